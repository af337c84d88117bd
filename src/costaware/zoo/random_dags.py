"""Random architectures from a seed: convolutional cells (NAS-style DAGs of conv,
pooling and skip ops) and transformer stacks of varied blocks.
"""

from __future__ import annotations

import math
import random
from typing import Literal

import torch
from torch import Tensor, nn

from costaware.zoo._layers import (
    _conv_bn,
    _FeedForward,
    _init_convnet,
    _init_transformer,
    _make_divisible,
    _relu,
    _SelfAttention,
)

_CELL_OPS = ("conv3x3", "conv1x1", "sep_conv3x3", "bn_relu", "max_pool3x3", "avg_pool3x3", "skip")


def _cell_op(name: str, c: int) -> nn.Module:
    if name == "conv3x3":
        return _conv_bn(c, c, 3, act=_relu)
    if name == "conv1x1":
        return _conv_bn(c, c, 1, act=_relu)
    if name == "sep_conv3x3":
        return nn.Sequential(
            nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False), _conv_bn(c, c, 1, act=_relu)
        )
    if name == "bn_relu":
        return nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(inplace=True))
    if name == "max_pool3x3":
        return nn.MaxPool2d(3, 1, 1)
    if name == "avg_pool3x3":
        return nn.AvgPool2d(3, 1, 1, count_include_pad=False)
    return nn.Identity()


class _Merge(nn.Module):
    """Combine k same-shaped tensors by sum, or by concat followed by a 1x1 conv + BN."""

    def __init__(self, mode: str, k: int, c: int) -> None:
        super().__init__()
        self.mode = mode
        self.proj: nn.Module = (
            _conv_bn(k * c, c, 1) if mode == "concat" and k > 1 else nn.Identity()
        )

    def forward(self, xs: list[Tensor]) -> Tensor:
        if self.mode == "concat" and len(xs) > 1:
            out: Tensor = self.proj(torch.cat(xs, dim=1))
            return out
        acc = xs[0]
        for t in xs[1:]:
            acc = acc + t
        return acc

    def extra_repr(self) -> str:
        return f"mode={self.mode}"


class _RandomCell(nn.Module):
    """A random DAG: node 0 is the (pre-processed) cell input, each later node applies one
    op per incoming edge and merges the results; all loose ends are merged into the output."""

    def __init__(self, cin: int, c: int, reduction: bool, rng: random.Random) -> None:
        super().__init__()
        self.reduction = reduction
        if reduction:
            self.pre: nn.Module = _conv_bn(cin, c, 3, 2, act=_relu)
        elif cin != c:
            self.pre = _conv_bn(cin, c, 1)
        else:
            self.pre = nn.Identity()
        n = rng.randint(3, 6)  # nodes, including the input node
        self.preds: list[list[int]] = []
        self.edges = nn.ModuleList()
        self.merges = nn.ModuleList()
        used: set[int] = set()
        for j in range(1, n):
            k = min(j, rng.choice((1, 1, 2, 2, 3)))
            preds = sorted(rng.sample(range(j), k))
            ops = [rng.choice(_CELL_OPS) for _ in preds]
            mode = rng.choice(("add", "concat")) if k > 1 else "add"
            self.preds.append(preds)
            self.edges.append(nn.ModuleList(_cell_op(op, c) for op in ops))
            self.merges.append(_Merge(mode, k, c))
            used.update(preds)
        self.outputs = [j for j in range(1, n) if j not in used]
        mode = rng.choice(("add", "concat")) if len(self.outputs) > 1 else "add"
        self.out_merge = _Merge(mode, len(self.outputs), c)

    def forward(self, x: Tensor) -> Tensor:
        nodes: list[Tensor] = [self.pre(x)]
        for preds, edges, merge in zip(self.preds, self.edges, self.merges, strict=True):
            assert isinstance(edges, nn.ModuleList)
            nodes.append(merge([op(nodes[p]) for p, op in zip(preds, edges, strict=True)]))
        out: Tensor = self.out_merge([nodes[j] for j in self.outputs])
        return out

    def extra_repr(self) -> str:
        return f"reduction={self.reduction}, preds={self.preds}, outputs={self.outputs}"


