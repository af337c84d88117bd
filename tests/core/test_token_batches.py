"""Token batches as Hugging Face models take them: attention masks, one label per sequence,
and the position table's length checked like the vocabulary."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch import nn

import costaware as ca
from costaware.spec import check_positions, default_loss, position_table

VOCAB = 100


class Classifier(nn.Module):
    """A hand-written sequence classifier that takes the dict a tokenizer gives:
    ``input_ids``, ``attention_mask`` and ``labels`` (one class per sequence); learned
    positions in ``pos_emb``. It returns a dict with ``loss`` and ``logits``, as Hugging
    Face models do."""

    def __init__(self, max_len: int = 32, num_labels: int = 3, dim: int = 16) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, dim)
        self.pos_emb = nn.Embedding(max_len, dim)
        self.head = nn.Linear(dim, num_labels)
        self.seen: list[tuple[str, ...]] = []

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
        self.seen.append(tuple(k for k, v in given.items() if v is not None))
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tok_emb(input_ids) + self.pos_emb(pos)
        if attention_mask is not None:  # mean over the tokens the mask keeps
            mask = attention_mask.unsqueeze(-1).to(x.dtype)
            x = (x * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        else:
            x = x.mean(1)
        logits = self.head(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


class NoMask(nn.Module):
    """Takes ``input_ids`` and ``labels`` by name, but no attention mask; returns logits."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.emb(input_ids).mean(1))


def _predict(model: Any, batch: ca.TokenBatch, batch_size: int = 4) -> ca.Prediction:
    spec = ca.TrainingSpec(model=model, batch=batch, batch_size=batch_size, optimizer="adamw")
    return ca.CostModel.default().predict(spec, device="cpu")


# --------------------------------------------------------------------------------------
# the batch
# --------------------------------------------------------------------------------------
def test_the_default_token_batch_is_unchanged() -> None:
    b = ca.TokenBatch(seq_len=7, vocab=VOCAB)
    made = b.make(3)
    assert list(made) == ["input_ids", "labels"]
    assert made["input_ids"].shape == made["labels"].shape == (3, 7)
    assert int(made["labels"].max()) < VOCAB
    assert b.signature() == "TokenBatch7v100" and b.describe()["classes"] == VOCAB
    assert (b.num_labels, b.attention_mask) == (None, False)


def test_attention_mask_and_one_label_per_sequence() -> None:
    b = ca.TokenBatch(seq_len=16, vocab=VOCAB, num_labels=3, attention_mask=True)
    made = b.make(5)
    assert list(made) == ["input_ids", "attention_mask", "labels"]  # the order HF prints
    assert made["attention_mask"].shape == (5, 16) and made["attention_mask"].dtype == torch.long
    assert bool((made["attention_mask"] == 1).all())  # full-length sequences: the worst case
    assert made["labels"].shape == (5,) and int(made["labels"].max()) < 3
    assert b.describe()["classes"] == 3
    # another batch, another trace: the signature tells them apart
    signatures = {
        ca.TokenBatch(16, VOCAB).signature(),
        ca.TokenBatch(16, VOCAB, num_labels=3).signature(),
        ca.TokenBatch(16, VOCAB, attention_mask=True).signature(),
        b.signature(),
    }
    assert len(signatures) == 4
    assert b.index_ranges() == (("input_ids", VOCAB, "vocab"), ("labels", 3, "num_labels"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_labels": 0}, r"num_labels must be a positive integer, but got num_labels=0\."),
        ({"num_labels": 2.5}, r"num_labels must be a positive integer, but got num_labels=2\.5\."),
        (
            {"attention_mask": "yes"},
            r"attention_mask must be True or False \(whether the batch carries one\), but got "
            r"attention_mask='yes'\.",
        ),
    ],
)
def test_bad_token_batches_say_what_was_expected(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ca.SpecError, match=message):
        ca.TokenBatch(16, VOCAB, **kwargs)


