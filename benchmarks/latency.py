"""Prediction latency on this machine: cold, new architecture, and warm.

Prints one table. Figures, not assertions: run it on an idle machine.

- process start: importing costaware (torch included) and the first prediction ever
  (torch's fake-tensor machinery warms up on first use);
- cold: a new architecture in a warm process (one dry run, ResNet-50 sized and others);
- first new batch size: the same architecture at a second batch size, which is dry-run
  once more (two traced sizes are what the others are rescaled from);
- warm: the same architecture with a further new batch size (rescaled from the cached
  traces) or a new learning rate (cached), which is what an HPO study mostly asks.

Usage: python benchmarks/latency.py [--repeats N]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import subprocess
import sys
import time

PROCESS_START = """
import time; t0 = time.perf_counter()
import costaware as ca
from costaware import zoo
import functools
t1 = time.perf_counter()
spec = ca.TrainingSpec(model=functools.partial(zoo.resnet, depth=18), batch=ca.ImageBatch((3, 224, 224)), batch_size=32)
ca.CostModel.default().predict(spec, device="H100")
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeats", type=int, default=5, help="repetitions per figure (median reported)"
    )
    args = parser.parse_args()

    out = subprocess.run(
        [sys.executable, "-c", PROCESS_START], capture_output=True, text=True, check=True
    )
    import_s, first_s = (float(v) for v in out.stdout.split())

    import costaware as ca
    from costaware import zoo

    def spec(factory, batch, bs, **kw):  # type: ignore[no-untyped-def]
        return ca.TrainingSpec(model=factory, batch=batch, batch_size=bs, dataset_size=50_000, **kw)

    img = ca.ImageBatch((3, 224, 224))
    cases = [
        ("ResNet-50, bs 32, AdamW", spec(functools.partial(zoo.resnet, depth=50), img, 32)),
        (
            "ResNet-18, bs 64, SGD",
            spec(functools.partial(zoo.resnet, depth=18), img, 64, optimizer="sgd"),
        ),
        ("ViT-B/16, bs 32, bf16", spec(functools.partial(zoo.vit), img, 32, precision="bf16")),
        (
            "GPT-2 small, bs 8 x 1024, bf16",
            spec(functools.partial(zoo.gpt), ca.TokenBatch(1024, 50257), 8, precision="bf16"),
        ),
    ]
    # warm the fake-tensor machinery once, as any process that has predicted before is
    ca.CostModel().predict(
        spec(functools.partial(zoo.mlp), ca.ImageBatch((784,), classes=10), 8), device="H100"
    )

    rows = []
    for name, s in cases:
        cold, second, warm_bs, warm_lr = [], [], [], []
        for r in range(args.repeats):
            model = ca.CostModel()  # empty cache: a new architecture
            t0 = time.perf_counter()
            model.predict(s, device="H100")
            cold.append(time.perf_counter() - t0)
            for i, bs in enumerate((s.batch_size * 2, s.batch_size + 3, max(1, s.batch_size // 2))):
                t0 = time.perf_counter()
                model.predict(s.with_batch_size(bs + r), device="H100")
                (second if i == 0 else warm_bs).append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                model.predict(
                    ca.TrainingSpec(**{**s.__dict__, "optimizer_kwargs": {"lr": 10.0 ** -(i + 2)}}),
                    device="H100",
                )
                warm_lr.append(time.perf_counter() - t0)
        rows.append(
            (
                name,
                statistics.median(cold),
                statistics.median(second),
                statistics.median(warm_bs),
                statistics.median(warm_lr),
            )
        )

    print(
        f"costaware {ca.__version__} prediction latency ({args.repeats} repeats, median), device H100"
    )
    print(f"  import costaware (with torch): {import_s * 1e3:,.0f} ms")
    print(f"  first prediction in a fresh process (ResNet-18): {first_s * 1e3:,.0f} ms\n")
    print(
        f"| {'configuration':<34} | {'cold (new arch)':>15} | {'first new batch':>15} "
        f"| {'warm: new batch':>15} | {'warm: new lr':>12} |"
    )
    print(f"|{'-' * 36}|{'-' * 17}|{'-' * 17}|{'-' * 17}|{'-' * 14}|")
    for name, c, sb, wb, wl in rows:
        print(
            f"| {name:<34} | {c * 1e3:>12,.0f} ms | {sb * 1e3:>12,.0f} ms "
            f"| {wb * 1e3:>12,.1f} ms | {wl * 1e3:>9,.1f} ms |"
        )


if __name__ == "__main__":
    main()
