"""The step models a time residual is learned over: a whole training step's time from a
few of its features, fitted on measured step times. :class:`_Dispatch` for a GPU (kernel
time against the CPU's issue time), :class:`_CpuSteps` for a CPU (the roofline's parts,
a cost per kernel and per parameter tensor).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from costaware.observation import Observation

#: whole-model timings below which no step model (_Dispatch, _CpuSteps) is fitted: the op
#: sum or the roofline stays the baseline
_MIN_DISPATCH_ROWS = 20


class _StepModel:
    """A whole step's time (milliseconds) from a few of its features: what a model's time
    residual is learned over. Subclasses give the features (:meth:`row`) and the formula
    (:meth:`_ms`)."""

    @classmethod
    def row(cls, feats: Mapping[str, float]) -> list[float] | None:
        raise NotImplementedError

    def _ms(self, rows: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    @classmethod
    def fit(cls, rows: np.ndarray, measured_s: np.ndarray) -> Any:
        raise NotImplementedError

    def seconds(self, feats: Mapping[str, float]) -> float | None:
        """The step time for ``feats``; None when a feature it needs is missing."""
        row = self.row(feats)
        return None if row is None else float(self._ms(np.asarray([row]))[0]) / 1e3

    @classmethod
    def fitted_on(
        cls, obs: Sequence[Observation], keep: Callable[[Observation], bool] = lambda o: True
    ) -> Any:
        """Fitted on the measured step times of the ``keep`` observations that have every
        feature it needs; None below ``_MIN_DISPATCH_ROWS`` of them."""
        timed = [
            (row, o.iteration_time)
            for o in obs
            if (row := cls.row(o.features)) is not None and o.iteration_time and keep(o)
        ]
        if len(timed) < _MIN_DISPATCH_ROWS:
            return None
        return cls.fit(
            np.asarray([row for row, _ in timed], dtype=np.float64),
            np.asarray([secs for _, secs in timed], dtype=np.float64),
        )


@dataclass(frozen=True)
class _Dispatch(_StepModel):
    """A GPU step (milliseconds) from two pipelines: the GPU's kernel time ``gpu * kernel
    time`` and the CPU's issue time ``fwd * kernels_fwd + bwd * kernels_bwd + opt *
    kernels_opt + tensor * param_tensors + view * views + step``. The two combine as
    ``(k^p + i^p)^(1/p)`` with ``p = 1 / softness``: 0 is their maximum, 1 their sum.
    Under autocast (bf16, fp16) the kernel time is multiplied by ``amp_kernel`` and the
    issue time by ``amp_issue``.

    An eager step is the CPU issuing ops (Python, dispatcher and autograd per op) while
    the GPU runs them. A step of many tiny kernels takes about its issue time, one of large
    kernels about its kernel time; adding the two would count small models twice. They do
    not overlap perfectly either: the loss and the optimizer synchronise, and the GPU
    idles where the CPU falls behind for part of a step. Hence a soft maximum, whose
    softness is fitted: it charges most where the two are close.

    The CPU's cost per op differs by phase: a forward op goes through Python and the
    module call, a backward op only through the autograd engine in C++, and an optimizer
    node is a ``_foreach`` op over every parameter, so each phase has its own cost per
    kernel (one cost for all three over-predicts backward-heavy steps such as DenseNet's).
    A view (``view``, ``transpose``, ``split`` and the rest of the ``shape`` op group)
    launches no kernel but costs the CPU a dispatch all the same; a transformer or a
    DenseNet makes hundreds per step. Besides its ops, the CPU pays per parameter tensor:
    autograd's gradient accumulation, ``zero_grad``, each ``_foreach`` op's per-tensor
    work and the module call around most tensors; without that term a ``_foreach`` node
    would cost as much over the 8 tensors of an MLP as over the 160 of a ResNet. Autocast
    dispatches every op through its cast policy and adds casts that the op-level sum
    under-counts, hence its two factors (one set of constants for both would
    under-predict the mixed-precision steps and over-predict the fp32 ones). What each
    part is worth on held-out families is in ``docs/predictions.md``. The constants are
    fitted on whole-model timings (the training rows of ``fit``), minimising the mean
    absolute log error; the kernel time and the three kernel counts are the
    :data:`INPUTS` features of :mod:`costaware.core.optime`, ``param_tensors`` the dry
    run's, per optimizer step as ``kernels_opt`` is, and the views the forward and
    backward ``ops:shape`` count of :mod:`costaware.core.features`, per micro-batch as
    the kernels are.

    A manifest written before the views and the softness were modelled loads with both at
    0: the step is then the plain maximum it was fitted as.
    """

    gpu: float
    fwd_ms: float
    bwd_ms: float
    opt_ms: float
    step_ms: float
    tensor_ms: float
    amp_kernel: float = 1.0
    amp_issue: float = 1.0
    view_ms: float = 0.0
    softness: float = 0.0

    #: the features the step is computed from, in the order of ``_ms``'s columns, then
    #: whether the step runs under autocast (``precision_is_bf16`` or ``_fp16``)
    INPUTS: ClassVar[tuple[str, ...]] = (
        "optime_kernel_ms",
        "kernels_fwd",
        "kernels_bwd",
        "kernels_opt",
        "param_tensors",
        "ops:shape",
    )
    #: the column of the autocast flag in a :meth:`row`
    _AMP = len(INPUTS)

    @classmethod
    def row(cls, feats: Mapping[str, float]) -> list[float] | None:
        """The :data:`INPUTS` of ``feats`` and the autocast flag; None when one is missing
        (or not finite)."""
        row = [feats.get(n, math.nan) for n in cls.INPUTS]
        accumulation = max(feats.get("grad_accumulation", 1.0), 1.0)
        row[4] /= accumulation
        row[5] /= min(accumulation, 2.0)  # a trace holds up to two micro-batches
        amp = max(feats.get("precision_is_bf16", 0.0), feats.get("precision_is_fp16", 0.0))
        row.append(1.0 if amp > 0 else 0.0)
        return row if all(math.isfinite(v) for v in row) else None

    def _ms(self, rows: np.ndarray) -> np.ndarray:
        per = np.asarray([self.fwd_ms, self.bwd_ms, self.opt_ms, self.tensor_ms, self.view_ms])
        amp = rows[:, self._AMP] > 0
        # the counts: every input but the kernel time, up to the autocast flag
        issue = (rows[:, 1 : self._AMP] @ per + self.step_ms) * np.where(amp, self.amp_issue, 1.0)
        kernel = self.gpu * np.maximum(rows[:, 0], 1e-3) * np.where(amp, self.amp_kernel, 1.0)
        top: np.ndarray = np.maximum(kernel, issue)
        if self.softness <= 0.0:
            return top
        p = 1.0 / min(self.softness, 1.0)
        out: np.ndarray = top * ((kernel / top) ** p + (issue / top) ** p) ** (1.0 / p)
        return out

    @classmethod
    def fit(cls, rows: np.ndarray, measured_s: np.ndarray, soft: bool = True) -> _Dispatch:
        """From rows of :meth:`row` and the measured seconds of each; with ``soft=False``
        the two pipelines combine as their plain maximum (``benchmarks/step_model.py``
        scores each form)."""
        measured_ms = measured_s * 1e3
        any_amp = bool((rows[:, cls._AMP] > 0).any())  # else no autocast factor to learn

        def make(x: np.ndarray) -> _Dispatch:
            # clipped: the search strays far along the flat directions of the max
            gpu, fwd, bwd, opt, step, tensor, amp_kernel, amp_issue, view, soft_ = np.exp(
                np.clip(x, -40.0, 40.0)
            ).tolist()
            if not any_amp:
                amp_kernel = amp_issue = 1.0
            softness = min(soft_, 1.0) if soft else 0.0
            return cls(gpu, fwd, bwd, opt, step, tensor, amp_kernel, amp_issue, view, softness)

        def loss(x: np.ndarray) -> float:
            return float(np.mean(np.abs(np.log(make(x)._ms(rows) / measured_ms))))

        starts = [  # a few starts: the objective has flat regions
            np.log([1.0, per_op, per_op, per_op, 0.5, per_op / 4, 1.0, 1.0, per_op / 4, 0.25])
            for per_op in (0.005, 0.015, 0.04)
        ]
        return make(_min_log_error(loss, starts))


def _min_log_error(loss: Callable[[np.ndarray], float], starts: Sequence[np.ndarray]) -> np.ndarray:
    """The log-parameters that minimise ``loss`` (a mean absolute log error), best of a
    Powell search from each of ``starts``."""
    from scipy.optimize import minimize

    best: Any = None
    for x0 in starts:
        r = minimize(loss, x0, method="Powell", options={"maxiter": 40000, "xtol": 1e-5})
        if best is None or r.fun < best.fun:
            best = r
    return np.asarray(best.x)


@dataclass(frozen=True)
class _CpuSteps(_StepModel):
    """A CPU step (milliseconds) as ``compute * roofline compute + memory * roofline
    memory + op_ms * kernels + tensor_ms * param_tensors + step_ms``: the time baseline
    of a model fitted on CPU timings.

    A CPU runs the ops one after another, so the step is a sum, not the GPU's overlap of
    two pipelines (:class:`_Dispatch`). The analytic roofline charges every kernel one
    constant, in which the cost that goes with each layer (its module call, autograd's
    gradient accumulation, the optimizer's work on its tensors) rides on the kernel
    count; timed on their own (``benchmarks/cpu_overheads.py``) an elementwise op and the
    optimizer's work per parameter tensor cost quite different amounts, so a model of
    many tiny ops on few tensors (a GRU unrolled over its time steps) would be charged
    several times what it takes. Hence a cost per kernel and one per parameter tensor.
    The constants are fitted on the training rows' whole-step timings (mean absolute log
    error) from features every dry run has, so a family held out of the fit is predicted
    by constants that never saw it.

    Where the rows carry a CPU's op-level sum (an op model fitted on the CPU's per-op
    timings), the step adds ``op_sum * optime_kernel_ms``: the roofline has one efficiency
    for every FLOP, the op model has what oneDNN makes of each kernel's shape. Its weight
    depends on the steps and their op cases being timed on one host under the same
    settings (``data/README.md``). The fitted constants and what each term is worth on
    held-out families are in ``docs/accuracy.md``.
    """

    compute: float
    memory: float
    op_ms: float
    tensor_ms: float
    step_ms: float
    op_sum: float = 0.0

    #: the features the step is computed from
    INPUTS: ClassVar[tuple[str, ...]] = (
        "analytic_compute_ms",
        "analytic_memory_ms",
        "kernels",
        "param_tensors",
        "optime_kernel_ms",
    )

    @classmethod
    def row(cls, feats: Mapping[str, float]) -> list[float] | None:
        """``[compute ms, memory ms, kernels, param tensors, op sum ms]`` per micro-batch (a
        trace's kernels are those of up to two micro-batches, its tensors are stepped once
        per optimizer step; the op sum is per micro-batch already, 0 without a CPU op
        model); None when a feature is missing or not finite."""
        comp, mem, kernels, tensors, op_sum = (feats.get(n, math.nan) for n in cls.INPUTS)
        accumulation = max(feats.get("grad_accumulation", 1.0), 1.0)
        row = [comp, mem, kernels / min(accumulation, 2.0), tensors / accumulation]
        row.append(op_sum if math.isfinite(op_sum) else 0.0)
        return row if all(math.isfinite(v) for v in row) else None

    def _ms(self, rows: np.ndarray) -> np.ndarray:
        per = np.asarray([self.compute, self.memory, self.op_ms, self.tensor_ms, self.op_sum])
        out: np.ndarray = rows @ per + self.step_ms
        return out

    @classmethod
    def fit(cls, rows: np.ndarray, measured_s: np.ndarray) -> _CpuSteps:
        """From rows of :meth:`row` and the measured seconds of each; the op sum's factor
        only where every row has one (a CPU op model), else it stays 0."""
        measured_ms = measured_s * 1e3
        with_sum = bool((rows[:, 4] > 0).all())

        def make(x: np.ndarray) -> _CpuSteps:
            compute, memory, op_ms, tensor_ms, step_ms, *rest = np.exp(x).tolist()
            return cls(compute, memory, op_ms, tensor_ms, step_ms, rest[0] if with_sum else 0.0)

        def loss(x: np.ndarray) -> float:
            return float(np.mean(np.abs(np.log(make(x)._ms(rows) / measured_ms))))

        extra = [0.5] if with_sum else []
        starts = [np.log([1.0, 1.0, op_ms, 0.1, 0.5, *extra]) for op_ms in (0.002, 0.02)]
        return make(_min_log_error(loss, starts))
