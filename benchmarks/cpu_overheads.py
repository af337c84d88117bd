"""What one op costs a CPU beyond its arithmetic: eager dispatch, autograd and optimizer
bookkeeping, timed on tensors too small for the arithmetic to count.

The CPU step model (``costaware.core.model._CpuSteps``) charges each kernel and each parameter
tensor a cost of its own, fitted on whole-step timings. This script measures those costs
directly (a convolution's too, which the step model does not price apart), so the fitted
constants can be checked against them on the machine at hand:

    python benchmarks/cpu_overheads.py            # one torch thread, as the CPU corpus

It prints the median of ``--repeats`` timings of each case in microseconds. A backward
includes the autograd engine's start (the ``sum`` row's backward is little else), and the
optimizer rows are per parameter tensor, with PyTorch's default implementation on a CPU
(a for-loop over the tensors) and with ``foreach=True``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn


def _median_us(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _ops(repeats: int) -> list[tuple[str, float, float]]:
    """(case, forward us, forward + backward us) on a 1x4x8x8 input."""
    x = torch.randn(1, 4, 8, 8, requires_grad=True)
    flat = torch.randn(2, 8, requires_grad=True)
    lin, conv, bn = nn.Linear(8, 8), nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)
    pool = nn.MaxPool2d(2)
    cases: list[tuple[str, Callable[[], torch.Tensor]]] = [
        ("sum (the backward's fixed cost)", lambda: x.sum()),
        ("relu", lambda: torch.relu(x).sum()),
        ("linear 8->8", lambda: lin(flat).sum()),
        ("conv 3x3, 4->4 channels", lambda: conv(x).sum()),
        ("batch norm", lambda: bn(x).sum()),
        ("max pool 2x2", lambda: pool(x).sum()),
    ]
    out = []
    for name, fn in cases:
        fwd = _median_us(fn, repeats)
        both = _median_us(lambda fn=fn: fn().backward(), repeats)  # type: ignore[misc]
        out.append((name, fwd, both))
    return out


def _optimizers(tensors: int, repeats: int) -> list[tuple[str, float, float]]:
    """(optimizer, us per tensor by default, us per tensor with foreach=True)."""
    params = [nn.Parameter(torch.randn(16)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn(16)
    cases: list[tuple[str, type[torch.optim.Optimizer], dict[str, float]]] = [
        ("SGD", torch.optim.SGD, {"lr": 0.1}),
        ("SGD, momentum 0.9", torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
        ("Adam", torch.optim.Adam, {}),
        ("AdamW", torch.optim.AdamW, {}),
    ]
    out = []
    for name, cls, kwargs in cases:
        default = _median_us(cls(params, **kwargs).step, repeats) / tensors
        foreach = _median_us(cls(params, foreach=True, **kwargs).step, repeats) / tensors
        out.append((name, default, foreach))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--repeats", type=int, default=200, help="timings per case (default 200)")
    p.add_argument(
        "--tensors", type=int, default=100, help="parameter tensors an optimizer steps (100)"
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats}\n")
    print("| op | forward (us) | forward + backward (us) |\n|---|---|---|")
    for name, fwd, both in _ops(args.repeats):
        print(f"| {name} | {fwd:.1f} | {both:.1f} |")
    print(
        f"\n| optimizer step, per tensor ({args.tensors} tensors of 16) | default (us) | "
        "foreach (us) |\n|---|---|---|"
    )
    for name, default, foreach in _optimizers(args.tensors, args.repeats):
        print(f"| {name} | {default:.1f} | {foreach:.1f} |")


if __name__ == "__main__":
    main()