class RandomConvNet(nn.Module):
    """Stem -> random cells (some stride-2 reduction cells) -> global pool -> linear."""

    def __init__(
        self, seed: int, classes: int, image_size: int, in_channels: int, max_width: int
    ) -> None:
        super().__init__()
        rng = random.Random(seed)
        self.seed = seed
        c = min(max_width, rng.choice((16, 24, 32, 48, 64, 96, 128)))
        stem: list[nn.Module] = [
            _conv_bn(in_channels, c, 3, 2 if image_size >= 96 else 1, act=_relu)
        ]
        spatial = image_size // 2 if image_size >= 96 else image_size
        if image_size >= 160 and rng.random() < 0.5:
            stem.append(nn.MaxPool2d(3, 2, 1))
            spatial //= 2
        self.stem = nn.Sequential(*stem)
        n_cells = rng.randint(3, 12)
        max_red = max(0, min(3, int(math.log2(max(spatial, 1))) - 2, n_cells - 1))
        n_red = rng.randint(min(1, max_red), max_red)
        reductions = set(rng.sample(range(1, n_cells), n_red))
        cells: list[nn.Module] = []
        cin = c
        for i in range(n_cells):
            red = i in reductions
            if red:
                c = min(max_width, _make_divisible(c * rng.choice((1.5, 2.0))))
            elif rng.random() < 0.2:
                c = min(max_width, _make_divisible(c * rng.choice((0.75, 1.25))))
            cells.append(_RandomCell(cin, c, red, rng))
            cin = c
        self.cells = nn.Sequential(*cells)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(rng.choice((0.0, 0.0, 0.2, 0.5)))
        self.fc = nn.Linear(c, classes)
        _init_convnet(self)

    def forward(self, x: Tensor) -> Tensor:
        x = self.cells(self.stem(x))
        x = self.fc(self.drop(torch.flatten(self.pool(x), 1)))
        return x

    def extra_repr(self) -> str:
        return f"seed={self.seed}"