def test_the_default_loss_passes_the_mask_only_to_a_forward_that_takes_it() -> None:
    torch.manual_seed(0)
    batch = ca.TokenBatch(8, VOCAB, num_labels=3, attention_mask=True).make(2)
    model = Classifier()
    assert default_loss(model, batch).dim() == 0
    assert model.seen == [("input_ids", "attention_mask", "labels")]
    no_mask = ca.TokenBatch(8, VOCAB, num_labels=4, attention_mask=True).make(2)
    assert default_loss(NoMask(), no_mask).dim() == 0  # not a TypeError about attention_mask


# --------------------------------------------------------------------------------------
# dry runs of a hand-written model that takes the same dict
# --------------------------------------------------------------------------------------
def test_a_hand_written_classifier_is_predicted_with_its_mask_and_labels() -> None:
    seen: list[tuple[str, ...]] = []

    def factory() -> Classifier:
        m = Classifier(max_len=32)
        m.seen = seen
        return m

    pred = _predict(factory, ca.TokenBatch(32, VOCAB, num_labels=3, attention_mask=True))
    assert pred.peak_memory > 0
    assert ("input_ids", "attention_mask", "labels") in seen
    assert pred.spec["batch"] == "TokenBatch32v100l3m"


def test_labels_past_num_labels_name_both_sizes() -> None:
    with pytest.raises(
        ca.SpecError,
        match=r"the batch's labels \(num_labels=5\) are drawn from 0 to 4, but the model feeds "
        r"them to a cross-entropy over 3 classes.*TokenBatch\(\.\.\., num_labels=3\)",
    ):
        _predict(functools.partial(Classifier, 32, 3), ca.TokenBatch(32, VOCAB, num_labels=5))


def test_a_sequence_past_the_position_table_names_both_sizes() -> None:
    """A real step fails with an index error; the dry run on fake tensors would not, so the
    spec check says it first, like the vocabulary check."""
    model = Classifier(max_len=32)
    with pytest.raises(IndexError):  # what the real step does
        model(**ca.TokenBatch(33, VOCAB, num_labels=3).make(2))
    with pytest.raises(
        ca.SpecError,
        match=r"^the batch's sequences are 33 tokens long, but Classifier has positions for 32 "
        r"\(the embedding pos_emb of 32 rows\): a real training step would fail on the "
        r"positions past 31 \(an index out of range\)\. Make the batch fit the model: "
        r"TokenBatch\(seq_len=32, \.\.\.\) or shorter, or a model with room for 33 positions\.$",
    ):
        _predict(functools.partial(Classifier, 32), ca.TokenBatch(33, VOCAB, num_labels=3))
    # an instance too, and exactly the table's length fits
    with pytest.raises(ca.SpecError, match="33 tokens long"):
        _predict(Classifier(max_len=32), ca.TokenBatch(33, VOCAB, num_labels=3))
    assert _predict(functools.partial(Classifier, 32), ca.TokenBatch(32, VOCAB, 3)).peak_memory


def test_models_without_a_position_table_take_any_length() -> None:
    assert position_table(NoMask()) is None  # an embedding of tokens only
    batch = ca.TokenBatch(4096, VOCAB, num_labels=4).make(1)
    check_positions(NoMask(), batch)  # no error
    check_positions(Classifier(max_len=8), (torch.zeros(2, 64), torch.zeros(2)))  # not tokens

    class Relative(nn.Module):  # T5-style relative buckets are no position table
        def __init__(self) -> None:
            super().__init__()
            self.relative_attention_bias = nn.Embedding(32, 4)

    assert position_table(Relative()) is None
    assert position_table(Classifier(max_len=8)) == (8, "the embedding pos_emb of 8 rows")


# --------------------------------------------------------------------------------------
# real Hugging Face models
# --------------------------------------------------------------------------------------
def _quiet_transformers() -> Any:
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    return transformers


