"""The pre-launch judgement every integration shares: predict, decide, record.

:class:`Gate` holds a budget, a device, a cost model (refitted online when a store is
given) and the fail policy. :meth:`Gate.judge` fails fast on the user's bug and open on
costaware's own failure: a spec the user's code could not build, or one whose training
step fails as a real one would (:class:`~costaware.errors.UserCodeError`, a
:class:`~costaware.errors.SpecError`), is raised, so that the trial fails with it; a
prediction that fails for costaware's own reasons (the model cannot run on fake tensors,
the dry run's time limit, an unreadable model) admits the trial (``fail_open=True``, the
default) or rejects it, with a :class:`~costaware.errors.CostAwareWarning` and the reason
in the verdict. Framework adapters (Optuna, Ray Tune) translate the :class:`Verdict` into
their own terms.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from costaware.budget import Budget, Decision
from costaware.core.model import CostModel, Prediction
from costaware.devices import Device, get_device, is_auto
from costaware.errors import (
    CostawareError,
    CostAwareWarning,
    UserCodeError,
    first_line,
    is_user_error,
    user_code_error,
    warn_at_users_line,
)
from costaware.spec import TrainingSpec

__all__ = [
    "CONSTRAINT_MEMORY",
    "CONSTRAINT_TIME",
    "Gate",
    "Verdict",
    "as_json",
    "check_options",
    "check_study",
    "open_store",
    "spec_build_error",
]

#: names of the feasibility constraints (<= 0 is feasible) the integrations set
CONSTRAINT_MEMORY = "costaware_memory"
CONSTRAINT_TIME = "costaware_time"


_STORE_FAILED: Final = "\0store"  # among Gate._warned: a write to the store failed


def _measured_context(store: Any, device: str) -> int | None:
    """The median CUDA context (``actual["context_bytes"]``) the store's measurements on
    ``device`` recorded, or None (none recorded, or the store cannot be read)."""
    try:
        rows = store.measurements()
    except Exception:
        return None
    values = sorted(
        int(v)
        for r in rows
        if r.get("device") == device
        and isinstance(v := (r.get("actual") or {}).get("context_bytes"), (int, float))
        and v > 0
    )
    return values[len(values) // 2] if values else None


def as_json(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` as plain JSON data, a value JSON cannot write (a class, a function) as
    its ``repr``: a search's suggested parameters as the store holds them, a searcher's
    state as Tune checkpoints it."""
    out: dict[str, Any] = json.loads(json.dumps(dict(values), default=repr))
    return out


def check_study(study: Any, default: str) -> None:
    """Refuse a study name the rows cannot be recorded under: TypeError for anything but a
    string, ValueError for a blank one. ``default`` is the caller's, shown as an example."""
    if not isinstance(study, str):
        raise TypeError(
            f"study must name the study the rows are recorded under (a string such as "
            f"{default!r}), but got {study!r}."
        )
    if not study.strip():
        raise ValueError(
            f"study must name the study the rows are recorded under (such as {default!r}), "
            f"but got {study!r}."
        )


def check_options(
    *,
    model: Any = None,
    device: Any = "auto",
    store: Any = None,
    refit_every: Any = None,
    fail_open: Any = True,
    store_needs: tuple[str, ...] = ("record_prediction",),
) -> None:
    """Refuse, at construction, the options every integration takes (the pruners, Ray's
    searcher, the Lightning callback) when they are of the wrong kind or name no device:
    a mistake there would otherwise surface only when a trial is judged, where it fails
    open and every trial is admitted unjudged. A store object must have the methods
    ``store_needs`` names (a gate records predictions; the callback measurements too)."""
    if model is not None and not isinstance(model, CostModel):
        raise TypeError(
            f"model must be a costaware.CostModel (e.g. CostModel.default() or "
            f"CostModel.load(path)), or None for the shipped one, but got {model!r}."
        )
    if not isinstance(device, (str, Device)):
        raise TypeError(
            f"device must be a device name such as 'H100', a costaware Device or 'auto' "
            f"(the GPU this process sees), but got {device!r}."
        )
    if isinstance(device, str) and not is_auto(device):
        get_device(device)  # an unknown name raises UnknownDeviceError, with the close ones
    if not (
        store is None
        or isinstance(store, (str, bytes))
        or hasattr(store, "__fspath__")
        or all(hasattr(store, name) for name in store_needs)
    ):
        raise TypeError(
            "store must be an ObservationStore, a URL or path such as 'sqlite:///hpo.db', or "
            f"None, but got {type(store).__name__}."
        )
    if refit_every is not None and (
        isinstance(refit_every, bool) or not isinstance(refit_every, int) or refit_every < 1
    ):
        raise ValueError(
            "refit_every must be a whole number of measured trials >= 1 between refits, or "
            f"None to never refit, but got {refit_every!r}."
        )
    if not isinstance(fail_open, bool):
        raise TypeError(
            "fail_open must be True (admit a trial whose prediction fails, with a warning) or "
            f"False (reject it), but got {fail_open!r}."
        )


