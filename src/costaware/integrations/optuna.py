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
prediction record goes to the :class:`~costaware.runtime.store.ObservationStore` that the
Lightning callback's measurements join for the online refit.

The user's bug fails fast, costaware's own failure fails open. An error in the user's code
(``spec_fn`` raising, a model factory that needs arguments, a shape mismatch, an exception
in the factory, forward or loss) is raised out of ``should_prune()`` or :func:`admit` as a
:class:`~costaware.UserCodeError` (or :class:`~costaware.SpecError`) that says where and
what to change: the trial FAILs with it, and ``study.optimize`` stops on that first trial
unless its ``catch`` names the error. It is an instance of the user's own exception's type
too (a ``RuntimeError`` for a shape mismatch, say), so ``catch=(RuntimeError,)`` goes on
past it as it would without costaware. A prediction that fails for costaware's own reasons
(the model cannot run on fake tensors, the dry run's time limit) never crashes the study:
by default the trial is admitted, a warning is issued and the reason is recorded
(``fail_open=False`` rejects instead).

Hyperband: Optuna only applies Hyperband's bracket logic to the sampler when
``isinstance(study.pruner, HyperbandPruner)``, so wrapping a ``HyperbandPruner`` in
``CostAwarePruner(wrapped=...)`` loses it. Use :class:`CostAwareHyperbandPruner`, which *is*
a ``HyperbandPruner`` with the cost gate in front.

Example:
    >>> import optuna, costaware as ca
    >>> from costaware import zoo
    >>> from costaware.integrations.optuna import CostAwarePruner, pruned
    >>> def spec_fn(params):
    ...     return ca.TrainingSpec(model=lambda: zoo.mlp(784, (params["width"],), 10),
    ...                            batch=ca.ImageBatch((784,), classes=10), batch_size=params["bs"])
    >>> pruner = CostAwarePruner(spec_fn=spec_fn, budget=ca.Budget(max_memory="2GiB"), device="T4")
    >>> study = optuna.create_study(pruner=pruner)
    >>> def objective(trial):
    ...     trial.suggest_int("width", 64, 512); trial.suggest_int("bs", 8, 64)
    ...     if trial.should_prune():
    ...         raise pruned(trial)  # Optuna's log line then says why
    ...     return 0.0
    >>> study.optimize(objective, n_trials=2)
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections import OrderedDict
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

from costaware.budget import Budget
from costaware.core.model import CostModel
from costaware.devices import Device
from costaware.errors import CostAwareWarning, SpecError, warn_at_users_line
from costaware.integrations._keywords import keyword_options
from costaware.runtime.gate import Gate, spec_build_error
from costaware.spec import TrainingSpec

__all__ = [
    "CostAwareHyperbandPruner",
    "CostAwarePruner",
    "CostAwareWarning",
    "admit",
    "decision",
    "pruned",
    "study_gate",
]

#: user attribute keys (prefix ``costaware:``)
ATTR = "costaware:"


def study_spent(study: optuna.Study) -> float:
    """Seconds the study's finished trials took (what ``max_total_time`` and, at the
    budget's ``price_per_hour``, ``max_cost`` count)."""
    total = 0.0
    for t in study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    ):
        if t.duration is not None:
            total += t.duration.total_seconds()
    return total


_LOG = optuna.logging.get_logger("optuna.costaware")
#: the studies (by name) already told that their budget is spent, in this process
_SPENT_TOLD: set[str] = set()
#: per study, the trials rejected in a row for its max_total_time or max_cost alone
_SPENT_STREAK: dict[str, int] = {}
_SPENT_LOCK = threading.Lock()
#: trials in a row that the rest of the study's budget fits none of, after which it stops
SPENT_STREAK_LIMIT = 10
_CUMULATIVE = frozenset({"total_time", "cost"})


