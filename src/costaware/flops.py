"""Per-operator FLOP formulas and operator classes, as a typed registry.

FLOPs come from PyTorch's own ``torch.utils.flop_counter`` registry (matmul, conv, the
CUDA attention kernels, in forward and backward), plus formulas it lacks on a CPU trace:
``_scaled_dot_product_flash_attention_for_cpu`` and its backward, without which attention
counts as zero FLOPs on a CPU-only machine. An op without a formula counts 0 FLOPs and is
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
    "VIEW",
    "count_flops",
    "op_class",
    "register_flop_formula",
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
