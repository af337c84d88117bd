from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import costaware as ca
from costaware.spec import default_loss
from tests.conftest import tiny_cnn


def _spec(**kw: object) -> ca.TrainingSpec:
    base: dict[str, object] = dict(
        model=tiny_cnn, batch=ca.ImageBatch((3, 8, 8), classes=10), batch_size=4
    )
    base.update(kw)
    return ca.TrainingSpec(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8"])
def test_batch_size_must_be_positive_int(bad: object) -> None:
    with pytest.raises(ca.SpecError, match="batch_size must be a positive integer"):
        _spec(batch_size=bad)


def test_integers_of_any_integral_type_are_taken_as_ints() -> None:
    """A numpy integer (a search space's ``np.arange``, a config read with numpy) is a
    positive integer like an int, and the spec holds plain ints; a bool or a float is not."""
    np = pytest.importorskip("numpy")
    spec = ca.TrainingSpec(
        model=tiny_cnn,
        batch=ca.ImageBatch((np.int64(3), 8, 8), classes=np.int32(10)),
        batch_size=np.int64(8),
        grad_accumulation=np.int64(2),
        epochs=np.int16(3),
        dataset_size=np.uint32(100),
        max_steps=np.int64(40),
        world_size=np.int64(1),
    )
    for name in ("batch_size", "grad_accumulation", "epochs", "dataset_size", "max_steps"):
        assert type(getattr(spec, name)) is int, name
    assert type(spec.world_size) is int
    assert all(type(d) is int for d in spec.batch.shape)  # type: ignore[union-attr]
    assert type(spec.batch.classes) is int  # type: ignore[union-attr]
    tokens = ca.TokenBatch(np.int64(16), np.int64(100), num_labels=np.int64(3))
    assert (type(tokens.seq_len), type(tokens.vocab), type(tokens.num_labels)) == (int,) * 3
    for bad in (np.float64(8.0), np.bool_(True), np.int64(0)):
        with pytest.raises(ca.SpecError, match="batch_size must be a positive integer"):
            _spec(batch_size=bad)


def test_a_batch_size_past_any_device_is_refused_not_overflowed() -> None:
    """Past 2**31 - 1 samples a step's byte counts would leave an int64: refused."""
    from costaware.spec import MAX_BATCH_SIZE

    assert _spec(batch_size=MAX_BATCH_SIZE).batch_size == MAX_BATCH_SIZE
    with pytest.raises(ca.SpecError, match="give a smaller batch size"):
        _spec(batch_size=10**12)


def test_unknown_optimizer_lists_known_ones() -> None:
    with pytest.raises(ca.SpecError, match=r"unknown optimizer 'lamb'.*adamw"):
        _spec(optimizer="lamb")


def test_optimizer_class_accepted_and_names_normalised() -> None:
    assert _spec(optimizer=torch.optim.SGD).optimizer_class is torch.optim.SGD
    assert _spec(optimizer="AdamW").optimizer_name == "adamw"
    with pytest.raises(ca.SpecError, match=r"torch\.optim\.Optimizer"):
        _spec(optimizer=int)


@pytest.mark.parametrize(
    ("given", "canonical"), [("bf16-mixed", "bf16"), ("16-mixed", "fp16"), ("32", "fp32")]
)
def test_precision_aliases(given: str, canonical: str) -> None:
    assert _spec(precision=given).precision == canonical


def test_bad_precision_allocator_batch_model() -> None:
    with pytest.raises(ca.SpecError, match="precision"):
        _spec(precision="fp8")
    with pytest.raises(ca.SpecError, match="allocator"):
        _spec(allocator="cudaMallocAsync")
    with pytest.raises(ca.SpecError, match="batch must be"):
        _spec(batch=(3, 224, 224))
    with pytest.raises(ca.SpecError, match="model must be"):
        _spec(model=42)
    with pytest.raises(ca.SpecError, match="shape"):
        ca.ImageBatch((3, 0, 8))
    with pytest.raises(ca.SpecError, match="segmentation"):
        ca.SegmentationBatch((8, 8))


def test_steps_and_state_counts() -> None:
    spec = _spec(
        batch_size=64, dataset_size=1000, optimizer="sgd", optimizer_kwargs={"momentum": 0.9}
    )
    assert spec.steps_per_epoch == 16
    assert spec.optimizer_state_per_param == 1.0
    assert _spec(optimizer="sgd").optimizer_state_per_param == 0.0
    assert _spec(optimizer="adam").optimizer_state_per_param == 2.0
    assert _spec().steps_per_epoch is None


def test_a_rank_steps_through_its_share_of_the_data() -> None:
    """DistributedSampler gives each of world_size ranks ceil(N / world_size) samples."""
    assert _spec(batch_size=64, dataset_size=1000, world_size=4).steps_per_epoch == 4
    # 1001 samples over 4 ranks: 251 each, in 4 batches of 64 (the last one partial)
    assert _spec(batch_size=64, dataset_size=1001, world_size=4).steps_per_epoch == 4
    assert _spec(batch_size=50, dataset_size=1001, world_size=4).steps_per_epoch == 6


def test_the_trial_is_its_epochs_cut_at_max_steps() -> None:
    assert _spec(batch_size=64, dataset_size=1000, epochs=3).trial_steps == 48
    # max_steps counts optimizer steps: with accumulation, that many micro-batches each
    cut = _spec(batch_size=64, dataset_size=1000, epochs=3, max_steps=10, grad_accumulation=2)
    assert cut.trial_steps == 20
    assert _spec(batch_size=64, dataset_size=1000, epochs=3, max_steps=100).trial_steps == 48
    assert _spec(max_steps=7).trial_steps == 7  # no dataset_size: max_steps alone
    assert _spec().trial_steps is None
    assert _spec(max_steps=7).summary()["max_steps"] == 7
    assert "max_steps" not in _spec().summary()
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ca.SpecError, match="max_steps must be a positive integer"):
            _spec(max_steps=bad)


