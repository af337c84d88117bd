"""What is trained: :class:`TrainingSpec` and the batch descriptions it takes.

A spec is everything that decides a training step's memory and time, and nothing else.
It is cheap to build and validates its arguments at once, so a bad search space fails
with a readable message before anything is traced.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import math
import numbers
import operator
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from costaware.budget import BudgetError, parse_duration
from costaware.compiled import compiled_parts, drop_compiled, eager_module, uncompiled
from costaware.errors import SpecError

__all__ = [
    "ALLOCATORS",
    "OPTIMIZERS",
    "PRECISIONS",
    "PURE_PRECISIONS",
    "SHARDINGS",
    "BatchLike",
    "ImageBatch",
    "SegmentationBatch",
    "TokenBatch",
    "TrainingSpec",
    "cast_floating",
    "check_positions",
    "compiled_parts",
    "default_loss",
    "drop_compiled",
    "eager_module",
    "module_precision",
    "parse_precision",
    "parse_sharding",
    "parse_wrap_policy",
    "position_table",
    "uncompiled",
]

#: Optimizers known by name, and how many tensors of state each holds per parameter.
OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], float]] = {
    "sgd": (torch.optim.SGD, 0.0),
    "adam": (torch.optim.Adam, 2.0),
    "adamw": (torch.optim.AdamW, 2.0),
    "nadam": (torch.optim.NAdam, 2.0),
    "radam": (torch.optim.RAdam, 2.0),
    "adamax": (torch.optim.Adamax, 2.0),
    "adagrad": (torch.optim.Adagrad, 1.0),
    "adadelta": (torch.optim.Adadelta, 2.0),
    "rmsprop": (torch.optim.RMSprop, 1.0),
}

_PRECISION_ALIASES = {
    "fp32": "fp32", "32": "fp32", "32-true": "fp32", "float32": "fp32",
    "bf16": "bf16", "bf16-mixed": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "16": "fp16", "16-mixed": "fp16", "float16": "fp16",
    "bf16-true": "bf16-true",
    "fp16-true": "fp16-true", "16-true": "fp16-true",
    "fp64-true": "fp64-true", "64-true": "fp64-true", "64": "fp64-true", "fp64": "fp64-true",
    "float64": "fp64-true", "double": "fp64-true",
}  # fmt: skip
#: Canonical names of the precisions that train fp32 parameters: fp32 itself, and mixed
#: precision through autocast for bf16 and fp16 (the cost model's precision features).
PRECISIONS = ("fp32", "bf16", "fp16")
#: Canonical names of pure precisions: parameters, gradients, optimizer state and the
#: batch's floating inputs all in one type (Lightning's ``"bf16-true"``, ``"16-true"``,
#: ``"64-true"``; ``model.to(torch.bfloat16)``), without autocast.
PURE_PRECISIONS = ("bf16-true", "fp16-true", "fp64-true")
_PURE_DTYPES = {"bf16-true": torch.bfloat16, "fp16-true": torch.float16, "fp64-true": torch.float64}
_DTYPE_PRECISIONS = {dtype: name for name, dtype in _PURE_DTYPES.items()}
#: Allocator modes of PyTorch's CUDA caching allocator (``PYTORCH_CUDA_ALLOC_CONF``).
ALLOCATORS = ("default", "expandable_segments")


#: What a sharded spec can say: FSDP's ``FULL_SHARD``, ``SHARD_GRAD_OP`` and ``NO_SHARD``
#: (FSDP's flat parameters and gradients, unsharded), and DeepSpeed ZeRO's stages 1-3.
SHARDINGS = ("full_shard", "shard_grad_op", "no_shard", "zero1", "zero2", "zero3")
#: the shardings that need several processes (all but ``no_shard``, which FSDP over one
#: process trains: it switches ``FULL_SHARD`` to it there)
_SHARDING_SPLITS = ("full_shard", "shard_grad_op", "zero1", "zero2", "zero3")
_SHARDING_ALIASES = {
    "full_shard": "full_shard", "fsdp": "full_shard", "shard_grad_op": "shard_grad_op",
    "no_shard": "no_shard",
    "zero1": "zero1", "zero-1": "zero1", "zero_1": "zero1", "zero2": "zero2",
    "zero-2": "zero2", "zero_2": "zero2", "zero3": "zero3", "zero-3": "zero3",
    "zero_3": "zero3",
}  # fmt: skip


def parse_sharding(value: object) -> str | None:
    """The canonical name (of :data:`SHARDINGS`) of a sharding, or None for none.

    Takes costaware's names, FSDP's ``ShardingStrategy`` members and their names
    (``"FULL_SHARD"``), ``"fsdp"`` for ``FULL_SHARD``, and ``"zero-2"``-style spellings.

    Raises:
        SpecError: a name costaware does not know, or a sharding it does not model
            (``HYBRID_SHARD``).
    """
    if value is None:
        return None
    text = getattr(value, "name", value)  # a ShardingStrategy member
    found = _SHARDING_ALIASES.get(text.strip().lower()) if isinstance(text, str) else None
    if found is None:
        raise SpecError(
            f"sharding must be one of {SHARDINGS} (FSDP's FULL_SHARD, SHARD_GRAD_OP and "
            "NO_SHARD, DeepSpeed ZeRO stages 1-3), FSDP's ShardingStrategy member of one, "
            f"or None (DDP, or one process), but got sharding={value!r}; FSDP's "
            "HYBRID_SHARD is not modelled."
        )
    return found


def parse_wrap_policy(value: object) -> tuple[type[nn.Module], ...]:
    """The module classes of a wrap policy: a class, a tuple/list/set of classes, or
    FSDP's ``ModuleWrapPolicy``; ``None`` or empty for no policy (FSDP wraps the root
    alone: the whole model is one unit). Sorted by name, so equal policies compare equal.

    Raises:
        SpecError: anything else (a callable policy, something not an ``nn.Module``
            subclass).
    """
    if value is None:
        return ()
    classes: Any = getattr(value, "_module_classes", value)  # FSDP's ModuleWrapPolicy
    if isinstance(classes, type):
        classes = (classes,)
    ok = isinstance(classes, (tuple, list, set, frozenset)) and all(
        isinstance(c, type) and issubclass(c, nn.Module) for c in classes
    )
    if not ok:
        if isinstance(value, str):
            why = (
                "a class's name is not the class: pass the class itself "
                f"(wrap_policy={value.rsplit('.', 1)[-1]}, imported from where it is defined)"
            )
        elif isinstance(value, nn.Module):
            why = f"pass the class (wrap_policy={type(value).__name__}), not a module of it"
        elif callable(value) and not isinstance(value, type):
            why = "a callable (size-based) policy is not modelled"
        else:
            why = "each entry must be an nn.Module subclass"
        raise SpecError(
            "wrap_policy must be the nn.Module classes FSDP wraps as units of their own (a "
            "class, a tuple or set of them, or FSDP's ModuleWrapPolicy), or None for none "
            f"(the whole model one unit), but got wrap_policy={value!r}: {why}."
        )
    return tuple(sorted(set(classes), key=lambda c: (c.__module__, c.__qualname__)))


def parse_precision(value: object) -> str:
    """The canonical name (of :data:`PRECISIONS` or :data:`PURE_PRECISIONS`) of a precision
    written as costaware or Lightning writes it.

    Raises:
        SpecError: ``value`` names no precision costaware knows.
    """
    found = _PRECISION_ALIASES.get(str(value).strip().lower()) if value is not None else None
    if found is None:
        raise SpecError(
            f"precision must be one of {PRECISIONS} (fp32 parameters; bf16 and fp16 by "
            f"autocast) or {PURE_PRECISIONS} (parameters, gradients and optimizer state in "
            "that type), or Lightning's spelling of one ('32-true', 'bf16-mixed', '16-mixed', "
            f"'bf16-true', '16-true', '64-true'), but got precision={value!r}."
        )
    return found


def module_precision(module: nn.Module) -> str | None:
    """The pure precision (of :data:`PURE_PRECISIONS`) ``module`` is already in: every
    floating-point parameter in bfloat16, float16 or float64 (``model.to(torch.bfloat16)``);
    None for fp32 parameters, mixed types or no floating-point parameters."""
    dtypes = {p.dtype for p in module.parameters() if p.is_floating_point()}
    if len(dtypes) != 1:
        return None
    return _DTYPE_PRECISIONS.get(dtypes.pop())


def cast_floating(batch: Any, dtype: torch.dtype) -> Any:
    """``batch`` with its floating-point tensors converted to ``dtype``, as Lightning's
    pure-precision plugins convert a batch (tensors, tuples, lists, namedtuples and
    mappings, rebuilt as their own type where it takes its items; integer tensors and
    other values as they are)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, Mapping):
        items = {k: cast_floating(v, dtype) for k, v in batch.items()}
        kind: Any = type(batch)
        try:
            return kind(items)
        except Exception:
            return items
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(cast_floating(v, dtype) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(cast_floating(v, dtype) for v in batch)
    return batch


#: the largest batch size a spec takes: 2**31 - 1 samples, past any device's memory for
#: any model, and a bound under which a sample's bytes times the batch stay an int64
MAX_BATCH_SIZE = 2**31 - 1


def _positive_int(name: str, value: object) -> int:
    """``value`` as an ``int`` where it is a positive integer of any integral type (a
    numpy ``int64`` too, not a bool), else a :class:`SpecError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise SpecError(f"{name} must be a positive integer, but got {name}={value!r}.")
    return operator.index(value)


def _shape(name: str, value: object) -> tuple[int, ...]:
    if isinstance(value, numbers.Integral):
        value = (value,)
    if not isinstance(value, (tuple, list)) or not value:
        raise SpecError(f"{name} must be a tuple of positive ints, but got {name}={value!r}.")
    return tuple(_positive_int(name, v) for v in value)


@dataclass(frozen=True)
class ImageBatch:
    """A batch of dense inputs with one class label per sample.

    ``shape`` is the per-sample shape, ``(3, 224, 224)`` for images; any shape works, so
    ``ImageBatch((784,), classes=10)`` describes flat vectors for an MLP.
    """

    shape: tuple[int, ...]
    classes: int = 1000
    kind: str = field(default="image", init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", _shape("shape", self.shape))
        object.__setattr__(self, "classes", _positive_int("classes", self.classes))

    def make(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Build ``(inputs, labels)`` with torch factories (fake tensors inside a trace)."""
        x = torch.randn(batch_size, *self.shape)
        y = torch.randint(0, self.classes, (batch_size,))
        return x, y

    def signature(self) -> str:
        return f"{type(self).__name__}{self.shape}c{self.classes}"

    def describe(self) -> dict[str, float]:
        s = self.shape
        return {
            "input_numel": float(math.prod(s)),
            "input_channels": float(s[0]) if len(s) >= 2 else 1.0,
            "input_height": float(s[1]) if len(s) >= 2 else float(s[0]),
            "input_width": float(s[2]) if len(s) >= 3 else 1.0,
            "seq_len": 0.0,
            "vocab": 0.0,
            "classes": float(self.classes),
        }


@dataclass(frozen=True)
class SegmentationBatch(ImageBatch):
    """Images with a class label per pixel: inputs ``N×C×H×W``, labels ``N×H×W``."""

    kind: str = field(default="segmentation", init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.shape) != 3:
            raise SpecError(f"shape must be (C, H, W) for segmentation, but got {self.shape=}.")

    def make(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch_size, *self.shape)
        y = torch.randint(0, self.classes, (batch_size, *self.shape[1:]))
        return x, y


@dataclass(frozen=True)
class TokenBatch:
    """A batch of token ids, in the dict form Hugging Face models take.

    By default a language-modelling batch: ``input_ids`` and ``labels`` of ``N×T`` token
    ids drawn from ``[0, vocab)``.

    - ``num_labels=k``: sequence classification; ``labels`` is one class per sequence,
      of shape ``(N,)`` in ``[0, k)`` (``AutoModelForSequenceClassification`` with
      ``num_labels=k``).
    - ``attention_mask=True``: an ``attention_mask`` of ``N×T`` ones (int64, as a tokenizer
      returns it) goes with the ids. Every sequence is full length, the most a padded
      batch of this length costs.

    The default loss calls ``model(input_ids=..., labels=...)`` (and ``attention_mask``
    where ``forward`` takes it) when ``forward`` accepts ``input_ids`` and ``labels``
    (Hugging Face style) and uses the output's ``.loss``; otherwise it calls
    ``model(input_ids)`` and applies cross-entropy to the logits.

    Example:
        >>> import costaware as ca
        >>> b = ca.TokenBatch(seq_len=128, vocab=30522, num_labels=2, attention_mask=True)
        >>> {k: tuple(v.shape) for k, v in b.make(8).items()}
        {'input_ids': (8, 128), 'attention_mask': (8, 128), 'labels': (8,)}
    """

    seq_len: int
    vocab: int
    num_labels: int | None = None
    attention_mask: bool = False
    kind: str = field(default="tokens", init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "seq_len", _positive_int("seq_len", self.seq_len))
        object.__setattr__(self, "vocab", _positive_int("vocab", self.vocab))
        if self.num_labels is not None:
            object.__setattr__(self, "num_labels", _positive_int("num_labels", self.num_labels))
        if not isinstance(self.attention_mask, bool):
            raise SpecError(
                "attention_mask must be True or False (whether the batch carries one), but "
                f"got attention_mask={self.attention_mask!r}."
            )

    def make(self, batch_size: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, self.vocab, (batch_size, self.seq_len))
        batch = {"input_ids": ids}
        if self.attention_mask:
            batch["attention_mask"] = torch.ones(batch_size, self.seq_len, dtype=torch.long)
        if self.num_labels is None:
            batch["labels"] = torch.randint(0, self.vocab, (batch_size, self.seq_len))
        else:
            batch["labels"] = torch.randint(0, self.num_labels, (batch_size,))
        return batch

    def index_ranges(self) -> tuple[tuple[str, int, str], ...]:
        """``(field, n, argument)`` for each field of the batch that holds indices drawn from
        ``[0, n)``, and the argument of this class that sets ``n``."""
        labels = ("labels", self.vocab, "vocab")
        if self.num_labels is not None:
            labels = ("labels", self.num_labels, "num_labels")
        return (("input_ids", self.vocab, "vocab"), labels)

    def signature(self) -> str:
        extra = "" if self.num_labels is None else f"l{self.num_labels}"
        return f"TokenBatch{self.seq_len}v{self.vocab}{extra}{'m' if self.attention_mask else ''}"

    def describe(self) -> dict[str, float]:
        return {
            "input_numel": float(self.seq_len),
            "input_channels": 1.0,
            "input_height": float(self.seq_len),
            "input_width": 1.0,
            "seq_len": float(self.seq_len),
            "vocab": float(self.vocab),
            "classes": float(self.vocab if self.num_labels is None else self.num_labels),
        }


#: the config attributes Hugging Face models give the size of a learned position table by
#: (GPT-2's ``n_positions``; BERT's and most others' ``max_position_embeddings``)
_POSITION_CONFIG = ("n_positions", "max_position_embeddings")


def _is_position_name(name: str) -> bool:
    """Whether a module's attribute name reads as a table of positions (``wpe``,
    ``pos_emb``, ``position_embeddings``, ``positional_embedding``), not of relative
    position buckets (T5's ``relative_attention_bias``)."""
    last = name.rsplit(".", 1)[-1].lower()
    if "relative" in last or last.startswith("rel_"):
        return False
    return last == "wpe" or last.startswith("pos") or "position" in last


def position_table(model: nn.Module) -> tuple[int, str] | None:
    """The longest sequence ``model``'s learned position table takes, and where that figure
    comes from in words; None when it has none (rotary or sinusoidal positions, or no
    positions at all, take any length without an index error).

    The table is an ``nn.Embedding`` that ``model.config.n_positions`` or
    ``max_position_embeddings`` sizes (Hugging Face; its padding row, as RoBERTa has one,
    is not a position), or one whose name says it holds positions (``wpe``, ``pos_emb``,
    ``position_embeddings``).
    """
    embeddings = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Embedding)]
    config = getattr(model, "config", None)
    for attr in _POSITION_CONFIG:
        size = getattr(config, attr, None) if config is not None else None
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            continue
        sized = [(n, m) for n, m in embeddings if m.num_embeddings == size]
        named = [(n, m) for n, m in sized if _is_position_name(n)]
        if not named:
            continue
        name, table = named[0]
        # RoBERTa's positions start after its padding row: padding_idx + 1 onwards
        offset = table.padding_idx + 1 if table.padding_idx is not None else 0
        where = f"config.{attr}={size}, the embedding {name}"
        if offset:
            where += f", whose first {offset} rows are not positions"
        return size - offset, where
    for name, table in embeddings:
        if _is_position_name(name):
            return table.num_embeddings, f"the embedding {name} of {table.num_embeddings} rows"
    return None


