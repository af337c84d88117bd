"""Per-operator FLOP formulas and operator classes, as a typed registry.

FLOPs come from PyTorch's own ``torch.utils.flop_counter`` registry (matmul, conv, the
CUDA attention kernels, in forward and backward), plus formulas it lacks on a CPU trace:
``_scaled_dot_product_flash_attention_for_cpu`` and its backward, without which attention
counts as zero FLOPs on a CPU-only machine, and the fused recurrent layer
(``costaware::rnn`` and ``costaware::rnn_backward``, see :mod:`costaware.core.trace`) and the
oneDNN layer a CPU runs an LSTM as (``mkldnn_rnn_layer`` and its backward), costed as
:mod:`costaware.measure.opbench` costs its LSTM (:func:`rnn_flops`). An op without a formula counts 0 FLOPs and is
costed by the bytes it moves; an op whose formula fails is counted by the caller, never
fatal (fvcore's rule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import flop_counter

__all__ = [
    "COMPUTE_OPS",
    "CONV",
    "MATMUL",
    "MEMORY",
    "RNN_GATES",
    "VIEW",
    "count_flops",
    "op_class",
    "register_flop_formula",
    "rnn_backward_formula",
    "rnn_flops",
    "rnn_formula",
]

aten = torch.ops.aten

_REGISTRY: dict[Any, Callable[..., int]] = dict(flop_counter.flop_registry)


def register_flop_formula(op: Any, formula: Callable[..., int]) -> None:
    """Register ``formula(*args, out_val=out, **kwargs) -> int`` for an aten overload packet."""
    _REGISTRY[op] = formula


def _cpu_sdpa(
    query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any
) -> int:
    return int(flop_counter.sdpa_flop_count(query.shape, key.shape, value.shape))  # type: ignore[no-untyped-call]


def _cpu_sdpa_backward(
    grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_val: Any = None, **kwargs: Any
) -> int:
    return int(
        flop_counter.sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)  # type: ignore[no-untyped-call]
    )


for _name, _f in (
    ("_scaled_dot_product_flash_attention_for_cpu", _cpu_sdpa),
    ("_scaled_dot_product_flash_attention_for_cpu_backward", _cpu_sdpa_backward),
):
    if hasattr(aten, _name):
        register_flop_formula(getattr(aten, _name), _f)

#: gates per recurrent cell, by cuDNN mode name (as ``torch._VF`` names the RNN functions)
RNN_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
# elementwise FLOPs per hidden unit and time step: the LSTM's 10 are opbench's; GRU: three
# activations, r*hn, +xn, (1-z)*n + z*h; plain RNN: the bias add and the activation
_RNN_POINTWISE = {"lstm": 10, "gru": 9, "rnn_tanh": 2, "rnn_relu": 2}


def rnn_flops(
    mode: str, seq: int, batch: int, input_size: int, hidden: int, directions: int = 1
) -> int:
    """Forward FLOPs of one recurrent layer: ``2*T*B*G*H*(I+H) + c*T*B*H`` per direction.

    ``G`` gates (4 LSTM, 3 GRU, 1 RNN) and ``c`` elementwise FLOPs per unit and step; for an
    LSTM this is the formula :mod:`costaware.measure.opbench` gives its measured ``lstm`` op.
    """
    g = RNN_GATES[mode]
    per = 2 * seq * batch * g * hidden * (input_size + hidden)
    return directions * (per + _RNN_POINTWISE[mode] * seq * batch * hidden)


def rnn_formula(
    input: Any,
    weights: Any,
    hx: Any,
    cx: Any,
    mode: str,
    bidirectional: bool,
    *args: Any,
    out_val: Any = None,
    **kwargs: Any,
) -> int:
    """FLOPs of ``costaware::rnn`` (one layer, time-major input ``(T, B, I)``)."""
    t, b, i = input.shape
    return rnn_flops(mode, int(t), int(b), int(i), int(hx.shape[-1]), 2 if bidirectional else 1)


def rnn_backward_formula(
    input: Any,
    weights: Any,
    hx: Any,
    cx: Any,
    output: Any,
    reserve: Any,
    grad_output: Any,
    grad_hy: Any,
    grad_cy: Any,
    mode: str,
    bidirectional: bool,
    need_weights: bool,
    *args: Any,
    out_val: Any = None,
    **kwargs: Any,
) -> int:
    """FLOPs of ``costaware::rnn_backward``: the data gradient, and the weights' if needed.

    Each costs the forward's FLOPs, which makes the whole backward ``2f`` as opbench's.
    """
    f = rnn_formula(input, weights, hx, cx, mode, bidirectional)
    return 2 * f if need_weights else f


#: the ``mode`` argument of ``aten::mkldnn_rnn_layer`` (cuDNN's numbering of cell types)
_MKLDNN_MODES = {0: "rnn_relu", 1: "rnn_tanh", 2: "lstm", 3: "gru"}


def _mkldnn_rnn_layer_flops(input: Any, hx: Any, mode: int, hidden_size: int) -> int:
    """Forward FLOPs of one ``mkldnn_rnn_layer`` call: one direction of one layer.

    The input is time-major whatever ``batch_first`` says (nn.LSTM transposes it before
    the call), so the batch is read from ``hx`` (B, H) and the time steps from the rest.
    """
    kind = _MKLDNN_MODES.get(int(mode))
    b, i = int(hx.shape[0]), int(input.shape[-1])
    if kind is None or b <= 0 or i <= 0:
        return 0
    return rnn_flops(kind, input.numel() // (b * i), b, i, int(hidden_size))


def mkldnn_rnn_layer_formula(
    input: Any,
    weight0: Any,
    weight1: Any,
    weight2: Any,
    weight3: Any,
    hx: Any,
    cx: Any,
    reverse: bool,
    batch_sizes: Any,
    mode: int,
    hidden_size: int,
    *args: Any,
    out_val: Any = None,
    **kwargs: Any,
) -> int:
    """FLOPs of ``aten::mkldnn_rnn_layer``, the oneDNN layer a CPU runs ``nn.LSTM`` as:
    the same count as the fused GPU layer's (:func:`rnn_formula`)."""
    return _mkldnn_rnn_layer_flops(input, hx, mode, hidden_size)


