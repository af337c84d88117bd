"""RMSNorm traced as the one fused kernel a CUDA GPU runs (the "fused" mode).

``torch.rms_norm`` runs as one ``_fused_rms_norm`` kernel on a CUDA GPU when the input
and the weight have one dtype, and its backward as one ``_fused_rms_norm_backward``
from what the forward kept: the input and the inverse RMS per row. This CPU build runs
it as its composite (``pow``, ``mean``, ``add``, ``rsqrt``, ``mul``, ``mul``), whose
autograd keeps the squares, the inverse RMS and the normalized input besides: the
allocated peaks of the RMSNorm transformers in the GPU corpus came out 0.82-0.88x the
dry run's, of their LayerNorm twins 0.92-1.0x. The "fused" dry run traces the kernel as
``costaware::rms_norm`` and its backward as ``costaware::rms_norm_backward``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from costaware.core.trace.fused import _FUSED_DTYPES, _FusedMode


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

    def trace_note(self) -> str | None:
        return self.note(
            f"RMSNorm traced as one fused kernel, as a CUDA GPU runs it ({self.fused} "
            "calls per step; the backward keeps the input and the inverse RMS)",
            "ran as the composite, as CUDA runs them",
        )

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
