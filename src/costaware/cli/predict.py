"""``costaware predict``: one configuration's predicted peak memory and times."""

from __future__ import annotations

import argparse
import json

from costaware.cli._common import (
    _build_spec,
    _device,
    _device_arguments,
    _Parser,
    _spec_arguments,
)

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[_Parser]) -> _Parser:
    """The ``costaware predict`` command and its options, on the sub-parsers ``sub``."""
    p = sub.add_parser(
        "predict",
        help="predict peak memory and time of one configuration",
        description=(
            "Dry-run one training step of MODEL and print its predicted peak memory (the caching "
            "allocator's reserved peak, what a run reports), the smallest memory the step runs in "
            "(what decides an OOM), iteration and epoch time, with upper bounds. "
            "Example: costaware predict examples/models.py:resnet18 --batch-size 64 --input 3x224x224 "
            "--optimizer adamw --device H100 (or --device lab-a40 --device-file lab.toml: a GPU of "
            "your own, see docs/compare.md)"
        ),
    )
    _spec_arguments(p, batch_help="samples per step", batch_required=True)
    _device_arguments(p)
    p.add_argument("--model-dir", help="a saved CostModel directory (default: the shipped model)")
    p.add_argument("--json", action="store_true", help="print the prediction as JSON")
    p.add_argument("--explain", action="store_true", help="also print what the numbers rest on")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    import costaware as ca
    from costaware._format import fmt_bytes, fmt_seconds

    dev = _device(args)
    spec = _build_spec(args)
    model = ca.CostModel.load(args.model_dir) if args.model_dir else ca.CostModel.default()
    pred = model.predict(spec, device=dev, exact=True)
    if args.json:
        print(json.dumps(pred.to_dict(), indent=2, default=str))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(
        title=f"costaware prediction: {spec.display_name} on {pred.device}", title_justify="left"
    )
    table.add_column("quantity")
    table.add_column("predicted", justify="right")
    bound = f"upper bound ({pred.coverage:.0%})" if pred.coverage else "upper bound (heuristic)"
    table.add_column(bound, justify="right")
    table.add_row(
        "peak memory (reserved)", fmt_bytes(pred.peak_memory), fmt_bytes(pred.peak_memory_upper)
    )
    table.add_row(
        "memory it needs (smallest capacity)",
        fmt_bytes(pred.min_capacity),
        fmt_bytes(pred.min_capacity_upper),
    )
    table.add_row(
        "iteration time", fmt_seconds(pred.iteration_time), fmt_seconds(pred.iteration_time_upper)
    )
    if pred.epoch_time is not None:
        table.add_row(
            "epoch time", fmt_seconds(pred.epoch_time), fmt_seconds(pred.epoch_time_upper)
        )
    steps, max_time = pred.spec.get("trial_steps"), pred.spec.get("max_time")
    if pred.trial_time is not None and (
        steps != pred.spec.get("steps_per_epoch") or max_time is not None
    ):
        stopped = pred.trial_time == max_time  # the steps take longer, or have no end
        table.add_row(
            "trial time (max_time)" if stopped else f"trial time ({steps:,} steps)",
            fmt_seconds(pred.trial_time),
            fmt_seconds(pred.trial_time_upper),
        )
    console.print(table)
    fits = pred.min_capacity_upper <= dev.usable_memory_bytes
    verdict = "[green]fits[/green]" if fits else "[red]does not fit[/red]"
    where = f"{verdict} in {pred.device}'s {fmt_bytes(dev.usable_memory_bytes)} usable memory"
    # soft_wrap: a line piped to a file or a pager is not cut at 80 columns
    if dev.kind == "cpu":  # no CUDA context to set aside
        console.print(f"{where}.", soft_wrap=True)
    else:
        console.print(
            f"{where} (of {fmt_bytes(dev.memory_bytes)}; the rest is CUDA context).",
            soft_wrap=True,
        )
    if args.explain:  # the notes are part of it
        console.print(pred.explain(), markup=False, highlight=False, soft_wrap=True)
    else:
        for note in pred.notes:  # what the figures rest on: an unseen GPU, bf16 on a T4, ...
            console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    return 0
