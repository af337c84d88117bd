"""Budget reports: where the compute went, what was refused and why, what the refusals
saved, and how far the predictions were from reality.

:func:`report` reads what the integrations recorded and returns a :class:`Report`:

- an Optuna study (an ``optuna.Study``, or its storage URL and name): the trials, their
  states, parameters and objective values, and the ``costaware:*`` user attributes
  :class:`~costaware.integrations.optuna.CostAwarePruner` writes (the prediction, the
  decision and its reasons) and the ``costaware_stopped`` / ``costaware_oom`` attributes
  the Lightning callback sets;
- the :class:`~costaware.runtime.store.ObservationStore` (an object, a URL or a SQLite path):
  every prediction and decision, and every measured epoch (peak memory, epoch time) or
  crash that :class:`~costaware.integrations.lightning.CostAwareCallback` and
  :class:`~costaware.integrations.ray.CostAwareScheduler` recorded;
- a Ray Tune experiment directory: its trials (``experiment_state-*.json``) and each
  trial's reported results (``result.json``); the rejected suggestions and the
  predictions are only in the store (pass ``store=``).

A study and a store are joined on the study name and the trial number, so the measured
memory and epoch times sit next to the predictions. Every number comes from these records;
what is missing is said in :attr:`Report.notes`, with what to add.

Example:
    >>> import costaware as ca
    >>> from costaware.runtime.store import ObservationStore
    >>> store = ObservationStore("sqlite://")
    >>> _ = store.record_prediction(
    ...     study="s", trial=0, spec={"name": "mlp", "epochs": 2}, features=None,
    ...     prediction={"peak_memory": 2**30, "peak_memory_upper": 1.2 * 2**30,
    ...                 "epoch_time": 60.0, "epoch_time_upper": 70.0, "trial_time": 120.0},
    ...     decision={"admit": False, "reasons": [{"kind": "memory", "message": "too big"}]},
    ...     device="A10", status="rejected", reason="too big")
    >>> r = ca.report(store)
    >>> r.to_dict()["summary"]["rejected"], r.to_dict()["summary"]["saved_s"]
    (1, 120.0)
    >>> html = r.to_html()          # or r.to_html("report.html"); r.to_markdown(...); r.print()
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import pathlib
import re
import statistics
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from costaware._format import fmt_bytes, fmt_seconds
from costaware.errors import CostawareError, CostAwareWarning
from costaware.reporting.rows import OUTCOME_LABELS, OUTCOMES, ProgressFn, TrialRow

__all__ = [
    "OUTCOMES",
    "OUTCOME_LABELS",
    "Report",
    "ReportError",
    "TrialRow",
    "report",
]

#: result keys the Ray scheduler reads (as in costaware.integrations.ray, which imports ray)
_RAY_EPOCH_TIME_KEYS: Final = ("epoch_time_s", "epoch_time", "costaware/epoch_time")
_RAY_PEAK_MEMORY_KEYS: Final = ("peak_memory_bytes", "peak_memory", "costaware/peak_memory")
_ATTR: Final = "costaware:"
_MIN_FOR_BIAS: Final = 3  # measured trials needed before a bias-corrected saving is shown


class ReportError(CostawareError, ValueError):
    """The report's source cannot be found or read; the message says what to pass instead."""


# --------------------------------------------------------------------------------------
# numbers
# --------------------------------------------------------------------------------------
def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return v


def _first_num(d: Mapping[str, Any], keys: Iterable[str]) -> float | None:
    for k in keys:
        v = _num(d.get(k))
        if v is not None:
            return v
    return None


def _trials(n: int) -> str:
    """``"1 trial"``, ``"3 trials"``."""
    return f"{n:,} trial{'s' * (n != 1)}"


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def _aware(t: _dt.datetime | None) -> _dt.datetime | None:
    """An aware UTC datetime; a naive one is taken as local time (Optuna writes those)."""
    if t is None:
        return None
    if t.tzinfo is None:
        t = t.astimezone()
    return t.astimezone(_dt.timezone.utc)


def _from_epoch(s: Any) -> _dt.datetime | None:
    v = _num(s)
    return _dt.datetime.fromtimestamp(v, _dt.timezone.utc) if v is not None else None


def rel_errors(pairs: Sequence[tuple[float, float, float | None]]) -> dict[str, Any]:
    """Error statistics of (predicted, actual, upper bound) triples.

    The error of one pair is ``predicted / actual - 1`` (+0.10: predicted 10% high).
    Returns ``n``, ``median_abs`` (the median absolute error), ``median`` (the median
    signed error: the bias), ``mean_abs``, ``coverage`` (the share of pairs whose actual
    is at most the upper bound, over ``n_upper`` pairs that have one) and
    ``median_ratio`` (the median of actual / predicted).
    """
    errs: list[float] = []
    ratios: list[float] = []
    covered = n_upper = 0
    for pred, act, upper in pairs:
        if pred <= 0 or act <= 0:
            continue
        errs.append(pred / act - 1.0)
        ratios.append(act / pred)
        if upper is not None:
            n_upper += 1
            covered += act <= upper
    if not errs:
        return {"n": 0}
    return {
        "n": len(errs),
        "median_abs": float(statistics.median(abs(e) for e in errs)),
        "median": float(statistics.median(errs)),
        "mean_abs": float(sum(abs(e) for e in errs) / len(errs)),
        "coverage": covered / n_upper if n_upper else None,
        "n_upper": n_upper,
        "median_ratio": float(statistics.median(ratios)),
    }


def _held_by_others(row: TrialRow) -> bool:
    """Whether ``row``'s measured peak is partly memory its process held before it
    (more than the store's ``MAX_HELD_BEFORE``, which the refit leaves out too)."""
    from costaware.observation import MAX_HELD_BEFORE

    return (row.memory_held_before or 0.0) > MAX_HELD_BEFORE


def _memory_pairs(rows: Iterable[TrialRow]) -> list[tuple[float, float, float | None]]:
    return [
        (r.pred_memory, r.actual_memory, r.pred_memory_upper)
        for r in rows
        if r.pred_memory is not None
        and r.actual_memory is not None
        and r.outcome != "oom"
        and not _held_by_others(r)
    ]


def _time_pairs(rows: Iterable[TrialRow]) -> list[tuple[float, float, float | None]]:
    return [
        (r.pred_epoch_time, r.actual_epoch_time, r.pred_epoch_time_upper)
        for r in rows
        if r.pred_epoch_time is not None and r.actual_epoch_time is not None
    ]


#: the study-wide limits: a rejection for these alone is one the study's budget had no
#: room left for
_STUDY_CAPS: Final = frozenset({"total_time", "cost"})


def _cap_only(row: TrialRow) -> bool:
    """Whether ``row`` was rejected for the study-wide caps alone."""
    return bool(row.reason_kinds) and set(row.reason_kinds) <= _STUDY_CAPS


def _config_key(row: TrialRow) -> str | None:
    """The identity of ``row``'s configuration: its study, model and the parameters the
    search drew (the rest of a study's configuration does not vary within it), not its
    prediction, which a refit between two rejections of one configuration makes anew.
    Where the parameters are a spec's few fields (the search's were not recorded), they
    may not tell two models apart, and the prediction is part of the identity. None when
    no parameters are recorded: nothing then says two trials are the same."""
    if not row.params:
        return None
    params = sorted((str(k), repr(v)) for k, v in row.params.items())
    if row.params_searched:
        return repr((row.study, row.name, params))
    return repr((row.study, row.name, params, row.pred_memory, row.predicted_cost))


def _repeated_rejections(rows: Iterable[TrialRow]) -> set[int]:
    """The ids of the rejected rows whose configuration an earlier rejected row (one
    whose saving counts: not rejected for the study-wide caps alone) already has."""
    seen: set[str] = set()
    repeats: set[int] = set()
    for r in rows:
        if r.outcome != "rejected" or _cap_only(r) or (key := _config_key(r)) is None:
            continue
        if key in seen:
            repeats.add(id(r))
        seen.add(key)
    return repeats


#: a cost reason as the budget words it, amounts without a currency:
#: "0.0017 spent + 0.0034 for this trial (2 GPUs) exceeds the 0.0040 cost cap"
_AMOUNT = r"\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?"
_COST_REASON: Final = re.compile(
    rf"(?<!\S)({_AMOUNT}) spent \+ ({_AMOUNT}) for this trial( \(\d+ GPUs\))? "
    rf"exceeds the ({_AMOUNT}) cost cap"
)


def _with_currency(reason: str, currency: str) -> str:
    """``reason`` with the amounts of a cost-cap reason written in ``currency``."""
    if not currency:
        return reason
    return _COST_REASON.sub(
        lambda m: (
            f"{currency}{m[1]} spent + {currency}{m[2]} for this trial{m[3] or ''} "
            f"exceeds the {currency}{m[4]} cost cap"
        ),
        reason,
    )