def stop_when_spent(
    study: optuna.Study, budget: Budget, spent_time: float, reason_kinds: Any = ()
) -> None:
    """After each judged trial (``reason_kinds``: the kinds of limit it broke; none when
    admitted): stop ``study`` once what it has spent reaches its ``max_total_time`` or
    ``max_cost``, or once :data:`SPENT_STREAK_LIMIT` trials in a row broke only those
    (what is left of the budget fits none of the trials the sampler proposes). Every
    further trial would be rejected, and a study without ``n_trials`` or ``timeout``
    would ask for them without end. Warns once per study. Outside ``optimize`` (ask and
    tell), where ``study.stop`` cannot act, the warning says to stop asking."""
    kinds = set(reason_kinds)
    name = study.study_name
    with _SPENT_LOCK:
        if kinds and kinds <= _CUMULATIVE:
            streak = _SPENT_STREAK[name] = _SPENT_STREAK.get(name, 0) + 1
        elif not kinds:
            streak = _SPENT_STREAK[name] = 0
        else:
            streak = _SPENT_STREAK.get(name, 0)
    why = budget.exhausted(spent_time)
    if why is None and streak >= SPENT_STREAK_LIMIT:
        why = (
            f"{streak} trials in a row would pass the study's "
            + " or ".join(k for k, on in (("max_total_time", budget.max_total_time),
                                          ("max_cost", budget.max_cost)) if on is not None)
            + " (what is left fits none of the trials proposed)"
        )  # fmt: skip
    if why is None:
        return
    try:
        study.stop()
        done = "stopping it"
    except RuntimeError:  # not inside optimize: the caller's loop asks for trials
        done = "every further trial will be rejected: stop asking for trials"
    with _SPENT_LOCK:
        if name in _SPENT_TOLD:
            return
        _SPENT_TOLD.add(name)
    warnings.warn(f"costaware: study {name!r}: {why}; {done}.", CostAwareWarning, stacklevel=3)


#: how a rejection begins, in the log and in the ``TrialPruned`` that :func:`admit` raises
_REJECTED = "rejected by costaware before it ran: "


def _log_rejection(number: int, reasons: list[str]) -> None:
    """The pruner's rejection of a trial, with its reasons, at INFO: the objective's
    ``raise optuna.TrialPruned()`` after ``should_prune()`` makes Optuna's own line say
    only "pruned" (``raise pruned(trial)`` puts the reasons there too)."""
    _LOG.info(f"Trial {number} {_REJECTED}{'; '.join(reasons)}")


