"""Online refit: keep a cost model current with what the user's trials really cost.

:class:`OnlineRefit` watches an :class:`~costaware.runtime.store.ObservationStore`. Once ``every``
new trials have been measured, it refits in a background thread (a trial's start never
waits for it) a residual over the base model, the shipped one by default, on all the
study's measurements, and saves the result beside the store. Every worker that shares
the directory picks up the newest model on its next prediction.

A refit that fails (the disk is full, the directory is not writable, the fit raises)
never stops the study: it is logged, and the next try waits for twice as many newly
measured trials each time it fails again (:attr:`OnlineRefit.failures`). A model is
written into a hidden temporary folder and renamed into place whole, so a failed save
leaves nothing behind, and a reader never sees half a model. The newest
:data:`KEEP_VERSIONS` models are kept.

Example:
    >>> import costaware as ca
    >>> from costaware.runtime.refit import OnlineRefit
    >>> from costaware.runtime.store import ObservationStore
    >>> refit = OnlineRefit(ObservationStore("sqlite://"), every=5)
    >>> refit.model().is_fitted   # nothing measured yet: the base model
    False
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final

from costaware.core.model import CostModel, stop_fits_when
from costaware.errors import FitCancelled, NotEnoughObservations
from costaware.runtime.store import StoreUnreachable

__all__ = ["KEEP_VERSIONS", "OnlineRefit"]

log = logging.getLogger("costaware.refit")  # the name users configure, whatever the layout
_LATEST = "LATEST"
_TMP = ".tmp-"  # a model being written: hidden, never read, renamed into place when whole
_REFIT_LOCK = ".refit.lock"  # held (flock) by the one process refitting on the directory
_NICE = 10  # the background refit's priority below the trial's (Linux niceness)

#: set as the interpreter begins to exit, before it waits for its threads: a refit in
#: flight stops within one CatBoost tree and is dropped, so that the exit is not held
#: for it (nor, at a second Ctrl-C, torn down under CatBoost's threads)
_EXITING = threading.Event()
with contextlib.suppress(AttributeError, RuntimeError):  # CPython's hook for this
    threading._register_atexit(_EXITING.set)  # type: ignore[attr-defined]
KEEP_VERSIONS: Final = 3
"""Refitted models kept in the directory (the newest ones); older ones are removed."""
MAX_BACKOFF_DOUBLINGS: Final = 6
"""After failed refits in a row, the next waits for ``2**failures`` times as many newly
measured trials as it would have, at most ``2**6 = 64`` times."""
_STALE_TMP_S: Final = 3600.0  # a temporary folder this old was left by a killed process


class OnlineRefit:
    """Refits a :class:`CostModel` on a store's observations and shares the result.

    Args:
        store: where the measurements are (an ``ObservationStore``).
        base: the model to correct (default ``CostModel.default()``).
        every: refit after this many newly measured trials. The first refits come
            sooner: after 2, 4 and 8 measured trials, the gap doubling until it reaches
            ``every`` (with the default 5: 2, 4, 8, 13, 18, ...). A handful of the
            study's own measurements corrects the shipped model most, and a refit on so
            few rows is a line, fitted in milliseconds.
        directory: where refitted models are saved and read; default: beside a SQLite
            store (``<file>.costaware-models/``), or none (in-process only) for servers,
            unless given. Workers that share it share refits.
        study: only learn from this study's trials (default: all in the store).
        background: refit in a background thread (default) or inline.
    """

    def __init__(
        self,
        store: Any,
        base: CostModel | None = None,
        *,
        every: int = 5,
        directory: str | os.PathLike[str] | None = None,
        study: str | None = None,
        background: bool = True,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive integer, but got {every=}.")
        self.store = store
        self.base = base if base is not None else CostModel.default()
        self.every = every
        self.study = study
        self.background = background
        if directory is None and getattr(store, "path", None) is not None:
            directory = Path(store.path).with_name(Path(store.path).name + ".costaware-models")
        self.directory = Path(directory) if directory is not None else None
        self._lock = threading.Lock()
        self._model = self.base
        self._loaded_version: str | None = None
        self._id: str | None = None
        self._fitted_on = 0
        self._thread: threading.Thread | None = None
        #: held while a refit is decided on and started (and, not in the background, run):
        #: trials judged at once from several threads (Optuna's n_jobs) start one refit
        self._starting = threading.Lock()
        self.history: list[dict[str, Any]] = []
        self.last_error: str | None = None
        #: refits that failed in a row (0 after a success); each one doubles the wait
        self.failures = 0
        self._retry_at = 0  # after a failure: the observation count the next try waits for
        self._counted = 0  # the observation count when the last refit started

    # -- reading --------------------------------------------------------------------------
    def model(self) -> CostModel:
        """The newest model: this process's last refit or a newer one another worker saved."""
        self._pick_up()
        with self._lock:
            return self._model

    def _pick_up(self) -> None:
        if self.directory is None:
            return
        pointer = self.directory / _LATEST
        try:
            version = pointer.read_text().strip()
        except OSError:
            return
        if not version or version == self._loaded_version:
            return
        try:
            model = CostModel.load(self.directory / version)
        except Exception as e:  # a half-written or foreign directory: keep the current model
            log.warning("costaware: could not load refitted model %s: %s", version, e)
            return
        learned_from = model.training_.get("store_id")
        if learned_from != self._store_id():
            # refitted on another store's records (the file deleted and made again, or a
            # directory shared by mistake): what it learned is not in this store
            log.info(
                "costaware: not using refitted model %s: it was learned from store %s, "
                "not this one (%s)",
                version,
                learned_from,
                self._store_id(),
            )
            self._loaded_version = version  # looked at once, not on every call
            return
        with self._lock:
            self._adopt(model)
            self._loaded_version = version
            self._fitted_on = max(self._fitted_on, int(model.training_.get("rows", 0)))

    def _store_id(self) -> str | None:
        """The store's id (:attr:`ObservationStore.store_id`), or None for a store
        without one, or that cannot say it now."""
        if self._id is None and hasattr(self.store, "store_id"):
            try:
                self._id = str(self.store.store_id)
            except Exception as e:  # a server that is down: asked again next time
                log.debug("costaware: the store's id is not readable now: %s", e)
        return self._id

    def _adopt(self, model: CostModel) -> None:
        """Use ``model`` from now on (under the lock), keeping the traces already made:
        a trace depends on the spec alone, not on the model that asked for it."""
        model.__dict__["_trace_cache"] = self._model._cache()
        self._model = model

    # -- refitting ------------------------------------------------------------------------
    def pending(self) -> int:
        """Trials measured since the model in use was fitted."""
        return int(self.store.count_observations(study=self.study)) - self._fitted_on

    def due_after(self) -> int:
        """How many newly measured trials the next refit waits for: 2 with none fitted
        yet, then as many as were fitted on (2, 4, 8, ...) until that reaches ``every``."""
        return min(self.every, max(2, self._fitted_on))

    def maybe_refit(self) -> bool:
        """Start a refit if enough new trials were measured (:meth:`due_after`), and, after
        failed refits, enough more since the last failure; True if one started."""
        if not self._starting.acquire(blocking=False):
            return False  # another thread is starting (or running) one
        try:
            return self._maybe_start()
        finally:
            self._starting.release()

    def _maybe_start(self) -> bool:
        if self._thread is not None and self._thread.is_alive():
            return False
        try:
            count = int(self.store.count_observations(study=self.study))
        except Exception as e:  # an unreachable store must not stop the study
            self.last_error = f"cannot count observations: {e}"
            return False
        if count - self._fitted_on < self.due_after():
            return False
        if self.failures and count < self._retry_at:
            return False  # backing off after failed refits
        if self.background:
            self._thread = threading.Thread(
                # not a daemon: the interpreter waits for a refit in flight at exit, instead
                # of tearing Python down under CatBoost's threads (which segfaults); the
                # refit stops within one tree once the exit begins (_EXITING)
                target=self._refit_in_background,
                name="costaware-refit",
                daemon=False,
            )
            self._thread.start()
        else:
            self._refit_safely()
        return True

    def _refit_in_background(self) -> None:
        """The background refit: at a lower priority than the trial beside it (on Linux,
        this thread alone), so that the measurements it takes are not slowed."""
        if sys.platform.startswith("linux"):
            with contextlib.suppress(AttributeError, OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _NICE)
        self._refit_safely()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a background refit to finish (for tests and scripts)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _refit_safely(self) -> None:
        with contextlib.ExitStack() as stack:
            if not self._claim(stack):
                log.debug(
                    "costaware: another process refits on this store now; its model is "
                    "picked up once saved"
                )
                return
            stack.enter_context(stop_fits_when(_EXITING))
            self._refit_reporting()

    def _claim(self, stack: contextlib.ExitStack) -> bool:
        """Whether this process may refit now: it holds the models directory's lock (held
        until ``stack`` closes), or there is no directory (or no ``fcntl``) to share. Workers
        sharing a store refit one at a time, and the others pick up the saved model instead
        of fitting the same rows again."""
        if self.directory is None:
            return True
        try:
            import fcntl
        except ImportError:  # not POSIX: each process refits on its own
            return True
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            handle = stack.enter_context((self.directory / _REFIT_LOCK).open("a"))
        except OSError:  # an unwritable directory: the save says so
            return True
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        stack.callback(fcntl.flock, handle, fcntl.LOCK_UN)
        return True

    def _refit_reporting(self) -> None:
        try:
            self.refit_now()
        except FitCancelled:
            log.info("costaware: online refit stopped: the process is exiting")
        except NotEnoughObservations as e:
            # the trials so far ran out of memory or crashed: nothing measured to learn
            # from yet, which is no failure; the next measured trial triggers it again
            log.debug("costaware: online refit waits for measurements: %s", e)
        except StoreUnreachable as e:
            # the store's own outage, said by the store when it began: no failure of the
            # refit, which runs again at the first measured trial after it answers
            self.last_error = f"{type(e).__name__}: {e}"
            log.info("costaware: online refit waits for the store to answer: %s", e)
        except Exception as e:
            self.failures += 1
            wait = self.due_after() * 2 ** min(self.failures, MAX_BACKOFF_DOUBLINGS)
            self._retry_at = self._counted + wait
            self.last_error = f"{type(e).__name__}: {e}"
            log.warning(
                "costaware: online refit failed (%d in a row; the model in use is kept, and "
                "the next try waits for %d more measured trials): %s",
                self.failures,
                wait,
                self.last_error,
            )

    def refit_now(self) -> CostModel:
        """Refit on every observation in the store now, save it, and use it.

        Raises what the fit or the save raised; nothing is left in the directory then.
        """
        t0 = time.perf_counter()
        # counted first: the rows the store skips as malformed are counted by the database
        # but never read, and must not make every later trial look like a new one
        self._counted = int(self.store.count_observations(study=self.study))
        observations = self.store.observations(study=self.study)
        params = self.base.get_params()
        if self.background:  # one core: the other is the trial's beside it
            params["thread_count"] = 1
        model = CostModel(**params).fit(observations, base=self.base)
        if (store_id := self._store_id()) is not None:
            model.training_["store_id"] = store_id
        seconds = time.perf_counter() - t0
        version = None
        if self.directory is not None:
            version = self._save(model)
        with self._lock:
            self._adopt(model)
            self._fitted_on = max(len(observations), self._counted)
            if version is not None:
                self._loaded_version = version
        self.failures = 0
        self.history.append(
            {"rows": len(observations), "seconds": round(seconds, 3), "version": version}
        )
        gap = next((m.step_gap_ for m in (model, *model.kinds_.values()) if m.step_gap_), None)
        log.info(
            "costaware: refitted the cost model on %d measured trial%s%s in %.1f s%s; the "
            "next predictions use it%s",
            len(observations),
            "" if len(observations) == 1 else "s",
            f" of study {self.study!r}" if self.study else "",
            seconds,
            f" (saved as {version})" if version else "",
            f", with {gap * 1e3:.1f} ms a step between steps" if gap else "",
        )
        return model

    def _save(self, model: CostModel) -> str:
        """Write ``model`` as a new version and point ``LATEST`` at it; on any failure,
        remove what was written and raise."""
        assert self.directory is not None
        directory = self.directory
        directory.mkdir(parents=True, exist_ok=True)
        version = f"v{time.time_ns()}-{os.getpid()}"
        tmp = Path(tempfile.mkdtemp(dir=directory, prefix=f"{_TMP}{version}-"))
        try:
            model.save(tmp)
            os.rename(tmp, directory / version)  # atomic: the folder appears whole
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            _write_atomically(directory / _LATEST, version)  # readers see old or new
        except BaseException:
            shutil.rmtree(directory / version, ignore_errors=True)
            raise
        try:
            with (directory / "refits.jsonl").open("a") as log_file:
                log_file.write(
                    json.dumps({"version": version, "rows": model.training_.get("rows")}) + "\n"
                )
        except OSError as e:  # the model is saved and in use; the log line is a nicety
            log.warning("costaware: could not append to %s: %s", directory / "refits.jsonl", e)
        _tidy(directory, keep=version)
        return version


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{_TMP}{path.name}-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _tidy(directory: Path, keep: str) -> None:
    """Remove the versions older than the newest :data:`KEEP_VERSIONS` (never ``keep``),
    and temporary files and folders that a killed process left behind."""
    try:
        entries = list(directory.iterdir())
    except OSError:
        return
    versions = sorted(
        (p for p in entries if p.name.startswith("v") and p.is_dir()),
        key=lambda p: _version_time(p.name),
    )
    for old in versions[:-KEEP_VERSIONS]:
        if old.name != keep:
            shutil.rmtree(old, ignore_errors=True)
    now = time.time()
    for p in entries:
        if not p.name.startswith(_TMP):
            continue
        with contextlib.suppress(OSError):
            if now - p.stat().st_mtime > _STALE_TMP_S:  # another worker's is younger
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink()


def _version_time(name: str) -> int:
    """``v<time_ns>-<pid>``'s time, for ordering (0 for a name of another form)."""
    try:
        return int(name[1:].split("-", 1)[0])
    except ValueError:
        return 0
