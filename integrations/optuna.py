"""Optuna integration: reject trials predicted to OOM or blow the budget before they run.

Two ways in:

- :class:`CostAwarePruner` for ``optuna.create_study(pruner=...)``. The objective suggests
  its parameters and calls ``trial.should_prune()`` before it builds anything; the first
  such call (no step reported yet) builds the spec with ``spec_fn(params)``, predicts,
  decides against the budget, and prunes a rejected trial. PRUNED, not FAIL: TPE learns
  the infeasible region from pruned trials and ignores failed ones. Later calls go to the
  wrapped pruner.
- :func:`admit` for objectives that build the spec themselves: it predicts, decides,
  records, and raises ``optuna.TrialPruned`` for a rejected trial.

Either way, the prediction and the decision are written as user attributes through the
study's storage (readable from any worker), a constraint is set on *every* trial so that
GPSampler, NSGA-II and ``study.best_trial`` respect feasibility, and, with a store, a
prediction record goes to the :class:`~costaware.store.ObservationStore` that the
Lightning callback's measurements join for the online refit.

A prediction that fails never crashes the study: by default the trial is admitted, a
warning is issued and the reason is recorded (``fail_open=False`` rejects instead).

Hyperband: Optuna only applies Hyperband's bracket logic to the sampler when
``isinstance(study.pruner, HyperbandPruner)``, so wrapping a ``HyperbandPruner`` in
``CostAwarePruner(wrapped=...)`` loses it. Use :class:`CostAwareHyperbandPruner`, which *is*
a ``HyperbandPruner`` with the cost gate in front.

Example:
    >>> import optuna, costaware as ca
    >>> from costaware import zoo
    >>> from costaware.integrations.optuna import CostAwarePruner
    >>> def spec_fn(params):
    ...     return ca.TrainingSpec(model=lambda: zoo.mlp(784, (params["width"],), 10),
    ...                            batch=ca.ImageBatch((784,), classes=10), batch_size=params["bs"])
    >>> pruner = CostAwarePruner(spec_fn, ca.Budget(max_memory="2GiB"), device="T4")
    >>> study = optuna.create_study(pruner=pruner)
    >>> def objective(trial):
    ...     trial.suggest_int("width", 64, 512); trial.suggest_int("bs", 8, 64)
    ...     if trial.should_prune():
    ...         raise optuna.TrialPruned()
    ...     return 0.0
    >>> study.optimize(objective, n_trials=2)
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

try:
    import optuna
    from optuna.pruners import BasePruner, HyperbandPruner
    from optuna.trial import FrozenTrial, TrialState
except ImportError as e:  # pragma: no cover - exercised only without optuna
    raise ImportError(
        "costaware.integrations.optuna needs Optuna: pip install 'costaware[optuna]'"
    ) from e

from costaware.budget import Budget, Decision
from costaware.devices import Device, get_device
from costaware.errors import CostAwareWarning
from costaware.model import CostModel, Prediction
from costaware.spec import TrainingSpec

__all__ = ["CostAwareHyperbandPruner", "CostAwarePruner", "CostAwareWarning", "admit"]

#: user attribute keys (prefix ``costaware:``)
ATTR = "costaware:"
CONSTRAINT_MEMORY = "costaware_memory"
CONSTRAINT_TIME = "costaware_time"


def _spent(study: optuna.Study) -> float:
    """Seconds the study's finished trials took."""
    total = 0.0
    for t in study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    ):
        if t.duration is not None:
            total += t.duration.total_seconds()
    return total


