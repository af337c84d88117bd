"""Image models over patch tokens: ViT, Swin (shifted windows), MLP-Mixer and
PoolFormer (pooling as the token mixer).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from costaware.zoo._layers import _init_transformer, _layer_scale, _on_meta, _PreLNBlock


class ViT(nn.Module):
    """Vision Transformer (Dosovitskiy et al., 2020): patch embedding, class token."""

    def __init__(
        self,
        image_size: int,
        patch: int,
        dim: int,
        depth: int,
        heads: int,
        mlp_ratio: float,
        classes: int,
        dropout: float,
    ) -> None:
        super().__init__()
        n = (image_size // patch) ** 2
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.empty(1, n + 1, dim))
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(
            *(_PreLNBlock(dim, heads, mlp_ratio, dropout, eps=1e-6) for _ in range(depth))
        )
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)
        _init_transformer(self)
        if not _on_meta(self):
            nn.init.normal_(self.pos_embed, 0.0, 0.02)
            nn.init.zeros_(self.head.weight)

    def forward(self, x: Tensor) -> Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = self.drop(torch.cat([cls, x], dim=1) + self.pos_embed)
        x = self.norm(self.blocks(x))
        x = self.head(x[:, 0])
        return x


def vit(
    image_size: int = 224,
    patch: int = 16,
    dim: int = 768,
    depth: int = 12,
    heads: int = 12,
    mlp_ratio: float = 4,
    classes: int = 1000,
    dropout: float = 0.0,
) -> nn.Module:
    """ViT classifier; inputs must be ``image_size`` squared (a multiple of ``patch``)."""
    if image_size % patch:
        raise ValueError(f"image_size {image_size} is not a multiple of patch {patch}")
    return ViT(image_size, patch, dim, depth, heads, mlp_ratio, classes, dropout)


def _windows(x: Tensor, ws: int) -> Tensor:
    """``(N, H, W, C)`` -> ``(N * H/ws * W/ws, ws * ws, C)``: the non-overlapping windows."""
    n, h, w, c = x.shape
    x = x.view(n, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, ws * ws, c)


def _unwindow(x: Tensor, ws: int, n: int, h: int, w: int) -> Tensor:
    c = x.shape[-1]
    x = x.view(n, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n, h, w, c)


def _shift_mask(h: int, w: int, ws: int, shift: int, like: Tensor) -> Tensor:
    """Swin's mask for shifted windows: ``(windows, ws*ws, ws*ws)``, -100 between tokens
    that the cyclic shift brought together from different regions, 0 elsewhere."""
    img = torch.zeros(1, h, w, 1, device=like.device)
    region = 0
    for hs in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
        for wsl in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
            img[:, hs, wsl, :] = float(region)
            region += 1
    win = _windows(img, ws).squeeze(-1)
    diff = win.unsqueeze(1) - win.unsqueeze(2)
    return torch.zeros(diff.shape, dtype=like.dtype, device=like.device).masked_fill(
        diff != 0, -100.0
    )


class _SwinBlock(nn.Module):
    """Window attention (shifted by half a window in every other block) with a learned
    bias per head over the window's token pairs, then an MLP; pre-norm residuals."""

    def __init__(self, dim: int, heads: int, window: int, shift: int) -> None:
        super().__init__()
        self.heads, self.window, self.shift = heads, window, shift
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.bias = nn.Parameter(torch.zeros(heads, window * window, window * window))
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        n, h, w, c = x.shape
        ws, s = self.window, self.shift
        y = self.norm1(x)
        if s:
            y = torch.roll(y, (-s, -s), (1, 2))
        y = _windows(y, ws)
        b, t = y.shape[0], y.shape[1]
        q, k, v = self.qkv(y).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        mask = self.bias.to(q.dtype).unsqueeze(0)
        if s:
            shift = _shift_mask(h, w, ws, s, q).repeat(n, 1, 1).unsqueeze(1)
            mask = mask + shift
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = self.proj(y.transpose(1, 2).reshape(b, t, c))
        y = _unwindow(y, ws, n, h, w)
        if s:
            y = torch.roll(y, (s, s), (1, 2))
        x = x + y
        out: Tensor = x + self.mlp(self.norm2(x))
        return out


