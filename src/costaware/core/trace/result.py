"""What a dry run returns: the :class:`Trace`, its memory categories, and the live-bytes
timeline computed from its allocation and free events.

The timeline rounds each storage to 512 B, as the CUDA caching allocator does
(:attr:`Trace.peak_live`); :func:`exact_live_peak` keeps every block at its own size, as
a CPU's allocator holds them.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

#: The note of a prediction for a model that ``torch.compile`` runs: the dry run traces the
#: module it wraps, in eager mode.
COMPILED_NOTE = (
    "torch.compile: the model runs compiled, but these figures are those of eager mode "
    "(the dry run traces the module torch.compile wraps). A compiled step fuses kernels and "
    "chooses what it saves for the backward, so it often runs faster, and may need less "
    "memory, than predicted"
)

#: Categories of live memory in :attr:`Trace.peak_breakdown`.
CATEGORIES = (
    "parameters",
    "buffers",
    "inputs",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
)

#: the CUDA caching allocator's smallest block, which every storage is rounded up to
_MIN_BLOCK = 512
#: category -> its code in :attr:`Trace.event_category`
_CAT_CODE = {name: i for i, name in enumerate(CATEGORIES)}


def _round(n: int) -> int:
    """``n`` bytes as the CUDA caching allocator holds them: rounded up to 512 B."""
    return 0 if n <= 0 else _MIN_BLOCK * ((n + _MIN_BLOCK - 1) // _MIN_BLOCK)


@dataclass
class Trace:
    """What one dry run recorded. Sizes are bytes, FLOPs are per optimizer step."""

    batch_size: int
    graph: nx.DiGraph
    #: ``(key, nbytes)`` in time order; ``nbytes == -1`` frees the storage ``key``.
    events: np.ndarray
    #: live bytes (512-B rounded) after each event
    timeline: np.ndarray
    peak_live: int
    peak_breakdown: dict[str, int]
    phase_peaks: dict[str, int]
    flops_forward: float
    flops_backward: float
    flops_optimizer: float
    bytes_moved: float
    param_count: int
    param_bytes: int
    buffer_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    input_bytes: int
    op_counts: Counter[str]
    #: per graph node (one step): FLOPs, bytes moved, op class (see costaware.core.flops),
    #: dtype code (0 fp32, 1 bf16, 2 fp16, 3 fp64, 4 other), phase (0 forward,
    #: 1 backward, 2 optimizer, 3 optimizer-state initialisation, step 1 only) and the
    #: time steps the kernel runs in sequence (a fused recurrent layer's T, forward or
    #: backward; 1 for every other op: a step of T small GEMMs takes about T times one
    #: of them, whatever the FLOPs, so the op model needs T)
    node_flops: np.ndarray
    node_bytes: np.ndarray
    node_class: np.ndarray
    node_dtype: np.ndarray
    node_phase: np.ndarray
    node_serial: np.ndarray
    #: per event: the storage's category code (index into CATEGORIES)
    event_category: np.ndarray
    #: per event: whether the storage grows with the batch (inputs, activations and
    #: their gradients), used to rescale this trace to another batch size
    event_scales: np.ndarray
    #: (event index, phase) where each phase of the two steps starts
    marks: list[tuple[int, str]]
    build: str
    duration_s: float
    op_signature: str
    layer_counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: ``(event index, nbytes, fixed)``: a block that the step allocates and frees again
    #: just before that event, outside any storage the trace sees, ``fixed`` of its bytes
    #: the same at every batch size (:mod:`costaware.core.trace.transients`): cuDNN's
    #: convolution-backward block and recurrent-backward work space in a trace for a GPU,
    #: the im2col columns of PyTorch's own convolution and oneDNN's LSTM buffers in one
    #: for a CPU
    transients: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), dtype=np.int64))
    #: parameter tensors the optimizer steps (those that got a gradient): each costs the
    #: CPU an autograd gradient accumulation and a share of every ``_foreach`` op
    param_tensors: int = 0
    #: elements of the parameters the optimizer steps (0 in a trace from before it was
    #: recorded: :attr:`param_count` stands in)
    stepped_numel: int = 0
    #: one rank of sharded training: ``(phase, kind, unsharded bytes)`` of each all-gather
    #: and reduce-scatter of one micro-batch step, in order
    #: (:attr:`costaware.core.sharding.ShardedStep.collectives`); empty otherwise
    collectives: tuple[tuple[str, str, int], ...] = ()

    @property
    def flops(self) -> float:
        return self.flops_forward + self.flops_backward + self.flops_optimizer

    def allocator_events(self) -> np.ndarray:
        """:attr:`events` as the device's allocator sees them: each of :attr:`transients`
        allocated and freed again just before its event, under a key of its own."""
        if not len(self.transients):
            return self.events
        pos, nbytes = self.transients[:, 0], self.transients[:, 1]
        first = int(self.events[:, 0].max(initial=-1)) + 1
        keys = np.repeat(np.arange(first, first + len(pos), dtype=np.int64), 2)
        sizes = np.stack([nbytes, np.full_like(nbytes, -1)], axis=1).ravel()
        return np.insert(self.events, np.repeat(pos, 2), np.stack([keys, sizes], axis=1), axis=0)

    def summary(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "peak_live": self.peak_live,
            "peak_breakdown": dict(self.peak_breakdown),
            "flops": self.flops,
            "param_count": self.param_count,
            "param_tensors": self.param_tensors,
            "graph_nodes": self.graph.number_of_nodes(),
            "graph_edges": self.graph.number_of_edges(),
            "build": self.build,
            "duration_s": round(self.duration_s, 4),
        }


def _memory_profile(
    events: np.ndarray, category: np.ndarray, marks: list[tuple[int, str]]
) -> tuple[np.ndarray, int, dict[str, int], dict[str, int]]:
    """Live-bytes timeline, its peak, the peak's breakdown by category, and phase peaks."""
    delta = _signed_rounded(events)
    timeline = np.cumsum(delta)
    if not len(timeline):
        return timeline, 0, dict.fromkeys(CATEGORIES, 0), {}
    idx = int(np.argmax(timeline))
    upto, cats = delta[: idx + 1], category[: idx + 1]
    breakdown = {name: int(upto[cats == code].sum()) for code, name in enumerate(CATEGORIES)}
    phase_peaks: dict[str, int] = {}
    bounds = [*marks, (len(timeline), "end")]
    for (start, name), (stop, _) in itertools.pairwise(bounds):
        if stop > start and name in ("forward", "backward", "optimizer"):
            phase_peaks[name] = max(phase_peaks.get(name, 0), int(timeline[start:stop].max()))
    return timeline, int(timeline[idx]), breakdown, phase_peaks