def check_positions(model: nn.Module, batch: Any) -> None:
    """Raise :class:`~costaware.errors.SpecError` when the batch's sequences are longer than
    ``model``'s learned position table: a real step fails with an index out of range (on
    fake tensors it would not).

    The sequence length is the second dimension of a mapping batch's ``input_ids``.
    """
    if not isinstance(batch, Mapping) or not isinstance(batch.get("input_ids"), torch.Tensor):
        return
    ids = batch["input_ids"]
    if ids.dim() != 2:
        return
    seq_len = int(ids.shape[1])
    found = position_table(model)
    if found is None or seq_len <= found[0]:
        return
    longest, where = found
    raise SpecError(
        f"the batch's sequences are {seq_len} tokens long, but {type(model).__name__} has "
        f"positions for {longest} ({where}): a real training step would fail on the "
        f"positions past {longest - 1} (an index out of range). Make the batch fit the model: "
        f"TokenBatch(seq_len={longest}, ...) or shorter, or a model with room for {seq_len} "
        "positions."
    )


def _not_a_batch(batch: Any, batch_size: int) -> str | None:
    """What is wrong with a batch callable's result, where it is plainly not a batch
    (None, numpy arrays, a list of samples not collated), else None. Anything else (a
    custom batch object) is the loss's to take."""
    if batch is None:
        return "returned None (a missing return?)"
    parts = list(batch.values()) if isinstance(batch, Mapping) else batch
    if not isinstance(parts, (tuple, list)):
        parts = [parts]
    arrays = any(type(p).__module__ == "numpy" and hasattr(p, "shape") for p in parts)
    if arrays and not any(isinstance(p, torch.Tensor) for p in parts):
        return "returned numpy arrays, not torch tensors (torch.from_numpy(a) makes one)"
    if (
        isinstance(batch, list)
        and len(batch) == batch_size > 1
        and all(isinstance(p, (tuple, Mapping)) for p in batch)  # a Dataset's samples
    ):
        return (
            f"returned a list of {batch_size} samples, not one batch "
            "(torch.utils.data.default_collate(samples) collates them)"
        )
    return None


