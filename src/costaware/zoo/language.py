"""Transformer language models: GPT (causal decoder), BERT (masked-LM encoder),
LLaMA-style decoders (RMSNorm, SwiGLU, rotary embeddings, grouped-query attention) and
T5-style encoder-decoders.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from costaware.zoo._layers import _init_transformer, _on_meta, _PreLNBlock


class GPT(nn.Module):
    """GPT-2 style decoder: learned positions, pre-LN causal blocks, (tied) LM head."""

    def __init__(
        self,
        vocab: int,
        seq_len: int,
        dim: int,
        depth: int,
        heads: int,
        mlp_ratio: float,
        dropout: float,
        tie_weights: bool,
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq_len, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(
            *(_PreLNBlock(dim, heads, mlp_ratio, dropout, causal=True) for _ in range(depth))
        )
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        _init_transformer(self)
        for block in () if _on_meta(self) else self.blocks:  # GPT-2 scaled residual init
            assert isinstance(block, _PreLNBlock)
            for w in (block.attn.proj.weight, block.mlp.fc2.weight):
                nn.init.normal_(w, 0.0, 0.02 / math.sqrt(2 * depth))
        if tie_weights:
            self.lm_head.weight = self.wte.weight

    def forward(self, input_ids: Tensor) -> Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x: Tensor = self.drop(self.wte(input_ids) + self.wpe(pos))
        x = self.ln_f(self.blocks(x))
        x = self.lm_head(x)
        return x


def gpt(
    vocab: int = 50257,
    seq_len: int = 1024,
    dim: int = 768,
    depth: int = 12,
    heads: int = 12,
    mlp_ratio: float = 4,
    dropout: float = 0.0,
    tie_weights: bool = True,
) -> nn.Module:
    """GPT-2 decoder; ``forward(input_ids)`` with ``T <= seq_len`` -> ``(N, T, vocab)``."""
    return GPT(vocab, seq_len, dim, depth, heads, mlp_ratio, dropout, tie_weights)


class BERT(nn.Module):
    """BERT encoder (Devlin et al., 2018): post-LN layers with an MLM or [CLS] head."""

    def __init__(
        self,
        vocab: int,
        seq_len: int,
        dim: int,
        depth: int,
        heads: int,
        mlp_ratio: float,
        classes: int | None,
        dropout: float,
    ) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, dim)
        self.position_embeddings = nn.Embedding(seq_len, dim)
        self.token_type_embeddings = nn.Embedding(2, dim)
        self.emb_norm = nn.LayerNorm(dim, eps=1e-12)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                dim,
                heads,
                int(dim * mlp_ratio),
                dropout,
                activation="gelu",
                layer_norm_eps=1e-12,
                batch_first=True,
                norm_first=False,
            )
            for _ in range(depth)
        )
        self.classes = classes
        self.head: nn.Module
        if classes is None:  # masked-LM head, decoder tied to the word embeddings
            decoder = nn.Linear(dim, vocab)
            self.head = nn.Sequential(
                nn.Linear(dim, dim), nn.GELU(), nn.LayerNorm(dim, eps=1e-12), decoder
            )
        else:  # pooler over the first ([CLS]) token, then a classifier
            self.head = nn.Sequential(
                nn.Linear(dim, dim), nn.Tanh(), nn.Dropout(dropout), nn.Linear(dim, classes)
            )
        _init_transformer(self)
        if classes is None:
            decoder.weight = self.word_embeddings.weight

    def forward(self, input_ids: Tensor) -> Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos)
        x = x + self.token_type_embeddings.weight[0]  # segment A everywhere
        x = self.drop(self.emb_norm(x))
        for layer in self.layers:
            x = layer(x)
        out: Tensor = self.head(x if self.classes is None else x[:, 0])
        return out


def bert(
    vocab: int = 30522,
    seq_len: int = 512,
    dim: int = 768,
    depth: int = 12,
    heads: int = 12,
    mlp_ratio: float = 4,
    classes: int | None = None,
    dropout: float = 0.1,
) -> nn.Module:
    """BERT on token ids ``(N, T)``, ``T <= seq_len``.

    Returns ``(N, T, vocab)`` masked-LM logits when ``classes`` is None, else
    ``(N, classes)`` logits from the pooled first token.
    """
    return BERT(vocab, seq_len, dim, depth, heads, mlp_ratio, classes, dropout)


def _rotate(x: Tensor, base: float = 10000.0) -> Tensor:
    """Rotary position embedding of ``(N, heads, T, d)`` queries or keys (the half-split
    form of GPT-NeoX and LLaMA's Hugging Face port), its angles made from the positions."""
    t, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(t, device=x.device, dtype=torch.float32), inv)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1)