def exact_live_peak(events: np.ndarray) -> int:
    """The live-bytes peak of ``events`` with every block at its own size, as a CPU's
    allocator holds them (:attr:`Trace.peak_live` rounds each to 512 B, as a CUDA
    caching allocator does: a model of many small tensors, its norms' weights and their
    gradients and optimizer states, is over-counted on a CPU; a DenseNet-121 of growth
    rate 4 at batch 2 by 27%)."""
    if not len(events):
        return 0
    return max(0, int(np.cumsum(_signed_rounded(events, block=1)).max()))


def _signed_rounded(events: np.ndarray, block: int = _MIN_BLOCK) -> np.ndarray:
    """Per-event change of live bytes (``block``-rounded, 512 B by default), vectorised."""
    keys, sizes = events[:, 0], events[:, 1]
    rounded = np.where(sizes > 0, block * ((sizes + block - 1) // block), 0)
    delta = rounded.copy()
    frees = np.nonzero(sizes < 0)[0]
    if len(frees):
        allocs = np.nonzero(sizes > 0)[0]
        # the matching allocation of each free is the latest earlier one with its key
        order = np.lexsort((allocs, keys[allocs]))
        a_keys, a_idx = keys[allocs][order], allocs[order]
        pos = np.searchsorted(a_keys, keys[frees], side="right") - 1
        # (keys are never reused within a trace, so this is a direct hit)
        delta[frees] = -rounded[a_idx[pos]]
    return delta
