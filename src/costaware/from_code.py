"""A :class:`~costaware.TrainingSpec` from the objects a training script already has.

A spec is otherwise written by hand, which describes the model a second time. Here it is
read off the live objects instead: the model (an ``nn.Module``, a LightningModule
included), one example batch, the optimizer and the precision.

- The model is dry-run from a copy on the meta device, made fresh for each dry run: its
  parameters and buffers take no memory, and the module itself is never touched (a
  shallow copy with meta parameters; other attributes, such as a Trainer a LightningModule
  holds, are shared, not copied).
- The example batch gives the structure: tensors, tuples, lists and mappings (a Hugging
  Face ``BatchEncoding`` is one), each tensor's shape after the batch dimension, its dtype
  and, for integer tensors (token ids, labels, masks), the range of its values, so that a
  batch of any size is drawn alike with torch's factories. Its leading dimension is the
  batch size.
- The optimizer is an optimizer object (``torch.optim.AdamW(model.parameters(), ...)``),
  a ``torch.optim.Optimizer`` subclass or a name; an object's class and defaults (``lr``,
  ``weight_decay``, ...) are what the spec takes.

Example:
    >>> import torch, costaware as ca
    >>> net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    >>> batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    >>> spec = ca.TrainingSpec.from_module(net, batch, optimizer=torch.optim.AdamW(net.parameters()))
    >>> spec.batch_size, spec.optimizer_name
    (8, 'adamw')
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

from costaware.compiled import drop_compiled, eager_module
from costaware.errors import SpecError

#: the spec class :func:`spec_from_module` builds (the caller's, so that this module does
#: not import :mod:`costaware.spec`, which imports it)
_Spec = TypeVar("_Spec")

__all__ = ["BatchLikeExample", "meta_copy", "optimizer_of", "spec_from_module"]


def uninitialized_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A lazy module's uninitialized parameter or buffer like ``t`` (in ``dtype`` when
    given), on the meta device, for the module's first forward to shape; made outside any
    fake mode, which cannot make a tensor subclass."""
    with unset_fake_temporarily():
        if isinstance(t, UninitializedParameter):
            return UninitializedParameter(  # type: ignore[call-arg]
                t.requires_grad,  # type: ignore[arg-type]
                device="meta",
                dtype=dtype or t.dtype,
            )
        return UninitializedBuffer(device="meta", dtype=dtype or t.dtype)  # type: ignore[call-arg]


