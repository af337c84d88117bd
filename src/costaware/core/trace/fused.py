"""The fused kernels a CUDA GPU runs, traced as such (the "fused" mode): the base of the
modes that route calls to them, and scaled dot-product attention as one flash kernel.

RMSNorm, dropout and the recurrent layers have modules of their own
(:mod:`~costaware.core.trace.fused_rms_norm`,
:mod:`~costaware.core.trace.fused_dropout`, :mod:`~costaware.core.trace.fused_rnn`).
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Sequence
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
    """Routes ``F.scaled_dot_product_attention`` to the fused flash kernel.

    On a CUDA GPU SDPA runs as flash or memory-efficient attention even with dropout: the
    B*H*L*L score matrix is never materialised and the dropout mask is regenerated from
    the RNG state in the backward. This CPU build takes the math path whenever
    ``dropout_p > 0`` (its flash kernel refuses dropout), which would put the scores, the
    softmax and the mask into the trace. Memory-wise the fused kernel with dropout is
    the fused kernel without it, so the call becomes
    ``_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, ...)``, its inputs cast
    as autocast casts them and grouped-query heads (``enable_gqa``) expanded. Inputs the
    fused op does not take (differing head dims, a mask together with ``is_causal``) run
    natively, and are counted in ``fallbacks``.
    """

    def trace_note(self) -> str | None:
        return self.note(
            f"attention traced as a fused flash kernel, as a CUDA GPU runs it "
            f"({self.fused} SDPA calls per step; no score matrix or dropout mask)",
            "ran natively, with the score matrix a CPU holds",
        )

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
        else:
            q, k, v = _autocast(q, k, v)
            k, v = _grouped(q, k, v, enable_gqa)
            why = _unfused(q, k, v, attn_mask, is_causal)
        if why is None and attn_mask is not None and attn_mask.dtype == torch.bool:
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


def _unfused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
) -> str | None:
    """Why the fused kernel does not take these inputs, or None where it does."""
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in _FUSED_DTYPES:
        return f"dtype {q.dtype}"
    if q.shape[1] != k.shape[1] or k.shape[1] != v.shape[1]:
        return "heads that differ without enable_gqa"
    if not (q.shape[-1] == k.shape[-1] == v.shape[-1]):
        return "differing head dims"
    if attn_mask is not None and is_causal:
        return "mask with is_causal"
    return None


def _autocast(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k and v as SDPA receives them under the dry run's autocast: CUDA's autocast runs
    SDPA in the half type, casting each floating input (rotary embeddings leave q and k in
    fp32 beside a half v). This mode sees the call before the dispatcher's autocast does."""
    if not torch.is_autocast_enabled("cpu"):
        return q, k, v
    half = torch.get_autocast_dtype("cpu")
    cast = tuple(t.to(half) if t.is_floating_point() and t.dtype != half else t for t in (q, k, v))
    return cast  # type: ignore[return-value]


def _grouped(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enable_gqa: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v with as many heads as q, where ``enable_gqa`` shares each of their heads
    among a group of q's: CUDA's flash kernel reads the shared heads in place, and the
    copies made here (which the step holds for its backward) are the trace's one excess
    over it, the size of k and v at q's head count."""
    heads, shared = q.shape[1], k.shape[1]
    if not enable_gqa or shared == heads or shared == 0 or heads % shared or v.shape[1] != shared:
        return k, v
    return k.repeat_interleave(heads // shared, dim=1), v.repeat_interleave(heads // shared, dim=1)
_MHA_SIGNATURE = inspect.signature(torch.nn.functional.multi_head_attention_forward)
