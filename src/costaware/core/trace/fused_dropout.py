"""Dropout traced as the one fused kernel a CUDA GPU runs (the "fused" mode).

On a CUDA GPU, ``F.dropout`` in training (not in place, 0 < p < 1) runs as one
``native_dropout`` kernel: the output and a bool mask, which the backward
(``native_dropout_backward``) reads. This CPU build runs it as its composite instead: a
noise tensor of the input's dtype (``bernoulli_``, ``div_``) that the product's backward
keeps, two or four times the mask's bytes (what that did to the OOM probes' MLPs:
docs/features.md, version 21). The "fused" dry run traces the kernel as
``costaware::native_dropout`` and its backward as ``costaware::native_dropout_backward``
(the op names the NSM groups count as dropout). In place, CUDA runs the composite too.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from costaware.core.trace.fused import _FusedMode


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

    def trace_note(self) -> str | None:
        return self.note(
            f"dropout traced as one fused kernel, as a CUDA GPU runs it ({self.fused} "
            "calls per step; the backward keeps a bool mask)",
            "ran as the composite, as CUDA runs them",
        )

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
