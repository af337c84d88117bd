"""Op-level time model: per-op timings learned, then summed over a traced step.

Habitat / PreNeT style. :mod:`costaware.measure.opbench` times individual operations (conv,
linear/matmul, bmm, attention, norms, elementwise, pooling, embedding, LSTM, optimizer
steps) over many random shapes on a GPU, or on a CPU. :class:`OpTimeModel` learns
``log seconds`` of one kernel from what a dry run knows about a graph node: its operator
group (the NSM groups of :mod:`costaware.core.features`), its phase (forward, backward,
optimizer), dtype, FLOPs, bytes, arithmetic intensity and the time steps it runs in
sequence (a fused recurrent layer's T; see :attr:`costaware.core.trace.Trace.node_serial`).
:meth:`OpTimeModel.step_features` sums the predictions over a trace's kernel nodes, the
way :func:`costaware.core.analytic.roofline_time` sums roofline times, and returns them as
features of the whole-model cost model.

A node whose group has no op data is costed by the elementwise (memory-bound) model from
its bytes. One model's op data comes from one device, and a model is fitted per device
kind (:func:`fit_op_models`): another device of the same kind is scaled by the ratio of
its roofline time to the measured one's (where op data of several GPUs is given, the one
with the most timings is learned), and a device of another kind gets NaN features.

The model is saved as a CatBoost ``.cbm`` file (no pickle).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from costaware.core.flops import MEMORY, VIEW
from costaware.core.trace import Trace
from costaware.devices import device_kind, get_device

__all__ = [
    "MIN_OP_SAMPLES",
    "OPTIME_FEATURES",
    "OPTIMIZER_STEP",
    "NodeTable",
    "OpTimeModel",
    "catalog_device",
    "fit_op_models",
    "node_table",
    "op_rows_digest",
    "op_samples",
    "optimizer_step_row",
    "preferred_op_rows",
]

#: (op name, phase code, dtype code, op class, flops, bytes, serial steps, count) per
#: distinct kernel node
NodeTable = list[tuple[str, int, int, int, float, float, int, int]]


#: the op name of a node table's summary of the optimizer step (:func:`node_table`)
OPTIMIZER_STEP = "optimizer_step"
_DTYPE_BYTES = {0: 4, 1: 2, 2: 2}


def node_table(trace: Trace) -> NodeTable:
    """The trace's kernel nodes (not views, not optimizer-state initialisation), compacted.

    Identical (op, phase, dtype, class, flops, bytes, serial steps) nodes are merged with
    a count: a deep network repeats the same layers, so the table is far smaller than the
    graph. Where the step has an optimizer, one more row, :data:`OPTIMIZER_STEP` with
    count 0 (it is no kernel of its own), describes the whole step as opbench times one
    (:func:`optimizer_step_row`).
    """
    ops = [trace.graph.nodes[i]["op"] for i in range(trace.graph.number_of_nodes())]
    kernel = (trace.node_class != VIEW) & (trace.node_phase != 3)
    counts: dict[tuple[str, int, int, int, float, float, int], int] = {}
    for i in np.nonzero(kernel)[0].tolist():
        key = (
            ops[i],
            int(trace.node_phase[i]),
            int(trace.node_dtype[i]),
            int(trace.node_class[i]),
            float(trace.node_flops[i]),
            float(trace.node_bytes[i]),
            int(trace.node_serial[i]),
        )
        counts[key] = counts.get(key, 0) + 1
    table: NodeTable = [(*k, n) for k, n in counts.items()]
    step = optimizer_step_row(trace, table)
    return table if step is None else [*table, step]


def optimizer_step_row(
    trace: Trace, table: NodeTable
) -> tuple[str, int, int, int, float, float, int, int] | None:
    """The optimizer step as opbench describes its cases: FLOPs and bytes of the ideal
    (fused) update over the stepped parameters, and the tensors as its serial steps.

    Opbench's optimizer samples carry an analytic count (SGD with momentum 3 FLOPs and
    5 element reads and writes per parameter; Adam 12 FLOPs and 7), where a trace's
    optimizer nodes are elementwise ops without FLOPs whose bytes count every pass: a
    CPU's single-tensor Adam moves 76 bytes per fp32 parameter, in about ten ops. Fed
    the trace's sums, the op model put the Adam step of a 2.1M-parameter CNN at 1.4 ms on
    the corpus CPU; the same step runs 4.9 ms alone on this kind of 2-core machine. The update is priced here by
    the optimizer state per parameter, so an optimizer without op cases of its own gets
    the nearest: under two states per parameter SGD's count, else Adam's. None without
    optimizer nodes.
    """
    opt = [t for t in table if t[1] == 2]
    if not opt:
        return None
    dcode = opt[int(np.argmax([t[5] * t[7] for t in opt]))][2]
    numel = trace.stepped_numel or trace.param_count
    if numel <= 0:
        return None
    esz = _DTYPE_BYTES.get(dcode, 4)
    states = round(trace.optimizer_state_bytes / (numel * esz))
    flops = (3.0 if states < 2 else 12.0) * numel
    nbytes = float((3 + 2 * max(states, 1)) * esz * numel)
    return (OPTIMIZER_STEP, 2, dcode, MEMORY, flops, nbytes, max(trace.param_tensors, 1), 0)


#: opbench op -> (forward group, backward group); the groups are the NSM groups of
#: costaware.core.features, plus "optimizer" for a whole optimizer step
OPBENCH_GROUPS: dict[str, tuple[str, str]] = {
    "conv2d": ("conv", "conv_bwd"),
    "linear": ("matmul", "matmul"),
    "matmul": ("matmul", "matmul"),
    "bmm": ("matmul", "matmul"),
    "sdpa": ("attention", "attention_bwd"),
    "layer_norm": ("layer_norm", "layer_norm_bwd"),
    "group_norm": ("layer_norm", "layer_norm_bwd"),
    "batch_norm": ("batch_norm", "batch_norm_bwd"),
    "softmax": ("softmax", "softmax_bwd"),
    "cross_entropy": ("loss", "loss_bwd"),
    "add": ("add", "add"),
    "mul": ("mul", "mul"),
    "relu": ("activation", "activation_bwd"),
    "gelu": ("activation", "activation_bwd"),
    "silu": ("activation", "activation_bwd"),
    "dropout": ("dropout", "dropout"),
    "embedding": ("embedding", "embedding_bwd"),
    "lstm": ("rnn", "rnn"),
    "max_pool2d": ("pool", "pool_bwd"),
    "avg_pool2d": ("pool", "pool_bwd"),
    "adaptive_avg_pool2d": ("pool", "pool_bwd"),
    "sgd": ("optimizer", "optimizer"),
    "adam": ("optimizer", "optimizer"),
    "adamw": ("optimizer", "optimizer"),
}
#: the groups the op model knows, in feature order (the index is a feature)
GROUPS: tuple[str, ...] = tuple(sorted({g for pair in OPBENCH_GROUPS.values() for g in pair}))
_GROUP_INDEX = {g: i for i, g in enumerate(GROUPS)}
#: a node of a group without op data is costed as this memory-bound group, by its bytes
FALLBACK_GROUP = "add"
_DTYPES = {"fp32": 0, "bf16": 1, "fp16": 2}
#: Every opbench time of schema 1 (``timer`` "cuda_event") carries the harness's own
#: cost: a timed Python call around one kernel (forward) or one ``backward()`` through
#: the autograd engine, issued to an idle GPU. Their floors, about 0.9x the 2nd percentile
#: of the H100 op rows (fwd 19.8 us, bwd 81.6 us), are taken off so that the model learns
#: the kernel time; a traced node adds the analytic launch overhead instead. Optimizer
#: steps keep theirs: their Python bookkeeping is real. Held timings (``timer``
#: "cuda_held", opbench schema 2) time the GPU's work alone and keep every microsecond.
HARNESS_FLOOR_S = {0: 18e-6, 1: 75e-6, 2: 0.0}
#: A CPU's opbench times (``timer`` "perf_counter") are the op's whole call, and a CPU
#: step is such calls one after another: a forward's call is kept. A backward sample is
#: one ``backward()`` through the autograd engine, whose set-up a step pays once, not per
#: node: about 0.9x the 2nd percentile of the cheapest backward ops on the corpus machine
#: (relu, softmax, max-pool: 41-45 us, 1 thread) is taken off.
CPU_HARNESS_FLOOR_S = {0: 0.0, 1: 38e-6, 2: 0.0}
#: the opbench timer of a CPU's op rows
CPU_TIMER = "perf_counter"
#: the opbench timer whose samples are the GPU's own time (no harness floor to take off)
HELD_TIMER = "cuda_held"
MIN_KERNEL_S = 1e-6
#: the fewest usable kernel timings the op model is fitted on
MIN_OP_SAMPLES = 10
#: the names step_features returns (NaN on a device of another kind than the op data's)
OPTIME_FEATURES = (
    "optime_ms",
    "optime_fwd_ms",
    "optime_bwd_ms",
    "optime_opt_ms",
    "optime_fallback_frac",
    "log_optime",
    "optime_over_analytic",
    "optime_kernel_ms",
    "kernels_fwd",
    "kernels_bwd",
    "kernels_opt",
)
#: Groups whose backward nodes are the forward group's kernels. Autograd runs a linear's or
#: a matmul's backward as two ``mm`` nodes, an add's or a mul's as elementwise kernels (and
#: ops without op data fall back to "add"). Opbench's backward time of those ops is the
#: whole ``backward()``: both kernels and the autograd engine's overhead, timed as one
#: sample. Costing every backward ``mm`` as such a sample counted the harness about twice
#: per linear layer: the op sum of the H100 BERT and random-transformer rows came out a
#: median 1.53x and 1.74x their measured steps, and 0.95x and 1.07x with these nodes
#: costed by the forward model of their group: the same kernel.
FORWARD_KERNEL_GROUPS = ("matmul", "add", "mul")
_FORWARD_KERNEL_INDEX = [_GROUP_INDEX[g] for g in FORWARD_KERNEL_GROUPS]


def _x(group: Any, phase: Any, dtype: Any, flops: Any, nbytes: Any, serial: Any) -> np.ndarray:
    """The op model's feature matrix: group, phase, dtype, log FLOPs, log bytes, log
    intensity, log serial steps.

    The serial steps are what FLOPs cannot tell apart: a recurrent layer over T steps runs
    T small GEMMs one after another, so with the same FLOPs a longer sequence of a smaller
    batch takes longer. ``docs/predictions.md`` ("A recurrent kernel's time steps") measures
    what they change.
    """
    f = np.asarray(flops, dtype=np.float64)
    b = np.asarray(nbytes, dtype=np.float64)
    return np.column_stack(
        [
            np.asarray(group, dtype=np.float64),
            np.asarray(phase, dtype=np.float64),
            np.asarray(dtype, dtype=np.float64),
            np.log10(f + 1.0),
            np.log10(b + 1.0),
            np.log10((f + 1.0) / (b + 1.0)),
            np.log10(np.maximum(np.asarray(serial, dtype=np.float64), 1.0)),
        ]
    )


def catalog_device(row: dict[str, Any]) -> str:
    """The device-catalog name of a row's device ("CPU" for CPU rows, the GPU's entry else).

    Raises ``UnknownDeviceError`` for a GPU that is not in the catalog.
    """
    if not str(row.get("device", "cpu")).startswith("cuda"):
        return get_device("cpu").name
    return get_device(str(row.get("device_name") or row.get("env", {}).get("gpu"))).name


def _held(row: Mapping[str, Any]) -> bool:
    """Whether an opbench row's times are held timings (the GPU's work alone)."""
    return bool((row.get("times") or {}).get("timer") == HELD_TIMER)


def _harness_floor(row: Mapping[str, Any], phase: int) -> float:
    """Seconds of an opbench sample that are the harness's, not the op's (see
    :data:`HARNESS_FLOOR_S`, :data:`CPU_HARNESS_FLOOR_S`)."""
    if _held(row):
        return 0.0
    if (row.get("times") or {}).get("timer") == CPU_TIMER:
        return CPU_HARNESS_FLOOR_S[phase]
    return HARNESS_FLOOR_S[phase]


def preferred_op_rows(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``rows`` in order, less the unheld row of every case that also has a held one (a
    schema 1 file and its held re-run): the held timing supersedes it."""
    rows = list(rows)
    held = {r.get("id") for r in rows if _held(r)}
    return [r for r in rows if r.get("id") not in held or _held(r)]


