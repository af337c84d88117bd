"""Per-operator FLOP formulas and operator classes, as a typed registry.

FLOPs come from PyTorch's own ``torch.utils.flop_counter`` registry (matmul, the CUDA
attention kernels' lower layers), replaced, with :data:`PROJECT_FORMULAS` on, by the
project's own formulas where torch's are wrong or missing (each worked out by hand in
``tests/test_flops.py``):

- **Convolution**, forward and backward, any ``groups``, stride, dilation, padding and
  transposed (:func:`conv_flops`, :func:`conv_backward_flops`). torch's backward counts
  the weight gradient as if every input channel met every output channel, ``groups``
  times too many: a depthwise 3x3 over 256 channels at 16x16, batch 32, was counted
  9.7 GFLOP backward against 0.04 forward. A bias adds one FLOP per output element
  forward and per output-gradient element backward, as opbench counts its cases.
- **Attention** (:func:`sdpa_flops`, :func:`sdpa_backward_flops`): every SDPA kernel
  (the CPU flash kernel a dry run traces, and the flash, memory-efficient and cuDNN
  kernels of a GPU), with grouped-query heads, an additive mask (one add per score) and
  ``is_causal`` (only the scores the causal mask keeps, as flash kernels skip the rest).
- **Embedding**: the forward is a gather (0 FLOPs), the backward one add per gradient
  element accumulated into the weight's rows (:func:`embedding_backward_flops`), as
  opbench counts its embedding cases.
- **Norms** (layer, group, batch, RMS; :data:`NORM_FLOPS_PER_ELEMENT`): per element of
  the input, opbench's counts for the norms it times (so that a trace's norm nodes and
  the op model's samples are on one scale), and RMSNorm counted the same way.
- Attention on a CPU trace (``_scaled_dot_product_flash_attention_for_cpu`` and its
  backward), without which attention counts as zero FLOPs on a CPU-only machine, the
  fused recurrent layer (``costaware::rnn`` and ``costaware::rnn_backward``, see
  :mod:`costaware.core.trace`) and the oneDNN layer a CPU runs an LSTM as
  (``mkldnn_rnn_layer`` and its backward), costed as :mod:`costaware.measure.opbench` costs its
  LSTM (:func:`rnn_flops`).

An op without a formula counts 0 FLOPs and is costed by the bytes it moves; an op whose
formula fails is counted by the caller, never fatal (fvcore's rule).
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
    "NORM_FLOPS_PER_ELEMENT",
    "RNN_GATES",
    "VIEW",
    "attention_pairs",
    "conv_backward_flops",
    "conv_flops",
    "conv_macs",
    "count_flops",
    "embedding_backward_flops",
    "norm_flops",
    "op_class",
    "register_flop_formula",
    "register_named_formula",
    "rnn_backward_formula",
    "rnn_flops",
    "rnn_formula",
    "sdpa_backward_flops",
    "sdpa_flops",
]

aten = torch.ops.aten

_REGISTRY: dict[Any, Callable[..., int]] = dict(flop_counter.flop_registry)


def register_flop_formula(op: Any, formula: Callable[..., int]) -> None:
    """Register ``formula(*args, out_val=out, **kwargs) -> int`` for an aten overload packet."""
    _REGISTRY[op] = formula


#: Whether :func:`count_flops` counts with the project's formulas (:func:`register_named_formula`)
#: where they replace torch's. Off, the counts are torch's with the CPU attention kernel
#: added (feature version 21, which the shipped model is fitted on); on, they are the
#: formulas below (feature version 22, :data:`costaware.core.features.FEATURE_VERSION`). The
#: features change with it, so it is turned on together with a refit of the model.
PROJECT_FORMULAS = False


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


# torch's counts of the CPU flash kernel, for the counts without the project's formulas
for _name, _f in (
    ("_scaled_dot_product_flash_attention_for_cpu", _cpu_sdpa),
    ("_scaled_dot_product_flash_attention_for_cpu_backward", _cpu_sdpa_backward),
):
    if hasattr(aten, _name):
        register_flop_formula(getattr(aten, _name), _f)


#: formulas over an op's arguments by their schema names: ``formula(named, out) -> int``,
#: keyed by the op's qualified name (``"aten::convolution"``), whatever its overload
_NAMED: dict[str, Callable[[dict[str, Any], Any], int]] = {}


def register_named_formula(
    names: str | tuple[str, ...], formula: Callable[[dict[str, Any], Any], int]
) -> None:
    """Register ``formula(named_args, out) -> int`` for ops by qualified name
    (``"aten::convolution"``, ``"costaware::rms_norm"``): ``named_args`` maps each of the
    op's schema arguments to the value it was called with (its default where it was
    omitted). It takes precedence over a torch formula for the same op."""
    for name in (names,) if isinstance(names, str) else names:
        _NAMED[name] = formula


def _bind(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """An op call's arguments by their schema names (defaults filled in, None if absent)."""
    named: dict[str, Any] = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            named[a.name] = args[i]
        elif a.name in kwargs:
            named[a.name] = kwargs[a.name]
        else:
            named[a.name] = a.default_value if a.has_default_value() else None
    return named


