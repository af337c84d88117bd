"""What a fit of a :class:`~costaware.core.model.CostModel` learns of each figure.

A fit learns two targets the same way, the reserved peak (``CostModel.memory_``) and the
iteration time (``CostModel.time_``): a residual model over the baseline and the
conformal upper bound around its corrections, one :class:`TargetFit` each. The smallest
capacity's bound (``CostModel.capacity_``) is a :class:`CapacityFit`. Both are frozen: a
model and the copies :meth:`CostModel.default <costaware.CostModel.default>` hands out
share them, and none of them writes to one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CapacityFit", "TargetFit"]


@dataclass(frozen=True)
class TargetFit:
    """The residual model of one target and its calibrated upper bound.

    The bound over a corrected point is ``(point + shift) * exp(q) - shift``: ``q`` is
    the conformal quantile of the log residuals of shifted values,
    ``log((measured + shift) / (predicted + shift))``, at the achieved ``coverage``.

    Attributes:
        model: the log correction over the baseline: CatBoost trees, a line over the
            baseline (``_Affine``), a factor per precision (``_PrecisionLine``) or a
            constant (``_Constant``), all of :mod:`costaware.core.residuals`.
        q: the bound's conformal quantile; NaN where the bound is the base's
            (``from_base``).
        coverage: the coverage the bound achieves: the nominal one with enough
            calibration rows, lower with few.
        shift: the shift of the bound's log residuals (0: the bound is a factor).
        bounds: the bounds of the groups calibrated on their own (conv nets or not, and
            within each, under autocast or not: ``_bound_keys``), each ``(shift, q,
            coverage)``; empty where one bound serves every row.
        from_base: the bound is the base model's, moved by the same correction as the
            point: a refit on too few measurements to calibrate one of its own.
        cal_rows: the rows the bound was calibrated on (0 in a model read from disk,
            whose ``training_["calibration"]`` records them).
    """

    model: Any
    q: float
    coverage: float
    shift: float = 0.0
    bounds: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)
    from_base: bool = False
    cal_rows: int = 0


@dataclass(frozen=True)
class CapacityFit:
    """The smallest capacity's upper bound, from the measured allocated peaks
    (:func:`~costaware.core.conformal.capacity_quantile`): ``(point + shift) * exp(q) -
    shift``, at ``coverage``, calibrated on ``rows`` measurements."""

    q: float
    shift: float
    coverage: float
    rows: int
