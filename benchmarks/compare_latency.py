"""How long ``CostModel.compare`` takes for 16 GPUs, and where the time goes.

For a ResNet-18 (bf16, batch 64, 224x224 images) and a GPT-style transformer, on 16 GPUs
of the catalog: the comparison from a fresh model (its two dry runs included), again with
the dry runs cached but the allocator replays forgotten (what a comparison of another
batch size or precision of a model already predicted costs: every step it tries is
replayed once), again with both remembered (the same comparison repeated), the number of
predictions the batch-size search made against what
:func:`costaware.core.batch_size.max_batch_size` makes (and how far apart their answers are:
the memory need is not monotone to the byte near the edge), and, for
reference, the loop a user writes without it (one ``predict`` per GPU, no batch-size
search). Wall-clock seconds on this machine; run it alone for figures to quote.

Usage:
    python benchmarks/compare_latency.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

DEVICES = [
    "T4", "V100", "A10", "A10G", "L4", "RTX-3090", "RTX-4090", "RTX-5090",
    "RTX-A6000", "L40S", "A100-40GB", "A100-80GB", "H100-PCIe", "H100-SXM", "H200", "B200",
]  # fmt: skip


def _specs() -> dict[str, object]:
    import costaware as ca
    from costaware import zoo

    return {
        "resnet18 bf16 b64": ca.TrainingSpec(
            model=functools.partial(zoo.resnet, 18),
            batch=ca.ImageBatch((3, 224, 224), classes=1000),
            batch_size=64,
            precision="bf16",
            dataset_size=50_000,
        ),
        "gpt 6x512 seq512 bf16 b16": ca.TrainingSpec(
            model=functools.partial(zoo.gpt, vocab=32_000, seq_len=512, dim=512, depth=6, heads=8),
            batch=ca.TokenBatch(512, 32_000),
            batch_size=16,
            precision="bf16",
            dataset_size=100_000,
        ),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    import costaware as ca
    import costaware.core.allocator as allocator
    from costaware.core.batch_size import max_batch_size

    def forget_replays() -> None:
        with allocator._replays_lock:
            allocator._replays.clear()

    print(f"{len(DEVICES)} devices; cpu count {os.cpu_count()}, load {os.getloadavg()[0]:.1f}")
    for label, spec in _specs().items():
        forget_replays()
        model = ca.CostModel.default()
        t = time.perf_counter()
        first = model.compare(spec, DEVICES)
        cold = time.perf_counter() - t
        warm, again = [], []
        for _ in range(args.repeats):
            forget_replays()
            t = time.perf_counter()
            model.compare(spec, DEVICES)
            warm.append(time.perf_counter() - t)
            t = time.perf_counter()
            model.compare(spec, DEVICES)
            again.append(time.perf_counter() - t)
        forget_replays()
        t = time.perf_counter()
        for d in DEVICES:
            model.predict(spec, d)
        loop = time.perf_counter() - t
        tried = sum(len(o.batch_search.tried) for o in first.options if o.batch_search)
        plain = 0
        apart = 0.0
        for o in first.options:
            found = max_batch_size(model, spec, o.device)
            plain += len(found.tried)
            apart = max(apart, abs(found.batch_size - o.max_batch) / max(found.batch_size, 1))
        print(
            f"{label}: compare {cold:.2f} s from a fresh model (dry runs included), "
            f"{statistics.median(warm):.2f} s with them cached, "
            f"{statistics.median(again):.2f} s repeated (medians of {args.repeats}); "
            f"a predict per device alone {loop:.2f} s; batch-size search "
            f"{tried} predictions (max_batch_size: {plain}; their answers at most "
            f"{apart:.2%} apart)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