def open_store(store: Any, *, retry: bool = False) -> Any:
    """``store`` as given, or the ``ObservationStore`` that a URL or path names (SQLAlchemy
    is imported only then): how the Gate, Ray's integration and ``calibrate`` take one.

    With ``retry`` (what a study's integrations pass), a database server that does not
    answer is a :class:`~costaware.errors.CostAwareWarning`, not an error: the store
    tries again, less and less often, when it is next used, and records go through once
    it answers (``ObservationStore(..., retry=True)``). A store that cannot be opened for
    another reason (a wrong path or password, a newer schema) still raises.
    """
    if isinstance(store, (str, bytes)) or hasattr(store, "__fspath__"):
        from costaware.runtime.store import ObservationStore

        return ObservationStore(store, retry=retry)
    return store


def spec_build_error(
    error: Exception,
    *,
    what: str = "building the TrainingSpec",
    params: Any = None,
    missing: str = "suggest every parameter it reads before trial.should_prune() (or "
    "admit()) is called",
    contract: str = "costaware calls it before the trial runs, and it must return a "
    "costaware.TrainingSpec",
) -> Exception:
    """The error to judge for ``error``, raised while the user's code built a spec
    (``spec_fn``, a Lightning module's spec): costaware's own errors as they are, anything
    else as a :class:`~costaware.errors.UserCodeError` that names the line and what to
    change, with ``error`` as its ``__cause__``. ``params``: what the spec was built from
    (a trial's parameters, a Tune config); a ``KeyError`` for a key not among them is
    explained, with ``missing`` as the fix. ``contract``: what costaware expects of the code
    it called, said after the fix."""
    if isinstance(error, CostawareError):
        return error
    from costaware.core.trace import _failing_line, _raised_by_costaware

    if _raised_by_costaware(error):
        return error  # costaware's own bug: not the user's to fix, the trial fails open
    said = first_line(error).rstrip(". ")
    hint = _key_hint(error, params, missing)
    return user_code_error(
        f"{what} raised {said} at {_failing_line(error)}.{hint} This is the user's code, not "
        f"costaware's: fix it ({contract}).",
        error,
    )


def _key_hint(error: BaseException | None, params: Any, missing: str) -> str:
    """Where ``error`` is a ``KeyError`` for a key the search's ``params`` lack: which key,
    what they hold, and ``missing`` (the fix); else ""."""
    if not (isinstance(error, KeyError) and isinstance(params, Mapping) and error.args):
        return ""
    key = error.args[0]
    if key in params:
        return ""
    nested = [
        str(k) for k, v in params.items() if isinstance(v, Mapping) and key in v
    ]  # a nested search space: {"model": {"width": ...}}
    if nested:
        return (
            f" It reads {key!r}, which the parameters it was given hold nested, under "
            f"{nested[0]!r}: read it as cfg[{nested[0]!r}][{key!r}]."
        )
    return (
        f" It reads {key!r}, which is not among the parameters it was given "
        f"({', '.join(sorted(map(str, params))) or 'none'}): {missing}."
    )


def _with_key_hint(error: UserCodeError, params: Any) -> UserCodeError:
    """``error`` (the dry run's: the model factory, forward or loss raised), with
    :func:`_key_hint` added where its cause is a ``KeyError`` for a key the search's
    ``params`` lack (``model=lambda: build(cfg)`` reading ``cfg["widht"]``)."""
    cause = error.__cause__
    hint = _key_hint(
        cause,
        params,
        "every parameter the spec's code reads must be among those the search suggests "
        "(or be read with a default, cfg.get)",
    )
    if not hint or cause is None:
        return error
    import costaware.errors as errors

    kind = next(  # the error's own kind (UserCodeError, SpecError), not one made of it
        c for c in type(error).__mro__ if getattr(errors, c.__qualname__, None) is c
    )
    return user_code_error(f"{str(error).rstrip()}{hint}", cause, kind)


