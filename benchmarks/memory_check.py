"""Dry-run peak against a measured peak, for a few models, on this machine's CPU.

Each configuration is measured for real in its own subprocess with
:func:`costaware.measure.profile.measure` (on a CPU, the peak of the bytes PyTorch's CPU allocator
held over the model's build and the warm-up steps, from the profiler's memory events; the
resident-set growth is printed beside it), and predicted
with the dry run (``CostModel().predict(spec, device="cpu")``: the live-tensor peak, no
GPU allocator). On a GPU machine, pass ``--device cuda`` to compare the simulated
allocator peak against ``max_memory_reserved`` instead.

Usage: python benchmarks/memory_check.py [--device cpu|cuda] [--catalog-device H100]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CONFIGS = {
    "resnet18 bs16 3x64x64 adamw": "ca.TrainingSpec(model=functools.partial(zoo.resnet, depth=18), batch=ca.ImageBatch((3, 64, 64)), batch_size=16)",
    "resnet50 bs8 3x128x128 sgd-momentum": "ca.TrainingSpec(model=functools.partial(zoo.resnet, depth=50), batch=ca.ImageBatch((3, 128, 128)), batch_size=8, optimizer='sgd', optimizer_kwargs={'momentum': 0.9})",
    "mlp 784-2048-2048-10 bs256 sgd-momentum": "ca.TrainingSpec(model=functools.partial(zoo.mlp, 784, (2048, 2048), 10), batch=ca.ImageBatch((784,), classes=10), batch_size=256, optimizer='sgd', optimizer_kwargs={'momentum': 0.9})",
    "gpt d256 L4 T256 bs4 adamw": "ca.TrainingSpec(model=functools.partial(zoo.gpt, vocab=8192, seq_len=256, dim=256, depth=4, heads=4), batch=ca.TokenBatch(256, 8192), batch_size=4)",
    "vit d192 L6 3x64x64 p8 bs8 adam": "ca.TrainingSpec(model=functools.partial(zoo.vit, image_size=64, patch=8, dim=192, depth=6, heads=3, classes=100), batch=ca.ImageBatch((3, 64, 64), classes=100), batch_size=8, optimizer='adam')",
    "unet base16 3x128x128 bs4 adamw": "ca.TrainingSpec(model=functools.partial(zoo.unet, base=16), batch=ca.SegmentationBatch((3, 128, 128), classes=21), batch_size=4)",
}

CHILD = """
import functools, json, sys, torch
torch.set_num_threads(2)
import costaware as ca
from costaware import zoo
from costaware.measure.profile import measure
spec = {expr}
m = measure(spec, sys.argv[1], warmup=2, steps=10)
print(json.dumps({{"status": m.status, "error": m.error, "reserved": m.max_reserved, "allocated": m.max_allocated,
                  "rss": m.rss_growth, "time": m.iteration_time, "method": m.memory_method}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="where to measure: cpu or cuda")
    parser.add_argument(
        "--catalog-device",
        default=None,
        help="catalog entry to predict for (default: CPU, or auto on cuda)",
    )
    args = parser.parse_args()

    import functools  # noqa: F401  (used by the evaluated specs)

    import costaware as ca
    from costaware import zoo  # noqa: F401

    target = args.catalog_device or ("cpu" if args.device == "cpu" else "auto")
    model = ca.CostModel()
    print(f"dry-run peak vs measured peak, measured on {args.device}, predicted for {target}")
    print(
        f"| {'configuration':<42} | {'predicted':>10} | {'measured':>10} | {'error':>7} "
        f"| {'resident-set growth':>19} |"
    )
    print(f"|{'-' * 44}|{'-' * 12}|{'-' * 12}|{'-' * 9}|{'-' * 21}|")
    errors = []
    method = ""
    for name, expr in CONFIGS.items():
        spec = eval(expr)
        pred = model.predict(spec, device=target)
        out = subprocess.run(
            [sys.executable, "-c", CHILD.format(expr=expr), args.device],
            capture_output=True,
            text=True,
            check=True,
        )
        m = json.loads(out.stdout.strip().splitlines()[-1])
        method = m["method"]
        if m["status"] != "ok":
            print(
                f"| {name:<42} | {pred.peak_memory / 2**20:>6,.1f} MiB | {m['status']:>10} | {'-':>7} | {'-':>19} |"
            )
            continue
        err = (pred.peak_memory - m["reserved"]) / m["reserved"]
        errors.append(abs(err))
        rss = "-" if m.get("rss") is None else f"{m['rss'] / 2**20:,.1f} MiB"
        print(
            f"| {name:<42} | {pred.peak_memory / 2**20:>6,.1f} MiB | {m['reserved'] / 2**20:>6,.1f} MiB | {err:>+6.1%} | {rss:>19} |"
        )
    if errors:
        print(
            f"\nmean absolute relative error {sum(errors) / len(errors):.1%} over {len(errors)} configurations"
        )
    print(f"measured as: {method}")


if __name__ == "__main__":
    main()
