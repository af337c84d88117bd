"""What a prediction says: :class:`Prediction`, the cost of one training configuration on
one device; :class:`PredictionBasis`, the figures it rests on; :class:`SpecSummary`, the
configuration it is of.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypedDict

from costaware._format import fmt_bytes, fmt_seconds
from costaware.devices import device_kind

__all__ = ["Prediction", "PredictionBasis", "PredictionKind", "SpecSummary", "TraceSource"]

#: what a prediction's figures come from: a learned model fitted on measurements of the
#: device's kind, or the analytic estimate alone (no learned model, or none for the kind)
PredictionKind = Literal["learned", "analytic"]

#: where the dry run behind a prediction came from (:meth:`CostModel.trace
#: <costaware.CostModel.trace>`): a trace kept for this batch size, a fresh dry run, or a
#: kept trace rescaled to this batch size from two traces of the architecture or from one
TraceSource = Literal["cached", "traced", "rescaled (two traces)", "rescaled (one trace)"]


class SpecSummary(TypedDict, total=False):
    """The configuration a prediction is of: :meth:`TrainingSpec.summary
    <costaware.TrainingSpec.summary>`, the steps of an epoch and of the whole trial
    (micro-batches of one rank). ``compiled`` is there only for a compiled model,
    ``world_size`` and ``bucket_cap_mb`` only for DDP, ``max_steps`` and ``max_time``
    (seconds) only when set; ``epochs`` is None for a trial without an epoch limit."""

    name: str
    batch: str
    batch_size: int
    optimizer: str
    lr: float
    precision: str
    dataset_size: int | None
    cudnn_benchmark: bool
    allocator: str
    grad_accumulation: int
    epochs: int | None
    compiled: bool
    world_size: int
    bucket_cap_mb: float
    steps_per_epoch: int | None
    trial_steps: int | None
    max_steps: int
    max_time: float


class PredictionBasis(TypedDict, total=False):
    """The figures a prediction rests on (:meth:`Prediction.explain` words them).

    Bytes: ``live_peak`` (the dry run's live tensors at their peak),
    ``simulated_allocated``, ``simulated_reserved`` and ``simulated_min_capacity`` (the
    allocator simulation's), ``workspace`` (cuBLAS/cuDNN's, in the simulated peak),
    ``breakdown`` (the live peak by kind of storage). ``params`` counts parameters;
    ``flops``, ``flops_forward`` and ``bytes_moved`` are per step. Seconds:
    ``analytic_time`` (the roofline's step), ``trace_seconds`` (the dry run's own time).
    ``trace_source`` and ``build`` say where the trace came from and what the model was
    built on; ``features_used`` counts the learned model's features (0: analytic).

    A :meth:`CostModel.predict <costaware.CostModel.predict>` prediction has each of those.
    The rest are there only where they apply: ``trained_rows``, ``memory_factor`` and
    ``time_factor`` (the learned correction over the analytic peak and time) for a learned
    prediction; ``op_sum_time`` (the op-level sum) and ``cpu_step_time`` (the CPU step
    model) where the model has them; ``time_predicted`` and ``time_measured_trials``
    where a refit measured this configuration (the time is then the measured one);
    ``time_bound_widened`` (the log factor of the time bound's widening) on a device the
    model was not trained on; ``exposed_allreduce`` (seconds of DDP's all-reduce that the
    backward does not hide); ``rank_compute_scale`` under DDP or sharding (the rank's
    roofline time over the same step's on one GPU, whose learned time it scales);
    ``step_gap`` (seconds a refit adds to each step: the time between steps its study's
    epochs measured).
    """

    live_peak: int
    simulated_allocated: int
    simulated_reserved: int
    workspace: int
    breakdown: dict[str, int]
    params: int
    flops: float
    flops_forward: float
    bytes_moved: float
    analytic_time: float
    trace_source: TraceSource
    build: str
    trace_seconds: float
    time_predicted: float
    time_measured_trials: int
    op_sum_time: float
    cpu_step_time: float
    memory_factor: float
    time_factor: float
    features_used: int
    trained_rows: int | None
    time_bound_widened: float
    exposed_allreduce: float
    rank_compute_scale: float
    step_gap: float
    simulated_min_capacity: int


@dataclass(frozen=True)
class Prediction:
    """Predicted cost of one training configuration on one device.

    Memory, in bytes:

    - ``peak_memory``: the caching allocator's reserved peak (``max_memory_reserved``) on
      a device with room to spare, the figure a run reports; ``peak_memory_upper`` its
      calibrated upper bound.
    - ``min_capacity``: the smallest memory the step runs in, the figure that decides an
      OOM. Under a limit the allocator gives back its cached, unused memory before it
      raises, so a step runs in less than its unlimited reserved peak (at least its
      allocated peak). ``min_capacity_upper`` is its calibrated upper bound, which a
      :class:`~costaware.Budget` compares with the memory it allows.

    Neither includes the CUDA context (the device's ``context_overhead_bytes``).
    Times are seconds; ``epoch_time`` is None when the spec has no ``dataset_size``, and
    ``trial_time`` (``trial_steps`` iterations: the spec's epochs, cut at its ``max_steps``,
    the time cut at its ``max_time``) when none of them says how long the trial is.
    """

    peak_memory: int
    peak_memory_upper: int
    iteration_time: float
    iteration_time_upper: float
    epoch_time: float | None
    epoch_time_upper: float | None
    trial_time: float | None
    device: str
    kind: PredictionKind
    coverage: float | None
    spec: SpecSummary
    basis: PredictionBasis
    notes: tuple[str, ...] = ()
    latency_s: float = 0.0
    min_capacity: int = 0
    min_capacity_upper: int = 0

    def __post_init__(self) -> None:
        # a Prediction built without the capacity figures (an older record) decides on
        # the reserved peak, which is never below them
        if not self.min_capacity:
            object.__setattr__(self, "min_capacity", self.peak_memory)
        if not self.min_capacity_upper:
            object.__setattr__(self, "min_capacity_upper", self.peak_memory_upper)

    @property
    def trial_time_upper(self) -> float | None:
        """The trial time's upper bound: the iteration time's, times the trial's steps, cut
        at the spec's ``max_time``."""
        steps = self.spec.get("trial_steps")
        upper = max(self.iteration_time_upper, self.iteration_time) * steps if steps else None
        return within_max_time(upper, self.spec.get("max_time"))

    def explain(self) -> str:
        """What the numbers rest on, in words a person can check."""
        b = self.basis
        lines = [
            f"{self.spec.get('name', 'model')} on {self.device}: batch {self.spec.get('batch_size')}, "
            f"{self.spec.get('optimizer')}, {self.spec.get('precision')}, allocator {self.spec.get('allocator')}",
            f"  peak memory (reserved, with room to spare): {fmt_bytes(self.peak_memory)}  "
            f"upper bound: {fmt_bytes(self.peak_memory_upper)}",
            f"  memory it needs (the smallest capacity it runs in): {fmt_bytes(self.min_capacity)}  "
            f"upper bound: {fmt_bytes(self.min_capacity_upper)}  (what a budget checks)",
            f"  iteration time: {fmt_seconds(self.iteration_time)}  "
            f"upper bound: {fmt_seconds(self.iteration_time_upper)}",
        ]
        if self.epoch_time is not None:
            lines.append(
                f"  epoch time: {fmt_seconds(self.epoch_time)} ({self.spec.get('steps_per_epoch')} steps)  "
                f"upper bound: {fmt_seconds(self.epoch_time_upper)}"
            )
        trial_steps = self.spec.get("trial_steps")
        if self.trial_time is not None and (
            trial_steps != self.spec.get("steps_per_epoch") or "max_time" in self.spec
        ):
            ws = self.spec.get("world_size", 1)
            steps_time = self.iteration_time * trial_steps if trial_steps else None
            length = _trial_length(self.spec, steps_time)
            lines.append(
                f"  trial time: {fmt_seconds(self.trial_time)} ("
                + (length if length.startswith("max_time") else f"{trial_steps} steps: {length}")
                + (f"; each of the {ws} ranks steps through 1/{ws} of the data" if ws > 1 else "")
                + ")"
            )
        if self.kind == "analytic":
            lines.append(
                "  model: analytic estimate only (no learned model is fitted); the upper bounds are "
                "heuristic margins, not calibrated"
            )
        else:
            lines.append(
                f"  model: learned residual over the estimates below, trained on "
                f"{b.get('trained_rows')} measurements; upper bounds conformal, calibrated on "
                f"the residuals of measurements held out of the fit to cover "
                f"{self.coverage:.0%} of measurements like those it learned from (a target, "
                "not a guarantee for an architecture unlike any of them)"
            )
        lines += [
            "  based on:",
            f"    dry-run live peak        {fmt_bytes(b.get('live_peak'))}",
            f"    simulated allocator peak {fmt_bytes(b.get('simulated_reserved'))} "
            f"(allocated {fmt_bytes(b.get('simulated_allocated'))}, incl. {fmt_bytes(b.get('workspace'))} "
            "cuBLAS/cuDNN workspace)",
            "    peak breakdown           "
            + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in b.get("breakdown", {}).items() if v),
            f"    parameters               {b.get('params', 0) / 1e6:.2f} M",
            f"    FLOPs per step           {b.get('flops', 0) / 1e9:.1f} GFLOP "
            f"(forward {b.get('flops_forward', 0) / 1e9:.1f})",
            f"    roofline time            {fmt_seconds(b.get('analytic_time'))}",
        ]
        on_cpu = device_kind(self.device) == "cpu"
        with_sum = b.get("op_sum_time") is not None
        if with_sum:
            lines.append(
                f"    op-level time (sum)      {fmt_seconds(b.get('op_sum_time'))} "
                f"(per-kernel times learned from {'CPU' if on_cpu else 'GPU'} microbenchmarks)"
            )
        if b.get("cpu_step_time") is not None:
            lines.append(
                f"    CPU step model           {fmt_seconds(b.get('cpu_step_time'))} "
                f"(the roofline's parts{' and the op-level sum' if with_sum else ''}, plus "
                "a cost per kernel and per parameter tensor, fitted on CPU timings)"
            )
        if self.kind == "learned":
            lines.append(
                f"    learned correction       memory x{b.get('memory_factor', 1):.3f}, "
                f"time x{b.get('time_factor', 1):.3f}"
            )
        lines.append(
            f"    features used            {b.get('features_used')} "
            f"(trace: {b.get('trace_source')}, model built on {b.get('build')})"
        )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["spec"] = dict(self.spec)
        d["basis"] = {k: v for k, v in self.basis.items()}
        d["notes"] = list(self.notes)
        return d

    def __repr__(self) -> str:
        ep = f", epoch_time={fmt_seconds(self.epoch_time)}" if self.epoch_time is not None else ""
        return (
            f"Prediction(peak_memory={fmt_bytes(self.peak_memory)}, "
            f"peak_memory_upper={fmt_bytes(self.peak_memory_upper)}, "
            f"min_capacity={fmt_bytes(self.min_capacity)}, "
            f"min_capacity_upper={fmt_bytes(self.min_capacity_upper)}, "
            f"iteration_time={fmt_seconds(self.iteration_time)}{ep}, device={self.device!r}, "
            f"kind={self.kind!r})"
        )


def within_max_time(seconds: float | None, max_time: float | None) -> float | None:
    """A trial's time cut at its ``max_time``; ``max_time`` itself where the steps do not
    say how long the trial is (None when neither does)."""
    if max_time is None:
        return seconds
    return float(max_time) if seconds is None else min(seconds, float(max_time))


def _trial_length(spec: Mapping[str, Any], steps_time: float | None) -> str:
    """What sets a trial's length, in words: its epochs, ``max_steps`` where that cuts them
    short, or ``max_time`` where that cuts the steps' time (``steps_time``) short."""
    max_time = spec.get("max_time")
    if max_time is not None and (steps_time is None or max_time < steps_time):
        return f"max_time={fmt_seconds(max_time)}"
    epochs, per_epoch = spec.get("epochs", 1), spec.get("steps_per_epoch")
    max_steps, accumulation = spec.get("max_steps"), spec.get("grad_accumulation", 1)
    if max_steps is not None and (
        per_epoch is None or epochs is None or max_steps * accumulation < epochs * per_epoch
    ):
        micro = f" x {accumulation} micro-batches" if accumulation > 1 else ""
        return f"max_steps={max_steps}{micro}"
    return f"{epochs} epochs of {per_epoch}"
