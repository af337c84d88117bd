"""torch's own code that reads a tensor's values, given a fake-tensor answer for the dry
run: where a real step's memory and time do not depend on them (whether a mask is the
causal one), and where they are bounded by the largest answer (packed sequences, taken at
their full, padded length).

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


def _install_packed_sequences() -> None:
    """``pack_padded_sequence`` packs as many steps as the lengths' values say, which fake
    tensors do not have (torch refuses the op on them). On fake tensors every sequence is
    taken at its full length, the padded length: the most a batch of that shape packs,
    so the step's memory and time are bounded from above (as the dry run's "give it the
    largest" does for every other size). The recurrent layers take such a packed
    sequence as the padded one it is, and ``pad_packed_sequence`` unpacks it."""
    from torch import _VF, nn
    from torch.nn.utils.rnn import PackedSequence

    pack, pad = _VF._pack_padded_sequence, _VF._pad_packed_sequence

    def pack_full(
        data: torch.Tensor, lengths: torch.Tensor, batch_first: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not (_fake(data) or _fake(lengths)):
            return pack(data, lengths, batch_first)  # type: ignore[no-any-return]
        steps_first = data.transpose(0, 1) if batch_first else data
        steps, batch = steps_first.shape[:2]
        packed = steps_first.reshape(steps * batch, *steps_first.shape[2:])
        return packed, torch.full((steps,), batch, dtype=torch.int64)

    def pad_full(
        data: torch.Tensor,
        batch_sizes: torch.Tensor,
        batch_first: bool,
        padding_value: float,
        total_length: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        steps = batch_sizes.shape[0]
        if not (_fake(data) and steps and data.shape[0] % steps == 0):
            return pad(data, batch_sizes, batch_first, padding_value, total_length)  # type: ignore[no-any-return]
        batch = data.shape[0] // steps
        padded = data.view(steps, batch, *data.shape[1:])
        if total_length > steps:
            more = padded.new_full((total_length - steps, *padded.shape[1:]), padding_value)
            padded = torch.cat((padded, more))
        padded = padded.transpose(0, 1).contiguous() if batch_first else padded.clone()
        return padded, torch.full((batch,), steps, dtype=torch.int64)

    setattr(_VF, "_pack_padded_sequence", pack_full)  # noqa: B010 - torch's own module
    setattr(_VF, "_pad_packed_sequence", pad_full)  # noqa: B010

    for cls in (nn.LSTM, nn.GRU, nn.RNN):
        _take_packed_as_padded(cls, PackedSequence)


def _take_packed_as_padded(cls: type[torch.nn.Module], packed_type: type[Any]) -> None:
    """``cls.forward`` taking a fake packed sequence (every sequence at full length, see
    :func:`_install_packed_sequences`) as the padded sequence it is: the same kernels over
    the same steps, and a packed output of the same data."""
    forward = cls.forward

    def forward_padded(self: Any, input: Any, hx: Any = None) -> Any:
        if not (isinstance(input, packed_type) and _fake(input.data)):
            return forward(self, input, hx)
        data, sizes = input.data, input.batch_sizes
        steps = sizes.shape[0]
        if not steps or data.shape[0] % steps:
            return forward(self, input, hx)
        padded = data.view(steps, data.shape[0] // steps, *data.shape[1:])
        out, hidden = forward(self, padded.transpose(0, 1) if self.batch_first else padded, hx)
        out = out.transpose(0, 1) if self.batch_first else out
        flat = out.reshape(out.shape[0] * out.shape[1], *out.shape[2:])
        return packed_type(flat, sizes, input.sorted_indices, input.unsorted_indices), hidden

    forward_padded.__wrapped__ = forward  # type: ignore[attr-defined]
    cls.forward = forward_padded  # type: ignore[method-assign]


def install() -> None:
    """Install the shims (once per process)."""
    if _INSTALLED.is_set():
        return
    with _LOCK:
        if _INSTALLED.is_set():
            return
        _install_causal_mask()
        _install_packed_sequences()
        _INSTALLED.set()