class _Gate:
    """Predict, decide, record: shared by the pruners and :func:`admit`."""

    def __init__(
        self,
        budget: Budget,
        device: str | Device,
        model: CostModel | None,
        store: Any,
        refit_every: int | None,
        fail_open: bool,
    ) -> None:
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be a costaware.Budget, but got {type(budget).__name__}.")
        self.budget = budget
        self.device = device
        self.fail_open = fail_open
        self._model = model
        self._device: Device | None = None
        self._lock = threading.Lock()
        if isinstance(store, (str, bytes)) or hasattr(store, "__fspath__"):
            from costaware.store import ObservationStore

            store = ObservationStore(store)
        self.store = store
        self.refit = None
        if store is not None and refit_every:
            from costaware.refit import OnlineRefit

            self.refit = OnlineRefit(store, base=model, every=refit_every)

    def model(self) -> CostModel:
        if self.refit is not None:
            self.refit.maybe_refit()  # non-blocking: refits in the background
            return self.refit.model()
        with self._lock:
            if self._model is None:
                self._model = CostModel.default()
            return self._model

    def resolved_device(self) -> Device:
        if self._device is None:
            self._device = get_device(self.device)
        return self._device

    def constraints(self, pred: Prediction | None, decision: Decision | None) -> dict[str, float]:
        """One value per budgeted quantity, for every trial: <= 0 is feasible."""
        out: dict[str, float] = {}
        checked = decision.checked if decision is not None else {}
        if self.budget.max_memory is not None:
            m = checked.get("memory")
            out[CONSTRAINT_MEMORY] = float(m["predicted"] - m["limit"]) / 2**30 if m else 0.0
        if self.budget.max_epoch_time is not None or self.budget.max_trial_time is not None:
            key = "epoch_time" if self.budget.max_epoch_time is not None else "trial_time"
            t = checked.get(key)
            out[CONSTRAINT_TIME] = (
                float(t["predicted"] - t["limit"]) if t and t.get("predicted") is not None else 0.0
            )
        return out

    def judge(
        self,
        spec: TrainingSpec | None,
        spec_error: Exception | None,
        study_name: str,
        number: int,
        spent: float,
    ) -> tuple[bool, dict[str, Any], dict[str, float]]:
        """Returns (admit, user attrs, constraints); never raises."""
        attrs: dict[str, Any] = {}
        pred: Prediction | None = None
        decision: Decision | None = None
        error = spec_error
        features = None
        model = None
        if error is None and spec is not None:
            try:
                model = self.model()
                device = self.resolved_device()
                pred = model.predict(spec, device=device)
                decision = self.budget.decide(pred, device=device, spent_time=spent)
            except Exception as e:  # fail open (or closed), never crash the study
                error = e
        if error is not None:
            admit_it = self.fail_open
            reason = f"prediction failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            warnings.warn(
                f"costaware could not judge trial {number}: {reason}; "
                f"{'admitting' if admit_it else 'rejecting'} it (fail_open={self.fail_open}).",
                CostAwareWarning,
                stacklevel=3,
            )
            attrs.update(
                {"admit": admit_it, "error": reason, "reasons": [] if admit_it else [reason]}
            )
            status = "error"
        else:
            assert pred is not None and decision is not None
            admit_it = decision.admit
            reason = "; ".join(r.message for r in decision.reasons)
            attrs.update(
                {
                    "admit": admit_it,
                    "reasons": [r.message for r in decision.reasons],
                    "reason_kinds": [r.kind for r in decision.reasons],
                    "peak_memory": pred.peak_memory,
                    "peak_memory_upper": pred.peak_memory_upper,
                    "iteration_time": pred.iteration_time,
                    "epoch_time": pred.epoch_time,
                    "epoch_time_upper": pred.epoch_time_upper,
                    "trial_time": pred.trial_time,
                    "device": pred.device,
                    "model": pred.kind,
                    "latency_ms": round(pred.latency_s * 1e3, 2),
                }
            )
            status = "admitted" if admit_it else "rejected"
        if self.store is not None:
            try:
                if model is not None and spec is not None and error is None:
                    features = model.features(spec, self.resolved_device())
                self.store.record_prediction(
                    study=study_name,
                    trial=number,
                    spec=spec.summary() if spec is not None else {},
                    features=features,
                    prediction=pred.to_dict() if pred is not None else None,
                    decision=decision.to_dict() if decision is not None else None,
                    device=pred.device if pred is not None else None,
                    status=status,
                    reason=reason or None,
                )
            except Exception as e:  # an unreachable store never stops the study
                attrs["store_error"] = f"{type(e).__name__}: {e}"
                warnings.warn(
                    f"costaware could not write to the store: {e}", CostAwareWarning, stacklevel=3
                )
        return admit_it, attrs, self.constraints(pred, decision)


class _PrunerGate:
    """The pre-launch decision as a pruner mixin (first ``should_prune`` with no step)."""

    _gate: _Gate
    _spec_fn: Callable[[dict[str, Any]], TrainingSpec]

    def _pre_launch(self, study: optuna.Study, trial: FrozenTrial) -> bool | None:
        """True/False for the pre-launch decision; None when it is not the time for it."""
        if trial.last_step is not None:
            return None
        # the FrozenTrial a pruner gets is a cached copy: ask the storage what was decided
        known = study._storage.get_trial_user_attrs(trial._trial_id).get(ATTR + "admit")
        if known is not None:  # judged already (a second early should_prune call)
            return not known
        spec, spec_error = None, None
        try:
            spec = self._spec_fn(dict(trial.params))
            if not isinstance(spec, TrainingSpec):
                raise TypeError(
                    f"spec_fn must return a costaware.TrainingSpec, but returned {type(spec).__name__}"
                )
        except Exception as e:
            spec_error = e
        admit_it, attrs, constraints = self._gate.judge(
            spec, spec_error, study.study_name, trial.number, _spent(study)
        )
        storage = study._storage
        for key, value in attrs.items():
            storage.set_trial_user_attr(trial._trial_id, ATTR + key, value)
        for key, value in constraints.items():
            storage.set_trial_system_attr(trial._trial_id, "constraints:" + key, value)
        return not admit_it


