"""The cost model: analytic estimates corrected by CatBoost, with calibrated upper bounds.

:class:`CostModel` follows scikit-learn's estimator contract: ``__init__`` only stores
parameters, :meth:`CostModel.fit` validates and returns ``self``, learned state ends in
``_``, and a learned component used before ``fit`` raises :class:`NotFittedError`. An
unfitted model still predicts: it returns the analytic estimate and says so.

For each device kind, the model learns the *residual* over a baseline:
``log(actual / simulated reserved peak)`` for memory (a Theil-Sen line over the simulated
peak, or CatBoost trees on every feature: ``memory_model``) and ``log(actual / step
model)`` for time (CatBoost trees on the NSM, graph2vec, hyperparameter, analytic and
device features). The time baseline is itself fitted on the training timings: the op-level
sum against the CPU's issue time on a GPU (:class:`_Dispatch`), the roofline's parts with a
cost per kernel and per parameter tensor on a CPU (:class:`_CpuSteps`). Residual learning
is what carries over to architectures the model has never seen. With few measurements (a
refit on the user's trials) a line per target replaces the trees.

The upper bounds are conformal: their residuals come from measurements held out of the fit
that predicted them (cross-conformal by family where there are enough families, else one
held-out split; leave-one-out for a small sample). The coverage they target holds for
measurements like the training data's; an architecture unlike any of them may fall outside
more often.

Models are saved as CatBoost ``.cbm`` files plus a JSON manifest. Nothing is pickled.

The estimator's parts live beside it: :mod:`~costaware.core.prediction` (what a
prediction says), :mod:`~costaware.core.step_models` (the time baselines),
:mod:`~costaware.core.residuals` (the small-sample lines), :mod:`~costaware.core.conformal`
(the bounds' calibration), :mod:`~costaware.core.learned` (what a fit learns of each
target), :mod:`~costaware.core.persistence` (saving and loading) and
:mod:`~costaware.core.trace_cache` (the traces kept per architecture). This module
re-exports the names that moved there.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as _dt
import hashlib
import inspect
import json
import math
import os
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, cast

import numpy as np
import torch
from torch import nn

from costaware._format import fmt_seconds
from costaware.core import analytic as _analytic
from costaware.core.conformal import (
    _CV_FOLDS,
    _MIN_BOUND_ROWS,
    _MIN_CV_FAMILIES,
    _bound_group,
    _bound_groups,
    _bound_keys,
    _conformal_quantile,
    _family_folds,
    _group_bounds,
    _shifted_quantile,
)
from costaware.core.conformal import CAPACITY_COVERAGE as CAPACITY_COVERAGE
from costaware.core.conformal import CAPACITY_SHIFT as CAPACITY_SHIFT
from costaware.core.conformal import capacity_quantile as capacity_quantile
from costaware.core.features import (
    device_features,
    hyperparameter_features,
    nsm_features,
    trace_features,
)
from costaware.core.learned import CapacityFit, TargetFit
from costaware.core.optime import OpTimeModel, node_table
from costaware.core.persistence import FORMAT_VERSION as FORMAT_VERSION
from costaware.core.persistence import MANIFEST as MANIFEST
from costaware.core.persistence import read_model, save_model
from costaware.core.prediction import Prediction as Prediction
from costaware.core.prediction import (
    PredictionBasis,
    PredictionKind,
    SpecSummary,
    TraceSource,
    within_max_time,
)
from costaware.core.residuals import _MIN_SLOPE_ROWS as _MIN_SLOPE_ROWS
from costaware.core.residuals import (
    _Affine,
    _Constant,
    _fit_affine,
    _group_columns,
    _PrecisionLine,
    _row_groups,
    _small_sample_affine,
    _small_sample_line,
    _spans,
)
from costaware.core.step_models import _CpuSteps, _Dispatch
from costaware.core.trace import (
    COMPILED_NOTE,
    Trace,
    _call_with_timeout,
    cpu_conditions,
    dry_run,
    rescale,
)
from costaware.core.trace_cache import _arch_key, _ArchEntry, _TraceCache
from costaware.devices import Device, device_kind, get_device, is_auto, precision_notes
from costaware.errors import (
    CostawareError,
    CostAwareWarning,
    FitCancelled,
    NotEnoughObservations,
    NotFittedError,
    TraceError,
    first_line,
)
from costaware.observation import Observation as Observation
from costaware.spec import TrainingSpec

__all__ = ["CostModel", "Observation", "Prediction", "benchmark_search_peak", "features_for"]

MiB = 2**20
#: the value of a learned mapping (per-kind models, op models) where nothing was learned
_NOTHING: Mapping[str, Any] = MappingProxyType({})
#: below this many measurements of a target, fit learns a line, not trees: trees on a
#: handful of trials fit their noise, and their few calibration rows give bounds no wider
#: than the point (``docs/predictions.md`` compares the two on the HPO benchmark's studies)
SMALL_SAMPLE = 30
#: how much wider the time's upper bound is, in log terms, on a device the model has no
#: rows of: ``upper = point * (upper / point) ** UNSEEN_DEVICE_WIDENING``. The ratio of
#: the 95% quantile of the iteration time's absolute log error with the device and the
#: family unseen to the one with the family alone unseen, over the GPU rows, rounded up to
#: 0.05 (``benchmarks/unseen_device_bound.py``; figures in docs/compare.md)
UNSEEN_DEVICE_WIDENING = 1.55

#: the features that say which configuration a step is (:func:`repeat_key`): what the
#: model, batch, optimizer, precision and device are, from the dry run's structure and the
#: spec. Not the learning rate or the epochs, which do not change a step's cost, and not
#: the simulated allocator's or the bytes' figures, which a trace rescaled from another
#: batch size gets a little off where a dry run at this size gets them exactly
_REPEAT_PREFIXES = ("nsm", "ops:", "layers_", "batch_", "optimizer_is_", "precision_is_", "device_")
_REPEAT_NAMES = frozenset(
    {
        "params_m",
        "param_tensors",
        "graph_nodes",
        "kernels",
        "gflops",
        "gflops_forward",
        "grad_accumulation",
        "optimizer_states",
        "cudnn_benchmark",
        "expandable_segments",
        "calls_cublas",
    }
)


def _pure_note(spec: TrainingSpec, learned: bool) -> str:
    """The note of a prediction in a pure precision: what was traced in it, and that no
    learned correction was calibrated on such steps."""
    dtype = str(spec.param_dtype).removeprefix("torch.").replace("bfloat16", "bf16")
    dtype = dtype.replace("float16", "fp16").replace("float64", "fp64")
    note = (
        f"pure {dtype} ({spec.precision}): parameters, gradients, optimizer state and the "
        f"batch's floating-point inputs traced in {dtype}"
    )
    if not learned:
        return note
    return (
        f"{note}. The learned model was trained on no pure-precision step: its correction "
        "here is the one it learned for fp32 steps (no autocast), and the time rests on the "
        f"analytic roofline at {dtype}'s peak and those fp32 rows, not calibrated for pure "
        f"{dtype}"
    )


def _attention_mode(device: Device) -> str:
    """The dry run's SDPA mode for a target device: fused kernels on CUDA, native on CPU."""
    return "fused" if device.kind == "cuda" else "native"


def features_for(
    trace: Trace,
    spec: TrainingSpec,
    device: Device,
    est: _analytic.AnalyticEstimate,
    graph_feats: Mapping[str, float],
    op_model: OpTimeModel | None = None,
) -> dict[str, float]:
    """The full feature dict for one (trace, spec, device), as the learned model sees it.

    With ``op_model`` (:class:`~costaware.core.optime.OpTimeModel`), the op-level time sums
    (``optime_*``) are added: learned per-kernel times summed over the trace. They are
    NaN for a device of another kind than the op model's and absent without an op model.
    """
    feats: dict[str, float] = {}
    feats.update(hyperparameter_features(spec))
    feats.update(trace_features(trace))
    feats.update(device_features(device))
    feats.update(graph_feats)
    feats.update(
        {
            "analytic_reserved_mib": est.reserved / MiB,
            "analytic_allocated_mib": est.allocated / MiB,
            "analytic_reserved_over_live": est.reserved / max(est.live_peak, 1),
            "analytic_segments": float(est.allocator_segments),
            "analytic_time_ms": est.iteration_time * 1e3,
            "analytic_compute_ms": est.compute_time * 1e3,
            "analytic_memory_ms": est.memory_time * 1e3,
            "log_analytic_reserved": math.log(max(est.reserved, 1)),
            "log_analytic_time": math.log(max(est.iteration_time, 1e-9)),
            "memory_over_capacity": est.reserved / device.memory_bytes,
        }
    )
    if op_model is not None:
        feats.update(
            op_model.step_features(
                node_table(trace), device, spec.grad_accumulation, est.iteration_time
            )
        )
    return feats


def benchmark_search_peak(feats: Mapping[str, float]) -> bool:
    """Whether a measured peak of this feature row holds cuDNN's benchmark-mode search: a
    conv net on a GPU with ``cudnn_benchmark`` on. The search's workspace is sized to the
    free memory (see :mod:`costaware.core.analytic`), so that peak measures the card, not what
    the step needs: it is not a memory target (times still are)."""
    bench = feats.get("cudnn_benchmark", 0.0)
    gpu = feats.get("device_is_cpu", 0.0) != 1.0
    return gpu and bench == bench and bench > 0 and _bound_group(feats) == "conv"