# --------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------
class Report:
    """A budget report over the trials of one study, store or Ray Tune experiment.

    Build it with :func:`report`. Render it with :meth:`to_html` (one self-contained
    file that opens offline), :meth:`to_markdown` or :meth:`print` (the terminal);
    :meth:`to_dict` gives every figure as plain data.

    Attributes:
        trials: the trials, as :class:`TrialRow`.
        title: the report's title.
        source: where the records came from, in words.
        notes: what is missing from the records, and how to record it.
        caps: the recorded budget limits (``memory`` bytes, ``epoch_time``,
            ``trial_time``, ``total_time`` seconds, ``cost``).
        budget_spent_s: what the study has spent as its budget counts it against the
            study-wide caps (``max_total_time``, ``max_cost``), where that differs from the
            time of the trials that ran (an Optuna study: the time its rejected trials took
            to be judged counts too); None: the time of the trials that ran.
        budget_spent_basis: what :attr:`budget_spent_s` counts, in words.
    """

    def __init__(
        self,
        trials: Sequence[TrialRow],
        *,
        title: str,
        source: str,
        study: str | None = None,
        direction: str | None = None,
        metric: str | None = None,
        caps: Mapping[str, float] | None = None,
        price_per_hour: float | None = None,
        currency: str = "$",
        notes: Sequence[str] = (),
        spent_basis: str = "",
        budget_spent_s: float | None = None,
        budget_spent_basis: str = "",
        generated_at: _dt.datetime | None = None,
        actuals_expected: bool = True,
    ) -> None:
        self.trials: list[TrialRow] = list(trials)
        self.title = title
        self.source = source
        self.study = study
        self.direction = direction
        self.metric = metric
        self.caps: dict[str, float] = dict(caps or {})
        self.price_per_hour = price_per_hour
        self.currency = currency
        self.spent_basis = spent_basis
        self.budget_spent_s = budget_spent_s
        self.budget_spent_basis = budget_spent_basis
        self.generated_at = generated_at or _dt.datetime.now(_dt.timezone.utc)
        self.actuals_expected = actuals_expected
        for row in self.trials:
            row.reasons = [_with_currency(r, currency) for r in row.reasons]
        self._oom_time = self.time_to_oom()
        self._repeats = _repeated_rejections(self.trials)
        #: notes already given as a warning while the report was read: the terminal
        #: summary does not print them a second time
        self.warned: set[str] = set()
        given = " ".join(notes)
        self.notes: list[str] = list(
            dict.fromkeys([*notes, *(n for n in self._missing() if not _said_in(n, given))])
        )

    def __repr__(self) -> str:
        s = self.summary()
        return (
            f"Report({self.title!r}: {s['trials']} trials, {s['rejected']} rejected, "
            f"{s['oom']} OOM, {s['completed']} completed)"
        )

    # -- what the numbers say ---------------------------------------------------------
    @property
    def device_word(self) -> str:
        """``"GPU"``, ``"CPU"`` or ``"device"``: what the trials ran on, for labels.

        The kind the trials were measured on decides (a CPU run of a study that predicted
        for an A10 spent CPU time); without measurements, the devices the records name.
        """
        kinds = {r.device_kind for r in self.trials if r.device_kind}
        if kinds:
            if kinds == {"cpu"}:
                return "CPU"
            return "GPU" if kinds == {"cuda"} else "device"
        devices = {(r.device or "").lower() for r in self.trials if r.device}
        if not devices:
            return "device"
        if all(d == "cpu" or d.startswith("cpu") for d in devices):
            return "CPU"
        if any(d == "cpu" or d.startswith("cpu") for d in devices):
            return "device"
        return "GPU"

    def time_to_oom(self) -> tuple[float | None, int]:
        """The median measured time from start to crash of the trials that ran out of
        memory (their wall time, else their measured training time), and how many there
        were; ``(None, 0)`` when none was measured (an OOM with no recorded time, or a
        time of zero, is not a measurement)."""
        # a zero time is no measurement (a trial created with no start and end times)
        times = [s for r in self.trials if r.outcome == "oom" and (s := r.spent)]
        return _median(times), len(times)

    def saving(self, row: TrialRow) -> tuple[float | None, str]:
        """What rejecting ``row`` saved, in device seconds, and what the figure rests on.

        The basis is one of:

        - ``"until_oom"``: rejected for memory, it would have crashed when it ran out of
          memory; counted at the median measured time to the crash of this report's OOM
          trials (:meth:`time_to_oom`), never more than its predicted run;
        - ``"upper_bound"``: rejected for memory, but no OOM was measured to say how soon
          it would have crashed: counted at its whole predicted run, an upper bound;
        - ``"predicted_run"``: rejected for time or cost (or for a reason not recorded):
          counted at its whole predicted run (epoch time × epochs, the point prediction),
          which it would have used had it been admitted;
        - ``"cap_only"``: rejected only for the study-wide caps (``max_total_time``,
          ``max_cost``): not counted, since what was left of the study's budget did not
          cover it and the study stops once its cap is spent: it would not have run
          within the budget anyway;
        - ``"repeat"``: the same configuration (parameters) as an earlier rejection of
          the study, which is counted; this one is not, so that a searcher proposing a
          configuration again and again does not multiply what refusing it saved;
        - ``"unknown"``: no figure (no predicted time, and no measured OOM for one
          rejected for memory);
        - ``"ran"``: not rejected.
        """
        if row.outcome != "rejected":
            return None, "ran"
        if _cap_only(row):
            return None, "cap_only"
        if id(row) in self._repeats:
            return None, "repeat"
        predicted = row.predicted_cost
        if "memory" in row.reason_kinds:
            crash, _ = self._oom_time
            if crash is not None:
                return (crash if predicted is None else min(crash, predicted)), "until_oom"
            return (predicted, "upper_bound") if predicted is not None else (None, "unknown")
        return (predicted, "predicted_run") if predicted is not None else (None, "unknown")

    def savings(self) -> dict[str, Any]:
        """What the rejections saved, by basis (see :meth:`saving`), with the sentences
        that say what the total rests on.

        Keys: ``seconds`` (the total, None when nothing is counted and trials were
        rejected), ``upper_bound`` (whether a part of it is an upper bound),
        ``upper_bound_s`` (that part), ``all_upper_bound`` (whether all of it is), per
        basis ``{basis: {"seconds": ..., "trials": ...}}`` under ``by_basis``, ``unknown``
        (the rejected trials with no figure), ``predicted_s`` (the part resting on the
        point predictions of the trials rejected for time or cost: the part a correction
        by the measured time errors applies to), ``time_to_oom_s`` and
        ``time_to_oom_trials``, and ``basis`` (sentences).
        """
        by: dict[str, dict[str, float]] = {}
        for r in self.trials:
            seconds, how = self.saving(r)
            if how == "ran":
                continue
            entry = by.setdefault(how, {"seconds": 0.0, "trials": 0})
            entry["trials"] += 1
            entry["seconds"] += seconds or 0.0
        not_counted = ("unknown", "cap_only", "repeat")
        counted = {b: v for b, v in by.items() if b not in not_counted}
        if counted:
            total: float | None = sum(v["seconds"] for v in counted.values())
        else:  # nothing to count: zero, unless a rejection has no figure
            total = None if by.get("unknown") else 0.0
        crash, n_oom = self._oom_time
        word = self.device_word
        basis: list[str] = []
        if "until_oom" in by:
            n = int(by["until_oom"]["trials"])
            basis.append(
                f"{_trials(n)} rejected for memory: {'each ' * (n != 1)}counted at "
                f"{fmt_seconds(crash)}, the median time from start to crash of the "
                f"{_trials(n_oom)} of this study that ran out of memory (a trial over its "
                "memory crashes early, not at the end of its planned run)."
            )
        if "upper_bound" in by:
            n = int(by["upper_bound"]["trials"])
            one = n == 1
            basis.append(
                f"{_trials(n)} rejected for memory: counted at {'its' if one else 'their'} "
                f"whole predicted run ({fmt_seconds(by['upper_bound']['seconds'])}), an upper "
                f"bound. {'It' if one else 'They'} would have crashed when "
                f"{'it' if one else 'they'} ran out of memory, most likely in the first "
                "steps, and no trial of this study ran out of memory to measure how soon."
            )
        if "predicted_run" in by:
            n = int(by["predicted_run"]["trials"])
            one = n == 1
            basis.append(
                f"{_trials(n)} rejected for time or cost: counted at "
                f"{'its' if one else 'their'} whole predicted run (epoch time × epochs, the "
                f"point prediction), the {word} time {'it' if one else 'they'} would have "
                f"used had {'it' if one else 'they'} been admitted."
            )
        for how, why in (
            (
                "cap_only",
                "rejected only for the study's total time or cost cap: not counted. What was "
                "left of the study's budget did not cover {it_them}, and the study stops once "
                "its cap is spent: {it_they} would not have run within the budget anyway.",
            ),
            (
                "repeat",
                "rejected with the same parameters as an earlier rejected trial: not counted "
                "again. Each distinct configuration counts once: a searcher that proposes a "
                "refused configuration again would have run it once had it been admitted, and "
                "learnt from its result.",
            ),
        ):
            if how in by:
                n = int(by[how]["trials"])
                said = why.format(
                    it_them="it" if n == 1 else "them", it_they="it" if n == 1 else "they"
                )
                basis.append(f"{_trials(n)} {said}")
        upper = by.get("upper_bound", {}).get("seconds", 0.0)
        return {
            "seconds": total,
            "trials": sum(int(v["trials"]) for v in counted.values()),
            "upper_bound": "upper_bound" in by,
            "upper_bound_s": upper if "upper_bound" in by else None,
            "all_upper_bound": "upper_bound" in by and set(counted) == {"upper_bound"},
            "by_basis": {b: dict(v) for b, v in by.items()},
            "unknown": int(by.get("unknown", {}).get("trials", 0)),
            "not_counted": int(sum(by.get(b, {}).get("trials", 0) for b in not_counted)),
            "predicted_s": by.get("predicted_run", {}).get("seconds", 0.0),
            "time_to_oom_s": crash,
            "time_to_oom_trials": n_oom,
            "basis": basis,
        }

    def counts(self) -> dict[str, int]:
        """Trials per outcome (every outcome of :data:`OUTCOMES`, zeros included)."""
        out = dict.fromkeys(OUTCOMES, 0)
        for r in self.trials:
            out[r.outcome] = out.get(r.outcome, 0) + 1
        return out

    def cost(self, seconds: float | None) -> float | None:
        """``seconds`` of device time in money, when a price per hour is known."""
        if seconds is None or self.price_per_hour is None:
            return None
        return seconds / 3600.0 * self.price_per_hour

    def summary(self) -> dict[str, Any]:
        """The headline figures: counts, time spent and saved, prediction errors."""
        counts = self.counts()
        ran = [r for r in self.trials if r.admitted]
        spent_values = [s for r in ran if (s := r.spent) is not None]
        savings = self.savings()
        ooms = [r for r in self.trials if r.outcome == "oom"]
        oom_values = [s for r in ooms if (s := r.spent) is not None]
        stopped = [r for r in self.trials if r.outcome == "stopped"]
        mem = rel_errors(_memory_pairs(self.trials))
        tim = rel_errors(_time_pairs(self.trials))
        saved = savings["seconds"]
        adjusted = factor = None
        if saved and savings["predicted_s"] and tim.get("n", 0) >= _MIN_FOR_BIAS:
            # only the point predictions of the time and cost rejections are scaled by how
            # the time predictions fared; the memory rejections' figures (a measured time to
            # the crash, or an upper bound) are kept as they are
            factor = 1.0 / (1.0 + tim["median"])
            adjusted = saved - savings["predicted_s"] + savings["predicted_s"] * factor
        latencies = [r.gate_latency for r in self.trials if r.gate_latency is not None]
        spent = sum(spent_values)
        budget_spent = self.budget_spent_s if self.budget_spent_s is not None else spent
        return {
            "trials": len(self.trials),
            "admitted": sum(r.admitted for r in self.trials),
            **counts,
            "measured": sum(r.measured for r in self.trials),
            "prediction_failed": sum(r.prediction_error is not None for r in self.trials),
            "device_word": self.device_word,
            "spent_s": spent,
            "spent_trials": len(spent_values),
            "spent_cost": self.cost(spent),
            "budget_spent_s": budget_spent,
            "budget_spent_cost": self.cost(budget_spent),
            "budget_spent_basis": self.budget_spent_basis or self.spent_basis,
            "saved_s": saved,
            "saved_trials": savings["trials"],
            "saved_unknown": savings["unknown"],
            "saved_cost": self.cost(saved),
            "saved_adjusted_s": adjusted,
            "saved_adjusted_factor": factor,
            "saved_upper_bound": savings["upper_bound"],
            "saved_upper_bound_s": savings["upper_bound_s"],
            "saved_all_upper_bound": savings["all_upper_bound"],
            "saved_not_counted": savings["not_counted"],
            "saved_by_basis": savings["by_basis"],
            "saved_basis": savings["basis"],
            "time_to_oom_s": savings["time_to_oom_s"],
            "time_to_oom_trials": savings["time_to_oom_trials"],
            "oom_wasted_s": sum(oom_values),
            "oom_wasted_trials": len(oom_values),
            "stopped_spent_s": sum(s for r in stopped if (s := r.spent) is not None),
            "gate_latency_median_s": _median(latencies),
            "memory_error": mem,
            "time_error": tim,
            "price_per_hour": self.price_per_hour,
            "currency": self.currency,
        }

    def timeline(self) -> list[dict[str, Any]]:
        """Cumulative device time, trial by trial in the order they ended.

        Each point: ``time`` (aware UTC), ``trial``, ``spent`` (cumulative seconds of
        the trials that ran) and ``avoided`` (cumulative seconds the rejections so far
        saved, as :meth:`saving` counts them). Trials with no recorded end time are left
        out.
        """
        events: list[tuple[_dt.datetime, TrialRow]] = [
            (r.end, r) for r in self.trials if r.end is not None
        ]
        events.sort(key=lambda e: e[0])
        spent = avoided = 0.0
        out: list[dict[str, Any]] = []
        starts = [r.start for r in self.trials if r.start is not None]
        if events and starts and min(starts) < events[0][0]:  # the curve starts at zero
            out.append({"time": min(starts), "trial": "start", "spent": 0.0, "avoided": 0.0})
        for t, r in events:
            if r.outcome == "rejected":
                avoided += self.saving(r)[0] or 0.0
            else:
                spent += r.spent or 0.0
            out.append({"time": t, "trial": r.label, "spent": spent, "avoided": avoided})
        return out

    def accuracy(self) -> dict[str, Any]:
        """Prediction errors: overall, by model kind, by family (spec name)."""
        out: dict[str, Any] = {
            "memory": rel_errors(_memory_pairs(self.trials)),
            "time": rel_errors(_time_pairs(self.trials)),
            "oom_with_prediction": sum(
                r.outcome == "oom" and r.pred_memory is not None for r in self.trials
            ),
        }
        for key, attr in (("by_model", "model_kind"), ("by_family", "name")):
            groups: dict[str, list[TrialRow]] = {}
            for r in self.trials:
                if r.measured:
                    groups.setdefault(str(getattr(r, attr) or "unknown"), []).append(r)
            rows: list[dict[str, Any]] = []
            for name, members in groups.items():
                m = rel_errors(_memory_pairs(members))
                t = rel_errors(_time_pairs(members))
                if m["n"] or t["n"]:
                    rows.append({"group": name, "trials": len(members), "memory": m, "time": t})
            rows.sort(key=lambda g: (-int(g["trials"]), str(g["group"])))
            out[key] = rows
        return out

    def rejections(self) -> dict[str, Any]:
        """Rejected trials by the limit they broke, and the distinct reasons."""
        kinds: dict[str, int] = {}
        for r in self.trials:
            if r.outcome != "rejected":
                continue
            found = r.reason_kinds or (["prediction failed"] if r.prediction_error else [])
            for k in found or ["unknown"]:
                kinds[k] = kinds.get(k, 0) + 1
        return {"by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1]))}

    def best(self, n: int = 10) -> list[TrialRow]:
        """The ``n`` best trials by objective value (needs a direction), best first."""
        if self.direction not in ("maximize", "minimize"):
            return []
        done = [r for r in self.trials if r.value is not None and r.outcome != "rejected"]
        done.sort(key=lambda r: r.value or 0.0, reverse=self.direction == "maximize")
        return done[:n]

    def _missing(self) -> list[str]:
        """Plain-language notes on what the records lack, each with its fix."""
        notes: list[str] = []
        if not self.trials:
            return [
                "No trials recorded yet. Run the study with CostAwarePruner (Optuna) or "
                "CostAwareSearcher (Ray Tune), then report again."
            ]
        if not any(r.predicted or r.prediction_error for r in self.trials):
            notes.append(
                "No costaware predictions recorded: create the study with CostAwarePruner "
                "(or call costaware.integrations.optuna.admit in the objective; for Ray Tune, "
                "CostAwareSearcher with a store)."
            )
        # a trial that crashed before it reported anything could not be measured,
        # whatever recorded the measurements: it says nothing of what is missing
        crashed = [r for r in self.trials if r.outcome in ("failed", "oom") and not r.measured]
        measurable = [r for r in self.trials if r.admitted and r.outcome not in ("failed", "oom")]
        unmeasured = [r for r in measurable if not r.measured]
        if not self.actuals_expected:
            pass  # the source's own note says where the actuals are
        elif unmeasured and len(unmeasured) == len(measurable):
            notes.append(
                "No actuals recorded (measured peak memory and epoch time): add "
                "CostAwareCallback(store=store, ...) to the Lightning Trainer (CostAwareScheduler "
                "for Ray Tune) and give the report that store (--store / store=)."
            )
        elif unmeasured:
            notes.append(
                f"{len(unmeasured)} of {len(measurable)} admitted trials that did not crash "
                "have no measured actuals (still running, or run without CostAwareCallback)."
            )
        if (
            crashed
            and self.actuals_expected
            and len(crashed) == sum(r.admitted for r in self.trials)
        ):
            notes.append(
                f"Every admitted trial ({len(crashed)}) crashed before recording a "
                "measurement, so there are no actuals to compare with the predictions: their "
                "errors are in the trials' table."
            )
        held = [r for r in self.trials if _held_by_others(r)]
        if held:
            most = max(r.memory_held_before or 0.0 for r in held)
            notes.append(
                f"{len(held)} trial(s) started with GPU memory already reserved beyond their "
                f"own model and optimizer (up to {fmt_bytes(most)}: an earlier trial's tensors "
                "still referenced?). Their measured peaks include it: they are shown, but "
                "left out of the memory error and of the refit."
            )
        s = self.summary()
        if s["saved_unknown"]:
            notes.append(
                f"{s['saved_unknown']} rejected trials have no predicted epoch time (their "
                "TrainingSpec has no dataset_size, or the prediction failed) and, for a "
                "memory rejection, no measured OOM in this study to count its time to the "
                "crash by, so their saving is not counted. Give the spec dataset_size."
            )
        if self.direction is None and any(r.value is not None for r in self.trials):
            notes.append(
                "The optimisation direction is not recorded, so the best trials are not "
                "ranked: pass --mode max or --mode min (mode= in Python)."
            )
        failed = [r for r in self.trials if r.admitted and r.prediction_error]
        if failed:
            reasons = Counter(  # by the error's type: "prediction failed: TraceError: ..."
                str(r.prediction_error).removeprefix("prediction failed: ").split(":", 1)[0]
                for r in failed
            )
            common = ", ".join(f"{k} ({n})" for k, n in reasons.most_common(3))
            notes.append(
                f"{len(failed)} admitted trial(s) could not be predicted and ran unjudged "
                f"(fail open): {common}. Their reasons are in the trials' table; their "
                "measurements still teach the refit."
            )
        return notes

    # -- plain data ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Everything the report shows, as JSON-able data."""
        tl = [{**p, "time": p["time"].isoformat()} for p in self.timeline()]
        return {
            "title": self.title,
            "source": self.source,
            "study": self.study,
            "generated_at": self.generated_at.isoformat(),
            "direction": self.direction,
            "metric": self.metric,
            "summary": self.summary(),
            "caps": dict(self.caps),
            "spent_basis": self.spent_basis,
            "timeline": tl,
            "accuracy": self.accuracy(),
            "rejections": self.rejections(),
            "best": [r.to_dict() for r in self.best()],
            "trials": [self._trial_dict(r) for r in self.trials],
            "notes": list(self.notes),
            "other_gpus": _gpu_costs(self),
        }

    def _trial_dict(self, r: TrialRow) -> dict[str, Any]:
        saved, basis = self.saving(r)
        return {**r.to_dict(), "saved": saved, "saved_basis": basis}

    # -- renderings ---------------------------------------------------------------------
    def to_html(
        self, path: str | os.PathLike[str] | None = None, *, progress: ProgressFn | None = None
    ) -> str:
        """The report as one self-contained HTML page (plotly.js inlined: opens offline).

        Writes it to ``path`` when given; returns the HTML either way.
        """
        from costaware.reporting.html import render_html

        text = render_html(self, progress=progress)
        if path is not None:
            _write(path, text)
        return text

    def to_markdown(self, path: str | os.PathLike[str] | None = None) -> str:
        """The report as Markdown (tables, no figures), for a pull request or a wiki."""
        from costaware.reporting.text import render_markdown

        text = render_markdown(self)
        if path is not None:
            _write(path, text)
        return text

    def print(self, console: Any = None) -> None:
        """Print the summary to the terminal (a ``rich.console.Console``; default stdout)."""
        from costaware.reporting.text import print_summary

        print_summary(self, console)


def _gpu_costs(rep: Report) -> dict[str, Any]:
    from costaware.reporting.gpus import gpu_costs

    return gpu_costs(rep)


def _write(path: str | os.PathLike[str], text: str) -> None:
    p = pathlib.Path(path)
    if p.parent and not p.parent.is_dir():
        raise ReportError(f"cannot write {p}: the directory {p.parent} does not exist.")
    try:
        p.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write {p}: {e.strerror or e}.") from None


# --------------------------------------------------------------------------------------
# the observation store
# --------------------------------------------------------------------------------------
@dataclass
class _StoreTrial:
    prediction: dict[str, Any] | None = None  # the latest record with a prediction, else latest
    measurements: list[dict[str, Any]] = field(default_factory=list)
    first_seen: _dt.datetime | None = None


def _is_calibration(st: _StoreTrial) -> bool:
    """Whether a store trial is a ``costaware calibrate`` measurement, not a study's trial."""
    return bool(_map(_map(st.prediction).get("spec")).get("calibration"))


def _group_store(
    predictions: Iterable[Mapping[str, Any]], measurements: Iterable[Mapping[str, Any]]
) -> dict[tuple[str | None, str], _StoreTrial]:
    out: dict[tuple[str | None, str], _StoreTrial] = {}
    for p in predictions:
        if p.get("trial") is None:
            continue
        key = (p.get("study"), str(p["trial"]))
        st = out.setdefault(key, _StoreTrial(first_seen=p.get("created_at")))
        if st.prediction is None or p.get("prediction") or not st.prediction.get("prediction"):
            st.prediction = dict(p)
    for m in measurements:
        if m.get("trial") is None:
            continue
        key = (m.get("study"), str(m["trial"]))
        st = out.setdefault(key, _StoreTrial(first_seen=m.get("created_at")))
        st.measurements.append(dict(m))
    return out


def _apply_prediction(row: TrialRow, p: Mapping[str, Any]) -> None:
    """Fill ``row``'s predicted figures from a store prediction record."""
    spec = _map(p.get("spec"))
    pred = _map(p.get("prediction"))
    decision = _map(p.get("decision"))
    row.name = row.name or _str(spec.get("family") or spec.get("name"))
    row.device = row.device or _str(p.get("device"))
    row.epochs_planned = row.epochs_planned or _int(spec.get("epochs"))
    row.gpus = max(row.gpus, _int(spec.get("world_size")) or 1)
    if not row.params:  # the search's parameters where recorded, else the spec's
        row.params = dict(_map(_map(p.get("meta")).get("params")))
        if not row.params:
            row.params = {
                k: v
                for k, v in spec.items()
                if k in ("batch_size", "lr", "optimizer", "precision") and v is not None
            }
            row.params_searched = False
    if pred:
        row.predicted = True
        row.pred_memory = _first(row.pred_memory, pred.get("peak_memory"))
        row.pred_memory_upper = _first(row.pred_memory_upper, pred.get("peak_memory_upper"))
        row.pred_epoch_time = _first(row.pred_epoch_time, pred.get("epoch_time"))
        row.pred_epoch_time_upper = _first(row.pred_epoch_time_upper, pred.get("epoch_time_upper"))
        row.pred_trial_time = _first(row.pred_trial_time, pred.get("trial_time"))
        row.gate_latency = _first(row.gate_latency, pred.get("latency_s"))
        row.model_kind = row.model_kind or _str(pred.get("kind"))
        if not row.pred_step:
            from costaware.reporting.gpus import step_of

            row.pred_step = step_of(pred, spec)
    if p.get("status") == "error":
        row.prediction_error = row.prediction_error or _str(p.get("reason")) or "prediction failed"
    if p.get("status") == "rejected" and not row.reasons:
        reasons = _list(decision.get("reasons"))
        row.reasons = [str(r.get("message")) for r in reasons if isinstance(r, Mapping)]
        row.reason_kinds = [str(r.get("kind")) for r in reasons if isinstance(r, Mapping)]
        if not row.reasons and p.get("reason"):
            row.reasons = [str(p["reason"])]


def _apply_measurements(row: TrialRow, ms: Sequence[Mapping[str, Any]]) -> str | None:
    """Fill ``row``'s actuals from its measurement records; returns the store's outcome."""
    if not ms:
        return None
    row.measured = True
    good = [_map(m.get("actual")) for m in ms if m.get("status") in ("ok", "stopped")]
    peaks = [v for a in good if (v := _num(a.get("peak_memory"))) is not None]
    epochs = [v for a in good if (v := _num(a.get("epoch_time"))) is not None]
    iters = [v for a in good if (v := _num(a.get("iteration_time"))) is not None]
    every = [  # the epochs' times and those of epochs cut short: what the trial trained
        v
        for m in ms
        for k in ("epoch_time", "partial_epoch_time")
        if (v := _num(_map(m.get("actual")).get(k))) is not None
    ]
    row.actual_memory = max(peaks) if peaks else None
    held = [v for a in good if (v := _num(a.get("held_before"))) is not None]
    row.memory_held_before = max(held) if held else None
    methods = [v for a in good if isinstance(v := a.get("memory_method"), str) and v]
    row.memory_method = row.memory_method or (methods[-1] if methods else None)
    row.actual_epoch_time = _median(epochs)
    row.actual_iteration_time = _median(iters)
    row.epochs_measured = len(epochs)
    row.train_time = sum(every) if every else None
    row.device = row.device or next((_str(m.get("device")) for m in ms if m.get("device")), None)
    kinds = [k for m in ms if isinstance(k := _map(m.get("actual")).get("device_kind"), str)]
    row.device_kind = row.device_kind or (kinds[0].lower() if kinds else None)
    times = [t for m in ms if isinstance(t := m.get("created_at"), _dt.datetime)]
    if times and row.end is None:
        row.end = max(times)
    statuses = [m.get("status") for m in ms]
    reason_of = {m.get("status"): m.get("reason") for m in ms if m.get("reason")}
    if "oom" in statuses:
        reached = [
            v
            for m in ms
            if m.get("status") == "oom"
            and (v := _num(_map(m.get("actual")).get("peak_memory"))) is not None
        ]
        row.oom_memory_reached = max(reached) if reached else None
        row.reasons = row.reasons or [str(reason_of.get("oom") or "CUDA out of memory")]
        return "oom"
    if "stopped" in statuses:
        row.reasons = row.reasons or [str(reason_of.get("stopped") or "stopped")]
        return "stopped"
    if "error" in statuses:
        row.reasons = row.reasons or [str(reason_of.get("error") or "error")]
        return "failed"
    return "completed"


def _map(v: Any) -> Mapping[str, Any]:
    """``v`` when it is a mapping, else an empty one: a record's JSON of another shape
    (written by other means) reads as missing, never as a crash."""
    return v if isinstance(v, Mapping) else {}


def _list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, (list, tuple)) else []


