"""oneDNN's convolution buffers on this CPU: measured against the dry run's block.

A fp32 convolution that PyTorch hands to oneDNN (``mkldnn_convolution``) reorders its
input, weight and output into blocked layouts inside the op, and its backward does the
same for the gradients. Those buffers are freed before the op returns, so a dry run on
fake tensors never sees them;
:func:`costaware.core.trace.transients._onednn_conv_transient` is the block the CPU dry
run adds for them (feature version 15).

This script draws random convolutions (seeded), runs each forward and backward for real
on this CPU with the profiler recording every allocation, and compares the op's peak
above what it started with (its output, or its gradients, plus the buffers) with the
prediction: the returned tensors alone (the dry run before version 15) and with the block.
Errors are ``|predicted / measured - 1|`` of that peak; "exact" is within 8 KiB, "under"
the share predicted below it by more, and "bytes off" the summed ``|predicted - measured|``
over the summed peaks (the large convolutions, which set a model's peak, weigh most; a
few-KiB convolution 3x over weighs little).

Usage:
    python benchmarks/cpu_conv_memory.py [--n 400] [--seed 0] [--threads 1]

About 25 seconds for 400 cases on 2 cores. The CPU corpus was measured with one thread;
oneDNN's buffers are per CPU (instruction set, threads), so the figures are this
machine's.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from costaware.core.trace.transients import _onednn_conv_transient
from costaware.measure.profile import AllocatorPeak

KIB8 = 8 * 1024


@dataclass
class Case:
    n: int
    c: int
    k: int
    h: int
    kernel: int
    stride: int
    padding: int
    depthwise: bool
    input_grad: bool


def draw(seed: int, count: int) -> list[Case]:
    """``count`` random convolutions of the sizes the CPU corpus has, deterministic."""
    rng = random.Random(seed)
    out: list[Case] = []
    while len(out) < count:
        c = rng.choice((3, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256))
        depthwise = c > 3 and rng.random() < 0.15
        k = c if depthwise else rng.choice((4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512))
        kernel = rng.choice((1, 1, 3, 3, 3, 5, 7))
        stride = rng.choice((1, 1, 2))
        padding = kernel // 2 if rng.random() < 0.85 else 0
        h = rng.choice((1, 2, 4, 7, 8, 14, 16, 28, 32, 56, 64))
        n = rng.choice((1, 2, 4, 8, 16))
        if rng.random() < 0.05:  # a ViT's patch embedding: an image cut into 16x16 patches
            c, k, kernel, stride, padding, depthwise = (
                3,
                rng.choice((64, 192, 384)),
                16,
                16,
                0,
                False,
            )
            h = rng.choice((32, 64, 224))
        if h + 2 * padding < kernel or n * max(c, k) * h * h * 4 > 32e6:
            continue
        out.append(Case(n, c, k, h, kernel, stride, padding, depthwise, rng.random() < 0.75))
    return out


def _peak_above_start(fn: Callable[[], object]) -> int:
    """The highest number of bytes the CPU allocator held during ``fn`` above its start,
    measured as the CPU corpus was (:class:`costaware.measure.profile.AllocatorPeak`)."""
    with AllocatorPeak() as peak:
        fn()
    if peak.peak is None:
        raise RuntimeError(f"no CPU allocator peak: {peak.why}")
    return peak.peak


def measure(case: Case) -> dict[str, float] | None:
    """The case's measured and predicted peaks, forward and backward; None when PyTorch
    does not run it through oneDNN (its own convolution's columns are modelled apart)."""
    groups = case.c if case.depthwise else 1
    conv = nn.Conv2d(case.c, case.k, case.kernel, case.stride, case.padding, groups=groups)
    conv.bias = None
    x = torch.randn(case.n, case.c, case.h, case.h, requires_grad=case.input_grad)
    strides, pads = [case.stride] * 2, [case.padding] * 2
    backend = torch._C._select_conv_backend(
        x, conv.weight, None, strides, pads, [1, 1], False, [0, 0], groups, None
    )
    if backend.name != "Mkldnn":
        return None
    with torch.no_grad():
        grad_out = torch.ones_like(conv(x))
    for _ in range(2):  # oneDNN's one-time set-up is not the op's
        conv(x).backward(grad_out)
        conv.weight.grad = x.grad = None
    held: dict[str, torch.Tensor] = {}

    def forward() -> None:
        held["y"] = conv(x)

    fwd = _peak_above_start(forward)
    y = held.pop("y")
    bwd = _peak_above_start(lambda: y.backward(grad_out))
    out_bytes = y.numel() * y.element_size()
    grads = conv.weight.numel() * 4 + (x.numel() * 4 if case.input_grad else 0)
    w = conv.weight.detach()
    block_f = _onednn_conv_transient(x, w, y, groups, case.stride > 1, None)
    block_b = _onednn_conv_transient(x, w, y, groups, case.stride > 1, case.input_grad)
    return {
        "fwd": fwd,
        "fwd_without": out_bytes,
        "fwd_with": out_bytes + block_f,
        "bwd": bwd,
        "bwd_without": grads,
        "bwd_with": grads + block_b,
    }


def summarise(pred: np.ndarray, meas: np.ndarray) -> str:
    err = np.abs(pred / meas - 1.0)
    return (
        f"mean {100 * err.mean():5.1f}%  median {100 * np.median(err):5.1f}%  "
        f"p90 {100 * np.percentile(err, 90):5.1f}%  exact {100 * np.mean(np.abs(pred - meas) <= KIB8):3.0f}%  "
        f"under {100 * np.mean(pred < meas - KIB8):3.0f}%  "
        f"bytes off {100 * np.abs(pred - meas).sum() / meas.sum():5.1f}%"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=400, help="random convolutions to draw (400)")
    p.add_argument("--seed", type=int, default=0, help="seed of the draw (0)")
    p.add_argument("--threads", type=int, default=1, help="torch threads, as the corpus (1)")
    args = p.parse_args(argv)
    if args.n < 1:
        p.error("--n must be at least 1")
    torch.set_num_threads(args.threads)
    rows = []
    for case in draw(args.seed, args.n):
        r = measure(case)
        if r is not None:
            rows.append(r)
    print(
        f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{args.threads} thread(s): {len(rows)} of {args.n} random convolutions ran through "
        "oneDNN\n"
    )
    if not rows:
        print("none ran through oneDNN here: nothing to compare")
        return 1
    for phase in ("fwd", "bwd"):
        meas = np.array([r[phase] for r in rows], dtype=np.float64)
        label = "forward" if phase == "fwd" else "backward"
        for how in ("without", "with"):
            pred = np.array([r[f"{phase}_{how}"] for r in rows], dtype=np.float64)
            name = "tensors only (no block)" if how == "without" else "with the oneDNN block"
            print(f"{label:8s} {name:24s} {summarise(pred, meas)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
