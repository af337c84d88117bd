"""The dry run's time limit: the call runs in a worker thread that is stopped at the
deadline, by an exception raised into it again and again until it has left, so that a
model's own ``except`` cannot keep it running. No signal or timer of the process is
used, so the caller's own stay as they were.
"""

from __future__ import annotations

import atexit
import contextvars
import ctypes
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from costaware.errors import TraceError, TraceTimeout

_T = TypeVar("_T")


class _DryRunTimeout(BaseException):
    """Raised inside the dry run's thread at its deadline (never seen by the caller, who
    gets :class:`~costaware.errors.TraceTimeout`).

    Not an ``Exception``: a factory's ``except Exception`` fallback or a forward's retry
    loop does not catch it. It is raised again every few milliseconds until the thread has
    left the dry run, so a loop that catches everything (a bare ``except:``) around Python
    code lets it through too, at the first check outside its ``try``.
    """


#: seconds the caller goes on stopping a timed-out dry run before it reports the timeout
_STOP_GRACE_S = 1.0
#: seconds between two timeouts raised into a dry run's thread that has not yet stopped:
#: while the caller waits, and afterwards (a thread stuck in one long native call)
_STOP_EVERY_S = 0.005
_STOP_EVERY_LATER_S = 0.05
#: set inside a time-limited call: a dry run nested in one runs under the enclosing limit
_IN_TIME_LIMIT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "costaware_in_time_limit", default=False
)
#: the timed-out dry runs whose threads are still being stopped
_STOPPING: set[_Stoppable] = set()
#: seconds interpreter exit waits for them (a daemon thread still in torch's C++ code when
#: the interpreter finalizes aborts the process)
_EXIT_WAIT_S = 5.0


def _set_async_exc(ident: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in the thread ``ident`` at its next bytecode check (None: withdraw
    one not yet raised)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(ident), None if exc is None else ctypes.py_object(exc)
    )


class _Stoppable:
    """A thread's stay inside a time-limited call, and the means to end it from outside.

    :meth:`interrupt` raises :class:`_DryRunTimeout` in the thread only between its
    :meth:`enter` and :meth:`leave`, under one lock, so that nothing is raised into the
    code that runs after the call (a timeout injected just before :meth:`leave` is
    withdrawn, or absorbed there). :attr:`done` is set as the thread finishes: waiting
    on it, unlike ``Thread.join``, leaves the thread's state intact when a signal
    handler of the caller raises meanwhile (a join interrupted so marks a running thread
    as stopped).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ident: int | None = None
        self._inside = False
        self._stopped = False
        self.importing = False  # at the last interrupt: the timeout was held back
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def running(self) -> bool:
        return not self.done.is_set() and self.thread is not None and self.thread.is_alive()

    def enter(self) -> None:
        with self._lock:
            if self._stopped:
                raise _DryRunTimeout
            self._ident = threading.get_ident()
            self._inside = True

    def leave(self) -> None:
        for _ in range(3):  # each try absorbs a timeout raised meanwhile
            try:
                with self._lock:
                    self._inside = False
                    if self._ident is not None:
                        _set_async_exc(self._ident, None)
                return
            except _DryRunTimeout:
                continue

    def interrupt(self) -> None:
        """Raise the timeout in the thread, unless it is importing a module: an import
        cut short leaves a half-made module in ``sys.modules`` (torch's first dry run
        imports sympy lazily), and every later dry run of the process would fail on it.
        The caller tries again a few milliseconds later, after the import."""
        with self._lock:
            self._stopped = True
            if self._inside and self._ident is not None:
                self.importing = _importing(self._ident)
                if not self.importing:
                    _set_async_exc(self._ident, _DryRunTimeout)


_LOADED = threading.Event()


def _load_tracing() -> None:
    """Import what torch loads on a dry run's first use of fake tensors (sympy, for its
    symbolic shapes: about 2 s), once per process, in the caller's thread: outside the
    time limit, which is the model's, and never cut short by it."""
    if _LOADED.is_set():
        return
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        torch.empty(1) + 1
    _LOADED.set()


def _importing(ident: int) -> bool:
    """Whether the thread ``ident`` is running an import (a frame of importlib's
    bootstrap is on its stack)."""
    frame = sys._current_frames().get(ident)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _stop(guard: _Stoppable, grace: float) -> bool:
    """Raise the timeout into the guarded thread until it has finished; whether it did
    within ``grace`` seconds (if not, a watchdog thread goes on until it does)."""
    _quiet_unraisable()
    end = time.monotonic() + grace
    try:
        while guard.running():
            guard.interrupt()
            if time.monotonic() >= end:
                break
            guard.done.wait(_STOP_EVERY_S)
        else:
            return True
    except BaseException:  # the caller's own interrupt while it waits: stopped all the same
        _watch(guard)
        raise
    _watch(guard)
    return False