def _first(current: float | None, new: Any) -> float | None:
    return current if current is not None else _num(new)


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


def _store_rows(
    grouped: Mapping[tuple[str | None, str], _StoreTrial], *, prefix_study: bool
) -> list[TrialRow]:
    rows = []
    for (study, trial), st in grouped.items():
        label = f"{study}:{trial}" if prefix_study and study is not None else trial
        row = TrialRow(trial=label, outcome="unmeasured", study=study, number=_trial_number(trial))
        if st.prediction is not None:
            _apply_prediction(row, st.prediction)
        outcome = _apply_measurements(row, st.measurements)
        status = st.prediction.get("status") if st.prediction else None
        if status == "rejected" and not st.measurements:
            row.outcome = "rejected"
            row.end = st.prediction.get("created_at") if st.prediction else None
        else:
            row.outcome = outcome or "unmeasured"
        if row.outcome == "completed":
            row.reasons = []
        row.start = st.first_seen
        rows.append(row)
    return rows


def _said_in(note: str, given: str) -> bool:
    """Whether a note the report would add is already said by one the source gave: the
    fix it names (``--mode``) appears there."""
    return "--mode" in note and "--mode" in given


def _says_oom(text: str) -> bool:
    """Whether an error's text is an out-of-memory error's (CUDA's, a CPU allocator's)."""
    low = text.lower()
    return "out of memory" in low or "outofmemoryerror" in low or "can't allocate memory" in low