def meta_copy(module: nn.Module, memo: dict[int, Any] | None = None) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are on the meta device.

    Each submodule is copied shallowly (``copy.copy``): its parameters, buffers and
    submodules are new, everything else it holds is shared with the original. Tied
    parameters stay tied. The original is not modified. The copy runs in eager mode: a
    ``torch.compile`` wrapper is copied as the module it wraps, and a compiled call is
    left out of the copy (:func:`costaware.compiled.drop_compiled`).
    """
    memo = {} if memo is None else memo
    if id(module) in memo:
        return memo[id(module)]  # type: ignore[no-any-return]
    wrapper = module
    module = eager_module(module)
    if id(module) in memo:
        return memo[id(module)]  # type: ignore[no-any-return]
    clone = copy.copy(module)
    for name, value in module.__dict__.items():
        # what a __getstate__ leaves out of a copy (a LightningModule's Trainer), shared
        # as everything else is: the step may read it (self.trainer, self.optimizers())
        if value is not None and clone.__dict__.get(name) is None:
            clone.__dict__[name] = value
    memo[id(module)] = memo[id(wrapper)] = clone
    drop_compiled(clone)
    params: dict[str, Any] = {}
    for name, p in module._parameters.items():
        if p is None:
            params[name] = None
        elif id(p) in memo:
            params[name] = memo[id(p)]
        elif isinstance(p, UninitializedParameter):  # a lazy module's, shaped when it runs
            params[name] = memo[id(p)] = uninitialized_like(p)
        else:
            params[name] = memo[id(p)] = nn.Parameter(
                torch.empty_like(p, device="meta"), p.requires_grad
            )
    buffers: dict[str, Any] = {}
    for name, b in module._buffers.items():
        if b is None:
            buffers[name] = None
        elif id(b) in memo:
            buffers[name] = memo[id(b)]
        elif isinstance(b, UninitializedBuffer):
            buffers[name] = memo[id(b)] = uninitialized_like(b)
        else:
            buffers[name] = memo[id(b)] = torch.empty_like(b, device="meta")
    clone.__dict__["_parameters"] = params
    clone.__dict__["_buffers"] = buffers
    clone.__dict__["_modules"] = {
        name: None if sub is None else meta_copy(sub, memo) for name, sub in module._modules.items()
    }
    return clone


@dataclass(frozen=True)
class _MetaFactory:
    """A zero-argument factory: a fresh meta copy of a live module at every call (a dry
    run swaps its parameters for fake tensors, so each needs its own)."""

    module: nn.Module
    prepare: Callable[[nn.Module], None] | None = None

    def __call__(self) -> nn.Module:
        clone = meta_copy(self.module)
        if self.prepare is not None:
            self.prepare(clone)
        return clone


@dataclass(frozen=True)
class _Leaf:
    """One tensor of the example batch: how to draw it at another batch size."""

    shape: tuple[int, ...]  # after the batch dimension
    dtype: torch.dtype
    low: int = 0  # integer tensors: the range of the example's values
    high: int = 1

    def make(self, batch_size: int) -> torch.Tensor:
        size = (batch_size, *self.shape)
        if self.dtype == torch.bool:
            return torch.randint(0, 2, size).bool()
        if self.dtype.is_floating_point or self.dtype.is_complex:
            return torch.randn(size, dtype=self.dtype)
        return torch.randint(self.low, self.high + 1, size, dtype=self.dtype)

    def describe(self) -> str:
        rng = "" if self.dtype.is_floating_point else f"[{self.low},{self.high}]"
        return f"{tuple(self.shape)}:{str(self.dtype).removeprefix('torch.')}{rng}"


class BatchLikeExample:
    """A ``batch_size -> batch`` callable drawing batches shaped like an example batch.

    Tensors whose leading dimension is the batch size follow it; other tensors and
    non-tensor values are kept as they are in the example (a tensor the same for every
    batch is copied as a constant). A list of one entry per sample (a detection batch's
    target dicts, variable-length sequences: see :func:`_per_sample`) follows the batch
    size too, its entries drawn in turn from the example's. A dataclass batch is rebuilt
    with its fields drawn so.
    """

    def __init__(self, example: Any) -> None:
        found = _leading_dim(example)
        if found is None:
            found = _samples(example)
        if found is None:
            raise SpecError(
                "the example batch holds no tensor with a batch dimension: give the batch as "
                "the model's training step receives it (a tensor, a tuple/list of tensors, a "
                f"mapping or a dataclass of them), but got {type(example).__name__}."
            )
        self.batch_size: int = found
        self._template = self._describe(example)

    def _describe(self, value: Any) -> Any:
        if _per_sample(value) and len(value) == self.batch_size:
            return ("samples", type(value), [("const", _frozen(v)) for v in value])
        if _is_dataclass_batch(value):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            return ("fields", value, {k: self._describe(v) for k, v in fields.items()})
        if isinstance(value, torch.Tensor):
            if value.dim() == 0 or value.shape[0] != self.batch_size:
                return ("const", value.detach().to("cpu", copy=True))
            if value.dtype.is_floating_point or value.dtype == torch.bool or value.numel() == 0:
                return ("leaf", _Leaf(tuple(value.shape[1:]), value.dtype))
            lo, hi = int(value.min()), int(value.max())
            return ("leaf", _Leaf(tuple(value.shape[1:]), value.dtype, lo, hi))
        if isinstance(value, Mapping):
            return ("map", type(value), {k: self._describe(v) for k, v in value.items()})
        if isinstance(value, (tuple, list)):
            return ("seq", type(value), [self._describe(v) for v in value])
        return ("const", value)

    def _make(self, node: Any, batch_size: int) -> Any:
        kind = node[0]
        if kind == "leaf":
            return node[1].make(batch_size)
        if kind == "const":
            value = node[1]
            return value.clone() if isinstance(value, torch.Tensor) else _copied(value)
        if kind == "samples":
            entries = node[2]
            drawn = [self._make(entries[i % len(entries)], batch_size) for i in range(batch_size)]
            return _rebuild(node[1], drawn, list)
        if kind == "fields":
            made = copy.copy(node[1])
            for name, child in node[2].items():
                object.__setattr__(made, name, self._make(child, batch_size))
            return made
        if kind == "map":
            items = {k: self._make(v, batch_size) for k, v in node[2].items()}
            return items if node[1] is dict else _rebuild(node[1], items, dict)
        return _rebuild(node[1], [self._make(v, batch_size) for v in node[2]], list)

    def __call__(self, batch_size: int) -> Any:
        return self._make(self._template, batch_size)

    def shapes(self, batch_size: int) -> str:
        """The batch's structure at ``batch_size``, for messages: ``{'x': (32, 16),
        'labels': (32,)}``."""

        def shape(node: Any) -> Any:
            kind = node[0]
            if kind == "leaf":
                return (batch_size, *node[1].shape)
            if kind == "const":
                return tuple(node[1].shape) if isinstance(node[1], torch.Tensor) else node[1]
            if kind == "samples":
                return f"[{batch_size} samples like {_shown(node[2][0][1])}]"
            if kind in ("map", "fields"):
                return {k: shape(v) for k, v in node[2].items()}
            return [shape(v) for v in node[2]]

        return repr(shape(self._template))

    def signature(self) -> str:
        """A description of the batch's structure (the trace cache's key)."""
        text = repr(_signature(self._template))
        return "example:" + hashlib.sha1(text.encode()).hexdigest()[:12]


def _rebuild(kind: type, items: Any, plain: type) -> Any:
    """``items`` as the container type of the example (a BatchEncoding, a namedtuple, ...),
    or as a plain dict/list where that type cannot be rebuilt from them."""
    try:
        if isinstance(items, list) and hasattr(kind, "_fields"):  # a namedtuple
            return kind(*items)
        return kind(items)
    except Exception:
        return plain(items)


def _signature(node: Any) -> Any:
    kind = node[0]
    if kind == "leaf":
        return node[1].describe()
    if kind == "samples":  # the entries' structure: their lengths are the data's
        return ["samples", _structure(node[2][0][1])]
    if kind == "fields":
        return {
            "dataclass": type(node[1]).__qualname__,
            **{k: _signature(v) for k, v in node[2].items()},
        }
    if kind == "const":
        value = node[1]
        if isinstance(value, torch.Tensor):
            return f"const{tuple(value.shape)}:{value.dtype}"
        return f"const:{type(value).__name__}:{value!r}"[:80]
    if kind == "map":
        return {
            str(k): _signature(v) for k, v in sorted(node[2].items(), key=lambda kv: str(kv[0]))
        }
    return [_signature(v) for v in node[2]]


def _is_dataclass_batch(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _per_sample(value: Any) -> bool:
    """Whether ``value`` is a list of one entry per sample, as a collate function leaves
    what it cannot stack: a detection batch's target dicts (all mappings), or
    variable-length sequences (tensors whose lengths differ). A tuple or list of tensors
    of one leading dimension (``(inputs, labels)``) is a batch's parts, not samples."""
    if not isinstance(value, list) or not value:
        return False
    if all(isinstance(v, Mapping) for v in value):
        return True
    return all(isinstance(v, torch.Tensor) and v.dim() > 0 for v in value) and (
        len({int(v.shape[0]) for v in value}) > 1
    )