def test_epochs_may_be_unbounded_and_max_time_is_a_duration() -> None:
    # no epoch limit: the trial ends at max_steps, or its steps are unknown
    assert _spec(batch_size=64, dataset_size=1000, epochs=None).trial_steps is None
    assert _spec(batch_size=64, dataset_size=1000, epochs=None, max_steps=5).trial_steps == 5
    assert _spec(max_time="1h30m").max_time == 5400.0
    assert _spec(max_time=90).summary()["max_time"] == 90.0
    assert "max_time" not in _spec().summary()
    for bad in (0, -5, "soon", True):
        with pytest.raises(ca.SpecError, match=r"^max_time: (expected a|a duration must be positive)"):
            _spec(max_time=bad)
    with pytest.raises(ca.SpecError, match="epochs must be a positive integer"):
        _spec(epochs=0)


def test_architecture_key_tracks_factory_arguments_not_batch_size() -> None:
    a = _spec(model=functools.partial(tiny_cnn, width=8))
    assert a.architecture_key() == a.with_batch_size(99).architecture_key()
    assert (
        a.architecture_key()
        == _spec(
            model=functools.partial(tiny_cnn, width=8), optimizer_kwargs={"lr": 0.1}
        ).architecture_key()
    )
    assert (
        a.architecture_key()
        != _spec(model=functools.partial(tiny_cnn, width=16)).architecture_key()
    )
    assert (
        a.architecture_key()
        != _spec(model=functools.partial(tiny_cnn, width=8), precision="bf16").architecture_key()
    )
    width = 8
    assert _spec(model=lambda: tiny_cnn(width)).architecture_key() is not None
    # an instance has no fingerprint: its key comes from building it
    assert _spec(model=tiny_cnn()).architecture_key() is None


class _Settings:
    """A settings object a factory closes over, as a Hugging Face config is."""

    def __init__(self, width: int, attention: str = "sdpa") -> None:
        self.width = width
        self._attention = attention
        self.dtype = torch.float32
        self.labels = {0: "cat", 1: "dog"}


def test_a_factory_closing_over_a_settings_object_has_a_key_of_its_settings() -> None:
    """A factory over a config object is keyed by the object's class and attributes,
    private ones included, so a warm prediction builds nothing; another setting is another
    key, and an object costaware cannot describe (holding a module) leaves it to the
    built model."""

    def spec(settings: object) -> ca.TrainingSpec:
        return _spec(model=lambda: tiny_cnn(width=settings.width))  # type: ignore[attr-defined]

    base = spec(_Settings(8)).architecture_key()
    assert base is not None and base == spec(_Settings(8)).architecture_key()
    assert base != spec(_Settings(16)).architecture_key()
    assert base != spec(_Settings(8, attention="eager")).architecture_key()
    held = _Settings(8)
    held.layer = nn.Linear(2, 2)  # type: ignore[attr-defined]
    assert spec(held).architecture_key() is None