def _trial_number(trial: str) -> int | None:
    return int(trial) if trial.isdigit() else None


def _read_store(
    store: Any, study: str | None, *, known: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str | None]:
    """The store's prediction and measurement records, and a note on the malformed rows
    it skipped (None when there were none), also given as one warning. A ``study`` the
    store holds no records of is a misspelling, unless it is ``known`` (an Optuna study
    that exists, whose trials costaware has not recorded yet)."""
    try:
        with warnings.catch_warnings():  # the store warns per table: one warning below
            warnings.filterwarnings("ignore", message=".*malformed row", category=CostAwareWarning)
            predictions, measurements = (
                store.predictions(study=study),
                store.measurements(study=study),
            )
        if study is not None and not known and not predictions and not measurements:
            held = sorted(
                {str(r.get("study")) for r in [*store.predictions(), *store.measurements()]}
                - {"None", ""}
            )
            if held:  # a misspelt study, not an empty store
                raise ReportError(
                    f"no study named {study!r} in the observation store "
                    f"{getattr(store, 'url', '')}; it holds: {', '.join(held)}."
                )
    except CostawareError as e:
        raise ReportError(str(e)) from None
    return predictions, measurements, _skipped_note(getattr(store, "skipped", None))


def _skipped_note(skipped: Any) -> str | None:
    """A note (and a warning) on the malformed rows a store skipped: how many and why."""
    if not skipped:
        return None
    by_reason: dict[str, int] = {}
    for row in skipped:
        why = str(row.get("reason") if isinstance(row, Mapping) else row)
        by_reason[why] = by_reason.get(why, 0) + 1
    shown = sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
    why_text = "; ".join(f"{why} ({n} row{'s' * (n > 1)})" for why, n in shown[:5])
    if len(shown) > 5:
        why_text += f"; and {len(shown) - 5} other kinds"
    note = (
        f"{len(skipped)} malformed row(s) of the observation store were skipped and are left "
        f"out of this report: {why_text}. They were not written by costaware, or were damaged."
    )
    warnings.warn(note, CostAwareWarning, stacklevel=4)
    return note