def mkldnn_rnn_layer_backward_formula(
    input: Any,
    weight1: Any,
    weight2: Any,
    weight3: Any,
    weight4: Any,
    hx: Any,
    cx: Any,
    output: Any,
    hy: Any,
    cy: Any,
    grad_output: Any,
    grad_hy: Any,
    grad_cy: Any,
    reverse: bool,
    mode: int,
    hidden_size: int,
    *args: Any,
    out_val: Any = None,
    **kwargs: Any,
) -> int:
    """FLOPs of ``aten::mkldnn_rnn_layer_backward``: the data and the weight gradients,
    each the forward's count (it always returns the weights' gradients)."""
    return 2 * _mkldnn_rnn_layer_flops(input, hx, mode, hidden_size)


register_flop_formula(aten.mkldnn_rnn_layer, mkldnn_rnn_layer_formula)
register_flop_formula(aten.mkldnn_rnn_layer_backward, mkldnn_rnn_layer_backward_formula)


#: Ops whose time is bound by arithmetic (matmul, convolution, attention, recurrent cells).
COMPUTE_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "matmul",
        "convolution",
        "_convolution",
        "convolution_backward",
        "cudnn_convolution",
        "_slow_conv2d_forward",
        "_slow_conv2d_backward",
        "mkldnn_convolution",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_cudnn_attention_backward",
        "_thnn_fused_lstm_cell",
        "_thnn_fused_gru_cell",
        "lstm",
        "gru",
        "mkldnn_rnn_layer",
        "mkldnn_rnn_layer_backward",
        "rnn",  # costaware::rnn, the fused (cuDNN) recurrent layer of a GPU dry run
        "rnn_backward",
    }
)


#: op classes: convolutions (TF32 by default in fp32 on Ampere+), other compute-bound
#: kernels, memory-bound kernels (elementwise, norms, reductions, copies), and views
#: (metadata only, no kernel).
CONV, MATMUL, MEMORY, VIEW = 0, 1, 2, 3


def op_class(name: str) -> int:
    """The class of an aten op by name: :data:`CONV`, :data:`MATMUL` or :data:`MEMORY`."""
    if name not in COMPUTE_OPS:
        return MEMORY
    return CONV if "conv" in name else MATMUL


def count_flops(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """FLOPs of one dispatched aten op (0 when no formula is registered)."""
    formula = _REGISTRY.get(func._overloadpacket)
    if formula is None:
        return 0
    return int(formula(*args, **kwargs, out_val=out))