def _numel(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) else out


# convolution --------------------------------------------------------------------------
def conv_macs(
    input_shape: Any, weight_shape: Any, dense_shape: Any, transposed: bool = False
) -> int:
    """Multiply-accumulates of a convolution: ``N * prod(spatial) * weight.numel()``.

    The weight holds ``C_out * C_in/groups * prod(kernel)`` values (``C_in * C_out/groups
    * prod(kernel)`` transposed), each of which meets one input value per output position
    of a convolution (per *input* position of a transposed one, which scatters each input
    value through the kernel). So groups, stride, padding and dilation enter only through
    the weight's shape and ``dense_shape``: the output's shape for a convolution, the
    input's for a transposed one. An unbatched input (no ``N`` dim) is one sample.
    """
    spatial = len(weight_shape) - 2
    batch = int(input_shape[0]) if len(input_shape) == len(weight_shape) else 1
    return batch * _numel(list(dense_shape)[-spatial:]) * _numel(weight_shape)


def conv_flops(
    input_shape: Any, weight_shape: Any, out_shape: Any, transposed: bool, bias: bool
) -> int:
    """Forward FLOPs of a convolution: ``2 * MACs`` (:func:`conv_macs`), plus one add per
    output element for a bias."""
    dense = input_shape if transposed else out_shape
    bias_adds = _numel(out_shape) if bias else 0
    return 2 * conv_macs(input_shape, weight_shape, dense, transposed) + bias_adds


def conv_backward_flops(
    grad_out_shape: Any,
    input_shape: Any,
    weight_shape: Any,
    transposed: bool,
    output_mask: Any,
) -> int:
    """FLOPs of a convolution's backward: the input gradient (a transposed convolution of
    the output gradient with the weight) and the weight gradient (the input correlated
    with the output gradient, group by group) each cost the forward's ``2 * MACs``; the
    bias gradient one add per output-gradient element. ``output_mask`` says which of the
    three are computed."""
    mask = list(output_mask) if output_mask is not None else [True, True, False]
    dense = input_shape if transposed else grad_out_shape
    macs = conv_macs(input_shape, weight_shape, dense, transposed)
    return (
        (2 * macs if mask[0] else 0)
        + (2 * macs if mask[1] else 0)
        + (_numel(grad_out_shape) if len(mask) > 2 and mask[2] else 0)
    )


def _conv_formula(transposed_op: bool = False) -> Callable[[dict[str, Any], Any], int]:
    def formula(a: dict[str, Any], out: Any) -> int:
        x = a["input"] if "input" in a else a["self"]
        transposed = bool(a.get("transposed") or transposed_op)
        return conv_flops(
            x.shape, a["weight"].shape, _first(out).shape, transposed, a.get("bias") is not None
        )

    return formula


def _conv_backward_formula(a: dict[str, Any], out: Any) -> int:
    return conv_backward_flops(
        a["grad_output"].shape,
        a["input"].shape,
        a["weight"].shape,
        bool(a.get("transposed")),
        a.get("output_mask"),
    )


register_named_formula(
    (
        "aten::convolution",
        "aten::_convolution",
        "aten::convolution_overrideable",
        "aten::cudnn_convolution",
        "aten::mkldnn_convolution",
        "aten::_slow_conv2d_forward",
        "aten::slow_conv_dilated2d",
        "aten::slow_conv_dilated3d",
    ),
    _conv_formula(),
)
register_named_formula(
    (
        "aten::cudnn_convolution_transpose",
        "aten::slow_conv_transpose2d",
        "aten::slow_conv_transpose3d",
    ),
    _conv_formula(transposed_op=True),
)
register_named_formula(
    ("aten::convolution_backward", "aten::convolution_backward_overrideable"),
    _conv_backward_formula,
)