def _check_spec_fn(spec_fn: Any) -> None:
    if not callable(spec_fn):
        raise TypeError(f"spec_fn must be callable(params) -> TrainingSpec, but got {spec_fn!r}.")


class CostAwarePruner(BasePruner, _PrunerGate):
    """Prunes trials predicted to break a :class:`~costaware.Budget`, before they start.

    Args:
        spec_fn: ``params -> TrainingSpec``, from the trial's suggested parameters.
        budget: the limits a trial must fit.
        device: a catalog name, a ``Device``, or ``"auto"`` (the local GPU).
        wrapped: a pruner to consult after the first report (default: none).
        model: the cost model (default: the shipped one).
        store: an ``ObservationStore`` or its URL, to record predictions (and to refit).
        refit_every: with a store, refit after this many measured trials (None: never).
        fail_open: admit a trial whose prediction fails (default) or reject it.
    """

    def __init__(
        self,
        spec_fn: Callable[[dict[str, Any]], TrainingSpec],
        budget: Budget,
        device: str | Device = "auto",
        wrapped: BasePruner | None = None,
        *,
        model: CostModel | None = None,
        store: Any = None,
        refit_every: int | None = 5,
        fail_open: bool = True,
    ) -> None:
        _check_spec_fn(spec_fn)
        if wrapped is not None and not isinstance(wrapped, BasePruner):
            raise TypeError(f"wrapped must be an optuna pruner, but got {type(wrapped).__name__}.")
        if isinstance(wrapped, HyperbandPruner):
            warnings.warn(
                "wrapping HyperbandPruner disables its bracket logic in the sampler; "
                "use CostAwareHyperbandPruner instead.",
                CostAwareWarning,
                stacklevel=2,
            )
        self._spec_fn = spec_fn
        self._wrapped = wrapped
        self._gate = _Gate(budget, device, model, store, refit_every, fail_open)

    @property
    def refit(self) -> Any:
        """The :class:`~costaware.refit.OnlineRefit` in use, or None."""
        return self._gate.refit

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        decided = self._pre_launch(study, trial)
        if decided is not None:
            return decided
        return self._wrapped.prune(study, trial) if self._wrapped is not None else False


class CostAwareHyperbandPruner(HyperbandPruner, _PrunerGate):
    """A ``HyperbandPruner`` with the cost gate in front, so Hyperband's brackets still work.

    Takes ``spec_fn`` and ``budget`` (and the keyword options of :class:`CostAwarePruner`)
    plus any ``HyperbandPruner`` keyword argument.
    """

    def __init__(
        self,
        spec_fn: Callable[[dict[str, Any]], TrainingSpec],
        budget: Budget,
        device: str | Device = "auto",
        *,
        model: CostModel | None = None,
        store: Any = None,
        refit_every: int | None = 5,
        fail_open: bool = True,
        **hyperband: Any,
    ) -> None:
        _check_spec_fn(spec_fn)
        super().__init__(**hyperband)
        self._spec_fn = spec_fn
        self._gate = _Gate(budget, device, model, store, refit_every, fail_open)

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        decided = self._pre_launch(study, trial)
        if decided is not None:
            return decided
        return bool(super().prune(study, trial))


_GATES: dict[tuple[int, int, int, str, bool], _Gate] = {}
_GATES_LOCK = threading.Lock()


def admit(
    trial: optuna.Trial,
    spec: TrainingSpec,
    budget: Budget,
    *,
    device: str | Device = "auto",
    model: CostModel | None = None,
    store: Any = None,
    fail_open: bool = True,
) -> Mapping[str, Any]:
    """Judge ``spec`` inside an objective: record it, and raise ``TrialPruned`` if rejected.

    Returns the recorded attributes (the prediction's figures) for an admitted trial.
    Sets the same user attributes and constraints as :class:`CostAwarePruner`.

    Example:
        >>> def objective(trial):
        ...     spec = build_spec(trial)          # doctest: +SKIP
        ...     admit(trial, spec, ca.Budget(max_memory="24GiB"), device="A10")  # doctest: +SKIP
    """
    key = (id(budget), id(model), id(store), str(device), fail_open)
    with _GATES_LOCK:
        gate = _GATES.get(key)
        if gate is None:
            gate = _GATES[key] = _Gate(budget, device, model, store, None, fail_open)
    t0 = time.perf_counter()
    admit_it, attrs, constraints = gate.judge(
        spec, None, trial.study.study_name, trial.number, _spent(trial.study)
    )
    attrs["gate_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
    for k, v in attrs.items():
        trial.set_user_attr(ATTR + k, v)
    for k, v in constraints.items():
        trial.set_constraint(k, v)
    if not admit_it:
        raise optuna.TrialPruned("; ".join(attrs.get("reasons", [])) or "rejected by costaware")
    return attrs
