"""A zoo of real, varied architectures written in plain PyTorch.

Every family is a *factory*: a function with keyword hyperparameters (and sensible
defaults) that returns an ``nn.Module``.  The corpus is what costaware traces to learn
how peak memory and iteration time depend on the architecture, so the factories obey
two rules:

* construction only allocates parameters through standard ``nn`` layers and
  ``nn.init`` (it works under ``with torch.device("meta"):`` and under
  ``FakeTensorMode``) and never computes with tensor values;
* ``forward`` is traceable with fake tensors: no ``.item()``, no ``nonzero``, no
  boolean-mask indexing and no Python branching on tensor values.

At their reference widths the image models reproduce the torchvision topologies
(and parameter counts) and the language models those of GPT-2 and BERT; every family
scales down to a toy that runs on a CPU in milliseconds.  ``random_dag`` generates
random convolutional cells and random transformer stacks from a seed.

``entries()`` lists a fixed set of representative configurations as ``ZooEntry``
records.  The output of an entry's model is determined by its ``input`` kind:

* ``"image"`` and ``"vector"``: ``(N, classes)`` logits;
* ``"tokens"``: ``(N, T, classes)`` next-token / masked-token logits (``classes`` is
  the vocabulary size);
* ``"segmentation"``: ``(N, classes, H, W)`` per-pixel logits.
"

The families live in modules by kind: :mod:`~costaware.zoo.mlps`,
:mod:`~costaware.zoo.convnets`, :mod:`~costaware.zoo.mobile`,
:mod:`~costaware.zoo.vision_transformers`, :mod:`~costaware.zoo.language`,
:mod:`~costaware.zoo.recurrent`, :mod:`~costaware.zoo.segmentation` and
:mod:`~costaware.zoo.random_dags`; :mod:`~costaware.zoo.catalog` holds ``entries()`` and
the family names. This package re-exports them all.
"""

from __future__ import annotations

from costaware.zoo.catalog import (
    BROAD_FAMILIES as BROAD_FAMILIES,
)
from costaware.zoo.catalog import (
    FAMILIES as FAMILIES,
)
from costaware.zoo.catalog import (
    ZooEntry as ZooEntry,
)
from costaware.zoo.catalog import (
    entries as entries,
)
from costaware.zoo.convnets import (
    VGG as VGG,
)
from costaware.zoo.convnets import (
    ConvNeXt as ConvNeXt,
)
from costaware.zoo.convnets import (
    DenseNet as DenseNet,
)
from costaware.zoo.convnets import (
    GoogLeNet as GoogLeNet,
)
from costaware.zoo.convnets import (
    GroupedResNet as GroupedResNet,
)
from costaware.zoo.convnets import (
    InceptionV3 as InceptionV3,
)
from costaware.zoo.convnets import (
    ResNet as ResNet,
)
from costaware.zoo.convnets import (
    convnext as convnext,
)
from costaware.zoo.convnets import (
    densenet as densenet,
)
from costaware.zoo.convnets import (
    googlenet as googlenet,
)
from costaware.zoo.convnets import (
    inception as inception,
)
from costaware.zoo.convnets import (
    regnet as regnet,
)
from costaware.zoo.convnets import (
    resnet as resnet,
)
from costaware.zoo.convnets import (
    resnext as resnext,
)
from costaware.zoo.convnets import (
    vgg as vgg,
)
from costaware.zoo.language import (
    BERT as BERT,
)
from costaware.zoo.language import (
    GPT as GPT,
)
from costaware.zoo.language import (
    T5 as T5,
)
from costaware.zoo.language import (
    Llama as Llama,
)
from costaware.zoo.language import (
    bert as bert,
)
from costaware.zoo.language import (
    gpt as gpt,
)
from costaware.zoo.language import (
    llama as llama,
)
from costaware.zoo.language import (
    t5 as t5,
)
from costaware.zoo.mlps import (
    mlp as mlp,
)
from costaware.zoo.mobile import (
    EfficientNet as EfficientNet,
)
from costaware.zoo.mobile import (
    MobileNetV2 as MobileNetV2,
)
from costaware.zoo.mobile import (
    MobileNetV3 as MobileNetV3,
)
from costaware.zoo.mobile import (
    ShuffleNetV2 as ShuffleNetV2,
)
from costaware.zoo.mobile import (
    SqueezeNet as SqueezeNet,
)
from costaware.zoo.mobile import (
    efficientnet as efficientnet,
)
from costaware.zoo.mobile import (
    mobilenet_v2 as mobilenet_v2,
)
from costaware.zoo.mobile import (
    mobilenet_v3 as mobilenet_v3,
)
from costaware.zoo.mobile import (
    shufflenet_v2 as shufflenet_v2,
)
from costaware.zoo.mobile import (
    squeezenet as squeezenet,
)
from costaware.zoo.random_dags import (
    RandomConvNet as RandomConvNet,
)
from costaware.zoo.random_dags import (
    RandomTransformer as RandomTransformer,
)
from costaware.zoo.random_dags import (
    random_dag as random_dag,
)
from costaware.zoo.recurrent import (
    RNNModel as RNNModel,
)
from costaware.zoo.recurrent import (
    rnn as rnn,
)
from costaware.zoo.segmentation import (
    UNet as UNet,
)
from costaware.zoo.segmentation import (
    unet as unet,
)
from costaware.zoo.vision_transformers import (
    MLPMixer as MLPMixer,
)
from costaware.zoo.vision_transformers import (
    PoolFormer as PoolFormer,
)
from costaware.zoo.vision_transformers import (
    Swin as Swin,
)
from costaware.zoo.vision_transformers import (
    ViT as ViT,
)
from costaware.zoo.vision_transformers import (
    mlp_mixer as mlp_mixer,
)
from costaware.zoo.vision_transformers import (
    poolformer as poolformer,
)
from costaware.zoo.vision_transformers import (
    swin as swin,
)
from costaware.zoo.vision_transformers import (
    vit as vit,
)

__all__ = [
    "BROAD_FAMILIES",
    "FAMILIES",
    "ZooEntry",
    "bert",
    "convnext",
    "densenet",
    "efficientnet",
    "entries",
    "googlenet",
    "gpt",
    "inception",
    "llama",
    "mlp",
    "mlp_mixer",
    "mobilenet_v2",
    "mobilenet_v3",
    "poolformer",
    "random_dag",
    "regnet",
    "resnet",
    "resnext",
    "rnn",
    "shufflenet_v2",
    "squeezenet",
    "swin",
    "t5",
    "unet",
    "vgg",
    "vit",
]