# attention ----------------------------------------------------------------------------
def attention_pairs(q_len: int, k_len: int, causal: bool) -> int:
    """(query, key) pairs scored per batch and head: all of them, or under ``is_causal``
    those the mask keeps. PyTorch's causal mask is aligned to the top left (query ``i``
    sees keys ``0..i``), so query ``i`` scores ``min(i + 1, k_len)`` keys."""
    if not causal:
        return q_len * k_len
    full = max(0, min(q_len, k_len))  # rows 0..full-1 score i+1 keys, the rest all k_len
    return full * (full + 1) // 2 + (q_len - full) * k_len


def sdpa_flops(
    query_shape: Any, key_shape: Any, value_shape: Any, causal: bool = False, mask: bool = False
) -> int:
    """Forward FLOPs of scaled-dot-product attention: ``Q K^T`` and ``P V``, two FLOPs per
    multiply-add over the scored pairs (:func:`attention_pairs`), and an additive mask's
    one add per score. The query's heads are counted (grouped-query key/value heads are
    broadcast to them); the softmax is not counted, as in torch's and opbench's counts."""
    heads = _numel(query_shape[:-2])  # batch x query heads
    q_len, e = int(query_shape[-2]), int(query_shape[-1])
    k_len, ev = int(key_shape[-2]), int(value_shape[-1])
    pairs = attention_pairs(q_len, k_len, causal)
    return heads * (2 * pairs * e + 2 * pairs * ev + (q_len * k_len if mask else 0))


def sdpa_backward_flops(
    query_shape: Any, key_shape: Any, value_shape: Any, causal: bool = False, mask: bool = False
) -> int:
    """Backward FLOPs of scaled-dot-product attention: the scores recomputed (``Q K^T``,
    and the mask added again), then ``dV = P^T dO``, ``dP = dO V^T``, ``dQ = dS K`` and
    ``dK = dS^T Q``: five matrix products, ``2 * pairs * (3 E + 2 Ev)`` per batch and head,
    2.5x the forward's when ``E == Ev``."""
    heads = _numel(query_shape[:-2])
    q_len, e = int(query_shape[-2]), int(query_shape[-1])
    k_len, ev = int(key_shape[-2]), int(value_shape[-1])
    pairs = attention_pairs(q_len, k_len, causal)
    return heads * (2 * pairs * (3 * e + 2 * ev) + (q_len * k_len if mask else 0))


def _sdpa_formula(a: dict[str, Any], out: Any) -> int:
    mask = a.get("attn_mask", a.get("attn_bias"))
    return sdpa_flops(
        a["query"].shape,
        a["key"].shape,
        a["value"].shape,
        bool(a.get("is_causal")),
        isinstance(mask, torch.Tensor),
    )


def _sdpa_backward_formula(a: dict[str, Any], out: Any) -> int:
    mask = a.get("attn_mask", a.get("attn_bias"))
    return sdpa_backward_flops(
        a["query"].shape,
        a["key"].shape,
        a["value"].shape,
        bool(a.get("is_causal")),
        isinstance(mask, torch.Tensor),
    )


register_named_formula(
    (
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_scaled_dot_product_fused_attention_overrideable",
    ),
    _sdpa_formula,
)
register_named_formula(
    (
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
        "aten::_scaled_dot_product_flash_attention_backward",
        "aten::_scaled_dot_product_efficient_attention_backward",
        "aten::_scaled_dot_product_cudnn_attention_backward",
        "aten::_scaled_dot_product_fused_attention_overrideable_backward",
    ),
    _sdpa_backward_formula,
)


# embedding ----------------------------------------------------------------------------
def embedding_backward_flops(grad_shape: Any, scale_grad_by_freq: bool = False) -> int:
    """FLOPs of an embedding's backward: each gradient row is added into the weight row
    of its index (one add per gradient element), and scaled by its index's inverse
    frequency first where ``scale_grad_by_freq`` (one multiply more)."""
    return _numel(grad_shape) * (2 if scale_grad_by_freq else 1)


register_named_formula("aten::embedding", lambda a, out: 0)  # a gather
register_named_formula(
    "aten::embedding_dense_backward",
    lambda a, out: embedding_backward_flops(
        a["grad_output"].shape, bool(a.get("scale_grad_by_freq"))
    ),
)


def _embedding_bag_formula(a: dict[str, Any], out: Any) -> int:
    """A bag's sum, mean or max: one add (or compare) per gathered element, and one
    multiply more per element with per-sample weights."""
    weight, indices = a["weight"], a["indices"]
    per = 2 if isinstance(a.get("per_sample_weights"), torch.Tensor) else 1
    return per * _numel(indices.shape) * int(weight.shape[-1])


