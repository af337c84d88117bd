"""Dry run of one real training step on fake tensors: graph, memory timeline, FLOPs.

The model is built on the ``meta`` device (no memory, any size), its parameters and
buffers are swapped for fake ``cpu`` tensors, and one full training step (forward, loss,
backward, optimizer step, ``zero_grad``) runs under :class:`FakeTensorMode`. A second step,
which holds the optimizer state the first one created as every later step does, is
synthesised from the first step's events rather than run again. A dispatch
mode records every aten op with its shapes, FLOPs and bytes, and every storage's
allocation and release, which gives:

- the operator graph (:class:`networkx.DiGraph`, edges follow storages from producer to
  consumer);
- the live-bytes timeline (each storage rounded to 512 B as the CUDA allocator does) and
  the peak broken down into parameters, buffers, inputs, gradients, optimizer state,
  activations and temporaries;
- the allocation/free event sequence that :mod:`costaware.core.allocator` replays.

Why fake ``cpu`` rather than fake ``cuda``: on a CPU-only build the first autograd op on a
fake CUDA tensor aborts the process with an uncatchable C++ terminate, and on an H200 the
fake-cpu and fake-cuda peaks agreed to 0.2 MiB (see DESIGN.md). CUDA's own kernel choices
are left to the fused attention and RNN modes (which also take the optimizer's multi-tensor
step, where a CPU steps one parameter at a time), the allocator simulation and the learned
residual; the cuDNN work spaces the trace models are the blocks a convolution's backward
and a fused recurrent layer's backward take and free again (:attr:`Trace.transients`). A
trace for a CPU holds the CPU's counterparts there instead: the columns of PyTorch's own
convolution, where it runs one, and oneDNN's LSTM buffers.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import copy
import ctypes
import dataclasses
import functools
import hashlib
import inspect
import itertools
import logging
import math
import os
import re
import sys
import sysconfig
import threading
import time
import traceback
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import networkx as nx
import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from costaware.core.flops import (
    RNN_GATES,
    VIEW,
    count_flops,
    op_class,
    register_flop_formula,
    rnn_backward_formula,
    rnn_formula,
)
from costaware.core.sharding import ShardedStep
from costaware.errors import (
    CostawareError,
    SpecError,
    TraceError,
    TraceTimeout,
    UntraceableModelError,
    UserCodeError,
    first_line,
)
from costaware.spec import (
    ImageBatch,
    TokenBatch,
    TrainingSpec,
    cast_floating,
    check_positions,
    compiled_parts,
    default_loss,
    uncompiled,
)

__all__ = ["ATTENTION_MODES", "CATEGORIES", "COMPILED_NOTE", "Trace", "build_model", "dry_run"]

_T = TypeVar("_T")

#: How the dry run traces ``F.scaled_dot_product_attention`` and recurrent layers: "native"
#: as this CPU build runs them (SDPA's math path, B*H*L*L scores, whenever dropout_p > 0;
#: nn.LSTM/GRU/RNN through oneDNN or unrolled into per-timestep cell ops), "fused" as a
#: CUDA GPU runs them (one flash-attention kernel, no score matrix, no dropout mask; one
#: cuDNN kernel per recurrent layer and pass, with its reserve space).
ATTENTION_MODES = ("native", "fused")

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

_MIN_BLOCK = 512
#: ops whose one argument indexes a dimension of another: op -> (index argument, indexed
#: argument, what is indexed). A real kernel fails on an index past the end; a fake one
#: cannot see values, so the dry run checks the batch's known range against the size.
_INDEXING_OPS = {
    "embedding": (1, 0, "an embedding of {n} rows"),
    "nll_loss_forward": (1, 0, "a cross-entropy over {n} classes"),
    "nll_loss2d_forward": (1, 0, "a cross-entropy over {n} classes"),
}
# Ops that carry no data dependence worth a graph node (about 65% of a raw trace).
_NOISE = frozenset(
    {
        "detach",
        "alias",
        "lift_fresh",
        "lift_fresh_copy",
        "_local_scalar_dense",
        "is_same_size",
        "_to_copy_noop",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
    }
)
_CAT_CODE = {name: i for i, name in enumerate(CATEGORIES)}
_STATE_INIT_OPS = frozenset(
    {"zeros_like", "zeros", "empty", "empty_like", "full", "full_like", "clone"}
)
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float64: 3}


def _round(n: int) -> int:
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
    #: the same at every batch size: cuDNN's convolution-backward block
    #: (:func:`_conv_transient`) and recurrent-backward work space
    #: (:func:`_cudnn_rnn_transient`) in a trace for a GPU, the im2col columns of PyTorch's
    #: own convolution (:func:`_cpu_conv_transient`) and oneDNN's LSTM buffers in one for
    #: a CPU
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


# --------------------------------------------------------------------------------------
# recorder
# --------------------------------------------------------------------------------------
def _conv_transient(args: tuple[Any, ...]) -> int:
    """Bytes of the block cuDNN allocates and frees again in a convolution's backward.

    ``args`` are ``aten.convolution_backward``'s: grad_output, input, weight, ...,
    groups (the tenth). On a GPU, the backward of a convolution whose kernel is larger
    than 1x1 and that is not depthwise takes a block about the size of its input plus its
    output gradient, beyond the gradients it returns. Two sets of H100 measurements show
    it: ``costaware.measure.opbench``'s conv2d rows peak that much above their tensors (median
    1.0x input + output for those convolutions, about 0 for depthwise and 1x1 ones, in
    fp32 and half precision alike), and with this block the simulated reserved peak of
    the collected conv nets went from 5.2% to 4.0% mean error (VGG 7.8% -> 3.9%, U-Net
    8.9% -> 4.5%, both under-predicted before). The block is freed before the next op,
    so it moves the allocated peak little; it shapes the segments the allocator keeps.
    """
    grad_out, inp, weight = args[0], args[1], args[2]
    if not all(isinstance(t, torch.Tensor) for t in (grad_out, inp, weight)) or weight.dim() < 3:
        return 0
    groups = int(args[9]) if len(args) > 9 else 1
    if math.prod(weight.shape[2:]) <= 1 or (groups > 1 and groups == inp.shape[1]):
        return 0
    return _round(inp.numel() * inp.element_size()) + _round(
        grad_out.numel() * grad_out.element_size()
    )


#: bytes per term of :func:`_cudnn_rnn_terms` in cuDNN's recurrent-backward block, fitted
#: on 191 H100 LSTM cases (see :func:`_cudnn_rnn_transient`)
_CUDNN_RNN_COEF = (8.0, 0.615, 0.37, 3.15, 1.07, 20.1)
#: the first terms, which do not grow with the batch
_CUDNN_RNN_FIXED = 3
#: what each term of :func:`_cudnn_rnn_terms` is, for reports
_CUDNN_RNN_TERMS = ("MiB floor", "weights", "fp32 weights", "input", "gates", "state")


def _cudnn_rnn_terms(
    seq: int,
    batch: int,
    inputs: int,
    hidden: int,
    directions: int,
    gates: int,
    weights: int,
    esz: int,
) -> tuple[float, ...]:
    """The terms of cuDNN's recurrent-backward block, in bytes (``_CUDNN_RNN_TERMS``):
    1 MiB, the weights at their precision and at fp32, then the input, the gates and one
    state, which grow with the batch."""
    gate_values = gates * directions * seq * batch * hidden
    return (
        float(1 << 20),
        float(weights * esz),
        float(weights * 4),
        float(seq * batch * inputs * esz),
        float(gate_values * esz),
        float(directions * batch * hidden * esz),
    )


def _cudnn_rnn_transient(args: tuple[Any, ...]) -> tuple[int, int]:
    """Bytes cuDNN's backward of one fused recurrent layer (``costaware::rnn_backward``)
    takes beyond the gradients it returns and the reserve space the forward kept, and the
    bytes of them that do not grow with the batch.

    cuDNN does not publish its work-space sizes. The H100 per-op benchmark
    (``costaware.measure.opbench``'s LSTM cases: one ``nn.LSTM`` layer forward and backward, its
    peak allocation measured) peaked far above the dry run's tensors: a median 3.1x, 8.0
    MiB at the least. Least squares (non-negative, relative) on those 191 cases put the
    difference at the backward at 8 MiB plus 3.15x the input, 1.07x the gates (``gates x T
    x B x H`` values), 0.62x the weights at their own precision plus 0.37x at fp32, and
    20x a ``B x H`` state. Held out by case (5 folds) the peak is then off by 5.1% mean
    (2.4% median) instead of 67% (``benchmarks/op_memory.py``). The opbench has no GRU or
    vanilla-RNN cases: those take the same formula with their own gate count.
    """
    inp, weights, hx = args[0], args[1], args[2]
    if not isinstance(inp, torch.Tensor) or not isinstance(hx, torch.Tensor):
        return 0, 0
    t, b, i = (int(n) for n in inp.shape)
    d, h = int(hx.shape[0]), int(hx.shape[-1])
    w = sum(int(x.numel()) for x in weights if isinstance(x, torch.Tensor))
    terms = _cudnn_rnn_terms(t, b, i, h, d, RNN_GATES.get(str(args[9]), 4), w, inp.element_size())
    sized = [c * v for c, v in zip(_CUDNN_RNN_COEF, terms)]
    fixed = sum(sized[:_CUDNN_RNN_FIXED])
    return _round(int(fixed + sum(sized[_CUDNN_RNN_FIXED:]))), int(fixed)


#: the CPU instruction set a CPU dry run simulates, where not this CPU's (see
#: :func:`simulated_cpu_capability`): a context variable, so that threads (and asyncio
#: tasks) that dry-run at once each see their own; the dry run's helper threads run in a
#: copy of the caller's context
_SIMULATED_CPU_CAPABILITY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "costaware_simulated_cpu_capability", default=None
)


def cpu_capability() -> str:
    """The CPU instruction set a CPU dry run simulates oneDNN's kernels for: this CPU's
    (``torch.backends.cpu.get_cpu_capability()``: "AVX2", "AVX512", ...), unless
    :func:`simulated_cpu_capability` names another."""
    simulated = _SIMULATED_CPU_CAPABILITY.get()
    if simulated is not None:
        return simulated
    return str(torch.backends.cpu.get_cpu_capability())


@contextlib.contextmanager
def simulated_cpu_capability(capability: str | None) -> Iterator[None]:
    """Dry-run a CPU step as a CPU of ``capability`` runs it (None: this CPU).

    oneDNN's blocked layouts, and so a CPU step's buffers, depend on the instruction set: a
    row measured on an AVX2 CPU is traced as AVX2 runs it when its features are computed
    on an AVX-512 one (:func:`costaware.measure.collect.observations`).
    """
    if capability is None:
        yield
        return
    token = _SIMULATED_CPU_CAPABILITY.set(str(capability))
    try:
        yield
    finally:
        _SIMULATED_CPU_CAPABILITY.reset(token)


def cpu_conditions() -> str:
    """What a CPU dry run depends on besides the spec: torch's threads (PyTorch picks a
    convolution's kernel by them) and the instruction set simulated."""
    return f"threads={torch.get_num_threads()}|isa={cpu_capability()}"