def repeat_key(feats: Mapping[str, float], device: str) -> str:
    """What identifies a configuration on a device for :meth:`CostModel.measured_time`:
    the features that describe it (:data:`_REPEAT_NAMES`, :data:`_REPEAT_PREFIXES`: its
    layers, operators and their pairs, parameters, FLOPs, batch, optimizer, precision, to
    6 significant digits) and the device. Two models that differ only where none of these
    do (an activation function swapped for another) count as one."""
    items = sorted(
        (k, "nan" if v != v else f"{float(v):.6g}")
        for k, v in feats.items()
        if k in _REPEAT_NAMES or k.startswith(_REPEAT_PREFIXES)
    )
    return hashlib.sha1(json.dumps([device, items]).encode()).hexdigest()[:20]


def _measured_times(obs: Sequence[Observation]) -> dict[str, tuple[float, int]]:
    """Per :func:`repeat_key`, the median measured iteration time and how many trials."""
    times: dict[str, list[float]] = {}
    for o in obs:
        if o.iteration_time is not None and o.iteration_time > 0 and o.status in ("ok", None):
            times.setdefault(repeat_key(o.features, o.device), []).append(float(o.iteration_time))
    return {k: (float(np.median(v)), len(v)) for k, v in times.items()}


def _step_gap(obs: Sequence[Observation]) -> float | None:
    """The median time between steps (an epoch's time over its steps, less the median
    step: data loading and the training loop's hooks) of the observations that measured
    both, in seconds; None where none did."""
    gaps = [
        float(g)
        for o in obs
        if o.status in ("ok", None) and isinstance(g := o.meta.get("step_gap"), int | float)
    ]
    return float(np.median(gaps)) if gaps else None


def _checked_observations(
    observations: Iterable[Observation | Mapping[str, Any]],
) -> list[Observation]:
    """The observations a fit learns from, as :class:`Observation` s; raises
    ``ValueError`` for none, or for one without the analytic features every baseline
    rests on."""
    obs = [o if isinstance(o, Observation) else Observation.from_dict(o) for o in observations]
    if not obs:
        raise ValueError("fit needs at least one observation, but got none.")
    for o in obs:
        for name in ("analytic_reserved_mib", "analytic_time_ms"):
            if name not in o.features:
                raise ValueError(
                    f"observation features lack {name!r}; build them with CostModel.features(spec, device)."
                )
    return obs


def _usable_base(base: CostModel | None, obs: Sequence[Observation]) -> CostModel | None:
    """The model a refit's residuals are learned over: ``base`` where it is fitted on the
    observations' device kind, else None (the analytic estimate). An unfitted base is
    the analytic estimate already; a base fitted on another kind (a GPU model under CPU
    trials) would apply its corrections where they mean nothing."""
    if base is None or not base.is_fitted:
        return None
    seen = {device_kind(d) for d in base.training_.get("devices", [])}
    if not {device_kind(o.device) for o in obs} <= seen:
        return None
    return base


@dataclass
class _FitRows:
    """The observations of one fit as arrays, one row each (:meth:`CostModel._fit_rows`)."""

    obs: list[Observation]
    names: list[str]  # the feature columns
    x: np.ndarray  # the features (NaN where a row lacks one)
    groups: np.ndarray  # each row's family, or a name of its own
    is_cal: np.ndarray  # in the families held out for a split calibration
    kinds: np.ndarray  # each row's device kind
    baselines: np.ndarray  # each row's (memory, time) baseline
    rng: np.random.Generator  # the calibration's draws, taken in order by the targets

    def residuals(self, which: str) -> np.ndarray:
        """Each row's ``log(measured / baseline)`` of ``which``, NaN where it is no target:
        no measurement, a peak of a failed step, or cuDNN's benchmark search's peak
        (:func:`benchmark_search_peak`)."""
        out = []
        for (mem, secs), o in zip(self.baselines, self.obs):
            if which == "memory":
                measured = (
                    o.peak_memory is not None
                    and o.peak_memory > 0
                    and o.status in ("ok", None)
                    and not benchmark_search_peak(o.features)
                )
                out.append(math.log(o.peak_memory / mem) if measured else np.nan)
            elif o.iteration_time is not None and o.iteration_time > 0:
                out.append(math.log(o.iteration_time / secs))
            else:
                out.append(np.nan)
        return np.asarray(out)


class _Residual(NamedTuple):
    """A target's residual model and the predictions its bound is calibrated on
    (:meth:`CostModel._fit_residual`)."""

    model: Any
    cal: np.ndarray  # the rows that calibrate the bound
    train: np.ndarray  # the rows the bound's shift is chosen on
    cal_pred: np.ndarray  # the calibrating rows' predicted log corrections (held out)
    train_pred: np.ndarray  # the training rows' predicted log corrections
    pooled: bool  # one bound for every row, not one per bound group


_STOP_FITS: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "costaware_stop_fits", default=None
)


@contextlib.contextmanager
def stop_fits_when(event: threading.Event) -> Iterator[None]:
    """Within this block (in this thread), :meth:`CostModel.fit` raises
    :class:`~costaware.errors.FitCancelled` once ``event`` is set, within one tree of
    CatBoost's: how the online refit stops when the process exits, instead of holding the
    exit (or being torn down under CatBoost's threads)."""
    token = _STOP_FITS.set(event)
    try:
        yield
    finally:
        _STOP_FITS.reset(token)


