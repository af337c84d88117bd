"""The residual models :class:`~costaware.core.model.CostModel` learns besides CatBoost's
trees: the lines a fit on few measurements learns (:class:`_Affine` for memory,
:class:`_PrecisionLine` for time, each with its leave-one-out residuals), and the constant
of a target that never varied.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from costaware.spec import PRECISIONS


@dataclass(frozen=True)
class _Constant:
    """A regressor for a target that never varied in training."""

    value: float

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.full(len(x), self.value)


#: the small-sample time correction learns one factor per precision: bf16 on a CPU without
#: bf16 arithmetic ran several times slower than fp32, so one pooled factor fits neither
_GROUP_FEATURES = {p: f"precision_is_{p}" for p in PRECISIONS}
#: the shared log-log slope is clipped to this: a handful of rows can suggest anything
_MAX_LOG_SLOPE = 0.5
#: row pairs (same precision, baselines apart) a slope needs; with fewer it is 0
_MIN_SLOPE_PAIRS = 3
#: time measurements a small-sample refit needs before it tries a slope at all: on fewer
#: rows a slope chosen by leave-one-out makes predictions worse than one factor per
#: precision (``benchmarks/refit_replay.py`` replays refits on held-out families)
_MIN_SLOPE_ROWS = 10


@dataclass(frozen=True)
class _PrecisionLine:
    """``log(measured / baseline) = a[precision] + slope * log(baseline)``.

    One intercept per precision and one slope shared by all, from a handful of
    measurements (fewer than ``SMALL_SAMPLE``, see ``fit``). The slope follows how the measured/estimated ratio drifts
    with size: a small model's step is mostly fixed costs that the estimate under-counts,
    a large one's mostly kernels. With slope 0 it is one factor per precision. A row of a
    precision with no measurement predicts NaN: the caller keeps its baseline (the
    shipped model or the analytic estimate) and that baseline's bound.

    Beyond the largest baseline a precision was measured at (``span``, its log, set by
    :func:`_spans` where the rows show a fixed excess), an excess over the baseline is held
    as the seconds it came to there, added rather than scaled: a study's first trials are
    often small ones, whose steps are mostly the framework's fixed costs (a ``self.log``
    each step, the optimizer's hooks), and that excess as a factor multiplied every larger
    model's step by it and rejected what fits the budget, which no measurement then
    corrects. A shortfall (a faster machine) stays a factor. ``docs/predictions.md``
    ("What a refit on a few trials is worth") replays it on held-out families.
    """

    by_group: dict[str, float]
    columns: dict[str, int]  # group -> index of its indicator feature
    slope: float = 0.0
    #: per precision, the largest log baseline it was fitted on (empty: always a factor)
    span: dict[str, float] = field(default_factory=dict)

    def correction(self, x: np.ndarray, baseline: float) -> float:
        """The log factor from ``baseline`` to the prediction of feature row ``x`` (NaN:
        its precision was never measured)."""
        lb = math.log(max(baseline, 1e-12))
        for g, v in self.by_group.items():
            col = self.columns.get(g)
            if col is not None and x[0, col] == 1.0:
                edge = self.span.get(g)
                if edge is not None and lb > edge and (at := v + self.slope * edge) > 0:
                    excess = math.expm1(at) * math.exp(edge)  # seconds over the baseline there
                    return math.log1p(excess / max(baseline, 1e-12))
                return v + self.slope * lb
        return math.nan


def _fit_precision_line(
    y: np.ndarray, log_base: np.ndarray, groups: np.ndarray, fit_slope: bool = True
) -> tuple[dict[str, float], float]:
    """Theil-Sen within precisions: the median slope of same-precision row pairs whose
    baselines differ by over 10% (0 without ``fit_slope`` or with too few pairs), then
    each precision's median intercept."""
    slopes: list[float] = []
    for g in np.unique(groups) if fit_slope else ():
        idx = np.nonzero(groups == g)[0] if g else np.zeros(0, dtype=int)
        i, j = np.triu_indices(len(idx), k=1)
        du = log_base[idx[j]] - log_base[idx[i]]
        apart = np.abs(du) > 0.1
        slopes += ((y[idx[j]] - y[idx[i]])[apart] / du[apart]).tolist()
    slope = 0.0
    if len(slopes) >= _MIN_SLOPE_PAIRS:
        slope = float(np.clip(np.median(slopes), -_MAX_LOG_SLOPE, _MAX_LOG_SLOPE))
    rest = y - slope * log_base
    return {str(g): float(np.median(rest[groups == g])) for g in np.unique(groups) if g}, slope