class _PrunerGate:
    """The pre-launch decision as a pruner mixin (first ``should_prune`` with no step)."""

    _gate: Gate
    _spec_fn: Callable[[dict[str, Any]], TrainingSpec] | None
    _warned_unjudged: set[str]

    def _init_gate(
        self,
        spec_fn: Callable[[dict[str, Any]], TrainingSpec] | None,
        budget: Budget | None,
        device: str | Device,
        *,
        model: CostModel | None,
        store: Any,
        refit_every: int | None,
        fail_open: bool,
    ) -> None:
        """The state every costaware pruner holds: its spec_fn and its gate."""
        self._spec_fn = spec_fn
        self._warned_unjudged = set()
        self._gate = Gate(
            budget,
            device,
            model=model,
            store=store,
            refit_every=refit_every,
            fail_open=fail_open,
        )

    @property
    def gate(self) -> Gate:
        """The :class:`~costaware.runtime.gate.Gate` (budget, device, model, store) this pruner
        judges with; ``CostAwareCallback(trial=trial)`` and :func:`admit` use it too."""
        return self._gate

    def _warn_unjudged(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Once per study: a trial reported a step without having been judged."""
        if study.study_name in self._warned_unjudged:
            return
        known = study._storage.get_trial_user_attrs(trial._trial_id).get(ATTR + "admit")
        if known is not None:
            return
        self._warned_unjudged.add(study.study_name)
        where = (
            "call trial.should_prune() right after suggesting the parameters, before anything "
            "is built"
            if self._spec_fn is not None
            else "pass trial=trial to CostAwareCallback, or call admit(trial, spec) before "
            "training (this pruner has no spec_fn to judge with)"
        )
        warn_at_users_line(
            f"trial {trial.number} of study {study.study_name!r} reported a step before "
            f"costaware judged it, so its cost was never checked: {where}."
        )

    def _warn_finished_unjudged(self, study: optuna.Study) -> None:
        """Once per study, without a ``spec_fn``: a trial finished that nothing judged (no
        callback with ``trial=``, no ``admit``), so the pruner checks nothing."""
        if study.study_name in self._warned_unjudged:
            return
        done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        unjudged = [t for t in done if ATTR + "admit" not in t.user_attrs]
        if not unjudged:
            return
        self._warned_unjudged.add(study.study_name)
        warn_at_users_line(
            f"trial {unjudged[0].number} of study {study.study_name!r} finished without "
            "costaware judging it: this pruner has no spec_fn, so it judges through "
            "CostAwareCallback(trial=trial) in the Trainer or admit(trial, spec) before "
            "training, and the objective calls neither."
        )

    def _pre_launch(self, study: optuna.Study, trial: FrozenTrial) -> bool | None:
        """True/False for the pre-launch decision; None when it is not the time for it."""
        if trial.last_step is not None:
            self._warn_unjudged(study, trial)
            return None
        if self._spec_fn is None:  # judged where the spec is built (callback, admit)
            self._warn_finished_unjudged(study)
            return False
        # the FrozenTrial a pruner gets is a cached copy: ask the storage what was decided
        known = study._storage.get_trial_user_attrs(trial._trial_id).get(ATTR + "admit")
        if known is not None:  # judged already (a second early should_prune call)
            return not known
        spec, spec_error = None, None
        try:
            spec = self._spec_fn(dict(trial.params))
            if not isinstance(spec, TrainingSpec):
                raise SpecError(
                    f"spec_fn must return a costaware.TrainingSpec, but returned {type(spec).__name__}"
                )
        except Exception as e:  # the user's bug is raised by judge (the trial fails), ours admits
            spec_error = spec_build_error(e, what="spec_fn", params=trial.params)
        spent = study_spent(study)
        verdict = self._gate.judge(
            spec,
            study=study.study_name,
            trial=trial.number,
            error=spec_error,
            spent_time=spent,
            params=trial.params,
        )
        storage = study._storage
        for key, value in verdict.info.items():
            storage.set_trial_user_attr(trial._trial_id, ATTR + key, value)
        for key, value in verdict.constraints.items():
            storage.set_trial_system_attr(trial._trial_id, "constraints:" + key, value)
        # the objective's Trial reads its user attributes from a cached copy, which the
        # FrozenTrial given here shares: it sees the decision without a storage read
        trial.user_attrs.update({ATTR + k: v for k, v in verdict.info.items()})
        if not verdict.admit:
            _log_rejection(trial.number, list(verdict.info.get("reasons", [])))
        stop_when_spent(study, self._gate.budget, spent, verdict.info.get("reason_kinds", ()))
        return not verdict.admit


def _check_spec_fn(spec_fn: Any) -> None:
    if spec_fn is not None and not callable(spec_fn):
        raise TypeError(f"spec_fn must be callable(params) -> TrainingSpec, but got {spec_fn!r}.")


def decision(trial: optuna.Trial | FrozenTrial) -> dict[str, Any]:
    """What costaware decided for ``trial``, read from the study's storage: ``admit``,
    ``reasons`` and the prediction's figures (the ``costaware:`` user attributes without
    their prefix); empty if it was not judged.

    Example:
        >>> if trial.should_prune():                    # doctest: +SKIP
        ...     print(decision(trial)["reasons"])       # doctest: +SKIP
        ...     raise pruned(trial)                     # doctest: +SKIP
    """
    if isinstance(trial, optuna.Trial):
        attrs = trial.storage.get_trial_user_attrs(trial._trial_id)
    else:
        attrs = trial.user_attrs
    return {k[len(ATTR) :]: v for k, v in attrs.items() if k.startswith(ATTR)}


def pruned(trial: optuna.Trial | FrozenTrial) -> optuna.TrialPruned:
    """The ``TrialPruned`` to raise for a pruned trial, its message why, so that Optuna's
    log line says it: ``raise pruned(trial)``. A trial costaware rejected gets its
    reasons (``Trial 3 pruned. rejected by costaware before it ran: ...``, the one line
    that says it: a bare ``TrialPruned()`` leaves them in ``trial.user_attrs`` alone);
    one it admitted was pruned by the wrapped pruner on the values reported."""
    found = decision(trial)
    reasons = found.get("reasons") or []
    if not reasons and found.get("admit") is True:
        step = getattr(trial, "last_step", None)  # a FrozenTrial's; a Trial has none
        at = f" at step {step}" if step is not None else ""
        return optuna.TrialPruned(f"pruned by the study's pruner{at} (costaware admitted it)")
    return optuna.TrialPruned(_REJECTED + ("; ".join(reasons) or "no reason"))


def _pruner_class(obj: Any) -> bool:
    """Whether ``obj`` is a pruner's class where an instance belongs."""
    return isinstance(obj, type) and issubclass(obj, BasePruner)