def _takes_a_batch_size(fn: Callable[..., Any]) -> None:
    """Refuse a batch callable that cannot be called with one argument, the batch size
    (a callable whose signature Python cannot read is taken as it is)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(1)
    except TypeError:
        name = getattr(fn, "__qualname__", None) or type(fn).__name__
        raise SpecError(
            f"batch={name} is called with the batch size, as batch(batch_size), to make one "
            f"batch, but its signature is {name}{sig}. Give it one parameter for the batch "
            f"size: batch=lambda batch_size: ..."
        ) from None


@dataclass(frozen=True)
class _CallableBatch:
    fn: Callable[[int], Any]
    kind: str = "custom"

    def make(self, batch_size: int) -> Any:
        batch = self.fn(batch_size)
        wrong = _not_a_batch(batch, batch_size)
        if wrong:
            raise SpecError(
                f"the batch callable {getattr(self.fn, '__qualname__', self.fn)!r} {wrong}. It "
                "must return one training batch of batch_size samples, as the loss takes it "
                "(a tensor, a tuple such as (inputs, labels), or a dict of tensors)."
            )
        return batch

    def signature(self) -> str:
        own = getattr(self.fn, "signature", None)  # a batch maker that describes itself
        if callable(own):
            return f"callable:{own()}"
        return f"callable:{_fingerprint(self.fn) or id(self.fn)}"

    def describe(self) -> dict[str, float]:
        return dict.fromkeys(
            (
                "input_numel",
                "input_channels",
                "input_height",
                "input_width",
                "seq_len",
                "vocab",
                "classes",
            ),
            0.0,
        )


BatchLike = ImageBatch | TokenBatch | Callable[[int], Any]
_Batch = ImageBatch | TokenBatch | _CallableBatch


def _logits(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, Mapping):
        # ``logits`` (Hugging Face), ``out`` (torchvision's segmentation models)
        for key in ("logits", "out"):
            if isinstance(out.get(key), torch.Tensor):
                found: torch.Tensor = out[key]
                return found
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    keys = ""
    if isinstance(out, Mapping):
        keys = f" (its keys: {', '.join(repr(k) for k in list(out)[:10])})"
    raise SpecError(
        f"cannot find logits in the model output of type {type(out).__name__}{keys}; "
        "the default loss looks for a tensor, .logits, or the key 'logits' or 'out'. Pass "
        "loss=callable(model, batch) to the TrainingSpec."
    )


def _output_loss(out: Any) -> torch.Tensor | None:
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, Mapping):
        loss = out.get("loss")
    return loss if isinstance(loss, torch.Tensor) else None


def _classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if (
        logits.dim() == labels.dim() + 1
        and logits.dim() >= 3
        and logits.shape[0] == labels.shape[0]
    ):
        if logits.shape[1:-1] == labels.shape[1:]:  # token logits N×T×V against N×T labels
            return F.cross_entropy(logits.flatten(0, -2), labels.flatten())
        return F.cross_entropy(logits, labels)  # segmentation: N×C×H×W against N×H×W
    if logits.dim() == 2 and labels.dim() == 2:  # a sequence classifier against token labels
        labels = labels[:, 0] % logits.shape[1]
    return F.cross_entropy(logits.flatten(1) if logits.dim() > 2 else logits, labels)


@functools.lru_cache(maxsize=256)
def _accepts_hf_kwargs(forward: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False
    return "input_ids" in params and "labels" in params


@functools.lru_cache(maxsize=256)
def _keywords(forward: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword arguments ``forward`` takes by name, or None when it takes any
    (``**kwargs``) or its signature cannot be read."""
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(
        name for name, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )


