"""The fused kernels a CUDA GPU runs, traced as such (the "fused" mode): the base of the
modes that route calls to them, and scaled dot-product attention as the flash or
memory-efficient kernel a GPU would pick.

RMSNorm, dropout and the recurrent layers have modules of their own
(:mod:`~costaware.core.trace.fused_rms_norm`,
:mod:`~costaware.core.trace.fused_dropout`, :mod:`~costaware.core.trace.fused_rnn`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from types import FunctionType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


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

    def trace_note(self) -> str | None:
        """What this mode did to the step, for the trace's notes; None when it saw no call."""
        raise NotImplementedError


class _FusedAttention(_FusedMode):
    """Routes ``F.scaled_dot_product_attention`` to the fused kernel a CUDA GPU runs it as.

    On a CUDA GPU SDPA runs as flash or memory-efficient attention even with dropout: the
    B*H*L*L score matrix is never materialised and the dropout mask is regenerated from
    the RNG state in the backward. This CPU build takes the math path whenever
    ``dropout_p > 0`` (its flash kernel refuses dropout), which would put the scores, the
    softmax and the mask into the trace. Memory-wise a fused kernel with dropout is the
    fused kernel without it, so dropout is left out of the routed call.

    Which fused kernel matters to memory through the layout of what it returns. PyTorch
    picks flash for half precision without a mask, and memory-efficient attention for
    fp32 or with a mask (flash takes neither). Flash lays its output out like the query,
    as this CPU's flash kernel does, so the call becomes
    ``_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, ...)``. Memory-efficient
    attention always returns a fresh (batch, length, heads, dim) tensor, and its
    gradients are laid out the same way, so the call becomes
    ``_scaled_dot_product_efficient_attention`` (its meta kernel: the dry run runs on fake
    tensors). The difference is a real copy: ``nn.MultiheadAttention`` lays its query out
    as (length, batch, heads, dim), and the ``.contiguous()`` after the attention copies
    the efficient kernel's output (one activation per layer kept for the backward) and
    not flash's. The efficient kernel's backward workspace (about one query gradient,
    freed within the op) is not traced.

    ``nn.MultiheadAttention`` calls SDPA from inside ``F.multi_head_attention_forward``,
    where a torch-function mode is off; torch's own function body is run with its SDPA
    name bound to the routing instead. Inputs the fused ops do not take (GQA, differing
    head dims, a mask together with ``is_causal``) run natively, and are counted in
    ``fallbacks``.
    """

    def __init__(self) -> None:
        super().__init__()
        #: routed calls by kernel: "flash", "efficient"
        self.kernels: Counter[str] = Counter()
        self._mha: Any = None

    def trace_note(self) -> str | None:
        kinds = ", ".join(
            f"{n} as {'memory-efficient attention' if k == 'efficient' else 'flash'}"
            for k, n in sorted(self.kernels.items())
        )
        return self.note(
            f"attention traced as the fused kernels a CUDA GPU runs ({self.fused} SDPA "
            f"calls per step: {kinds}; no score matrix or dropout mask)",
            "ran natively",
        )

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            return self._route(*args, **kwargs)
        if func is torch.nn.functional.multi_head_attention_forward:
            return self._multi_head_attention()(*args, **kwargs)
        return func(*args, **kwargs)

    def _route(self, *args: Any, **kwargs: Any) -> Any:
        """SDPA as the GPU's fused kernel, or natively where none takes the inputs."""
        out = self._fused(*args, **kwargs)
        if out is None:
            return torch.nn.functional.scaled_dot_product_attention(*args, **kwargs)
        self.fused += 1
        return out

    def _multi_head_attention(self) -> Any:
        """``F.multi_head_attention_forward``'s own body with its SDPA routed (built once
        per mode: a copy of the function over a copy of its module's globals, so nothing
        shared is patched)."""
        if self._mha is None:
            f = torch.nn.functional.multi_head_attention_forward
            scope = dict(f.__globals__)
            scope["scaled_dot_product_attention"] = self._route
            mha = FunctionType(f.__code__, scope, f.__name__, f.__defaults__, f.__closure__)
            mha.__kwdefaults__ = f.__kwdefaults__
            self._mha = mha
        return self._mha

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
        if why is None:
            efficient = q.dtype == torch.float32 or attn_mask is not None
            try:
                if efficient:
                    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
                    bias = None if attn_mask is None else _efficient_bias(attn_mask, q, k)
                    out = torch.ops.aten._scaled_dot_product_efficient_attention(
                        q, k, v, bias, grad, 0.0, is_causal, scale=scale
                    )[0]
                else:
                    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                        q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=scale
                    )[0]
                self.kernels["efficient" if efficient else "flash"] += 1
                return out  # type: ignore[no-any-return]
            except (RuntimeError, TypeError, ValueError, NotImplementedError) as e:
                why = f"{type(e).__name__}: {str(e)[:80]}"
        self.fallbacks[why] += 1
        return None


def _efficient_bias(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``mask`` as CUDA's SDPA hands it to the memory-efficient kernel: a bool mask made
    additive (one tensor of the mask's shape), padded along its last dimension to a
    multiple of 8 elements where a stride is not one (a copy), then expanded to (batch,
    heads, length, key length) as a view. A mask that needs its gradient (a learned
    position bias) then gets it from the kernel's backward dense at that full shape, its
    last dimension padded to 16, and summed back to its own: as on the GPU."""
    if mask.dtype == torch.bool:
        mask = torch.full_like(mask, float("-inf"), dtype=q.dtype).masked_fill_(mask, 0.0)
    if mask.stride(-1) != 1 or any(s % 8 for s in mask.stride()[:-1]):
        n = mask.shape[-1]
        mask = torch.nn.functional.pad(mask, (0, 8 - n % 8))[..., :n]
    return mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


_FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