def _caps_from(predictions: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The budget limits recorded with the decisions (the latest one of each kind), and
    under ``"price_per_hour"`` the budget's price of a device-hour where one was given."""
    caps: dict[str, float] = {}
    for p in predictions:
        checked = _map(_map(p.get("decision")).get("checked"))
        for kind in ("memory", "epoch_time", "trial_time", "total_time", "cost"):
            limit = _num(_map(checked.get(kind)).get("limit"))
            if limit is not None:
                caps[kind] = limit
        if (price := _num(checked.get("price_per_hour"))) is not None:
            caps["price_per_hour"] = price
    return caps


def _open_store(store: Any) -> Any:
    """An ObservationStore from an object, a URL or a path (checked before it is opened)."""
    if hasattr(store, "predictions") and hasattr(store, "measurements"):
        return store
    if not isinstance(store, (str, os.PathLike)):
        raise ReportError(
            "store must be an ObservationStore, its URL or a SQLite path, but got "
            f"{type(store).__name__}."
        )
    url = _as_url(store)
    tables = _tables(url)
    if "costaware_predictions" not in tables:
        what = "an Optuna study's storage" if "studies" in tables else "not an observation store"
        raise ReportError(
            f"{_safe(url)} has no costaware tables ({what}): --store takes the URL the "
            "pruner and CostAwareCallback wrote to, e.g. sqlite:///costaware.db."
        )
    from costaware.runtime.store import ObservationStore

    try:
        return ObservationStore(url)
    except CostawareError as e:
        raise ReportError(str(e)) from None


# --------------------------------------------------------------------------------------
# databases and URLs
# --------------------------------------------------------------------------------------
def _as_url(source: str | os.PathLike[str]) -> str:
    text = os.fspath(source)
    if "://" in text:
        return text
    return "sqlite:///" + str(pathlib.Path(text).expanduser().absolute())


def _safe(url: str) -> str:
    """``url`` with any password hidden."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1] if "@" in url else url


def _sqlite_file(url: str) -> pathlib.Path | None:
    if not url.startswith("sqlite"):
        return None
    from sqlalchemy.engine import make_url

    db = make_url(url).database
    if not db or db == ":memory:":
        return None
    return pathlib.Path(db).expanduser()


def _tables(url: str) -> set[str]:
    """The table names of the database at ``url``; a missing SQLite file is an error
    (opening it would create an empty one)."""
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    path = _sqlite_file(url)
    if path is not None and not path.is_file():
        raise ReportError(f"no such file: {path}")
    try:
        engine = sa.create_engine(url, poolclass=NullPool)
    except Exception as e:  # bad URL, missing driver
        raise ReportError(f"cannot open {_safe(url)}: {_one_line(e)}") from None
    try:
        return set(sa.inspect(engine).get_table_names())
    except Exception as e:
        raise ReportError(f"cannot read {_safe(url)}: {_one_line(e)}") from None
    finally:
        engine.dispose()


def _one_line(e: BaseException) -> str:
    orig = getattr(e, "orig", None)
    text = " ".join(str(orig if orig is not None else e).split())
    return text or type(e).__name__


# --------------------------------------------------------------------------------------
# Optuna
# --------------------------------------------------------------------------------------
def _is_study(obj: Any) -> bool:
    return all(hasattr(obj, a) for a in ("get_trials", "study_name", "directions"))


def _is_journal(text: str) -> bool:
    """Whether ``text`` is the path of an Optuna journal file (``JournalFileBackend``: JSON
    lines), not a database."""
    path = pathlib.Path(text).expanduser()
    if "://" in text or not path.is_file():
        return False
    try:
        with path.open("rb") as f:
            head = f.read(64).lstrip()
    except OSError:
        return False
    return head.startswith(b'{"op_code"')


def _journal_study(path: pathlib.Path, study: str | None) -> Any:
    """The Optuna study ``study`` (the only one where None) of the journal file ``path``."""
    try:
        from costaware.integrations import _studies
    except ImportError:
        raise ReportError(
            "reading an Optuna journal needs Optuna: pip install 'costaware[optuna]'"
        ) from None
    storage = _studies.journal(str(path))
    names = _studies.study_names(storage)
    if study is None:
        if len(names) != 1:
            shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
            raise ReportError(
                f"the Optuna journal {path} holds {len(names)} studies ({shown}): pass --study NAME."
                if names
                else f"the Optuna journal {path} holds no studies."
            )
        study = names[0]
    if study not in names:
        raise ReportError(
            f"the Optuna journal {path} holds no study {study!r} (it holds {', '.join(names)})."
        )
    return _studies.load_study(storage, study)


def _load_study(storage: str, study: str | None) -> Any:
    try:
        from costaware.integrations import _studies
    except ImportError:
        raise ReportError(
            "reading an Optuna study needs Optuna: pip install 'costaware[optuna]'"
        ) from None
    tables = _tables(storage)
    if "studies" not in tables:
        hint = (
            " It is an observation store: pass it as --store."
            if "costaware_predictions" in tables
            else ""
        )
        raise ReportError(f"{_safe(storage)} holds no Optuna studies.{hint}")
    try:
        names = _studies.study_names(storage)
    except Exception as e:
        raise ReportError(
            f"cannot read the Optuna storage {_safe(storage)}: {_one_line(e)}"
        ) from None
    if study is None:
        if len(names) == 1:
            study = names[0]
        elif not names:
            raise ReportError(f"{_safe(storage)} holds no Optuna studies.")
        else:
            shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
            raise ReportError(
                f"{_safe(storage)} holds {len(names)} studies ({shown}): pass --study NAME."
            )
    elif study not in names:
        shown = ", ".join(names[:10]) or "none"
        raise ReportError(f"no study named {study!r} in {_safe(storage)}; it holds: {shown}.")
    return _studies.load_study(storage, study)


def _direction(study: Any) -> str | None:
    try:
        dirs = [str(getattr(d, "name", d)).lower() for d in study.directions]
    except Exception:
        return None
    return dirs[0] if dirs and dirs[0] in ("maximize", "minimize") else None


def _optuna_rows(
    study: Any, grouped: Mapping[tuple[str | None, str], _StoreTrial], progress: ProgressFn | None
) -> list[TrialRow]:
    if progress is not None:
        progress("reading the study's trials", 0, 0)
    trials = study.get_trials(deepcopy=False)
    name = study.study_name
    rows = []
    total = len(trials)
    for i, t in enumerate(trials):
        if progress is not None and (i % 500 == 0 or i == total - 1):
            progress("reading trials", i + 1, total)
        a = t.user_attrs
        state = getattr(t.state, "name", str(t.state))
        row = TrialRow(
            trial=str(t.number),
            number=t.number,
            outcome="running",
            study=name,
            params=dict(t.params),
            start=_aware(t.datetime_start),
            end=_aware(t.datetime_complete),
        )
        if t.duration is not None:
            row.wall_time = t.duration.total_seconds()
        values = t.values
        if values:
            row.value = _num(values[0])
        admit = a.get(_ATTR + "admit")
        if any(k.startswith(_ATTR) for k in a):
            row.predicted = a.get(_ATTR + "peak_memory") is not None
            row.pred_memory = _num(a.get(_ATTR + "peak_memory"))
            row.pred_memory_upper = _num(a.get(_ATTR + "peak_memory_upper"))
            row.pred_epoch_time = _num(a.get(_ATTR + "epoch_time"))
            row.pred_epoch_time_upper = _num(a.get(_ATTR + "epoch_time_upper"))
            row.pred_trial_time = _num(a.get(_ATTR + "trial_time"))
            row.device = _str(a.get(_ATTR + "device"))
            row.model_kind = _str(a.get(_ATTR + "model"))
            latency = _num(a.get(_ATTR + "latency_ms"))
            row.gate_latency = latency / 1e3 if latency is not None else None
            row.prediction_error = _str(a.get(_ATTR + "error"))
        st = grouped.get((name, str(t.number)))
        if st is not None and st.prediction is not None:
            _apply_prediction(row, st.prediction)
        store_outcome = _apply_measurements(row, st.measurements if st is not None else [])
        if not row.measured and isinstance(kept := a.get(_ATTR + "measured"), list):
            # a storeless CostAwareCallback keeps its measurements in the trial
            store_outcome = _apply_measurements(row, [m for m in kept if isinstance(m, Mapping)])
            row.measured_in_trial = row.measured
        if state == "PRUNED" and admit is False:
            row.outcome = "rejected"
            row.reasons = [str(x) for x in a.get(_ATTR + "reasons") or []] or row.reasons
            row.reason_kinds = [str(x) for x in a.get(_ATTR + "reason_kinds") or []]
            if not row.reasons and row.prediction_error:
                row.reasons = [row.prediction_error]
        elif state == "PRUNED":
            row.outcome = "stopped"
            stop = a.get("costaware_stopped")
            row.reasons = (
                [str(stop)]
                if stop
                else (
                    row.reasons
                    or [
                        f"pruned by the study's pruner at step {t.last_step}"
                        if t.last_step is not None
                        else "pruned before it reported a step"
                    ]
                )
            )
        elif state == "FAIL":
            # the callback's record, else the error Optuna kept (a plain loop's OOM)
            failed = str(t.system_attrs.get("fail_reason") or "")
            oom = a.get("costaware_oom") or (failed if _says_oom(failed) else None)
            row.outcome = "oom" if oom or store_outcome == "oom" else "failed"
            if oom:
                row.reasons = [str(oom)]
            elif not row.reasons:
                row.reasons = [str(t.system_attrs.get("fail_reason") or "the objective raised")]
        elif state == "COMPLETE":
            row.outcome = "completed"
            row.reasons = []
        else:
            row.outcome = "running"
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------
# Ray Tune
# --------------------------------------------------------------------------------------
def _ray_experiment_dir(path: pathlib.Path) -> pathlib.Path:
    if any(path.glob("experiment_state-*.json")):
        return path
    subs = sorted(
        d for d in path.iterdir() if d.is_dir() and any(d.glob("experiment_state-*.json"))
    )
    if len(subs) == 1:
        return subs[0]
    if subs:
        shown = ", ".join(d.name for d in subs[:10])
        raise ReportError(
            f"{path} holds {len(subs)} Ray Tune experiments ({shown}): pass one of them."
        )
    raise ReportError(
        f"{path} is not a Ray Tune experiment directory (no experiment_state-*.json in it or "
        "in a subdirectory): pass the directory RunConfig(storage_path=..., name=...) wrote."
    )


def _read_json_lines(path: pathlib.Path) -> list[dict[str, Any]]:
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    d = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a crash
                if isinstance(d, dict):
                    out.append(d)
    except OSError:
        return []
    return out


def _ray_trials(exp: pathlib.Path) -> tuple[list[dict[str, Any]], str | None]:
    """The trials of a Ray Tune experiment directory (JSON only, never its pickles)."""
    # the newest by the session timestamp in the name, as Ray Tune restores it (the
    # greatest name): a restored run rewrites every state file, so their times say nothing
    states = sorted(exp.glob("experiment_state-*.json"), key=lambda p: p.name)
    try:
        state = json.loads(states[-1].read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ReportError(f"cannot read {states[-1]}: {e}") from None
    metric = None
    runner = state.get("runner_data")
    if isinstance(runner, Mapping):
        metric = _str(runner.get("_metric"))
    trials = []
    for entry in state.get("trial_data") or []:
        try:
            info = json.loads(entry[0]) if isinstance(entry[0], str) else dict(entry[0])
            runtime = json.loads(entry[1]) if isinstance(entry[1], str) else dict(entry[1])
        except (ValueError, TypeError, IndexError, KeyError):
            continue
        trials.append({**runtime, **info})
    return trials, metric


def _ray_rows(
    exp: pathlib.Path, grouped: Mapping[tuple[str | None, str], _StoreTrial], study: str | None
) -> tuple[list[TrialRow], str | None]:
    trials, metric = _ray_trials(exp)
    rows = []
    for tr in trials:
        tid = str(tr.get("trial_id"))
        tag = str(tr.get("experiment_tag") or "")
        head = tag.split("_", 1)[0]
        row = TrialRow(
            trial=tid,
            outcome="running",
            number=int(head) if head.isdigit() else None,
            study=study,
            params=dict(tr.get("config") or {}),
            start=_from_epoch(tr.get("start_time")),
        )
        logdir = tr.get("relative_logdir")
        results = _read_json_lines(exp / str(logdir) / "result.json") if logdir else []
        last = tr.get("last_result") if isinstance(tr.get("last_result"), Mapping) else None
        if not results and last:
            results = [dict(last)]
        if results:
            final = results[-1]
            row.wall_time = _num(final.get("time_total_s"))
            row.end = _from_epoch(final.get("timestamp")) or _from_epoch(tr.get("last_result_time"))
            if metric is not None:
                row.value = _num(final.get(metric))
        st = grouped.get((study, tid))
        if st is not None and st.prediction is not None:
            _apply_prediction(row, st.prediction)
        store_outcome = _apply_measurements(row, st.measurements if st is not None else [])
        if not row.measured:  # actuals straight from the results the trainable reported
            epochs = [v for r in results if (v := _first_num(r, _RAY_EPOCH_TIME_KEYS)) is not None]
            peaks = [v for r in results if (v := _first_num(r, _RAY_PEAK_MEMORY_KEYS)) is not None]
            if epochs or peaks:
                row.measured = True
                row.actual_epoch_time = _median(epochs)
                row.actual_memory = max(peaks) if peaks else None
                row.epochs_measured = max(len(epochs), len(peaks))
                row.train_time = sum(epochs) if epochs else None
        status = str(tr.get("status") or "")
        if status == "ERROR":
            text = _ray_error(exp, tr)
            row.outcome = "oom" if store_outcome == "oom" or _says_oom(text) else "failed"
            row.reasons = row.reasons or [text or "the trainable raised"]
        elif store_outcome in ("stopped", "oom", "failed"):
            row.outcome = store_outcome
        elif status == "TERMINATED":
            row.outcome = "completed"
            row.reasons = []
        else:
            row.outcome = "running"
        rows.append(row)
    rows.sort(key=lambda r: (r.number is None, r.number or 0, r.trial))
    return rows, metric


def _ray_error(exp: pathlib.Path, tr: Mapping[str, Any]) -> str:
    name = tr.get("error_filename")
    logdir = tr.get("relative_logdir")
    for candidate in (name, "error.txt"):
        if not candidate or not logdir:
            continue
        p = exp / str(logdir) / str(candidate)
        if p.is_file():
            try:
                lines = [
                    ln.strip() for ln in p.read_text(errors="replace").splitlines() if ln.strip()
                ]
            except OSError:
                continue
            errs = [ln for ln in lines if "Error" in ln or "error" in ln]
            return (errs[-1] if errs else lines[-1] if lines else "")[:500]
    return ""


def _ray_study(
    grouped: Mapping[tuple[str | None, str], _StoreTrial],
    ids: set[str],
    study: str | None,
    name: str,
) -> tuple[str | None, str | None]:
    """The store study the Ray trials were recorded under, and a note when it is chosen
    on weaker grounds than the trials' own records. Given, else the study that holds the
    most of the run's trials; else, when no trial of the run is in the store (a run whose
    every suggestion was rejected has no Tune trial), the study named as the experiment
    directory ``name``, or the store's only study."""
    if study is not None:
        return study, None
    overlap: dict[str | None, int] = {}
    for s, t in grouped:
        if t in ids or t.split("_rej", 1)[0] in ids:
            overlap[s] = overlap.get(s, 0) + 1
    if overlap:
        return max(overlap, key=lambda s: overlap[s]), None
    held = {s for s, _ in grouped if s is not None}
    if name in held:
        return name, None
    calibration = {s for (s, t), st in grouped.items() if _is_calibration(st)}
    if not ids and len(held - calibration) == 1:
        only = next(iter(held - calibration))
        return only, (
            f"No Tune trial of this run is in the observation store, which holds one study, "
            f"{only!r}: its records are shown as this run's (pass --study to choose)."
        )
    return None, None