class _LlamaBlock(nn.Module):
    """RMSNorm -> causal attention with rotary embeddings and grouped-query heads ->
    RMSNorm -> SwiGLU MLP; no biases."""

    def __init__(self, dim: int, heads: int, kv_heads: int, ffn: int, eps: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.attn_norm = nn.RMSNorm(dim, eps=eps)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.ffn_norm = nn.RMSNorm(dim, eps=eps)
        self.w1 = nn.Linear(dim, ffn, bias=False)
        self.w3 = nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        n, t, dim = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(n, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(n, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(n, t, self.kv_heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            _rotate(q), _rotate(k), v, is_causal=True, enable_gqa=self.kv_heads != self.heads
        )
        x = x + self.wo(y.transpose(1, 2).reshape(n, t, dim))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))  # type: ignore[no-any-return]


class Llama(nn.Module):
    """A LLaMA-style decoder (Touvron et al., 2023): token embedding, RMSNorm/SwiGLU
    blocks with rotary, grouped-query causal attention, an untied LM head."""

    def __init__(
        self, vocab: int, dim: int, depth: int, heads: int, kv_heads: int, ffn: int, eps: float
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(
            *(_LlamaBlock(dim, heads, kv_heads, ffn, eps) for _ in range(depth))
        )
        self.norm = nn.RMSNorm(dim, eps=eps)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        _init_transformer(self)

    def forward(self, input_ids: Tensor) -> Tensor:
        x = self.norm(self.blocks(self.embed(input_ids)))
        logits: Tensor = self.lm_head(x)
        return logits


def llama(
    vocab: int = 32000,
    dim: int = 2048,
    depth: int = 16,
    heads: int = 32,
    kv_heads: int = 8,
    ffn: int | None = None,
    eps: float = 1e-5,
) -> nn.Module:
    """LLaMA-style decoder on token ids ``(N, T)`` -> ``(N, T, vocab)``; ``ffn`` defaults
    to LLaMA's ``8/3 * dim`` rounded up to a multiple of 256. ``heads`` must be a multiple
    of ``kv_heads`` (equal: multi-head attention) and divide ``dim`` into even head dims."""
    if heads % kv_heads or dim % heads or (dim // heads) % 2:
        raise ValueError(
            f"llama needs heads ({heads}) a multiple of kv_heads ({kv_heads}) and dim ({dim}) "
            "split into even head dims"
        )
    if ffn is None:
        ffn = 256 * math.ceil(8 * dim / 3 / 256)
    return Llama(vocab, dim, depth, heads, kv_heads, ffn, eps)


class _T5Attention(nn.Module):
    """T5 attention: no biases, no 1/sqrt(d) scaling beyond SDPA's own, an additive bias."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor, kv: Tensor, bias: Tensor | None) -> Tensor:
        n, t, dim = x.shape
        s, d = kv.shape[1], dim // self.heads
        q = self.q(x).view(n, t, self.heads, d).transpose(1, 2)
        k = self.k(kv).view(n, s, self.heads, d).transpose(1, 2)
        v = self.v(kv).view(n, s, self.heads, d).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if bias is None else bias.to(q.dtype)
        )
        return self.o(y.transpose(1, 2).reshape(n, t, dim))  # type: ignore[no-any-return]


class _T5Layer(nn.Module):
    """Pre-RMSNorm self-attention, cross-attention (decoder only) and a ReLU MLP."""

    def __init__(self, dim: int, heads: int, ffn: int, dropout: float, decoder: bool) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(dim, eps=1e-6)
        self.self_attn = _T5Attention(dim, heads)
        self.cross: nn.ModuleList | None = None
        if decoder:
            self.cross = nn.ModuleList([nn.RMSNorm(dim, eps=1e-6), _T5Attention(dim, heads)])
        self.norm2 = nn.RMSNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(dim, ffn, bias=False),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(ffn, dim, bias=False),
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, bias: Tensor, memory: Tensor | None = None) -> Tensor:
        h = self.norm1(x)
        x = x + self.drop(self.self_attn(h, h, bias))
        if self.cross is not None and memory is not None:
            x = x + self.drop(self.cross[1](self.cross[0](x), memory, None))
        out: Tensor = x + self.drop(self.mlp(self.norm2(x)))
        return out


class T5(nn.Module):
    """A T5-style encoder-decoder (Raffel et al., 2020) on one token sequence: the encoder
    reads it, the decoder reads it shifted right by one (a start token 0 first) and attends
    to the encoder. Relative positions as learned per-head biases over clipped offsets
    (T5's buckets, linear), causal in the decoder."""

    def __init__(
        self, vocab: int, dim: int, depth: int, heads: int, ffn: int, dropout: float, buckets: int
    ) -> None:
        super().__init__()
        self.buckets = buckets
        self.embed = nn.Embedding(vocab, dim)
        self.enc_bias = nn.Embedding(buckets, heads)
        self.dec_bias = nn.Embedding(buckets, heads)
        self.encoder = nn.ModuleList(
            _T5Layer(dim, heads, ffn, dropout, False) for _ in range(depth)
        )
        self.decoder = nn.ModuleList(_T5Layer(dim, heads, ffn, dropout, True) for _ in range(depth))
        self.enc_norm = nn.RMSNorm(dim, eps=1e-6)
        self.dec_norm = nn.RMSNorm(dim, eps=1e-6)
        self.drop = nn.Dropout(dropout)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        _init_transformer(self)

    def _bias(self, table: nn.Embedding, t: int, device: torch.device, causal: bool) -> Tensor:
        pos = torch.arange(t, device=device)
        rel = pos[None, :] - pos[:, None]  # key - query
        half = self.buckets // 2
        # the decoder sees only earlier keys: offsets 0..buckets-1 back; the encoder both ways
        bucket = (-rel).clamp(0, self.buckets - 1) if causal else rel.clamp(-half, half - 1) + half
        bias: Tensor = table(bucket).permute(2, 0, 1)  # (heads, T, T)
        if causal:
            bias = bias.masked_fill(rel > 0, -1e4)
        return bias

    def forward(self, input_ids: Tensor) -> Tensor:
        t, device = input_ids.shape[1], input_ids.device
        x = self.drop(self.embed(input_ids))
        bias = self._bias(self.enc_bias, t, device, causal=False)
        for layer in self.encoder:
            x = layer(x, bias)
        memory = self.drop(self.enc_norm(x))
        start = torch.zeros_like(input_ids[:, :1])
        y = self.drop(self.embed(torch.cat([start, input_ids[:, :-1]], 1)))
        bias = self._bias(self.dec_bias, t, device, causal=True)
        for layer in self.decoder:
            y = layer(y, bias, memory)
        logits: Tensor = self.lm_head(self.drop(self.dec_norm(y)))
        return logits


def t5(
    vocab: int = 32128,
    dim: int = 512,
    depth: int = 6,
    heads: int = 8,
    ffn: int = 2048,
    dropout: float = 0.1,
    buckets: int = 32,
) -> nn.Module:
    """T5-style encoder-decoder on token ids ``(N, T)`` -> ``(N, T, vocab)``; the defaults
    are T5-small's shape (``depth`` layers in each of the encoder and the decoder)."""
    if dim % heads:
        raise ValueError(f"t5 dim {dim} is not a multiple of heads {heads}")
    return T5(vocab, dim, depth, heads, ffn, dropout, buckets)
