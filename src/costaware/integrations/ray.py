"""Ray Tune integration: keep trials that would not fit off the cluster, and pack the rest.

Three pieces, usable together or alone:

- :class:`CostAwareSearcher` wraps any Tune ``Searcher`` (``OptunaSearch``, ``HyperOptSearch``,
  ...). Each suggestion is judged *before* Tune creates the trial: ``spec_fn(config)`` builds
  the :class:`~costaware.TrainingSpec`, the cost model predicts its peak memory and epoch
  time, and :meth:`costaware.Budget.decide` admits or rejects it. A rejected suggestion is
  closed in the wrapped searcher with ``on_trial_complete(inner_id, result=None,
  error=False)`` (``OptunaSearch`` records it as PRUNED, so TPE learns the infeasible
  region), kept in :attr:`CostAwareSearcher.rejections` with its reasons, and the wrapped
  searcher is asked again under a new id. Rejected suggestions never become Tune trials and
  do not count towards ``num_samples``.
- :class:`CostAwareScheduler` wraps a ``TrialScheduler`` (default FIFO; ASHA, HyperBand,
  ...). It reads the actual cost every trial reports, records it in the
  :class:`~costaware.runtime.store.ObservationStore` (the online refit learns from it), and stops a
  running trial whose measured cost breaks the budget. Everything else is delegated.
- :func:`resources` computes per-trial fractional GPUs from the predicted memory, for
  ``tune.with_resources(trainable, resources=...)``; :func:`limit_memory` enforces the
  fraction inside the trial.

Inside the trainable, :class:`EpochMeter` measures an epoch's time and peak memory and
returns them under the keys the scheduler reads:

============================  ==========================================================
result key                    meaning
============================  ==========================================================
``"epoch_time_s"``            wall time of the epoch's training, in seconds
``"peak_memory_bytes"``       peak memory so far, in bytes (CUDA: ``max_memory_reserved``;
                              CPU: the CPU allocator's peak over the first epoch, or
                              the first two ``meter.step()`` calls)
``"held_before_bytes"``       CUDA: bytes the process held reserved when the meter was
                              created, before the model (an earlier trial's leftovers);
                              above 256 MiB the store keeps the peak out of the refit
``"measured_on"``             the device measured (a catalog name, or CUDA's name of the
                              GPU): the store records the measurements as that device's,
                              and the refit learns no CPU run as a GPU's
``"epoch"``                   the epoch index (else ``training_iteration - 1`` is used);
                              an epoch reported several times counts once in the
                              trial's time
============================  ==========================================================

``"epoch_time"`` and ``"peak_memory"`` (the store's and the Lightning callback's names) are
accepted too.

Example:
    >>> import costaware as ca
    >>> from ray import tune
    >>> from ray.tune.search.optuna import OptunaSearch
    >>> from ray.tune.schedulers import ASHAScheduler
    >>> from costaware import zoo
    >>> from costaware.integrations.ray import CostAwareScheduler, CostAwareSearcher, EpochMeter
    >>> def spec_fn(cfg):
    ...     return ca.TrainingSpec(model=lambda: zoo.mlp(784, (cfg["width"],), 10),
    ...                            batch=ca.ImageBatch((784,), classes=10), batch_size=cfg["bs"])
    >>> budget = ca.Budget(max_memory="20GiB", max_epoch_time="5min")
    >>> def trainable(cfg):
    ...     meter = EpochMeter()
    ...     for epoch in range(3):
    ...         with meter:
    ...             loss = 1.0 / (epoch + 1)   # train one epoch here
    ...         tune.report({"loss": loss, "epoch": epoch, **meter.metrics()})
    >>> tuner = tune.Tuner(  # doctest: +SKIP
    ...     trainable,
    ...     param_space={"width": tune.choice([64, 4096]), "bs": tune.choice([32, 256])},
    ...     tune_config=tune.TuneConfig(
    ...         metric="loss", mode="min", num_samples=8,
    ...         search_alg=CostAwareSearcher(OptunaSearch(), spec_fn, budget, device="A10"),
    ...         scheduler=CostAwareScheduler(ASHAScheduler(), budget, device="A10")))
"""

from __future__ import annotations

import functools
import json
import math
import numbers
import os
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

try:
    import ray
    from ray.tune.schedulers import FIFOScheduler, TrialScheduler
    from ray.tune.search import Searcher
    from ray.tune.search.util import _set_search_properties_backwards_compatible
except ImportError as e:  # pragma: no cover - exercised only without ray
    raise ImportError(
        "costaware.integrations.ray needs Ray Tune: pip install 'costaware[ray]'"
    ) from e

from costaware.budget import Budget, Reason
from costaware.core.model import CostModel
from costaware.devices import Device, get_device, is_auto
from costaware.errors import CostAwareWarning, SpecError, first_line
from costaware.integrations._keywords import keyword_options
from costaware.measure.profile import CpuMemoryMeter, clear_cuda_cache
from costaware.runtime.gate import (
    Gate,
    as_json,
    check_options,
    check_study,
    open_store,
    spec_build_error,
)
from costaware.spec import TrainingSpec

