"""torch's own code that reads a tensor's values where a real step's memory and time do
not depend on them, given a fake-tensor answer for the dry run.

Each shim replaces one torch function process-wide, once, and changes nothing for real
tensors: the original runs for them, whatever thread calls it (a trial training for
real beside a dry run).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

_INSTALLED = threading.Event()
_LOCK = threading.Lock()


def _fake(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _install_causal_mask() -> None:
    """``nn.TransformerEncoder`` and ``nn.Transformer`` ask whether a mask given without
    ``is_causal`` is the causal one by comparing its values (PyTorch's tutorial passes
    ``generate_square_subsequent_mask``). On fake tensors the answer is "no": the mask is
    applied as given, which costs what the causal hint would, within the attention
    kernel's own work."""
    from torch.nn.modules import transformer

    original = transformer._detect_is_causal_mask

    def detect(
        mask: torch.Tensor | None, is_causal: bool | None = None, size: int | None = None
    ) -> bool:
        if is_causal is None and _fake(mask):
            return False
        return original(mask, is_causal, size)

    detect.__wrapped__ = original  # type: ignore[attr-defined]
    transformer._detect_is_causal_mask = detect


def install() -> None:
    """Install the shims (once per process)."""
    if _INSTALLED.is_set():
        return
    with _LOCK:
        if _INSTALLED.is_set():
            return
        _install_causal_mask()
        _INSTALLED.set()
