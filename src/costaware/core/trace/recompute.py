"""Activation checkpointing's recomputation under the dry run's fused-kernel modes.

``torch.utils.checkpoint`` runs the checkpointed function again in the backward with
none of the forward's torch-function modes (but a ``DeviceContext``):

- the non-reentrant checkpoint (``use_reentrant=False``, what Hugging Face's
  ``gradient_checkpointing_enable()`` passes) from a saved-tensor hook. The fused modes
  (:mod:`~costaware.core.trace.fused`) then saw the forward and not its recomputation: the
  recomputed dropout keeps a float mask where the forward kept a bool one, attention saves
  other tensors, and torch refuses the backward (``CheckpointError``: recomputed values
  have different metadata) where a real step on a GPU, which runs the same fused kernels
  both times, trains;
- the reentrant one (``use_reentrant=True``, torch's default when none is passed) from its
  autograd function's backward. Its recomputation then ran attention and dropout as the
  composites a CPU runs, with the score matrix and a float mask, and costed them so.

:func:`recompute_under` makes each checkpoint created in its scope, on this thread,
recompute under the modes given (those not already active). The checkpoint's frame class
and its reentrant function are replaced once, process-wide, by subclasses that do nothing
outside that scope.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

_LOCAL = threading.local()
_PATCH_LOCK = threading.Lock()


def _in_modes(fn: Callable[..., Any], modes: Sequence[TorchFunctionMode]) -> Callable[..., Any]:
    """``fn``, run with ``modes`` entered (those not active where it runs)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        with contextlib.ExitStack() as stack:
            active = {id(m) for m in _get_current_function_mode_stack()}  # type: ignore[no-untyped-call]
            for mode in modes:
                if id(mode) not in active:
                    stack.enter_context(mode)
            return fn(*args, **kwargs)

    return run


def _under_thread_modes(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, to run under the modes :func:`recompute_under` set on this thread (``fn``
    itself where none are set)."""
    modes = getattr(_LOCAL, "modes", ())
    return _in_modes(fn, modes) if modes else fn


def _posing_as(cls: type, original: type) -> None:
    """Give ``cls`` the name and module of the torch class it replaces."""
    cls.__name__ = cls.__qualname__ = original.__name__
    cls.__module__ = original.__module__


def _install_reentrant() -> None:
    """Replace ``torch.utils.checkpoint.CheckpointFunction`` (looked up by the reentrant
    checkpoint each time it runs) by a subclass whose saved function runs under the modes
    :func:`recompute_under` set on the thread that ran the forward: the backward's
    recomputation then enters them (the forward itself already runs under them). Nothing
    where this torch has no such function."""
    import torch.utils.checkpoint as ckpt

    found = getattr(ckpt, "CheckpointFunction", None)
    if found is None or getattr(found, "_costaware_recompute", False):
        return
    function: Any = found

    class _Function(function):  # type: ignore[misc, valid-type]
        _costaware_recompute = True

        @staticmethod
        def forward(ctx: Any, run_function: Callable[..., Any], *args: Any) -> Any:
            return function.forward(ctx, _under_thread_modes(run_function), *args)

    _posing_as(_Function, function)
    ckpt.CheckpointFunction = _Function  # type: ignore[misc]


def _install() -> bool:
    """Replace ``torch.utils.checkpoint._CheckpointFrame`` (looked up by the non-reentrant
    checkpoint each time it runs) by a subclass whose recomputation runs under the modes
    :func:`recompute_under` set on the creating thread, and the reentrant checkpoint's
    function likewise (:func:`_install_reentrant`). False where this torch has no such
    frame class: its checkpoints then recompute as torch does."""
    import torch.utils.checkpoint as ckpt

    with _PATCH_LOCK:
        frame = getattr(ckpt, "_CheckpointFrame", None)
        if frame is None:
            return False
        if getattr(frame, "_costaware_recompute", False):
            return True
        _install_reentrant()

        class _Frame(frame):  # type: ignore[misc, valid-type]
            _costaware_recompute = True

            def __init__(self, recompute_fn: Callable[..., Any], *args: Any, **kw: Any) -> None:
                super().__init__(_under_thread_modes(recompute_fn), *args, **kw)

        _posing_as(_Frame, frame)
        ckpt._CheckpointFrame = _Frame  # type: ignore[misc]
        return True


@contextlib.contextmanager
def recompute_under(modes: Sequence[TorchFunctionMode]) -> Iterator[None]:
    """Within this scope, on this thread, a checkpointed function recomputes in the
    backward under ``modes``, as its forward ran."""
    if not modes or not _install():
        yield
        return
    before = getattr(_LOCAL, "modes", ())
    _LOCAL.modes = tuple(modes)
    try:
        yield
    finally:
        _LOCAL.modes = before