__all__ = [
    "CostAwareScheduler",
    "CostAwareSearcher",
    "CostAwareWarning",
    "EpochMeter",
    "limit_memory",
    "resources",
]

#: the study name predictions and measurements are recorded under, unless ``study=`` is given
DEFAULT_STUDY = "ray-tune"
#: result keys read by :class:`CostAwareScheduler`, first match wins
EPOCH_TIME_KEYS = ("epoch_time_s", "epoch_time", "costaware/epoch_time")
PEAK_MEMORY_KEYS = ("peak_memory_bytes", "peak_memory", "costaware/peak_memory")
HELD_BEFORE_KEYS = ("held_before_bytes", "held_before", "costaware/held_before")
#: the result key of the device :class:`EpochMeter` measured on
MEASURED_ON_KEY = "measured_on"


def _open_store(store: Any) -> Any:
    store = open_store(store, retry=True)  # a server that is down never stops a run
    if store is not None and not (
        hasattr(store, "record_prediction") and hasattr(store, "record_measurement")
    ):
        raise TypeError(
            f"store must be an ObservationStore or its URL, but got {type(store).__name__}."
        )
    return store


def _check_budget(budget: Any) -> Budget:
    if not isinstance(budget, Budget):
        raise TypeError(f"budget must be a costaware.Budget, but got {type(budget).__name__}.")
    return budget


def _check_spec_fn(spec_fn: Any) -> None:
    if not callable(spec_fn):
        raise TypeError(f"spec_fn must be callable(config) -> TrainingSpec, but got {spec_fn!r}.")


def _build_spec(spec_fn: Callable[[dict[str, Any]], TrainingSpec], config: Any) -> TrainingSpec:
    spec = spec_fn(dict(config))
    if not isinstance(spec, TrainingSpec):
        raise SpecError(
            f"spec_fn must return a costaware.TrainingSpec, but returned {type(spec).__name__}."
        )
    return spec