def _embedding_bag_backward_formula(a: dict[str, Any], out: Any) -> int:
    indices, grad = a["indices"], a["grad"]
    per = 2 if isinstance(a.get("per_sample_weights"), torch.Tensor) else 1
    return per * _numel(indices.shape) * int(grad.shape[-1])


register_named_formula(
    ("aten::_embedding_bag", "aten::_embedding_bag_forward_only"), _embedding_bag_formula
)
register_named_formula("aten::_embedding_bag_dense_backward", _embedding_bag_backward_formula)


# norms --------------------------------------------------------------------------------
#: FLOPs per input element of each norm, (forward, backward). Layer norm's and the
#: batch and group norms' are opbench's counts for the cases it times, so that a trace's
#: norm nodes sit on the op model's scale. Layer norm forward: the mean (1 add), the
#: centring (1), the square and its sum (2), the scaling by 1/std (1), the weight and the
#: bias (2) = 7; backward 10. Batch and group norm: 8 and 12 (their statistics span
#: channels or groups, one pass more). A batch norm in eval mode normalises with its
#: running statistics: subtract, scale, weight, bias = 4 forward; backward the input's
#: gradient (2: times weight, times 1/std), the weight's (4: centre, scale, times the
#: gradient, accumulate) and the bias's (1) = 7. RMSNorm, counted as layer norm is
#: without the mean, centring and bias: the square and its sum (2), the scaling (1), the
#: weight (1) = 4; backward: the normalised input again (1), the gradient times the
#: weight (1), its product with the normalised input and that product's sum (2), the
#: input's gradient ``r * (g - x_hat * m)`` (3), the weight's gradient (2) = 9.
NORM_FLOPS_PER_ELEMENT: dict[str, tuple[int, int]] = {
    "layer_norm": (7, 10),
    "group_norm": (8, 12),
    "batch_norm": (8, 12),
    "batch_norm_eval": (4, 7),
    "rms_norm": (4, 9),
}


def norm_flops(kind: str, input_shape: Any, backward: bool = False) -> int:
    """FLOPs of a norm (a key of :data:`NORM_FLOPS_PER_ELEMENT`) over an input of
    ``input_shape``, forward or backward."""
    return NORM_FLOPS_PER_ELEMENT[kind][int(backward)] * _numel(input_shape)


def _norm_formula(
    kind: str, backward: bool, tensor: str = "input"
) -> Callable[[dict[str, Any], Any], int]:
    def formula(a: dict[str, Any], out: Any) -> int:
        k = kind
        if kind == "batch_norm":
            training = a.get("training", a.get("train", a.get("update", True)))
            k = "batch_norm" if training is None or bool(training) else "batch_norm_eval"
        return norm_flops(k, a[tensor].shape, backward)

    return formula


register_named_formula("aten::native_layer_norm", _norm_formula("layer_norm", False))
register_named_formula("aten::native_layer_norm_backward", _norm_formula("layer_norm", True))
register_named_formula("aten::native_group_norm", _norm_formula("group_norm", False))
register_named_formula("aten::native_group_norm_backward", _norm_formula("group_norm", True))
register_named_formula(
    (
        "aten::native_batch_norm",
        "aten::_native_batch_norm_legit",
        "aten::_native_batch_norm_legit_functional",
        "aten::cudnn_batch_norm",
    ),
    _norm_formula("batch_norm", False),
)
register_named_formula(
    "aten::_native_batch_norm_legit_no_training", _norm_formula("batch_norm_eval", False)
)
register_named_formula(
    (
        "aten::native_batch_norm_backward",
        "aten::batch_norm_backward",
        "aten::cudnn_batch_norm_backward",
    ),
    _norm_formula("batch_norm", True),
)
register_named_formula(
    ("aten::_fused_rms_norm", "costaware::rms_norm"), _norm_formula("rms_norm", False)
)
register_named_formula(
    ("aten::_fused_rms_norm_backward", "costaware::rms_norm_backward"),
    _norm_formula("rms_norm", True),
)


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
    named = _NAMED.get(func._schema.name) if PROJECT_FORMULAS else None
    if named is not None:
        return int(named(_bind(func, args, kwargs), out))
    formula = _REGISTRY.get(func._overloadpacket)
    if formula is None:
        return 0
    return int(formula(*args, **kwargs, out_val=out))