def _check_stop(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise FitCancelled("the fit was stopped: the process is exiting")


class _StopWhenSet:
    """A CatBoost callback: go on growing trees while ``event`` is not set."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def after_iteration(self, info: Any) -> bool:
        return not self.event.is_set()


def _check_params(**params: Any) -> None:
    """Raise ``ValueError`` naming the first of :class:`CostModel`'s parameters that is out
    of its range, with what it accepts and what it got."""

    def whole(name: str, low: int) -> None:
        v = params[name]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
            raise ValueError(f"{name} must be a whole number of at least {low}, but got {v!r}.")

    def number(name: str, low: float, high: float = math.inf) -> None:
        v = params[name]
        ok = isinstance(v, (int, float, np.number)) and not isinstance(v, bool)
        if not ok or not low < float(v) <= high or (high < math.inf and float(v) == high):
            span = f"between {low:g} and {high:g}" if high < math.inf else f"above {low:g}"
            raise ValueError(f"{name} must be a number {span}, but got {v!r}.")

    def one_of(name: str, allowed: tuple[str, ...]) -> None:
        if params[name] not in allowed:
            words = " or ".join(repr(a) for a in allowed)
            raise ValueError(f"{name} must be {words}, but got {name}={params[name]!r}.")

    whole("iterations", 1)
    whole("depth", 1)
    number("learning_rate", 0.0)
    number("coverage", 0.0, 1.0)
    number("calibration_fraction", 0.0, 1.0)
    whole("random_state", 0)
    v = params["thread_count"]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not (v == -1 or v >= 1):
        raise ValueError(f"thread_count must be -1 (every core) or at least 1, but got {v!r}.")
    number("trace_timeout", 0.0)
    whole("cache_size", 0)
    one_of("time_baseline", CostModel.TIME_BASELINES)
    one_of("memory_model", CostModel.MEMORY_MODELS)
    one_of("calibration", CostModel.CALIBRATIONS)


class CostModel:
    """Predicts peak memory and iteration/epoch time of a :class:`TrainingSpec`.

    Example:
        >>> import costaware as ca
        >>> from costaware import zoo
        >>> model = ca.CostModel.default()
        >>> spec = ca.TrainingSpec(model=lambda: zoo.mlp(784, (256,), 10),
        ...                        batch=ca.ImageBatch((784,), classes=10), batch_size=64)
        >>> pred = model.predict(spec, device="H100")
        >>> pred.peak_memory <= pred.peak_memory_upper
        True

    Args:
        iterations, depth, learning_rate: CatBoost settings of both regressors.
        coverage: nominal coverage of the upper bounds (conformal).
        calibration_fraction: share of rows (of families, when known) held out to calibrate
            where a bound is split-conformal.
        random_state: seed of CatBoost and of the calibration split.
        thread_count: CatBoost threads.
        trace_timeout: seconds allowed for one dry run.
        cache_size: architectures whose traces are kept for warm predictions.
        time_baseline: what the time residual is learned over: "optime" (a step model
            fitted on the training timings: on a GPU the op-level sum of
            :mod:`costaware.core.optime` through :class:`_Dispatch`, on a CPU the roofline's
            parts and op counts through :class:`_CpuSteps`; the roofline where neither
            applies) or "roofline" (always the roofline). ``docs/accuracy.md`` compares
            the two on held-out families (``benchmarks/accuracy.py --time-baseline``).
        memory_model: how the memory residual is learned, for each device kind: "line"
            (measured = offset + factor x the simulated peak, Theil-Sen, with a
            cross-conformal bound by family) or "trees" (CatBoost on every feature). The
            allocator simulation already carries what transfers between architectures; a
            line keeps to it and extrapolates to models larger than the training data's,
            where trees stay within the range they saw. ``docs/accuracy.md`` compares
            them (``benchmarks/accuracy.py --memory-model``).
        calibration: how the trees' upper bounds are calibrated: "cross" (cross-conformal
            by family: residuals from trees fitted without the row's fold of families,
            ``_CV_FOLDS`` folds, and the trees fitted on every row; needs
            ``_MIN_CV_FAMILIES`` families, else a split) or "split" (one held-out split of
            ``calibration_fraction`` of the families, kept out of the trees). "cross" fits
            the trees ``_CV_FOLDS`` + 1 times.

    Attributes:
        memory_: what the fit learned of the reserved peak, a
            :class:`~costaware.core.learned.TargetFit` (its correction and bound), or None.
        time_: what the fit learned of the iteration time, likewise, or None.
        capacity_: the smallest capacity's bound, a
            :class:`~costaware.core.learned.CapacityFit`, or None where the fit had no
            measured allocated peaks.
        base_: the model a refit corrects; None: the analytic estimate.
        kinds_: one model per device kind ("cuda", "cpu") of a fit on several; else empty.
        dispatch_: the GPU step model the time residual is learned over, or None.
        cpu_steps_: the CPU step model the time residual is learned over, or None.
        time_measured_: a refit's median measured iteration time and trials per
            configuration (:func:`repeat_key`), or None.
        step_gap_: a refit's median time between steps (:func:`_step_gap`), added to each
            step it predicts, or None.
        feature_names_: the feature columns the fit learned on (set by every fit).
        training_: what the fit was fitted on: rows, devices, families, calibration rows
            (set by every fit).
        op_models_: the op-level time models per device kind (:meth:`add_op_model`), which
            fit keeps.
        graph2vec_: the graph embedding whose features the model sees (a refit takes its
            base's), which fit keeps; or None.
    """

    # Learned state (the Attributes above): what fit (or load) sets, each name ending in
    # "_", declared here with the value it holds where nothing of it was learned (no time
    # rows, no allocated peaks, one device kind, ...). Every fit starts from these values
    # (_forget), so a second fit keeps nothing of the first; feature_names_ and training_
    # are set by every fit and absent before one.
    feature_names_: list[str]
    training_: dict[str, Any]
    base_: CostModel | None = None
    kinds_: Mapping[str, CostModel] = _NOTHING
    dispatch_: _Dispatch | None = None
    cpu_steps_: _CpuSteps | None = None
    memory_: TargetFit | None = None
    time_: TargetFit | None = None
    capacity_: CapacityFit | None = None
    time_measured_: dict[str, tuple[float, int]] | None = None
    step_gap_: float | None = None
    # parts added to the model rather than learned by fit, which fit keeps
    graph2vec_: Any = None
    op_models_: Mapping[str, OpTimeModel] = _NOTHING
    # the traces kept per architecture (made on first use; a copy starts without)
    _trace_cache: _TraceCache | None = None

    #: every attribute a fit learns; each fit starts without any of them
    _LEARNED: ClassVar[tuple[str, ...]] = (
        "feature_names_",
        "training_",
        "base_",
        "kinds_",
        "dispatch_",
        "cpu_steps_",
        "memory_",
        "time_",
        "capacity_",
        "time_measured_",
        "step_gap_",
    )
    TIME_BASELINES: ClassVar[tuple[str, ...]] = ("optime", "roofline")
    MEMORY_MODELS: ClassVar[tuple[str, ...]] = ("line", "trees")
    CALIBRATIONS: ClassVar[tuple[str, ...]] = ("cross", "split")

    def __init__(
        self,
        *,
        iterations: int = 800,
        depth: int = 6,
        learning_rate: float = 0.05,
        coverage: float = 0.95,
        calibration_fraction: float = 0.2,
        random_state: int = 0,
        thread_count: int = 2,
        trace_timeout: float = 60.0,
        cache_size: int = 64,
        time_baseline: str = "optime",
        memory_model: str = "line",
        calibration: str = "cross",
    ) -> None:
        _check_params(
            iterations=iterations,
            depth=depth,
            learning_rate=learning_rate,
            coverage=coverage,
            calibration_fraction=calibration_fraction,
            random_state=random_state,
            thread_count=thread_count,
            trace_timeout=trace_timeout,
            cache_size=cache_size,
            time_baseline=time_baseline,
            memory_model=memory_model,
            calibration=calibration,
        )
        self.iterations = iterations
        self.depth = depth
        self.learning_rate = learning_rate
        self.coverage = coverage
        self.calibration_fraction = calibration_fraction
        self.random_state = random_state
        self.thread_count = thread_count
        self.trace_timeout = trace_timeout
        self.cache_size = cache_size
        self.time_baseline = time_baseline
        self.memory_model = memory_model
        self.calibration = calibration

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def default(cls, *, trace_timeout: float | None = None) -> CostModel:
        """The shipped model: learned when the package carries one, else analytic.

        ``trace_timeout``: seconds one dry run may take in this model (default: the
        shipped model's, 60 s), for models whose first dry run takes longer.

        The package's files are read and verified once per process, by the first call
        (others wait for it); each call returns a new :class:`CostModel` that shares the
        loaded regressors, read-only, with every other call's. So a study that builds a
        gate, a callback or a refit per trial holds one copy of the shipped model, and
        fitting or extending the returned model changes no other caller's.

        Raises:
            CostawareError: the shipped files are damaged (a file does not match the
                checksum its manifest records, or the manifest is malformed), naming the
                file. The failure is remembered for the process: every call raises it
                again without reading the files, and the integrations admit their trials
                with a warning that gives this reason.
        """
        shipped = _shipped_model()
        model = cls() if shipped is None else shipped._shared(cls)
        if trace_timeout is not None:
            _check_params(**{**model.get_params(), "trace_timeout": trace_timeout})
            model.trace_timeout = trace_timeout
        return model

    # -- state helpers --------------------------------------------------------------------
    @property
    def is_fitted(self) -> bool:
        """Whether a fit (or load) learned a correction of either target, here or per kind."""
        return self.memory_ is not None or self.time_ is not None or bool(self.kinds_)

    def _target(self, which: str) -> TargetFit | None:
        """What this model learned of ``which`` ("memory" or "time"), or None."""
        return self.memory_ if which == "memory" else self.time_

    def __getstate__(self) -> dict[str, Any]:
        # the trace cache holds a lock: a pickled (or copied) model starts with a fresh one
        state = self.__dict__.copy()
        state.pop("_trace_cache", None)
        return state

    def _shared(self, cls: type[CostModel]) -> CostModel:
        """A new model of class ``cls`` over this one's fitted parts (regressors, op
        models, per-kind models, shared as they are, never written to by ``predict``),
        with its own trace cache and its own dicts of per-kind and op models, so that
        ``fit`` or ``add_op_model`` on it leaves this one as it was."""
        new = cls.__new__(cls)
        new.__dict__.update(self.__getstate__())
        for name in ("kinds_", "op_models_"):
            if name in new.__dict__:
                new.__dict__[name] = dict(new.__dict__[name])
        return new

    def _forget(self) -> None:
        """Drop everything an earlier fit learned (:attr:`_LEARNED`): each attribute
        holds its declared nothing-learned value again."""
        for name in self._LEARNED:
            vars(self).pop(name, None)

    def _cache(self) -> _TraceCache:
        if self._trace_cache is None:
            self._trace_cache = _TraceCache(self.cache_size)
        return self._trace_cache

    # -- features -------------------------------------------------------------------------
    def trace(
        self, spec: TrainingSpec, *, exact: bool = False, attention: str = "native"
    ) -> tuple[Trace, dict[str, float], TraceSource]:
        """The spec's trace (cached per architecture), its graph features, and its source.

        The first two batch sizes of an architecture are traced; every other batch size is
        interpolated from those two traces, storage by storage (exact for every size that
        is affine in the batch size, which is all of them in the models we know). One
        trace alone cannot tell a storage that grows with the batch from one that does not
        (under autocast, the half-precision weight gradients of the backward look like
        activation gradients), so a second batch size is always traced; where that dry run
        fails, the one trace is rescaled and the note says so. ``exact=True`` always traces.
        ``attention`` is the dry run's SDPA mode (:func:`~costaware.core.trace.dry_run`):
        "fused" for a CUDA target, "native" for a CPU; the cache keeps them apart.
        A factory without a fingerprint is built to key the cache: that build and the dry
        run share one time limit, ``trace_timeout``.
        """
        if not isinstance(spec.model, nn.Module) and spec.architecture_key() is None:
            # its fingerprint builds the model (the user's code): under the dry run's limit
            return _call_with_timeout(
                lambda: self._trace_cached(spec, exact, attention), self.trace_timeout
            )
        return self._trace_cached(spec, exact, attention)

    def _trace_cached(
        self, spec: TrainingSpec, exact: bool, attention: str
    ) -> tuple[Trace, dict[str, float], TraceSource]:
        cache = self._cache()
        key = self._cache_key(spec, attention)
        entry = cache.get(key)
        if entry is not None:
            for t in entry.traces:
                if t.batch_size == spec.batch_size:
                    return t, entry.graph_feats, "cached"
            if not exact and len(entry.traces) > 1:
                src: TraceSource = "rescaled (two traces)"
                return (
                    rescale(entry.traces[0], spec.batch_size, entry.traces[1]),
                    entry.graph_feats,
                    src,
                )
            if not exact and not entry.second_tried:  # the architecture's second batch size
                entry.second_tried = True
                try:
                    t = dry_run(spec, timeout=self.trace_timeout, attention=attention)
                except TraceError as e:
                    entry.second_why = f"a second batch size could not be dry-run: {e}"
                else:
                    return self._cached_trace(key, entry, t)
            if not exact:
                r = rescale(entry.traces[0], spec.batch_size)
                why = entry.second_why or "a second batch size runs other ops"
                note = (
                    "rescaled from one trace, with the storages that grow with the batch told "
                    f"apart by kind only ({why})"
                )
                return replace(r, notes=[*r.notes, note]), entry.graph_feats, "rescaled (one trace)"
        t = dry_run(spec, timeout=self.trace_timeout, attention=attention)
        traced = self._cached_trace(key, entry, t)
        if entry is None and spec.architecture_key() is not None:
            # a settings object the model's construction changed (a Hugging Face config
            # settles its attention implementation there) has another key from now on
            after = self._cache_key(spec, attention)
            if after != key and (kept := cache.get(key)) is not None:
                cache.put(after, kept)
        return traced

    @staticmethod
    def _cache_key(spec: TrainingSpec, attention: str) -> str:
        key = _arch_key(spec) + f"|attention={attention}"
        if attention == "native":  # a CPU target: its dry run depends on the CPU too
            key += "|" + cpu_conditions()
        return key

    def _cached_trace(
        self, key: str, entry: _ArchEntry | None, t: Trace
    ) -> tuple[Trace, dict[str, float], TraceSource]:
        """Keep the fresh trace ``t`` under ``key`` (the first or second of its
        architecture); its graph features and source ("traced")."""
        cache = self._cache()
        if entry is None:
            entry = _ArchEntry(traces=[t], graph_feats=self._graph_features(t))
        elif t.op_signature != entry.traces[0].op_signature:
            # this batch size runs another op sequence: its own graph, and not cached as
            # the architecture's (a rescale from it would mix the two)
            return t, self._graph_features(t), "traced"
        elif len(entry.traces) < 2:
            entry.traces.append(t)
        cache.put(key, entry)
        return t, entry.graph_feats, "traced"

    def _graph_features(self, t: Trace) -> dict[str, float]:
        graph_feats = nsm_features(t)
        g2v = self.graph2vec_
        if g2v is not None:
            vec = g2v.transform([t.graph])[0]
            graph_feats.update({f"g2v_{i}": float(v) for i, v in enumerate(vec)})
            graph_feats["g2v_oov"] = float(g2v.oov_fraction(t.graph))
        return graph_feats

    def features(
        self, spec: TrainingSpec, device: str | Device = "auto", *, exact: bool = False
    ) -> dict[str, float]:
        """The feature dict the learned model sees for ``spec`` on ``device``.

        ``exact=True`` dry-runs ``spec`` itself rather than rescaling a cached trace of the
        same architecture, so the features do not depend on which specs came before
        (training data is featurized this way).
        """
        dev = get_device(device)
        trace, graph_feats, _ = self.trace(spec, exact=exact, attention=_attention_mode(dev))
        est = _analytic.estimate(trace, spec, dev)
        return features_for(trace, spec, dev, est, graph_feats, self._op_model_for(dev.kind))

    def op_model(self, kind: str = "cuda") -> OpTimeModel | None:
        """The op-level time model of a device kind ("cuda" or "cpu") whose sums are
        features: this model's or its base's."""
        m = self.op_models_.get(kind)
        if m is None and self.base_ is not None:
            return self.base_.op_model(kind)
        return m

    def add_op_model(self, op_model: OpTimeModel) -> None:
        """Use ``op_model`` (fitted) for the devices of its kind: its sums become features."""
        self.op_models_ = {**self.op_models_, op_model.kind: op_model}

    def _op_model_for(self, kind: str) -> OpTimeModel | None:
        """The op model for a device of ``kind``; without one but with another kind's, that
        one (its features come out NaN: a row of a kind it does not time)."""
        return self.op_model(kind) or self.op_model("cuda") or self.op_model("cpu")

    # -- prediction -----------------------------------------------------------------------
    def predict(
        self, spec: TrainingSpec, device: str | Device = "auto", *, exact: bool = False
    ) -> Prediction:
        """Predict ``spec``'s peak memory and iteration/epoch time on ``device``.

        ``device`` is a catalog name (``"H100"``), a :class:`~costaware.devices.Device`, or
        ``"auto"`` (the local GPU through NVML, else the CPU).

        Raises:
            SpecError: the spec is invalid.
            TraceError: the model could not be dry-run (UntraceableModelError, TraceTimeout).
            UnknownDeviceError: ``device`` is not in the catalog.
        """
        t0 = time.perf_counter()
        if not isinstance(spec, TrainingSpec):
            raise CostawareError(f"predict expects a TrainingSpec, but got {type(spec).__name__}.")
        dev = get_device(device)
        trace, graph_feats, source = self.trace(spec, exact=exact, attention=_attention_mode(dev))
        est = _analytic.estimate(trace, spec, dev)
        notes = list(trace.notes) + list(est.notes) + precision_notes(dev, spec.precision)
        if spec.compiled and COMPILED_NOTE not in notes:
            notes.append(COMPILED_NOTE)
        if spec.pure:
            notes.append(_pure_note(spec, self.is_fitted and self.covers(dev)))
        if self._half_timed_slow(spec, dev):
            notes.append(
                f"{spec.precision} on a CPU with bf16 arithmetic (AVX512-BF16 or AMX): the "
                "CPU op model's bf16 kernels were timed on a host without it, where they ran "
                "about 10x slower than fp32, so this time is likely several times too long "
                "(docs/accuracy.md measured bf16 CPU steps predicted 4.9x too slow)"
            )
        if is_auto(device) and dev.kind == "cpu":
            notes.append(
                "device='auto' found no GPU here (NVML sees none), so this is for this "
                "machine's CPU; name the GPU the trial will train on (device='A10', "
                "'costaware devices' lists them) to predict for it"
            )
        basis: PredictionBasis = {
            "live_peak": trace.peak_live,
            "simulated_allocated": est.allocated,
            "simulated_reserved": est.reserved,
            "workspace": est.workspace,
            "breakdown": dict(trace.peak_breakdown),
            "params": trace.param_count,
            "flops": trace.flops,
            "flops_forward": trace.flops_forward,
            "bytes_moved": trace.bytes_moved,
            "analytic_time": est.iteration_time,
            "trace_source": source,
            "build": trace.build,
            "trace_seconds": trace.duration_s,
        }
        learned_here = self.is_fitted and self.covers(dev)
        if self.is_fitted and not learned_here:
            notes.append(
                f"the learned model saw no {dev.kind.upper()} measurements "
                f"(trained on {', '.join(self.training_.get('devices', []))}): using the analytic estimate"
            )
        if learned_here:
            feats = features_for(trace, spec, dev, est, graph_feats, self._op_model_for(dev.kind))
            peak, peak_hi, it, it_hi = self._learned(feats, est, dev.kind)
            if spec.world_size > 1:
                it, it_hi, scale = self._rank_time(spec, dev, est, exact)
                basis["rank_compute_scale"] = scale
                notes.append(
                    "time per rank: the learned time of this step on one GPU at the same "
                    f"per-rank batch, times {scale:.3g} (the roofline's share of it this "
                    f"{spec.sharding or 'DDP'} rank still computes), plus the communication "
                    "below: the model learned single-GPU steps only"
                )
            if (repeat := self.measured_time(feats, dev.name)) is not None:
                secs, trials = repeat
                basis["time_predicted"] = it
                basis["time_measured_trials"] = trials
                it_hi, it = max(it_hi * secs / it, secs), secs
                notes.append(
                    f"iteration time as measured: this configuration ran in {trials} earlier "
                    f"trial{'s' if trials > 1 else ''} (median {fmt_seconds(secs)}; the model "
                    "alone predicts " + fmt_seconds(float(basis["time_predicted"])) + ")"
                )
            if spec.precision == "fp64-true" and it < est.iteration_time:
                # no fp64 step was learned, and the fp32 correction carried over can put
                # an fp64 step below its own roofline, faster than the fp32 step
                it_hi, it = max(it_hi * est.iteration_time / it, est.iteration_time), est.iteration_time
                notes.append(
                    "fp64 time held at the analytic estimate at fp64's peak: the learned "
                    "model, which saw no fp64 step, put it below"
                )
            if "optime_ms" in feats and feats["optime_ms"] == feats["optime_ms"]:
                basis["op_sum_time"] = feats["optime_ms"] / 1e3
            cpu_steps = self.kinds_.get(dev.kind, self).cpu_steps_
            if cpu_steps is not None and (stepped := cpu_steps.seconds(feats)) is not None:
                basis["cpu_step_time"] = stepped
            basis["memory_factor"] = peak / max(est.reserved, 1)
            basis["time_factor"] = it / max(est.iteration_time, 1e-12)
            kind: PredictionKind = "learned"
            coverage: float | None = self.achieved_coverage(dev.kind)
            basis["features_used"] = len(self.feature_names_)
            basis["trained_rows"], seen = self.trained_on(dev.kind)
            if dev.name not in seen:
                it_hi = it * (max(it_hi, it) / it) ** UNSEEN_DEVICE_WIDENING
                basis["time_bound_widened"] = UNSEEN_DEVICE_WIDENING
                notes.append(
                    f"{dev.name} is not among the devices the model was trained on "
                    f"({', '.join(seen)}): its time is predicted from theirs, and the time's "
                    f"upper bound is widened {UNSEEN_DEVICE_WIDENING:.2f}x in log terms, as "
                    "measured for a GPU left out of the fit (docs/compare.md)"
                )
        else:
            peak, peak_hi, it = est.reserved, est.reserved_upper, est.iteration_time
            it_hi = _analytic.time_upper(it)
            kind, coverage = "analytic", None
            basis["features_used"] = 0
        gap = self.kinds_.get(dev.kind, self).step_gap_ if learned_here else None
        if gap:
            # the user's loop between steps (data loading, hooks), as the study measured it:
            # a cost per step, not a factor on the step the way a refit's correction is
            basis["step_gap"] = gap
            it, it_hi = it + gap, it_hi + gap
            notes.append(
                f"plus {fmt_seconds(gap)} a step between steps (data loading, the training "
                "loop's hooks), as this study's measured epochs took it"
            )
        if est.exposed_allreduce:  # DDP: the all-reduce the backward does not hide
            basis["exposed_allreduce"] = est.exposed_allreduce
            it, it_hi = it + est.exposed_allreduce, it_hi + est.exposed_allreduce
        capacity, capacity_hi = self._capacity(est, peak, peak_hi, dev.kind, learned_here)
        basis["simulated_min_capacity"] = est.min_capacity
        steps = spec.steps_per_epoch
        epoch = it * steps if steps is not None else None
        epoch_hi = max(it_hi, it) * steps if steps is not None else None
        # spec.summary() is a SpecSummary, typed as a plain dict
        trial_steps = spec.trial_steps
        summary = cast(
            SpecSummary, {**spec.summary(), "steps_per_epoch": steps, "trial_steps": trial_steps}
        )
        return Prediction(
            peak_memory=int(peak),
            peak_memory_upper=int(max(peak_hi, peak)),
            iteration_time=float(it),
            iteration_time_upper=float(max(it_hi, it)),
            epoch_time=epoch,
            epoch_time_upper=epoch_hi,
            trial_time=within_max_time(
                it * trial_steps if trial_steps is not None else None, summary.get("max_time")
            ),
            device=dev.name,
            kind=kind,
            coverage=coverage,
            spec=summary,
            basis=basis,
            notes=tuple(notes),
            latency_s=time.perf_counter() - t0,
            min_capacity=int(capacity),
            min_capacity_upper=int(max(capacity_hi, capacity)),
        )

    def max_batch_size(
        self,
        spec: TrainingSpec,
        device: str | Device = "auto",
        budget: Any = None,
        *,
        limit: int = 65_536,
        headroom: float | None = None,
    ) -> Any:
        """The largest batch size of ``spec`` that ``budget`` (default ``Budget()``: the
        device's memory alone) admits on ``device``, with the step's memory need grown by
        ``headroom`` (default :data:`~costaware.core.batch_size.DEFAULT_HEADROOM`): a
        :class:`~costaware.core.batch_size.BatchSizeResult`. No step runs; see
        :func:`costaware.core.batch_size.max_batch_size`."""
        from costaware.core.batch_size import max_batch_size

        return max_batch_size(self, spec, device, budget, limit=limit, headroom=headroom)

    def compare(
        self,
        spec: TrainingSpec,
        devices: Any = None,
        price_per_hour: Any = None,
        budget: Any = None,
        **kwargs: Any,
    ) -> Any:
        """``spec`` on each of ``devices`` (default: every catalog GPU): whether it fits,
        the largest batch size, iteration and epoch time with bounds, and the cost of an
        epoch at ``price_per_hour`` (one number, or one per device): a
        :class:`~costaware.core.compare.Comparison`. See :func:`costaware.core.compare.compare`."""
        from costaware.core.compare import compare

        return compare(self, spec, devices, price_per_hour, budget, **kwargs)

    def _capacity(
        self,
        est: _analytic.AnalyticEstimate,
        peak: float,
        peak_hi: float,
        kind: str,
        learned: bool,
    ) -> tuple[float, float]:
        """The smallest capacity the step runs in, and its upper bound.

        The point is the simulated capacity (:func:`~costaware.core.allocator.min_capacity`)
        moved by the same learned correction as the reserved peak. The bound is the point
        times the capacity quantile (:attr:`capacity_`: the spread of the measured
        allocated peaks around the simulated ones, which the capacity follows, where the
        model was fitted with it), and never above the reserved peak's own bound (no step
        needs more than its unlimited reserved peak). Without a learned model, the point
        is the simulated capacity and the bound a heuristic 10% above it.
        """
        point = est.min_capacity * (peak / max(est.reserved, 1)) if learned else est.min_capacity
        point = min(point, peak)
        bound = self._capacity_bound(kind) if learned else None
        if bound is None:
            upper = point * (peak_hi / max(peak, 1.0)) if learned else point * 1.1
        else:
            q, shift = bound
            upper = (point + shift) * math.exp(q) - shift
        return point, min(max(upper, point), max(peak_hi, point))

    def _capacity_bound(self, kind: str | None) -> tuple[float, float] | None:
        """``(q, shift)`` of the capacity's upper bound for ``kind`` (see
        :func:`capacity_quantile`), or None where the fit had no allocated peaks."""
        if kind is not None and kind in self.kinds_:
            return self.kinds_[kind]._capacity_bound(kind)
        if self.capacity_ is None:
            return None
        return float(self.capacity_.q), float(self.capacity_.shift)

    def covers(self, device: str | Device) -> bool:
        """Whether the learned part applies to ``device``: fitted on that kind (GPU or CPU).

        CPU residuals (the CPU allocator's peak, CPU kernels) say nothing about a GPU's
        caching allocator or kernels, and the other way round.
        """
        if not self.is_fitted:
            return False
        kind = get_device(device).kind
        seen = self.training_.get("devices", [])
        return kind in {device_kind(d) for d in seen}

    def trained_on(self, kind: str) -> tuple[int | None, list[str]]:
        """The measurements the learned part for device ``kind`` ("cuda", "cpu") was fitted
        on, and the devices they came from: a fit on several kinds is one model per kind,
        and a GPU's prediction rests on the GPU rows alone."""
        own = (self.training_.get("by_kind") or {}).get(kind)
        if own:
            return own.get("rows"), list(own.get("devices", []))
        devices = [d for d in self.training_.get("devices", []) if device_kind(d) == kind]
        rows = self.training_.get("rows") if devices == self.training_.get("devices") else None
        return rows, devices

    def achieved_coverage(self, kind: str | None = None) -> float | None:
        """The coverage the memory bound guarantees (the time bound's if memory has none).

        The nominal ``coverage`` when there were enough calibration rows, lower otherwise.
        With ``kind`` ("cuda" or "cpu"), the level of that kind's own bound when it has one.
        """
        if self.kinds_:
            levels = [
                c
                for k, sub in self.kinds_.items()
                if kind in (None, k) and (c := sub.achieved_coverage(k)) is not None
            ]
            return min(levels) if levels else None
        for target in (self.memory_, self.time_):
            if target is not None:
                return float(target.coverage)
        return None

    def _vector(self, feats: Mapping[str, float]) -> np.ndarray:
        return np.asarray([[feats.get(n, np.nan) for n in self.feature_names_]], dtype=np.float64)

    def _q(self, which: str, kind: str | None) -> float:
        """The conformal quantile of ``which``'s log residual for a device of ``kind``.

        A model fitted on GPU and CPU rows holds one model per kind, each calibrated on
        its own rows (CPU timing noise must not widen GPU bounds). Never below 0: when every calibration row was over-predicted the quantile is
        negative, and an upper bound below its own point prediction would admit trials
        that the point prediction already puts over the budget.
        """
        if kind is not None and kind in self.kinds_:
            return self.kinds_[kind]._q(which, kind)
        target = self._target(which)
        if target is None:
            raise NotFittedError(f"this CostModel learned no {which} bound.")
        return max(0.0, float(target.q))

    def _half_timed_slow(self, spec: TrainingSpec, dev: Device) -> bool:
        """Whether a bf16 step on the CPU ``dev``, which has bf16 arithmetic, is costed by
        a CPU op model timed on a host without it (its rows record no such flags)."""
        if dev.kind != "cpu" or not dev.has_bf16:
            return False
        if torch.bfloat16 not in (spec.autocast_dtype, spec.param_dtype):
            return False
        op = self.op_model("cpu")
        if op is None:
            return False
        flags = op.info_.get("cpu_half_flags") or ()
        return not any(f in flags for f in ("avx512_bf16", "amx_bf16"))

    def _rank_time(
        self, spec: TrainingSpec, dev: Device, est: _analytic.AnalyticEstimate, exact: bool
    ) -> tuple[float, float, float]:
        """One rank's learned step time and its bound under DDP or sharding, and the
        scale of its compute: the same step on one GPU (``world_size=1``, no sharding, the
        same per-rank batch) as learned, times the ratio of the two steps' rooflines.

        The model learned single-GPU steps only. A rank's step is the same forward and
        backward, less the optimizer work its shards remove, plus collectives (added by
        the caller, as an assumption): its own features (flat parameters, a rank's share of
        the memory) lie outside what was learned, and the correction fitted to them put a
        sharded step below one GPU's, communication included."""
        single = replace(spec, world_size=1, sharding=None, wrap_policy=())
        trace, graph_feats, _ = self.trace(single, exact=exact, attention=_attention_mode(dev))
        alone = _analytic.estimate(trace, single, dev)
        feats = features_for(trace, single, dev, alone, graph_feats, self._op_model_for(dev.kind))
        _, _, it, it_hi = self._learned(feats, alone, dev.kind)
        scale = est.iteration_time / max(alone.iteration_time, 1e-12)
        return it * scale, it_hi * scale, scale

    def _learned(
        self, feats: Mapping[str, float], est: _analytic.AnalyticEstimate, kind: str | None = None
    ) -> tuple[float, float, float, float]:
        """Point predictions and upper bounds (peak, peak_hi, time, time_hi) from features.

        The baseline is the analytic estimate, or the base model's point prediction when
        this model was refitted on top of another one. A target without a learned model
        falls back to the baseline and its bound.
        """
        if kind is not None and kind in self.kinds_:
            return self.kinds_[kind]._learned(feats, est, kind)
        if self.base_ is not None:
            peak, peak_hi, it, it_hi = self.base_._learned(feats, est, kind)
        else:
            peak, peak_hi = float(est.reserved), float(est.reserved_upper)
            it = self.baseline(feats, kind)[1]
            it_hi = _analytic.time_upper(it)
        return self.correct(feats, (peak, peak_hi, it, it_hi), kind)

    def correct(
        self,
        features: Mapping[str, float],
        baseline: tuple[float, float, float, float],
        kind: str | None = None,
    ) -> tuple[float, float, float, float]:
        """This model's corrections and upper bounds over ``baseline``, for one feature
        row (:meth:`features`) on a device of ``kind`` ("cuda" or "cpu").

        ``baseline`` is ``(peak, peak upper, time, time upper)``: bytes and seconds.
        Returns the same four, each target moved by its learned correction and given its
        calibrated bound; a target without a learned correction keeps its baseline and
        bound. :meth:`predict` corrects the analytic estimate; an evaluation on stored
        features (``benchmarks/accuracy.py``) corrects :meth:`baseline`. A model fitted
        on several device kinds corrects with ``kind``'s model.
        """
        if kind is not None and kind in self.kinds_:
            return self.kinds_[kind].correct(features, baseline, kind)
        peak, peak_hi, it, it_hi = baseline
        x = self._vector(features)
        if (r := self._residual("memory", x, peak)) is not None:
            peak = peak * math.exp(r)
            peak_hi = self._moved_or_own("memory", peak, peak_hi * math.exp(r), kind, features)
        if (r := self._residual("time", x, it)) is not None:
            it = it * math.exp(r)
            it_hi = self._moved_or_own("time", it, it_hi * math.exp(r), kind, features)
        return peak, peak_hi, it, it_hi

    def _moved_or_own(
        self,
        which: str,
        point: float,
        moved: float,
        kind: str | None,
        feats: Mapping[str, float],
    ) -> float:
        """The upper bound of a corrected point: this model's own, or, for a refit on too
        few measurements to calibrate one (``_MIN_BOUND_ROWS``), ``moved``: the base's
        bound times the same correction as the point."""
        target = self._target(which)
        if target is not None and target.from_base:
            return moved
        return self._upper(which, point, kind, feats)

    def _upper(
        self,
        which: str,
        point: float,
        kind: str | None,
        feats: Mapping[str, float] | None = None,
    ) -> float:
        """The calibrated upper bound of ``which`` over the point prediction ``point``.

        ``(point + shift) * exp(q) - shift``: the conformal quantile ``q`` is of the log
        residuals of shifted values, ``log((measured + shift) / (predicted + shift))``.
        With a shift of 0 the bound is a factor. A positive shift (chosen in ``fit`` for
        the narrowest bounds) widens small predictions in absolute terms and narrows
        large ones: a 100 MiB model off by 50% and a 40 GiB one off by 2% are the same
        few hundred MiB of allocator and workspace, and as one factor the small models'
        spread would set every large model's bound. Models with and without convolutions
        are calibrated apart when each has the rows for it, and within each, steps under
        autocast apart from fp32 ones (``_bound_keys``).
        """
        if kind is not None and kind in self.kinds_:
            return self.kinds_[kind]._upper(which, point, kind, feats)
        target = self._target(which)
        groups = target.bounds if target is not None else _NOTHING
        found = (
            next((groups[k] for k in _bound_keys(feats) if k in groups), None)
            if feats is not None and groups
            else None
        )
        if found is not None:
            shift, q = found[0], max(0.0, found[1])
        else:
            shift = float(target.shift) if target is not None else 0.0
            q = self._q(which, kind)
        return (point + shift) * math.exp(q) - shift

    def _residual(self, which: str, x: np.ndarray, baseline: float) -> float | None:
        """The learned log correction of ``which`` for one feature row whose baseline
        prediction is ``baseline`` (None: keep the baseline)."""
        target = self._target(which)
        if target is None:
            return None
        m = target.model
        if isinstance(m, _Affine):
            return m.correction(baseline)
        r = m.correction(x, baseline) if isinstance(m, _PrecisionLine) else float(m.predict(x)[0])
        return None if math.isnan(r) else r

    def baseline(
        self, features: Mapping[str, float], kind: str | None = None
    ) -> tuple[float, float]:
        """The ``(memory bytes, seconds)`` this model's corrections are learned over, for
        one feature row (:meth:`features`) on a device of ``kind`` ("cuda" or "cpu").

        The memory is the simulated reserved peak. The time is the ``time_baseline``'s:
        the CPU step model or the GPU's op-level sum through its dispatch model where
        the fit learned them, else the roofline. Over a ``base`` (a refit), both are the
        base's point prediction. A model fitted on several device kinds gives
        ``kind``'s model's.
        """
        if kind is not None and kind in self.kinds_:
            return self.kinds_[kind].baseline(features, kind)
        if self.base_ is None:
            secs = features["analytic_time_ms"] / 1e3
            op_sum = features.get("optime_ms", math.nan)
            stepped = self.cpu_steps_.seconds(features) if self.cpu_steps_ is not None else None
            if stepped is not None and stepped > 0:
                secs = stepped  # a CPU's step model (over the roofline's parts and op sum)
            elif self.time_baseline == "optime" and op_sum > 0:
                secs = op_sum / 1e3  # the op-level sum where there is one, else roofline
                dispatch = self.dispatch_
                if dispatch is not None and (issued := dispatch.seconds(features)) is not None:
                    secs = issued
            return features["analytic_reserved_mib"] * MiB, secs
        return self.base_._point(features, kind)

    def _point(self, feats: Mapping[str, float], kind: str | None) -> tuple[float, float]:
        """This model's (memory, time) point prediction on a device of ``kind``, from the
        features alone."""
        if kind is not None and kind in self.kinds_:
            return self.kinds_[kind]._point(feats, kind)
        mem, secs = self.baseline(feats, kind)
        x = self._vector(feats)
        if (r := self._residual("memory", x, mem)) is not None:
            mem *= math.exp(r)
        if (r := self._residual("time", x, secs)) is not None:
            secs *= math.exp(r)
        return mem, secs

    # -- fitting --------------------------------------------------------------------------
    def fit(
        self,
        observations: Iterable[Observation | Mapping[str, Any]],
        *,
        base: CostModel | None = None,
    ) -> CostModel:
        """Fit the memory and time residual models on measured observations.

        Each observation carries the features its spec had (:meth:`features`) and the
        measured reserved peak and/or iteration time. Rows without a measurement of a
        target (an OOM has no peak) are left out of that target's model, and so are the
        peaks of conv nets measured with cuDNN's benchmark mode on
        (:func:`benchmark_search_peak`: the search's workspace is sized to the free memory).

        With ``base`` (a fitted model), the residual is learned over the base model's
        predictions instead of the analytic estimate: that is how the online refit
        adapts a shipped model to the user's hardware. With fewer than
        ``SMALL_SAMPLE`` measurements of a target, a tree ensemble would overfit: memory
        gets a line over the baseline (a fixed offset and a factor, Theil-Sen), time a
        line in log space per precision (a precision measured once or never keeps the
        baseline's prediction and bound). Their bounds come from leave-one-out residuals;
        with fewer than ``_MIN_BOUND_ROWS`` of them and a ``base``, the base's bound is
        kept, moved by the same correction as the point. A fit with a ``base`` (fitted or
        not) also keeps each configuration's measured iteration time, which
        :meth:`predict` gives for that configuration again (:meth:`measured_time`).

        Every fit starts from nothing learned: what an earlier fit learned is dropped
        first, whatever this one's observations measure.
        """
        obs = _checked_observations(observations)
        if base is self:
            raise ValueError("fit's base must be another model, not the one being fitted.")
        self._forget()
        present = sorted({device_kind(o.device) for o in obs})
        if len(present) > 1:
            return self._fit_by_kind(obs, base, present)
        refit = base is not None  # even over an unfitted base, which is then the analytic one
        base = _usable_base(base, obs)
        self.base_ = base
        if base is not None and base.graph2vec_ is not None:
            self.graph2vec_ = base.graph2vec_
        if base is None and self.time_baseline == "optime":
            self._fit_step_models(obs)
        rows = self._fit_rows(obs)
        self.feature_names_ = rows.names
        self.memory_ = self._fit_target("memory", rows, base)
        self.time_ = self._fit_target("time", rows, base)
        if not self.is_fitted:
            raise NotEnoughObservations(
                "fit needs at least 2 observations with a measured peak memory or iteration time."
            )
        self._fit_capacity(obs)
        if refit:
            # a refit remembers what each configuration it saw measured (see predict)
            self.time_measured_ = _measured_times(obs)
            self.step_gap_ = _step_gap(obs)
        self.training_ = self._training_record(obs, rows.x, base)
        return self

    def _fit_step_models(self, obs: Sequence[Observation]) -> None:
        """The step models the time residual is learned over (``time_baseline="optime"``):
        a GPU's (:class:`_Dispatch`) where the rows have an op-level sum, a CPU's
        (:class:`_CpuSteps`) where they are all CPU rows."""
        self.dispatch_ = _Dispatch.fitted_on(
            obs,
            lambda o: device_kind(o.device) == "cuda" and o.features.get("optime_ms", math.nan) > 0,
        )
        if all(device_kind(o.device) == "cpu" for o in obs):
            self.cpu_steps_ = _CpuSteps.fitted_on(obs)

    def _fit_rows(self, obs: list[Observation]) -> _FitRows:
        """The observations as the arrays a fit learns from: features, families, the
        families held out for a split calibration (drawn from ``random_state``), device
        kinds and each row's (memory, time) baseline (a prediction, over a base)."""
        names = sorted({k for o in obs for k in o.features})
        x = np.asarray([[o.features.get(n, np.nan) for n in names] for o in obs], dtype=np.float64)
        groups = np.asarray([o.family or f"row{i}" for i, o in enumerate(obs)])
        rng = np.random.default_rng(self.random_state)
        uniq = np.unique(groups)
        n_cal = max(1, round(len(uniq) * self.calibration_fraction)) if len(uniq) > 1 else 0
        cal_groups = set(rng.choice(uniq, size=n_cal, replace=False).tolist()) if n_cal else set()
        kinds = np.asarray([device_kind(o.device) for o in obs])
        baselines = np.asarray(
            [self.baseline(o.features, k) for o, k in zip(obs, kinds)], dtype=np.float64
        )
        return _FitRows(
            obs=obs,
            names=names,
            x=x,
            groups=groups,
            is_cal=np.asarray([g in cal_groups for g in groups]),
            kinds=kinds,
            baselines=baselines,
            rng=rng,
        )

    def _fit_target(self, which: str, rows: _FitRows, base: CostModel | None) -> TargetFit | None:
        """What this fit learns of ``which`` ("memory" or "time"): a line with
        leave-one-out bounds under ``SMALL_SAMPLE`` measurements of it, else the
        ``memory_model``'s or the trees' residual model with a conformal bound; None with
        fewer than 2 measurements (or, few, none of a precision measured twice)."""
        y = rows.residuals(which)
        ok = ~np.isnan(y)
        if ok.sum() < 2:
            return None
        if ok.sum() < SMALL_SAMPLE:
            return self._fit_small_sample(which, rows, y, ok, base)
        return self._fit_calibrated(which, rows, y, ok)

    def _fit_small_sample(
        self, which: str, rows: _FitRows, y: np.ndarray, ok: np.ndarray, base: CostModel | None
    ) -> TargetFit | None:
        """A few measurements of ``which``: for memory a line (fixed offset + factor) over
        the baseline, for time a line in log space per precision (a precision not measured
        yet keeps the baseline). The bound comes from leave-one-out residuals; with fewer
        than ``_MIN_BOUND_ROWS`` of them over a ``base``, it is the base's, moved."""
        small: Any
        if which == "memory":
            bases = rows.baselines[ok, 0]
            small, loo = _small_sample_affine(bases, bases * np.exp(y[ok]))
        else:
            cols = _group_columns(rows.names)
            log_base = np.log(np.maximum(rows.baselines[ok, 1], 1e-12))
            groups = _row_groups(rows.x[ok], cols)
            factors, slope, loo = _small_sample_line(y[ok], log_base, groups)
            small = _PrecisionLine(factors, cols, slope, _spans(y[ok], log_base, groups))
        if not len(loo):  # no precision measured twice: nothing to calibrate on
            return None
        if base is not None and len(loo) < _MIN_BOUND_ROWS:
            # too few residuals to calibrate a bound of its own: the base's bound, moved by
            # the same correction as the point (see correct)
            level = base.achieved_coverage(rows.kinds[0])
            return TargetFit(
                small,
                q=math.nan,
                coverage=self.coverage if level is None else level,
                from_base=True,
                cal_rows=int(ok.sum()),
            )
        q, level = _conformal_quantile(loo, self.coverage)
        return TargetFit(small, q=q, coverage=level, cal_rows=int(ok.sum()))

    def _fit_calibrated(
        self, which: str, rows: _FitRows, y: np.ndarray, ok: np.ndarray
    ) -> TargetFit:
        """The residual model of ``which`` (:meth:`_fit_residual`) and its conformal bound:
        one over every row, and one per bound group with the rows for it (``_bound_keys``)."""
        fitted = self._fit_residual(which, rows, y, ok)
        cal, train = fitted.cal, fitted.train
        per_row = rows.baselines[:, 0 if which == "memory" else 1]
        cal_rows = (per_row[cal] * np.exp(fitted.cal_pred), per_row[cal] * np.exp(y[cal]))
        train_rows = (per_row[train] * np.exp(fitted.train_pred), per_row[train] * np.exp(y[train]))
        # the shift is chosen on rows apart from the calibration ones (chosen on the
        # calibrating rows themselves, it fits their noise and the bound covers less);
        # cross-conformal, every row calibrates, so the bound is a factor
        shape = None if fitted.pooled else train_rows
        shift, q, level = _shifted_quantile(cal_rows, shape, self.coverage)
        by_group = (
            {}
            if fitted.pooled
            else _group_bounds(
                _bound_groups(rows.x[cal], rows.names),
                _bound_groups(rows.x[train], rows.names),
                cal_rows,
                train_rows,
                self.coverage,
            )
        )
        return TargetFit(
            fitted.model,
            q=q,
            coverage=level,
            shift=shift,
            bounds=by_group if len(by_group) > 1 else {},
            cal_rows=int(cal.sum()),
        )

    def _fit_residual(self, which: str, rows: _FitRows, y: np.ndarray, ok: np.ndarray) -> _Residual:
        """The residual model of ``which`` on the measured rows ``ok``, and the predictions
        its bound is calibrated on.

        Memory with ``memory_model="line"``: a Theil-Sen line over the baseline,
        cross-conformal by family where there are ``_MIN_CV_FAMILIES`` families (one
        pooled bound), else calibrated on the held-out families. Otherwise trees,
        cross-conformal by family with ``calibration="cross"`` and enough families, else
        on one held-out split (of rows, where too few families were held out).
        """
        train = ok & ~rows.is_cal
        cal = ok & rows.is_cal
        if cal.sum() < 2 or train.sum() < 3:  # too few families: hold out rows instead
            idx = np.nonzero(ok)[0]
            rows.rng.shuffle(idx)
            k = max(2, int(len(idx) * self.calibration_fraction))
            cal = np.zeros_like(ok)
            cal[idx[:k]] = True
            train = ok & ~cal
        model: Any
        pooled = False  # one bound for every row, not one per bound group
        groups, x = rows.groups, rows.x
        one_kind = len(set(rows.kinds[ok].tolist())) == 1
        if which == "memory" and self.memory_model == "line" and one_kind:
            bases = rows.baselines[:, 0]
            fams = np.unique(groups[ok])
            if len(fams) >= _MIN_CV_FAMILIES:
                # cross-conformal by family: every family's residuals come from a line
                # fitted without it, and the line itself from every row. One held-out
                # split would calibrate on a few families, and a family's simulator
                # error is shared by all its rows; one pooled bound, since a group holds
                # too few families to calibrate its own
                cal, train, pooled = ok.copy(), ok.copy(), True
                oof = np.zeros(len(rows.obs))
                for fam in fams.tolist():
                    rest, out = ok & (groups != fam), ok & (groups == fam)
                    line = _fit_affine(bases[rest], bases[rest] * np.exp(y[rest]))
                    oof[out] = [line.correction(b) for b in bases[out]]
                model = _fit_affine(bases[ok], bases[ok] * np.exp(y[ok]))
                cal_pred = oof[cal]
            else:
                model = _fit_affine(bases[train], bases[train] * np.exp(y[train]))
                cal_pred = np.asarray([model.correction(b) for b in bases[cal]])
            train_pred = np.asarray([model.correction(b) for b in bases[train]])
        elif self.calibration == "cross" and len(fams := np.unique(groups[ok])) >= _MIN_CV_FAMILIES:
            # cross-conformal by family: each row's residual comes from trees fitted
            # without its fold of families, and the trees themselves from every row (one
            # held-out split calibrates on the few families it happens to draw, and
            # keeps them out of the trees)
            cal, train = ok.copy(), ok.copy()
            oof = np.zeros(len(rows.obs))
            for fold in _family_folds(fams, _CV_FOLDS, rows.rng):
                out = ok & np.isin(groups, fold)
                oof[out] = self._trees(x[ok & ~out], y[ok & ~out]).predict(x[out])
            model = self._trees(x[ok], y[ok])
            cal_pred = oof[cal]
            train_pred = model.predict(x[train])
        else:
            model = self._trees(x[train], y[train])
            cal_pred = model.predict(x[cal])
            train_pred = model.predict(x[train])
        return _Residual(model, cal, train, cal_pred, train_pred, pooled)

    def _training_record(
        self, obs: Sequence[Observation], x: np.ndarray, base: CostModel | None
    ) -> dict[str, Any]:
        """What this fit was fitted on (``training_``): rows, devices, families, when, a
        hash of the feature matrix ``x``, the rows each bound was calibrated on, and the
        base's record."""
        targets = {"memory": self.memory_, "time": self.time_}
        return {
            "rows": len(obs),
            "devices": sorted({o.device for o in obs}),
            "families": sorted({o.family for o in obs if o.family}),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "data_hash": hashlib.sha1(x.tobytes()).hexdigest()[:16],
            "calibration": {w: 0 if t is None else t.cal_rows for w, t in targets.items()},
            "base": None if base is None else base.training_,
        }

    def _fit_capacity(self, obs: Sequence[Observation]) -> None:
        """The capacity bound (:func:`capacity_quantile`) from the observations with a
        measured allocated peak: each one's predicted allocated peak is the simulated one
        moved by this model's memory correction, as :meth:`predict` moves the capacity.
        A fit without such rows has no capacity bound (the reserved peak's applies)."""
        pairs = []
        for o in obs:
            simulated = o.features.get("analytic_allocated_mib", math.nan) * MiB
            if not o.peak_allocated or not simulated > 0 or benchmark_search_peak(o.features):
                continue  # (cuDNN's benchmark search takes what is free: not the step's need)
            reserved = float(o.features["analytic_reserved_mib"]) * MiB
            point = self._point(o.features, device_kind(o.device))[0]
            pairs.append((simulated * point / max(reserved, 1.0), o.peak_allocated))
        found = capacity_quantile(pairs)
        if found is not None:
            q, coverage = found
            self.capacity_ = CapacityFit(
                q=q, shift=float(CAPACITY_SHIFT), coverage=coverage, rows=len(pairs)
            )

    def measured_time(self, feats: Mapping[str, float], device: str) -> tuple[float, int] | None:
        """(median seconds, trials) of the iteration time this refit measured for the
        configuration ``feats`` describes on ``device``, or None.

        A study runs the same configuration again and again: a search over architecture,
        batch size and learning rate measures one architecture and batch at several
        learning rates, which do not change what a step costs, so a repeat is best predicted
        by its earlier measurements (``docs/predictions.md``, "Online refit", measures how
        much). Only a refit (a model fitted over a ``base``) keeps them."""
        measured = self.kinds_.get(device_kind(device), self).time_measured_
        if not measured:
            return None
        return measured.get(repeat_key(feats, device))

    def _fit_by_kind(
        self, obs: list[Observation], base: CostModel | None, kinds: list[str]
    ) -> CostModel:
        """One model per device kind (GPU, CPU), each fitted on its own rows only.

        A GPU's caching allocator and kernels and a CPU's allocator and kernels share no
        residual: pooled, the CPU rows would pull the GPU memory model off its line and
        widen its bounds. A kind with too few measurements to fit is left to the analytic estimate.
        """
        subs: dict[str, CostModel] = {}
        skipped: dict[str, str] = {}
        for kind in kinds:
            rows = [o for o in obs if device_kind(o.device) == kind]
            sub = CostModel(**self.get_params())
            try:
                subs[kind] = sub.fit(rows, base=base)
            except ValueError as e:
                skipped[kind] = str(e)
        if not subs:
            raise ValueError(f"no device kind could be fitted: {skipped}")
        self.kinds_ = subs
        self.base_ = None  # each kind's model carries its own base
        self.feature_names_ = sorted({n for sub in subs.values() for n in sub.feature_names_})
        trained = {k: sub.training_ for k, sub in subs.items()}
        self.training_ = {
            "rows": sum(t["rows"] for t in trained.values()),
            "devices": sorted({d for t in trained.values() for d in t["devices"]}),
            "families": sorted({f for t in trained.values() for f in t["families"]}),
            "date": max(t["date"] for t in trained.values()),
            "data_hash": hashlib.sha1(
                " ".join(t["data_hash"] for t in trained.values()).encode()
            ).hexdigest()[:16],
            "calibration": {k: t["calibration"] for k, t in trained.items()},
            "base": None if base is None else base.training_,
            "by_kind": {
                k: {"rows": t["rows"], "devices": t["devices"]} for k, t in trained.items()
            },
        }
        if skipped:
            self.training_["kinds_not_fitted"] = skipped
        return self

    def _trees(self, x: np.ndarray, y: np.ndarray) -> Any:
        """A CatBoost regressor fitted on ``(x, y)`` (a constant where ``y`` is one).

        Raises:
            FitCancelled: the event of :func:`stop_fits_when` is set, before the fit or
                during it (CatBoost stops after the tree it is growing).
        """
        stop = _STOP_FITS.get()
        _check_stop(stop)
        if float(np.ptp(y)) < 1e-12:  # CatBoost refuses constant targets
            return _Constant(float(y[0]))
        model = self._regressor()
        model.fit(x, y, callbacks=None if stop is None else [_StopWhenSet(stop)])
        _check_stop(stop)
        return model

    def _regressor(self) -> Any:
        from catboost import CatBoostRegressor

        return CatBoostRegressor(
            iterations=self.iterations,
            depth=self.depth,
            learning_rate=self.learning_rate,
            loss_function="RMSE",
            random_seed=self.random_state,
            thread_count=self.thread_count,
            verbose=False,
            allow_writing_files=False,
        )

    # -- persistence ----------------------------------------------------------------------
    def get_params(self) -> dict[str, Any]:
        """The parameters ``__init__`` declares, with this model's values:
        ``CostModel(**model.get_params())`` is an unfitted model with the same settings."""
        names = inspect.signature(type(self).__init__).parameters
        return {name: getattr(self, name) for name in names if name != "self"}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the model to directory ``path``: ``.cbm`` files and ``manifest.json``."""
        return save_model(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostModel:
        """Load a model saved by :meth:`save` (no pickle involved).

        Each file is checked against the sha256 its manifest records before anything
        parses it, so a damaged ``.cbm`` is refused here rather than handed to CatBoost
        (which can crash the process on one). A model whose manifest records no
        checksums still loads, unverified, with a
        :class:`~costaware.errors.CostAwareWarning`; ``CostModel.load(p).save(p)`` adds
        them.

        Raises:
            FileNotFoundError: ``path`` (or a part its manifest lists) has no manifest.
            CostawareError: a file does not match its checksum; the manifest is not a
                CostModel manifest (bad JSON, wrong types, a part that names the model
                itself or a folder outside it); or it was written for another feature
                version.
        """
        unverified: list[Path] = []
        model = read_model(cls, Path(path), (), unverified)
        if unverified:
            warnings.warn(
                f"the model at {path} was saved without checksums ({MANIFEST} has no "
                "'sha256'), so its files are read unverified and a damaged one could crash "
                "the process; CostModel.load(path).save(path) adds them.",
                CostAwareWarning,
                stacklevel=2,
            )
        return model

    def __repr__(self) -> str:
        state = f"fitted on {self.training_.get('rows')} rows" if self.is_fitted else "analytic"
        return f"CostModel({state})"


# the shipped model, read once per process (CostModel.default): None until the first call,
# then (model or None where the package carries none, the error that stopped it or None)
_shipped: tuple[CostModel | None, str | None] | None = None
_shipped_lock = threading.Lock()


def _reset_shipped_lock() -> None:
    # a child forked while another thread was loading would find the lock held for ever
    global _shipped_lock
    _shipped_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_shipped_lock)


def _load_shipped() -> CostModel | None:
    """Read the model in the package's ``data/default_model`` (None: there is none)."""
    root = resources.files("costaware") / "data" / "default_model"
    with resources.as_file(root) as path:
        if not (Path(path) / MANIFEST).is_file():
            return None
        return CostModel.load(path)


def _shipped_model() -> CostModel | None:
    """The process's one loaded copy of the shipped model (None: the package carries
    none); raises the :class:`CostawareError` that loading it raised, every time."""
    global _shipped
    with _shipped_lock:
        if _shipped is None:
            try:
                _shipped = (_load_shipped(), None)
            except Exception as e:  # damaged: remembered, so that no later call reads it
                _shipped = (None, first_line(e))
        model, error = _shipped
    if error is not None:
        raise CostawareError(
            f"the cost model shipped with costaware cannot be used ({error.rstrip('.')}); "
            "reinstall costaware (pip install --force-reinstall costaware), or pass model= "
            "a model of your own."
        )
    return model
