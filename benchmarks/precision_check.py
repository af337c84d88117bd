"""Pure half precision on this machine's CPU: the dry run's peak against a real step's.

Each configuration is trained for real in its own subprocess in fp32 and in pure bf16
(``precision="bf16-true"``: parameters, gradients, optimizer state and inputs in
bfloat16) with :func:`costaware.measure.profile.measure` (on a CPU, the peak of the bytes
PyTorch's CPU allocator held over the model's build and the warm-up steps), and dry-run
(``CostModel().predict(spec, device="cpu")``: the live-tensor peak). The shipped model's
time prediction is printed beside the measured step time: it has no pure-precision rows,
so for bf16-true it rests on the roofline and its fp32 rows.

Usage: python benchmarks/precision_check.py [--precisions fp32,bf16-true]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CONFIGS = {
    "mlp 784-1024-1024-10 bs64 adamw": "ca.TrainingSpec(model=functools.partial(zoo.mlp, 784, (1024, 1024), 10), batch=ca.ImageBatch((784,), classes=10), batch_size=64)",
    "resnet18 w16 3x32x32 bs8 sgd-momentum": "ca.TrainingSpec(model=functools.partial(zoo.resnet, depth=18, width=16, classes=10), batch=ca.ImageBatch((3, 32, 32), classes=10), batch_size=8, optimizer='sgd', optimizer_kwargs={'momentum': 0.9})",
    "gpt d128 L2 T128 bs4 adamw": "ca.TrainingSpec(model=functools.partial(zoo.gpt, vocab=4096, seq_len=128, dim=128, depth=2, heads=4), batch=ca.TokenBatch(128, 4096), batch_size=4)",
    "vit d96 L2 3x32x32 p4 bs8 adam": "ca.TrainingSpec(model=functools.partial(zoo.vit, image_size=32, patch=4, dim=96, depth=2, heads=3, classes=10), batch=ca.ImageBatch((3, 32, 32), classes=10), batch_size=8, optimizer='adam')",
}

CHILD = """
import dataclasses, functools, json, sys, torch
torch.set_num_threads(1)
import costaware as ca
from costaware import zoo
from costaware.measure.profile import measure
spec = dataclasses.replace({expr}, precision=sys.argv[1])
m = measure(spec, "cpu", warmup=2, steps=10)
print(json.dumps({{"status": m.status, "error": m.error, "peak": m.max_allocated, "time": m.iteration_time}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="fp32,bf16-true")
    args = parser.parse_args()

    import dataclasses
    import functools  # noqa: F401  (used by the evaluated specs)

    import costaware as ca
    from costaware import zoo  # noqa: F401

    dry = ca.CostModel()  # no learned model: the dry run's own peak
    shipped = ca.CostModel.default()
    print(
        f"| {'configuration':<38} | {'precision':<9} | {'dry-run peak':>12} | {'measured':>10} "
        f"| {'error':>7} | {'vs fp32':>7} | {'time pred.':>10} | {'measured':>9} |"
    )
    print(
        f"|{'-' * 40}|{'-' * 11}|{'-' * 14}|{'-' * 12}|{'-' * 9}|{'-' * 9}|{'-' * 12}|{'-' * 11}|"
    )
    for name, expr in CONFIGS.items():
        fp32_peak = None
        for precision in args.precisions.split(","):
            spec = dataclasses.replace(eval(expr), precision=precision)
            pred = dry.predict(spec, device="cpu")
            timed = shipped.predict(spec, device="cpu")
            out = subprocess.run(
                [sys.executable, "-c", CHILD.format(expr=expr), precision],
                capture_output=True,
                text=True,
                check=True,
            )
            m = json.loads(out.stdout.strip().splitlines()[-1])
            if m["status"] != "ok":
                print(f"| {name:<38} | {precision:<9} | {m['status']}: {m['error']} |")
                continue
            if precision == "fp32":
                fp32_peak = m["peak"]
            err = (pred.peak_memory - m["peak"]) / m["peak"]
            ratio = f"{m['peak'] / fp32_peak:.3f}" if fp32_peak else "-"
            print(
                f"| {name:<38} | {precision:<9} | {pred.peak_memory / 2**20:>8,.2f} MiB "
                f"| {m['peak'] / 2**20:>6,.2f} MiB | {err:>+6.2%} | {ratio:>7} "
                f"| {timed.iteration_time * 1e3:>7.1f} ms | {m['time'] * 1e3:>6.1f} ms |"
            )


if __name__ == "__main__":
    main()