class CostAwarePruner(BasePruner, _PrunerGate):
    """Prunes trials predicted to break a :class:`~costaware.Budget`, before they start.

    ``CostAwarePruner()`` with no arguments judges every trial against the memory of the
    GPU this process sees: the spec then comes from the training code, through
    ``CostAwareCallback(trial=trial)`` (Lightning) or :func:`admit` (any loop), which use
    this pruner's budget, device and store. With ``spec_fn``, the trial is judged at its
    first ``trial.should_prune()`` (before anything is built); raise :func:`pruned` to
    carry the reasons into Optuna's log.

    The wrapped pruner is the one argument given by position, as Optuna's
    ``PatientPruner`` takes it; the options are keywords:
    ``CostAwarePruner(MedianPruner(), spec_fn=spec_fn, budget=budget)``. The earlier
    positional form, ``CostAwarePruner(spec_fn, budget, device, wrapped)``, still works
    with a ``FutureWarning`` that names the keywords.

    Args:
        wrapped: a pruner to consult after the first report (default: none).
        spec_fn: ``params -> TrainingSpec``, from the trial's suggested parameters
            (optional: see above).
        budget: the limits a trial must fit (default ``Budget()``: the device's memory).
        device: a catalog name, a ``Device``, or ``"auto"`` (the local GPU).
        model: the cost model (default: the shipped one).
        store: an ``ObservationStore`` or its URL, to record predictions (and to refit).
        refit_every: with a store, refit after this many measured trials (None: never).
        fail_open: admit a trial whose prediction fails (default) or reject it.
    """

    @keyword_options(
        ("spec_fn", "budget", "device", "wrapped"),
        positional=1,
        is_old_first=lambda first: (
            first is not None and not isinstance(first, BasePruner) and not _pruner_class(first)
        ),
    )
    def __init__(
        self,
        wrapped: BasePruner | None = None,
        *,
        spec_fn: Callable[[dict[str, Any]], TrainingSpec] | None = None,
        budget: Budget | None = None,
        device: str | Device = "auto",
        model: CostModel | None = None,
        store: Any = None,
        refit_every: int | None = 5,
        fail_open: bool = True,
    ) -> None:
        _check_spec_fn(spec_fn)
        if _pruner_class(wrapped):
            name = getattr(wrapped, "__name__", "")
            raise TypeError(
                f"wrapped must be a pruner, not its class: write {name}() (with its options), "
                f"but got the class {name}."
            )
        if wrapped is not None and not isinstance(wrapped, BasePruner):
            raise TypeError(f"wrapped must be an optuna pruner, but got {type(wrapped).__name__}.")
        if isinstance(wrapped, HyperbandPruner):
            warnings.warn(
                "wrapping HyperbandPruner disables its bracket logic in the sampler; "
                "use CostAwareHyperbandPruner instead.",
                CostAwareWarning,
                stacklevel=3,  # the user's line, past keyword_options' wrapper
            )
        self._wrapped = wrapped
        self._init_gate(
            spec_fn,
            budget,
            device,
            model=model,
            store=store,
            refit_every=refit_every,
            fail_open=fail_open,
        )

    @property
    def refit(self) -> Any:
        """The :class:`~costaware.runtime.refit.OnlineRefit` in use, or None."""
        return self._gate.refit

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        decided = self._pre_launch(study, trial)
        if decided is not None:
            return decided
        return self._wrapped.prune(study, trial) if self._wrapped is not None else False


class CostAwareHyperbandPruner(HyperbandPruner, _PrunerGate):
    """A ``HyperbandPruner`` with the cost gate in front, so Hyperband's brackets still work.

    Takes the keyword options of :class:`CostAwarePruner` (``spec_fn``, ``budget``,
    ``device``, ...) plus any ``HyperbandPruner`` keyword argument. The earlier positional
    form, ``CostAwareHyperbandPruner(spec_fn, budget, device)``, still works with a
    ``FutureWarning`` that names the keywords.
    """

    @keyword_options(("spec_fn", "budget", "device"))
    def __init__(
        self,
        *,
        spec_fn: Callable[[dict[str, Any]], TrainingSpec] | None = None,
        budget: Budget | None = None,
        device: str | Device = "auto",
        model: CostModel | None = None,
        store: Any = None,
        refit_every: int | None = 5,
        fail_open: bool = True,
        **hyperband: Any,
    ) -> None:
        _check_spec_fn(spec_fn)
        super().__init__(**hyperband)
        self._init_gate(
            spec_fn,
            budget,
            device,
            model=model,
            store=store,
            refit_every=refit_every,
            fail_open=fail_open,
        )

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        decided = self._pre_launch(study, trial)
        if decided is not None:
            return decided
        return bool(super().prune(study, trial))


