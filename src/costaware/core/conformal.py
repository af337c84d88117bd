"""The upper bounds' calibration: conformal quantiles of log residuals, the shift that
makes a bound an offset, a factor or between, the calibration groups a bound is kept per,
the folds of families of a cross-conformal fit, and the capacity bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

#: the shifts ``_shifted_quantile`` tries, as multiples of the median prediction
_SHIFTS = (0.0, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)


#: calibration rows a bound group needs for a bound of its own (else the pooled one)
_MIN_GROUP_ROWS = 20

#: families a memory line or the trees need for cross-conformal bounds (else one
#: held-out split)
_MIN_CV_FAMILIES = 5

#: folds of families the trees' cross-conformal residuals come from (each fold's trees
#: are fitted without it; the line fits once per family, which costs nothing)
_CV_FOLDS = 5


def _family_folds(families: np.ndarray, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``families`` shuffled and dealt into ``k`` folds (fewer when there are fewer)."""
    shuffled = rng.permutation(families)
    return [shuffled[i::k] for i in range(min(k, len(shuffled)))]


def _bound_group(feats: Mapping[str, float]) -> str:
    """The coarse calibration group of a feature row: models with convolutions ("conv")
    carry cuDNN's workspace choices, the others do not ("other"). See :func:`_bound_keys`
    for the finer groups within each."""
    conv = feats.get("layers_conv", 0.0)
    return "conv" if conv == conv and conv > 0 else "other"


def _bound_keys(feats: Mapping[str, float]) -> tuple[str, str]:
    """The calibration groups of a feature row, finest first: its coarse group
    (:func:`_bound_group`) split by whether the step runs under autocast ("conv+amp",
    "conv+fp32"), then the coarse group. A bound is the finest group's that had the rows
    for one when the model was fitted, else the coarse group's, else the pooled one (not
    the cross-conformal memory line: one bound). Mixed precision is a group of its own
    because its error differs in kind: on a host without bf16 arithmetic autocast runs
    bf16 kernels in emulation, and a bound pooled with the fp32 steps would be too narrow
    for them and too wide for the rest."""
    coarse = _bound_group(feats)
    amp = max(feats.get("precision_is_bf16", 0.0), feats.get("precision_is_fp16", 0.0))
    return f"{coarse}+{'amp' if amp == amp and amp > 0 else 'fp32'}", coarse


