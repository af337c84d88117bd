"""Predict peak GPU memory and epoch time for a few training configurations, on CPU.

Nothing here touches a GPU: each configuration is dry-run once on fake tensors, and a
new batch size of the same architecture is rescaled from the cached trace in
milliseconds. Run it with ``python examples/predict_demo.py`` (``--help`` for options).

Needs: ``pip install costaware`` (no extra).
"""

from __future__ import annotations

import argparse
import time

import models
from rich import box
from rich.console import Console
from rich.table import Table

import costaware as ca


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device", default="H100", help="catalog device to predict for (default H100)"
    )
    parser.add_argument(
        "--capacity", default="24GiB", help="a memory budget to check against (default 24GiB)"
    )
    args = parser.parse_args()
    capacity = float(args.capacity.lower().removesuffix("gib")) * 2**30

    cost = ca.CostModel.default()
    console = Console()
    console.print(
        f"[bold]costaware[/bold] {ca.__version__} - predictions for {args.device} ({cost!r})\n"
    )
    configs = [
        (
            "ResNet-18",
            models.resnet18,
            ca.ImageBatch((3, 224, 224)),
            [32, 128, 512],
            "adamw",
            "fp32",
        ),
        ("ResNet-50", models.resnet50, ca.ImageBatch((3, 224, 224)), [32, 64, 256], "sgd", "bf16"),
        ("ViT-B/16", models.vit_b16, ca.ImageBatch((3, 224, 224)), [16, 64, 256], "adamw", "bf16"),
        ("GPT-2 small", models.gpt_small, ca.TokenBatch(1024, 50257), [4, 8, 32], "adamw", "bf16"),
        (
            "U-Net",
            models.unet,
            ca.SegmentationBatch((3, 256, 256), classes=21),
            [8, 32],
            "adam",
            "fp32",
        ),
    ]
    table = Table(
        title=f"Predicted cost on {args.device}: batch size, optimizer, precision; epoch = 50k samples",
        caption=f"peak: allocator reserved peak; upper: its upper bound, checked against {args.capacity}",
        box=box.SIMPLE_HEAD,
    )
    cold: list[float] = []
    warm: list[float] = []
    for col in ("configuration", "peak", "upper", "epoch", "fits?", "ms"):
        table.add_column(col, justify="left" if col == "configuration" else "right", no_wrap=True)
    for name, factory, batch, sizes, optimizer, precision in configs:
        for bs in sizes:
            spec = ca.TrainingSpec(
                model=factory,
                batch=batch,
                batch_size=bs,
                optimizer=optimizer,
                precision=precision,
                dataset_size=50_000,
                name=name,
            )
            t0 = time.perf_counter()
            pred = cost.predict(spec, device=args.device)
            ms = (time.perf_counter() - t0) * 1e3
            fits = pred.peak_memory_upper <= capacity
            (cold if pred.basis["trace_source"] == "traced" else warm).append(ms)
            table.add_row(
                f"{name} {bs} {optimizer} {precision}",
                ca.fmt_bytes(pred.peak_memory),
                ca.fmt_bytes(pred.peak_memory_upper),
                ca.fmt_seconds(pred.epoch_time),
                "[green]yes[/green]" if fits else "[red]reject[/red]",
                f"{ms:,.0f}",
            )
    console.print(table)
    console.print(
        f"A new architecture is dry-run once ({min(cold):,.0f}-{max(cold):,.0f} ms here, including first-use "
        f"warm-up); other batch sizes are rescaled from its trace ({min(warm):,.0f}-{max(warm):,.0f} ms)."
    )
    spec = ca.TrainingSpec(
        model=models.resnet50,
        batch=ca.ImageBatch((3, 224, 224)),
        batch_size=64,
        optimizer="sgd",
        precision="bf16",
        dataset_size=50_000,
        name="ResNet-50",
    )
    console.print("\n[bold]What one prediction rests on:[/bold]")
    console.print(cost.predict(spec, device=args.device).explain(), markup=False, highlight=False)


if __name__ == "__main__":
    main()
