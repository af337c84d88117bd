"""First-principles estimates from a dry run: allocator peak and roofline time.

These are the baseline the learned model corrects (it learns ``log(actual / analytic)``),
and the whole prediction when no learned model is available. Every constant is a
measured figure or a documented assumption:

- Workspaces a CUDA step allocates through the caching allocator besides its tensors
  (:func:`workspace_bytes`): ``CUBLAS_WORKSPACE_BYTES`` (65 MiB) where the step calls
  cuBLAS (a matmul, linear or bmm: :data:`CUBLAS_OPS`), plus ``WORKSPACE_BYTES`` (6 MiB)
  for every step. On the H200 rows, the measured ``max_memory_allocated`` less the
  simulated peak was a median 71.6 MiB for the 164 steps that call cuBLAS and 5.7 MiB for
  the 20 that do not (U-Nets, SqueezeNets: convolutions only). The 20 such configurations
  measured on both GPUs allocated 65.0-67.5 MiB more on the H100 (65.0 in 17): the H100
  collector kept the workspace of an earlier configuration (the H200 collector drops it
  before each), so the H100 peaks of those models include it (see
  :func:`costaware.measure.collect.observations`). One flat 80 MiB, the constant before this,
  over-predicted the U-Nets and SqueezeNets on the H200 by up to 2x.
- The allocator replay adds the block cuDNN takes and frees again in the backward of each
  convolution larger than 1x1 that is not depthwise (input plus output gradient; see
  :attr:`~costaware.core.trace.Trace.transients`). It barely moves the allocated peak but adds
  the segments a real run keeps: without it the H100 conv nets' reserved peaks were
  under-predicted (VGG by 7%, U-Net by 6%).
- A CPU's peak is the live-tensor peak, unrounded, with the columns of PyTorch's own
  convolution where a CPU runs it (:func:`~costaware.core.trace.transients._cpu_conv_transient`).
- cuDNN's benchmark mode (``torch.backends.cudnn.benchmark=True``) is not a factor on the
  peak. Its algorithm search takes a workspace sized to the free memory: PyTorch keeps the
  plans whose workspace fits the largest free block (``cacheInfo`` starts from
  ``cudaMemGetInfo``'s free bytes) and halves the allocation on OOM
  (``generate_and_filter_plans`` in ``aten/src/ATen/native/cudnn/Conv_v8.cpp``). So the
  peak it reaches grows with the card, not with what the step needs: on an 80 GB H100,
  fp32 conv nets peaked at 0.97-10.9x the predicted need (median 2.5x, 22 runs; a U-Net
  at batch 2: 17.1 GiB), bf16/fp16 ones at 0.93-1.26x (13 runs; ``docs/accuracy.md``).
  The estimate is the step's need, as with benchmark mode off, and says so in a note.
- Roofline: per kernel, ``max(flops / (peak * COMPUTE_EFFICIENCY), bytes / (bandwidth *
  MEMORY_EFFICIENCY)) + LAUNCH_OVERHEAD``. fp32 convolutions use the TF32 peak (cuDNN's
  default ``allow_tf32=True``), fp32 matmuls the fp32 peak (PyTorch's default).
- CPU constants: a least-squares fit (of the relative error) of the measured step time
  on the roofline's compute part, memory part, kernel count and a constant, over the
  1,218 fp32 CPU configurations of the first CPU collection (``data/archive/cpu-first``:
  a shared 2-core EPYC container, 1 torch thread, on a host that ran whole steps about
  twice as slowly as when ``data/cpu`` was measured again; feature version 12, whose CPU
  dry run steps the optimizer one tensor at a time, ten-odd kernels per tensor for Adam):
  compute ran at 0.26 of the assumed peak, memory at 0.30 of the assumed bandwidth, 20 µs
  per kernel (eager dispatch + autograd) and 1 ms per step; 27% mean error on those rows.
  (Fitted on 304 configurations with the multi-tensor optimizer step in the trace, they
  were 0.22, 0.19, 45 µs and 2 ms.) That is one machine at one time: the learned step
  model, the online refit and ``costaware calibrate`` learn the user's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from costaware.core.allocator import replay
from costaware.core.flops import CONV, VIEW
from costaware.core.sharding import collective_time
from costaware.core.trace import Trace, exact_live_peak
from costaware.devices import Device
from costaware.spec import TrainingSpec

__all__ = [
    "ALLREDUCE_EFFICIENCY",
    "ALLREDUCE_LATENCY_S",
    "BENCHMARK_NOTE",
    "COMPUTE_EFFICIENCY",
    "CUBLAS_OPS",
    "CUBLAS_WORKSPACE_BYTES",
    "INTERCONNECT_BANDWIDTH",
    "LAUNCH_OVERHEAD_S",
    "MEMORY_EFFICIENCY",
    "ROOFLINE_UNDER",
    "WORKSPACE_BYTES",
    "AnalyticEstimate",
    "allreduce_time",
    "calls_cublas",
    "estimate",
    "time_upper",
    "workspace_bytes",
]

MiB = 2**20
#: what a CUDA step allocates besides its tensors, whatever it runs (cuDNN's handles and
#: small workspaces; see the module docstring)
WORKSPACE_BYTES = 6 * MiB
#: cuBLAS's workspace, allocated through the caching allocator at a process's first
#: cuBLAS call on a stream and kept until ``torch._C._cuda_clearCublasWorkspaces()``
CUBLAS_WORKSPACE_BYTES = 65 * MiB
#: aten ops whose CUDA kernels PyTorch runs through cuBLAS or cuBLASLt (a fused attention
#: kernel, a convolution and an RNN go through their own libraries)
CUBLAS_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "addbmm",
        "matmul",
        "linear",
        "_scaled_mm",
        "mv",
        "addmv",
        "dot",
        "vdot",
        "_addmm_activation",
        "addr",
    }
)
BENCHMARK_NOTE = (
    "cudnn.benchmark on a conv net: the peak is what the step needs; the first step's "
    "algorithm search may briefly take more, up to the free memory (PyTorch sizes its "
    "workspace to what is free and backs off rather than run out)"
)
#: achieved share of the device's peak FLOP/s and bandwidth, per device kind (see above)
COMPUTE_EFFICIENCY = {"cuda": 0.6, "cpu": 0.26}
MEMORY_EFFICIENCY = {"cuda": 0.75, "cpu": 0.30}
LAUNCH_OVERHEAD_S = {
    "cuda": 5e-6,
    "cpu": 2e-5,
}  # CPU: eager dispatch + autograd per op (fitted on the first CPU collection, see above)
#: fixed per-step cost outside kernels (Python, optimizer bookkeeping, loader hand-off)
STEP_OVERHEAD_S = {"cuda": 2e-3, "cpu": 1e-3}
#: the roofline ran -59%..+47% against measured step times on an H200: its heuristic upper
#: bound is the roofline divided by (1 - ROOFLINE_UNDER) (see :func:`time_upper`)
ROOFLINE_UNDER = 0.59


#: Assumed bandwidth, bytes/s in each direction, of the link between two devices of one
#: machine that DDP's all-reduce runs over, by catalog device (the datasheets' figures):
#: NVLink for SXM parts (B200 NVLink 5: 1,800 GB/s both ways; H100/H200/GH200 NVLink 4:
#: 900; A100 NVLink 3: 600; V100 NVLink 2: 300), PCIe for the others (gen 5 x16 for the
#: H100 PCIe and the RTX 5090, gen 4 x16 for Ampere and Ada cards, the RTX A6000 without
#: its NVLink bridge, gen 3 x16 for the T4), and, for processes on one CPU, gloo over the
#: loopback (an assumption, not a datasheet figure). A device without a figure here (one
#: of the user's own) takes PCIe 4.
INTERCONNECT_BANDWIDTH = {
    "B200": 900e9, "H100-SXM": 450e9, "H200": 450e9, "GH200": 450e9,
    "A100-40GB": 300e9, "A100-80GB": 300e9, "V100": 150e9, "V100-16GB": 150e9,
    "H100-PCIe": 64e9, "RTX-5090": 64e9, "A100-40GB-PCIe": 32e9, "A100-80GB-PCIe": 32e9,
    "A10": 32e9, "A10G": 32e9, "RTX-A6000": 32e9, "RTX-3090": 32e9, "L4": 32e9, "L40": 32e9,
    "L40S": 32e9, "RTX-4090": 32e9, "T4": 16e9,
    "CPU": 2e9,
}  # fmt: skip
#: the share of that bandwidth a ring all-reduce achieves (assumed), and its cost per
#: bucket besides the bytes (launch and synchronisation; assumed)
ALLREDUCE_EFFICIENCY = 0.8
ALLREDUCE_LATENCY_S = 5e-5


def allreduce_time(trace: Trace, spec: TrainingSpec, device: Device) -> tuple[float, float]:
    """``(total, exposed)`` seconds of DDP's gradient all-reduce per micro-batch step of
    ``spec`` on ``device`` (0 without DDP).

    A ring all-reduce of ``b`` bytes over ``n`` ranks moves ``2 (n - 1) / n * b`` bytes
    through each rank's link (:data:`INTERCONNECT_BANDWIDTH` at
    :data:`ALLREDUCE_EFFICIENCY`), plus :data:`ALLREDUCE_LATENCY_S` per bucket; with
    gradient accumulation it runs once per optimizer step. DDP all-reduces each bucket as
    soon as its gradients are ready, during the backward: the assumption is that all of
    it overlaps with the backward's kernels but the last bucket's (taken as a whole
    ``bucket_cap_mb``), and what does not fit in the backward's roofline time. No
    multi-device time has been measured: these are assumptions, not a fit.
    """
    n, grads = spec.world_size, trace.gradient_bytes
    if spec.sharding is not None:  # all-gathers and reduce-scatters instead
        return _sharded_time(trace, spec, device)
    if n <= 1 or grads <= 0:
        return 0.0, 0.0
    cap = int(spec.bucket_cap_mb * 2**20)
    link = INTERCONNECT_BANDWIDTH.get(device.name, 32e9) * ALLREDUCE_EFFICIENCY

    def seconds(nbytes: float, buckets: int) -> float:
        return 2 * (n - 1) / n * nbytes / link + buckets * ALLREDUCE_LATENCY_S

    total = seconds(grads, 1 + max(0, -(-(grads - 2**20) // cap)))
    kernel = (trace.node_class != VIEW) & (trace.node_phase == 1)
    t_compute, t_memory = node_seconds(
        trace.node_flops, trace.node_bytes, trace.node_dtype, trace.node_class, device
    )
    backward = float(np.where(kernel, np.maximum(t_compute, t_memory), 0.0).sum())
    backward /= min(spec.grad_accumulation, 2)
    last = seconds(min(grads, cap), 1)
    exposed = min(total, last + max(0.0, total - last - backward))
    return total / spec.grad_accumulation, exposed / spec.grad_accumulation


def _sharded_time(trace: Trace, spec: TrainingSpec, device: Device) -> tuple[float, float]:
    """``(total, exposed)`` seconds per micro-batch step of one rank's all-gathers and
    reduce-scatters under sharded training (:func:`costaware.core.sharding.collective_time`,
    on the link of :data:`INTERCONNECT_BANDWIDTH` at :data:`ALLREDUCE_EFFICIENCY`)."""
    link = INTERCONNECT_BANDWIDTH.get(device.name, 32e9) * ALLREDUCE_EFFICIENCY
    t_compute, t_memory = node_seconds(
        trace.node_flops, trace.node_bytes, trace.node_dtype, trace.node_class, device
    )
    bound = np.where(trace.node_class != VIEW, np.maximum(t_compute, t_memory), 0.0)
    micro = min(spec.grad_accumulation, 2)
    forward = float(bound[trace.node_phase == 0].sum()) / micro
    backward = float(bound[trace.node_phase == 1].sum()) / micro
    return collective_time(
        trace.collectives, spec.world_size, link, ALLREDUCE_LATENCY_S, forward, backward,
        spec.grad_accumulation,
    )  # fmt: skip


def time_upper(seconds: float) -> float:
    """The heuristic upper bound of a roofline time (no learned model to calibrate one)."""
    return seconds / (1 - ROOFLINE_UNDER)


@dataclass(frozen=True)
class AnalyticEstimate:
    """The analytic figures for one spec on one device (bytes and seconds)."""

    live_peak: int
    allocated: int
    reserved: int
    reserved_upper: int
    allocator_segments: int
    iteration_time: float
    compute_time: float
    memory_time: float
    overhead_time: float
    notes: tuple[str, ...] = field(default=())
    #: of ``allocated`` and ``reserved``: the workspaces (:func:`workspace_bytes`)
    workspace: int = 0
    #: the smallest capacity the step runs in (:func:`~costaware.core.allocator.min_capacity`,
    #: workspaces included): between ``allocated`` and ``reserved``. On a CPU, the peak
    min_capacity: int = 0
    #: DDP's all-reduce (sharded training's all-gathers and reduce-scatters) per
    #: micro-batch step not hidden behind the compute
    #: (:func:`allreduce_time`; 0 without DDP), not part of ``iteration_time``
    exposed_allreduce: float = 0.0


def calls_cublas(trace: Trace) -> bool:
    """Whether the traced step runs an op of :data:`CUBLAS_OPS`."""
    return any(op in CUBLAS_OPS for _, op in trace.graph.nodes(data="op"))


def workspace_bytes(trace: Trace, device: Device) -> int:
    """Bytes the step allocates on ``device`` besides its tensors: cuBLAS's workspace
    where it calls cuBLAS, and :data:`WORKSPACE_BYTES`; 0 on a CPU."""
    if device.kind != "cuda":
        return 0
    return WORKSPACE_BYTES + (CUBLAS_WORKSPACE_BYTES if calls_cublas(trace) else 0)


def node_seconds(
    flops: np.ndarray, nbytes: np.ndarray, dtype: np.ndarray, cls: np.ndarray, device: Device
) -> tuple[np.ndarray, np.ndarray]:
    """Per-node (compute-bound, memory-bound) roofline seconds on ``device``, launch not
    included. ``dtype`` and ``cls`` are the trace's codes (see :class:`~costaware.core.trace.Trace`);
    the peak is the dtype's, TF32 for fp32 convolutions."""
    fp32 = device.peak_flops("fp32")
    tf32 = device.peak_flops("fp32", allow_tf32=True)
    by_dtype = np.array(
        [fp32, device.peak_flops("bf16"), device.peak_flops("fp16"), fp32 / 2, fp32],
        dtype=np.float64,
    )
    peaks = np.where((cls == CONV) & (dtype == 0), tf32, by_dtype[np.clip(dtype, 0, 4)])
    t_compute = flops / (peaks * COMPUTE_EFFICIENCY[device.kind])
    t_memory = nbytes / (device.bandwidth * MEMORY_EFFICIENCY[device.kind])
    return t_compute, t_memory