def op_samples(rows: Iterable[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """(features, log seconds) of every kernel timing in opbench rows with status "ok".

    A ``fwd+bwd`` row gives a forward and a backward sample, an optimizer ``step`` row one
    optimizer sample. An LSTM case runs its ``T`` time steps in sequence (its serial
    steps), an optimizer step its parameter tensors; every other case one. The harness
    floor is taken off unheld timings (see :data:`HARNESS_FLOOR_S`). A case timed both
    ways (a schema 1 file and its held re-run) gives only its held samples.
    """
    g: list[int] = []
    ph: list[int] = []
    dt: list[int] = []
    fl: list[float] = []
    by: list[float] = []
    se: list[int] = []
    y: list[float] = []
    for r in preferred_op_rows(rows):
        if r.get("kind") != "op" or r.get("status") != "ok" or r.get("op") not in OPBENCH_GROUPS:
            continue
        times = r.get("times") or {}
        fwd_group, bwd_group = OPBENCH_GROUPS[r["op"]]
        dcode = _DTYPES.get(str(r.get("dtype")), 0)
        flops, nbytes = r.get("flops") or {}, r.get("bytes") or {}
        par = r.get("params") or {}
        # serial: a recurrent layer's time steps, an optimizer's tensors (one after another)
        steps = int(par.get("T" if fwd_group == "rnn" else "tensors", 1))
        if fwd_group not in ("rnn", "optimizer"):
            steps = 1
        if fwd_group == "optimizer":
            parts = [(fwd_group, 2, flops.get("step"), nbytes.get("step"), times.get("total_s"))]
        else:
            parts = [(fwd_group, 0, flops.get("fwd"), nbytes.get("fwd"), times.get("fwd_s"))]
            if r.get("direction") == "fwd+bwd":
                parts.append(
                    (bwd_group, 1, flops.get("bwd"), nbytes.get("bwd"), times.get("bwd_s"))
                )
        for group, phase, f, b, t in parts:
            if t is None or f is None or b is None or not t > 0:
                continue
            g.append(_GROUP_INDEX[group])
            ph.append(phase)
            dt.append(dcode)
            fl.append(float(f))
            by.append(float(b))
            se.append(steps)
            floor = _harness_floor(r, phase)
            y.append(math.log(max(float(t) - floor, MIN_KERNEL_S)))
    return _x(g, ph, dt, fl, by, se), np.asarray(y, dtype=np.float64)


def _sample_range(x: np.ndarray) -> dict[str, list[float]]:
    """The largest FLOPs and bytes timed per group, from a :func:`_x` matrix."""
    out: dict[str, list[float]] = {}
    for i, name in enumerate(GROUPS):
        rows = x[x[:, 0] == i]
        if len(rows):
            out[name] = [float(10 ** rows[:, 3].max() - 1.0), float(10 ** rows[:, 4].max() - 1.0)]
    return out


def op_rows_digest(rows: Iterable[Mapping[str, Any]]) -> str:
    """sha256 of the op rows' measured content (id, op, shapes, dtype, direction, times), by id."""
    keep = sorted(

            json.dumps(
                [r.get("id"), r.get("op"), r.get("params"), r.get("dtype"), r.get("direction"),
                 r.get("flops"), r.get("bytes"), r.get("times"), r.get("status")],
                sort_keys=True,
            )
            for r in rows
            if r.get("kind") == "op"

    )  # fmt: skip
    return hashlib.sha256("\n".join(keep).encode()).hexdigest()


@dataclass
class _Arrays:
    group: np.ndarray
    phase: np.ndarray
    dtype: np.ndarray
    cls: np.ndarray
    flops: np.ndarray
    nbytes: np.ndarray
    serial: np.ndarray
    count: np.ndarray
    fallback: np.ndarray


def _arrays(table: NodeTable) -> _Arrays:
    from costaware.core.features import op_group

    fb = [t for t in table if t[1] in (0, 1)]
    step = next((t for t in table if t[0] == OPTIMIZER_STEP), None)
    groups: list[int] = []
    fallback: list[bool] = []
    for t in fb:
        name = op_group(t[0])
        fallback.append(name not in _GROUP_INDEX)
        groups.append(_GROUP_INDEX.get(name, _GROUP_INDEX[FALLBACK_GROUP]))
    rows = [t[1:] for t in fb]  # phase, dtype, class, flops, bytes, serial steps, count
    # the optimizer step is one sample, as opbench describes it (node_table's step row;
    # its optimizer nodes are costed through it, not one by one)
    if step is not None:
        rows.append((2, step[2], 0, step[4], step[5], step[6], 1))
        groups.append(_GROUP_INDEX["optimizer"])
        fallback.append(False)
    a = np.asarray(rows, dtype=np.float64).reshape(-1, 7)
    return _Arrays(
        group=np.asarray(groups, dtype=np.int64),
        phase=a[:, 0].astype(np.int64),
        dtype=a[:, 1].astype(np.int64),
        cls=a[:, 2].astype(np.int64),
        flops=a[:, 3],
        nbytes=a[:, 4],
        serial=a[:, 5],
        count=a[:, 6],
        fallback=np.asarray(fallback, dtype=bool),
    )


def _roofline_nodes(a: _Arrays, device: Any) -> np.ndarray:
    """Per-row roofline seconds on ``device`` (costaware.core.analytic's formula, no launch)."""
    from costaware.core.analytic import node_seconds

    out: np.ndarray = np.maximum(*node_seconds(a.flops, a.nbytes, a.dtype, a.cls, device))
    return out


class OpTimeModel:
    """Per-kernel time from (group, phase, dtype, FLOPs, bytes), learned on one device's
    opbench rows (a GPU's, or a CPU's).

    Args:
        iterations, depth, learning_rate: CatBoost settings.
        random_state, thread_count: CatBoost seed and threads.
    """

    model_: Any
    info_: dict[str, Any]

    def __init__(
        self,
        *,
        iterations: int = 1000,
        depth: int = 8,
        learning_rate: float = 0.08,
        random_state: int = 0,
        thread_count: int = 2,
    ) -> None:
        self.iterations = iterations
        self.depth = depth
        self.learning_rate = learning_rate
        self.random_state = random_state
        self.thread_count = thread_count

    def fit(self, rows: Sequence[Mapping[str, Any]], *, device: str | None = None) -> OpTimeModel:
        """Fit on opbench rows (``kind: "op"``) of one device (a GPU, or a CPU);
        ``device`` is its catalog name."""
        from catboost import CatBoostRegressor

        ops = [r for r in rows if r.get("kind") == "op"]
        x, y = op_samples(ops)
        if len(y) < MIN_OP_SAMPLES:
            raise ValueError(
                f"the op model needs at least {MIN_OP_SAMPLES} op timings, but got {len(y)}."
            )
        if device is None:
            names = {catalog_device(dict(r)) for r in ops if r.get("status") == "ok"}
            if len(names) != 1:
                raise ValueError(
                    f"op rows must come from one device, but they come from {sorted(names)}; "
                    "fit one op model per device kind."
                )
            device = names.pop()
        model = CatBoostRegressor(
            iterations=self.iterations,
            depth=self.depth,
            learning_rate=self.learning_rate,
            loss_function="RMSE",
            random_seed=self.random_state,
            thread_count=self.thread_count,
            verbose=False,
            allow_writing_files=False,
        )
        model.fit(x, y)
        self.model_ = model
        self.info_ = {
            "device": device,
            "rows": len(ops),
            "samples": len(y),
            "data_sha256": op_rows_digest(ops),
            "groups": list(GROUPS),
            # the floor taken off this device's timings (a CPU's or a GPU's schema 1)
            "harness_floor_s": {
                str(k): v
                for k, v in (
                    CPU_HARNESS_FLOOR_S if device_kind(device) == "cpu" else HARNESS_FLOOR_S
                ).items()
            },
            "range": _sample_range(x),
        }
        return self

    @property
    def kind(self) -> str:
        """The kind ("cuda" or "cpu") of the device the op data comes from."""
        return device_kind(self.info_["device"])

    def predict_kernels(self, a: _Arrays) -> np.ndarray:
        """Seconds per row of ``a`` (one kernel each, count not applied), on the op data's
        device.

        A kernel larger than any its group was timed at (more FLOPs or more bytes) is
        predicted at the size where it comes back in range, with its arithmetic intensity
        kept, and scaled up linearly: at the end of the range a kernel runs at its
        steady-state throughput, and more work takes proportionally longer. Trees do not
        extrapolate; without this a kernel 10x past the data came out as fast as the
        largest timed one. Opbench cases stop at 4 GiB, and a GPT's logits (64 x 1024
        tokens over a 50,257-word vocabulary) make 13 GB fp32 loss kernels
        (``docs/predictions.md``, "Kernels larger than any timed", measures the
        scaling). A model saved without the range predicts as it was fitted.
        """
        if not len(a.group):
            return np.zeros(0)
        flops = np.asarray(a.flops, dtype=np.float64)
        nbytes = np.asarray(a.nbytes, dtype=np.float64)
        scale = self._past_range(np.asarray(a.group), flops, nbytes)
        x = _x(
            a.group,
            np.minimum(a.phase, 2),
            np.clip(a.dtype, 0, 2),
            flops / scale,
            nbytes / scale,
            a.serial,
        )
        out: np.ndarray = np.exp(np.asarray(self.model_.predict(x), dtype=np.float64)) * scale
        return out

    def _past_range(self, group: np.ndarray, flops: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Per kernel, how many times past its group's largest timed FLOPs or bytes it is
        (1 within range, and for a group without a recorded range)."""
        known = self.info_.get("range") or {}
        top = np.full((len(GROUPS), 2), np.inf)
        for name, (f, b) in known.items():
            if name in _GROUP_INDEX:
                top[_GROUP_INDEX[name]] = (f if f > 0 else np.inf, b if b > 0 else np.inf)
        over = np.maximum(flops / top[group, 0], nbytes / top[group, 1])
        out: np.ndarray = np.maximum(over, 1.0)
        return out

    def node_times(self, table: NodeTable, device: Any) -> tuple[_Arrays, np.ndarray]:
        """The rows of ``table`` (:func:`_arrays`: the optimizer's nodes as one row) and
        the seconds each row's kernels take on ``device``, counts applied, launch
        overhead not. Backward nodes of :data:`FORWARD_KERNEL_GROUPS` are costed as the
        forward kernels they are; another device of the op data's kind is scaled by the
        ratio of the roofline sums. The caller checks that ``device`` is of this model's
        kind."""

        a = _arrays(table)
        same = np.isin(a.group, _FORWARD_KERNEL_INDEX)
        as_kernels = dataclasses.replace(a, phase=np.where((a.phase == 1) & same, 0, a.phase))
        per = self.predict_kernels(as_kernels) * a.count
        if device.name != self.info_["device"]:
            ref = get_device(self.info_["device"])
            scale = _roofline_nodes(a, device).sum() / max(_roofline_nodes(a, ref).sum(), 1e-12)
            per = per * scale
        return a, per

    def step_features(
        self,
        table: NodeTable,
        device: Any,
        grad_accumulation: int = 1,
        analytic_s: float | None = None,
    ) -> dict[str, float]:
        """The op-sum time of one (micro-batch) step on ``device``, as features.

        Sums predicted kernel times, forward and backward per micro-batch and the
        optimizer step once per ``grad_accumulation`` micro-batches, as
        :func:`costaware.core.analytic.roofline_time` does; on a GPU each kernel also pays the
        analytic launch overhead (a CPU's op timings are whole calls: theirs is in them).
        Backward nodes of :data:`FORWARD_KERNEL_GROUPS` are costed as the forward kernels
        they are. Another device of the op data's kind is scaled by the ratio of the
        roofline sums; a device of another kind (a CPU under a GPU's op model) gets NaN.
        Besides the sums: the kernel time alone (``optime_kernel_ms``) and the kernel
        nodes of each phase (``kernels_fwd``, ``kernels_bwd``, ``kernels_opt``).
        """
        if device.kind != self.kind:
            return nan_features()
        from costaware.core.analytic import LAUNCH_OVERHEAD_S, STEP_OVERHEAD_S

        a, per = self.node_times(table, device)
        gpu = device.kind == "cuda"
        launch = LAUNCH_OVERHEAD_S["cuda"] * a.count if gpu else np.zeros(len(a.count))
        micro = min(grad_accumulation, 2)
        fwd = float((per + launch)[a.phase == 0].sum()) / micro
        bwd = float((per + launch)[a.phase == 1].sum()) / micro
        opt = float(per[a.phase == 2].sum()) / grad_accumulation
        total = fwd + bwd + opt + (STEP_OVERHEAD_S["cuda"] / grad_accumulation if gpu else 0.0)
        fb = a.phase <= 1
        fb_kernels = float(per[fb].sum())
        fall = float(per[fb & a.fallback].sum()) / max(fb_kernels, 1e-12)
        kernel = fb_kernels / micro + opt  # the optimizer's share carries no launch cost
        return {
            "optime_ms": total * 1e3,
            "optime_fwd_ms": fwd * 1e3,
            "optime_bwd_ms": bwd * 1e3,
            "optime_opt_ms": opt * 1e3,
            "optime_fallback_frac": fall,
            "log_optime": math.log(total),
            "optime_over_analytic": total / analytic_s if analytic_s else math.nan,
            # the GPU's own share (no launch or step overhead) and the ops the CPU issues,
            # per micro-batch: what model._Dispatch splits a step into
            "optime_kernel_ms": kernel * 1e3,
            "kernels_fwd": float(a.count[a.phase == 0].sum()) / micro,
            "kernels_bwd": float(a.count[a.phase == 1].sum()) / micro,
            # the optimizer's nodes, each (a.count has its step as one sample)
            "kernels_opt": float(sum(t[7] for t in table if t[1] == 2)) / grad_accumulation,
        }

    # -- persistence ------------------------------------------------------------------------
    def save(self, path: str | Path) -> dict[str, Any]:
        """Write ``path`` (a ``.cbm`` file) and return the manifest entry that describes it."""
        p = Path(path)
        self.model_.save_model(str(p), format="cbm")
        return {"file": p.name, **self.info_, "params": self._params()}

    def _params(self) -> dict[str, Any]:
        return {
            "iterations": self.iterations,
            "depth": self.depth,
            "learning_rate": self.learning_rate,
            "random_state": self.random_state,
            "thread_count": self.thread_count,
        }

    @classmethod
    def load(cls, root: str | Path, entry: Mapping[str, Any]) -> OpTimeModel:
        """Load the model a manifest ``entry`` (from :meth:`save`) describes, from ``root``."""
        from catboost import CatBoostRegressor

        self = cls(**entry.get("params", {}))
        if list(entry.get("groups", GROUPS)) != list(GROUPS):
            from costaware.errors import CostawareError

            raise CostawareError("the saved op model uses another op-group vocabulary; refit it.")
        m = CatBoostRegressor()
        m.load_model(str(Path(root) / entry["file"]), format="cbm")
        self.model_ = m
        self.info_ = {k: v for k, v in entry.items() if k not in ("file", "params")}
        return self


def fit_op_models(
    rows: Iterable[Mapping[str, Any]], **params: Any
) -> tuple[list[OpTimeModel], list[str]]:
    """One :class:`OpTimeModel` per device kind in opbench ``rows`` (a GPU's op rows, a
    CPU's), each fitted on its own rows with ``params``; and what got no model, and why.

    One model's op data comes from one device. Where the rows of one kind come from several
    devices (an H100's op timings and an H200's), the device with the most usable timings
    gives that kind's model, and the other devices' rows are left out and said so: a model
    of the same kind scales its kernel times to another device by the roofline's ratio. A
    kind with fewer than :data:`MIN_OP_SAMPLES` usable timings gets no model.
    """
    by_device: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
    for r in rows:
        if r.get("kind") != "op":
            continue
        name = catalog_device(dict(r))
        by_device.setdefault(device_kind(name), {}).setdefault(name, []).append(r)
    models: list[OpTimeModel] = []
    skipped: list[str] = []
    for kind, devices in sorted(by_device.items()):
        usable = {name: len(op_samples(got)[1]) for name, got in devices.items()}
        # the most timings first; a tie goes to the name that sorts first, so it is stable
        ranked = sorted(devices, key=lambda n: (-usable[n], n))
        name = ranked[0]
        for other in ranked[1:]:
            skipped.append(
                f"{len(devices[other])} {kind} op rows of {other} left out: one op model per "
                f"device kind, and {name}'s has more usable timings ({usable[name]} against "
                f"{usable[other]})"
            )
        if usable[name] < MIN_OP_SAMPLES:
            skipped.append(
                f"{len(devices[name])} {kind} op rows hold {usable[name]} usable timings, fewer "
                f"than {MIN_OP_SAMPLES}: no {kind} op model"
            )
            continue
        # the device is known already: fit need not look every row's name up again
        models.append(OpTimeModel(**params).fit(devices[name], device=name))
    return models, skipped


def nan_features() -> dict[str, float]:
    return dict.fromkeys(OPTIME_FEATURES, math.nan)