# --------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------
@dataclass
class _Sources:
    """What :func:`report` reads from, once its arguments are resolved: the Optuna study,
    the opened observation store and the Ray Tune directory (any may be missing), and the
    Optuna storage URL (where a store lying beside it is looked for)."""

    optuna_study: Any = None
    store: Any = None
    ray_path: pathlib.Path | None = None
    storage: str | None = None


@dataclass
class _Gathered:
    """The trials one kind of source gives the report, and what the report says of them:
    where they came from, its default title, what a trial's spent time is, what is
    missing, and the study, ranking direction and metric the trials were read under."""

    rows: list[TrialRow]
    source: str
    default_title: str
    spent_basis: str
    notes: list[str]
    study: str | None
    direction: str | None
    metric: str | None = None
    budget_spent_s: float | None = None
    budget_spent_basis: str = ""


def _direction_of(mode: str | None, price_per_hour: float | None) -> str | None:
    """The Optuna direction ``mode`` names, after checking ``mode`` and
    ``price_per_hour``: bad options fail before any source is opened."""
    if mode is not None and mode not in ("max", "min", "maximize", "minimize"):
        raise ReportError(f"mode must be 'max' or 'min', but got {mode!r}.")
    direction = {"max": "maximize", "min": "minimize"}.get(mode or "", mode)
    if price_per_hour is not None and (_num(price_per_hour) is None or price_per_hour < 0):
        raise ReportError(f"price_per_hour must be a number >= 0, but got {price_per_hour!r}.")
    return direction