def _spans(y: np.ndarray, log_base: np.ndarray, groups: np.ndarray) -> dict[str, float]:
    """Per precision (group), the largest log baseline of its rows (:class:`_PrecisionLine`'s
    ``span``), where a fixed excess explains the rows at least as well as a factor: each
    row, left out, predicted from the others' median excess in seconds no worse (in mean
    relative error) than from their median factor. Rows whose excess grows with their size
    (a slower GPU, what ``costaware calibrate`` measures over models of many sizes) keep a
    factor beyond them; a study's first small trials, alike in size or mostly fixed costs,
    hold theirs as seconds."""
    spans: dict[str, float] = {}
    base = np.exp(log_base)
    measured = base * np.exp(y)
    for g in np.unique(groups):
        if not g:
            continue
        idx = np.nonzero(groups == g)[0]
        factor_err = excess_err = 0.0
        for i in idx if len(idx) > 1 else ():
            rest = idx[idx != i]
            factor = base[i] * float(np.median(measured[rest] / base[rest]))
            excess = base[i] + float(np.median(measured[rest] - base[rest]))
            factor_err += abs(factor / measured[i] - 1)
            excess_err += abs(max(excess, 1e-12) / measured[i] - 1)
        if excess_err <= factor_err:
            spans[str(g)] = float(np.max(log_base[idx]))
    return spans


def _small_sample_line(
    y: np.ndarray,
    log_base: np.ndarray,
    groups: np.ndarray,
    min_slope_rows: int = _MIN_SLOPE_ROWS,
) -> tuple[dict[str, float], float, np.ndarray]:
    """The per-precision line through every row, and the leave-one-out residuals of the
    rows whose precision keeps a measurement without them (a lone row would be predicted
    by the baseline, whose own bound covers it, so it calibrates nothing here).

    The slope is tried only from ``min_slope_rows`` rows on, and kept only when it
    predicts left-out rows better than one factor per precision does: over a narrow range
    of sizes, or a handful of rows, timing noise is all a slope would learn.
    """
    best: tuple[float, dict[str, float], float, np.ndarray] | None = None
    for fit_slope in (False, True) if len(y) >= min_slope_rows else (False,):
        loo = []
        for i in range(len(y)):
            keep = np.arange(len(y)) != i
            if not groups[i] or not np.any(groups[keep] == groups[i]):
                continue
            fit_g, fit_s = _fit_precision_line(y[keep], log_base[keep], groups[keep], fit_slope)
            loo.append(y[i] - fit_g[str(groups[i])] - fit_s * log_base[i])
        res = np.asarray(loo)
        err = float(np.mean(np.abs(res))) if len(res) else 0.0
        if best is None or err < best[0]:
            by_group, slope = _fit_precision_line(y, log_base, groups, fit_slope)
            best = (err, by_group, slope, res)
    assert best is not None
    return best[1], best[2], best[3]


@dataclass(frozen=True)
class _Affine:
    """``measured = intercept + slope * baseline`` (bytes), from a handful of measurements.

    A fixed offset is what a few small trials show most: on a CPU the process grows by a
    few MiB of framework state besides the tensors, and as one factor that offset would
    double the prediction of a 3 MiB model and every larger one after it.
    """

    intercept: float
    slope: float

    def correction(self, baseline: float) -> float:
        """The log factor from ``baseline`` to the prediction."""
        b = max(baseline, 1.0)
        return math.log(max(self.intercept + self.slope * b, 1.0) / b)


#: rows a Theil-Sen slope is estimated from (a random subset above that: O(n^2) pairs)
_THEIL_SEN_ROWS = 800


def _fit_affine(base: np.ndarray, actual: np.ndarray) -> _Affine:
    """Theil-Sen line through (baseline, measured): median pairwise slope, then the median
    intercept; a negative intercept (no offset to learn) falls back to the median ratio."""
    b, a = base, actual
    if len(b) > _THEIL_SEN_ROWS:
        pick = np.random.default_rng(0).choice(len(b), _THEIL_SEN_ROWS, replace=False)
        b, a = b[pick], a[pick]
    i, j = np.triu_indices(len(b), k=1)
    db = b[j] - b[i]
    apart = np.abs(db) > 0.05 * np.maximum(b[i], b[j])
    slopes = (a[j] - a[i])[apart] / db[apart]
    if len(slopes):
        slope = float(np.clip(np.median(slopes), 0.25, 4.0))
        intercept = float(np.median(actual - slope * base))
        if intercept >= 0:
            return _Affine(intercept, slope)
    return _Affine(0.0, float(np.median(actual / np.maximum(base, 1.0))))


def _small_sample_affine(base: np.ndarray, actual: np.ndarray) -> tuple[_Affine, np.ndarray]:
    """The line through every row, and each row's leave-one-out log residual."""
    loo = []
    for i in range(len(base)):
        rest = _fit_affine(np.delete(base, i), np.delete(actual, i))
        loo.append(math.log(actual[i] / base[i]) - rest.correction(base[i]))
    return _fit_affine(base, actual), np.asarray(loo)


def _group_columns(names: Sequence[str]) -> dict[str, int]:
    """Precision -> index of its indicator among the feature ``names``."""
    return {g: list(names).index(f) for g, f in _GROUP_FEATURES.items() if f in names}


def _row_groups(x: np.ndarray, columns: Mapping[str, int]) -> np.ndarray:
    """Each row's precision (``""`` where the features do not say)."""
    groups = np.full(len(x), "", dtype=object)
    for g, col in columns.items():
        groups[x[:, col] == 1.0] = g
    return groups
