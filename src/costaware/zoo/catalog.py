"""The zoo's fixed list of representative configurations (:func:`entries`) and the
names of its families.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from costaware.zoo.convnets import densenet, googlenet, resnet, vgg
from costaware.zoo.language import bert, gpt
from costaware.zoo.mlps import mlp
from costaware.zoo.mobile import mobilenet_v2, mobilenet_v3, shufflenet_v2, squeezenet
from costaware.zoo.random_dags import random_dag
from costaware.zoo.recurrent import rnn
from costaware.zoo.segmentation import unet
from costaware.zoo.vision_transformers import vit


@dataclass(frozen=True)
class ZooEntry:
    """One representative configuration of a family.

    ``input_shape`` is per sample (no batch dimension).  ``classes`` is the number of
    classes, or the vocabulary size for ``"tokens"`` entries, whose models return
    per-token logits ``(N, T, classes)``; see the module docstring for output shapes.
    """

    family: str
    name: str
    factory: Callable[[], nn.Module]
    input: str
    input_shape: tuple[int, ...]
    classes: int


FAMILIES: tuple[str, ...] = (
    "mlp",
    "vgg",
    "resnet",
    "mobilenet_v2",
    "mobilenet_v3",
    "squeezenet",
    "shufflenet_v2",
    "googlenet",
    "densenet",
    "vit",
    "rnn",
    "gpt",
    "bert",
    "unet",
    "random_conv",
    "random_transformer",
)


_P = functools.partial


def _image(
    family: str, name: str, factory: Callable[[], nn.Module], size: int = 224, classes: int = 1000
) -> ZooEntry:
    return ZooEntry(family, name, factory, "image", (3, size, size), classes)


def _tokens(
    family: str, name: str, factory: Callable[[], nn.Module], seq: int, vocab: int
) -> ZooEntry:
    return ZooEntry(family, name, factory, "tokens", (seq,), vocab)


def _build_entries() -> list[ZooEntry]:
    # Within a hand-written family the entries go from the smallest to the largest.
    out: list[ZooEntry] = [
        ZooEntry("mlp", "mlp-784-512x2", _P(mlp), "vector", (784,), 10),
        ZooEntry(
            "mlp", "mlp-img-1024x3", _P(mlp, 3 * 32 * 32, (1024,) * 3, 10), "image", (3, 32, 32), 10
        ),
        ZooEntry(
            "mlp",
            "mlp-3072-2048x4-ln",
            _P(mlp, 3072, (2048,) * 4, 100, 0.1, True),
            "vector",
            (3072,),
            100,
        ),
    ]
    out += [
        _image("vgg", "vgg11-bn-w32-cifar", _P(vgg, 11, 32, 100, image_size=32), 32, 100),
        _image("vgg", "vgg16-bn-w64-cifar", _P(vgg, 16, classes=10, image_size=32), 32, 10),
        _image("vgg", "vgg11-bn-w64", _P(vgg, 11)),
        _image("vgg", "vgg16-bn-w64", _P(vgg, 16)),
        _image("vgg", "vgg19-w64", _P(vgg, 19, batch_norm=False)),
    ]
    out += [
        _image("resnet", "resnet50-w32", _P(resnet, 50, 32)),
        _image("resnet", "resnet18-w64-cifar", _P(resnet, 18, classes=10), 32, 10),
    ]
    out += [_image("resnet", f"resnet{d}-w64", _P(resnet, d)) for d in (18, 34, 50, 101, 152)]
    out += [
        _image("mobilenet_v2", f"mobilenet_v2-x{w}", _P(mobilenet_v2, w)) for w in (0.5, 1.0, 1.4)
    ]
    out += [
        _image("mobilenet_v3", "mobilenet_v3-small", _P(mobilenet_v3, "small")),
        _image("mobilenet_v3", "mobilenet_v3-large-x0.75", _P(mobilenet_v3, "large", 0.75)),
        _image("mobilenet_v3", "mobilenet_v3-large", _P(mobilenet_v3, "large")),
    ]
    out += [_image("squeezenet", f"squeezenet{v}", _P(squeezenet, v)) for v in ("1_1", "1_0")]
    out += [
        _image("shufflenet_v2", f"shufflenet_v2-x{w}", _P(shufflenet_v2, w))
        for w in (0.5, 1.0, 1.5, 2.0)
    ]
    out += [
        _image("googlenet", "googlenet-w32", _P(googlenet, width=32)),
        _image("googlenet", "googlenet-w64", _P(googlenet)),
    ]
    out += [_image("densenet", f"densenet{d}", _P(densenet, d)) for d in (121, 169, 201)]
    out += [_image("densenet", "densenet161", _P(densenet, 161, 48))]
    out += [
        _image("vit", "vit-ti16", _P(vit, dim=192, heads=3)),
        _image("vit", "vit-cifar-p4", _P(vit, 32, 4, 384, 6, 8, 2, 10), 32, 10),
        _image("vit", "vit-s16", _P(vit, dim=384, heads=6)),
        _image("vit", "vit-b16", _P(vit)),
        _image("vit", "vit-b32", _P(vit, patch=32)),
        _image("vit", "vit-l16", _P(vit, dim=1024, depth=24, heads=16)),
    ]
    out += [
        _tokens("rnn", "gru-lm-2x512", _P(rnn, "gru"), 64, 10000),
        _tokens("rnn", "lstm-lm-2x512", _P(rnn), 64, 10000),
        _tokens(
            "rnn", "lstm-lm-2x650", _P(rnn, "lstm", 10000, 650, 650, 2, dropout=0.5), 35, 10000
        ),
        _tokens("rnn", "lstm-lm-3x1024", _P(rnn, "lstm", 33278, 400, 1024, 3), 128, 33278),
    ]
    out += [
        _tokens("gpt", "gpt-char-6x384", _P(gpt, 65, 256, 384, 6, 6, dropout=0.2), 256, 65),
        _tokens(
            "gpt", "gpt-mini-6x384", _P(gpt, seq_len=256, dim=384, depth=6, heads=6), 256, 50257
        ),
        _tokens("gpt", "gpt2-small", _P(gpt), 1024, 50257),
        _tokens("gpt", "gpt2-small-512", _P(gpt, dropout=0.1, tie_weights=False), 512, 50257),
        _tokens("gpt", "gpt2-medium", _P(gpt, dim=1024, depth=24, heads=16), 1024, 50257),
    ]
    out += [
        _tokens("bert", "bert-tiny", _P(bert, dim=128, depth=2, heads=2), 128, 30522),
        _tokens("bert", "bert-mini", _P(bert, dim=256, depth=4, heads=4), 128, 30522),
        _tokens("bert", "bert-small", _P(bert, dim=512, depth=4, heads=8), 128, 30522),
        _tokens("bert", "bert-base-128", _P(bert), 128, 30522),
        _tokens("bert", "bert-base-512", _P(bert), 512, 30522),
        _tokens("bert", "bert-large-128", _P(bert, dim=1024, depth=24, heads=16), 128, 30522),
    ]
    out += [
        ZooEntry("unet", "unet-b16-d3", _P(unet, 3, 2, 16, 3), "segmentation", (3, 128, 128), 2),
        ZooEntry("unet", "unet-b32-d4", _P(unet), "segmentation", (3, 256, 256), 21),
        ZooEntry("unet", "unet-b64-d4", _P(unet, 1, 2, 64, 4), "segmentation", (1, 512, 512), 2),
    ]
    conv_cfgs = ((32, 10), (32, 100), (64, 200), (96, 10), (128, 100), (224, 1000))
    for seed, (size, classes) in enumerate(conv_cfgs):
        factory = _P(random_dag, seed, "conv", classes=classes, image_size=size)
        out.append(_image("random_conv", f"random_conv-s{seed}-{size}px", factory, size, classes))
    tf_cfgs = ((128, 8192), (256, 32000), (512, 32000), (128, 50257), (1024, 16384), (256, 256))
    for seed, (seq, vocab) in enumerate(tf_cfgs):
        factory = _P(random_dag, seed, "transformer", vocab=vocab, seq_len=seq)
        out.append(
            _tokens("random_transformer", f"random_transformer-s{seed}-t{seq}", factory, seq, vocab)
        )
    return out


def entries(family: str | None = None) -> list[ZooEntry]:
    """The fixed, ordered list of zoo configurations (optionally of one family).

    Every entry has at most ~355M parameters (GPT-2 medium being the largest).
    """
    if family is not None and family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    return [e for e in _build_entries() if family is None or e.family == family]


#: the broad families, in the order the broad corpora draw them: ConvNeXt, EfficientNet/MnasNet,
#: Swin, MLP-Mixer and pooling mixers, LLaMA-style decoders, T5-style encoder-decoders,
#: Inception-v3-style multi-branch blocks, ResNeXt/RegNet and recurrent LMs at realistic
#: sizes. The corpus draws them apart from :data:`FAMILIES`
#: (:mod:`costaware.measure.corpus`, kinds "gpu-broad" and "cpu-broad"), so that the
#: corpora of those stay as they were measured
BROAD_FAMILIES: tuple[str, ...] = (
    "convnext",
    "efficientnet",
    "swin",
    "mixer",
    "llama",
    "t5",
    "inception",
    "resnext",
    "rnn_lm",
)