def test_default_loss_image_segmentation_tokens() -> None:
    torch.manual_seed(0)
    cnn = tiny_cnn(classes=10)
    x, y = ca.ImageBatch((3, 8, 8), classes=10).make(4)
    assert default_loss(cnn, (x, y)).dim() == 0

    seg = nn.Conv2d(3, 5, 1)
    batch = ca.SegmentationBatch((3, 8, 8), classes=5).make(2)
    assert batch[1].shape == (2, 8, 8)
    assert default_loss(seg, batch).dim() == 0

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(50, 16)
            self.head = nn.Linear(16, 50)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.emb(ids))

    tokens = ca.TokenBatch(seq_len=7, vocab=50).make(3)
    assert default_loss(LM(), tokens).dim() == 0


def test_default_loss_uses_hf_style_loss() -> None:
    class Out:
        def __init__(self, loss: torch.Tensor) -> None:
            self.loss = loss
            self.logits = None

    class HF(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(()))

        def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> Out:
            return Out(self.w * 3.0)

    loss = default_loss(HF(), ca.TokenBatch(4, 10).make(2))
    assert float(loss.detach()) == pytest.approx(3.0)


def test_default_loss_passes_a_dict_batch_of_other_inputs_by_name() -> None:
    """``input_ids`` with other inputs (CLIP's ``pixel_values``) is not a language-modelling
    batch: the model gets every input ``forward`` takes, by name, not the token ids alone;
    a language-modelling batch still gives a ``forward(ids)`` the token ids."""

    class TwoTower(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(50, 8)
            self.conv = nn.Conv2d(3, 8, 1)
            self.seen: list[tuple[str, ...]] = []

        def forward(
            self,
            input_ids: torch.Tensor,
            pixel_values: torch.Tensor,
            return_loss: bool = False,
        ) -> dict[str, torch.Tensor]:
            self.seen.append(("input_ids", "pixel_values") + (("return_loss",) * return_loss))
            text = self.emb(input_ids).mean(1)
            image = self.conv(pixel_values).mean((2, 3))
            return {"loss": (text @ image.T).diagonal().mean()}

    class Kwargs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tower = TwoTower()

        def forward(self, **inputs: torch.Tensor) -> dict[str, torch.Tensor]:
            return self.tower(**inputs)  # type: ignore[no-any-return]

    torch.manual_seed(0)
    batch = {
        "input_ids": torch.randint(0, 50, (2, 5)),
        "pixel_values": torch.randn(2, 3, 4, 4),
        "return_loss": True,
    }
    model = TwoTower()
    assert default_loss(model, batch).dim() == 0
    assert model.seen == [("input_ids", "pixel_values", "return_loss")]
    wrapped = Kwargs()
    assert default_loss(wrapped, batch).dim() == 0
    assert wrapped.tower.seen == [("input_ids", "pixel_values", "return_loss")]
    # a key forward does not take (an id the data loader carries) is left out
    model = TwoTower()
    assert default_loss(model, {**batch, "sample_id": torch.arange(2)}).dim() == 0

    spec = ca.TrainingSpec(
        model=TwoTower,
        batch=lambda n: {
            "input_ids": torch.randint(0, 50, (n, 5)),
            "pixel_values": torch.randn(n, 3, 4, 4),
            "return_loss": True,
        },
        batch_size=4,
    )
    assert ca.CostModel.default().predict(spec, device="H100").peak_memory > 0


def test_default_loss_finds_torchvision_segmentation_output() -> None:
    """torchvision's FCN and DeepLabV3 return ``OrderedDict(out=..., aux=...)``; an output
    the default loss cannot read names its keys."""
    from collections import OrderedDict

    class FCNLike(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Conv2d(3, 5, 1)
            self.aux = nn.Conv2d(3, 5, 1)

        def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
            return OrderedDict(out=self.head(x), aux=self.aux(x))

    class Opaque(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = nn.Conv2d(3, 5, 1)

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"masks": self.head(x), "scores": x.mean()}

    torch.manual_seed(0)
    batch = ca.SegmentationBatch((3, 8, 8), classes=5).make(2)
    assert default_loss(FCNLike(), batch).dim() == 0
    with pytest.raises(ca.SpecError, match=r"of type dict \(its keys: 'masks', 'scores'\)"):
        default_loss(Opaque(), batch)


def test_summary_is_json_able() -> None:
    import json

    json.dumps(_spec(dataset_size=100).summary())


GLOBAL_WIDTH = 8


def test_a_factory_reading_a_module_global_is_keyed_on_its_value() -> None:
    """`lambda: make(GLOBAL_WIDTH)` in a loop over the global must not share one key."""
    global GLOBAL_WIDTH
    spec = _spec(model=lambda: tiny_cnn(GLOBAL_WIDTH))
    k8 = spec.architecture_key()
    GLOBAL_WIDTH = 64
    try:
        assert spec.architecture_key() != k8
        assert ca.CostModel().predict(spec, device="H100").basis["params"] > 0
    finally:
        GLOBAL_WIDTH = 8
    assert spec.architecture_key() == k8


def test_an_example_batch_with_one_entry_per_sample_follows_the_batch_size() -> None:
    """A collate function leaves lists of one entry per sample (variable-length
    sequences, a detection batch's target dicts): the batch size is their count, not a
    sample's own length, and a batch drawn at another size has that many entries, each a
    sample of the example's, whatever its own leading dimension."""
    from costaware.from_code import BatchLikeExample

    ragged = ([torch.randn(7 + i % 5, 16) for i in range(12)], torch.randint(0, 3, (12,)))
    like = BatchLikeExample(ragged)
    assert like.batch_size == 12
    seqs, labels = like(30)
    assert len(seqs) == 30 and labels.shape == (30,)
    assert [s.shape[0] for s in seqs[:6]] == [7, 8, 9, 10, 11, 7]
    # the images and the targets follow the batch size; a box tensor of 4 rows is a
    # sample's, however many samples the example had
    targets = [{"boxes": torch.rand(4, 4), "labels": torch.randint(0, 5, (4,))} for _ in range(4)]
    detection = BatchLikeExample((torch.randn(4, 3, 8, 8), targets))
    images, drawn = detection(9)
    assert images.shape == (9, 3, 8, 8) and len(drawn) == 9
    assert {tuple(t["boxes"].shape) for t in drawn} == {(4, 4)}
    assert drawn[0]["boxes"] is not drawn[4]["boxes"]  # no two samples share a tensor
    assert "[9 samples like {'boxes': (4, 4), 'labels': (4,)}]" in detection.shapes(9)
    # the targets alone are a batch too; a pair of tensors of one length is not samples
    assert BatchLikeExample(targets).batch_size == 4
    assert BatchLikeExample([torch.randn(2, 8), torch.randn(2, 8)]).batch_size == 2


def test_a_dataclass_batch_is_drawn_as_a_dataclass() -> None:
    import dataclasses

    from costaware.from_code import BatchLikeExample

    @dataclasses.dataclass(frozen=True)
    class Batch:
        x: torch.Tensor
        y: torch.Tensor
        tag: str = "train"

    like = BatchLikeExample(Batch(torch.randn(16, 8), torch.randint(0, 2, (16,))))
    drawn = like(32)
    assert isinstance(drawn, Batch) and drawn.x.shape == (32, 8) and drawn.y.shape == (32,)
    assert drawn.tag == "train" and like.batch_size == 16
    assert like.shapes(32) == "{'x': (32, 8), 'y': (32,), 'tag': 'train'}"


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda bs: None, "returned None"),
        (lambda bs: (np.zeros((bs, 8), "float32"), np.zeros(bs, "int64")), "numpy arrays"),
        (lambda bs: [(torch.zeros(8), 1) for _ in range(bs)], "a list of 4 samples"),
    ],
)
def test_a_batch_callable_that_returns_no_batch_is_told_so(make: Any, said: str) -> None:
    """Not "the model's forward raised": the batch is what is wrong."""
    spec = ca.TrainingSpec(model=lambda: nn.Linear(8, 2), batch=make, batch_size=4)
    with pytest.raises(ca.SpecError, match=f"the batch callable .*{said}"):
        ca.dry_run(spec)


def test_a_batch_with_tensors_and_a_numpy_extra_is_taken() -> None:
    """Only a batch without any tensor is told it holds numpy arrays: a dict batch may
    carry an array the loss never reads."""
    from costaware.spec import _not_a_batch

    batch = {"x": torch.zeros(4, 8), "meta": np.zeros(4)}
    assert _not_a_batch(batch, 4) is None
    assert "numpy" in (_not_a_batch({"x": np.zeros((4, 8))}, 4) or "")
