"""The largest batch size that fits: a search over predictions, with no trial run.

Lightning's ``BatchSizeFinder`` finds a batch size by running steps until one runs out of
memory, and its answer can still run out later, on a step that allocates more. Here the
answer comes from the same decision a study makes for each trial
(:meth:`costaware.Budget.decide` on :attr:`~costaware.Prediction.min_capacity_upper`, the
calibrated upper bound of the memory the step needs), so it carries that decision's margin
and its reasons, and no step is run.

The search costs two dry runs of the architecture (the spec's own batch size and one
other: every other batch size is interpolated from them, storage by storage) and a few
milliseconds for each batch size it tries: it doubles from the spec's batch size until
the budget rejects one, then bisects.

Example:
    >>> import costaware as ca
    >>> from costaware import zoo
    >>> spec = ca.TrainingSpec(model=lambda: zoo.mlp(784, (256,), 10),
    ...                        batch=ca.ImageBatch((784,), classes=10), batch_size=64)
    >>> found = ca.CostModel.default().max_batch_size(spec, device="A10", limit=4096)
    >>> found.batch_size
    4096
    >>> found.limited_by
    'search limit'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from costaware._format import fmt_apart, fmt_bytes
from costaware.budget import Budget, Decision, Reason
from costaware.devices import Device, get_device
from costaware.errors import CostawareError
from costaware.spec import MAX_BATCH_SIZE

if TYPE_CHECKING:
    from costaware.core.model import CostModel, Prediction
    from costaware.spec import TrainingSpec

__all__ = [
    "DEFAULT_HEADROOM",
    "DEFAULT_LIMIT",
    "BatchSizeResult",
    "NothingFitsError",
    "check_headroom",
    "check_limit",
    "max_batch_size",
    "with_headroom",
]

#: the largest batch size searched unless the caller says otherwise
DEFAULT_LIMIT = 65_536
#: the share by which the search grows the step's predicted memory need (its CUDA context
#: apart) before setting it against the limit.
#: The largest admitted size sits at the limit by construction, where the capacity bound
#: (calibrated on uncapped runs) does not cover the allocator simulation's own error
#: under a cap: replayed from the allocator's recorded events at 56 bisected boundaries,
#: it put a run that ran out of memory up to 2.0% under its cap (``docs/accuracy.md``,
#: "Where the capacity decision misses").
DEFAULT_HEADROOM = 0.02


class NothingFitsError(CostawareError, ValueError):
    """Not even a batch of one fits the budget (raised where a batch size must be set)."""


@dataclass(frozen=True)
class BatchSizeResult:
    """What :func:`max_batch_size` found.

    ``batch_size`` is the largest batch size the budget admits (0 when not even 1 does).
    ``prediction`` is that batch size's prediction (batch 1's when nothing fits), and
    ``rejected`` the decision on the next size tried above it, ``rejected_batch_size``
    (both None at the search limit or when nothing fits). ``limited_by`` says what
    stopped the search: ``"memory"`` (or another budget limit's kind), ``"search
    limit"``, or ``"nothing fits"``.
    """

    batch_size: int
    prediction: Prediction
    decision: Decision
    rejected: Decision | None
    limited_by: str
    device: str
    limit: int
    tried: tuple[int, ...] = field(default=(), repr=False)
    rejected_batch_size: int | None = None

    @property
    def fits(self) -> bool:
        """Whether any batch size fits (``batch_size >= 1``)."""
        return self.batch_size >= 1

    def __str__(self) -> str:
        p = self.prediction
        if not self.fits:
            why = "; ".join(r.message for r in self.decision.reasons) or "rejected"
            return (
                f"nothing fits on the {self.device}, not even a batch of 1: {why}. The step "
                f"needs {fmt_bytes(p.min_capacity_upper)} (upper bound) at batch size 1."
            )
        mem = self.decision.checked.get("memory") or {}
        with_context = (
            f"{fmt_bytes(mem['predicted'])} with the CUDA context against the "
            f"{fmt_bytes(mem['limit'])} limit; the step alone "
            if mem.get("context") and mem.get("predicted") is not None and mem.get("limit")
            else ""
        )
        head = (
            f"largest batch size on the {self.device}: {self.batch_size:,} (needs "
            f"{with_context}{fmt_bytes(p.min_capacity_upper)} at its upper bound, "
            f"{fmt_bytes(p.min_capacity)} predicted)"
        )
        if self.limited_by == "search limit":
            return head + f"; every batch size up to the search limit of {self.limit} fits"
        assert self.rejected is not None
        why = "; ".join(r.message for r in self.rejected.reasons)
        over = f"batch size {self.rejected_batch_size:,}" if self.rejected_batch_size else None
        return head + f"; {over or 'the next size tried'} is rejected: {why}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "fits": self.fits,
            "limited_by": self.limited_by,
            "device": self.device,
            "limit": self.limit,
            "prediction": self.prediction.to_dict(),
            "decision": self.decision.to_dict(),
            "rejected": None if self.rejected is None else self.rejected.to_dict(),
            "rejected_batch_size": self.rejected_batch_size,
            "tried": list(self.tried),
        }


def max_batch_size(
    model: CostModel,
    spec: TrainingSpec,
    device: str | Device = "auto",
    budget: Budget | None = None,
    *,
    limit: int = DEFAULT_LIMIT,
    headroom: float | None = None,
    on_try: Callable[[int, Decision], None] | None = None,
) -> BatchSizeResult:
    """The largest batch size of ``spec`` that ``budget`` admits on ``device``.

    ``budget`` defaults to ``Budget()``: the device's memory is the only limit. A budget
    with time limits counts them too (a larger batch rarely makes an epoch slower, but a
    trial time limit can bind). The search assumes that a batch size the budget rejects
    is followed by no larger one it admits; the returned size was itself admitted.
    ``headroom`` (None: :data:`DEFAULT_HEADROOM`) is the share by which the predicted need
    of the step (its CUDA context apart) is grown before it is set against the limit: the
    search ends where the need meets the limit, the one place a trial's own decision
    rarely lands. ``on_try(batch_size,
    decision)`` is called for each size tried (progress).

    Raises:
        ValueError: ``limit`` is below 1, or ``headroom`` is not in [0, 1).
    """
    check_limit(limit)
    headroom = DEFAULT_HEADROOM if headroom is None else headroom
    check_headroom(headroom)
    dev = get_device(device)
    judge = budget if budget is not None else Budget()
    seen: dict[int, tuple[Prediction, Decision]] = {}

    def admit(b: int) -> bool:
        if b not in seen:
            pred = model.predict(spec.with_batch_size(b), dev)
            decision = with_headroom(judge.decide(pred, device=dev), headroom)
            seen[b] = (pred, decision)
            if on_try is not None:
                on_try(b, decision)
        return seen[b][1].admit

    def result(best: int, over: int | None, why: str) -> BatchSizeResult:
        pred, decision = seen[max(best, 1)]
        rejected = seen[over][1] if over is not None else None
        return BatchSizeResult(
            batch_size=best,
            prediction=pred,
            decision=decision,
            rejected=rejected,
            limited_by=why,
            device=dev.name,
            limit=limit,
            tried=tuple(seen),
            rejected_batch_size=over,
        )

    start = max(1, min(spec.batch_size, limit))
    if admit(start):
        lo, hi = start, None
        while hi is None:  # double until a size is rejected or the limit is reached
            if lo >= limit:
                return result(lo, None, "search limit")
            nxt = min(lo * 2, limit)
            if admit(nxt):
                lo = nxt
            else:
                hi = nxt
    else:
        if start == 1 or not admit(1):
            return result(0, None, "nothing fits")
        lo, hi = 1, start
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if admit(mid):
            lo = mid
        else:
            hi = mid
    reasons = seen[hi][1].reasons
    return result(lo, hi, reasons[0].kind if reasons else "rejected")


def check_limit(limit: Any) -> None:
    """Raise ValueError unless ``limit`` is a batch size a search can reach."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BATCH_SIZE:
        raise ValueError(
            f"limit must be a whole number from 1 to {MAX_BATCH_SIZE:,}, but got {limit=}."
        )


def check_headroom(headroom: Any) -> None:
    """Raise ValueError unless ``headroom`` is a share of a memory limit, in [0, 1)."""
    if isinstance(headroom, bool) or not isinstance(headroom, int | float) or not 0 <= headroom < 1:
        raise ValueError(
            f"headroom must be a share of the memory need in [0, 1), such as 0.02, but got "
            f"{headroom=}."
        )


def with_headroom(decision: Decision, headroom: float) -> Decision:
    """``decision``, rejected where the predicted memory need (its CUDA context apart)
    grown by ``headroom`` passes the memory limit."""
    mem = decision.checked.get("memory")
    if not decision.admit or not headroom or not mem:
        return decision
    context = float(mem.get("context", 0))
    need = (float(mem["predicted"]) - context) * (1 + headroom) + context
    limit = float(mem["limit"])
    checked = {**decision.checked, "headroom": headroom}
    if need <= limit:
        return Decision(True, decision.reasons, checked)
    with_context = ", CUDA context included" if context else ""
    grown, lim = fmt_apart(need, limit, seconds=False)
    message = (
        f"predicted memory need {fmt_bytes(mem['predicted'])} (upper bound{with_context}), "
        f"its step grown by the {headroom:.0%} headroom to {grown}, passes the {lim} limit"
    )
    if mem.get("limit_from") == "device":
        message += f" (all of the {decision.checked.get('device')}'s memory)"
    return Decision(False, (Reason("memory", need, limit, message),), checked)