class CostAwareSearcher(Searcher):
    """Wraps a Tune ``Searcher`` and rejects suggestions predicted to break a budget.

    Tune asks ``suggest(trial_id)``; this wrapper asks the wrapped searcher (first under
    ``trial_id``, then ``f"{trial_id}_try{k}"``), judges each suggestion and returns the
    first one admitted (its prediction is recorded under ``trial_id``, the id Tune and
    :class:`CostAwareScheduler` use). Rejected suggestions are closed in the wrapped
    searcher as ``on_trial_complete(inner_id, result=None, error=False)`` (PRUNED in
    ``OptunaSearch``), appended to :attr:`rejections` (dicts with ``trial_id`` =
    ``f"{trial_id}_rej{k}"``, ``inner_id``, ``for_trial``, ``config``, ``reasons``,
    ``reason_kinds`` and the predicted figures ``peak_memory``, ``peak_memory_upper``,
    ``epoch_time``, ...) and recorded in the store under ``f"{trial_id}_rej{k}"`` with
    status ``"rejected"``.

    When every suggestion keeps being rejected:

    - after ``max_retries`` rejections within one ``suggest`` call it warns and returns
      ``None``: Tune creates no trial in this step and asks again in the next one (the
      wrapped searcher has learnt from the rejections in the meantime);
    - after ``max_consecutive_rejections`` rejections in a row (across calls) it warns and
      returns ``Searcher.FINISHED``: the budget rules out what the searcher keeps
      proposing, so the search ends (running trials finish) instead of spinning forever.
      ``None`` disables this.

    ``Searcher.FINISHED`` and ``None`` from the wrapped searcher are passed through.

    The wrapped searcher is the one argument given by position; the options are
    keywords. The earlier positional form, ``CostAwareSearcher(searcher, spec_fn, budget,
    device)``, still works with a ``FutureWarning`` that names the keywords.

    Args:
        searcher: the Tune ``Searcher`` to wrap.
        spec_fn: ``config -> TrainingSpec``, from the suggested config (the searched
            parameters, as the wrapped searcher returns them; constants of
            ``param_space`` are not included).
        budget: the limits a trial must fit.
        device: where trials run: a catalog name (``"A10"``, ``"H100"``), a ``Device``,
            ``"cpu"``, or ``"auto"`` (the GPU of the driver machine).
        model: the cost model (default: the shipped one).
        store: an ``ObservationStore`` or its URL (use a server URL shared by all nodes,
            see ``docs/ray.md``), to record predictions and refit.
        study: the name predictions are recorded under; give :class:`CostAwareScheduler`
            the same one so that measurements join them.
        max_retries: suggestions tried per ``suggest`` call after the first is rejected.
        max_consecutive_rejections: rejections in a row after which the search is declared
            finished (None: never).
        fail_open: admit a suggestion whose prediction fails (default) or reject it.
        refit_every: with a store, refit the model after this many measured trials.

    Example:
        >>> from ray.tune.search.optuna import OptunaSearch
        >>> import costaware as ca
        >>> searcher = CostAwareSearcher(  # doctest: +SKIP
        ...     OptunaSearch(), spec_fn=spec_fn, budget=ca.Budget(max_memory="24GiB"),
        ...     device="A10")
        >>> tune.TuneConfig(search_alg=searcher, metric="loss", mode="min")  # doctest: +SKIP
    """

    @keyword_options(("searcher", "spec_fn", "budget", "device"), positional=1)
    def __init__(
        self,
        searcher: Searcher,
        *,
        spec_fn: Callable[[dict[str, Any]], TrainingSpec],
        budget: Budget,
        device: str | Device = "auto",
        model: CostModel | None = None,
        store: Any = None,
        study: str = DEFAULT_STUDY,
        max_retries: int = 20,
        max_consecutive_rejections: int | None = 200,
        fail_open: bool = True,
        refit_every: int | None = 5,
    ) -> None:
        if not isinstance(searcher, Searcher):
            hint = ""
            if type(searcher).__name__ == "BasicVariantGenerator":
                hint = (
                    " Tune's default grid and random search (BasicVariantGenerator) is a "
                    "search algorithm that expands param_space itself, not a Searcher that "
                    "suggests one config at a time, so costaware cannot judge its configs "
                    "before they launch: wrap a Searcher (OptunaSearch(), HyperOptSearch()), "
                    "or keep the default search and judge the running trials with "
                    "CostAwareScheduler."
                )
            raise TypeError(
                f"searcher must be a ray.tune.search.Searcher, but got "
                f"{type(searcher).__name__}.{hint}"
            )
        _check_spec_fn(spec_fn)
        _check_budget(budget)
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an integer >= 0, but got {max_retries=}.")
        if max_consecutive_rejections is not None and (
            isinstance(max_consecutive_rejections, bool)
            or not isinstance(max_consecutive_rejections, int)
            or max_consecutive_rejections < 1
        ):
            raise ValueError(
                "max_consecutive_rejections must be a positive integer or None, but got "
                f"{max_consecutive_rejections=}."
            )
        check_study(study, DEFAULT_STUDY)
        self.searcher = searcher
        self.spec_fn = spec_fn
        self.budget = budget
        self.max_retries = max_retries
        self.max_consecutive_rejections = max_consecutive_rejections
        self.study = study
        self._gate = Gate(
            budget,
            device,
            model=model,
            store=_open_store(store),
            refit_every=refit_every,
            fail_open=fail_open,
        )
        # state saved by get_state (checkpointed by Tune)
        self.rejections: list[dict[str, Any]] = []
        self.admitted: dict[str, dict[str, Any]] = {}
        self.inner_ids: dict[str, str] = {}
        self.consecutive_rejections = 0
        self.spent_time = 0.0
        super().__init__(metric=searcher.metric, mode=searcher.mode)

    # -- properties -----------------------------------------------------------------------
    @property
    def metric(self) -> Any:
        return self.searcher.metric

    @property
    def mode(self) -> Any:
        return self.searcher.mode

    @property
    def store(self) -> Any:
        """The ``ObservationStore`` in use, or None."""
        return self._gate.store

    @property
    def refit(self) -> Any:
        """The :class:`~costaware.runtime.refit.OnlineRefit` in use, or None."""
        return self._gate.refit

    # -- Searcher API -----------------------------------------------------------------------
    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        ok: bool = _set_search_properties_backwards_compatible(
            self.searcher.set_search_properties, metric, mode, config, **spec
        )
        return ok

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        ok: bool = self.searcher.set_max_concurrency(max_concurrent)
        return ok

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        spent = self._gate.budget.exhausted(self.spent_time)
        if spent is not None:  # every suggestion would be rejected: the search is over
            warnings.warn(f"costaware: {spent}; ending the search.", CostAwareWarning, stacklevel=2)
            return Searcher.FINISHED  # type: ignore[return-value]
        for attempt in range(self.max_retries + 1):
            inner_id = trial_id if attempt == 0 else f"{trial_id}_try{attempt}"
            rejected_as = f"{trial_id}_rej{attempt}"
            config: Any = self.searcher.suggest(inner_id)
            if config is None or isinstance(config, str):  # None, or Searcher.FINISHED
                return config  # type: ignore[return-value]
            spec, error = None, None
            try:
                spec = _build_spec(self.spec_fn, config)
            except Exception as e:  # the user's bug is raised by judge, ours admits
                error = spec_build_error(
                    e, what="spec_fn", params=config,
                    missing="the searcher suggests the searched parameters alone (Tune adds "
                    "param_space's constants to the trial later): search it, or close over a "
                    "constant in spec_fn, or read it with a default (cfg.get)",
                )  # fmt: skip
            verdict = self._gate.judge(
                spec,
                study=self.study,
                trial=trial_id,
                error=error,
                spent_time=self.spent_time,
                rejected_as=rejected_as,
                params=config,
            )
            info = verdict.info
            if verdict.admit:
                self.consecutive_rejections = 0
                self.inner_ids[trial_id] = inner_id
                self.admitted[trial_id] = info
                return config  # type: ignore[no-any-return]
            # close it so the wrapped searcher learns (OptunaSearch: PRUNED) and frees its slot
            self.searcher.on_trial_complete(inner_id, result=None, error=False)
            self.rejections.append(
                {
                    "trial_id": rejected_as,
                    "inner_id": inner_id,
                    "for_trial": trial_id,
                    "config": dict(config),
                    **info,
                }
            )
            self.consecutive_rejections += 1
            limit = self.max_consecutive_rejections
            if limit is not None and self.consecutive_rejections >= limit:
                warnings.warn(
                    f"costaware rejected {self.consecutive_rejections} suggestions in a row: "
                    "the budget rules out what the searcher proposes; ending the search. "
                    "Raise the budget or narrow the search space.",
                    CostAwareWarning,
                    stacklevel=2,
                )
                return Searcher.FINISHED  # type: ignore[return-value]
        if not self.__dict__.get("_said_no_trial"):
            self._said_no_trial = True
            warnings.warn(
                f"costaware rejected {self.max_retries + 1} suggestions for trial {trial_id}; "
                "no trial this step, Tune will ask again (said once: searcher.rejections "
                "lists every rejection).",
                CostAwareWarning,
                stacklevel=2,
            )
        return None

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self.searcher.on_trial_result(self.inner_ids.get(trial_id, trial_id), result)

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        if result:
            spent = result.get("time_total_s")
            if isinstance(spent, (int, float)) and math.isfinite(spent):
                self.spent_time += float(spent)
        inner_id = self.inner_ids.pop(trial_id, trial_id)
        self.searcher.on_trial_complete(inner_id, result=result, error=error)

    def add_evaluated_point(
        self,
        parameters: dict[str, Any],
        value: float,
        error: bool = False,
        pruned: bool = False,
        intermediate_values: list[float] | None = None,
    ) -> None:
        self.searcher.add_evaluated_point(parameters, value, error, pruned, intermediate_values)

    # -- checkpointing --------------------------------------------------------------------
    _STATE_KEYS = ("rejections", "admitted", "inner_ids", "consecutive_rejections", "spent_time")

    def get_state(self) -> dict[str, Any]:
        """The wrapper's own state (Tune checkpoints the wrapped searcher separately)."""
        return as_json({k: getattr(self, k) for k in self._STATE_KEYS})

    def set_state(self, state: dict[str, Any]) -> None:
        missing = [k for k in self._STATE_KEYS if k not in state]
        if missing:
            raise ValueError(
                f"expected a CostAwareSearcher state with keys {list(self._STATE_KEYS)}, "
                f"but got one without {missing}."
            )
        for key in self._STATE_KEYS:
            setattr(self, key, state[key])

    def save(self, checkpoint_path: str) -> None:
        """Save the wrapped searcher to ``checkpoint_path`` and this wrapper beside it
        (``<checkpoint_path>.costaware.json``)."""
        self.searcher.save(checkpoint_path)
        with open(os.fspath(checkpoint_path) + ".costaware.json", "w") as f:
            json.dump(self.get_state(), f)

    def restore(self, checkpoint_path: str) -> None:
        self.searcher.restore(checkpoint_path)
        own = os.fspath(checkpoint_path) + ".costaware.json"
        if os.path.exists(own):
            with open(own) as f:
                self.set_state(json.load(f))