#: the keys of a language-modelling batch (a tokenizer's, and its labels): a model that
#: does not take them by name is called with the token ids alone
_TOKEN_KEYS = frozenset({"input_ids", "labels", "attention_mask", "token_type_ids", "position_ids"})


def _model_kwargs(forward: Callable[..., Any], batch: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of a mapping batch that ``forward`` takes: all of them where it takes
    ``**kwargs`` (or none of them by name, and the call's error says so)."""
    names = _keywords(forward)
    if names is None:
        return dict(batch)
    taken = {k: v for k, v in batch.items() if k in names}
    return taken or dict(batch)


def default_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """The loss costaware uses when the spec gives none.

    - ``(inputs, labels)``: cross-entropy on the logits (classification, and N×C×H×W
      segmentation against N×H×W labels);
    - a language-modelling mapping (``input_ids``, ``labels`` and a tokenizer's
      ``attention_mask``, ``token_type_ids``, ``position_ids``): the model's own
      ``.loss`` when it computes one (Hugging Face; the entries ``forward`` takes are
      passed by name), otherwise cross-entropy of the logits against ``labels`` (token
      labels, or one label per sequence); a ``forward`` that does not take both
      ``input_ids`` and ``labels`` by name gets the token ids alone;
    - any other mapping (CLIP's ``input_ids`` with ``pixel_values``) is passed as keyword
      arguments, those ``forward`` takes (all where it takes ``**kwargs``), the loss as
      above; a tensor positionally, and the mean of the output stands in for the loss.
    """
    if isinstance(batch, Mapping):
        forward = type(model).forward
        if "input_ids" in batch and set(batch) <= _TOKEN_KEYS and not _accepts_hf_kwargs(forward):
            out = model(batch["input_ids"])
        else:
            out = model(**_model_kwargs(forward, batch))
        loss = _output_loss(out)
        if loss is not None:
            return loss
        if "labels" in batch:
            return _classification_loss(_logits(out), batch["labels"])
        return _logits(out).float().mean()
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        x, y = batch
        return _classification_loss(_logits(model(x)), y)
    return _logits(model(batch)).float().mean()


def _global_names(code: types.CodeType) -> set[str]:
    """Names a code object (and the functions and comprehensions nested in it) looks up."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _fingerprint(obj: Any, depth: int = 0) -> str | None:
    """A stable description of a factory's code and arguments, or None if it has none.

    Two factories with the same fingerprint build the same architecture, which lets the
    trace cache skip building the model at all on a warm prediction.
    """
    if depth > 4:
        return None
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, torch.dtype, torch.device)):
        return repr(obj)
    if isinstance(obj, (tuple, list, frozenset)):
        if len(obj) > _MAX_FINGERPRINT_ITEMS:  # data, not a setting
            return None
        parts = [_fingerprint(o, depth + 1) for o in obj]
        return None if None in parts else f"{type(obj).__name__}({','.join(parts)})"  # type: ignore[arg-type]
    if isinstance(obj, dict):
        items = [(repr(k), _fingerprint(v, depth + 1)) for k, v in sorted(obj.items(), key=repr)]
        return (
            None
            if any(v is None for _, v in items)
            else "{" + ",".join(f"{k}:{v}" for k, v in items) + "}"
        )
    if isinstance(obj, functools.partial):
        inner = [_fingerprint(o, depth + 1) for o in (obj.func, obj.args, obj.keywords)]
        return None if None in inner else f"partial({','.join(inner)})"  # type: ignore[arg-type]
    if isinstance(obj, type):
        return f"class:{obj.__module__}.{obj.__qualname__}"
    if isinstance(obj, types.ModuleType):
        return f"module:{obj.__name__}"
    code = getattr(obj, "__code__", None)
    if code is not None and inspect.isfunction(obj):
        cells = [c.cell_contents for c in (obj.__closure__ or ())]
        # the module-level names the code reads: `lambda: mlp(width)` with a global `width`
        # builds a different model for every value of `width`
        # (for the factory itself; the library functions it calls, and a partial's function,
        # are taken by their code and arguments alone)
        scope = obj.__globals__ if depth == 0 else {}
        used = {n: scope[n] for n in sorted(_global_names(code)) if n in scope}
        extra = [
            _fingerprint(o, depth + 1) for o in (cells, obj.__defaults__, obj.__kwdefaults__, used)
        ]
        if None in extra:
            return None
        digest = hashlib.sha1(code.co_code + repr(code.co_consts).encode()).hexdigest()[:12]
        return f"fn:{obj.__module__}.{obj.__qualname__}:{digest}:{','.join(extra)}"  # type: ignore[arg-type]
    if plain_settings(obj):
        # a settings object a factory closes over (a Hugging Face config): its class and
        # every attribute, private ones included (a config's attention implementation)
        state = _fingerprint(dict(vars(obj)), depth)
        cls = type(obj)
        return None if state is None else f"obj:{cls.__module__}.{cls.__qualname__}:{state}"
    return None


#: the longest list, and the most attributes, a fingerprint describes (more is data)
_MAX_FINGERPRINT_ITEMS = 4096


def plain_settings(obj: Any) -> bool:
    """Whether ``obj`` is a plain object of settings: it has attributes of its own (not too
    many) and is no function, class, module, tensor or ``nn.Module``."""
    state = getattr(obj, "__dict__", None)
    return (
        isinstance(state, dict)
        and len(state) <= _MAX_FINGERPRINT_ITEMS
        and not callable(obj)
        and not isinstance(obj, (type, types.ModuleType, torch.Tensor, nn.Module))
    )


def rank_samples(samples: int, world_size: int) -> int:
    """The samples one rank gets of an epoch of ``samples``: ``DistributedSampler`` gives
    each of ``world_size`` ranks ``ceil(samples / world_size)`` of them."""
    return -(-samples // max(world_size, 1))


def rank_batches(samples: int, world_size: int, batch_size: int, drop_last: bool = False) -> int:
    """The batches one rank steps through in an epoch of ``samples``: its
    :func:`rank_samples`, in batches of ``batch_size``, the last one partial unless
    ``drop_last``."""
    per_rank = rank_samples(samples, world_size)
    return per_rank // batch_size if drop_last else -(-per_rank // batch_size)


@dataclass
class TrainingSpec:
    """One training configuration, as it will run: the input to every prediction.

    Example:
        >>> import costaware as ca
        >>> from costaware import zoo
        >>> spec = ca.TrainingSpec(
        ...     model=lambda: zoo.mlp(in_features=784, classes=10),
        ...     batch=ca.ImageBatch((784,), classes=10),
        ...     batch_size=128, optimizer="adamw", dataset_size=60_000,
        ... )
        >>> spec.steps_per_epoch
        469

    Args:
        model: a zero-argument callable returning an ``nn.Module`` (preferred: it is built
            on the meta device and costs no memory), or an ``nn.Module``.
        batch: an :class:`ImageBatch`, :class:`SegmentationBatch`, :class:`TokenBatch`, or
            a callable ``batch_size -> batch`` built with torch factories.
        batch_size: samples per step (per micro-batch with gradient accumulation).
        optimizer: a name from :data:`OPTIMIZERS` or a ``torch.optim.Optimizer`` subclass.
        optimizer_kwargs: passed to the optimizer (``lr``, ``momentum``, ...).
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (fp32 parameters; the last two
            are mixed precision through autocast), or a pure precision,
            ``"bf16-true"``, ``"fp16-true"`` or ``"fp64-true"``: parameters, gradients,
            optimizer state and the batch's floating-point inputs in that type, as
            Lightning's ``precision="bf16-true"`` trains (the model is converted with
            ``model.to(dtype)``). Lightning's spellings (``"bf16-mixed"``,
            ``"16-mixed"``, ``"32-true"``, ``"16-true"``, ``"64-true"``) are accepted. A
            model given as an ``nn.Module`` whose parameters are all bfloat16 (float16,
            float64) with ``"fp32"`` is in ``"bf16-true"`` (``"fp16-true"``,
            ``"fp64-true"``): fp32 precision trains the parameters as they are.
        loss: ``callable(model, batch) -> scalar tensor``; default :func:`default_loss`.
        dataset_size: samples per epoch, for the epoch time. Under data parallel
            (``world_size > 1``) it is the whole dataset: each rank steps through its
            ``1/world_size`` share, as ``DistributedSampler`` splits it.
        cudnn_benchmark: whether ``torch.backends.cudnn.benchmark`` is on (its algorithm
            search takes a workspace sized to the free memory; the prediction is what the
            step needs).
        allocator: ``"default"`` or ``"expandable_segments"`` (``PYTORCH_CUDA_ALLOC_CONF``).
        grad_accumulation: micro-batches per optimizer step.
        epochs: planned epochs, for the trial time and a feature. None: no epoch limit
            (Lightning's ``max_epochs=-1``), the trial ends at ``max_steps`` or
            ``max_time``; with neither, its length is unknown.
        max_steps: optimizer steps after which training stops, whatever ``epochs`` says
            (Lightning's ``max_steps``). The trial is then the shorter of ``epochs``
            epochs and ``max_steps * grad_accumulation`` micro-batches, and has a trial
            time even without a ``dataset_size``. None (the default): ``epochs`` alone.
        max_time: a time limit after which training stops, whatever ``epochs`` and
            ``max_steps`` say (Lightning's ``max_time``): seconds or a duration such as
            ``"10min"`` or ``"1h30m"``. The trial time is then at most this, and is this
            where the steps are unbounded or unknown. None (the default): no limit.
        name: a label for reports (default: the model's class name).
        world_size: the processes DDP (``DistributedDataParallel``) trains with, one per
            device; the prediction is one rank's (its batch is ``batch_size``). 1 (the
            default) trains without DDP.
        bucket_cap_mb: DDP's ``bucket_cap_mb``: the gradient buckets' size, which DDP
            allocates besides the gradients (``gradient_as_bucket_view=False``, its
            default) and all-reduces bucket by bucket during the backward.
        sharding: sharded data parallel over ``world_size`` processes instead of DDP:
            FSDP's ``"full_shard"`` (``ShardingStrategy.FULL_SHARD``, about ZeRO-3) or
            ``"shard_grad_op"`` (``SHARD_GRAD_OP``, about ZeRO-2), FSDP's ``"no_shard"``
            (its flat parameters and gradients unsharded, as FSDP trains over one
            process), or DeepSpeed's
            ``"zero1"`` (optimizer state sharded), ``"zero2"`` (and gradients) or
            ``"zero3"`` (and parameters). The prediction is one rank's: its shards, the
            gathered units at the peak, and the all-gathers and reduce-scatters not
            hidden behind the compute (see :mod:`costaware.core.sharding`). None (the
            default): DDP where ``world_size > 1``.
        wrap_policy: the module classes FSDP wraps as units of their own (FSDP's
            ``ModuleWrapPolicy``, Lightning's ``auto_wrap_policy={Block}``): each unit is
            all-gathered for its forward and backward alone. Empty (the default), FSDP
            wraps the root alone: the whole model is one unit, gathered whole at the
            peak. Under ZeRO, empty means each module with parameters of its own.
        compiled: whether ``torch.compile`` runs the model. Its figures are those of eager
            mode, and the prediction says so. Set for a model given as an ``nn.Module``
            that is compiled (see :func:`compiled_parts`).
    """

    model: Callable[[], nn.Module] | nn.Module
    batch: BatchLike
    batch_size: int
    optimizer: str | type[torch.optim.Optimizer] = "adamw"
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)
    precision: str = "fp32"
    loss: Callable[[nn.Module, Any], torch.Tensor] | None = None
    dataset_size: int | None = None
    cudnn_benchmark: bool = False
    allocator: str = "default"
    grad_accumulation: int = 1
    epochs: int | None = 1
    name: str | None = None
    compiled: bool = False
    world_size: int = 1
    bucket_cap_mb: float = 25.0
    sharding: str | None = None
    wrap_policy: Any = ()
    max_steps: int | None = None
    max_time: float | str | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.model, nn.Module) or callable(self.model)):
            raise SpecError(
                "model must be a zero-argument callable returning an nn.Module, or an "
                f"nn.Module, but got {type(self.model).__name__}."
            )
        if not isinstance(self.batch, (ImageBatch, TokenBatch, _CallableBatch)) and not callable(
            self.batch
        ):
            raise SpecError(
                "batch must be an ImageBatch, SegmentationBatch, TokenBatch or a "
                f"callable(batch_size) -> batch, but got {type(self.batch).__name__}."
            )
        if callable(self.batch) and not isinstance(self.batch, (ImageBatch, TokenBatch)):
            _takes_a_batch_size(self.batch)
        self.batch_size = _positive_int("batch_size", self.batch_size)
        if self.batch_size > MAX_BATCH_SIZE:
            raise SpecError(
                f"batch_size={self.batch_size:,} is more samples than costaware predicts for "
                f"(up to {MAX_BATCH_SIZE:,}, already past any device's memory for any model): "
                "give a smaller batch size."
            )
        self.grad_accumulation = _positive_int("grad_accumulation", self.grad_accumulation)
        if self.epochs is not None:
            self.epochs = _positive_int("epochs", self.epochs)
        if (
            isinstance(self.world_size, bool)
            or not isinstance(self.world_size, numbers.Integral)
            or (self.world_size < 1)
        ):
            raise SpecError(
                "world_size must be a positive integer (the processes DDP trains with, one per "
                f"device; 1 trains without DDP), but got world_size={self.world_size!r}."
            )
        self.world_size = operator.index(self.world_size)
        if (
            isinstance(self.bucket_cap_mb, bool)
            or not isinstance(self.bucket_cap_mb, (int, float))
            or not self.bucket_cap_mb > 0
        ):
            raise SpecError(
                "bucket_cap_mb must be a positive number of MiB (DDP's gradient bucket size, "
                f"25 by default), but got bucket_cap_mb={self.bucket_cap_mb!r}."
            )
        self._check_sharding()
        if self.dataset_size is not None:
            self.dataset_size = _positive_int("dataset_size", self.dataset_size)
        if self.max_steps is not None:
            self.max_steps = _positive_int("max_steps", self.max_steps)
        if self.max_time is not None:
            try:
                self.max_time = parse_duration(self.max_time)
            except BudgetError as e:
                raise SpecError(f"max_time: {e}") from None
        if isinstance(self.optimizer, str):
            if self.optimizer.lower() not in OPTIMIZERS:
                raise SpecError(
                    f"unknown optimizer {self.optimizer!r}; expected one of "
                    f"{sorted(OPTIMIZERS)} or a torch.optim.Optimizer subclass."
                )
            self.optimizer = self.optimizer.lower()
        elif not (
            isinstance(self.optimizer, type) and issubclass(self.optimizer, torch.optim.Optimizer)
        ):
            raise SpecError(
                f"optimizer must be a name from {sorted(OPTIMIZERS)} or a torch.optim.Optimizer "
                f"subclass, but got {self.optimizer!r}."
            )
        if not isinstance(self.optimizer_kwargs, Mapping):
            raise SpecError(f"optimizer_kwargs must be a dict, but got {self.optimizer_kwargs!r}.")
        self.optimizer_kwargs = dict(self.optimizer_kwargs)
        self.precision = parse_precision(self.precision)
        if isinstance(self.model, nn.Module):
            if self.precision == "fp32" and (found := module_precision(self.model)) is not None:
                self.precision = found  # fp32 precision trains the parameters as they are
            self.compiled = self.compiled or bool(compiled_parts(self.model))
        if not isinstance(self.compiled, bool):
            raise SpecError(
                "compiled must be True or False (whether torch.compile runs the model), but "
                f"got compiled={self.compiled!r}."
            )
        if self.allocator not in ALLOCATORS:
            raise SpecError(f"allocator must be one of {ALLOCATORS}, but got {self.allocator!r}.")
        if self.loss is not None and not callable(self.loss):
            raise SpecError(f"loss must be callable(model, batch), but got {self.loss!r}.")

    def _check_sharding(self) -> None:
        self.sharding = parse_sharding(self.sharding)
        self.wrap_policy = parse_wrap_policy(self.wrap_policy)
        if self.sharding in _SHARDING_SPLITS and self.world_size < 2:
            raise SpecError(
                f"sharding={self.sharding!r} shards over world_size processes, but "
                f"world_size={self.world_size}: one process holds everything (FSDP trains "
                "it unsharded: sharding='no_shard'). Give the processes it trains with "
                "(world_size=2 or more), or leave sharding out."
            )
        if self.wrap_policy and self.sharding is None:
            raise SpecError(
                f"wrap_policy={tuple(c.__name__ for c in self.wrap_policy)} says which "
                "modules sharded training wraps, but sharding is None; give sharding="
                "'full_shard' (or 'shard_grad_op', 'zero3', ...) with it, or leave "
                "wrap_policy out."
            )

    # -- derived -------------------------------------------------------------------------
    @property
    def batch_spec(self) -> _Batch:
        """The batch as an object with ``make(batch_size)``, ``signature()``, ``describe()``."""
        b = self.batch
        return b if isinstance(b, (ImageBatch, TokenBatch, _CallableBatch)) else _CallableBatch(b)

    @property
    def optimizer_class(self) -> type[torch.optim.Optimizer]:
        if isinstance(self.optimizer, str):
            return OPTIMIZERS[self.optimizer][0]
        return self.optimizer

    @property
    def optimizer_name(self) -> str:
        return (
            self.optimizer if isinstance(self.optimizer, str) else self.optimizer.__name__.lower()
        )

    @property
    def optimizer_state_per_param(self) -> float:
        """Tensors of optimizer state per parameter (momentum buffers, Adam moments...)."""
        name = self.optimizer_name
        states = OPTIMIZERS[name][1] if name in OPTIMIZERS else 2.0
        kw = self.optimizer_kwargs
        if name == "sgd" and kw.get("momentum", 0):
            states = 1.0
        if name == "rmsprop":
            states += float(bool(kw.get("momentum", 0))) + float(bool(kw.get("centered", False)))
        if name in ("adam", "adamw") and kw.get("amsgrad", False):
            states += 1.0
        return states

    @property
    def pure(self) -> bool:
        """Whether the parameters train in a pure precision (:data:`PURE_PRECISIONS`)."""
        return self.precision in PURE_PRECISIONS

    @property
    def param_dtype(self) -> torch.dtype | None:
        """The type a pure precision converts parameters, buffers and the batch's
        floating-point inputs to; None where they stay as the model and batch make them."""
        return _PURE_DTYPES.get(self.precision)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The type autocast runs the forward in (bf16 or fp16 mixed precision), else None."""
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)

    @property
    def learning_rate(self) -> float:
        lr = self.optimizer_kwargs.get("lr", 1e-3)
        return float(lr) if isinstance(lr, (int, float)) else 1e-3

    @property
    def steps_per_epoch(self) -> int | None:
        """Micro-batch steps in one epoch of one rank: ``ceil(dataset_size / batch_size)``,
        and under data parallel ``ceil(ceil(dataset_size / world_size) / batch_size)``
        (:func:`rank_batches`)."""
        if self.dataset_size is None:
            return None
        return rank_batches(self.dataset_size, self.world_size, self.batch_size)

    @property
    def trial_steps(self) -> int | None:
        """Micro-batch steps in the whole trial: ``epochs`` epochs, cut at ``max_steps``
        optimizer steps (``max_steps * grad_accumulation`` micro-batches) when that is set;
        None when neither a ``dataset_size`` with an epoch limit nor ``max_steps`` says how
        long it is (``max_time`` cuts the trial's time, not its steps)."""
        steps = self.steps_per_epoch
        lengths = [steps * self.epochs] if steps is not None and self.epochs is not None else []
        if self.max_steps is not None:
            lengths.append(self.max_steps * self.grad_accumulation)
        return min(lengths) if lengths else None

    @property
    def display_name(self) -> str:
        if self.name:
            return self.name
        if isinstance(self.model, nn.Module):
            return type(self.model).__name__
        inner = self.model.func if isinstance(self.model, functools.partial) else self.model
        return str(getattr(inner, "__qualname__", None) or getattr(inner, "__name__", "model"))

    @classmethod
    def from_module(
        cls,
        module: nn.Module,
        example_batch: Any,
        *,
        optimizer: Any = "adamw",
        loss: Callable[[nn.Module, Any], torch.Tensor] | None = None,
        precision: str = "fp32",
        **kwargs: Any,
    ) -> TrainingSpec:
        """The spec of training ``module`` (a live ``nn.Module``) on batches like
        ``example_batch`` (one batch as the training step receives it: a tensor, a
        tuple/list or a mapping of tensors), with ``optimizer`` (the optimizer object the
        training uses, a class or a name). The batch size is the example's leading
        dimension; other keyword arguments (``dataset_size``, ``epochs``,
        ``grad_accumulation``, ``name``, ...) are the spec's. The module is dry-run from a
        copy on the meta device and never modified. See :mod:`costaware.from_code`.

        Example:
            >>> import torch, costaware as ca
            >>> net = torch.nn.Linear(16, 4)
            >>> spec = ca.TrainingSpec.from_module(
            ...     net, (torch.randn(32, 16), torch.randint(0, 4, (32,))),
            ...     optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
            >>> spec.batch_size, spec.optimizer_kwargs["lr"]
            (32, 0.1)
        """
        from costaware.from_code import spec_from_module

        # a module whose parameters are all bfloat16 (float16, float64) trains in pure
        # "bf16-true" ("fp16-true", "fp64-true") where precision is "fp32", which trains
        # the parameters as they are; a compiled module (compiled_parts) is compiled=True
        kwargs.setdefault("name", type(eager_module(module)).__name__)
        precision = parse_precision(precision)
        if precision == "fp32" and (found := module_precision(module)) is not None:
            precision = found
        kwargs["compiled"] = bool(kwargs.get("compiled")) or bool(compiled_parts(module))
        spec: TrainingSpec = spec_from_module(
            cls,
            module,
            example_batch,
            optimizer=optimizer,
            loss=loss,
            precision=precision,
            **kwargs,
        )
        return spec

    def with_batch_size(self, batch_size: int) -> TrainingSpec:
        """A copy of this spec with another batch size."""
        return dataclasses.replace(self, batch_size=batch_size)

    def architecture_key(self) -> str | None:
        """A key shared by specs that trace to the same op sequence up to the batch size.

        None when the model factory has no stable fingerprint (then the model's repr is
        used after building it).
        """
        model_fp = None if isinstance(self.model, nn.Module) else _fingerprint(self.model)
        if model_fp is None:
            return None
        return self._key_with(model_fp)

    def _key_with(self, model_fp: str) -> str:
        kw = {
            k: v
            for k, v in sorted(self.optimizer_kwargs.items())
            if k not in ("lr", "weight_decay")
        }
        loss_fp = (
            "default" if self.loss is None else (_fingerprint(self.loss) or f"id{id(self.loss)}")
        )
        parts = [
            model_fp,
            self.batch_spec.signature(),
            self.optimizer_name,
            repr(kw),
            self.precision,
            loss_fp,
            str(min(self.grad_accumulation, 2)),
        ]
        if self.sharding is not None:  # one rank's shards and gathers are in the trace
            wrap = ",".join(f"{c.__module__}.{c.__qualname__}" for c in self.wrap_policy)
            parts.append(f"{self.sharding}{self.world_size}[{wrap}]")
        elif self.world_size > 1:  # DDP's buckets are in the trace
            parts.append(f"ddp{self.bucket_cap_mb}")
        return hashlib.sha1("|".join(parts).encode()).hexdigest()

    def summary(self) -> dict[str, Any]:
        """A JSON-able description, for stores and reports."""
        b = self.batch_spec
        return {
            "name": self.display_name,
            "batch": b.signature(),
            "batch_size": self.batch_size,
            "optimizer": self.optimizer_name,
            "lr": self.learning_rate,
            "precision": self.precision,
            "dataset_size": self.dataset_size,
            "cudnn_benchmark": self.cudnn_benchmark,
            "allocator": self.allocator,
            "grad_accumulation": self.grad_accumulation,
            "epochs": self.epochs,
            **({"max_steps": self.max_steps} if self.max_steps is not None else {}),
            **({"max_time": self.max_time} if self.max_time is not None else {}),
            **({"compiled": True} if self.compiled else {}),
            **(
                {"world_size": self.world_size, "bucket_cap_mb": self.bucket_cap_mb}
                if self.world_size > 1 and self.sharding is None
                else {}
            ),
            **(
                {
                    "world_size": self.world_size,
                    "sharding": self.sharding,
                    "wrap_policy": [c.__qualname__ for c in self.wrap_policy],
                }
                if self.sharding is not None
                else {}
            ),
        }