def _gpt2(n_positions: int = 64, **kw: Any) -> Any:
    t = _quiet_transformers()
    cfg = t.GPT2Config(
        n_layer=1, n_head=2, n_embd=32, n_positions=n_positions, vocab_size=VOCAB,
        bos_token_id=0, eos_token_id=0, **kw,
    )  # fmt: skip
    return t.GPT2LMHeadModel(cfg)


def test_gpt2_past_n_positions_is_a_spec_error_naming_both_sizes() -> None:
    _quiet_transformers()
    with pytest.raises(IndexError):  # a real step on the real model
        _gpt2(64)(**ca.TokenBatch(65, VOCAB).make(1))
    with pytest.raises(
        ca.SpecError,
        match=r"sequences are 65 tokens long, but GPT2LMHeadModel has positions for 64 "
        r"\(config\.n_positions=64, the embedding transformer\.wpe\)",
    ):
        _predict(functools.partial(_gpt2, 64), ca.TokenBatch(65, VOCAB))
    ok = _predict(functools.partial(_gpt2, 64), ca.TokenBatch(64, VOCAB, attention_mask=True))
    assert ok.peak_memory > 0


def test_hugging_face_sequence_classifiers_with_masks_and_labels() -> None:
    t = _quiet_transformers()

    def bert(max_positions: int = 64) -> Any:
        cfg = t.BertConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=max_positions, vocab_size=VOCAB, num_labels=3,
        )  # fmt: skip
        return t.BertForSequenceClassification(cfg)

    def gpt2_classifier() -> Any:
        cfg = t.GPT2Config(
            n_layer=1, n_head=2, n_embd=32, n_positions=64, vocab_size=VOCAB, num_labels=3,
            pad_token_id=0, bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        return t.GPT2ForSequenceClassification(cfg)

    batch = ca.TokenBatch(64, VOCAB, num_labels=3, attention_mask=True)
    for factory in (bert, gpt2_classifier):
        out = factory()(**batch.make(2))  # the real model takes the batch as it is
        assert out.loss.dim() == 0 and out.logits.shape == (2, 3)
        assert _predict(factory, batch).peak_memory > 0
    # BERT past max_position_embeddings: a size mismatch in a real step, a SpecError here
    with pytest.raises(RuntimeError):
        bert(64)(**ca.TokenBatch(65, VOCAB, num_labels=3, attention_mask=True).make(1))
    with pytest.raises(
        ca.SpecError,
        match=r"BertForSequenceClassification has positions for 64 \(config\."
        r"max_position_embeddings=64, the embedding bert\.embeddings\.position_embeddings\)",
    ):
        _predict(bert, ca.TokenBatch(65, VOCAB, num_labels=3, attention_mask=True))
    # labels for 5 classes against a 3-class head
    with pytest.raises(ca.SpecError, match=r"labels \(num_labels=5\).*over 3 classes"):
        _predict(bert, ca.TokenBatch(64, VOCAB, num_labels=5, attention_mask=True))


def test_roberta_positions_start_after_its_padding_row() -> None:
    t = _quiet_transformers()

    def roberta() -> Any:
        cfg = t.RobertaConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=66, vocab_size=VOCAB, num_labels=2, pad_token_id=1,
        )  # fmt: skip
        return t.RobertaForSequenceClassification(cfg)

    assert position_table(roberta())[0] == 64  # type: ignore[index]
    with pytest.raises(RuntimeError):  # 65 tokens: position 66 of a 66-row table
        roberta()(**ca.TokenBatch(65, VOCAB, num_labels=2, attention_mask=True).make(1))
    with pytest.raises(ca.SpecError, match=r"positions for 64 .*whose first 2 rows are not"):
        _predict(roberta, ca.TokenBatch(65, VOCAB, num_labels=2, attention_mask=True))
    assert _predict(roberta, ca.TokenBatch(64, VOCAB, num_labels=2, attention_mask=True))