def _open_sources(
    source: Any,
    *,
    study: str | None,
    store: Any,
    storage: str | None,
    ray_dir: str | os.PathLike[str] | None,
    progress: ProgressFn | None,
) -> _Sources:
    """Tell what ``source`` is (a study, a store, a database holding either or both, a Ray
    directory), then open the Optuna study and the store; a database that holds both
    serves as both. Fails with what to pass when nothing can be reported on."""
    found = _Sources(storage=storage)
    if source is not None:
        if _is_study(source):
            found.optuna_study = source
        elif hasattr(source, "predictions") and hasattr(source, "measurements"):
            found.store = source
        elif isinstance(source, (str, os.PathLike)):
            text = os.fspath(source)
            path = pathlib.Path(text).expanduser()
            if "://" not in text and path.is_dir():
                found.ray_path = path
            elif _is_journal(text):
                found.optuna_study = _journal_study(path, study)
            else:
                url = _as_url(text)
                tables = _tables(url)
                if "studies" in tables:
                    found.storage = url
                if "costaware_predictions" in tables and store is None:
                    store = url
                if "studies" not in tables and "costaware_predictions" not in tables:
                    raise ReportError(
                        f"{_safe(url)} holds neither an Optuna study nor a costaware "
                        "observation store."
                    )
        else:
            raise ReportError(
                "report() takes an optuna.Study, an ObservationStore, a database URL or path, "
                f"or a Ray Tune experiment directory, but got {type(source).__name__}."
            )
    if ray_dir is not None:
        found.ray_path = pathlib.Path(ray_dir).expanduser()
        if not found.ray_path.is_dir():
            raise ReportError(f"no such directory: {found.ray_path}")
    if found.storage is not None and found.optuna_study is None and _is_journal(found.storage):
        found.optuna_study = _journal_study(pathlib.Path(found.storage).expanduser(), study)
        found.storage = None
    if found.storage is not None and found.optuna_study is None:
        if progress is not None:
            progress("opening the Optuna study", 0, 1)
        storage_url = _as_url(found.storage)
        found.optuna_study = _load_study(storage_url, study)
        if store is None and "costaware_predictions" in _tables(storage_url):
            store = storage_url  # one database holds both
    if store is not None and found.store is None:
        found.store = _open_store(store)
    if found.optuna_study is None and found.store is None and found.ray_path is None:
        raise ReportError(
            "nothing to report on: give an Optuna study (--storage URL --study NAME), an "
            "observation store (--store URL) or a Ray Tune directory (--ray-dir PATH)."
        )
    return found


def _read_records(
    found: _Sources, study: str | None, progress: ProgressFn | None
) -> tuple[dict[tuple[str | None, str], _StoreTrial], dict[str, float], str | None]:
    """The store's records grouped by (study, trial), the budget limits its decisions
    recorded, and the note on malformed rows it skipped (None: none). Beside an Optuna
    study only that study's records are read; alone, ``study``'s (None: all)."""
    if found.store is None:
        return {}, {}, None
    if progress is not None:
        progress("reading the observation store", 0, 1)
    want = study if found.optuna_study is None and found.ray_path is None else None
    if found.optuna_study is not None:
        want = found.optuna_study.study_name
    known = found.optuna_study is not None
    predictions, measurements, skipped = _read_store(found.store, want, known=known)
    return _group_store(predictions, measurements), _caps_from(predictions), skipped


def _optuna_gathered(
    found: _Sources,
    grouped: Mapping[tuple[str | None, str], _StoreTrial],
    direction: str | None,
    progress: ProgressFn | None,
) -> _Gathered:
    """An Optuna study's trials, joined with the store's records where one is given;
    the study's own direction wins over ``mode``."""
    optuna_study = found.optuna_study
    name = optuna_study.study_name
    notes: list[str] = []
    rows = _optuna_rows(optuna_study, grouped, progress)
    src = f"Optuna study {name!r}"
    if found.store is not None:
        src += f", observation store {found.store.url}" if hasattr(found.store, "url") else ""
        ran = [r for r in rows if r.outcome not in ("rejected", "running")]
        if any(r.measured_in_trial for r in rows):
            notes.append(
                f"The observation store holds no measurements of study {name!r} for "
                f"{_trials(sum(r.measured_in_trial for r in rows))}: their measured figures are "
                "those CostAwareCallback kept in the trials' user attributes (it had no store, "
                "or could not write to it), which the model did not refit on."
            )
        elif not any(st.measurements for st in grouped.values()) and ran:
            notes.append(
                f"The observation store has no measurements for study {name!r}: add "
                "CostAwareCallback(trial=trial) to the Trainer (it records into the "
                "CostAwarePruner's store, or its own store=)."
            )
    elif any(r.measured_in_trial for r in rows):
        notes.append(
            "No observation store given: the measured figures are those CostAwareCallback "
            "kept in the trials' user attributes (costaware:measured). With a store "
            "(CostAwarePruner(store=...)) the model also refits on them."
        )
    else:
        notes.append(
            "No observation store given: the measured peak memory and epoch times live in "
            "the store CostAwareCallback writes to; pass it with --store URL (store= in "
            "Python)." + _store_hint(found.storage, name)
        )
    if len(getattr(optuna_study, "directions", ())) > 1:
        notes.append("A multi-objective study: the best trials are ranked by the first objective.")
    # the pruner's own sum, so that the report's "spent" of the study-wide caps is the
    # figure that stopped the study
    from costaware.integrations.optuna import study_spent

    return _Gathered(
        rows=rows,
        source=src,
        default_title=f"costaware report: {name}",
        spent_basis="a trial's wall time as Optuna recorded it (start to end)",
        notes=notes,
        study=name,
        direction=_direction(optuna_study) or direction,
        budget_spent_s=study_spent(optuna_study),
        budget_spent_basis=(
            "the wall time of every finished trial (completed, pruned or failed), as "
            "CostAwarePruner counts it against max_total_time and max_cost: the time the "
            "rejected trials took to be judged counts too"
        ),
    )


