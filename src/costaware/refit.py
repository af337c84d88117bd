"""Online refit: keep a cost model current with what the user's trials really cost.

:class:`OnlineRefit` watches an :class:`~costaware.store.ObservationStore`. Once ``every``
new trials have been measured, it refits in a background thread (a trial's start never
waits for it) a residual over the base model, the shipped one by default, on all the
study's measurements, and saves the result beside the store. Every worker that shares
the directory picks up the newest model on its next prediction.

Example:
    >>> import costaware as ca
    >>> from costaware.refit import OnlineRefit
    >>> from costaware.store import ObservationStore
    >>> refit = OnlineRefit(ObservationStore("sqlite://"), every=5)
    >>> refit.model().is_fitted   # nothing measured yet: the base model
    False
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from costaware.errors import NotEnoughObservations
from costaware.model import CostModel

__all__ = ["OnlineRefit"]

log = logging.getLogger(__name__)
_LATEST = "LATEST"


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
        self._fitted_on = 0
        self._thread: threading.Thread | None = None
        self.history: list[dict[str, Any]] = []
        self.last_error: str | None = None

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
        with self._lock:
            self._adopt(model)
            self._loaded_version = version
            self._fitted_on = max(self._fitted_on, int(model.training_.get("rows", 0)))

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
        """Start a refit if enough new trials were measured (:meth:`due_after`); True if
        one started."""
        if self._thread is not None and self._thread.is_alive():
            return False
        try:
            if self.pending() < self.due_after():
                return False
        except Exception as e:  # an unreachable store must not stop the study
            self.last_error = f"cannot count observations: {e}"
            return False
        if self.background:
            self._thread = threading.Thread(
                # not a daemon: the interpreter waits for a refit in flight at exit, instead
                # of tearing Python down under CatBoost's threads (which segfaults)
                target=self._refit_safely,
                name="costaware-refit",
                daemon=False,
            )
            self._thread.start()
        else:
            self._refit_safely()
        return True

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a background refit to finish (for tests and scripts)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _refit_safely(self) -> None:
        try:
            self.refit_now()
        except NotEnoughObservations as e:
            # the trials so far ran out of memory or crashed: nothing measured to learn
            # from yet, which is no failure; the next measured trial triggers it again
            log.debug("costaware: online refit waits for measurements: %s", e)
        except Exception as e:
            self.last_error = f"{type(e).__name__}: {e}"
            log.warning("costaware: online refit failed: %s", self.last_error)

    def refit_now(self) -> CostModel:
        """Refit on every observation in the store now, save it, and use it."""
        t0 = time.perf_counter()
        observations = self.store.observations(study=self.study)
        template = self.base
        model = CostModel(**template._params()).fit(observations, base=self.base)
        seconds = time.perf_counter() - t0
        version = None
        if self.directory is not None:
            version = self._save(model)
        with self._lock:
            self._adopt(model)
            self._fitted_on = len(observations)
            if version is not None:
                self._loaded_version = version
        self.history.append(
            {"rows": len(observations), "seconds": round(seconds, 3), "version": version}
        )
        return model

    def _save(self, model: CostModel) -> str:
        assert self.directory is not None
        self.directory.mkdir(parents=True, exist_ok=True)
        version = f"v{time.time_ns()}-{os.getpid()}"
        model.save(self.directory / version)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".latest-")
        with os.fdopen(fd, "w") as f:
            f.write(version)
        os.replace(tmp, self.directory / _LATEST)  # atomic: readers see old or new, never half
        with (self.directory / "refits.jsonl").open("a") as log_file:
            log_file.write(
                json.dumps({"version": version, "rows": model.training_.get("rows")}) + "\n"
            )
        return version