def _is_number(v: Any) -> bool:
    """Whether ``v`` is a finite real number (a numpy scalar too), not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def _number(result: Mapping[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        v: Any = result.get(key)
        if _is_number(v):
            return float(v)
    return None


#: the cost keys a result may carry, and the unit each must be a number of
_COST_UNITS = (
    *((key, "seconds (the epoch's training time)") for key in EPOCH_TIME_KEYS),
    *((key, "bytes (the peak memory)") for key in PEAK_MEMORY_KEYS),
    *((key, "bytes (what the process held before the trial)") for key in HELD_BEFORE_KEYS),
)


def _not_numbers(result: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """``(key, unit, value)`` for each cost key the result carries whose value is not a
    finite number (``"30s"``, ``"1GB"``, NaN): nothing is checked or recorded for it.
    None is a cost not measured (no peak on a CPU), not a wrong one."""
    return [
        (key, unit, result[key])
        for key, unit in _COST_UNITS
        if key in result and result[key] is not None and not _is_number(result[key])
    ]


class CostAwareScheduler(TrialScheduler):
    """Wraps a ``TrialScheduler``: records every trial's actual cost, stops over-budget trials.

    On each result, the measured epoch time (``"epoch_time_s"``) and peak memory
    (``"peak_memory_bytes"``; see the module docs for the accepted keys) are compared with
    the budget: memory (plus the device's CUDA context overhead) against ``max_memory``,
    the epoch time against ``max_epoch_time``, and the sum of the trial's epoch times
    against ``max_trial_time``. A trial over budget gets ``STOP``, is added to
    :attr:`stopped` with the reason, and its measurement is recorded as ``"stopped"``;
    the wrapped scheduler is not consulted for that result. Otherwise the measurement is
    recorded as ``"ok"`` and the wrapped scheduler decides. Results without any cost key
    go straight to the wrapped scheduler.

    The wrapped scheduler is the one argument given by position; the options are
    keywords. The earlier positional form, ``CostAwareScheduler(scheduler, budget,
    device)``, still works with a ``FutureWarning`` that names the keywords.

    Args:
        scheduler: the scheduler to wrap (default ``FIFOScheduler()``).
        budget: the limits (default: none, only record).
        device: the device trials run on, for the context overhead and ``"90%"`` budgets
            (None: no overhead added; a percentage budget then cannot be checked).
        store: an ``ObservationStore`` or its URL, for the measurements.
        study: the study name measurements are recorded under (as for the searcher).
        enforce: stop over-budget trials (default) or only record them.

    Example:
        >>> from ray.tune.schedulers import ASHAScheduler
        >>> scheduler = CostAwareScheduler(  # doctest: +SKIP
        ...     ASHAScheduler(), budget=ca.Budget(max_epoch_time="10min"))
    """

    @keyword_options(("scheduler", "budget", "device"), positional=1)
    def __init__(
        self,
        scheduler: TrialScheduler | None = None,
        *,
        budget: Budget | None = None,
        device: str | Device | None = None,
        store: Any = None,
        study: str = DEFAULT_STUDY,
        enforce: bool = True,
    ) -> None:
        if scheduler is None:
            scheduler = FIFOScheduler()  # type: ignore[no-untyped-call]
        if isinstance(scheduler, type) and issubclass(scheduler, TrialScheduler):
            raise TypeError(
                f"scheduler must be a ray.tune TrialScheduler instance, but got the class "
                f"{scheduler.__name__}: write {scheduler.__name__}(...)."
            )
        if not isinstance(scheduler, TrialScheduler):
            raise TypeError(
                f"scheduler must be a ray.tune TrialScheduler, but got {type(scheduler).__name__}."
            )
        if budget is not None:
            _check_budget(budget)
        if device is not None:
            check_options(device=device)  # the searcher's message for a wrong device
            if budget is not None:
                budget.check_room(device)
        elif budget is not None and budget.max_memory is not None:
            budget.max_memory_bytes()  # a relative max_memory ("90%") needs the device
        check_study(study, DEFAULT_STUDY)
        if not isinstance(enforce, bool):
            raise TypeError(
                "enforce must be True (stop a trial whose measured cost breaks the budget) or "
                f"False (record it only), but got {enforce!r}."
            )
        super().__init__()  # type: ignore[no-untyped-call]
        self.scheduler = scheduler
        self.budget = budget
        self.device = get_device(device) if device is not None else None
        self.store = _open_store(store)
        self.study = study
        self.enforce = enforce
        #: trial id -> {"reasons": [...], "epoch": ..., "actual": {...}} for stopped trials
        self.stopped: dict[str, dict[str, Any]] = {}
        #: trial id -> the epoch time of each epoch index it reported (several reports of
        #: one epoch, or an epoch run again after a restore, count once)
        self._epoch_times: dict[str, dict[int | str, float]] = {}
        #: trial id -> the last measurement recorded (epoch, actual): a repeat is not stored
        self._last_recorded: dict[str, tuple[int | None, dict[str, Any]]] = {}
        self._warned_store = False
        self._warned_device = False
        #: the cost keys already warned of as not numbers
        self._warned_keys: set[str] = set()

    @property
    def metric(self) -> Any:
        return self.scheduler.metric

    @property
    def supports_buffered_results(self) -> bool:
        return bool(self.scheduler.supports_buffered_results)

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        ok: bool = self.scheduler.set_search_properties(metric, mode, **spec)
        return ok

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        self.scheduler.on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        self.scheduler.on_trial_error(tune_controller, trial)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        reasons = self._check(trial, result)
        if reasons and self.enforce:
            return TrialScheduler.STOP
        decision: str = self.scheduler.on_trial_result(tune_controller, trial, result)
        return decision

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        self.scheduler.on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller: Any, trial: Any) -> None:
        self.scheduler.on_trial_remove(tune_controller, trial)

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        return self.scheduler.choose_trial_to_run(tune_controller)

    def debug_string(self) -> str:
        inner: str = self.scheduler.debug_string()
        return f"CostAware({len(self.stopped)} stopped over budget) + {inner}"

    def save(self, checkpoint_path: str) -> None:
        self.scheduler.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        self.scheduler.restore(checkpoint_path)

    # -- the check ------------------------------------------------------------------------
    def _check(self, trial: Any, result: Mapping[str, Any]) -> list[Reason]:
        """Record the result's actual cost and return the budget it breaks (if any)."""
        self._warn_not_numbers(result)
        epoch_time = _number(result, EPOCH_TIME_KEYS)
        peak = _number(result, PEAK_MEMORY_KEYS)
        if epoch_time is None and peak is None:
            return []
        trial_id = str(trial.trial_id)
        epoch_raw = result.get("epoch")
        if isinstance(epoch_raw, int) and not isinstance(epoch_raw, bool) and epoch_raw >= 0:
            epoch: int | None = epoch_raw
        else:
            it = result.get("training_iteration")
            epoch = it - 1 if isinstance(it, int) and it >= 1 else None
        times = self._epoch_times.setdefault(trial_id, {})
        if epoch_time is not None:
            times[epoch if epoch is not None else f"result {len(times)}"] = epoch_time
        reasons = self._over_budget(epoch_time, peak, sum(times.values()) if times else None)
        actual: dict[str, Any] = {"epoch_time": epoch_time, "peak_memory": peak}
        if (held := _number(result, HELD_BEFORE_KEYS)) is not None:
            actual["held_before"] = held  # the store leaves such a peak out of the refit
        device = self._measured_on(result)
        if reasons:
            self.stopped[trial_id] = {
                "reasons": [r.message for r in reasons],
                "reason_kinds": [r.kind for r in reasons],
                "epoch": epoch,
                "actual": actual,
                "config": dict(getattr(trial, "config", None) or {}),
            }
        repeat = self._last_recorded.get(trial_id) == (epoch, actual) and not reasons
        self._last_recorded[trial_id] = (epoch, actual)
        if self.store is not None and not repeat:
            try:
                self.store.record_measurement(
                    study=self.study,
                    trial=trial_id,
                    status="stopped" if reasons and self.enforce else "ok",
                    actual=actual,
                    device=device,
                    epoch=epoch,
                    reason="; ".join(r.message for r in reasons) or None,
                )
            except Exception as e:  # never break the experiment for the store
                if not self._warned_store:
                    self._warned_store = True
                    warnings.warn(
                        f"costaware could not write to the store: {first_line(e)}",
                        CostAwareWarning,
                        stacklevel=3,
                    )
        return reasons

    def _warn_not_numbers(self, result: Mapping[str, Any]) -> None:
        """Warn, once per key, of a cost key whose value is not a number: the trainable
        reports it, so it means a budget to be kept, and nothing checks it."""
        for key, unit, value in _not_numbers(result):
            if key in self._warned_keys:
                continue
            self._warned_keys.add(key)
            warnings.warn(
                f"costaware: the result's {key!r} must be a number of {unit}, but got "
                f"{key}={value!r} ({type(value).__name__}): nothing is checked against the "
                f"budget or recorded for it. Report it as a number, e.g. "
                f"tune.report({{{key!r}: 30.0}}).",
                CostAwareWarning,
                stacklevel=4,
            )

    def _measured_on(self, result: Mapping[str, Any]) -> str | None:
        """The device a result's measurements were taken on, which the store records them
        as: :class:`EpochMeter`'s ``"measured_on"`` where the result has it, else the
        scheduler's device. Warns once where the two differ: the refit then leaves such
        runs out of what it learns for the device predicted for."""
        measured = result.get(MEASURED_ON_KEY)
        ours = self.device.name if self.device is not None else None
        if not isinstance(measured, str) or not measured:
            return ours
        if ours is not None and measured != ours and not self._warned_device:
            self._warned_device = True
            warnings.warn(
                f"costaware predicts for {ours} (device={ours!r}), but the trials measure on "
                f"{measured}: their measurements are recorded as {measured}'s, and the "
                "predictions do not describe these runs. Give the trainable the device "
                f"(resources_per_trial={{'gpu': 1}}, or resources(spec_fn, device={ours!r})) "
                "or predict for the device it runs on.",
                CostAwareWarning,
                stacklevel=3,
            )
        return measured

    def _over_budget(
        self, epoch_time: float | None, peak: float | None, trial_time: float | None
    ) -> list[Reason]:
        if self.budget is None:
            return []
        try:
            return list(
                self.budget.check_measured(
                    device=self.device,
                    peak_memory=peak,
                    epoch_time=epoch_time,
                    trial_time=trial_time,
                )
            )
        except Exception as e:  # a relative budget ("90%") without a known device
            warnings.warn(
                f"costaware cannot check the budget: {first_line(e)}", CostAwareWarning, 3
            )
            return []


class _Resources:
    """Per-config resources from the predicted memory (see :func:`resources`)."""

    def __init__(
        self,
        spec_fn: Callable[[dict[str, Any]], TrainingSpec],
        device: str | Device,
        budget: Budget | None,
        granularity: float,
        model: CostModel | None,
        cpu: float,
    ) -> None:
        self.spec_fn = spec_fn
        self.device = device
        self.budget = budget
        self.granularity = granularity
        self.model = model
        self.cpu = cpu
        self._cpu: bool | None = None  # the trials train on a CPU (_on_cpu), once resolved

    def fraction(self, config: Mapping[str, Any]) -> float:
        """The GPU fraction for ``config``: 1.0 (a whole GPU) when the prediction fails."""
        try:
            device = get_device(self.device)
            model = self.model if self.model is not None else CostModel.default()
            self.model = model
            pred = model.predict(_build_spec(self.spec_fn, dict(config)), device=device)
            bound = self.budget.bound if self.budget is not None else "upper"
            margin = self.budget.safety_margin if self.budget is not None else 0.0
            peak = pred.peak_memory_upper if bound == "upper" else pred.peak_memory
            need = peak * (1.0 + margin) + device.context_overhead_bytes
            g = self.granularity
            steps = math.ceil(need / device.memory_bytes / g - 1e-9)
            return round(min(1.0, max(1, steps) * g), 6)  # 0.15, not 0.15000000000000002
        except Exception as e:
            warnings.warn(
                f"costaware could not size the trial ({first_line(e)}); asking for a whole GPU.",
                CostAwareWarning,
                stacklevel=2,
            )
            return 1.0

    def __call__(self, config: dict[str, Any]) -> dict[str, float]:
        if self._on_cpu():  # no GPU to pack: asking for a share of one would wait forever
            return {"cpu": self.cpu}
        return {"cpu": self.cpu, "gpu": self.fraction(config)}

    def _on_cpu(self) -> bool:
        """Whether the trials train on a CPU: ``device`` names one, or is "auto" on a
        driver that sees no GPU (said once: "auto" is resolved here, not on the workers).
        Resolved at the first trial and kept: the device does not change within a run."""
        if self._cpu is None:
            self._cpu = get_device(self.device).kind == "cpu"
            auto = is_auto(self.device)
            if auto and self._cpu:
                warnings.warn(
                    "resources(device='auto') found no GPU where it runs (the Tune driver), "
                    "so the trials ask for no GPU; if the workers have one, name it "
                    "(device='A10') to pack trials onto it by their predicted memory.",
                    CostAwareWarning,
                    stacklevel=3,
                )
            gpus = ray.cluster_resources().get("GPU", 0) if ray.is_initialized() else None  # type: ignore[no-untyped-call]
            if not self._cpu and gpus is not None and not gpus:
                # an autoscaling cluster may add GPU nodes later: said, not changed
                warnings.warn(
                    f"resources(device={self.device!r}) asks each trial for a share of a GPU, "
                    "but this Ray cluster has none (ray.cluster_resources()): the trials wait "
                    "until a GPU node joins. On a cluster without GPUs, pass device='cpu'.",
                    CostAwareWarning,
                    stacklevel=3,
                )
        return self._cpu


def resources(
    spec_fn: Callable[[dict[str, Any]], TrainingSpec],
    device: str | Device = "auto",
    budget: Budget | None = None,
    granularity: float = 0.05,
    model: CostModel | None = None,
    cpu: float = 1,
) -> Callable[[dict[str, Any]], dict[str, float]]:
    """Per-trial resources that pack trials onto GPUs by their predicted memory.

    Each config gets ``{"cpu": cpu, "gpu": fraction}`` where ``fraction`` is the predicted
    peak memory (the calibrated upper bound, or the point figure when
    ``budget.bound == "point"``; grown by ``budget.safety_margin``) plus the device's CUDA
    context overhead, divided by the device's memory, rounded *up* to a multiple of
    ``granularity`` and capped at 1.0. A prediction that fails asks for a whole GPU (fail
    safe) with a :class:`CostAwareWarning`.

    On a CPU (``device="cpu"``, or ``"auto"`` where the driver that calls this sees no
    GPU, with a warning) the trials ask for ``{"cpu": cpu}`` alone: a share of a GPU the
    cluster lacks would leave them pending.

    Ray only accounts for fractions; to also enforce them, call
    :func:`limit_memory` with ``tune.get_context().get_trial_resources()``'s GPU share at
    the start of the trainable.

    Example:
        >>> trainable = tune.with_resources(  # doctest: +SKIP
        ...     train_fn, resources=resources(spec_fn, device="A10"))
    """
    _check_spec_fn(spec_fn)
    if budget is not None:
        _check_budget(budget)
    check_options(model=model, device=device)  # an unknown device name fails here, not per trial
    if isinstance(granularity, bool) or not isinstance(granularity, (int, float)):
        raise TypeError(f"granularity must be a number, but got {granularity!r}.")
    if not 0 < granularity <= 1:
        raise ValueError(f"granularity must be in (0, 1], but got {granularity=}.")
    if isinstance(cpu, bool) or not isinstance(cpu, (int, float)) or cpu < 0:
        raise ValueError(f"cpu must be a number >= 0, but got {cpu=}.")
    return _Resources(spec_fn, device, budget, float(granularity), model, cpu)


def limit_memory(fraction: float) -> bool:
    """Cap this process's CUDA caching allocator at ``fraction`` of the GPU's memory.

    Calls ``torch.cuda.set_per_process_memory_fraction`` inside a trial; returns True when
    the cap was set. Without CUDA it does nothing, warns, and returns False.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(f"fraction must be a number, but got {fraction!r}.")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], but got {fraction=}.")
    import torch

    if not torch.cuda.is_available():
        warnings.warn(
            "limit_memory: CUDA is not available; no memory cap set.",
            CostAwareWarning,
            stacklevel=2,
        )
        return False
    torch.cuda.set_per_process_memory_fraction(float(fraction))
    return True


class EpochMeter:
    """Measures an epoch's wall time and the peak memory, inside a trainable.

    Create it *before* building the model (its memory counts from there), wrap each
    epoch's training in ``with meter:``, and report ``meter.metrics()``:
    ``{"epoch_time_s": ..., "peak_memory_bytes": ...}``. Peaks are running peaks over the
    epochs measured so far.

    On a CPU the peak is what the cost model predicts for one: the peak of the bytes held
    by PyTorch's CPU allocator (:class:`costaware.measure.profile.AllocatorPeak`), profiled from
    the meter's creation to the end of the first epoch, or to the second call of
    :meth:`step` (call it after each optimizer step to keep the profiler's few
    microseconds per op to two steps). Where the profiler cannot run (another torch
    profiler is active) it is the growth of the process's anonymous resident set since the
    meter was created (:class:`costaware.measure.profile.RssPeak`); ``memory_method`` says which.

    On CUDA, creating the meter first returns what earlier work left in the caching
    allocator (:func:`costaware.measure.profile.clear_cuda_cache`: a Ray worker that runs one trial
    after another would otherwise count an earlier trial's cached and leftover blocks),
    then records what is still reserved as ``held_before`` (``"held_before_bytes"`` in
    :meth:`metrics`): nothing of this trial's exists yet, so it is all someone else's.

    Args:
        device: ``"cuda"`` (``torch.cuda.max_memory_reserved``), ``"cpu"``, or ``"auto"``
            (CUDA when available).
    """

    def __init__(self, device: str = "auto") -> None:
        import torch

        if device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', but got {device=}.")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif device == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                "EpochMeter('cuda') needs a GPU this process can see (torch finds none); "
                "use EpochMeter() ('auto') to measure whatever the trial runs on."
            )
        self.device = device
        self.epoch_time: float | None = None
        self._t0 = 0.0
        self._cpu_memory: CpuMemoryMeter | None = None
        self._steps = 0
        self.held_before: int | None = None
        if device == "cuda":
            self.held_before = clear_cuda_cache()
            torch.cuda.reset_peak_memory_stats()
        else:
            self._cpu_memory = CpuMemoryMeter(
                "from the meter's creation to the end of the first epoch or the second step()",
                "since the meter was created",
            ).start()

    def step(self) -> None:
        """Optional, after each optimizer step: on a CPU, profiling stops after the second."""
        self._steps += 1
        if self._steps == 2 and self._cpu_memory is not None:
            self._cpu_memory.end_profiling()

    @property
    def memory_method(self) -> str:
        """How :meth:`peak_memory` is measured."""
        if self.device == "cuda":
            return "torch.cuda.max_memory_reserved since the meter was created"
        return self._cpu_memory.method if self._cpu_memory is not None else "not measured"

    def peak_memory(self) -> int | None:
        """Peak memory since the meter was created, in bytes; None where it could not be
        measured (:attr:`memory_method` says why)."""
        if self.device == "cuda":
            import torch

            return int(torch.cuda.max_memory_reserved())
        return None if self._cpu_memory is None else self._cpu_memory.peak()

    def __enter__(self) -> EpochMeter:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
        self.epoch_time = time.perf_counter() - self._t0
        if self._cpu_memory is not None:
            self._cpu_memory.end_profiling()  # after the epoch's time: not the epoch's work

    @functools.cached_property
    def measured_on(self) -> str:
        """The device this meter measures: its catalog name (``"H100-SXM"``, the CPU's
        name), or the name CUDA gives a GPU the catalog does not know."""
        import torch

        from costaware.devices import cpu_device

        if self.device != "cuda":
            return cpu_device().name
        name = torch.cuda.get_device_name()
        try:
            return get_device(name).name
        except Exception:
            return name

    def metrics(self) -> dict[str, float | str]:
        """``{"epoch_time_s", "peak_memory_bytes", "measured_on"}`` for ``tune.report``
        (on CUDA also ``"held_before_bytes"``; no ``"peak_memory_bytes"`` where
        :meth:`peak_memory` is None). ``"measured_on"`` names the device measured, which
        the scheduler records the measurements as."""
        out: dict[str, float | str] = {MEASURED_ON_KEY: self.measured_on}
        peak = self.peak_memory()
        if peak is not None:
            out["peak_memory_bytes"] = float(peak)
        if self.epoch_time is not None:
            out["epoch_time_s"] = self.epoch_time
        if self.held_before is not None:
            out["held_before_bytes"] = float(self.held_before)
        return out
