"""A deterministic corpus of real, varied training configurations to measure.

Each :class:`Config` is a small JSON-able record (zoo factory + keyword arguments, the
batch, the batch size, the optimizer, the precision, ...) whose :meth:`Config.to_spec`
rebuilds the :class:`~costaware.spec.TrainingSpec`. The corpus is built from the zoo
families (VGG, ResNet, MobileNet v2/v3, SqueezeNet, ShuffleNet, GoogLeNet, DenseNet, ViT,
MLP, LSTM/GRU, GPT, BERT, U-Net) and the random DAG generator, varied over batch size,
input size, width/depth, optimizer (SGD/Adam/AdamW), precision (fp32/bf16/fp16) and
sequence length.

- ``corpus("gpu")`` spans real training sizes (up to GPT-2 medium, ViT-B, ResNet-152 at
  224 px): what an H100 measures in a few seconds per configuration; some OOM on purpose.
- ``corpus("cpu")`` uses small models and inputs so that one measurement takes well under
  ~5 s on one CPU core.

The list is shuffled with the seed so that any prefix covers every family, and ids are a
hash of the record, so a resumed collection skips exactly what it has measured. Shards are
balanced on a rough time estimate (:attr:`Config.est_seconds`), disjoint and covering.

Imports only torch and costaware's torch-only modules (it runs on bare GPU boxes).

Example:
    >>> from costaware.measure.corpus import corpus
    >>> configs = corpus("cpu", shard=0, shards=4)
    >>> spec = configs[0].to_spec()
    >>> spec.batch_size == configs[0].batch_size
    True
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from costaware import zoo
from costaware.spec import ImageBatch, SegmentationBatch, TokenBatch, TrainingSpec

__all__ = [
    "CORPUS_VERSION",
    "KINDS",
    "SHARD_TARGET_SECONDS",
    "Config",
    "corpus",
    "full_corpus",
    "recommended_shards",
    "shard_estimates",
]

#: Bumped when the generator changes (ids are content hashes, so old rows stay valid).
CORPUS_VERSION = 1
#: "gpu" and "cpu" draw the original sixteen families; "gpu-broad" and "cpu-broad" the
#: broad ones (:data:`costaware.zoo.BROAD_FAMILIES`) at the same sizes, apart, so that the
#: corpora already measured keep their configurations, order and shards
KINDS = ("gpu", "cpu", "gpu-broad", "cpu-broad")
#: A shard should finish within this many seconds (estimated, H100 for "gpu").
SHARD_TARGET_SECONDS = 8 * 60.0

#: Rough sustained throughput (FLOP/s) of a training step, to estimate measurement time.
_THROUGHPUT = {
    ("gpu", "fp32"): 25e12,
    ("gpu", "bf16"): 90e12,
    ("gpu", "fp16"): 90e12,
    ("cpu", "fp32"): 25e9,
    ("cpu", "bf16"): 8e9,
    ("cpu", "fp16"): 5e9,
}
#: Fixed cost of one measurement: build, warm-up allocations, cuDNN, process overheads.
_OVERHEAD_S = {"gpu": 3.5, "cpu": 0.4}
_MEASURED_STEPS = 13  # warmup 3 + 10 timed steps

_FACTORIES: dict[str, Callable[..., Any]] = {
    "mlp": zoo.mlp,
    "vgg": zoo.vgg,
    "resnet": zoo.resnet,
    "mobilenet_v2": zoo.mobilenet_v2,
    "mobilenet_v3": zoo.mobilenet_v3,
    "squeezenet": zoo.squeezenet,
    "shufflenet_v2": zoo.shufflenet_v2,
    "googlenet": zoo.googlenet,
    "densenet": zoo.densenet,
    "vit": zoo.vit,
    "rnn": zoo.rnn,
    "gpt": zoo.gpt,
    "bert": zoo.bert,
    "unet": zoo.unet,
    "random_dag": zoo.random_dag,
    # the broad families (kinds "gpu-broad" and "cpu-broad")
    "convnext": zoo.convnext,
    "efficientnet": zoo.efficientnet,
    "swin": zoo.swin,
    "mlp_mixer": zoo.mlp_mixer,
    "poolformer": zoo.poolformer,
    "llama": zoo.llama,
    "t5": zoo.t5,
    "inception": zoo.inception,
    "resnext": zoo.resnext,
    "regnet": zoo.regnet,
}


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def _tupled(value: Any) -> Any:
    """JSON lists back to tuples (zoo factories take tuples for sequences)."""
    if isinstance(value, list):
        return tuple(_tupled(v) for v in value)
    return value


@dataclass(frozen=True)
class Config:
    """One training configuration of the corpus, as a JSON-able record.

    ``batch_kind`` is ``"image"``, ``"vector"``, ``"segmentation"`` or ``"tokens"``;
    ``batch_shape`` is the per-sample shape (``[seq_len]`` for tokens) and ``classes`` the
    number of classes (the vocabulary for tokens). ``fwd_flops`` is a rough forward FLOP
    count per sample and ``est_seconds`` a rough measurement time, used to balance shards.
    """

    id: str
    family: str
    factory: str
    kwargs: dict[str, Any]
    batch_kind: str
    batch_shape: list[int]
    classes: int
    batch_size: int
    optimizer: str = "adamw"
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)
    precision: str = "fp32"
    allocator: str = "default"
    cudnn_benchmark: bool = False
    corpus: str = ""
    fwd_flops: float = 0.0
    est_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Config:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    def model_factory(self) -> Callable[[], Any]:
        """A zero-argument factory (a ``functools.partial`` of the zoo function)."""
        fn = _FACTORIES.get(self.factory)
        if fn is None:
            raise ValueError(
                f"unknown zoo factory {self.factory!r}; expected one of {sorted(_FACTORIES)}."
            )
        return functools.partial(fn, **{k: _tupled(v) for k, v in self.kwargs.items()})

    def to_spec(self) -> TrainingSpec:
        """The :class:`TrainingSpec` this record describes."""
        shape = tuple(int(s) for s in self.batch_shape)
        batch: Any
        if self.batch_kind == "tokens":
            batch = TokenBatch(shape[0], self.classes)
        elif self.batch_kind == "segmentation":
            batch = SegmentationBatch(shape, classes=self.classes)
        elif self.batch_kind in ("image", "vector"):
            batch = ImageBatch(shape, classes=self.classes)
        else:
            raise ValueError(f"unknown batch_kind {self.batch_kind!r}.")
        return TrainingSpec(
            model=self.model_factory(),
            batch=batch,
            batch_size=self.batch_size,
            optimizer=self.optimizer,
            optimizer_kwargs=dict(self.optimizer_kwargs),
            precision=self.precision,
            cudnn_benchmark=self.cudnn_benchmark,
            allocator=self.allocator,
            name=self.id,
        )


def _make(
    kind: str,
    family: str,
    factory: str,
    kwargs: dict[str, Any],
    batch_kind: str,
    batch_shape: tuple[int, ...],
    classes: int,
    batch_size: int,
    fwd_flops: float,
    rng: random.Random,
) -> Config:
    opt = rng.choice(("sgd", "adam", "adamw"))
    opt_kw: dict[str, Any] = {"lr": 0.01} if opt == "sgd" else {"lr": 1e-3}
    if opt == "sgd" and rng.random() < 0.7:
        opt_kw["momentum"] = 0.9
    if kind == "gpu":
        precision = rng.choices(("fp32", "bf16", "fp16"), weights=(4, 4, 2))[0]
        allocator = "expandable_segments" if rng.random() < 0.2 else "default"
        convnet = batch_kind in ("image", "segmentation") and family not in ("vit", "mlp")
        cudnn = convnet and rng.random() < 0.15
    else:
        precision = rng.choices(("fp32", "bf16"), weights=(5, 1))[0]
        allocator, cudnn = "default", False
    record = {
        "family": family,
        "factory": factory,
        "kwargs": _jsonable(kwargs),
        "batch_kind": batch_kind,
        "batch_shape": list(batch_shape),
        "classes": classes,
        "batch_size": batch_size,
        "optimizer": opt,
        "optimizer_kwargs": opt_kw,
        "precision": precision,
        "allocator": allocator,
        "cudnn_benchmark": cudnn,
    }
    digest = hashlib.sha1(json.dumps(record, sort_keys=True).encode()).hexdigest()[:12]
    flops = 3.0 * fwd_flops * batch_size  # forward + backward
    est = _OVERHEAD_S[kind] + _MEASURED_STEPS * flops / _THROUGHPUT[(kind, precision)]
    if kind == "gpu":
        est += _MEASURED_STEPS * 0.004  # launch-bound floor of small models
    return Config(
        id=f"{family}-{digest}",
        corpus=kind,
        fwd_flops=float(fwd_flops),
        est_seconds=round(est, 3),
        **record,  # type: ignore[arg-type]
    )


# -------------------------------------------------------------------- rough FLOP counts
def _tf_flops(tokens: int, dim: int, depth: int, mlp_ratio: float = 4.0, head: int = 0) -> float:
    per_block = 2 * tokens * (4 * dim * dim + 2 * mlp_ratio * dim * dim) + 4 * tokens * tokens * dim
    return depth * per_block + 2 * tokens * dim * head


_CONV_REF_GFLOPS = {  # forward GFLOPs per 224 px sample at the reference width
    ("vgg", 11): 15.2, ("vgg", 13): 22.6, ("vgg", 16): 31.0, ("vgg", 19): 39.3,
    ("resnet", 18): 3.6, ("resnet", 34): 7.3, ("resnet", 50): 8.2,
    ("resnet", 101): 15.6, ("resnet", 152): 23.0,
    ("densenet", 121): 5.8, ("densenet", 169): 6.8, ("densenet", 201): 8.6,
}  # fmt: skip


def _scale(size: int, ref: int = 224) -> float:
    return (size / ref) ** 2


# -------------------------------------------------------------------- family generators
_Gen = Callable[[str, random.Random], Config]


def _bs(rng: random.Random, options: tuple[int, ...]) -> int:
    return rng.choice(options)


def _g_mlp(kind: str, rng: random.Random) -> Config:
    if kind == "gpu":
        width = rng.choice((512, 1024, 2048, 4096))
        depth = rng.choice((2, 3, 4, 6))
        bs = _bs(rng, (64, 128, 256, 512, 1024, 2048, 4096))
    else:
        width = rng.choice((128, 256, 512, 1024))
        depth = rng.choice((1, 2, 3, 4))
        bs = _bs(rng, (16, 32, 64, 128, 256))
    shape, bk = rng.choice((((784,), "vector"), ((3072,), "vector"), ((3, 32, 32), "image")))
    classes = rng.choice((10, 100, 1000))
    inf = math.prod(shape)
    hidden = tuple(width for _ in range(depth))
    kw = {
        "in_features": inf,
        "hidden": hidden,
        "classes": classes,
        "dropout": rng.choice((0.0, 0.1)),
        "norm": rng.random() < 0.3,
    }
    dims = (inf, *hidden, classes)
    flops = sum(2.0 * a * b for a, b in itertools.pairwise(dims))
    return _make(kind, "mlp", "mlp", kw, bk, shape, classes, bs, flops, rng)


def _image_size(kind: str, rng: random.Random, gpu: tuple[int, ...], cpu: tuple[int, ...]) -> int:
    return rng.choice(gpu if kind == "gpu" else cpu)


def _image_bs(kind: str, rng: random.Random, size: int) -> int:
    if kind == "cpu":
        return rng.choice((2, 4, 8, 16) if size <= 32 else (2, 4, 8))
    if size <= 32:
        return rng.choice((64, 128, 256, 512))
    if size <= 96:
        return rng.choice((32, 64, 128, 256))
    if size <= 160:
        return rng.choice((16, 32, 64, 128))
    return rng.choice((8, 16, 32, 64, 128))


def _g_vgg(kind: str, rng: random.Random) -> Config:
    depth = rng.choice((11, 13, 16, 19))
    width = rng.choice((32, 48, 64) if kind == "gpu" else (8, 16))
    size = _image_size(kind, rng, (32, 64, 128, 224), (32,))
    classes = rng.choice((10, 100, 1000))
    kw = {
        "depth": depth,
        "width": width,
        "classes": classes,
        "batch_norm": rng.random() < 0.7,
        "image_size": size,
    }
    flops = _CONV_REF_GFLOPS[("vgg", depth)] * 1e9 * (width / 64) ** 2 * _scale(size)
    bs = _image_bs(kind, rng, size)
    return _make(kind, "vgg", "vgg", kw, "image", (3, size, size), classes, bs, flops, rng)


def _g_resnet(kind: str, rng: random.Random) -> Config:
    if kind == "gpu":
        depth = rng.choice((18, 34, 50, 101, 152))
        width = rng.choice((32, 64, 64))
        size = rng.choice((32, 64, 128, 160, 224))
    else:
        depth = rng.choice((18, 34, 50))
        width = rng.choice((8, 16))
        size = rng.choice((32, 64))
    classes = rng.choice((10, 100, 1000))
    kw = {"depth": depth, "width": width, "classes": classes}
    flops = _CONV_REF_GFLOPS[("resnet", depth)] * 1e9 * (width / 64) ** 2 * _scale(size)
    bs = _image_bs(kind, rng, size)
    return _make(kind, "resnet", "resnet", kw, "image", (3, size, size), classes, bs, flops, rng)


def _g_mobilenet_v2(kind: str, rng: random.Random) -> Config:
    w = rng.choice((0.5, 0.75, 1.0, 1.4) if kind == "gpu" else (0.25, 0.5))
    size = _image_size(kind, rng, (64, 96, 128, 160, 224), (32, 64))
    classes = rng.choice((10, 100, 1000))
    flops = 0.6e9 * w * w * _scale(size)
    bs = _image_bs(kind, rng, size)
    kw = {"width_mult": w, "classes": classes}
    return _make(
        kind, "mobilenet_v2", "mobilenet_v2", kw, "image", (3, size, size), classes, bs, flops, rng
    )


def _g_mobilenet_v3(kind: str, rng: random.Random) -> Config:
    variant = rng.choice(("small", "large"))
    w = rng.choice((0.75, 1.0, 1.25) if kind == "gpu" else (0.5, 0.75))
    size = _image_size(kind, rng, (64, 96, 128, 160, 224), (32, 64))
    classes = rng.choice((10, 100, 1000))
    flops = (0.12e9 if variant == "small" else 0.44e9) * w * w * _scale(size)
    bs = _image_bs(kind, rng, size)
    kw = {"variant": variant, "width_mult": w, "classes": classes}
    return _make(
        kind, "mobilenet_v3", "mobilenet_v3", kw, "image", (3, size, size), classes, bs, flops, rng
    )


def _g_squeezenet(kind: str, rng: random.Random) -> Config:
    version = rng.choice(("1_0", "1_1"))
    size = _image_size(kind, rng, (64, 96, 128, 224), (64,))
    classes = rng.choice((10, 100, 1000))
    flops = (1.6e9 if version == "1_0" else 0.7e9) * _scale(size)
    bs = _image_bs(kind, rng, size)
    kw = {"version": version, "classes": classes}
    return _make(
        kind, "squeezenet", "squeezenet", kw, "image", (3, size, size), classes, bs, flops, rng
    )


def _g_shufflenet(kind: str, rng: random.Random) -> Config:
    w = rng.choice((0.5, 1.0, 1.5, 2.0) if kind == "gpu" else (0.5, 1.0))
    size = _image_size(kind, rng, (64, 96, 128, 224), (32, 64))
    classes = rng.choice((10, 100, 1000))
    flops = {0.5: 0.08e9, 1.0: 0.3e9, 1.5: 0.6e9, 2.0: 1.2e9}[w] * _scale(size)
    bs = _image_bs(kind, rng, size)
    kw = {"width_mult": w, "classes": classes}
    return _make(
        kind,
        "shufflenet_v2",
        "shufflenet_v2",
        kw,
        "image",
        (3, size, size),
        classes,
        bs,
        flops,
        rng,
    )


def _g_googlenet(kind: str, rng: random.Random) -> Config:
    width = rng.choice((32, 48, 64) if kind == "gpu" else (8, 16))
    size = _image_size(kind, rng, (64, 96, 128, 224), (32, 64))
    classes = rng.choice((10, 100, 1000))
    flops = 3.0e9 * (width / 64) ** 2 * _scale(size)
    bs = _image_bs(kind, rng, size)
    kw = {"classes": classes, "width": width}
    return _make(
        kind, "googlenet", "googlenet", kw, "image", (3, size, size), classes, bs, flops, rng
    )


def _g_densenet(kind: str, rng: random.Random) -> Config:
    depth = rng.choice((121, 169, 201) if kind == "gpu" else (121,))
    growth = rng.choice((12, 24, 32) if kind == "gpu" else (4, 8))
    size = _image_size(kind, rng, (32, 64, 128, 224), (32,))
    classes = rng.choice((10, 100, 1000))
    flops = _CONV_REF_GFLOPS[("densenet", depth)] * 1e9 * (growth / 32) ** 2 * _scale(size)
    bs = _image_bs(kind, rng, size)
    kw = {"depth": depth, "growth_rate": growth, "classes": classes}
    return _make(
        kind, "densenet", "densenet", kw, "image", (3, size, size), classes, bs, flops, rng
    )


def _g_vit(kind: str, rng: random.Random) -> Config:
    if kind == "gpu":
        size, patch = rng.choice(((32, 4), (64, 8), (224, 16), (224, 32), (128, 16)))
        dim = rng.choice((192, 384, 768, 1024))
        depth = rng.choice((4, 6, 8, 12) if dim < 1024 else (6, 12, 24))
        bs = rng.choice((16, 32, 64, 128, 256))
    else:
        size, patch = rng.choice(((32, 4), (32, 8), (64, 8), (64, 16)))
        dim = rng.choice((64, 128, 192))
        depth = rng.choice((2, 4, 6))
        bs = rng.choice((4, 8, 16))
    heads = max(1, dim // 64)
    ratio = rng.choice((2, 4))
    classes = rng.choice((10, 100, 1000))
    tokens = (size // patch) ** 2 + 1
    flops = _tf_flops(tokens, dim, depth, ratio) + 2 * tokens * 3 * patch * patch * dim
    kw = {
        "image_size": size,
        "patch": patch,
        "dim": dim,
        "depth": depth,
        "heads": heads,
        "mlp_ratio": ratio,
        "classes": classes,
    }
    return _make(kind, "vit", "vit", kw, "image", (3, size, size), classes, bs, flops, rng)


def _g_rnn(kind: str, rng: random.Random) -> Config:
    cell = rng.choice(("lstm", "gru"))
    if kind == "gpu":
        vocab = rng.choice((10000, 33278))
        embed = rng.choice((256, 400, 650))
        hidden = rng.choice((256, 512, 1024))
        layers = rng.choice((1, 2, 3))
        seq = rng.choice((35, 64, 128, 256))
        bs = rng.choice((16, 32, 64, 128))
    else:
        vocab = rng.choice((1000, 5000))
        embed = rng.choice((64, 128))
        hidden = rng.choice((64, 128, 256))
        layers = rng.choice((1, 2))
        seq = rng.choice((16, 32, 64))
        bs = rng.choice((4, 8, 16))
    return _rnn_config(kind, "rnn", rng, cell, vocab, embed, hidden, layers, seq, bs, (0.0, 0.2))


def _rnn_config(
    kind: str,
    family: str,
    rng: random.Random,
    cell: str,
    vocab: int,
    embed: int,
    hidden: int,
    layers: int,
    seq: int,
    bs: int,
    dropouts: tuple[float, ...],
) -> Config:
    """A recurrent language model's configuration (zoo.rnn), with its forward FLOPs per
    sample; its dropout is drawn from ``dropouts``."""
    gates = 4 if cell == "lstm" else 3
    per_tok = sum(
        2 * gates * hidden * ((embed if i == 0 else hidden) + hidden) for i in range(layers)
    )
    flops = seq * (per_tok + 2 * hidden * vocab)
    kw = {
        "kind": cell,
        "vocab": vocab,
        "embed": embed,
        "hidden": hidden,
        "layers": layers,
        "dropout": rng.choice(dropouts),
    }
    return _make(kind, family, "rnn", kw, "tokens", (seq,), vocab, bs, flops, rng)


def _lm(kind: str, rng: random.Random, family: str) -> Config:
    if kind == "gpu":
        dim = rng.choice((256, 384, 512, 768, 1024))
        depth = rng.choice((2, 4, 6, 12) if dim < 1024 else (6, 12, 24))
        seq = rng.choice((128, 256, 512, 1024) if family == "gpt" else (64, 128, 256, 512))
        vocab = 30522 if family == "bert" else rng.choice((65, 8192, 50257))
        bs = rng.choice((4, 8, 16, 32, 64))
    else:
        dim = rng.choice((64, 128, 256))
        depth = rng.choice((1, 2, 4))
        seq = rng.choice((32, 64, 128))
        vocab = rng.choice((256, 2048, 8192))
        bs = rng.choice((2, 4, 8))
    heads = max(1, dim // 64)
    ratio = rng.choice((2, 4)) if kind == "cpu" else 4
    flops = _tf_flops(seq, dim, depth, ratio, head=vocab)
    kw: dict[str, Any] = {
        "vocab": vocab,
        "seq_len": seq,
        "dim": dim,
        "depth": depth,
        "heads": heads,
        "mlp_ratio": ratio,
        "dropout": rng.choice((0.0, 0.1)),
    }
    if family == "gpt":
        kw["tie_weights"] = rng.random() < 0.7
    return _make(kind, family, family, kw, "tokens", (seq,), vocab, bs, flops, rng)


def _g_gpt(kind: str, rng: random.Random) -> Config:
    return _lm(kind, rng, "gpt")


def _g_bert(kind: str, rng: random.Random) -> Config:
    return _lm(kind, rng, "bert")


def _g_unet(kind: str, rng: random.Random) -> Config:
    if kind == "gpu":
        base = rng.choice((16, 32, 64))
        depth = rng.choice((3, 4))
        size = rng.choice((64, 128, 256, 512))
        bs = rng.choice((2, 4, 8, 16, 32) if size <= 256 else (1, 2, 4, 8))
    else:
        base = rng.choice((4, 8))
        depth = rng.choice((2, 3))
        size = rng.choice((32, 64))
        bs = rng.choice((1, 2, 4))
    cin = rng.choice((1, 3))
    classes = rng.choice((2, 21))
    flops = 40e9 * (base / 64) ** 2 * _scale(size, 256)
    kw = {"in_channels": cin, "classes": classes, "base": base, "depth": depth}
    return _make(
        kind, "unet", "unet", kw, "segmentation", (cin, size, size), classes, bs, flops, rng
    )


def _g_random_conv(kind: str, rng: random.Random) -> Config:
    seed = rng.randrange(10_000)
    if kind == "gpu":
        size = rng.choice((32, 64, 96, 128, 224))
        max_width = rng.choice((128, 256, 512))
    else:
        size = rng.choice((32,))
        max_width = rng.choice((16, 32, 48))
    classes = rng.choice((10, 100, 1000))
    flops = 0.6e9 * (max_width / 256) ** 2 * _scale(size, 64)
    bs = _image_bs(kind, rng, size)
    kw = {
        "seed": seed,
        "kind": "conv",
        "classes": classes,
        "image_size": size,
        "max_width": max_width,
    }
    return _make(
        kind, "random_conv", "random_dag", kw, "image", (3, size, size), classes, bs, flops, rng
    )


def _g_random_transformer(kind: str, rng: random.Random) -> Config:
    seed = rng.randrange(10_000)
    if kind == "gpu":
        seq = rng.choice((128, 256, 512, 1024))
        max_dim = rng.choice((256, 512, 768, 1024))
        vocab = rng.choice((8192, 32000, 50257))
        bs = rng.choice((4, 8, 16, 32))
    else:
        seq = rng.choice((32, 64))
        max_dim = rng.choice((128, 192))
        vocab = rng.choice((256, 2048))
        bs = rng.choice((2, 4))
    classes = None if rng.random() < 0.7 else rng.choice((2, 10))
    flops = _tf_flops(seq, max_dim, 9, 2.5, head=vocab if classes is None else 0) * 0.6
    kw: dict[str, Any] = {
        "seed": seed,
        "kind": "transformer",
        "classes": classes,
        "vocab": vocab,
        "seq_len": seq,
        "max_dim": max_dim,
    }
    return _make(
        kind,
        "random_transformer",
        "random_dag",
        kw,
        "tokens",
        (seq,),
        vocab,
        bs,
        flops,
        rng,
    )


#: family -> (generator, configurations per corpus kind)
_GENERATORS: dict[str, tuple[_Gen, dict[str, int]]] = {
    "mlp": (_g_mlp, {"gpu": 40, "cpu": 30}),
    "vgg": (_g_vgg, {"gpu": 40, "cpu": 20}),
    "resnet": (_g_resnet, {"gpu": 50, "cpu": 25}),
    "mobilenet_v2": (_g_mobilenet_v2, {"gpu": 30, "cpu": 20}),
    "mobilenet_v3": (_g_mobilenet_v3, {"gpu": 30, "cpu": 20}),
    "squeezenet": (_g_squeezenet, {"gpu": 20, "cpu": 15}),
    "shufflenet_v2": (_g_shufflenet, {"gpu": 30, "cpu": 20}),
    "googlenet": (_g_googlenet, {"gpu": 25, "cpu": 15}),
    "densenet": (_g_densenet, {"gpu": 30, "cpu": 15}),
    "vit": (_g_vit, {"gpu": 45, "cpu": 25}),
    "rnn": (_g_rnn, {"gpu": 35, "cpu": 25}),
    "gpt": (_g_gpt, {"gpu": 50, "cpu": 25}),
    "bert": (_g_bert, {"gpu": 40, "cpu": 25}),
    "unet": (_g_unet, {"gpu": 30, "cpu": 20}),
    "random_conv": (_g_random_conv, {"gpu": 40, "cpu": 25}),
    "random_transformer": (_g_random_transformer, {"gpu": 40, "cpu": 25}),
}


# ------------------------------------------------------------- broad family generators
def _convnext_flops(size: int, depths: tuple[int, ...], dims: tuple[int, ...]) -> float:
    """Forward FLOPs per sample: each block's depthwise 7x7 and 4x MLP at its stage's map."""
    total, side = 2.0 * (size // 4) ** 2 * 48 * dims[0], size // 4
    for i, (depth, dim) in enumerate(zip(depths, dims)):
        if i:
            side = max(1, side // 2)
        total += depth * 2.0 * side * side * (49 * dim + 8 * dim * dim)
    return total


def _g_convnext(kind: str, rng: random.Random) -> Config:
    if kind == "gpu":
        depths, dims = rng.choice(
            (
                ((3, 3, 9, 3), (96, 192, 384, 768)),  # T
                ((2, 2, 6, 2), (64, 128, 256, 512)),
                ((3, 3, 27, 3), (96, 192, 384, 768)),  # S
                ((2, 2, 8, 2), (128, 256, 512, 1024)),
            )
        )
        size = rng.choice((64, 128, 160, 224))
    else:
        depths, dims = rng.choice(
            (((1, 1, 2, 1), (16, 32, 64, 128)), ((2, 2, 2, 2), (24, 48, 96, 192)))
        )
        size = rng.choice((32, 64))
    classes = rng.choice((10, 100, 1000))
    kw = {"depths": depths, "dims": dims, "classes": classes}
    flops = _convnext_flops(size, depths, dims)
    bs = _image_bs(kind, rng, size)
    return _make(
        kind, "convnext", "convnext", kw, "image", (3, size, size), classes, bs, flops, rng
    )


def _g_efficientnet(kind: str, rng: random.Random) -> Config:
    if kind == "gpu":
        w, d = rng.choice(((1.0, 1.0), (1.0, 1.1), (1.1, 1.2), (1.2, 1.4), (0.5, 1.0), (0.75, 1.0)))
        size = rng.choice((96, 128, 160, 224, 240))
    else:
        w, d = rng.choice(((0.25, 0.34), (0.35, 0.5), (0.5, 0.5)))
        size = rng.choice((32, 64))
    classes = rng.choice((10, 100, 1000))
    mnas = rng.random() < 0.3  # MnasNet-style: no squeeze-and-excitation, ReLU
    kw: dict[str, Any] = {"width_mult": w, "depth_mult": d, "classes": classes}
    if mnas:
        kw.update(se_ratio=0.0, activation="relu")
    flops = 0.8e9 * w * w * d * _scale(size)
    bs = _image_bs(kind, rng, size)
    return _make(
        kind, "efficientnet", "efficientnet", kw, "image", (3, size, size), classes, bs, flops, rng
    )


def _g_swin(kind: str, rng: random.Random) -> Config:
    if kind == "gpu":
        size, patch, window = rng.choice(((224, 4, 7), (192, 4, 6), (128, 4, 4)))
        dim = rng.choice((64, 96, 128))
        depths: tuple[int, ...] = rng.choice(((2, 2, 6, 2), (2, 2, 2, 2), (2, 2, 18, 2)))
        bs = rng.choice((8, 16, 32, 64, 128))
    else:
        size, patch, window = 32, 2, 4
        dim = rng.choice((16, 24, 32))
        depths = rng.choice(((1, 1, 1), (2, 2, 2)))
        bs = rng.choice((2, 4, 8))
    heads = tuple(max(1, (dim << i) // 32) for i in range(len(depths)))
    classes = rng.choice((10, 100, 1000))
    flops, side, d = 2.0 * (size // patch) ** 2 * 3 * patch * patch * dim, size // patch, dim
    for i, depth in enumerate(depths):
        if i:
            side, d = side // 2, 2 * d
        tokens, ws = side * side, min(window, side)
        flops += depth * (2.0 * tokens * 12 * d * d + 4.0 * tokens * ws * ws * d)
    kw = {
        "image_size": size,
        "patch": patch,
        "dim": dim,
        "depths": depths,
        "heads": heads,
        "window": window,
        "classes": classes,
    }
    return _make(kind, "swin", "swin", kw, "image", (3, size, size), classes, bs, flops, rng)


def _g_mixer(kind: str, rng: random.Random) -> Config:
    classes = rng.choice((10, 100, 1000))
    if rng.random() < 0.5:  # MLP-Mixer
        if kind == "gpu":
            size, patch = rng.choice(((224, 16), (224, 32), (128, 16), (64, 8)))
            dim = rng.choice((256, 512, 768))
            depth = rng.choice((8, 12))
            bs = rng.choice((16, 32, 64, 128, 256))
        else:
            size, patch = rng.choice(((32, 4), (32, 8)))
            dim = rng.choice((32, 64))
            depth = rng.choice((2, 4))
            bs = rng.choice((4, 8, 16))
        tokens = (size // patch) ** 2
        kw: dict[str, Any] = {
            "image_size": size,
            "patch": patch,
            "dim": dim,
            "depth": depth,
            "token_hidden": dim // 2,
            "channel_hidden": 4 * dim,
            "classes": classes,
        }
        flops = depth * (4.0 * tokens * (dim // 2) * dim + 16.0 * tokens * dim * dim)
        return _make(
            kind, "mixer", "mlp_mixer", kw, "image", (3, size, size), classes, bs, flops, rng
        )
    if kind == "gpu":  # PoolFormer
        depths, dims = rng.choice(
            (((2, 2, 6, 2), (64, 128, 320, 512)), ((4, 4, 12, 4), (64, 128, 320, 512)))
        )
        size = rng.choice((64, 128, 224))
    else:
        depths, dims = ((1, 1, 2, 1), (16, 32, 64, 128))
        size = rng.choice((32, 64))
    kw = {"depths": depths, "dims": dims, "classes": classes}
    flops, side = 0.0, size // 4
    for i, (depth, dim) in enumerate(zip(depths, dims)):
        side = max(1, side // 2) if i else side
        flops += depth * 2.0 * side * side * 8 * dim * dim
    bs = _image_bs(kind, rng, size)
    return _make(kind, "mixer", "poolformer", kw, "image", (3, size, size), classes, bs, flops, rng)


def _g_llama(kind: str, rng: random.Random) -> Config:
    if kind == "gpu":
        dim = rng.choice((512, 768, 1024, 2048))
        depth = rng.choice((4, 8, 12) if dim < 2048 else (4, 8))
        seq = rng.choice((256, 512, 1024, 2048))
        vocab = rng.choice((32000, 32768, 50257))
        bs = rng.choice((1, 2, 4, 8, 16))
    else:
        dim = rng.choice((64, 128))
        depth = rng.choice((1, 2))
        seq = rng.choice((32, 64, 128))
        vocab = rng.choice((1000, 4096))
        bs = rng.choice((2, 4, 8))
    heads = max(2, dim // 64)
    kv_heads = rng.choice([k for k in (1, 2, 4, heads) if heads % k == 0])
    ffn = 256 * math.ceil(8 * dim / 3 / 256)
    kv = kv_heads * (dim // heads)
    per_tok = depth * (2.0 * (2 * dim * dim + 2 * kv * dim + 3 * dim * ffn) + 2.0 * seq * dim)
    flops = seq * (per_tok + 2.0 * dim * vocab)
    kw = {"vocab": vocab, "dim": dim, "depth": depth, "heads": heads, "kv_heads": kv_heads}
    return _make(kind, "llama", "llama", kw, "tokens", (seq,), vocab, bs, flops, rng)


def _g_t5(kind: str, rng: random.Random) -> Config:
    if kind == "gpu":
        dim = rng.choice((256, 512, 768))
        depth = rng.choice((4, 6, 8, 12))
        seq = rng.choice((128, 256, 512))
        vocab = 32128
        bs = rng.choice((4, 8, 16, 32, 64))
    else:
        dim = rng.choice((64, 128))
        depth = rng.choice((1, 2))
        seq = rng.choice((32, 64))
        vocab = rng.choice((1000, 4096))
        bs = rng.choice((2, 4, 8))
    heads = max(1, dim // 64)
    ffn = 4 * dim
    # encoder (attention + MLP) and decoder (self-, cross-attention + MLP) layers
    per_tok = depth * (
        2.0 * (4 * dim * dim + 2 * dim * ffn) * 2 + 2.0 * 4 * dim * dim + 12.0 * seq * dim
    )
    flops = seq * (per_tok + 2.0 * dim * vocab)
    kw = {
        "vocab": vocab,
        "dim": dim,
        "depth": depth,
        "heads": heads,
        "ffn": ffn,
        "dropout": rng.choice((0.0, 0.1)),
    }
    return _make(kind, "t5", "t5", kw, "tokens", (seq,), vocab, bs, flops, rng)


def _g_inception(kind: str, rng: random.Random) -> Config:
    if kind == "gpu":
        width = rng.choice((0.5, 0.75, 1.0))
        blocks_c = rng.choice((2, 3, 4))
        size = rng.choice((128, 160, 224, 299))
    else:
        width = rng.choice((0.1, 0.15, 0.25))
        blocks_c = rng.choice((1, 2))
        size = rng.choice((32, 64))
    classes = rng.choice((10, 100, 1000))
    kw = {"width": width, "blocks_c": blocks_c, "classes": classes}
    flops = 8e9 * width * width * (0.6 + 0.1 * blocks_c) * (size / 299) ** 2
    bs = _image_bs(kind, rng, size)
    return _make(
        kind, "inception", "inception", kw, "image", (3, size, size), classes, bs, flops, rng
    )


#: RegNet stages (depths, widths, group width, SE ratio) and forward GFLOPs at 224 px
_REGNETS = (
    ((1, 2, 7, 12), (32, 64, 160, 384), 16, 0.0, 0.8),  # X-400MF
    ((1, 3, 7, 5), (64, 128, 288, 672), 16, 0.0, 1.6),  # X-800MF
    ((2, 4, 10, 2), (72, 168, 408, 912), 24, 0.0, 3.2),  # X-1.6GF
    ((1, 3, 8, 2), (64, 144, 320, 768), 16, 0.25, 1.6),  # Y-800MF
)


def _g_resnext(kind: str, rng: random.Random) -> Config:
    classes = rng.choice((10, 100, 1000))
    size = _image_size(kind, rng, (64, 128, 160, 224), (32, 64))
    if rng.random() < 0.5:
        if kind == "gpu":  # 32x4d, 64x4d, wide (groups 1, 128 wide: WRN-50-2)
            depth, groups, wpg = rng.choice(((50, 32, 4), (101, 32, 4), (50, 64, 4), (50, 1, 128)))
            base = 64
        else:
            depth, groups, wpg, base = 50, rng.choice((4, 8)), 2, 8
        kw: dict[str, Any] = {
            "depth": depth,
            "groups": groups,
            "width_per_group": wpg,
            "classes": classes,
            "base": base,
        }
        ref = {50: 8.5, 101: 16.0}[depth] * (groups * wpg / 128) * (base / 64) ** 2
        flops = ref * 1e9 * _scale(size)
        bs = _image_bs(kind, rng, size)
        return _make(
            kind, "resnext", "resnext", kw, "image", (3, size, size), classes, bs, flops, rng
        )
    if kind == "gpu":
        depths, widths, gw, se, gflops = rng.choice(_REGNETS)
    else:
        depths, widths, gw, se, gflops = (
            (1, 1, 2, 1),
            (16, 32, 64, 128),
            8,
            rng.choice((0.0, 0.25)),
            0.05,
        )
    kw = {"depths": depths, "widths": widths, "group_width": gw, "se_ratio": se, "classes": classes}
    bs = _image_bs(kind, rng, size)
    return _make(
        kind,
        "resnext",
        "regnet",
        kw,
        "image",
        (3, size, size),
        classes,
        bs,
        gflops * 1e9 * _scale(size),
        rng,
    )


def _g_rnn_lm(kind: str, rng: random.Random) -> Config:
    """Recurrent language models at the sizes people train them: large vocabularies (the
    Penn Treebank's 10k, WikiText-103's 267k clipped to GPT-2's 50k), 2-4 layers."""
    cell = rng.choice(("lstm", "gru"))
    if kind == "gpu":
        vocab = rng.choice((10000, 33278, 50257))
        embed = rng.choice((400, 650, 1024))
        hidden = rng.choice((650, 1024, 1500))
        layers = rng.choice((2, 3, 4))
        seq = rng.choice((35, 70, 128, 256))
        bs = rng.choice((16, 32, 64, 128))
    else:
        vocab = rng.choice((5000, 10000))
        embed = rng.choice((128, 200))
        hidden = rng.choice((128, 200, 256))
        layers = rng.choice((2, 3))
        seq = rng.choice((20, 35))
        bs = rng.choice((4, 8))
    return _rnn_config(kind, "rnn_lm", rng, cell, vocab, embed, hidden, layers, seq, bs, (0.2, 0.5))


#: the broad families' generators (kinds "gpu-broad", "cpu-broad"; the same counts per
#: family for every kind's device sizes)
_BROAD_GENERATORS: dict[str, tuple[_Gen, dict[str, int]]] = {
    "convnext": (_g_convnext, {"gpu": 30, "cpu": 20}),
    "efficientnet": (_g_efficientnet, {"gpu": 30, "cpu": 20}),
    "swin": (_g_swin, {"gpu": 30, "cpu": 20}),
    "mixer": (_g_mixer, {"gpu": 30, "cpu": 20}),
    "llama": (_g_llama, {"gpu": 40, "cpu": 25}),
    "t5": (_g_t5, {"gpu": 30, "cpu": 20}),
    "inception": (_g_inception, {"gpu": 25, "cpu": 15}),
    "resnext": (_g_resnext, {"gpu": 30, "cpu": 20}),
    "rnn_lm": (_g_rnn_lm, {"gpu": 30, "cpu": 20}),
}

#: The CPU corpus keeps configurations estimated below this (one measurement, seconds).
_CPU_MAX_SECONDS = 4.0


@functools.lru_cache(maxsize=8)
def _full(kind: str, seed: int) -> tuple[Config, ...]:
    out: list[Config] = []
    seen: set[str] = set()
    base = kind.split("-")[0]  # the device sizes ("gpu", "cpu") a broad kind draws at
    generators = _BROAD_GENERATORS if kind.endswith("-broad") else _GENERATORS
    for family, (gen, counts) in generators.items():
        # one stream per family, so adding a family does not change the others
        rng = random.Random(f"{kind}:{family}:{seed}")
        want, tries = counts[base], 0
        made = 0
        while made < want and tries < 20 * want:
            tries += 1
            cfg = gen(base, rng)
            if base != kind:
                cfg = replace(cfg, corpus=kind)
            if cfg.id in seen:
                continue
            if base == "cpu" and cfg.est_seconds > _CPU_MAX_SECONDS:
                continue
            seen.add(cfg.id)
            out.append(cfg)
            made += 1
    random.Random(f"{kind}:order:{seed}").shuffle(out)
    return tuple(out)


def full_corpus(kind: str = "gpu", seed: int = 0) -> list[Config]:
    """Every configuration of the ``kind`` corpus, in its (shuffled) collection order."""
    if kind not in KINDS:
        raise ValueError(f"corpus kind must be one of {KINDS}, but got {kind=}.")
    return list(_full(kind, seed))


def _assign(configs: list[Config], shards: int) -> list[list[int]]:
    """Balanced, deterministic shard assignment (longest estimate first, least-loaded shard)."""
    loads = [0.0] * shards
    members: list[list[int]] = [[] for _ in range(shards)]
    order = sorted(range(len(configs)), key=lambda i: (-configs[i].est_seconds, configs[i].id))
    for i in order:
        s = min(range(shards), key=lambda k: (loads[k], k))
        loads[s] += configs[i].est_seconds
        members[s].append(i)
    return [sorted(m) for m in members]  # keep the shuffled collection order inside a shard


def corpus(kind: str = "gpu", shard: int = 0, shards: int = 1, seed: int = 0) -> list[Config]:
    """The configurations of shard ``shard`` of ``shards`` of the ``kind`` corpus.

    Shards are disjoint and together cover :func:`full_corpus`; each is balanced on the
    rough time estimate and keeps the corpus's shuffled order, so a prefix of a shard
    still spans the families. :func:`recommended_shards` gives a shard count whose shards
    each fit in :data:`SHARD_TARGET_SECONDS` (estimated).
    """
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards must be a positive integer, but got {shards=}.")
    if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < shards:
        raise ValueError(f"shard must be in [0, {shards}), but got {shard=}.")
    configs = full_corpus(kind, seed)
    return [configs[i] for i in _assign(configs, shards)[shard]]


def shard_estimates(kind: str = "gpu", shards: int = 1, seed: int = 0) -> list[float]:
    """Estimated seconds of each shard."""
    configs = full_corpus(kind, seed)
    return [sum(configs[i].est_seconds for i in m) for m in _assign(configs, shards)]


def recommended_shards(kind: str = "gpu", seed: int = 0) -> int:
    """The smallest shard count whose shards are all estimated under the target time."""
    configs = full_corpus(kind, seed)
    n = max(1, math.ceil(sum(c.est_seconds for c in configs) / SHARD_TARGET_SECONDS))
    while max(shard_estimates(kind, n, seed)) > SHARD_TARGET_SECONDS and n < len(configs):
        n += 1
    return n
