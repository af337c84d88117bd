"""The traces :class:`~costaware.core.model.CostModel` keeps per architecture, so that a
warm prediction needs no dry run: two batch sizes each, the others rescaled from them.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parameter import UninitializedParameter

from costaware.core.trace import Trace, build_model
from costaware.spec import TrainingSpec


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


def _arch_key(spec: TrainingSpec) -> str:
    key = spec.architecture_key()
    if key is not None:
        return key
    # an instance is described as it is; a factory without a fingerprint is built on meta
    model = spec.model if isinstance(spec.model, nn.Module) else build_model(spec)[0]
    shapes = ";".join(f"{n}:{_shape(p)}:{p.dtype}" for n, p in model.named_parameters())
    body = hashlib.sha1((repr(model) + shapes).encode()).hexdigest()
    return spec._key_with("module:" + body)