class _RandomBlock(nn.Module):
    """One random transformer block; ``style`` picks the wiring of attention, MLP, norms."""

    STYLES = ("pre", "pre", "post", "parallel", "attn", "mlp")

    def __init__(
        self,
        dim: int,
        heads: int,
        hidden: int,
        style: str,
        act: nn.Module,
        gated: bool,
        norm: str,
        dropout: float,
        causal: bool,
    ) -> None:
        super().__init__()
        self.style = style

        def make_norm() -> nn.Module:
            return nn.LayerNorm(dim) if norm == "layernorm" else nn.RMSNorm(dim)

        self.norm1 = make_norm()
        self.norm2: nn.Module = make_norm() if style in ("pre", "post") else nn.Identity()
        self.attn: nn.Module = (
            _SelfAttention(dim, heads, dropout, causal) if style != "mlp" else nn.Identity()
        )
        self.mlp: nn.Module = (
            _FeedForward(dim, hidden, act, dropout, gated) if style != "attn" else nn.Identity()
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.style == "pre":
            x = x + self.attn(self.norm1(x))
            x = x + self.mlp(self.norm2(x))
        elif self.style == "post":
            x = self.norm1(x + self.attn(x))
            x = self.norm2(x + self.mlp(x))
        elif self.style == "parallel":
            h = self.norm1(x)
            x = x + self.attn(h) + self.mlp(h)
        elif self.style == "attn":
            x = x + self.attn(self.norm1(x))
        else:
            x = x + self.mlp(self.norm1(x))
        return x

    def extra_repr(self) -> str:
        return f"style={self.style}"


class RandomTransformer(nn.Module):
    """Token embedding + learned positions -> random blocks -> norm -> head."""

    def __init__(
        self, seed: int, vocab: int, seq_len: int, classes: int | None, max_dim: int
    ) -> None:
        super().__init__()
        rng = random.Random(seed)
        self.seed = seed
        dims = [d for d in (128, 192, 256, 384, 512, 640, 768, 1024) if d <= max_dim]
        dim = rng.choice(dims or [max_dim])
        depth = rng.randint(2, 16 if dim <= 768 else 12)
        norm = rng.choice(("layernorm", "rmsnorm"))
        dropout = rng.choice((0.0, 0.0, 0.1))
        self.causal = classes is None
        self.classify = classes is not None
        head_dims = [h for h in (32, 64, 128) if dim % h == 0] or [dim]
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq_len, dim)
        self.drop = nn.Dropout(dropout)
        blocks = []
        for _ in range(depth):
            style = rng.choice(_RandomBlock.STYLES)
            heads = dim // rng.choice(head_dims)
            ratio = rng.choice((1, 2, 3, 4))
            act_name = rng.choice(("gelu", "gelu_tanh", "relu", "silu"))
            act: nn.Module = {
                "gelu": nn.GELU(),
                "gelu_tanh": nn.GELU(approximate="tanh"),
                "relu": nn.ReLU(),
                "silu": nn.SiLU(),
            }[act_name]
            gated = rng.random() < 0.3
            blocks.append(
                _RandomBlock(dim, heads, ratio * dim, style, act, gated, norm, dropout, self.causal)
            )
        self.blocks = nn.Sequential(*blocks)
        self.norm = nn.LayerNorm(dim) if norm == "layernorm" else nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab if classes is None else classes, bias=False)
        _init_transformer(self)
        if classes is None and rng.random() < 0.5:
            self.head.weight = self.embed.weight

    def forward(self, input_ids: Tensor) -> Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x: Tensor = self.drop(self.embed(input_ids) + self.pos(pos))
        x = self.norm(self.blocks(x))
        x = self.head(x.mean(dim=1) if self.classify else x)
        return x

    def extra_repr(self) -> str:
        return f"seed={self.seed}, causal={self.causal}"


def random_dag(
    seed: int,
    kind: Literal["conv", "transformer"] = "conv",
    classes: int | None = None,
    image_size: int = 32,
    in_channels: int = 3,
    max_width: int = 512,
    vocab: int = 32000,
    seq_len: int = 256,
    max_dim: int = 1024,
) -> nn.Module:
    """Random architecture, fully determined by ``seed`` and the keyword arguments.

    ``kind="conv"``: a stem, 3-12 random cells (DAGs of 3-6 nodes whose edges are drawn
    from conv3x3 / conv1x1 / separable conv / BN+ReLU / 3x3 max & avg pools / skip and
    whose nodes merge by sum or concat + 1x1 conv), random widths (<= ``max_width``)
    and stride-2 reduction cells, then global pool + linear to ``classes`` (default
    1000).  ``image_size`` only bounds the number of reductions; any input size works.

    ``kind="transformer"``: token embedding + learned positions (``seq_len``), 2-16 blocks
    of random style (pre-LN, post-LN, parallel, attention-only, MLP-only), heads,
    MLP ratio, activation and gating, with LayerNorm or RMSNorm.  Returns causal LM
    logits ``(N, T, vocab)`` when ``classes`` is None, else mean-pooled ``(N, classes)``.

    Only a private ``random.Random(seed)`` is used, so the result (and its repr) never
    depends on the global RNG state.
    """
    if kind == "conv":
        return RandomConvNet(
            seed, 1000 if classes is None else classes, image_size, in_channels, max_width
        )
    if kind == "transformer":
        return RandomTransformer(seed, vocab, seq_len, classes, max_dim)
    raise ValueError(f"random_dag kind must be 'conv' or 'transformer', got {kind!r}")
