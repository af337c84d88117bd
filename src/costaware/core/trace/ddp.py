"""DDP's gradient buckets: the flat buffers ``DistributedDataParallel`` allocates beside
the gradients (``gradient_as_bucket_view=False``, its default) and holds throughout
training, sized as its reducer assigns them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

#: DDP's first gradient bucket's size (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``)
_DDP_FIRST_BUCKET_BYTES = 1024 * 1024


def ddp_bucket_sizes(
    params: Sequence[torch.Tensor], cap_mb: float
) -> list[tuple[int, torch.dtype]]:
    """``(elements, dtype)`` of each gradient bucket DDP allocates for ``params``, as its
    reducer assigns them (``_compute_bucket_assignment_by_size``): the parameters that
    take a gradient in reverse order, one open bucket per dtype, closed once it reaches
    1 MiB for the first and ``cap_mb`` MiB for the others."""
    limits = (_DDP_FIRST_BUCKET_BYTES, int(cap_mb * 2**20))
    open_: dict[torch.dtype, list[int]] = {}  # dtype -> [elements, buckets closed]
    out: list[tuple[int, torch.dtype]] = []
    for p in reversed(list(params)):
        state = open_.setdefault(p.dtype, [0, 0])
        state[0] += p.numel()
        if state[0] * p.element_size() >= limits[min(state[1], 1)]:
            out.append((state[0], p.dtype))
            state[0], state[1] = 0, state[1] + 1
    out += [(n, dtype) for dtype, (n, _) in open_.items() if n]
    return out


def _ddp_buckets(model: nn.Module, cap_mb: float) -> list[torch.Tensor]:
    """DDP's gradient buckets for ``model``'s parameters, as (fake) tensors."""
    params = [p for p in {id(p): p for p in model.parameters()}.values() if p.requires_grad]
    return [torch.empty(n, dtype=dtype) for n, dtype in ddp_bucket_sizes(params, cap_mb)]
