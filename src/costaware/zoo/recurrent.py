"""Recurrent language models: an LSTM, GRU or plain RNN over token embeddings."""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn


class RNNModel(nn.Module):
    """Embedding -> multi-layer LSTM/GRU -> linear head (LM or last-state classifier)."""

    def __init__(
        self,
        kind: str,
        vocab: int,
        embed: int,
        hidden: int,
        layers: int,
        classes: int | None,
        dropout: float,
    ) -> None:
        super().__init__()
        self.classify = classes is not None
        self.embedding = nn.Embedding(vocab, embed)
        self.drop = nn.Dropout(dropout)
        cls = nn.LSTM if kind == "lstm" else nn.GRU
        self.rnn = cls(
            embed, hidden, layers, batch_first=True, dropout=dropout if layers > 1 else 0.0
        )
        self.head = nn.Linear(hidden, vocab if classes is None else classes)

    def forward(self, input_ids: Tensor) -> Tensor:
        x = self.drop(self.embedding(input_ids))
        out: Tensor = self.rnn(x)[0]
        out = self.drop(out[:, -1] if self.classify else out)
        out = self.head(out)
        return out


def rnn(
    kind: Literal["lstm", "gru"] = "lstm",
    vocab: int = 10000,
    embed: int = 256,
    hidden: int = 512,
    layers: int = 2,
    classes: int | None = None,
    dropout: float = 0.0,
) -> nn.Module:
    """Recurrent model on token ids ``(N, T)``.

    Returns ``(N, T, vocab)`` language-model logits when ``classes`` is None, else
    ``(N, classes)`` logits from the last time step.
    """
    if kind not in ("lstm", "gru"):
        raise ValueError(f"rnn kind must be 'lstm' or 'gru', got {kind!r}")
    return RNNModel(kind, vocab, embed, hidden, layers, classes, dropout)
