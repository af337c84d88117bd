"""What a report is made of, shared by :mod:`costaware.reporting` (which reads the
records into rows) and its renderers (:mod:`costaware.reporting.html`,
:mod:`costaware.reporting.text`): one trial's row, the outcomes, and the words the
renderers share."""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from costaware._format import fmt_money, fmt_pct, fmt_seconds

__all__ = ["OUTCOMES", "OUTCOME_LABELS", "ProgressFn", "TrialRow", "fmt_saved", "lean_words"]

ProgressFn = Callable[[str, int, int], None]
"""``progress(what, done, total)``: called while a report is read and rendered."""

OUTCOMES: Final = ("completed", "stopped", "oom", "failed", "rejected", "running", "unmeasured")
"""What became of a trial, in the order reports list them."""

OUTCOME_LABELS: Final = {
    "completed": "completed",
    "stopped": "stopped early",
    "oom": "out of memory",
    "failed": "failed",
    "rejected": "rejected before running",
    "running": "running",
    "unmeasured": "admitted, no actuals",
}


# --------------------------------------------------------------------------------------
# one trial
# --------------------------------------------------------------------------------------
@dataclass
class TrialRow:
    """One trial as the report sees it: what was predicted, decided and measured.

    Times are seconds, memory bytes; None where nothing was recorded. ``outcome`` is one
    of :data:`OUTCOMES`. ``wall_time`` is the trial's wall time as the HPO framework
    recorded it (Optuna's duration, Ray's ``time_total_s``); ``train_time`` the sum of
    its measured epoch times (the store's records). ``device`` is the device named with
    the prediction or measurement; ``device_kind`` the kind the trial was measured on
    (``"cpu"``, ``"cuda"``), when a measurement says it. ``gpus`` is the devices the trial
    trains on at once (its spec's ``world_size`` under data parallel): its device time
    counts each.
    """

    trial: str
    outcome: str
    number: int | None = None
    study: str | None = None
    name: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    reason_kinds: list[str] = field(default_factory=list)
    device: str | None = None
    device_kind: str | None = None
    model_kind: str | None = None
    prediction_error: str | None = None
    predicted: bool = False
    pred_memory: float | None = None
    pred_memory_upper: float | None = None
    pred_epoch_time: float | None = None
    pred_epoch_time_upper: float | None = None
    pred_trial_time: float | None = None
    gate_latency: float | None = None
    epochs_planned: int | None = None
    gpus: int = 1
    measured: bool = False
    actual_memory: float | None = None
    memory_held_before: float | None = None
    oom_memory_reached: float | None = None
    #: how the measured peak was taken, as the measurement recorded it
    memory_method: str | None = None
    #: the measurements came from the Optuna trial's user attributes (no store)
    measured_in_trial: bool = False
    #: :attr:`params` are the search's own (False: a spec's few fields, where the search's
    #: were not recorded)
    params_searched: bool = True
    actual_epoch_time: float | None = None
    actual_iteration_time: float | None = None
    epochs_measured: int = 0
    train_time: float | None = None
    wall_time: float | None = None
    start: _dt.datetime | None = None
    end: _dt.datetime | None = None
    value: float | None = None
    #: the predicted step's FLOPs, bytes moved, precision and memory need
    #: (:func:`costaware.reporting.gpus.step_of`), for the report's "On other GPUs"
    pred_step: dict[str, Any] = field(default_factory=dict)

    @property
    def admitted(self) -> bool:
        """Whether the trial was let through (everything but ``rejected``)."""
        return self.outcome != "rejected"

    @property
    def spent(self) -> float | None:
        """Device seconds the trial used: its wall time, else its measured training time,
        times the devices it held (:attr:`gpus`).

        None for a rejected trial (it never held a device) and for one with no record of
        either.
        """
        if self.outcome == "rejected":
            return None
        seconds = self.wall_time if self.wall_time is not None else self.train_time
        return None if seconds is None else seconds * self.gpus

    @property
    def predicted_cost(self) -> float | None:
        """The predicted device seconds of the whole trial (its trial time, else epoch time
        × epochs), times the devices it holds (:attr:`gpus`)."""
        if self.pred_trial_time is not None:
            return self.pred_trial_time * self.gpus
        if self.pred_epoch_time is not None and self.epochs_planned:
            return self.pred_epoch_time * self.epochs_planned * self.gpus
        return None

    @property
    def label(self) -> str:
        """How the trial is named on the page: ``#12`` where the trial is known by its
        number (an Optuna trial), else its id (a Ray Tune trial's, which may be all digits
        and is not its number)."""
        return (
            f"#{self.number}"
            if self.number is not None and self.trial == str(self.number)
            else self.trial
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["start"] = self.start.isoformat() if self.start else None
        d["end"] = self.end.isoformat() if self.end else None
        d["params"] = {str(k): _plain(v) for k, v in self.params.items()}
        d["spent"] = self.spent
        d["predicted_cost"] = self.predicted_cost
        return d


def _plain(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    return str(v)


# --------------------------------------------------------------------------------------
# words the renderers share
# --------------------------------------------------------------------------------------
def lean_words(err: Mapping[str, Any]) -> str:
    """``"bias +36%: predictions too high"`` when the median signed error (the bias, the
    figure the report's data gives as ``median``) is +25% or more, or -20% or less (a
    factor of 1.25 either way). The direction is that of the bias it names, so the words
    never contradict the figure beside them."""
    m = err.get("median")
    if m is None:
        return ""
    if m >= 0.25:
        return f"bias {fmt_pct(m, True)}: predictions too high"
    if m <= -0.2:
        return f"bias {fmt_pct(m, True)}: predictions too low"
    return ""


def saved_adjusted(summary: Mapping[str, Any]) -> str | None:
    """The saved time with the point predictions of the trials rejected for time or cost
    corrected by the median signed error of the time predictions on the trials that ran,
    as a sentence; None where there is no such figure."""
    seconds = summary.get("saved_adjusted_s")
    if seconds is None:
        return None
    factor = summary["saved_adjusted_factor"]
    by = summary["saved_by_basis"]
    kept = (
        "; the memory rejections' figures kept as they are"
        if by.get("until_oom") or by.get("upper_bound")
        else ""
    )
    part = summary.get("saved_upper_bound_s")
    bound = f", {fmt_seconds(part)} of it an upper bound" if part is not None else ""
    return (
        "With the predicted runs of the trials rejected for time or cost corrected by the "
        "median epoch-time error of the trials that ran (measured ÷ predicted "
        f"×{factor:.2f}{kept}): about {fmt_seconds(seconds)}{bound}."
    )


def fmt_saved(summary: Mapping[str, Any], currency: str | None = None) -> str:
    """The summary's saved time as a headline: ``"3.2 min"``; ``"at most 14.40 h"`` when
    all of it is an upper bound; ``"3.2 min (1.1 min of it an upper bound)"`` when a
    part is; with its cost when ``currency`` is given and a price is known; ``-`` when
    nothing could be counted."""
    seconds = summary.get("saved_s")
    if seconds is None:
        return "-"
    text = ("at most " if summary.get("saved_all_upper_bound") else "") + (
        "0 s" if seconds == 0 else fmt_seconds(seconds)
    )
    cost = summary.get("saved_cost")
    if currency is not None and cost is not None:
        text += f" ({fmt_money(cost, currency)})"
    part = summary.get("saved_upper_bound_s")
    if part is not None and not summary.get("saved_all_upper_bound"):
        text += f" ({fmt_seconds(part)} of it an upper bound)"
    return text