def roofline_time(
    trace: Trace, spec: TrainingSpec, device: Device
) -> tuple[float, float, float, float]:
    """Seconds per micro-batch step: (total, compute-bound part, memory-bound part, overhead)."""
    kind = device.kind
    kernel = (trace.node_class != VIEW) & (trace.node_phase != 3)
    t_compute, t_memory = node_seconds(
        trace.node_flops, trace.node_bytes, trace.node_dtype, trace.node_class, device
    )
    bound = np.maximum(t_compute, t_memory)
    per_node = np.where(kernel, bound + LAUNCH_OVERHEAD_S[kind], 0.0)
    micro = min(spec.grad_accumulation, 2)
    fb = trace.node_phase <= 1
    opt = trace.node_phase == 2
    step = float(per_node[fb].sum()) / micro + float(per_node[opt].sum()) / spec.grad_accumulation
    overhead = STEP_OVERHEAD_S[kind] / spec.grad_accumulation
    compute_part = float(np.where(kernel & (t_compute >= t_memory), bound, 0.0).sum()) / micro
    memory_part = float(np.where(kernel & (t_compute < t_memory), bound, 0.0).sum()) / micro
    return step + overhead, compute_part, memory_part, overhead


def estimate(trace: Trace, spec: TrainingSpec, device: Device) -> AnalyticEstimate:
    """Allocator-simulated peak and roofline time of ``trace`` on ``device``."""
    notes: list[str] = []
    if device.kind == "cpu":
        allocated = reserved = capacity = exact_live_peak(trace.allocator_events())
        segments = workspace = 0
        upper = int(reserved * 1.25)
        notes.append("CPU: no caching allocator; the peak is the live-tensor peak, unrounded")
    else:
        # the replay is the device's allocator's whatever the device: done once per step
        sim, fitting = replay(trace.allocator_events(), spec.allocator)
        workspace = workspace_bytes(trace, device)
        allocated = sim.peak_allocated + workspace
        reserved = sim.peak_reserved + workspace
        # the workspaces are held throughout: they take their bytes off any capacity
        capacity = fitting + workspace
        segments = sim.num_segments
        # H200 cross-check: reserved ran up to 1.75x allocated with the default allocator
        upper = int(reserved * (1.25 if spec.allocator == "default" else 1.1))
        if spec.cudnn_benchmark and trace.layer_counts.get("conv", 0) > 0:
            notes.append(BENCHMARK_NOTE)
    total, compute, memory, overhead = roofline_time(trace, spec, device)
    comm, exposed = allreduce_time(trace, spec, device)
    link = INTERCONNECT_BANDWIDTH.get(device.name)
    where = f"{link / 1e9:g} GB/s" if link else "32 GB/s (PCIe 4: no link figure for this device)"
    if spec.sharding is not None:
        notes.append(
            f"sharded ({spec.sharding}) over {spec.world_size} rank"
            f"{'s' if spec.world_size != 1 else ''}, per rank: the memory "
            "holds the rank's shards and the gathered units; the time adds the all-gathers "
            f"and reduce-scatters not hidden behind the compute, {exposed * 1e3:.3g} ms of "
            f"{comm * 1e3:.3g} ms, at an assumed {where} link ({ALLREDUCE_EFFICIENCY:.0%} "
            "achieved) with all but the forward's first gather and the backward's last "
            "reduce-scatter overlapping the compute: an assumption, not measured on "
            "several devices"
        )
    elif spec.world_size > 1:
        notes.append(
            f"DDP over {spec.world_size} ranks, per rank: the memory holds DDP's gradient "
            f"buckets (bucket_cap_mb={spec.bucket_cap_mb:g}); the time adds the all-reduce "
            f"not hidden behind the backward, {exposed * 1e3:.3g} ms of {comm * 1e3:.3g} ms, "
            f"at an assumed {where} link ({ALLREDUCE_EFFICIENCY:.0%} achieved) with all but "
            "the last bucket overlapping the backward: an assumption, not measured on "
            "several devices"
        )
    return AnalyticEstimate(
        live_peak=trace.peak_live,
        allocated=int(allocated),
        reserved=int(reserved),
        reserved_upper=int(max(upper, reserved)),
        allocator_segments=segments,
        iteration_time=total,
        compute_time=compute,
        memory_time=memory,
        overhead_time=overhead,
        notes=tuple(notes),
        workspace=workspace,
        min_capacity=int(capacity),
        exposed_allreduce=exposed,
    )