def _bound_groups(x: np.ndarray, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``_bound_keys`` of each row of the feature matrix ``x``: (fine, coarse) arrays."""
    names = list(names)

    def col(name: str) -> np.ndarray:
        return np.nan_to_num(x[:, names.index(name)]) if name in names else np.zeros(len(x))

    coarse = np.where(col("layers_conv") > 0, "conv", "other")
    amp = (col("precision_is_bf16") > 0) | (col("precision_is_fp16") > 0)
    fine = np.char.add(coarse.astype(str), np.where(amp, "+amp", "+fp32"))
    return fine, coarse


#: training rows below which the bound is one factor (no shift is chosen)
_MIN_SHIFT_ROWS = 20


def _shifted_quantile(
    calibration: tuple[np.ndarray, np.ndarray],
    training: tuple[np.ndarray, np.ndarray] | None,
    coverage: float,
) -> tuple[float, float, float]:
    """The shift, conformal quantile and coverage level of upper bounds
    ``(predicted + shift) * exp(q) - shift``, from (predicted, measured) rows.

    The shift is chosen on the training rows (their in-sample predictions): among
    multiples of their median prediction, the one whose bounds would be narrowest on
    average (mean log of bound over prediction) at their own ``coverage`` quantile. Only
    the shape of the error (a factor, an offset, or between) is taken from them. The
    quantile is then the split-conformal one of
    ``log((measured + shift) / (predicted + shift))`` over the calibration rows, which
    played no part in the choice, so the bound keeps its coverage. With fewer than
    ``_MIN_SHIFT_ROWS`` training rows the shift is 0 (a factor), and so it is with
    ``training`` None: no rows apart from the calibration ones to choose a shape on.
    """
    shift = 0.0
    if training is not None and len(training[0]) >= _MIN_SHIFT_ROWS:
        predicted, measured = training
        scale = float(np.median(predicted))
        best: tuple[float, float] | None = None
        for k in _SHIFTS:
            c = k * scale
            q, _ = _conformal_quantile(np.log((measured + c) / (predicted + c)), coverage)
            upper = (predicted + c) * math.exp(max(q, 0.0)) - c
            width = float(np.mean(np.log(upper / predicted)))
            if best is None or width < best[0] - 1e-12:
                best = (width, c)
        assert best is not None
        shift = best[1]
    predicted, measured = calibration
    q, level = _conformal_quantile(np.log((measured + shift) / (predicted + shift)), coverage)
    return shift, q, level


def _group_bounds(
    cal_groups: tuple[np.ndarray, np.ndarray],
    train_groups: tuple[np.ndarray, np.ndarray],
    calibration: tuple[np.ndarray, np.ndarray],
    training: tuple[np.ndarray, np.ndarray],
    coverage: float,
) -> dict[str, tuple[float, float, float]]:
    """The ``(shift, q, coverage)`` of the bound of each group (:func:`_bound_groups` of
    the calibration and training rows: the fine groups, then the coarse ones) with at
    least ``_MIN_GROUP_ROWS`` calibration rows, from (predicted, measured) rows as
    :func:`_shifted_quantile` takes them."""
    by_group: dict[str, tuple[float, float, float]] = {}
    for in_cal, in_train in zip(cal_groups, train_groups):
        by_group |= {
            g: _shifted_quantile(
                (calibration[0][in_cal == g], calibration[1][in_cal == g]),
                (training[0][in_train == g], training[1][in_train == g]),
                coverage,
            )
            for g in np.unique(in_cal).tolist()
            if np.sum(in_cal == g) >= _MIN_GROUP_ROWS
        }
    return by_group


#: leave-one-out residuals a small-sample refit needs before it calibrates its own bound;
#: with fewer, it moves its base model's bound by the same correction as the point
_MIN_BOUND_ROWS = 8


def _conformal_quantile(residuals: np.ndarray, coverage: float) -> tuple[float, float]:
    """Split-conformal quantile and the coverage it guarantees.

    The ceil((n+1)·coverage)-th smallest residual covers a new exchangeable row with
    probability >= coverage. With too few rows for that (n < coverage / (1 - coverage)),
    the distribution-free guarantee is only n / (n + 1), and that lower level is
    returned, not the nominal one. The quantile is then the larger of the largest
    residual and the one-sided Student-t prediction bound ``mean + t(coverage, n - 1) *
    sd * sqrt(1 + 1/n)``: the largest of a handful of residuals sits about one standard
    deviation above their mean, so on its own it would cover far less than
    ``coverage`` (``docs/predictions.md`` on the refit's bounds).
    """
    n = len(residuals)
    if n == 0:
        return float("nan"), 0.0
    k = math.ceil((n + 1) * coverage)
    if k > n:
        q = float(np.max(residuals))
        if n >= 2:
            from scipy import stats

            s = float(np.std(residuals, ddof=1))
            t = float(stats.t.ppf(coverage, n - 1))
            q = max(q, float(np.mean(residuals)) + t * s * math.sqrt(1 + 1 / n))
        return q, n / (n + 1)
    return float(np.sort(residuals)[k - 1]), coverage


#: the capacity bound's coverage. Higher than the other bounds': the capacity decides
#: whether a trial runs out of memory, which costs the trial, where a bound that is too
#: wide costs one configuration of a search that has many
CAPACITY_COVERAGE = 0.99
#: the capacity bound's shift (bytes): the measured allocated peak lies within a few
#: hundred MiB of the simulated one whatever the model's size (workspaces and library
#: buffers the dry run does not see), and within a few percent of it for large models; a
#: bound ``(point + shift) * exp(q) - shift`` is an offset on small models and a factor on
#: models of several GiB, which are the ones near a card's capacity. A larger shift
#: narrows the bound at a card's scale, but then covers the large models less: 2 GiB was
#: the largest of 1, 2, 4, 8, 16 and 32 GiB under which the 99% bound fitted on the GPU
#: corpus covered every one of its 100 rows above 4 GiB (4 GiB left 2 uncovered). On the
#: 961 rows the shipped model's bound is fitted on (the small models included) it leaves
#: 1 of the 91 rows above 4 GiB uncovered, by 0.7% (10.4 GiB measured, 10.1 predicted),
#: as a 99% bound may; 1 GiB covers all 91 but widens the bound at 8-40 GiB from
#: 1.021-1.025x the point to 1.030-1.033x, which rejects more of the runs that fit at a
#: card's edge (``docs/accuracy.md``, the OOM-boundary section)
CAPACITY_SHIFT = 2 * 2**30


def capacity_quantile(
    rows: Sequence[tuple[float, float]],
    *,
    coverage: float = CAPACITY_COVERAGE,
    shift: float = CAPACITY_SHIFT,
) -> tuple[float, float] | None:
    """The quantile ``q`` of the capacity bound ``(point + shift) * exp(q) - shift``, and
    the coverage it achieves, from ``(predicted, measured)`` allocated peaks (bytes).

    A step's smallest capacity lies a little above its allocated peak (what the
    allocator's cached, unused blocks cannot give back): the capacity is simulated, and
    its error is the allocated peak's, which a measurement records. So the bound is
    calibrated on the spread of measured allocated peaks around predicted ones. The
    simulation learns nothing from the rows, so every row's residual is out of sample.
    None with fewer than two rows.
    """
    pairs = [(p, m) for p, m in rows if p > 0 and m > 0]
    if len(pairs) < 2:
        return None
    predicted = np.asarray([p for p, _ in pairs], dtype=np.float64)
    measured = np.asarray([m for _, m in pairs], dtype=np.float64)
    return _conformal_quantile(np.log((measured + shift) / (predicted + shift)), coverage)