@dataclass
class Verdict:
    """The outcome of :meth:`Gate.judge`: admit or not, and the figures behind it."""

    admit: bool
    info: dict[str, Any]
    prediction: Prediction | None = None
    decision: Decision | None = None
    constraints: dict[str, float] = field(default_factory=dict)


class Gate:
    """Predict, decide against a budget, and record, for one study or experiment.

    Args:
        budget: the limits a trial must fit (default ``Budget()``: the device's memory).
        device: a catalog name, a ``Device``, or ``"auto"``.
        model: the cost model (default: the shipped one).
        store: an ``ObservationStore`` or its URL, to record predictions (and refit).
        refit_every: with a store, refit after this many measured trials (None: never).
        fail_open: admit a trial whose prediction fails (default) or reject it.
    """

    def __init__(
        self,
        budget: Budget | None = None,
        device: str | Device = "auto",
        *,
        model: CostModel | None = None,
        store: Any = None,
        refit_every: int | None = None,
        fail_open: bool = True,
    ) -> None:
        if budget is None:
            budget = Budget()  # the device's memory is the one limit
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be a costaware.Budget, but got {type(budget).__name__}.")
        check_options(
            model=model, device=device, store=store, refit_every=refit_every, fail_open=fail_open
        )
        if not is_auto(device):
            budget.check_room(device)
        self.budget = budget
        self.device = device
        self.fail_open = fail_open
        self.refit_every = refit_every
        self._model = model
        self._device: Device | None = None
        self._context: int | None = None  # the study's measured CUDA context
        self._context_read = -math.inf
        self._lock = threading.Lock()
        #: the reasons this gate could not judge a trial that it has warned of (each once:
        #: every trial records its own, and a study of one untraceable model has many)
        self._warned: set[str] = set()
        self.store = open_store(store, retry=True)  # a server that is down never stops a study
        self.refit: Any = None
        self._start_refit()

    def _start_refit(self) -> None:
        if self.store is not None and self.refit_every:
            from costaware.runtime.refit import OnlineRefit

            base = self._model
            if base is None:
                try:
                    base = CostModel.default()
                except CostawareError:
                    # a damaged shipped model: no base to refit over. Each judge raises
                    # this again through model() and admits the trial with the reason
                    return
            self.refit = OnlineRefit(self.store, base=base, every=self.refit_every)

    # frameworks (Ray Tune) pickle what they are given: no locks or threads in the state
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_lock", None)
        state["refit"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_warned", set())
        self._lock = threading.Lock()
        self._start_refit()

    def model(self) -> CostModel:
        """The model in use: the newest online refit, or the given (default) one."""
        if self.refit is not None:
            self.refit.maybe_refit()  # non-blocking: refits in the background
            refitted: CostModel = self.refit.model()
            return refitted
        with self._lock:
            if self._model is None:
                # one shared load per process (CostModel.default); a damaged shipped
                # model raises here, every time, and judge fails open with the reason
                self._model = CostModel.default()
            return self._model

    def resolved_device(self) -> Device:
        """The device decisions are made for. Its CUDA context is the one this study
        measured (the median ``context_bytes`` of the store's measurements on that device,
        which the Lightning callback records), where there is one, else the catalog's
        default. Re-read from the store at most once a minute."""
        if self._device is None:
            self._device = get_device(self.device)
            auto = is_auto(self.device)
            if auto and self._device.kind == "cpu":
                warnings.warn(
                    "device='auto' found no GPU here (NVML sees none), so trials are judged "
                    "for this machine's CPU and its memory; name the GPU they train on "
                    "(device='A10', ...) to judge them for it.",
                    CostAwareWarning,
                    stacklevel=3,
                )
        now = time.monotonic()
        if self.store is not None and now - self._context_read > 60.0:
            self._context_read = now
            measured = _measured_context(self.store, self._device.name)
            if measured is not None:
                self._context = measured
        if self._context is not None and self._device.kind == "cuda":
            ctx = min(self._context, self._device.memory_bytes - 1)
            return dataclasses.replace(self._device, context_overhead_bytes=ctx)
        return self._device

    def constraints(self, decision: Decision | None) -> dict[str, float]:
        """One value per budgeted quantity (<= 0 feasible), the same keys for every trial."""
        out: dict[str, float] = {}
        checked = decision.checked if decision is not None else {}
        m = checked.get("memory")  # memory is always checked: the device is a limit
        out[CONSTRAINT_MEMORY] = float(m["predicted"] - m["limit"]) / 2**30 if m else 0.0
        if self.budget.max_epoch_time is not None or self.budget.max_trial_time is not None:
            key = "epoch_time" if self.budget.max_epoch_time is not None else "trial_time"
            t = checked.get(key)
            ok = t is not None and t.get("predicted") is not None
            out[CONSTRAINT_TIME] = float(t["predicted"] - t["limit"]) if ok else 0.0  # type: ignore[index]
        return out

    def judge(
        self,
        spec: TrainingSpec | None,
        *,
        study: str | None,
        trial: str | int,
        error: Exception | None = None,
        spent_time: float = 0.0,
        rejected_as: str | int | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Verdict:
        """Judge ``spec`` (or the ``error`` that stopped building it).

        The prediction is recorded in the store under ``trial`` when admitted, under
        ``rejected_as`` (default ``trial``) when rejected, with the search's ``params``
        (the suggested configuration the spec was built from) where given: for a
        suggestion rejected before it became a trial, the store is the only record of them.

        Raises:
            UserCodeError: the user's bug, which a real trial would hit too: ``error``
                raised by the user's code building the spec (wrapped by
                :func:`spec_build_error`), or the dry run's :class:`SpecError` or
                :class:`UserCodeError` (a factory that needs arguments, a shape mismatch,
                an exception in the factory, forward or loss). Costaware's own failures
                never raise: they admit the trial (``fail_open``) with a warning.
        """
        pred: Prediction | None = None
        decision: Decision | None = None
        model: CostModel | None = None
        if error is not None:
            error = spec_build_error(error)
            if is_user_error(error):
                raise error  # the user's bug: the trial fails with it, shown at once
        if error is None and spec is None:
            error = ValueError("no TrainingSpec")
        if error is None and spec is not None:
            try:
                model = self.model()
                device = self.resolved_device()
                pred = model.predict(spec, device=device)
                decision = self.budget.decide(pred, device=device, spent_time=spent_time)
            except UserCodeError as e:  # the user's bug (a SpecError too): fail fast
                hinted = _with_key_hint(e, params)
                if hinted is e:
                    raise
                raise hinted from e.__cause__
            except Exception as e:  # costaware's own failure: fail open (or closed)
                error = e
        if error is not None or pred is None or decision is None:
            admit = self.fail_open
            reason = "prediction failed: " + (first_line(error) if error else "unknown")
            what = "this fit" if trial is None else f"trial {trial}"
            with self._lock:
                first = reason not in self._warned
                self._warned.add(reason)
            if first:
                warn_at_users_line(
                    f"costaware could not judge {what}: {reason}; "
                    f"{'admitting' if admit else 'rejecting'} it (fail_open={self.fail_open}); "
                    "later trials that fail the same way are "
                    f"{'admitted' if admit else 'rejected'} with this reason recorded, "
                    "without another warning."
                )
            info: dict[str, Any] = {
                "admit": admit,
                "error": reason,
                "reasons": [] if admit else [reason],
            }
            status = "error"
        else:
            admit = decision.admit
            reason = "; ".join(r.message for r in decision.reasons)
            info = {
                "admit": admit,
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
                # rows of this study the model in use was refitted on (0: the shipped model)
                "refit_rows": (
                    int(model.training_.get("rows", 0))
                    if model is not None and self.refit is not None and model is not self.refit.base
                    else 0
                ),
                "latency_ms": round(pred.latency_s * 1e3, 2),
            }
            status = "admitted" if admit else "rejected"
        if self.store is not None:
            try:
                features = None
                if model is not None and spec is not None and pred is not None:
                    features = model.features(spec, self.resolved_device())
                self.store.record_prediction(
                    study=study,
                    trial=trial if admit or rejected_as is None else rejected_as,
                    spec=spec.summary() if spec is not None else {},
                    features=features,
                    prediction=pred.to_dict() if pred is not None else None,
                    decision=decision.to_dict() if decision is not None else None,
                    device=pred.device if pred is not None else None,
                    status=status,
                    reason=reason or None,
                    meta={"params": as_json(params)} if params else None,
                )
            except Exception as e:  # an unreachable store never stops the study
                info["store_error"] = first_line(e)
                with self._lock:  # once until a write goes through again
                    first = _STORE_FAILED not in self._warned
                    self._warned.add(_STORE_FAILED)
                if first:
                    warn_at_users_line(
                        f"costaware could not write to the store: {first_line(e)}; the trials "
                        "are judged all the same, and their records are not kept until a write "
                        "goes through again."
                    )
            else:
                self._warned.discard(_STORE_FAILED)
        return Verdict(admit, info, pred, decision, self.constraints(decision))