#: the gates ``admit`` keeps, least recently used first: an objective that builds its
#: Budget (or store URL) anew on every trial finds its gate again, as budgets and URLs are
#: keyed by value, and one that passes a new model or store object every trial finds the
#: oldest gates dropped, so the number held never grows past this
_GATES_MAX = 16
_GATES: OrderedDict[tuple[Any, ...], Gate] = OrderedDict()
_GATES_LOCK = threading.Lock()


def _gate_key(
    budget: Budget, model: CostModel | None, store: Any, device: str | Device, fail_open: bool
) -> tuple[Any, ...]:
    """What makes two ``admit`` calls judge alike: a Budget by value (a frozen dataclass),
    a store URL or path by value, a model or store object by identity (the gate keeps a
    reference, so the id is not reused while the gate is held)."""
    budget_key: Any = ("value", budget)
    try:
        hash(budget)
    except TypeError:  # a field of an unhashable type
        budget_key = ("id", id(budget))
    if isinstance(store, (str, bytes, os.PathLike)):
        store_key: Any = ("value", os.fsdecode(store) if not isinstance(store, str) else store)
    else:
        store_key = ("id", id(store))
    return (budget_key, id(model), store_key, str(device), bool(fail_open))


def study_gate(study: optuna.Study) -> Gate | None:
    """The gate of the study's costaware pruner (its budget, device, model and store), or
    None when the study's pruner is not one."""
    pruner = getattr(study, "pruner", None)
    return pruner.gate if isinstance(pruner, _PrunerGate) else None


def admit(
    trial: optuna.Trial,
    spec: TrainingSpec,
    budget: Budget | None = None,
    *,
    device: str | Device | None = None,
    model: CostModel | None = None,
    store: Any = None,
    fail_open: bool = True,
) -> Mapping[str, Any]:
    """Judge ``spec`` inside an objective: record it, and raise ``TrialPruned`` if rejected
    (its message the reasons, so Optuna's log says why).

    With neither ``budget`` nor ``device`` (nor ``model``, ``store``), the study's
    :class:`CostAwarePruner` judges, with its budget, device and store; without one, the
    budget is ``Budget()`` (the memory of the GPU this process sees). Returns the recorded
    attributes (the prediction's figures) for an admitted trial. Sets the same user
    attributes and constraints as :class:`CostAwarePruner`. A trial judged already (by
    the pruner's ``spec_fn``, a callback or an earlier call) is not judged again: its
    decision stands.

    Example:
        >>> def objective(trial):
        ...     model, batch = build(trial)                                   # doctest: +SKIP
        ...     admit(trial, ca.TrainingSpec.from_module(model, batch))      # doctest: +SKIP
    """
    known = decision(trial)
    if "admit" in known:  # judged already (the pruner's spec_fn, a callback, an admit)
        if not known["admit"]:
            raise pruned(trial)
        return known
    own = study_gate(trial.study)
    if own is not None and budget is None and device is None and model is None and store is None:
        gate = own
    else:
        dev = device if device is not None else "auto"
        key = _gate_key(budget or Budget(), model, store, dev, fail_open)
        with _GATES_LOCK:
            found = _GATES.get(key)
            if found is None:
                found = _GATES[key] = Gate(budget, dev, model=model, store=store, fail_open=fail_open)
                while len(_GATES) > _GATES_MAX:
                    _GATES.popitem(last=False)
            _GATES.move_to_end(key)
        gate = found
    t0 = time.perf_counter()
    spent = study_spent(trial.study)
    verdict = gate.judge(
        spec,
        study=trial.study.study_name,
        trial=trial.number,
        spent_time=spent,
        params=trial.params,
    )
    attrs = verdict.info
    attrs["gate_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
    for k, v in attrs.items():
        trial.set_user_attr(ATTR + k, v)
    for k, v in verdict.constraints.items():
        trial.set_constraint(k, v)
    stop_when_spent(trial.study, gate.budget, spent, attrs.get("reason_kinds", ()))
    if not verdict.admit:
        # Optuna logs the message once ("Trial 3 pruned. rejected by costaware ...")
        raise optuna.TrialPruned(_REJECTED + ("; ".join(attrs.get("reasons", [])) or "no reason"))
    return attrs