class _PatchMerging(nn.Module):
    """2x2 neighbouring tokens concatenated (4C), normalised and projected to 2C."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4 * dim)
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        return self.reduction(self.norm(x))  # type: ignore[no-any-return]


class Swin(nn.Module):
    """Swin Transformer (Liu et al., 2021): patch embedding, stages of (shifted) window
    attention, patch merging between them. A stage whose map is no larger than the window
    attends over the whole map, unshifted."""

    def __init__(
        self,
        image_size: int,
        patch: int,
        dim: int,
        depths: Sequence[int],
        heads: Sequence[int],
        window: int,
        classes: int,
    ) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.embed_norm = nn.LayerNorm(dim)
        side = image_size // patch
        stages: list[nn.Module] = []
        for i, (depth, h) in enumerate(zip(depths, heads)):
            if i:
                stages.append(_PatchMerging(dim))
                dim, side = 2 * dim, side // 2
            ws = min(window, side)
            stages += [
                _SwinBlock(dim, h, ws, ws // 2 if j % 2 and side > ws else 0) for j in range(depth)
            ]
        self.stages = nn.Sequential(*stages)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        _init_transformer(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.embed_norm(self.patch_embed(x).permute(0, 2, 3, 1))
        x = self.norm(self.stages(x)).mean((1, 2))
        x = self.head(x)
        return x


def swin(
    image_size: int = 224,
    patch: int = 4,
    dim: int = 96,
    depths: Sequence[int] = (2, 2, 6, 2),
    heads: Sequence[int] = (3, 6, 12, 24),
    window: int = 7,
    classes: int = 1000,
) -> nn.Module:
    """Swin; the defaults are Swin-T (28.3M parameters). Every stage's map must split
    into whole windows: ``image_size / patch / 2**i`` a multiple of the window (or no
    larger than it), and each stage's width a multiple of its heads."""
    if len(depths) != len(heads) or not depths:
        raise ValueError(f"swin needs one head count per stage, got {depths=} {heads=}")
    side = image_size // patch
    for i, h in enumerate(heads):
        ws = min(window, side)
        if image_size % patch or side % ws or side == 0 or (dim << i) % h:
            raise ValueError(
                f"swin stage {i}: a {side}x{side} map of width {dim << i} does not split into "
                f"{ws}x{ws} windows and {h} heads (image_size {image_size}, patch {patch})"
            )
        side //= 2
    return Swin(image_size, patch, dim, tuple(depths), tuple(heads), window, classes)


class _MixerBlock(nn.Module):
    """MLP-Mixer block: an MLP across tokens, then an MLP across channels."""

    def __init__(self, tokens: int, dim: int, token_hidden: int, channel_hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.token_mlp = nn.Sequential(
            nn.Linear(tokens, token_hidden), nn.GELU(), nn.Linear(token_hidden, tokens)
        )
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.channel_mlp = nn.Sequential(
            nn.Linear(dim, channel_hidden), nn.GELU(), nn.Linear(channel_hidden, dim)
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))  # type: ignore[no-any-return]


class MLPMixer(nn.Module):
    """MLP-Mixer (Tolstikhin et al., 2021): patches, then token- and channel-mixing MLPs."""

    def __init__(
        self,
        image_size: int,
        patch: int,
        dim: int,
        depth: int,
        token_hidden: int,
        channel_hidden: int,
        classes: int,
    ) -> None:
        super().__init__()
        tokens = (image_size // patch) ** 2
        self.stem = nn.Conv2d(3, dim, patch, patch)
        self.blocks = nn.Sequential(
            *(_MixerBlock(tokens, dim, token_hidden, channel_hidden) for _ in range(depth))
        )
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)
        x = self.norm(self.blocks(x)).mean(1)
        x = self.head(x)
        return x


def mlp_mixer(
    image_size: int = 224,
    patch: int = 16,
    dim: int = 512,
    depth: int = 8,
    token_hidden: int = 256,
    channel_hidden: int = 2048,
    classes: int = 1000,
) -> nn.Module:
    """MLP-Mixer; the defaults are Mixer-S/16 (18.5M parameters). Inputs must be
    ``image_size`` squared (a multiple of ``patch``)."""
    if image_size % patch:
        raise ValueError(f"image_size {image_size} is not a multiple of patch {patch}")
    return MLPMixer(image_size, patch, dim, depth, token_hidden, channel_hidden, classes)


class _PoolBlock(nn.Module):
    """PoolFormer block: average pooling as the token mixer (minus the identity), then a
    1x1-conv MLP; GroupNorm(1) norms and layer scales."""

    def __init__(self, dim: int, layer_scale: float = 1e-5) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(1, dim)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.norm2 = nn.GroupNorm(1, dim)
        self.mlp = nn.Sequential(nn.Conv2d(dim, 4 * dim, 1), nn.GELU(), nn.Conv2d(4 * dim, dim, 1))
        self.gamma1 = _layer_scale(dim, layer_scale, 1, 1)
        self.gamma2 = _layer_scale(dim, layer_scale, 1, 1)

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm1(x)
        x = x + self.gamma1 * (self.pool(y) - y)
        out: Tensor = x + self.gamma2 * self.mlp(self.norm2(x))
        return out


class PoolFormer(nn.Module):
    """PoolFormer (Yu et al., 2022): a MetaFormer whose token mixer is pooling."""

    def __init__(self, depths: Sequence[int], dims: Sequence[int], classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 7, 4, 2)]
        for i, (depth, dim) in enumerate(zip(depths, dims)):
            if i:
                layers.append(nn.Conv2d(dims[i - 1], dim, 3, 2, 1))
            layers += [_PoolBlock(dim) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.GroupNorm(1, dims[-1])
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm(self.features(x)).mean((2, 3))
        x = self.head(x)
        return x


def poolformer(
    depths: Sequence[int] = (2, 2, 6, 2),
    dims: Sequence[int] = (64, 128, 320, 512),
    classes: int = 1000,
) -> nn.Module:
    """PoolFormer; the defaults are PoolFormer-S12 (11.9M parameters)."""
    if len(depths) != len(dims) or not depths:
        raise ValueError(f"poolformer needs one depth per stage width, got {depths=} {dims=}")
    return PoolFormer(tuple(depths), tuple(dims), classes)
