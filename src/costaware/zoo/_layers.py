"""The zoo's shared layers: conv-BN-activation stacks, initialisers, the pre-LN
transformer block (attention, feed-forward), the layer scale and squeeze-and-excitation.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round ``value`` to a multiple of ``divisor`` (never dropping more than 10%)."""
    if min_value is None:
        min_value = divisor
    new_value = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if new_value < 0.9 * value:
        new_value += divisor
    return new_value


def _conv_bn(
    cin: int,
    cout: int,
    kernel: int,
    stride: int = 1,
    groups: int = 1,
    act: Callable[[], nn.Module] | None = None,
    eps: float = 1e-5,
    momentum: float = 0.1,
) -> nn.Sequential:
    """Conv (no bias, 'same' padding) -> BatchNorm -> optional activation."""
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout, eps=eps, momentum=momentum),
    ]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


def _relu() -> nn.Module:
    return nn.ReLU(inplace=True)


def _relu6() -> nn.Module:
    return nn.ReLU6(inplace=True)


def _hardswish() -> nn.Module:
    return nn.Hardswish(inplace=True)


def _on_meta(model: nn.Module) -> bool:
    """True when the parameters live on the meta device: their values do not exist, so
    custom re-initialisation is skipped (the meta ``normal_`` is slow Python)."""
    p = next(model.parameters(), None)
    return p is not None and p.is_meta


def _init_convnet(model: nn.Module) -> None:
    """torchvision-style init: Kaiming (fan_out) convs, unit BN, small-normal linears."""
    if _on_meta(model):
        return
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def _init_transformer(model: nn.Module, std: float = 0.02) -> None:
    """GPT/BERT-style init: N(0, 0.02) linears and embeddings, zero biases."""
    if _on_meta(model):
        return
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)


class _SelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection and SDPA."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, causal: bool = False) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.causal = causal
        self.dropout = dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=self.causal)
        y = y.transpose(1, 2).reshape(b, t, c)
        out: Tensor = self.resid_drop(self.proj(y))
        return out

    def extra_repr(self) -> str:
        return f"heads={self.heads}, causal={self.causal}, dropout={self.dropout}"


class _FeedForward(nn.Module):
    """Transformer MLP; ``gated`` makes it GLU-style (act(x W1) * (x V) W2)."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        act: nn.Module | None = None,
        dropout: float = 0.0,
        gated: bool = False,
    ) -> None:
        super().__init__()
        self.gated = gated
        self.fc1 = nn.Linear(dim, 2 * hidden if gated else hidden)
        self.act = act if act is not None else nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.fc1(x)
        if self.gated:
            a, g = h.chunk(2, dim=-1)
            h = self.act(a) * g
        else:
            h = self.act(h)
        out: Tensor = self.drop(self.fc2(h))
        return out

    def extra_repr(self) -> str:
        return f"gated={self.gated}"


class _PreLNBlock(nn.Module):
    """x + attn(LN(x)); x + mlp(LN(x))  (GPT-2 / ViT block)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        mlp_ratio: float,
        dropout: float = 0.0,
        causal: bool = False,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.attn = _SelfAttention(dim, heads, dropout, causal)
        self.ln2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = _FeedForward(dim, int(dim * mlp_ratio), nn.GELU(), dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


def _layer_scale(dim: int, value: float, *shape: int) -> nn.Parameter:
    """A per-channel scale (ConvNeXt's and PoolFormer's layer scale), ``value`` everywhere."""
    return nn.Parameter(torch.full((dim, *shape), value))


class _SqueezeExcite(nn.Module):
    """Squeeze-and-excitation: a channel gate from the global mean, through a bottleneck."""

    def __init__(self, channels: int, squeeze: int, act: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.act = act()
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        s = self.fc2(self.act(self.fc1(x.mean((2, 3), keepdim=True))))
        return x * torch.sigmoid(s)