def _watch(guard: _Stoppable) -> None:
    _STOPPING.add(guard)
    threading.Thread(
        target=_keep_stopping, args=(guard,), name="costaware-dry-run-stopper", daemon=True
    ).start()


def _keep_stopping(guard: _Stoppable) -> None:
    while guard.running():
        guard.interrupt()
        guard.done.wait(_STOP_EVERY_LATER_S)
    _STOPPING.discard(guard)


_UNRAISABLE_HOOKED = threading.Lock()


def _quiet_unraisable() -> None:
    """Keep out of stderr the timeouts that land in a finalizer (a weakref callback, a
    ``__del__``) of a dry run being stopped, which Python reports as "Exception ignored
    in ...": the hook in place (``sys.unraisablehook``) is chained, once per process, and
    sees everything else as before."""
    if not _UNRAISABLE_HOOKED.acquire(blocking=False):
        return
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if unraisable.exc_type is None or not issubclass(unraisable.exc_type, _DryRunTimeout):
            previous(unraisable)

    sys.unraisablehook = hook


@atexit.register
def _wait_for_stopping() -> None:
    end = time.monotonic() + _EXIT_WAIT_S
    for guard in list(_STOPPING):
        guard.done.wait(max(0.0, end - time.monotonic()))


def _call_with_timeout(fn: Callable[[], _T], timeout: float | None) -> _T:
    """``fn()``, run in a worker thread that is stopped after ``timeout`` seconds.

    At the deadline the caller raises :class:`_DryRunTimeout` into the worker (CPython's
    ``PyThreadState_SetAsyncExc``), again every few milliseconds until the worker has
    left ``fn``, and raises :class:`~costaware.errors.TraceTimeout` itself: Python code,
    the user's factory and forward included, stops within milliseconds, even one that
    catches ``Exception``; a loop over a bare ``except:`` stops once a timeout lands
    outside its ``try`` (within a second, around torch operators). No signal or timer of
    the process is touched, so the user's ``SIGALRM`` handler and ``setitimer`` timers
    stay as they were, and it works the same in any thread.

    What it cannot interrupt is one call into native code: a single long C++ operator
    (a real matrix product of a huge model, a blocking ``time.sleep`` or read) runs to its
    end, and the timeout is raised when it returns to Python. The caller does not wait
    for that: it reports the timeout at most ``_STOP_GRACE_S`` after the deadline, a
    watchdog thread keeps raising it until the worker has stopped, and the CPU the
    worker still uses is that of the one call in progress. A loop that catches
    everything (bare ``except:``) around such a call, whose timeout is therefore always
    raised inside the ``try``, is not stopped.

    ``fn`` runs in a copy of the caller's context (the simulated CPU of
    :func:`~costaware.core.trace.transients.simulated_cpu_capability`, for one). Nested inside another time-limited call,
    ``fn`` runs inline under the enclosing limit. ``timeout`` None or <= 0: no limit.
    """
    if timeout is None or timeout <= 0 or _IN_TIME_LIMIT.get():
        return fn()
    _load_tracing()
    guard = _Stoppable()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            try:
                guard.enter()
                _IN_TIME_LIMIT.set(True)
                box["result"] = fn()
            except BaseException as e:  # handed to the caller's thread
                box["error"] = e
            finally:
                guard.leave()
        except _DryRunTimeout:  # raised as it left: its result or error is in the box
            guard.leave()
        finally:
            guard.done.set()

    context = contextvars.copy_context()  # the caller's simulated CPU, for one
    guard.thread = threading.Thread(
        target=context.run, args=(target,), name="costaware-dry-run", daemon=True
    )
    guard.thread.start()
    try:
        finished = guard.done.wait(timeout)
    except BaseException:  # the caller's own interrupt (Ctrl-C, its signal handler)
        _stop(guard, _STOP_GRACE_S)
        raise
    message = f"the dry run took longer than its time limit of {timeout:g} s"
    if not finished and guard.running():
        if _stop(guard, _STOP_GRACE_S):
            raise TraceTimeout(message + "; it was stopped.")
        if guard.importing:
            raise TraceTimeout(
                message + f"; it had not stopped {_STOP_GRACE_S:g} s later: it is importing a "
                "module, and is stopped as soon as that import has finished (an import cut "
                "short would break the module for the whole process)."
            )
        raise TraceTimeout(
            message + f"; it had not stopped {_STOP_GRACE_S:g} s later: it is inside one "
            "native (C++) call, which Python cannot interrupt, or catches every exception. "
            "It is stopped as soon as it returns to Python."
        )
    error = box.get("error")
    if isinstance(error, _DryRunTimeout):  # stopped just as it finished
        raise TraceTimeout(message + "; it was stopped.")
    if error is not None:
        raise error
    if "result" not in box:  # the thread ended without finishing (it cannot, but say so)
        raise TraceError("the dry run's thread ended without a result.")
    result: _T = box["result"]
    return result