def _ray_gathered(
    found: _Sources,
    ray_path: pathlib.Path,
    grouped: Mapping[tuple[str | None, str], _StoreTrial],
    study: str | None,
    direction: str | None,
) -> _Gathered:
    """A Ray Tune run's trials, joined with the store's records of the study they were
    recorded under; the suggestions the searcher rejected (never trials) come from the
    store alone."""
    exp = _ray_experiment_dir(ray_path)
    trials, _ = _ray_trials(exp)
    ids = {str(t.get("trial_id")) for t in trials}
    chosen, chosen_note = _ray_study(grouped, ids, study, exp.name)
    rows, metric = _ray_rows(exp, grouped, chosen)
    notes: list[str] = [chosen_note] if chosen_note else []
    if found.store is not None and chosen is not None:
        for (s, tid), st in grouped.items():  # rejected suggestions never became trials
            if s == chosen and tid not in ids:
                rows.extend(_store_rows({(s, tid): st}, prefix_study=False))
    elif found.store is not None:
        notes.append(
            "The observation store holds no records of these Ray trials: give "
            "CostAwareSearcher and CostAwareScheduler this store (and the same study=)."
        )
    else:
        notes.append(
            "No observation store given: Ray Tune keeps the rejected suggestions only in "
            "the searcher's pickled state, which a report does not unpickle. Pass the store "
            "CostAwareSearcher wrote to (--store URL) to see rejections, predictions and "
            "over-budget stops." + _ray_store_hint(exp, ray_path, ids)
        )
    if direction is None and metric:
        notes.append(
            f"Ray Tune does not record whether {metric!r} is maximised or minimised: pass "
            "--mode max or --mode min to rank the best trials."
        )
    src = f"Ray Tune experiment {exp}"
    if found.store is not None and hasattr(found.store, "url"):
        src += f", observation store {found.store.url}"
    return _Gathered(
        rows=rows,
        source=src,
        default_title=f"costaware report: {exp.name}",
        spent_basis="a trial's time_total_s as Ray Tune recorded it",
        notes=notes,
        study=study,
        direction=direction,
        metric=metric,
    )


def _store_gathered(
    found: _Sources,
    grouped: Mapping[tuple[str | None, str], _StoreTrial],
    study: str | None,
    direction: str | None,
) -> _Gathered:
    """The store's trials on their own, ordered by study, trial number and start. Without
    a ``study``, ``costaware calibrate`` measurements are left out (they are no study's
    trials) unless they are all the store holds."""
    notes: list[str] = []
    calibration = {k for k, st in grouped.items() if _is_calibration(st)}
    if study is None and calibration and len(calibration) < len(grouped):
        grouped = {k: st for k, st in grouped.items() if k not in calibration}
        names = sorted({str(s) for s, _ in calibration})
        notes.append(
            f"{len(calibration)} calibration measurements (costaware calibrate, study "
            f"{', '.join(map(repr, names))}) are left out: they are no study's trials. "
            f"--study {names[0]} reports them."
        )
    studies = {s for s, _ in grouped}
    rows = _store_rows(grouped, prefix_study=len(studies) > 1)
    rows.sort(
        key=lambda r: (
            r.study or "",
            r.number is None,
            r.number or 0,
            r.start or _dt.datetime.min.replace(tzinfo=_dt.timezone.utc),
        )
    )
    only = next(iter(studies)) if len(studies) == 1 else study
    src = f"observation store {getattr(found.store, 'url', found.store)!s}"
    if study is not None:
        src += f", study {study!r}"
    if grouped:
        notes.append(
            "The observation store holds no objective values: report the Optuna study "
            "(--storage URL --study NAME) or the Ray directory to see the best trials."
        )
    return _Gathered(
        rows=rows,
        source=src,
        default_title=f"costaware report: {only}" if only else "costaware report",
        spent_basis="the sum of a trial's measured epoch times (the store records no wall time)",
        notes=notes,
        study=only,
        direction=direction,
    )


def report(
    source: Any = None,
    *,
    study: str | None = None,
    store: Any = None,
    storage: str | None = None,
    ray_dir: str | os.PathLike[str] | None = None,
    budget: Any = None,
    price_per_hour: float | None = None,
    currency: str = "$",
    mode: str | None = None,
    title: str | None = None,
    progress: ProgressFn | None = None,
) -> Report:
    """Build the budget report of an Optuna study, an observation store or a Ray Tune run.

    Args:
        source: what to report on: an ``optuna.Study``, an
            :class:`~costaware.runtime.store.ObservationStore`, a database URL or SQLite path
            (an Optuna storage, an observation store, or one file holding both), or a
            Ray Tune experiment directory. May be None when ``storage``, ``store`` or
            ``ray_dir`` says it.
        study: the study name: the Optuna study in ``storage`` (needed when it holds
            several), or the store's study to keep (default: all of them).
        store: the observation store the integrations wrote to (an object, URL or
            path), joined with the study or Ray run for the measured actuals.
        storage: an Optuna storage URL (``--storage``).
        ray_dir: a Ray Tune experiment directory (``--ray-dir``).
        budget: a :class:`~costaware.Budget` whose study-wide caps
            (``max_total_time``, ``max_cost``, ``price_per_hour``) and per-trial limits
            complete what the records hold.
        price_per_hour: the price of one device-hour, to show costs.
        currency: the currency symbol for costs.
        mode: ``"max"`` or ``"min"``: how to rank a Ray Tune run's trials (Ray does not
            record it); an Optuna study's own direction wins.
        title: the report's title (default: from the source).
        progress: ``progress(what, done, total)``, called while reading.

    Raises:
        ReportError: the source cannot be found or read; the message says what to pass.
    """
    direction = _direction_of(mode, price_per_hour)
    found = _open_sources(
        source, study=study, store=store, storage=storage, ray_dir=ray_dir, progress=progress
    )
    grouped, caps, skipped = _read_records(found, study, progress)
    recorded_price = caps.pop("price_per_hour", None)
    if found.optuna_study is not None:
        gathered = _optuna_gathered(found, grouped, direction, progress)
    elif found.ray_path is not None:
        gathered = _ray_gathered(found, found.ray_path, grouped, study, direction)
    else:
        gathered = _store_gathered(found, grouped, study, direction)
    if budget is not None:
        caps.update(_caps_from_budget(budget))
        if price_per_hour is None:
            price_per_hour = getattr(budget, "price_per_hour", None)
    if price_per_hour is None:
        price_per_hour = recorded_price  # the price the study's own budget was given
    if progress is not None:
        progress("analysing", 1, 1)
    rep = Report(
        gathered.rows,
        title=title or gathered.default_title,
        source=gathered.source,
        study=gathered.study,
        direction=gathered.direction,
        metric=gathered.metric,
        caps=caps,
        price_per_hour=price_per_hour,
        currency=currency,
        notes=[*([skipped] if skipped is not None else []), *gathered.notes],
        spent_basis=gathered.spent_basis,
        budget_spent_s=gathered.budget_spent_s,
        budget_spent_basis=gathered.budget_spent_basis,
        actuals_expected=found.store is not None or found.ray_path is not None,
    )
    # the malformed-rows note was also given as a warning while the store was read
    rep.warned = {skipped} if skipped is not None else set()
    return rep


def _store_hint(near: str | None, study: str) -> str:
    """``" A store lies next to it: ..."`` for a costaware.db beside a SQLite file that
    holds records of ``study``."""
    if not near:
        return ""
    try:
        path = _sqlite_file(_as_url(near)) if "://" in near else pathlib.Path(near)
    except Exception:
        return ""
    if path is None:
        return ""
    candidate = _store_in((path.parent,), but=path, studies={study}, trials=set())
    return f" A store lies next to it: --store sqlite:///{candidate}" if candidate else ""


def _ray_store_hint(exp: pathlib.Path, given: pathlib.Path, trials: set[str]) -> str:
    """``" A store lies ..."`` for a costaware.db that holds records of this run (of its
    ``trials``, or of a study named as the experiment) in the experiment directory, the
    directory given, their storage path (the parent) or the current directory: where a
    script that ran Tune would have put one."""
    candidate = _store_in(
        (exp, given, exp.parent, given.parent, pathlib.Path.cwd()),
        studies={exp.name},
        trials=trials,
    )
    if candidate is None:
        return ""
    return f" A store lies at {candidate}: --store sqlite:///{candidate.resolve()}"


def _store_in(
    folders: Iterable[pathlib.Path],
    but: pathlib.Path | None = None,
    *,
    studies: set[str],
    trials: set[str],
) -> pathlib.Path | None:
    """The first ``costaware.db`` in ``folders`` that is not ``but`` (the file asked
    about) and holds records of one of ``studies`` or ``trials`` (a rejected suggestion
    of a trial, ``<id>_rej<n>``, counts): a store of another run is no hint."""
    for folder in dict.fromkeys(folders):
        candidate = folder / "costaware.db"
        if candidate.is_file() and candidate != but and _holds(candidate, studies, trials):
            return candidate
    return None


def _holds(path: pathlib.Path, studies: set[str], trials: set[str]) -> bool:
    """Whether the SQLite observation store at ``path`` holds a record of one of
    ``studies`` or ``trials``; read only, and False for a file that is not a store."""
    import sqlite3

    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    try:
        for table in ("costaware_predictions", "costaware_measurements"):
            rows = con.execute(f"SELECT DISTINCT study, trial FROM {table}")
            for study, trial in rows:
                if study in studies or str(trial).split("_rej", 1)[0] in trials:
                    return True
    except sqlite3.Error:
        return False
    finally:
        con.close()
    return False


def _caps_from_budget(budget: Any) -> dict[str, float]:
    from costaware.budget import parse_duration

    caps: dict[str, float] = {}
    for attr, kind in (
        ("max_epoch_time", "epoch_time"),
        ("max_trial_time", "trial_time"),
        ("max_total_time", "total_time"),
    ):
        v = getattr(budget, attr, None)
        if v is not None:
            caps[kind] = parse_duration(v)
    if getattr(budget, "max_cost", None) is not None:
        caps["cost"] = float(budget.max_cost)
    try:
        limit = budget.max_memory_bytes()
    except Exception:  # relative to a device: the decisions carry it
        limit = None
    if limit is not None:
        caps["memory"] = float(limit)
    return caps
