"""``costaware max-batch-size``: the largest batch size that fits a device and a budget."""

from __future__ import annotations

import argparse
import json
from typing import Any

from costaware.cli._common import (
    _SEARCH_LIMIT,
    CliError,
    _build_spec,
    _device,
    _device_arguments,
    _Parser,
    _spec_arguments,
)

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[_Parser]) -> _Parser:
    """The ``costaware max-batch-size`` command and its options, on the sub-parsers ``sub``."""
    p = sub.add_parser(
        "max-batch-size",
        help="the largest batch size that fits a device (and a budget), with no step run",
        description=(
            "Search the largest batch size of MODEL whose predicted memory need (the upper bound "
            "of the smallest capacity the step runs in, plus the CUDA context) fits DEVICE, or "
            "a tighter --max-memory. Two dry runs and a few milliseconds per size tried; nothing "
            "runs on a GPU. Example: costaware max-batch-size examples/models.py:resnet18 "
            "--input 3x224x224 --device A10"
        ),
    )
    _spec_arguments(
        p, batch_help="the batch size the search starts from (default 32)", batch_required=False
    )
    _device_arguments(p)
    p.add_argument("--max-memory", help="a memory budget below the device's, e.g. 20GiB or 90%%")
    p.add_argument(
        "--limit",
        type=int,
        default=_SEARCH_LIMIT,
        help=f"the largest batch size searched (default {_SEARCH_LIMIT})",
    )
    p.add_argument(
        "--headroom",
        type=float,
        default=None,
        help="the share by which the step's predicted memory need (the CUDA context apart) "
        "is grown before it is set against the limit, such as 0.05 (default 0.02: the "
        "allocator simulation's largest miss at a cap)",
    )
    p.add_argument("--model-dir", help="a saved CostModel directory (default: the shipped model)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    import costaware as ca
    from costaware.core.batch_size import max_batch_size

    if args.limit < 1:
        raise CliError(f"--limit must be at least 1, but got {args.limit}.")
    if args.headroom is not None and not 0 <= args.headroom < 1:
        raise CliError(
            f"--headroom must be a share of the memory need in [0, 1), such as 0.05, but got "
            f"{args.headroom}."
        )
    dev = _device(args)
    spec = _build_spec(args)
    model = ca.CostModel.load(args.model_dir) if args.model_dir else ca.CostModel.default()
    budget = ca.Budget(max_memory=args.max_memory) if args.max_memory else None
    from rich.console import Console

    with Console(stderr=True).status("dry-running and searching batch sizes ...") as status:

        def progress(batch_size: int, decision: Any) -> None:
            status.update(f"batch size {batch_size}: {'fits' if decision.admit else 'rejected'}")

        found = max_batch_size(
            model, spec, dev, budget, limit=args.limit, headroom=args.headroom,
            on_try=progress,
        )
    if args.json:
        print(json.dumps(found.to_dict(), indent=2, default=str))
    else:
        print(found)
    return 0 if found.fits else 1