def _onednn_channels(channels: int) -> int:
    """``channels`` rounded up to oneDNN's channel block on the CPU simulated (8 floats
    with AVX2, 16 with AVX-512; :func:`cpu_capability`): the blocked layouts oneDNN
    reorders tensors into are padded to it."""
    block = 16 if "AVX512" in cpu_capability() else 8
    return -(-channels // block) * block


def _onednn_conv_transient(
    inp: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    groups: int,
    strided: bool,
    input_grad: bool | None,
) -> int:
    """Bytes oneDNN's convolution (``mkldnn_convolution`` and its backward) holds inside
    the op beyond the tensors it returns: blocked copies of the input, the weight and the
    output (or of their gradients), their channels padded to oneDNN's block.
    ``input_grad`` is None for the forward, else whether the backward computes the input's
    gradient.

    - Forward: the blocked input and weight beside the blocked output, then the blocked
      output beside the plain one: ``max(in + w, out)`` above the output.
    - Backward, three phases: the input gradient from the blocked output gradient and
      weight; the blocked input gradient beside the plain one (twice the input at a
      stride above 1); the weight gradient from the blocked output gradient and input.
      Above the gradients: ``max(out + w, in (2 x in strided), out + in, w)``, the first
      two only when the input takes a gradient; when the kernel is larger than the input
      on a side (ResNet's 3x3 convolutions at 1x1 and 2x2 on a 32x32 image) or of 14
      pixels or more (a ViT's patch embedding; 12 and under did not), the weight gradient
      takes four weight-sized buffers per torch thread, so the last term is
      ``4 x threads x w + out`` (on an AVX-512 CPU only for the large kernel: a kernel
      larger than its input held one weight-sized buffer there). A depthwise convolution
      holds ``out + in`` at 3x3 (strided or not) and only ``in`` (when the input takes a
      gradient) past 3x3. Over
      1-3 input channels the weight's are not padded, and a stem convolution (kernel
      above 1x1) leaves its input in place unless it takes a gradient.

    Measured with the profiler's allocation events on this container's CPU (AVX2, fp32)
    over random convolutions, forward and backward (``benchmarks/cpu_conv_memory.py``
    prints the figures), with one thread as the CPU corpus was, and two; the misses are
    mostly small convolutions whose scratch pads of tens of KiB the terms leave out. With
    more threads oneDNN splits other weight gradients into per-thread partials too, which
    the terms leave out (on two threads 32% of the backwards were under, against 19% on
    one, by 4.6% of the bytes against 2.6%), and it picks its kernels per CPU: another
    instruction set may block and buffer differently. The thread count is read when the
    step is traced: a prediction's trace cache keeps the count it was traced with.
    """
    esz = inp.element_size()
    n, c, k = int(inp.shape[0]), int(inp.shape[1]), int(out.shape[1])
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    i = n * _onednn_channels(c) * (inp.numel() // max(n * c, 1)) * esz
    o = n * _onednn_channels(k) * (out.numel() // max(n * k, 1)) * esz
    # an image's 1-3 channels are not padded in the weight, nor moved in a stem's input
    per_group = 1 if groups >= c else c if c <= 3 else _onednn_channels(c // groups)
    w = _onednn_channels(k) * per_group * kh * kw * esz
    if c <= 3 and kh * kw > 1 and not input_grad:
        i = 0
    if input_grad is None:
        return max(i + w, o)
    if 1 < groups == c:  # depthwise: no doubled input when strided, none at all past 3x3
        if max(kh, kw) > 3:
            return max(i if input_grad else 0, w)
        return max(o + i, w)
    # a kernel larger than the input on a side (ResNet's 3x3 convolutions at 1x1 and 2x2
    # on a 32x32 image), or of 14 pixels or more (a ViT's patch embedding), takes four
    # weight-sized buffers per thread for its weight gradient; with AVX-512 only the large
    # kernel does (measured 2026-11-26 on an AVX-512 EPYC: a 3x3 kernel at 2x2 held one
    # weight-sized buffer, on one thread and on two)
    overhang = (kh > int(inp.shape[2]) or kw > int(inp.shape[3])) and (
        "AVX512" not in cpu_capability()
    )
    return max(
        o + w if input_grad else 0,
        (2 if strided else 1) * i if input_grad else 0,
        o + i,
        4 * torch.get_num_threads() * w + o if overhang or max(kh, kw) >= 14 else w,
    )


def _cpu_conv_transient(args: tuple[Any, ...], backward: bool, output: Any) -> int:
    """Bytes a convolution on a CPU allocates and frees again inside the op, beyond the
    tensors it returns: the im2col columns of PyTorch's own convolution.

    ``args`` are ``aten.convolution``'s (``backward=False``) or
    ``aten.convolution_backward``'s, and ``output`` is the convolution's output (or its
    gradient): its positions are the columns'. PyTorch picks the kernel per call
    (``torch._C._select_conv_backend``, which reads only shapes, dtypes and settings, so
    it answers for fake tensors): oneDNN for most, its own "slow" convolution for a small
    fp32 one at batch 1 (and a 1x1 one on one thread), and for every bf16 or fp16 one on a
    CPU without native support for them. The slow one copies its input into columns of
    ``batch x in_channels x kernel area x output positions`` (none for a 1x1 kernel at
    stride 1 without padding) in the forward, and again in the backward. Measured with
    the profiler's allocation events on this container's CPU (AVX2, no AVX-512), single
    convolutions forward and back held exactly those columns inside the op (fp32 and
    bf16, 3x3 and 7x7, stride 1 and 2). A fp32 oneDNN convolution holds blocked copies
    of its tensors instead (:func:`_onednn_conv_transient`); other oneDNN kernels
    (transposed convolutions) are left to the learned residual.
    """
    if backward:
        inp, weight = args[1], args[2]
        rest, bias = args[4:10], None
    else:
        inp, weight = args[0], args[1]
        rest, bias = args[3:9], args[2]
    tensors = (inp, weight, output)
    if not all(isinstance(t, torch.Tensor) for t in tensors) or weight.dim() != 4:
        return 0
    stride, padding, dilation, transposed, output_padding, groups = rest
    try:
        backend = torch._C._select_conv_backend(
            inp,
            weight,
            bias,
            stride,
            padding,
            dilation,
            transposed,
            output_padding,
            groups,
            list(args[3]) if backward and args[3] is not None else None,
        )
    except (RuntimeError, TypeError, ValueError):
        return 0
    name = backend.name
    if name == "Mkldnn" and inp.dtype != torch.float32 and "AVX512" not in cpu_capability():
        # PyTorch asks this CPU whether oneDNN has native half precision (AVX-512 at the
        # least); a simulated CPU without AVX-512 runs a half convolution as its own
        name = "Slow2d"
    if name == "Mkldnn" and not transposed and inp.dtype == torch.float32:
        input_grad = bool(args[10][0]) if backward else None
        strided = any(int(st) > 1 for st in stride)
        return _onednn_conv_transient(inp, weight, output, int(groups), strided, input_grad)
    if name != "Slow2d":
        return 0
    kh, kw = weight.shape[2:]
    if (kh, kw) == (1, 1) and tuple(stride) == (1, 1) and tuple(padding) == (0, 0):
        return 0  # the columns are a view of the input
    out_h, out_w = output.shape[2:]
    per_group = inp.shape[1] // max(int(groups), 1)
    return int(inp.shape[0] * per_group * kh * kw * out_h * out_w * inp.element_size())


def _cpu_rnn_transient(args: tuple[Any, ...], backward: bool) -> int:
    """Bytes oneDNN's LSTM layer on a CPU (``aten.mkldnn_rnn_layer`` and its backward)
    allocates and frees again inside the op, beyond the tensors it returns.

    Measured with the profiler's allocation events (this container's CPU, one thread,
    fp32, 1-2 layers, hidden 64-512, 8-64 time steps, batch 4-16): the forward holds
    reordered copies of the two weight matrices and a buffer of the gates,
    ``time steps x batch x 4 x hidden`` fp32 values, within 1-4% (plus 40-140 KiB); the
    backward about twice the weights plus the gates (0.84-1.15x of that). The fake
    kernels allocate their outputs only. On the 42 LSTMs of the CPU corpus the dry run's
    peak was off by 3.0% on average with the workspace alone
    (:func:`_onednn_lstm_workspace`), and by 0.5% with these blocks too (19.6% before
    either).
    """
    inp, w_ih, w_hh = args[0], args[1], args[2]
    if not all(isinstance(t, torch.Tensor) for t in (inp, w_ih, w_hh)) or inp.dim() != 3:
        return 0
    if inp.dtype != torch.float32:  # measured in fp32 only
        return 0
    weights = (w_ih.numel() + w_hh.numel()) * w_ih.element_size()
    gates = inp.shape[0] * inp.shape[1] * w_hh.shape[0] * 4
    return int((2 if backward else 1) * weights + gates)


#: oneDNN's LSTM workspace in bytes, per term: ``T x B x 4H``, ``(T + 1) x B x max(E, H)``
#: and ``(T + 1) x B x H`` fp32 values, and pages (see :func:`_onednn_lstm_workspace`)
_ONEDNN_LSTM_WORKSPACE = (1.34, 6.17, 3.64, 3.56)


def _onednn_lstm_workspace(args: tuple[Any, ...], out: Any) -> Any:
    """``aten.mkldnn_rnn_layer``'s outputs with its workspace sized as a CPU's oneDNN sizes it.

    In training the layer returns a workspace (gates and states kept for the backward)
    that autograd holds from the forward to the backward. The fake kernel returns it
    empty. oneDNN sizes it from its own padded layouts, which PyTorch does not expose; a
    least-squares fit of the real size (``T`` time steps, batch ``B``, input ``E``, hidden
    ``H``, one LSTM layer in fp32) on 120 random shapes (T 1-160, B 1-48, E and H 8-640)
    was within 0.7% on average of 80 others (0.96-1.03x): see
    :data:`_ONEDNN_LSTM_WORKSPACE`. A 1-layer LSTM of 256 units, 16 steps at batch 16,
    keeps 4.0 MiB there, while its weights take 1.5 MiB. Other dtypes keep the fake
    kernel's empty workspace (not measured: this CPU's oneDNN has no bf16 LSTM).
    """
    inp, w_hh = args[0], args[2]
    train = bool(args[15]) if len(args) > 15 else True
    if (
        not train
        or not isinstance(out, tuple)
        or len(out) != 4
        or not isinstance(inp, torch.Tensor)
        or inp.dim() != 3
        or inp.dtype != torch.float32  # fitted in fp32 only
        or out[3].numel()
    ):
        return out
    steps, batch = inp.shape[0], inp.shape[1]  # time-major here, batch_first or not
    hidden, width = int(args[10]), max(int(inp.shape[2]), int(args[10]))
    terms = (
        steps * batch * w_hh.shape[0] * 4,
        (steps + 1) * batch * width * 4,
        (steps + 1) * batch * hidden * 4,
        4096,
    )
    nbytes = int(sum(c * t for c, t in zip(_ONEDNN_LSTM_WORKSPACE, terms)))
    return (*out[:3], out[3].new_empty(nbytes))


def _fresh_outputs(func: Any, out: Any) -> Any:
    """Give each output of ``func`` its own storage where its schema promises one.

    Some fake (meta) kernels return one tensor twice where the real kernel returns two:
    ``mkldnn_rnn_layer_backward``'s meta returns its bias gradient as both ``grad_b_ih``
    and ``grad_b_hh``. Autograd then sees a gradient it does not own, and copies it
    before accumulating (a ``new_empty_strided`` + ``copy_`` the real step does not run),
    but only when the op missed FakeTensorMode's process-wide cache, which rebuilds each
    output separately on a hit. So the trace depended on what the process had traced
    before. An output whose schema return carries no alias annotation is fresh in the real
    kernel, and gets a fresh storage here too.
    """
    if not isinstance(out, tuple) or len(out) < 2 or func.is_view:
        return out
    returns = func._schema.returns
    seen: set[int] = set()
    fixed: list[Any] = []
    for i, t in enumerate(out):
        if isinstance(t, torch.Tensor) and i < len(returns) and returns[i].alias_info is None:
            sid = id(t.untyped_storage())
            if sid in seen:
                t = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            seen.add(sid)
        fixed.append(t)
    return tuple(fixed)


class _Recorder(TorchDispatchMode):
    """Records ops and storage lifetimes. Sits inside FakeTensorMode (sees ops first)."""

    def __init__(self, cpu: bool = False) -> None:
        super().__init__()
        #: the step is traced as a CPU runs it (the buffers of its convolutions and LSTM
        #: layers, not cuDNN's)
        self.cpu = cpu
        self.phase = "setup"
        self.step = 0
        self.record_graph = False
        self.closed = False
        self.paused = False
        self._keys: dict[int, int] = {}
        self._next_key = 0
        self.ev_key: list[int] = []
        self.ev_size: list[int] = []
        self.key_phase: dict[int, str] = {}
        self.key_category: dict[int, str] = {}
        self.phase_marks: list[tuple[int, str]] = []
        self._writer: dict[int, int] = {}
        self.nodes: list[tuple[str, str, int, int, int, float, float, int]] = []
        self.edges: list[tuple[int, int]] = []
        self.flops: dict[str, float] = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        self.bytes_moved = 0.0
        self.unsupported: Counter[str] = Counter()
        self.transients: list[tuple[int, int, int]] = []
        #: storage key -> (the exclusive bound of its values, the batch field it is, the
        #: batch argument that would make it fit, with ``{n}`` for the size it indexes)
        self.bounded: dict[int, tuple[int, str, str]] = {}

    # storages ----------------------------------------------------------------------------
    def _free(self, sid: int, key: int) -> None:
        self._keys.pop(sid, None)
        if self.closed:
            return
        self.ev_key.append(key)
        self.ev_size.append(-1)

    def key_of(self, t: torch.Tensor, category: str | None = None) -> int | None:
        st = t.untyped_storage()
        sid = id(st)
        key = self._keys.get(sid)
        if key is None:
            n = int(st.nbytes())
            if n <= 0:
                return None
            key = self._next_key
            self._next_key += 1
            self._keys[sid] = key
            weakref.finalize(st, self._free, sid, key)
            self.ev_key.append(key)
            self.ev_size.append(n)
            self.key_phase[key] = self.phase
        if category is not None:
            self.key_category[key] = category
        return key

    def bound(self, t: torch.Tensor, limit: int, field: str, fix: str) -> None:
        """Note that ``t`` holds values drawn from ``[0, limit)`` (a batch's labels or token
        ids): an op that indexes a smaller dimension with it fails on a real device."""
        key = self.key_of(t)
        if key is not None:
            self.bounded[key] = (limit, field, fix)

    def _check_index_range(self, name: str, args: tuple[Any, ...]) -> None:
        index_at, indexed_at, what = _INDEXING_OPS[name]
        if len(args) <= max(index_at, indexed_at):
            return
        index, indexed = args[index_at], args[indexed_at]
        if not isinstance(index, torch.Tensor) or not isinstance(indexed, torch.Tensor):
            return
        found = self.bounded.get(self._keys.get(id(index.untyped_storage()), -1))
        if found is None or indexed.dim() == 0:
            return
        limit, field, fix = found
        n = int(indexed.shape[0] if name == "embedding" or indexed.dim() == 1 else indexed.shape[1])
        if n < limit:
            raise SpecError(
                f"the batch's {field} are drawn from 0 to {limit - 1}, but the model feeds them "
                f"to {what.format(n=n)}: a real training step would fail with an index out of "
                f"range. Make the batch fit the model: {fix.format(n=n)}."
            )

    def label(self, tensors: Any, category: str) -> int:
        total = 0
        for t in tree_flatten(tensors)[0]:
            if isinstance(t, torch.Tensor):
                k = self.key_of(t, category)
                if k is not None:
                    total += _round(int(t.untyped_storage().nbytes()))
        return total

    def mark(self, phase: str) -> None:
        self.phase = phase
        self.phase_marks.append((len(self.ev_key), phase))

    # dispatch ---------------------------------------------------------------------------
    def _transient(self, name: str, args: tuple[Any, ...], out: Any) -> tuple[int, int]:
        """Bytes op ``name`` allocates and frees again inside itself on this trace's device,
        beyond the tensors it returns, and how many of them do not grow with the batch (see
        :attr:`Trace.transients`)."""
        if name in ("convolution", "convolution_backward"):
            backward = name == "convolution_backward"
            if self.phase != ("backward" if backward else "forward"):
                return 0, 0
            if self.cpu:
                return _cpu_conv_transient(args, backward, args[0] if backward else out), 0
            return (_conv_transient(args) if backward else 0), 0
        if self.cpu and name in ("mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"):
            return _cpu_rnn_transient(args, name.endswith("backward")), 0
        if not self.cpu and name == "rnn_backward" and self.phase == "backward":
            return _cudnn_rnn_transient(args)
        return 0, 0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = _fresh_outputs(func, func(*args, **kwargs))
        if self.paused:
            return out
        name = func._overloadpacket.__name__
        if self.bounded and name in _INDEXING_OPS:
            self._check_index_range(name, args)
        if self.cpu and name == "mkldnn_rnn_layer":
            out = _onednn_lstm_workspace(args, out)
        if name in _NOISE or func.namespace == "prim":
            return out
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        out_keys = [self.key_of(t) for t in outs]
        if not self.closed:
            block, fixed = self._transient(name, args, out)
            if block:
                self.transients.append((len(self.ev_key), block, fixed))
        if self.phase in ("forward", "backward", "optimizer"):
            flops: float = 0.0
            try:
                flops = float(count_flops(func, args, kwargs, out))
            except Exception:  # a formula that does not fit these args: count, never fail
                self.unsupported[name] += 1
            self.flops[self.phase] += flops
            ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            is_view = bool(func.is_view)
            nbytes = 0.0
            if not is_view:
                nbytes = float(
                    sum(t.numel() * t.element_size() for t in ins)
                    + sum(t.numel() * t.element_size() for t in outs)
                )
            self.bytes_moved += nbytes
            if self.record_graph:
                idx = len(self.nodes)
                dtype = outs[0].dtype if outs else (ins[0].dtype if ins else torch.float32)
                cls = VIEW if is_view else op_class(name)
                serial = 1
                if func.namespace == "costaware" and name in ("rnn", "rnn_backward"):
                    serial = int(args[0].shape[0])  # the time-major input (T, B, I)
                dcode = _DTYPE_CODES.get(dtype, 4)
                self.nodes.append((name, self.phase, cls, dcode, len(outs), flops, nbytes, serial))
                for t in ins:
                    st = t.untyped_storage()
                    k = self._keys.get(id(st))
                    w = self._writer.get(k) if k is not None else None
                    if w is not None and w != idx:
                        self.edges.append((w, idx))
                for k in out_keys:
                    if k is not None:
                        self._writer[k] = idx
        return out


# --------------------------------------------------------------------------------------
# model construction
# --------------------------------------------------------------------------------------
def build_model(
    spec: TrainingSpec, *, real_build_limit: int | None = None
) -> tuple[nn.Module, str]:
    """Build the spec's model without allocating it: on ``meta`` when possible.

    Returns the module and how it was built: ``"meta"``, ``"cpu"`` (the constructor
    computes with tensors and failed on meta, so it ran for real on the CPU) or
    ``"module"`` (an instance was given; it is copied to meta, never modified).

    The real build is bounded: it stops, with :class:`~costaware.errors.UntraceableModelError`
    naming the line that failed on meta, once the tensors it holds pass
    ``real_build_limit`` bytes (default :func:`default_real_build_limit`: half of the memory
    this machine has available).
    """
    if isinstance(spec.model, nn.Module):
        src = spec.model
        memo: dict[int, Any] = {}
        for p in src.parameters():
            memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
        for b in src.buffers():
            memo[id(b)] = torch.empty_like(b, device="meta")
        return copy.deepcopy(src, memo), "module"
    _check_zero_arguments(spec.model)
    try:
        with torch.device("meta"):
            model = spec.model()
        how = "meta"
    except Exception as e:  # the constructor reads values: built for real, within a limit
        model = _build_for_real(spec, e, real_build_limit)
        how = "cpu"
    if not isinstance(model, nn.Module):
        raise SpecError(
            f"the model factory {_factory_name(spec.model)} must return an nn.Module, but it "
            f"returned {type(model).__name__}: TrainingSpec(model=...) takes a zero-argument "
            "callable that builds the model, or an nn.Module."
        )
    return model, how


def _factory_name(factory: Any) -> str:
    """How the user wrote the factory: ``MyNet``, ``make_model``, ``partial(make, ...)``."""
    if isinstance(factory, functools.partial):
        return f"functools.partial({_factory_name(factory.func)}, ...)"
    name = getattr(factory, "__qualname__", None) or getattr(factory, "__name__", None)
    return str(name) if name else type(factory).__name__


def _check_zero_arguments(factory: Any) -> None:
    """Raise :class:`SpecError` when ``factory`` cannot be called with no arguments (a
    factory that needs them, or a class whose constructor does), naming what it needs."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C callable: let the call say
        return
    try:
        sig.bind()
        return
    except TypeError:
        pass
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    needed = [
        p.name
        for p in sig.parameters.values()
        if p.default is p.empty and (p.kind in kinds or p.kind is inspect.Parameter.KEYWORD_ONLY)
    ]
    name = _factory_name(factory)
    args = ", ".join(f"{n}=..." for n in needed)
    listed = ", ".join(f"`{n}`" for n in needed)
    if isinstance(factory, type):
        raise SpecError(
            f"TrainingSpec(model={name}) passes the class {name}, which costaware calls with "
            f"no arguments to build the model, but {name}() needs {listed}. Pass a "
            f"zero-argument factory, model=lambda: {name}({args}), or an instance, "
            f"model={name}({args})."
        )
    inner = factory.func if isinstance(factory, functools.partial) else factory
    base = _factory_name(inner)
    raise SpecError(
        f"TrainingSpec(model={name}) is called with no arguments to build the model, but "
        f"{base}() needs {listed}. Pass a zero-argument factory: "
        f"model=lambda: {base}({args}) or model=functools.partial({base}, {args})."
    )


def _factory_error(error: Exception, spec: TrainingSpec) -> Exception:
    """The error to raise for a model factory that failed when run for real on the CPU
    (after it failed on meta): the user's bug (:class:`UserCodeError`), unless the failure
    is this machine's (no GPU, out of memory) or costaware's, which fail open."""
    if isinstance(error, CostawareError):
        return error
    name = _factory_name(spec.model)
    if isinstance(error, MemoryError):
        return UntraceableModelError(
            f"the model factory {name} ran out of this machine's memory when built for real on "
            "the CPU (it failed on the meta device first): a limit of costaware's dry run, not "
            "a bug in the factory."
        )
    if _DEVICE_WORDS.search(str(error)):
        return UntraceableModelError(
            f"the model factory {name} needs a device this machine lacks "
            f"({_said(error)}) {_where(error)}. The dry run builds the model on "
            "the CPU (the meta device): a limit of costaware's dry run, not a bug in the "
            "factory. To predict it, return the model on the CPU and move it to the GPU in the "
            "training code."
        )
    return UserCodeError(
        f"the model factory {name} raised {_said(error)} {_where(error)}. This "
        "is the factory's own code: it fails the same way when built for real on the CPU, so "
        "a real trial would fail too. Fix the factory (TrainingSpec(model=...) calls it with "
        "no arguments and it must return an nn.Module)."
    )


#: the share of this machine's available memory that the real builds of models may hold
REAL_BUILD_SHARE = 0.5


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory() -> int | None:
    """Bytes of memory this process can still take: ``MemAvailable`` from /proc/meminfo,
    or what its cgroup's memory limit leaves where that is less (cgroup v2 or v1); where
    there is no /proc/meminfo, the machine's physical memory. None if none can be read."""
    avail: int | None = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            return None
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        cap, used = _read_int(limit_file), _read_int(usage_file)
        if cap is not None and used is not None and cap < 2**60:
            avail = min(avail, max(cap - used, 0))
    return avail


def default_real_build_limit(in_use: int = 0) -> int:
    """Bytes of tensors the real (not meta) builds of models may hold together:
    ``REAL_BUILD_SHARE`` of :func:`available_memory` plus the ``in_use`` bytes that builds
    in progress hold (4 GiB where the memory available cannot be read)."""
    avail = available_memory()
    return int(REAL_BUILD_SHARE * (avail + in_use)) if avail is not None else 4 * 2**30


class _RealBuildTooLarge(BaseException):
    """Raised inside a real build whose tensors pass its limit; not an ``Exception``, so a
    factory's own ``except Exception`` does not swallow it."""


#: aten ops that allocate a fresh tensor of their ``size`` argument (or, ``*_like``, of
#: their first argument's size): checked before they run, so that a build is refused
#: before it writes a tensor past the limit (``zeros`` or ``randn`` write every byte in
#: one call)
_FILLING_OPS = frozenset(
    {"empty", "empty_strided", "zeros", "ones", "full", "rand", "randn", "randint", "normal"}
    | {"new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full"}
)


class _AllocationLimit(TorchDispatchMode):
    """Counts the bytes of the CPU storages a real model build creates and still holds,
    and stops the build (:class:`_RealBuildTooLarge`) before they pass ``limit``.

    Every op's new storages are added after it runs; an op that allocates a tensor of a
    known size (``_FILLING_OPS``) is checked before it runs. Storages freed again are
    dropped from the count once it nears the limit. What torch does not allocate (a NumPy
    array, a file read into Python objects) is not seen.
    """

    #: the real builds in progress in this process (threads), which share the limit
    active: ClassVar[weakref.WeakSet[_AllocationLimit]] = weakref.WeakSet()

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.live: dict[int, tuple[Any, int]] = {}  # storage -> (weak reference, bytes)
        self.held = 0
        self.refused = False

    def others(self) -> int:
        """Bytes the other real builds in progress hold."""
        return sum(m.held for m in list(self.active) if m is not self)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        from torch.multiprocessing.reductions import StorageWeakRef

        kwargs = kwargs or {}
        upcoming = _upcoming_bytes(func, args, kwargs)
        if upcoming:
            self._check(upcoming)
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                nbytes = storage.nbytes()
                ref = StorageWeakRef(storage)
                if nbytes and ref.cdata not in self.live:
                    self.live[ref.cdata] = (ref, nbytes)
                    self.held += nbytes
        self._check(0)
        return out

    def _check(self, extra: int) -> None:
        if self.held + extra <= self.limit and (
            len(self.active) < 2 or self.held + extra + self.others() <= self.limit
        ):
            return
        for key, (ref, nbytes) in list(self.live.items()):
            if ref.expired():
                del self.live[key]
                self.held -= nbytes
        if self.held + extra + self.others() > self.limit:
            self.refused = True
            raise _RealBuildTooLarge(self.held + extra)


def _upcoming_bytes(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Bytes the op ``func`` is about to allocate, where its arguments say (else 0)."""
    name = func.overloadpacket.__name__
    like = name.endswith("_like") and args and isinstance(args[0], torch.Tensor)
    if not like and name not in _FILLING_OPS:
        return 0
    dtype = kwargs.get("dtype")
    if like:
        numel, dtype = args[0].numel(), dtype or args[0].dtype
    else:
        size = kwargs.get("size")
        if size is None:
            size = next((a for a in args if isinstance(a, (list, tuple, torch.Size))), None)
        if size is None or not all(isinstance(n, int) for n in size):
            return 0
        numel = math.prod(size)
        if dtype is None and name.startswith("new_") and isinstance(args[0], torch.Tensor):
            dtype = args[0].dtype
    dtype = dtype if isinstance(dtype, torch.dtype) else torch.get_default_dtype()
    return int(numel * dtype.itemsize)


def _build_for_real(
    spec: TrainingSpec, meta_error: BaseException, limit: int | None, *, attribute: bool = False
) -> nn.Module:
    """Run the spec's factory for real on the CPU, stopped (UntraceableModelError, naming
    where ``meta_error`` arose) once the tensors it holds pass ``limit`` bytes."""
    mode = _AllocationLimit(0)
    # the limit is shared with the real builds of other threads, whose memory in use is not
    # available to this one but will be again
    mode.limit = default_real_build_limit(mode.others()) if limit is None else limit
    _AllocationLimit.active.add(mode)
    try:
        with mode:
            model: nn.Module = spec.model()  # type: ignore[operator]
    except Exception as e:
        if not mode.refused:  # the factory's own error: the user's bug, said so
            raise _factory_error(e, spec) from e
    except BaseException:
        if not mode.refused:  # the time limit, the caller's interrupt
            raise
    finally:
        _AllocationLimit.active.discard(mode)
    if mode.refused:  # even where the factory caught the refusal and went on
        raise UntraceableModelError(
            _too_large(meta_error, mode.limit, limit is None, attribute)
        ) from meta_error
    return model


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: the zoo's models are code the user chose, not costaware's (found by path: the core
#: does not import the zoo)
_ZOO_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "zoo") + os.sep


def _own_dirs() -> tuple[str, ...]:
    """costaware's source folders: the package, and its integrations where an install
    keeps them apart."""
    import importlib.util

    import costaware

    dirs = [_OWN_DIR, os.path.dirname(os.path.abspath(costaware.__file__)) + os.sep]
    with contextlib.suppress(ImportError, ValueError):
        found = importlib.util.find_spec("costaware.integrations")
        for path in (found.submodule_search_locations or []) if found else []:
            dirs.append(os.path.abspath(path) + os.sep)
    return tuple(dirs)


_OWN_DIRS = _own_dirs()
_STDLIB_DIR = sysconfig.get_paths()["stdlib"] + os.sep


def _is_theirs(path: str) -> bool:
    """Whether a source file is the user's code (their own, a library's, the zoo's model
    they chose), not torch's, costaware's or the standard library's."""
    if path.startswith(_ZOO_DIR):
        return True
    if path.startswith((_TORCH_DIR, *_OWN_DIRS)):
        return False
    in_packages = "site-packages" in path or "dist-packages" in path
    return in_packages or not path.startswith(_STDLIB_DIR)


def _raised_by_costaware(exc: BaseException) -> bool:
    """Whether costaware's own code (not the zoo's models) raised ``exc``: its bug.

    costaware's torch modes that hand an op on (``return func(*args, **kwargs)``) are not
    where an op's error arises: the code that called the op is (a user's forward indexing
    a tensor with a string fails in torch, called through such a mode)."""
    frames = traceback.extract_tb(exc.__traceback__)
    while (
        frames
        and frames[-1].name in ("__torch_function__", "__torch_dispatch__")
        and "func(" in (frames[-1].line or "")
    ):
        frames.pop()
    path = frames[-1].filename if frames else ""
    return path.startswith(_OWN_DIRS) and not _is_theirs(path)


def _user_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The frames of ``exc``'s traceback in the user's code, outermost first."""
    return [f for f in traceback.extract_tb(exc.__traceback__) if _is_theirs(f.filename)]


def _failing_line(exc: BaseException) -> str:
    """Where ``exc`` arose in the user's code: ``path:line (`code`)``, and the outermost
    user frame it was reached from, when that is another."""
    frames = _user_frames(exc)
    if not frames:
        return "inside torch"
    last, first = frames[-1], frames[0]
    where = f"{last.filename}:{last.lineno}" + (f" (`{last.line.strip()}`)" if last.line else "")
    if first is not last:
        where += f", reached from {first.filename}:{first.lineno}"
    return where


def _too_large(meta_error: BaseException, limit: int, default: bool, attribute: bool) -> str:
    """Why a real build was refused, where it failed on meta, and what to change.
    ``attribute``: the meta-built model failed in its dry run (a tensor left on meta),
    rather than its constructor on meta."""
    from costaware._format import fmt_bytes

    if default:
        avail = available_memory()
        bound = f"{fmt_bytes(limit)}, {REAL_BUILD_SHARE:.0%} of the " + (
            f"{fmt_bytes(avail)} this machine has available" if avail else "memory available"
        )
    else:
        bound = f"its limit of {fmt_bytes(limit)}"
    what = (
        "the model built on the meta device failed in its dry run"
        if attribute
        else "the model's constructor failed on the meta device"
    )
    fix = (
        "keep the tensors forward uses as registered buffers or parameters "
        "(self.register_buffer(...)) rather than plain attributes, which stay on meta."
        if attribute
        else "make its constructor work on the meta device: do not read tensor values in "
        "it (float(t), t.item(), t.tolist(), a statistic such as w.std() printed or "
        "checked), compute them from the configuration or in forward; or pass an "
        "nn.Module built on the meta device (`with torch.device('meta'): model = ...`) as "
        "TrainingSpec(model=model)."
    )
    return (
        f"{what} at {_failing_line(meta_error)}: {first_line(meta_error).rstrip('.!')}. "
        f"Building it for real on the CPU instead would hold more than {bound}, so the "
        "build was refused. To "
        f"dry-run it without allocating it, {fix}"
    )


def _to_fake(model: nn.Module, dtype: torch.dtype | None = None) -> None:
    """Swap parameters and buffers for fake CPU tensors; call inside FakeTensorMode.
    With ``dtype``, floating-point ones take that type (``model.to(dtype)``)."""

    def type_of(t: torch.Tensor) -> torch.dtype:
        return dtype if dtype is not None and t.is_floating_point() else t.dtype

    done: dict[int, Any] = {}
    for mod in model.modules():
        for k, p in list(mod._parameters.items()):
            if p is None:
                continue
            if id(p) not in done:
                t = torch.empty_strided(p.shape, p.stride(), dtype=type_of(p), device="cpu")
                done[id(p)] = nn.Parameter(t, requires_grad=p.requires_grad)
            mod._parameters[k] = done[id(p)]
        for k, b in list(mod._buffers.items()):
            if b is None:
                continue
            if id(b) not in done:
                done[id(b)] = torch.empty_strided(
                    b.shape, b.stride(), dtype=type_of(b), device="cpu"
                )
            mod._buffers[k] = done[id(b)]


def _layer_counts(model: nn.Module) -> dict[str, int]:
    counts = {
        "conv": 0,
        "linear": 0,
        "norm": 0,
        "attention": 0,
        "recurrent": 0,
        "embedding": 0,
        "pool": 0,
    }
    for m in model.modules():
        if isinstance(m, nn.modules.conv._ConvNd):
            counts["conv"] += 1
        elif isinstance(m, nn.Linear):
            counts["linear"] += 1
        elif isinstance(m, (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)):
            counts["norm"] += 1
        elif isinstance(m, nn.MultiheadAttention):
            counts["attention"] += 1
        elif isinstance(m, nn.RNNBase):
            counts["recurrent"] += 1
        elif isinstance(m, nn.Embedding):
            counts["embedding"] += 1
        elif isinstance(m, (nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd,
                            nn.modules.pooling._AdaptiveAvgPoolNd, nn.modules.pooling._AdaptiveMaxPoolNd)):  # fmt: skip
            counts["pool"] += 1
    return counts


# --------------------------------------------------------------------------------------
# time limit
# --------------------------------------------------------------------------------------
class _DryRunTimeout(BaseException):
    """Raised inside the dry run's thread at its deadline (never seen by the caller, who
    gets :class:`~costaware.errors.TraceTimeout`).

    Not an ``Exception``: a factory's ``except Exception`` fallback or a forward's retry
    loop does not catch it. It is raised again every few milliseconds until the thread has
    left the dry run, so a loop that catches everything (a bare ``except:``) around Python
    code lets it through too, at the first check outside its ``try``.
    """


#: seconds the caller goes on stopping a timed-out dry run before it reports the timeout
_STOP_GRACE_S = 1.0
#: seconds between two timeouts raised into a dry run's thread that has not yet stopped:
#: while the caller waits, and afterwards (a thread stuck in one long native call)
_STOP_EVERY_S = 0.005
_STOP_EVERY_LATER_S = 0.05
#: set inside a time-limited call: a dry run nested in one runs under the enclosing limit
_IN_TIME_LIMIT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "costaware_in_time_limit", default=False
)
#: the timed-out dry runs whose threads are still being stopped
_STOPPING: set[_Stoppable] = set()
#: seconds interpreter exit waits for them (a daemon thread still in torch's C++ code when
#: the interpreter finalizes aborts the process)
_EXIT_WAIT_S = 5.0


def _set_async_exc(ident: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in the thread ``ident`` at its next bytecode check (None: withdraw
    one not yet raised)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(ident), None if exc is None else ctypes.py_object(exc)
    )


class _Stoppable:
    """A thread's stay inside a time-limited call, and the means to end it from outside.

    :meth:`interrupt` raises :class:`_DryRunTimeout` in the thread only between its
    :meth:`enter` and :meth:`leave`, under one lock, so that nothing is raised into the
    code that runs after the call (a timeout injected just before :meth:`leave` is
    withdrawn, or absorbed there). :attr:`done` is set as the thread finishes: waiting
    on it, unlike ``Thread.join``, leaves the thread's state intact when a signal
    handler of the caller raises meanwhile (a join interrupted so marks a running thread
    as stopped).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ident: int | None = None
        self._inside = False
        self._stopped = False
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def running(self) -> bool:
        return not self.done.is_set() and self.thread is not None and self.thread.is_alive()

    def enter(self) -> None:
        with self._lock:
            if self._stopped:
                raise _DryRunTimeout
            self._ident = threading.get_ident()
            self._inside = True

    def leave(self) -> None:
        for _ in range(3):  # each try absorbs a timeout raised meanwhile
            try:
                with self._lock:
                    self._inside = False
                    if self._ident is not None:
                        _set_async_exc(self._ident, None)
                return
            except _DryRunTimeout:
                continue

    def interrupt(self) -> None:
        with self._lock:
            self._stopped = True
            if self._inside and self._ident is not None:
                _set_async_exc(self._ident, _DryRunTimeout)


def _stop(guard: _Stoppable, grace: float) -> bool:
    """Raise the timeout into the guarded thread until it has finished; whether it did
    within ``grace`` seconds (if not, a watchdog thread goes on until it does)."""
    _quiet_unraisable()
    end = time.monotonic() + grace
    try:
        while guard.running():
            guard.interrupt()
            if time.monotonic() >= end:
                break
            guard.done.wait(_STOP_EVERY_S)
        else:
            return True
    except BaseException:  # the caller's own interrupt while it waits: stopped all the same
        _watch(guard)
        raise
    _watch(guard)
    return False


def _watch(guard: _Stoppable) -> None:
    _STOPPING.add(guard)
    threading.Thread(
        target=_keep_stopping, args=(guard,), name="costaware-dry-run-stopper", daemon=True
    ).start()


def _keep_stopping(guard: _Stoppable) -> None:
    while guard.running():
        guard.interrupt()
        guard.done.wait(_STOP_EVERY_LATER_S)
    _STOPPING.discard(guard)


_UNRAISABLE_HOOKED = threading.Lock()


def _quiet_unraisable() -> None:
    """Keep out of stderr the timeouts that land in a finalizer (a weakref callback, a
    ``__del__``) of a dry run being stopped, which Python reports as "Exception ignored
    in ...": the hook in place (``sys.unraisablehook``) is chained, once per process, and
    sees everything else as before."""
    if not _UNRAISABLE_HOOKED.acquire(blocking=False):
        return
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if unraisable.exc_type is None or not issubclass(unraisable.exc_type, _DryRunTimeout):
            previous(unraisable)

    sys.unraisablehook = hook


@atexit.register
def _wait_for_stopping() -> None:
    end = time.monotonic() + _EXIT_WAIT_S
    for guard in list(_STOPPING):
        guard.done.wait(max(0.0, end - time.monotonic()))


def _call_with_timeout(fn: Callable[[], _T], timeout: float | None) -> _T:
    """``fn()``, run in a worker thread that is stopped after ``timeout`` seconds.

    At the deadline the caller raises :class:`_DryRunTimeout` into the worker (CPython's
    ``PyThreadState_SetAsyncExc``), again every few milliseconds until the worker has
    left ``fn``, and raises :class:`~costaware.errors.TraceTimeout` itself: Python code,
    the user's factory and forward included, stops within milliseconds, even one that
    catches ``Exception``; a loop over a bare ``except:`` stops once a timeout lands
    outside its ``try`` (within a second, around torch operators). No signal or timer of
    the process is touched, so the user's ``SIGALRM`` handler and ``setitimer`` timers
    stay as they were, and it works the same in any thread.

    What it cannot interrupt is one call into native code: a single long C++ operator
    (a real matrix product of a huge model, a blocking ``time.sleep`` or read) runs to its
    end, and the timeout is raised when it returns to Python. The caller does not wait
    for that: it reports the timeout at most ``_STOP_GRACE_S`` after the deadline, a
    watchdog thread keeps raising it until the worker has stopped, and the CPU the
    worker still uses is that of the one call in progress. A loop that catches
    everything (bare ``except:``) around such a call, whose timeout is therefore always
    raised inside the ``try``, is not stopped.

    ``fn`` runs in a copy of the caller's context (the simulated CPU of
    :func:`simulated_cpu_capability`, for one). Nested inside another time-limited call,
    ``fn`` runs inline under the enclosing limit. ``timeout`` None or <= 0: no limit.
    """
    if timeout is None or timeout <= 0 or _IN_TIME_LIMIT.get():
        return fn()
    guard = _Stoppable()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            try:
                guard.enter()
                _IN_TIME_LIMIT.set(True)
                box["result"] = fn()
            except BaseException as e:  # handed to the caller's thread
                box["error"] = e
            finally:
                guard.leave()
        except _DryRunTimeout:  # raised as it left: its result or error is in the box
            guard.leave()
        finally:
            guard.done.set()

    context = contextvars.copy_context()  # the caller's simulated CPU, for one
    guard.thread = threading.Thread(
        target=context.run, args=(target,), name="costaware-dry-run", daemon=True
    )
    guard.thread.start()
    try:
        finished = guard.done.wait(timeout)
    except BaseException:  # the caller's own interrupt (Ctrl-C, its signal handler)
        _stop(guard, _STOP_GRACE_S)
        raise
    message = f"the dry run took longer than its time limit of {timeout:g} s"
    if not finished and guard.running():
        if _stop(guard, _STOP_GRACE_S):
            raise TraceTimeout(message + "; it was stopped.")
        raise TraceTimeout(
            message + f"; it had not stopped {_STOP_GRACE_S:g} s later: it is inside one "
            "native (C++) call, which Python cannot interrupt, or catches every exception. "
            "It is stopped as soon as it returns to Python."
        )
    error = box.get("error")
    if isinstance(error, _DryRunTimeout):  # stopped just as it finished
        raise TraceTimeout(message + "; it was stopped.")
    if error is not None:
        raise error
    if "result" not in box:  # the thread ended without finishing (it cannot, but say so)
        raise TraceError("the dry run's thread ended without a result.")
    result: _T = box["result"]
    return result


class _FusedMode(TorchFunctionMode):
    """A mode that routes some calls to the fused kernels a CUDA GPU runs: ``fused``
    counts the calls it routed, ``fallbacks`` the others it saw, by why they ran
    natively."""

    def __init__(self) -> None:
        super().__init__()
        self.fused = 0
        self.fallbacks: Counter[str] = Counter()

    def note(self, routed: str, fallen: str) -> str | None:
        """The trace's note on this mode: ``routed`` (what the routed calls became), and
        how many ran ``fallen`` and why; None when it saw no call."""
        if not (self.fused or self.fallbacks):
            return None
        if self.fallbacks:
            routed += f"; {sum(self.fallbacks.values())} {fallen} ({dict(self.fallbacks)})"
        return routed


class _FusedAttention(_FusedMode):
    """Routes ``F.scaled_dot_product_attention`` to the fused flash kernel.

    On a CUDA GPU SDPA runs as flash or memory-efficient attention even with dropout: the
    B*H*L*L score matrix is never materialised and the dropout mask is regenerated from
    the RNG state in the backward. This CPU build takes the math path whenever
    ``dropout_p > 0`` (its flash kernel refuses dropout), which would put the scores, the
    softmax and the mask into the trace. Memory-wise the fused kernel with dropout is
    the fused kernel without it, so the call becomes
    ``_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, ...)``. Inputs the fused
    op does not take (GQA, differing head dims, a mask together with ``is_causal``) run
    natively, and are counted in ``fallbacks``.
    """

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            out = self._fused(*args, **kwargs)
            if out is not None:
                self.fused += 1
                return out
        elif func is torch.nn.functional.multi_head_attention_forward:
            # its inner SDPA call never reaches this mode (a mode is off inside its own
            # handler), but without dropout this build's SDPA takes the flash path itself
            bound = _MHA_SIGNATURE.bind(*args, **kwargs)
            if bound.arguments.get("dropout_p", 0.0) > 0 and not bound.arguments.get(
                "need_weights", True
            ):
                bound.arguments["dropout_p"] = 0.0
                self.fused += 1
            return func(*bound.args, **bound.kwargs)
        return func(*args, **kwargs)

    def _fused(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor | None:
        why = None
        if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
            why = "not 4-D"
        elif not (q.dtype == k.dtype == v.dtype) or q.dtype not in _FUSED_DTYPES:
            why = f"dtype {q.dtype}"
        elif enable_gqa or q.shape[1] != k.shape[1] or k.shape[1] != v.shape[1]:
            why = "grouped-query heads"
        elif not (q.shape[-1] == k.shape[-1] == v.shape[-1]):
            why = "differing head dims"
        elif attn_mask is not None and is_causal:
            why = "mask with is_causal"
        elif attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros_like(attn_mask, dtype=q.dtype).masked_fill(
                attn_mask.logical_not(), float("-inf")
            )
        if why is None:
            try:
                out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=scale
                )[0]
                return out  # type: ignore[no-any-return]
            except (RuntimeError, TypeError, ValueError) as e:
                why = f"{type(e).__name__}: {str(e)[:80]}"
        self.fallbacks[why] += 1
        return None


_FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MHA_SIGNATURE = inspect.signature(torch.nn.functional.multi_head_attention_forward)


# --------------------------------------------------------------------------------------
# fused RMSNorm (the "fused" mode)
# --------------------------------------------------------------------------------------
# ``torch.rms_norm`` runs as one ``_fused_rms_norm`` kernel on a CUDA GPU when the input
# and the weight have one dtype, and its backward as one ``_fused_rms_norm_backward``
# from what the forward kept: the input and the inverse RMS per row. This CPU build runs
# it as its composite (``pow``, ``mean``, ``add``, ``rsqrt``, ``mul``, ``mul``), whose
# autograd keeps the squares, the inverse RMS and the normalized input besides: the
# allocated peaks of the RMSNorm transformers in the GPU corpus came out 0.82-0.88x the
# dry run's, of their LayerNorm twins 0.92-1.0x. The "fused" dry run traces the kernel as
# ``costaware::rms_norm`` and its backward as ``costaware::rms_norm_backward``.


def _rms_dims(input: torch.Tensor, normalized_shape: Sequence[int]) -> tuple[int, ...]:
    k = len(normalized_shape)
    if k == 0 or k > input.dim() or tuple(input.shape[-k:]) != tuple(normalized_shape):
        raise ValueError(
            f"costaware::rms_norm: normalized_shape {list(normalized_shape)} does not end "
            f"the input's shape {tuple(input.shape)}"
        )
    return tuple(range(input.dim() - k, input.dim()))


def _rstd_dtype(input: torch.Tensor) -> torch.dtype:
    """The inverse RMS is kept in the kernel's accumulation type (fp32 for half inputs)."""
    return torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype


@torch.library.custom_op("costaware::rms_norm", mutates_args=())
def _rms_norm_op(
    input: torch.Tensor, normalized_shape: list[int], weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the trailing ``normalized_shape`` dims as one kernel: the output and
    the inverse RMS of each row (kept for the backward). On real tensors a reference."""
    dims = _rms_dims(input, normalized_shape)
    x = input.to(_rstd_dtype(input))
    rstd = torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    out = x * rstd
    if weight is not None:
        out = out * weight
    return out.to(input.dtype), rstd


@_rms_norm_op.register_fake
def _rms_norm_fake(
    input: torch.Tensor, normalized_shape: list[int], weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    dims = _rms_dims(input, normalized_shape)
    rows = [1 if d in dims else n for d, n in enumerate(input.shape)]
    return input.new_empty(input.shape), input.new_empty(rows, dtype=_rstd_dtype(input))


@torch.library.custom_op("costaware::rms_norm_backward", mutates_args=())
def _rms_norm_backward_op(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    normalized_shape: list[int],
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
    need_weight: bool,
) -> list[torch.Tensor]:
    """The backward of :func:`_rms_norm_op`: ``[grad_input]``, and the weight's gradient
    when ``need_weight``. On real tensors a reference, from the kept inverse RMS ``r``:
    ``dx = r * (g - x r * mean(g * x r))`` with ``g`` the output gradient times the weight,
    and ``dw`` the sum of ``grad_out * x r`` over the rows."""
    dims = _rms_dims(input, normalized_shape)
    x_hat = input.to(rstd.dtype) * rstd
    g = grad_out.to(rstd.dtype)
    if weight is not None:
        g = g * weight
    grad_input = rstd * (g - x_hat * (g * x_hat).mean(dims, keepdim=True))
    result = [grad_input.to(input.dtype)]
    if weight is not None and need_weight:
        rows = tuple(range(input.dim() - len(dims)))
        result.append((grad_out.to(rstd.dtype) * x_hat).sum(rows).to(weight.dtype))
    return result


@_rms_norm_backward_op.register_fake
def _rms_norm_backward_fake(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    normalized_shape: list[int],
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
    need_weight: bool,
) -> list[torch.Tensor]:
    _rms_dims(input, normalized_shape)
    grads = [input.new_empty(input.shape)]
    if weight is not None and need_weight:
        grads.append(weight.new_empty(weight.shape))
    return grads


def _rms_norm_setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    input, normalized_shape, weight, _eps = inputs
    ctx.normalized_shape = list(normalized_shape)
    ctx.need_weight = weight is not None and weight.requires_grad
    ctx.save_for_backward(input, output[1], weight)  # what the CUDA backward reads
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _rms_norm_backward(
    ctx: Any, grad_out: torch.Tensor | None, _grad_rstd: torch.Tensor | None
) -> tuple[Any, ...]:
    if grad_out is None:
        return None, None, None, None
    input, rstd, weight = ctx.saved_tensors
    grads = torch.ops.costaware.rms_norm_backward(
        grad_out, input, ctx.normalized_shape, rstd, weight, ctx.need_weight
    )
    return grads[0], None, grads[1] if ctx.need_weight else None, None


_rms_norm_op.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup_context)


class _FusedRMSNorm(_FusedMode):
    """Routes ``F.rms_norm`` (``nn.RMSNorm``) to :func:`_rms_norm_op` where a CUDA GPU
    runs the fused kernel: input and weight of one dtype. Other calls run natively, as
    CUDA's composite does, and are counted in ``fallbacks``."""

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.rms_norm or func is torch.rms_norm:
            bound = _RMS_SIGNATURE.bind(*args, **kwargs)
            x, shape = bound.arguments["input"], bound.arguments["normalized_shape"]
            weight, eps = bound.arguments.get("weight"), bound.arguments.get("eps")
            why = None
            if not isinstance(x, torch.Tensor) or x.dtype not in _FUSED_DTYPES:
                why = "not a floating tensor"
            elif weight is not None and weight.dtype != x.dtype:
                why = "input and weight dtypes differ"
            if why is None:
                if eps is None:
                    eps = torch.finfo(x.dtype).eps
                shape = [shape] if isinstance(shape, int) else list(shape)
                self.fused += 1
                return torch.ops.costaware.rms_norm(x, shape, weight, float(eps))[0]
            self.fallbacks[why] += 1
        return func(*args, **kwargs)


_RMS_SIGNATURE = inspect.signature(torch.nn.functional.rms_norm)


# --------------------------------------------------------------------------------------
# fused dropout (the "fused" mode)
# --------------------------------------------------------------------------------------
# On a CUDA GPU, ``F.dropout`` in training (not in place, 0 < p < 1) runs as one
# ``native_dropout`` kernel: the output and a bool mask, which the backward
# (``native_dropout_backward``) reads. This CPU build runs it as its composite instead: a
# noise tensor of the input's dtype (``bernoulli_``, ``div_``) that the product's backward
# keeps, two or four times the mask's bytes (what that did to the OOM probes' MLPs:
# docs/features.md, version 21). The "fused" dry run traces the kernel as
# ``costaware::native_dropout`` and its backward as ``costaware::native_dropout_backward``
# (the op names the NSM groups count as dropout). In place, CUDA runs the composite too.


@torch.library.custom_op("costaware::native_dropout", mutates_args=())
def _dropout_op(input: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Dropout in training as one kernel: the output and the mask of the elements kept
    (bool). On real tensors a reference."""
    mask = torch.rand(input.shape, device=input.device) >= p
    return input * mask / (1.0 - p), mask


@_dropout_op.register_fake
def _dropout_fake(input: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    return input.new_empty(input.shape), input.new_empty(input.shape, dtype=torch.bool)


@torch.library.custom_op("costaware::native_dropout_backward", mutates_args=())
def _dropout_backward_op(grad: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """The backward of :func:`_dropout_op`: ``grad * mask * scale``, one new tensor."""
    return grad * mask * scale


@_dropout_backward_op.register_fake
def _dropout_backward_fake(grad: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    return grad.new_empty(grad.shape)


def _dropout_setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    ctx.scale = 1.0 / (1.0 - float(inputs[1]))
    ctx.save_for_backward(output[1])  # the mask: what the CUDA backward reads
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _dropout_backward(
    ctx: Any, grad: torch.Tensor | None, _grad_mask: torch.Tensor | None
) -> tuple[Any, ...]:
    if grad is None:
        return None, None
    (mask,) = ctx.saved_tensors
    return torch.ops.costaware.native_dropout_backward(grad, mask, ctx.scale), None


_dropout_op.register_autograd(_dropout_backward, setup_context=_dropout_setup_context)
_DROPOUT_SIGNATURE = inspect.signature(torch.nn.functional.dropout)
#: ``torch.dropout(input, p, train)``, a builtin without a signature of its own
_TORCH_DROPOUT_SIGNATURE = inspect.Signature(
    [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("input", "p", "train")]
)


class _FusedDropout(_FusedMode):
    """Routes ``F.dropout`` and ``torch.dropout`` in training to :func:`_dropout_op`
    where a CUDA GPU runs the fused kernel (not in place, ``0 < p < 1``, a floating
    tensor). Other calls run natively, as CUDA's composite does, and are counted in
    ``fallbacks``."""

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.dropout or func is torch.dropout:
            try:
                bound = (
                    _TORCH_DROPOUT_SIGNATURE if func is torch.dropout else _DROPOUT_SIGNATURE
                ).bind(*args, **kwargs)
            except TypeError:  # a call torch refuses: its own error, as a real step raises it
                return func(*args, **kwargs)
            bound.apply_defaults()
            x, p = bound.arguments["input"], bound.arguments["p"]
            train = bound.arguments.get("training", bound.arguments.get("train"))
            inplace = bound.arguments.get("inplace", False)
            if train and isinstance(p, (int, float)) and 0 < p < 1:
                why = None
                if inplace:
                    why = "in place"
                elif not isinstance(x, torch.Tensor) or not x.is_floating_point():
                    why = "not a floating tensor"
                elif x.numel() == 0:
                    why = "empty"
                if why is None:
                    self.fused += 1
                    return torch.ops.costaware.native_dropout(x, float(p))[0]
                self.fallbacks[why] += 1
        return func(*args, **kwargs)


# --------------------------------------------------------------------------------------
# fused recurrent layers (the "fused" mode)
# --------------------------------------------------------------------------------------
# On a CUDA GPU nn.LSTM / nn.GRU / nn.RNN run as cuDNN kernels: a few per layer and
# direction, whatever the sequence length. This CPU build runs an LSTM through oneDNN (one
# layer op without a FLOP formula) and unrolls a GRU or RNN into tens of small ops per
# time step, which puts thousands of cell ops into the trace. The "fused" dry run traces each layer as
# one ``costaware::rnn`` op and its backward as one ``costaware::rnn_backward`` op instead.


def _rnn_reserve_shape(
    mode: str, seq: int, batch: int, hidden: int, directions: int, train: bool
) -> tuple[int, ...]:
    """cuDNN's training reserve space of one layer: the gates and states backward reads."""
    if not train:
        return (0,)
    return (directions, seq, batch, (RNN_GATES[mode] + 2) * hidden)


def _in_clean_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a helper thread and return its result (or raise its error).

    The reference kernels below run torch's own RNN on real tensors; inside a custom op the
    dispatcher has autograd switched off for this thread (and a TorchFunctionMode may be
    active), so the backward's recomputation runs where neither applies.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    finished = threading.Event()

    def run() -> None:
        try:
            target()
        finally:
            finished.set()

    context = contextvars.copy_context()
    worker = threading.Thread(target=context.run, args=(run,), name="costaware-rnn-reference")
    worker.start()
    # waited on in steps, so that the dry run's time limit can stop the waiting thread
    while not finished.wait(0.05):
        pass
    if "error" in box:
        raise box["error"]
    return box["result"]


def _rnn_layer_reference(
    mode: str,
    input: torch.Tensor,
    weights: Sequence[torch.Tensor],
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    bidirectional: bool,
    train: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer through torch's own kernels (``torch._VF``), on real tensors."""
    per = len(weights) // (2 if bidirectional else 1)
    flat = list(weights)
    if mode == "lstm":
        assert cx is not None
        out, hy, cy = torch._VF.lstm(  # type: ignore[attr-defined]
            input, (hx, cx), flat, per == 4, 1, 0.0, train, bidirectional, False
        )
        return out, hy, cy
    out, hy = getattr(torch._VF, mode)(
        input, hx, flat, per == 4, 1, 0.0, train, bidirectional, False
    )
    return out, hy, hx.new_empty(0)


def _check_rnn_args(
    input: torch.Tensor,
    weights: Sequence[torch.Tensor],
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    mode: str,
    bidirectional: bool,
) -> tuple[int, int, int, int, int]:
    """Validate one layer's arguments as cuDNN would; returns (T, B, I, H, directions)."""
    if mode not in RNN_GATES:
        raise ValueError(f"costaware::rnn: unknown mode {mode!r}")
    d = 2 if bidirectional else 1
    if input.dim() != 3 or hx.dim() != 3:
        raise ValueError("costaware::rnn: input must be (T, B, I) and hx (D, B, H)")
    t, b, i = (int(s) for s in input.shape)
    h = int(hx.shape[-1])
    gh = RNN_GATES[mode] * h
    per = len(weights) // d
    if per not in (2, 4) or per * d != len(weights) or tuple(hx.shape) != (d, b, h):
        raise ValueError("costaware::rnn: weights or hidden state do not fit the layer")
    for k in range(d):
        w = weights[k * per : (k + 1) * per]
        if tuple(w[0].shape) != (gh, i) or tuple(w[1].shape) != (gh, h):
            raise ValueError(
                f"costaware::rnn: weights {tuple(w[0].shape)}, {tuple(w[1].shape)} do not fit "
                f"input size {i} and hidden size {h}"
            )
    if (cx is None) != (mode != "lstm"):
        raise ValueError("costaware::rnn: cx is required for an LSTM, and only for it")
    return t, b, i, h, d


@torch.library.custom_op("costaware::rnn", mutates_args=())
def _rnn_op(
    input: torch.Tensor,
    weights: list[torch.Tensor],
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    mode: str,
    bidirectional: bool,
    train: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One recurrent layer, both directions when ``bidirectional``, as one cuDNN call.

    ``input`` is time-major ``(T, B, I)``; ``weights`` are ``w_ih, w_hh[, b_ih, b_hh]`` per
    direction; ``hx`` (and ``cx``, an LSTM's cell state) are ``(D, B, H)``; ``mode`` is
    "lstm", "gru", "rnn_tanh" or "rnn_relu". Returns the output ``(T, B, D*H)``, ``hy``,
    ``cy`` (empty but for an LSTM) and the training reserve space
    (``(D, T, B, (gates+2)*H)``, what cuDNN keeps for the backward; empty when not
    training). On real tensors it runs torch's own kernels (a reference for the tests).
    """
    t, b, _, h, d = _check_rnn_args(input, weights, hx, cx, mode, bidirectional)
    out, hy, cy = _in_clean_thread(
        lambda: _rnn_layer_reference(mode, input, weights, hx, cx, bidirectional, train)
    )
    reserve = input.new_zeros(_rnn_reserve_shape(mode, t, b, h, d, train))
    return out, hy, cy, reserve


@_rnn_op.register_fake
def _rnn_fake(
    input: torch.Tensor,
    weights: list[torch.Tensor],
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    mode: str,
    bidirectional: bool,
    train: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    t, b, _, h, d = _check_rnn_args(input, weights, hx, cx, mode, bidirectional)
    out = input.new_empty((t, b, d * h))
    hy = hx.new_empty(hx.shape)
    cy = cx.new_empty(cx.shape) if cx is not None else hx.new_empty(0)
    return out, hy, cy, input.new_empty(_rnn_reserve_shape(mode, t, b, h, d, train))


@torch.library.custom_op("costaware::rnn_backward", mutates_args=())
def _rnn_backward_op(
    input: torch.Tensor,
    weights: list[torch.Tensor],
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    output: torch.Tensor,
    reserve: torch.Tensor,
    grad_output: torch.Tensor | None,
    grad_hy: torch.Tensor | None,
    grad_cy: torch.Tensor | None,
    mode: str,
    bidirectional: bool,
    need_weights: bool,
) -> list[torch.Tensor]:
    """The backward of :func:`_rnn_op` (cuDNN's backward-data and backward-weights calls).

    Returns ``[grad_input, grad_hx, grad_cx (LSTM only), *grad_weights (if need_weights)]``.
    On real tensors it recomputes the layer with autograd (a reference for the tests).
    """
    _check_rnn_args(input, weights, hx, cx, mode, bidirectional)

    def run() -> list[torch.Tensor]:
        leaves = [t.detach().requires_grad_() for t in (input, hx)]
        if cx is not None:
            leaves.append(cx.detach().requires_grad_())
        ws = [w.detach().requires_grad_() for w in weights]
        with torch.enable_grad():
            c = leaves[2] if cx is not None else None
            outs = _rnn_layer_reference(mode, leaves[0], ws, leaves[1], c, bidirectional, True)
        wrt = leaves + (ws if need_weights else [])
        pairs = [(o, g) for o, g in zip(outs, (grad_output, grad_hy, grad_cy)) if g is not None]
        if not pairs:
            return [torch.zeros_like(x) for x in wrt]
        grads = torch.autograd.grad(
            [o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True
        )
        return [g if g is not None else torch.zeros_like(x) for g, x in zip(grads, wrt)]

    result: list[torch.Tensor] = _in_clean_thread(run)
    return result


@_rnn_backward_op.register_fake
def _rnn_backward_fake(
    input: torch.Tensor,
    weights: list[torch.Tensor],
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    output: torch.Tensor,
    reserve: torch.Tensor,
    grad_output: torch.Tensor | None,
    grad_hy: torch.Tensor | None,
    grad_cy: torch.Tensor | None,
    mode: str,
    bidirectional: bool,
    need_weights: bool,
) -> list[torch.Tensor]:
    _check_rnn_args(input, weights, hx, cx, mode, bidirectional)
    grads = [input.new_empty(input.shape), hx.new_empty(hx.shape)]
    if cx is not None:
        grads.append(cx.new_empty(cx.shape))
    if need_weights:
        grads += [w.new_empty(w.shape) for w in weights]
    return grads


def _rnn_setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    input, weights, hx, cx, mode, bidirectional, _train = inputs
    out, _hy, _cy, reserve = output
    ctx.mode, ctx.bidirectional = mode, bidirectional
    ctx.has_cx = cx is not None
    ctx.need_weights = any(w.requires_grad for w in weights)
    ctx.n_weights = len(weights)
    # what cuDNN's backward reads: input, states, output and the reserve space (the
    # weights are parameters, or their autocast copies, kept alive for the backward)
    ctx.save_for_backward(input, hx, cx, out, reserve, *weights)
    ctx.mark_non_differentiable(reserve)
    ctx.set_materialize_grads(False)  # no zero gradients for unused outputs


def _rnn_backward(
    ctx: Any,
    grad_output: torch.Tensor | None,
    grad_hy: torch.Tensor | None,
    grad_cy: torch.Tensor | None,
    _grad_reserve: torch.Tensor | None,
) -> tuple[Any, ...]:
    input, hx, cx, out, reserve, *weights = ctx.saved_tensors
    grads = torch.ops.costaware.rnn_backward(
        input, weights, hx, cx, out, reserve, grad_output, grad_hy,
        grad_cy if ctx.has_cx else None, ctx.mode, ctx.bidirectional, ctx.need_weights,
    )  # fmt: skip
    n = 3 if ctx.has_cx else 2
    grad_cx = grads[2] if ctx.has_cx else None
    grad_w = list(grads[n:]) if ctx.need_weights else None
    return grads[0], grad_w, grads[1], grad_cx, None, None, None


_rnn_op.register_autograd(_rnn_backward, setup_context=_rnn_setup_context)
register_flop_formula(torch.ops.costaware.rnn, rnn_formula)
register_flop_formula(torch.ops.costaware.rnn_backward, rnn_backward_formula)

_RNN_VF = tuple(RNN_GATES)  # the torch._VF functions nn.LSTM / nn.GRU / nn.RNN call


def _rnn_weights_fit(
    mode: str, input_size: int, hidden: int, params: Sequence[Any], directions: int, per: int
) -> bool:
    """Whether every layer's ``w_ih`` and ``w_hh`` have the shapes a cuDNN layer takes."""
    gh = RNN_GATES[mode] * hidden
    for k in range(0, len(params), per):
        i = input_size if k < directions * per else directions * hidden
        w_ih, w_hh = params[k], params[k + 1]
        if not isinstance(w_ih, torch.Tensor) or not isinstance(w_hh, torch.Tensor):
            return False
        if tuple(w_ih.shape) != (gh, i) or tuple(w_hh.shape) != (gh, hidden):
            return False
    return True


class _FusedRNN(_FusedMode):
    """Routes ``torch._VF.lstm`` / ``gru`` / ``rnn_tanh`` / ``rnn_relu`` to fused layers.

    Each call (one ``nn.LSTM``, ``nn.GRU`` or ``nn.RNN`` forward) runs layer by layer as
    :func:`_rnn_op`, both directions of a layer in one op, with the inter-layer dropout as
    a dropout op and ``batch_first`` as a transpose (a view). Under autocast the input,
    states and weights are cast to the autocast dtype first, as CUDA's autocast casts them
    for cuDNN (it takes fp16 whatever the autocast dtype; the sizes are the same), and the
    weights' copies live until the backward. Packed sequences and LSTMs with projections
    (``proj_size``) run natively and are counted in ``fallbacks``; ``fused`` counts the
    calls routed, ``layers`` the layer kernels they became.
    """

    def __init__(self) -> None:
        super().__init__()
        self.layers = 0

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", None)
        if name in _RNN_VF and func == getattr(torch._VF, name):
            out = self._fused(name, args, kwargs)
            if out is not None:
                self.fused += 1
                return out
        return func(*args, **kwargs)

    def _fused(self, mode: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        why = None
        if kwargs or len(args) != 9 or not isinstance(args[3], bool):
            why = "packed sequence"  # (data, batch_sizes, hx, params, ...)
        else:
            x, hx, params, has_biases, layers, dropout, train, bidirectional, batch_first = args
            h0, c0 = (hx[0], hx[1]) if mode == "lstm" else (hx, None)
            d = 2 if bidirectional else 1
            per = 4 if has_biases else 2
            if not isinstance(x, torch.Tensor) or x.dim() != 3 or not x.is_floating_point():
                why = "input not a 3-D floating tensor"
            elif len(params) != layers * d * per or params[1].shape[-1] != h0.shape[-1]:
                why = "projections (proj_size)"
            elif not _rnn_weights_fit(mode, int(x.shape[-1]), int(h0.shape[-1]), params, d, per):
                why = "weight shapes"
        if why is None:
            # the shapes are checked above: an error here comes before any layer ran
            try:
                return self._layers(
                    mode, x, h0, c0, list(params), layers, dropout, train, bidirectional,
                    batch_first,
                )  # fmt: skip
            except (RuntimeError, TypeError, ValueError) as e:
                why = f"{type(e).__name__}: {str(e)[:80]}"
        self.fallbacks[why] += 1
        return None

    def _layers(
        self,
        mode: str,
        x: torch.Tensor,
        h0: torch.Tensor,
        c0: torch.Tensor | None,
        params: list[torch.Tensor],
        layers: int,
        dropout: float,
        train: bool,
        bidirectional: bool,
        batch_first: bool,
    ) -> Any:
        dev = x.device.type
        if torch.is_autocast_enabled(dev):
            dt = torch.get_autocast_dtype(dev)

            def cast(t: torch.Tensor) -> torch.Tensor:
                return t if t.dtype == dt or not t.is_floating_point() else t.to(dt)

            x, h0, params = cast(x), cast(h0), [cast(p) for p in params]
            c0 = cast(c0) if c0 is not None else None
        if batch_first:
            x = x.transpose(0, 1)
        d = 2 if bidirectional else 1
        per = len(params) // (layers * d)
        hs: list[torch.Tensor] = []
        cs: list[torch.Tensor] = []
        for layer in range(layers):
            if layer and dropout > 0 and train:
                x = torch.nn.functional.dropout(x, dropout, True)
            w = params[layer * d * per : (layer + 1) * d * per]
            h = h0[layer * d : (layer + 1) * d]
            c = c0[layer * d : (layer + 1) * d] if c0 is not None else None
            x, hy, cy, _ = torch.ops.costaware.rnn(x, w, h, c, mode, bidirectional, train)
            self.layers += 1
            hs.append(hy)
            cs.append(cy)
        out = x.transpose(0, 1) if batch_first else x
        h_n = torch.cat(hs) if layers > 1 else hs[0]
        if mode != "lstm":
            return out, h_n
        return out, h_n, torch.cat(cs) if layers > 1 else cs[0]


# --------------------------------------------------------------------------------------
# the dry run
# --------------------------------------------------------------------------------------
def _bound_batch(rec: _Recorder, batch_spec: Any, batch: Any) -> None:
    """Tell the recorder the value range of a built-in batch's labels and token ids."""
    if isinstance(batch_spec, TokenBatch):
        for field, n, arg in batch_spec.index_ranges():
            rec.bound(batch[field], n, f"{field} ({arg}={n})", f"TokenBatch(..., {arg}={{n}})")
    elif isinstance(batch_spec, ImageBatch):  # and SegmentationBatch
        kind = type(batch_spec).__name__
        field = f"labels (classes={batch_spec.classes})"
        fix = f"{kind}(..., classes={{n}}), or a loss that maps the labels into range"
        rec.bound(batch[1], batch_spec.classes, field, fix)


def _trace(spec: TrainingSpec, model: nn.Module, how: str, attention: str = "native") -> Trace:
    from torch._subclasses.fake_tensor import FakeTensorMode

    t0 = time.perf_counter()
    fm = FakeTensorMode(allow_non_fake_inputs=True)
    rec = _Recorder(cpu=attention == "native")
    fused = _FusedAttention() if attention == "fused" else contextlib.nullcontext()
    fused_rnn = _FusedRNN() if attention == "fused" else contextlib.nullcontext()
    fused_norm = _FusedRMSNorm() if attention == "fused" else contextlib.nullcontext()
    fused_dropout = _FusedDropout() if attention == "fused" else contextlib.nullcontext()
    loss_fn = spec.loss or default_loss
    batch_spec = spec.batch_spec
    bs = spec.batch_size
    autocast_dtype = spec.autocast_dtype
    param_dtype = spec.param_dtype  # a pure precision: the model and inputs in one type
    opt_cls = spec.optimizer_class
    opt_kwargs = dict(spec.optimizer_kwargs)
    try:
        if "foreach" in inspect.signature(opt_cls).parameters and "fused" not in opt_kwargs:
            # each device's default: CUDA's multi-tensor path, a CPU's one tensor at a time
            opt_kwargs.setdefault("foreach", attention == "fused")
    except (TypeError, ValueError):
        pass

    with fm:
        _to_fake(model, param_dtype)
        model.train()
        # one rank of sharded training (FSDP, ZeRO): its shards, gathers and reduce-scatters
        sharded = (
            ShardedStep(model, spec.sharding, spec.world_size, spec.wrap_policy, rec)
            if spec.sharding is not None
            else None
        )
        with rec, fused, fused_rnn, fused_norm, fused_dropout:
            if sharded is None:
                rec.label(list(model.parameters()), "parameters")
            else:
                sharded.setup()
            rec.label(list(model.buffers()), "buffers")
            # DDP's gradient buckets, allocated with the model and held throughout
            ddp = spec.world_size > 1 and sharded is None
            buckets = _ddp_buckets(model, spec.bucket_cap_mb) if ddp else []
            rec.label(buckets, "gradients")
            opt_params = list(model.parameters()) if sharded is None else sharded.optimizer_params
            try:
                opt = opt_cls(opt_params, **opt_kwargs)
            except (TypeError, ValueError) as e:
                raise SpecError(
                    f"optimizer {spec.optimizer_name!r} rejected its arguments {opt_kwargs}: {e}"
                ) from e
            micro = min(spec.grad_accumulation, 2)
            rec.step = 1
            rec.record_graph = True
            rec.mark("step")
            for _ in range(micro):
                rec.mark("input")
                if param_dtype is None:
                    batch = batch_spec.make(bs)
                else:
                    # converted before it reaches the device, as Lightning's pure precision
                    # converts a batch: the device holds the converted tensors alone
                    rec.paused = True
                    try:
                        batch = cast_floating(batch_spec.make(bs), param_dtype)
                    finally:
                        rec.paused = False
                rec.label(batch, "inputs")
                _bound_batch(rec, batch_spec, batch)
                check_positions(model, batch)
                rec.mark("forward")
                if autocast_dtype is not None:
                    with torch.autocast("cpu", dtype=autocast_dtype):
                        loss = loss_fn(model, batch)
                else:
                    loss = loss_fn(model, batch)
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    raise SpecError(
                        "the loss must return a scalar tensor, but it returned "
                        f"{type(loss).__name__}{tuple(getattr(loss, 'shape', ()))}."
                    )
                rec.mark("backward")
                loss.backward()
                if sharded is not None:
                    sharded.after_backward()
                del loss, batch
            grads = [p.grad for p in opt_params if p.grad is not None]
            grad_bytes = rec.label(grads, "gradients")
            del grads
            rec.mark("optimizer")
            params = list({id(p): p for p in opt_params if p.grad is not None}.values())
            param_tensors = len(params)
            stepped_numel = sum(p.numel() for p in params)
            if _flat_optimizer_ok(spec, opt_kwargs, params):
                state_bytes = _flat_optimizer_step(rec, opt_cls, opt_kwargs, params)
            else:
                state_bytes = _optimizer_step(rec, fm, opt)
            rec.mark("zero_grad")
            opt.zero_grad(set_to_none=True)
            if sharded is not None:  # ZeRO-1's whole gradients
                model.zero_grad(set_to_none=True)
                sharded.close()
            rec.mark("end")
            rec.closed = True
            del buckets, opt_params

    param_count = sum(p.numel() for p in model.parameters())
    param_bytes = sum(
        _round(p.untyped_storage().nbytes())
        for p in {id(p): p for p in model.parameters()}.values()
    )
    buffer_bytes = sum(_round(b.untyped_storage().nbytes()) for b in model.buffers())
    del opt, model

    ev_key, ev_size, marks, transients = _with_second_step(rec)
    events = np.asarray([ev_key, ev_size], dtype=np.int64).T.reshape(-1, 2)
    offset = rec._next_key  # step-2 keys are step-1 keys + offset

    def origin(k: int) -> int:
        return k - offset if k >= offset else k

    def category(k: int) -> str:
        cat = rec.key_category.get(origin(k))
        if cat is None:
            cat = "activations" if rec.key_phase.get(origin(k)) == "forward" else "temporaries"
        return cat

    def scales(k: int) -> bool:
        cat = category(k)
        return cat in ("inputs", "activations") or (
            cat == "temporaries" and rec.key_phase.get(origin(k)) == "backward"
        )

    event_category = np.asarray([_CAT_CODE[category(k)] for k in ev_key], dtype=np.int8)
    timeline, peak_live, breakdown, phase_peaks = _memory_profile(events, event_category, marks)

    g = nx.DiGraph()
    op_counts: Counter[str] = Counter()
    for i, (name, phase, cls, dcode, nout, fl, nb, _) in enumerate(rec.nodes):
        g.add_node(
            i, op=name, phase=phase, op_class=cls, dtype=dcode, outputs=nout, flops=fl, bytes=nb
        )
        op_counts[name] += 1
    g.add_edges_from(rec.edges)
    notes: list[str] = []
    if how == "cpu":
        notes.append(
            "the model constructor failed on the meta device, so it was built for real on the CPU"
        )
    if sharded is not None:
        notes.append(sharded.note())
    if rec.unsupported:
        notes.append(f"FLOPs not counted for ops whose formula failed: {dict(rec.unsupported)}")
    if isinstance(fused, _FusedAttention) and (
        note := fused.note(
            f"attention traced as a fused flash kernel, as a CUDA GPU runs it "
            f"({fused.fused} SDPA calls per step; no score matrix or dropout mask)",
            "ran natively",
        )
    ):
        notes.append(note)
    if isinstance(fused_rnn, _FusedRNN) and (
        note := fused_rnn.note(
            f"recurrent layers traced as fused cuDNN kernels, as a CUDA GPU runs them "
            f"({fused_rnn.fused} RNN calls per step, {fused_rnn.layers} layer kernels; "
            "no per-timestep cells)",
            "ran natively",
        )
    ):
        notes.append(note)
    if isinstance(fused_norm, _FusedRMSNorm) and (
        note := fused_norm.note(
            f"RMSNorm traced as one fused kernel, as a CUDA GPU runs it ({fused_norm.fused} "
            "calls per step; the backward keeps the input and the inverse RMS)",
            "ran as the composite, as CUDA runs them",
        )
    ):
        notes.append(note)
    if isinstance(fused_dropout, _FusedDropout) and (
        note := fused_dropout.note(
            f"dropout traced as one fused kernel, as a CUDA GPU runs it ({fused_dropout.fused} "
            "calls per step; the backward keeps a bool mask)",
            "ran as the composite, as CUDA runs them",
        )
    ):
        notes.append(note)
    return Trace(
        batch_size=bs,
        graph=g,
        events=events,
        timeline=timeline,
        peak_live=peak_live,
        peak_breakdown=breakdown,
        phase_peaks=phase_peaks,
        flops_forward=rec.flops["forward"],
        flops_backward=rec.flops["backward"],
        flops_optimizer=rec.flops["optimizer"],
        bytes_moved=rec.bytes_moved,
        param_count=int(param_count),
        param_bytes=int(param_bytes),
        buffer_bytes=int(buffer_bytes),
        gradient_bytes=int(grad_bytes),
        optimizer_state_bytes=int(state_bytes),
        input_bytes=int(breakdown["inputs"]),
        op_counts=op_counts,
        node_flops=np.asarray([n[5] for n in rec.nodes], dtype=np.float64),
        node_bytes=np.asarray([n[6] for n in rec.nodes], dtype=np.float64),
        node_class=np.asarray([n[2] for n in rec.nodes], dtype=np.int8),
        node_dtype=np.asarray([n[3] for n in rec.nodes], dtype=np.int8),
        node_phase=np.asarray([_node_phase(n[0], n[1]) for n in rec.nodes], dtype=np.int8),
        node_serial=np.asarray([n[7] for n in rec.nodes], dtype=np.int64),
        event_category=event_category,
        event_scales=np.asarray([scales(k) for k in ev_key], dtype=bool),
        marks=marks,
        build=how,
        duration_s=time.perf_counter() - t0,
        op_signature=hashlib.sha1(" ".join(n[0] for n in rec.nodes).encode()).hexdigest()
        + f":{len(ev_key)}",
        notes=notes,
        transients=np.asarray(transients, dtype=np.int64).reshape(-1, 3),
        param_tensors=param_tensors,
        stepped_numel=int(stepped_numel),
        collectives=tuple(sharded.collectives) if sharded is not None else (),
    )


#: DDP's first gradient bucket's size (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``)
_DDP_FIRST_BUCKET_BYTES = 1024 * 1024


def ddp_bucket_sizes(
    params: Sequence[torch.Tensor], cap_mb: float
) -> list[tuple[int, torch.dtype]]:
    """``(elements, dtype)`` of each gradient bucket DDP allocates for ``params``, as its
    reducer assigns them (``_compute_bucket_assignment_by_size``): the parameters that
    take a gradient in reverse order, one open bucket per dtype, closed once it reaches
    1 MiB for the first and ``cap_mb`` MiB for the others."""
    limits = (_DDP_FIRST_BUCKET_BYTES, int(cap_mb * 2**20))
    open_: dict[torch.dtype, list[int]] = {}  # dtype -> [elements, buckets closed]
    out: list[tuple[int, torch.dtype]] = []
    for p in reversed(list(params)):
        state = open_.setdefault(p.dtype, [0, 0])
        state[0] += p.numel()
        if state[0] * p.element_size() >= limits[min(state[1], 1)]:
            out.append((state[0], p.dtype))
            state[0], state[1] = 0, state[1] + 1
    out += [(n, dtype) for dtype, (n, _) in open_.items() if n]
    return out


def _ddp_buckets(model: nn.Module, cap_mb: float) -> list[torch.Tensor]:
    """DDP's gradient buckets for ``model``'s parameters, as (fake) tensors."""
    params = [p for p in {id(p): p for p in model.parameters()}.values() if p.requires_grad]
    return [torch.empty(n, dtype=dtype) for n, dtype in ddp_bucket_sizes(params, cap_mb)]


def _optimizer_step(rec: _Recorder, fm: Any, opt: torch.optim.Optimizer) -> int:
    """Run the real optimizer step on the model's fake parameters (exact, slower)."""
    # multi-tensor ops take hundreds of tensors: hashing them for FakeTensorMode's cache
    # costs more than running them uncached (a step one tensor at a time hits the cache)
    cache_was = fm.cache_enabled
    fm.cache_enabled = cache_was and opt.defaults.get("foreach") is False
    try:
        opt.step()
    finally:
        fm.cache_enabled = cache_was
    return rec.label([list(s.values()) for s in opt.state.values()], "optimizer_state")


def _flat_optimizer_ok(
    spec: TrainingSpec, opt_kwargs: dict[str, Any], params: Sequence[torch.Tensor]
) -> bool:
    """Whether the optimizer step may run on one flat tensor (see _flat_optimizer_step)."""
    return (
        isinstance(spec.optimizer, str)  # the built-in optimizers are elementwise
        and opt_kwargs.get("foreach", True) is not False
        and len(params) > 1
        and len({p.dtype for p in params}) == 1
    )


def _flat_optimizer_step(
    rec: _Recorder,
    opt_cls: type[torch.optim.Optimizer],
    opt_kwargs: dict[str, Any],
    params: Sequence[torch.Tensor],
) -> int:
    """Run an elementwise optimizer's step on one flat parameter, then expand its events.

    A multi-tensor (``foreach``) step allocates, for each list op, one output per
    parameter, and frees them together. Running it on a single flat parameter of the same
    total size gives the same sequence with one block per list; each block whose size is
    proportional to the flat parameter is expanded back into one block per parameter, in
    parameter order. Fused steps allocate no temporaries either way. This is 10-30x
    faster than dispatching hundreds of tensors through FakeTensorMode.
    """
    numels = [p.numel() for p in params]
    total = sum(numels)
    rec.paused = True
    try:
        flat = nn.Parameter(torch.empty(total, dtype=params[0].dtype))
        flat.grad = torch.empty(total, dtype=params[0].dtype)
        opt = opt_cls([flat], **opt_kwargs)
    finally:
        rec.paused = False
    sub = _Recorder()
    sub.phase = "optimizer"
    sub.record_graph = rec.record_graph
    rec.paused = True
    try:
        with sub:
            opt.step()
            sub.label([list(s.values()) for s in opt.state.values()], "optimizer_state")
            sub.closed = True
    finally:
        rec.paused = False
    expanded: dict[int, list[int]] = {}
    state_bytes = 0
    for k, size in zip(sub.ev_key, sub.ev_size):
        if size > 0:
            per_elem, rem = divmod(size, total)
            sizes = (
                [n * per_elem for n in numels] if rem == 0 and per_elem in (1, 2, 4, 8) else [size]
            )
            keys = []
            for sz in sizes:
                key = rec._next_key
                rec._next_key += 1
                keys.append(key)
                rec.ev_key.append(key)
                rec.ev_size.append(sz)
                rec.key_phase[key] = "optimizer"
                if sub.key_category.get(k) == "optimizer_state":
                    rec.key_category[key] = "optimizer_state"
                    state_bytes += _round(sz)
            expanded[k] = keys
        else:
            for key in expanded.pop(k, ()):
                rec.ev_key.append(key)
                rec.ev_size.append(-1)
    rec.flops["optimizer"] += sub.flops["optimizer"]
    rec.bytes_moved += sub.bytes_moved
    rec.nodes.extend(sub.nodes)
    del opt, flat
    return state_bytes


def _with_second_step(
    rec: _Recorder,
) -> tuple[list[int], list[int], list[tuple[int, str]], list[tuple[int, int, int]]]:
    """Append step 2 to the recorded step 1, without running it again.

    Step 2 repeats step 1's allocations and frees under fresh keys, except that the
    optimizer state step 1 created stays allocated instead of being created again. This
    is what every later step does, and it halves the cost of the dry run. Returns the
    events' keys and sizes, the phase marks, and the transients of both steps.
    """
    marks = list(rec.phase_marks)
    start = next(i for i, name in marks if name == "step")
    n = len(rec.ev_key)
    allocated_in_step: set[int] = set()
    ev_key, ev_size = list(rec.ev_key), list(rec.ev_size)
    step_marks = [(i, name) for i, name in marks if i >= start]
    m = 0
    offset = rec._next_key
    transients = list(rec.transients)
    repeat = [(i, nbytes, fixed) for i, nbytes, fixed in rec.transients if i >= start]
    t = 0
    for i in range(start, n):
        while m < len(step_marks) and step_marks[m][0] <= i:
            marks.append((len(ev_key), step_marks[m][1]))
            m += 1
        while t < len(repeat) and repeat[t][0] <= i:
            transients.append((len(ev_key), *repeat[t][1:]))
            t += 1
        k, sz = rec.ev_key[i], rec.ev_size[i]
        if sz > 0:
            allocated_in_step.add(k)
        if rec.key_category.get(k) == "optimizer_state" or k not in allocated_in_step:
            continue  # state persists; storages from before step 1 are not re-freed
        ev_key.append(k + offset)
        ev_size.append(sz)
    marks.extend((len(ev_key), name) for _, name in step_marks[m:])
    transients.extend((len(ev_key), nbytes, fixed) for _, nbytes, fixed in repeat[t:])
    return ev_key, ev_size, marks, transients


def _node_phase(name: str, phase: str) -> int:
    if phase == "forward":
        return 0
    if phase == "backward":
        return 1
    return 3 if name in _STATE_INIT_OPS else 2


# --------------------------------------------------------------------------------------
# a failed dry run: the user's bug (fail fast) or the dry run's own limit (fail open)
# --------------------------------------------------------------------------------------
#: torch's loggers that report an op failing inside a dry run (FakeTensorMode logs every
#: meta kernel that raises, with its traceback, at ERROR): silenced in the dry run's
#: thread while it runs, as the error it raises says what happened
_QUIET_LOGGERS = (
    "torch._subclasses.fake_tensor",
    "torch._subclasses.meta_utils",
    "torch.fx.experimental.symbolic_shapes",
)
#: set in a thread (context) whose records of ``_QUIET_LOGGERS`` are dropped
_QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("costaware_quiet", default=False)
_QUIET_LOCK = threading.Lock()
_QUIET_USERS = 0


class _DryRunLogFilter(logging.Filter):
    """Drops the records logged from inside a dry run; every other thread's pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _QUIET.get()


_LOG_FILTER = _DryRunLogFilter()


@contextlib.contextmanager
def _quiet_torch_logs() -> Iterator[None]:
    """Silence ``_QUIET_LOGGERS`` for this thread while the block runs.

    A filter on those loggers, added while any dry run is in progress and removed after the
    last, drops the records of the threads inside one: the levels, handlers and filters the
    user set stay as they are, and other threads log as before.
    """
    global _QUIET_USERS
    with _QUIET_LOCK:
        if _QUIET_USERS == 0:
            for name in _QUIET_LOGGERS:
                logging.getLogger(name).addFilter(_LOG_FILTER)
        _QUIET_USERS += 1
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)
        with _QUIET_LOCK:
            _QUIET_USERS -= 1
            if _QUIET_USERS == 0:
                for name in _QUIET_LOGGERS:
                    logging.getLogger(name).removeFilter(_LOG_FILTER)


#: what torch says when a fake or meta tensor cannot do what a real one would
_FAKE_WORDS = re.compile(
    r"fake ?tensor|fake impl|tensor subclass|meta tensor|meta device|'Meta' backend|"
    r"meta kernel|data pointer|data_ptr|doesn't have storage|without storage|"
    r"data-dependent|data dependent|unbacked|SymInt|SymFloat|SymBool|__torch_dispatch__",
    re.IGNORECASE,
)
#: what torch says about an operator without a fake (meta) implementation
_NO_FAKE_IMPL = re.compile(
    r"no fake impl|no fake implementation|no meta kernel|'Meta' backend|"
    r"attempted to run this operator with Meta tensors",
    re.IGNORECASE,
)
#: what torch says about a device the dry run does not have (it keeps every tensor on a
#: fake CPU)
_DEVICE_WORDS = re.compile(
    r"CUDA|NVIDIA|\bMPS\b|\bXPU\b|ROCm|HIP|same device|different devices|two different "
    r"devices|device type",
)
#: what torch says about shapes that do not fit (the user's bug)
_SHAPE_WORDS = re.compile(
    r"shape|size|dimension|\bdims?\b|channels|mat1|mat2|broadcast|reduction dim|"
    r"expected .{0,80}(?:but )?got",
    re.IGNORECASE,
)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, once each."""
    out: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or any(e is o for o in out):
            continue
        out.append(e)
        todo += [e.__cause__, e.__context__]
    return out


def _limit_of_the_dry_run(exc: BaseException) -> str | None:
    """Why ``exc`` is a limit of the dry run rather than the user's bug ("value",
    "dynamic", "unsupported", "device", "fake", "internal"), or None where it is theirs."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedOperatorException,
    )

    for e in _chain(exc):  # a fake tensor's refusal, however the model re-raised it
        if isinstance(e, DataDependentOutputException):
            return "value"
        if isinstance(e, DynamicOutputShapeException):
            return "dynamic"
        if isinstance(e, UnsupportedOperatorException) or _NO_FAKE_IMPL.search(str(e)):
            return "unsupported"
        if type(e).__module__.startswith(
            ("torch._subclasses", "torch.fx.experimental", "torch._guards")
        ):
            return "device" if _DEVICE_WORDS.search(str(e)) else "fake"
    text = str(exc)
    if _DEVICE_WORDS.search(text):
        return "device"
    if _FAKE_WORDS.search(text):
        return "fake"
    frames = traceback.extract_tb(exc.__traceback__)
    innermost = frames[-1].filename if frames else ""
    # torch's word for an operator without a meta kernel; a module without a forward, or
    # the user's own `raise NotImplementedError`, is the user's
    if (
        isinstance(exc, NotImplementedError)
        and not _is_theirs(innermost)
        and 'missing the required "forward"' not in text
    ):
        return "unsupported"
    if _raised_by_costaware(exc):
        return "internal"
    return None


def _untraceable(exc: BaseException, why: str) -> TraceError:
    """The dry run's own failure, said so: the trial is admitted (fail open)."""
    where = _where(exc)
    ours = "This is a limit of costaware's dry run, not a bug in the model"
    if why == "value":
        return UntraceableModelError(
            f"The model cannot run on fake tensors: it reads a tensor's value {where} "
            "(.item(), .tolist(), float(t), or a Python `if` on a tensor), and a dry run's "
            f"tensors have no values. {ours}; to make it predictable, keep the computation in "
            "tensors (torch.where rather than an `if`)."
        )
    if why == "dynamic":
        return UntraceableModelError(
            f"The model cannot run on fake tensors: the operator {_op_of(exc)} {where} "
            "returns a tensor whose size depends on the values (nonzero, a boolean mask such as "
            f"x[x > 0], unique), and a dry run's tensors have no values. {ours}; to make it "
            "predictable, use a fixed-size form (torch.where(mask, x, 0), masked_fill)."
        )
    if why == "unsupported":
        return UntraceableModelError(
            f"The model cannot run on fake tensors: an operator {where} has no fake (meta) "
            f"implementation ({_said(exc)}). {ours}; an operator of your own can be "
            "given one with torch.library.register_fake."
        )
    if why == "device":
        return UntraceableModelError(
            f"The model cannot run on fake tensors: it places tensors on a device of its own "
            f"{where} ({_said(exc)}), and the dry run keeps every tensor on a fake CPU. "
            f"{ours}; to make it predictable, create tensors on the input's device "
            "(torch.zeros(..., device=x.device)) or register them as buffers."
        )
    if why == "internal":
        return TraceError(
            f"costaware's dry run failed inside costaware at {_own_line(exc)}: "
            f"{_said(exc)}. This is costaware's bug, not the model's; please report it."
        )
    return UntraceableModelError(
        f"The model cannot run on fake tensors: {_said(exc)} {where}. {ours}: the "
        "step runs on tensors without data, and this model needs them."
    )


def _where(exc: BaseException) -> str:
    """``"at path:line (`code`)"`` in the user's code, or ``"inside torch"``."""
    line = _failing_line(exc)
    return line if line == "inside torch" else "at " + line


def _said(exc: BaseException) -> str:
    """``first_line(exc)`` without its closing period, to go inside a sentence."""
    return first_line(exc).rstrip(". ")


def _op_of(exc: BaseException) -> str:
    """The aten operator a fake tensor refused (``aten.nonzero``), from the chain."""
    for e in _chain(exc):
        func = getattr(e, "func", None)
        if func is not None:
            name = str(func)
            return name[: -len(".default")] if name.endswith(".default") else name
    return _said(exc)


def _own_line(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an unknown place"
    last = frames[-1]
    return f"{os.path.basename(last.filename)}:{last.lineno}"


def _shape(t: Any) -> str | None:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else None


def _failing_layer(
    exc: BaseException, model: nn.Module | None
) -> tuple[str, nn.Module, Any] | None:
    """The innermost module that was running when ``exc`` arose: its name in ``model``
    (``"fc"``; ``""`` for the model itself), the module, and the input it was called with
    (None where that is not a tensor)."""
    layer: nn.Module | None = None
    inputs: dict[int, Any] = {}
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        this = frame.f_locals.get("self")
        if not isinstance(this, nn.Module):
            continue
        layer = this
        if frame.f_code.co_name in ("_call_impl", "_wrapped_call_impl"):
            args = frame.f_locals.get("args")  # as the module was called, never rebound
            if isinstance(args, tuple) and args:
                inputs[id(this)] = args[0]
    if layer is None:
        return None
    names = {id(m): n for n, m in model.named_modules()} if model is not None else {}
    return names.get(id(layer), "?"), layer, inputs.get(id(layer))


def _batch_words(spec: TrainingSpec) -> str:
    """The spec's batch as the user wrote it, and the inputs it makes."""
    b = spec.batch
    bs = spec.batch_size
    if isinstance(b, ImageBatch):
        return f"{b!r} at batch_size={bs}: inputs of shape {(bs, *b.shape)}"
    if isinstance(b, TokenBatch):
        return f"{b!r} at batch_size={bs}: input_ids of shape {(bs, b.seq_len)}"
    return f"batch={_factory_name(b)}({bs})"


def _image_size_hint(spec: TrainingSpec, modules: list[nn.Module]) -> str | None:
    """Where the model records the image size it was built for and the batch's differs."""
    b = spec.batch
    if not isinstance(b, ImageBatch) or len(b.shape) != 3:
        return None
    for m in modules:
        config = getattr(m, "config", None)
        for owner in (m, config):
            for attr in ("image_size", "img_size"):
                size = getattr(owner, attr, None) if owner is not None else None
                if isinstance(size, (tuple, list)) and len(size) == 2:
                    hw = tuple(int(v) for v in size)
                elif isinstance(size, int):
                    hw = (size, size)
                else:
                    continue
                if hw != tuple(b.shape[1:]):
                    c = b.shape[0]
                    return (
                        f"the model was built for {attr}={size} but the batch's images are "
                        f"{b.shape[1]}x{b.shape[2]}: make the batch "
                        f"{type(b).__name__}(shape={(c, *hw)}, ...) or build the model with "
                        f"{attr}={b.shape[1] if b.shape[1] == b.shape[2] else tuple(b.shape[1:])}"
                    )
    return None


def _layer_hint(spec: TrainingSpec, label: str, layer: nn.Module, arg: Any) -> str | None:
    """The size a linear or convolutional layer takes against the one it was given."""
    if not isinstance(arg, torch.Tensor):
        return None
    if isinstance(layer, nn.Linear) and arg.dim() >= 1 and arg.shape[-1] != layer.in_features:
        got = int(arg.shape[-1])
        return (
            f"{label} takes in_features={layer.in_features} per sample but gets {got}: make the "
            f"batch give it {layer.in_features}, or build the layer with in_features={got}"
        )
    if isinstance(layer, nn.modules.conv._ConvNd) and arg.dim() >= 2:
        got = int(arg.shape[1] if arg.dim() > layer.weight.dim() - 2 else arg.shape[0])
        if got != layer.in_channels:
            fit = ""
            b = spec.batch
            if isinstance(b, ImageBatch) and len(b.shape) == 3 and b.shape[0] == got:
                fit = f" ({type(b).__name__}(shape={(layer.in_channels, *b.shape[1:])}, ...))"
            return (
                f"{label} takes in_channels={layer.in_channels} but gets {got} channels: make the "
                f"batch give it {layer.in_channels}{fit}, or build the layer with "
                f"in_channels={got}"
            )
    return None


def _user_bug(exc: Exception, spec: TrainingSpec, model: nn.Module | None) -> UserCodeError:
    """The user's bug in the training step (forward, loss, backward), said so: where it
    arose, in which layer, with what input, and what to change."""
    where = _where(exc)
    frames = [f for f, _ in traceback.walk_tb(exc.__traceback__)]
    files = [f.f_code.co_filename for f in frames]
    names = [f.f_code.co_name for f in frames]
    loss_code = getattr(spec.loss, "__code__", None)
    if any(p.startswith(_TORCH_DIR + "optim") for p in files) or "_optimizer_step" in names:
        what, fix = "The optimizer step", "fix the optimizer or its arguments"
    elif any(
        p.startswith(_TORCH_DIR) and n in ("backward", "_engine_run_backward")
        for p, n in zip(files, names, strict=True)
    ):
        what, fix = "The backward pass", "fix the model's custom backward"
    elif any(isinstance(f.f_locals.get("self"), nn.Module) for f in frames):
        what, fix = "The model's forward", "fix the model"
    elif loss_code is not None and any(f.f_code is loss_code for f in frames):
        what, fix = "The loss", "fix the loss"
    elif spec.loss is None and any(
        os.path.basename(p) == "spec.py" and p.startswith(_OWN_DIRS) for p in files
    ):
        what = "costaware's default loss"
        fix = (
            "pass TrainingSpec(loss=callable(model, batch)) that computes the loss as the "
            "training does"
        )
    else:
        what, fix = "The training step", "fix the model or the loss"
    found = _failing_layer(exc, model)
    in_layer, hint = "", None
    if found is not None:
        name, layer, arg = found
        label = f"`{name}`" if name not in ("", "?") else "the model"
        in_layer = f", in {label} ({_short_repr(layer)}"
        if _shape(arg) is not None:
            in_layer += f", given an input of shape {_shape(arg)}"
        in_layer += ")"
        hint = _layer_hint(spec, label, layer, arg)
    modules = [m for m in (model, found[1] if found else None) if m is not None]
    batch = _batch_words(spec)
    # torch says that a shape does not fit with a RuntimeError (a loss's batch sizes with a
    # ValueError, a model's own check with an AssertionError); an IndexError or a TypeError
    # is the code's own mistake, whatever words it uses
    if isinstance(exc, (RuntimeError, ValueError, AssertionError)) and _SHAPE_WORDS.search(
        str(exc)
    ):
        if what != "The model's forward":  # the loss does not fit the model's output
            change = f"Make it fit the model's output and the batch: {fix}."
        else:
            hint = hint or _image_size_hint(spec, modules)
            change = (
                "Change the batch to the shape the model was built for, or build the model for "
                "this batch"
                + (f": {hint}." if hint else " (its input size, channels or image size).")
            )
        return UserCodeError(
            f"{what} fails on a shape mismatch {where}{in_layer}: {_said(exc)}. The batch is "
            f"{batch}. A real training step fails the same way. {change}"
        )
    return UserCodeError(
        f"{what} raised {_said(exc)} {where}{in_layer}. A real training step runs the same "
        f"code and fails the same way: {fix} (the batch is {batch})."
    )


def _short_repr(module: nn.Module) -> str:
    """``Linear(in_features=784, out_features=64, bias=True)``; a container's class name."""
    extra = module.extra_repr()
    return (
        f"{type(module).__name__}({extra})"
        if extra and "\n" not in extra
        else type(module).__name__
    )


def _classify(exc: Exception, spec: TrainingSpec, model: nn.Module | None) -> Exception:
    """The error a failed dry run raises: the user's bug (:class:`UserCodeError`), or the
    dry run's own failure (:class:`UntraceableModelError`, :class:`TraceError`)."""
    if isinstance(exc, CostawareError):
        return exc
    why = _limit_of_the_dry_run(exc)
    if why is not None:
        return _untraceable(exc, why)
    if isinstance(exc, MemoryError):
        return TraceError(f"the dry run ran out of this machine's memory: {first_line(exc)}")
    return _user_bug(exc, spec, model)


def dry_run(
    spec: TrainingSpec,
    *,
    timeout: float | None = 60.0,
    attention: str = "native",
    real_build_limit: int | None = None,
) -> Trace:
    """Run two training steps of ``spec`` on fake tensors and return what they did.

    ``attention`` is "native" (as this CPU runs the step: SDPA's math path when dropout is
    on, recurrent layers through oneDNN or unrolled into per-timestep cells, and the
    optimizer one parameter at a time, PyTorch's default on a CPU) or "fused" (as a CUDA
    GPU runs it: SDPA as one flash kernel, each nn.LSTM / nn.GRU / nn.RNN layer as one
    fused cuDNN kernel forward and one backward, see :class:`_FusedRNN`, and the
    optimizer's multi-tensor ``foreach`` step); predictions for a CUDA device trace with
    "fused", for a CPU with "native". An optimizer given ``foreach`` or ``fused`` keeps it.

    Building the model and tracing it run under one time limit of ``timeout`` seconds
    (None: none), in a worker thread that is stopped at the deadline: its Python code, the
    model's included, stops within milliseconds, even where it catches every
    ``Exception``. One long native call (a single C++ operator, a blocking sleep) runs to
    its end first; the timeout is raised without waiting for it. No signal or timer of the
    process is used, so the caller's own stay as they were. A model whose constructor
    fails on the meta device is built for real on the CPU, holding at most
    ``real_build_limit`` bytes of tensors (default :func:`default_real_build_limit`: half
    of the memory this machine has available); past that the build is refused with an
    error that names the line that failed on meta.

    A failure is classified, so that the integrations can fail fast on the user's bug and
    fail open on the dry run's own (see :mod:`costaware.errors`); each message says what
    happened, where, and what to change. torch's log of the failing op is silenced in the
    dry run's thread while it runs.

    Raises:
        SpecError: the spec's pieces do not fit together (a factory that needs arguments,
            the loss, optimizer arguments, labels or token ids out of the model's range).
        UserCodeError: the user's code fails as a real training step would: the factory,
            forward or loss raised, or the model does not take the batch's shape (the
            user's exception is the ``__cause__``).
        UntraceableModelError: the model cannot run on fake tensors (it reads a tensor's
            value, an output's size depends on the values, an operator without a fake
            implementation), or building it for real would pass ``real_build_limit``.
        TraceTimeout: the dry run took longer than ``timeout`` seconds.
        TraceError: costaware's own dry run failed (an internal error).
    """
    if attention not in ATTENTION_MODES:
        raise ValueError(f"attention must be one of {ATTENTION_MODES}, but got {attention!r}.")

    #: the model being traced, to name the layer an error arose in
    built: dict[str, nn.Module] = {}

    def run() -> Trace:
        model, how = build_model(spec, real_build_limit=real_build_limit)
        compiled = bool(compiled_parts(model))
        if compiled:  # traced as eager mode runs it (the model is the dry run's own copy)
            model = uncompiled(model)
        built["model"] = model
        layers = _layer_counts(model)
        with torch.enable_grad():
            try:
                trace = _trace(spec, model, how, attention)
            except (SpecError, TraceError):
                raise
            except RuntimeError as e:
                # meta-built modules can keep plain tensor attributes on meta; retry real
                if how != "meta" or "meta" not in str(e):
                    raise
                size = _param_bytes(model) + sum(b.nbytes for b in model.buffers())
                cap = (
                    real_build_limit if real_build_limit is not None else default_real_build_limit()
                )
                if size > cap:  # its parameters alone would not fit: not even tried
                    raise UntraceableModelError(
                        _too_large(e, cap, real_build_limit is None, attribute=True)
                    ) from e
                del model
                model = _build_for_real(spec, e, real_build_limit, attribute=True)
                built["model"] = model
                trace = _trace(spec, model, "cpu", attention)
        trace.layer_counts = layers
        if compiled and COMPILED_NOTE not in trace.notes:
            trace.notes.append(COMPILED_NOTE)
        return trace

    def checked() -> Trace:
        # in the dry run's thread: what the caller's thread raises while it waits (its own
        # signal handler's error, Ctrl-C) reaches it as it is
        with _quiet_torch_logs():
            try:
                return run()
            except CostawareError:
                raise
            except Exception as e:  # the user's bug, or the dry run's limit: said which
                raise _classify(e, spec, built.get("model")) from e

    return _call_with_timeout(checked, timeout)


def _param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


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


def _scaled_transients(transients: np.ndarray, ratio: float) -> np.ndarray:
    """Transient block sizes at ``ratio`` times the batch: the part that grows with the
    batch (a convolution's input and output gradient, a recurrent layer's input and
    gates) scaled, the fixed part (a work space's floor, weight-sized buffers) kept."""
    nbytes, fixed = transients[:, 1].astype(np.float64), transients[:, 2].astype(np.float64)
    out: np.ndarray = fixed + (nbytes - fixed) * ratio
    return out


def rescale(trace: Trace, batch_size: int, other: Trace | None = None) -> Trace:
    """This trace's figures at another batch size, without running the model again.

    With ``other`` (a trace of the same architecture at a different batch size, with the
    same op sequence) every storage size, FLOP and byte count is interpolated linearly
    between the two, which is exact for sizes affine in the batch size. Without it,
    storages that grow with the batch (:attr:`Trace.event_scales`) and forward/backward
    FLOPs and bytes scale in proportion; parameters, gradients and optimizer state stay.
    """
    b0 = trace.batch_size
    if batch_size == b0:
        return trace
    sizes = trace.events[:, 1].astype(np.float64)
    alloc = sizes > 0
    fb = trace.node_phase <= 1
    if other is not None and other.op_signature == trace.op_signature and other.batch_size != b0:
        w = (batch_size - b0) / (other.batch_size - b0)
        new_sizes = sizes + w * (other.events[:, 1] - sizes)
        node_flops = trace.node_flops + w * (other.node_flops - trace.node_flops)
        node_bytes = trace.node_bytes + w * (other.node_bytes - trace.node_bytes)
        lin = {
            name: getattr(trace, name) + w * (getattr(other, name) - getattr(trace, name))
            for name in ("flops_forward", "flops_backward", "flops_optimizer", "bytes_moved")
        }
        transient = trace.transients[:, 1].astype(np.float64)
        if other.transients.shape == trace.transients.shape:
            transient = transient + w * (other.transients[:, 1] - transient)
        else:
            transient = _scaled_transients(trace.transients, batch_size / b0)
    else:
        r = batch_size / b0
        new_sizes = np.where(trace.event_scales, sizes * r, sizes)
        node_flops = np.where(fb, trace.node_flops * r, trace.node_flops)
        node_bytes = np.where(fb, trace.node_bytes * r, trace.node_bytes)
        fb_bytes = float(trace.node_bytes[fb].sum())
        lin = {
            "flops_forward": trace.flops_forward * r,
            "flops_backward": trace.flops_backward * r,
            "flops_optimizer": trace.flops_optimizer,
            "bytes_moved": trace.bytes_moved + fb_bytes * (r - 1.0),
        }
        transient = _scaled_transients(trace.transients, r)
    new_sizes = np.where(alloc, np.maximum(np.rint(new_sizes), 1), -1).astype(np.int64)
    events = np.stack([trace.events[:, 0], new_sizes], axis=1)
    blocks = np.maximum(np.rint(transient), 1).astype(np.int64)
    transients = np.stack(
        [trace.transients[:, 0], blocks, np.minimum(trace.transients[:, 2], blocks)], axis=1
    )
    timeline, peak_live, breakdown, phase_peaks = _memory_profile(
        events, trace.event_category, trace.marks
    )
    return dataclasses.replace(
        trace,
        batch_size=batch_size,
        events=events,
        timeline=timeline,
        peak_live=peak_live,
        peak_breakdown=breakdown,
        phase_peaks=phase_peaks,
        node_flops=node_flops,
        node_bytes=node_bytes,
        input_bytes=breakdown["inputs"],
        transients=transients,
        duration_s=0.0,
        notes=[
            *trace.notes,
            f"rescaled from batch size {b0}" + (f" and {other.batch_size}" if other else ""),
        ],
        **lin,
    )