def _parts(value: Any) -> list[Any]:
    """The values a batch container holds: a dataclass's fields, a mapping's values, a
    tuple's or list's items; none for anything else."""
    if _is_dataclass_batch(value):
        return [getattr(value, f.name) for f in dataclasses.fields(value)]
    if isinstance(value, Mapping):
        return list(value.values())
    return list(value) if isinstance(value, (tuple, list)) else []


def _leading_dim(value: Any) -> int | None:
    """The leading dimension of the first tensor with one in ``value`` (depth first),
    outside lists of one entry per sample (:func:`_per_sample`)."""
    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() > 0 else None
    if _per_sample(value):
        return None
    return next((d for v in _parts(value) if (d := _leading_dim(v)) is not None), None)


def _samples(value: Any) -> int | None:
    """The length of the first list of one entry per sample in ``value``: the batch size
    of a batch that holds no stacked tensor."""
    if _per_sample(value):
        return len(value)
    return next((n for v in _parts(value) if (n := _samples(v)) is not None), None)


def _frozen(value: Any) -> Any:
    """A sample's entry as the example holds it, its tensors copied to the CPU."""
    return _copied(value, lambda t: t.detach().to("cpu", copy=True))


def _shown(value: Any) -> Any:
    """A sample's entry for a message: its tensors by shape."""
    if isinstance(value, Mapping):
        return {k: _shown(v) for k, v in value.items()}
    return tuple(value.shape) if isinstance(value, torch.Tensor) else value


