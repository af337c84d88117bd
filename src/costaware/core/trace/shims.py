"""torch's own code that reads a tensor's values, given a fake-tensor answer for the dry
run: where a real step's memory and time do not depend on them (whether a mask is the
causal one), and where they are bounded by the largest answer (packed sequences, taken at
their full, padded length).

The shims are in place only while a dry run runs (:func:`active`, counted across the
threads that dry-run at once): each replaces a torch function or a recurrent layer's
``forward``, which TorchScript could not compile (``torch.jit.script`` of an ``nn.LSTM``
or a ``TransformerEncoder``). Meanwhile they change nothing for real tensors: the
original runs for them, whatever thread calls it (a trial training for real beside a dry
run).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

_LOCK = threading.Lock()
_USERS = 0  # dry runs in progress (threads)
#: (owner, attribute, original, shim), made once
_PATCHES: list[tuple[Any, str, Any, Any]] = []
#: the original of an attribute its owner does not hold but looks up (torch._VF's)
_LOOKED_UP = object()


@contextlib.contextmanager
def active() -> Iterator[None]:
    """The shims in place for the block: installed by the first dry run to enter, removed
    by the last to leave."""
    global _USERS
    with _LOCK:
        if not _PATCHES:
            _PATCHES.extend(_causal_mask() + _packed_sequences())
        if _USERS == 0:
            for owner, name, _, shim in _PATCHES:
                setattr(owner, name, shim)
        _USERS += 1
    try:
        yield
    finally:
        with _LOCK:
            _USERS -= 1
            if _USERS == 0:
                for owner, name, original, _ in _PATCHES:
                    if original is _LOOKED_UP:  # torch._VF's: found by its __getattr__
                        delattr(owner, name)
                    else:
                        setattr(owner, name, original)


def _fake(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _causal_mask() -> list[tuple[Any, str, Any, Any]]:
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
    return [(transformer, "_detect_is_causal_mask", original, detect)]


def _packed_sequences() -> list[tuple[Any, str, Any, Any]]:
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

    held = vars(_VF)
    return [
        (_VF, "_pack_padded_sequence", held.get("_pack_padded_sequence", _LOOKED_UP), pack_full),
        (_VF, "_pad_packed_sequence", held.get("_pad_packed_sequence", _LOOKED_UP), pad_full),
        *(
            (cls, "forward", cls.forward, _take_packed_as_padded(cls, PackedSequence))
            for cls in (nn.LSTM, nn.GRU, nn.RNN)
        ),
    ]


def _take_packed_as_padded(cls: type[torch.nn.Module], packed_type: type[Any]) -> Any:
    """``cls.forward`` taking a fake packed sequence (every sequence at full length, see
    :func:`_packed_sequences`) as the padded sequence it is: the same kernels over
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
    return forward_padded
