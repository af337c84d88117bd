"""The traces :class:`~costaware.core.model.CostModel` keeps per architecture, so that a
warm prediction needs no dry run: two batch sizes each, the others rescaled from them.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parameter import UninitializedParameter

from costaware.core.trace import Trace, build_model
from costaware.spec import TrainingSpec, plain_settings


@dataclass
class _ArchEntry:
    traces: list[Trace]
    graph_feats: dict[str, float]
    #: a second batch size was dry-run (kept in ``traces`` where it runs the same ops)
    second_tried: bool = False
    #: why there is no second trace, where its dry run failed
    second_why: str = ""


class _TraceCache:
    """LRU of traces per architecture: two batch sizes each, the others interpolated."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[str, _ArchEntry] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> _ArchEntry | None:
        with self._lock:
            entry = self._data.get(key)
            if entry is not None:
                self._data.move_to_end(key)
            return entry

    def put(self, key: str, entry: _ArchEntry) -> None:
        with self._lock:
            self._data[key] = entry
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)


def _shape(p: torch.Tensor) -> str:
    """A parameter's shape; a lazy module's is the batch's to give (in the key already)."""
    return "lazy" if isinstance(p, UninitializedParameter) else str(tuple(p.shape))


#: attributes that say nothing of the step: torch's own bookkeeping of every module (its
#: parameters, buffers, children and hooks, described apart) and what Lightning changes
#: from hook to hook
_SKIPPED = frozenset(vars(nn.Module())) | {"_current_fx_name", "_current_dataloader_idx"}
#: the longest list or tuple of simple values a key describes (a longer one is data)
_MAX_ITEMS = 64


def _simple(value: object) -> str | None:
    """``repr`` of a plain value (None, a bool, number or string, or a short tuple or
    list of them); None for anything else."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, (tuple, list)) and len(value) <= _MAX_ITEMS:
        parts = [_simple(v) for v in value]
        return None if None in parts else f"({','.join(parts)})"  # type: ignore[arg-type]
    return None


def _settings(obj: object, seen: dict[int, int], depth: int = 0) -> str:
    """The plain values ``obj`` holds besides its parameters: a module's attributes (the
    ``views`` its step repeats the batch by, Hugging Face's ``gradient_checkpointing``),
    a mapping's items (Lightning's ``hparams``) and, one object deep, a plain object's
    (a Hugging Face config's ``_attn_implementation``). An object reached twice, such as a
    config every layer holds, is described once."""
    if id(obj) in seen:
        return f"@{seen[id(obj)]}"
    seen[id(obj)] = len(seen)
    items = obj.items() if isinstance(obj, Mapping) else vars(obj).items()
    parts = []
    for name, value in sorted(items, key=lambda kv: str(kv[0])):
        if name in _SKIPPED:
            continue
        text = _simple(value)
        if text is None and depth == 0 and (isinstance(value, Mapping) or plain_settings(value)):
            text = "{" + _settings(value, seen, depth + 1) + "}"
        if text is not None:
            parts.append(f"{name}={text}")
    return ",".join(parts)


def _arch_key(spec: TrainingSpec) -> str:
    key = spec.architecture_key()
    if key is not None:
        return key
    # an instance is described as it is; a factory without a fingerprint is built on meta.
    # Its repr and parameter shapes leave out what the step depends on besides them:
    # which parameters train (a LoRA fine-tune freezes most), and the settings the
    # modules hold (activation checkpointing, an attention implementation, a value the
    # training_step reads)
    model = spec.model if isinstance(spec.model, nn.Module) else build_model(spec)[0]
    shapes = ";".join(
        f"{n}:{_shape(p)}:{p.dtype}:{p.requires_grad}" for n, p in model.named_parameters()
    )
    seen: dict[int, int] = {}
    settings = ";".join(f"{n}[{_settings(m, seen)}]" for n, m in model.named_modules())
    body = hashlib.sha1((repr(model) + shapes + settings).encode()).hexdigest()
    return spec._key_with("module:" + body)