def _structure(value: Any) -> Any:
    """A sample's entry's structure: tensors by dtype and shape past the first dimension
    (a sample's own length varies), mappings by key."""
    if isinstance(value, Mapping):
        return {str(k): _structure(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, torch.Tensor):
        return f"(n,{','.join(map(str, value.shape[1:]))}):{value.dtype}"
    return type(value).__name__


def _copied(
    value: Any, copy_tensor: Callable[[torch.Tensor], torch.Tensor] = torch.clone
) -> Any:
    """A constant of the example, its tensors copied (``copy_tensor``) where it holds them
    (a sample's target dict), so that no two batches share one."""
    if isinstance(value, Mapping):
        return _rebuild(type(value), {k: _copied(v, copy_tensor) for k, v in value.items()}, dict)
    return copy_tensor(value) if isinstance(value, torch.Tensor) else value


def optimizer_of(optimizer: Any) -> tuple[Any, dict[str, Any]]:
    """``(optimizer class or name, its keyword arguments)`` from an optimizer object, an
    optimizer class or a name. An object gives its class and its defaults (``lr``,
    ``weight_decay``, ``betas``, ...); a name or a class comes with no arguments."""
    if isinstance(optimizer, torch.optim.Optimizer):
        # the defaults the constructor takes (some classes keep others among them), less
        # the ones that choose an implementation, which the dry run picks as a GPU would
        accepted = set(inspect.signature(type(optimizer).__init__).parameters)
        skip = {"self", "params", "foreach", "fused", "capturable", "differentiable"}
        kwargs = {
            k: v
            for k, v in optimizer.defaults.items()
            if k in accepted and k not in skip and isinstance(v, (int, float, bool, tuple, str))
        }
        return type(optimizer), kwargs
    if isinstance(optimizer, str) or (
        isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer)
    ):
        return optimizer, {}
    raise SpecError(
        "optimizer must be a torch.optim.Optimizer object (the one the training uses), an "
        f"Optimizer subclass or a name such as 'adamw', but got {type(optimizer).__name__}."
    )


def spec_from_module(
    spec_class: Callable[..., _Spec],
    module: nn.Module,
    example_batch: Any,
    *,
    optimizer: Any = "adamw",
    loss: Callable[[nn.Module, Any], torch.Tensor] | None = None,
    precision: str = "fp32",
    prepare: Callable[[nn.Module], None] | None = None,
    **spec_kwargs: Any,
) -> _Spec:
    """The ``spec_class`` (:class:`~costaware.TrainingSpec`) of training ``module`` on
    batches like ``example_batch`` (see the module docstring). ``prepare(copy)`` is called
    on each meta copy before it is dry-run (to silence a LightningModule's ``log``, say); other keyword
    arguments (``dataset_size``, ``epochs``, ``grad_accumulation``, ``name``, ...) go to
    the spec as they are. The caller (:meth:`~costaware.TrainingSpec.from_module`)
    resolves the precision a module trains in and whether it is compiled."""
    if not isinstance(module, nn.Module):
        raise SpecError(
            f"from_module needs the model as an nn.Module, but got {type(module).__name__}; "
            "for a factory, use TrainingSpec(model=factory, ...)."
        )
    batch = BatchLikeExample(example_batch)
    opt, opt_kwargs = optimizer_of(optimizer)
    opt_kwargs.update(spec_kwargs.pop("optimizer_kwargs", {}) or {})
    spec_kwargs.setdefault("name", type(module).__name__)
    return spec_class(
        model=_MetaFactory(module, prepare),
        batch=batch,
        batch_size=batch.batch_size,
        optimizer=opt,
        optimizer_kwargs=opt_kwargs,
        precision=precision,
        loss=loss,
        **spec_kwargs,
    )
