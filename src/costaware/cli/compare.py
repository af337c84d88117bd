"""``costaware compare``: one configuration on every catalog GPU, as a table or JSON
(:func:`costaware.core.compare.compare` does the work)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from costaware.budget import Budget
from costaware.core.batch_size import DEFAULT_LIMIT
from costaware.core.compare import SORT_KEYS, CompareError, compare, parse_prices
from costaware.core.model import CostModel
from costaware.device_files import load_devices
from costaware.devices import Device

if TYPE_CHECKING:
    from costaware.spec import TrainingSpec

__all__ = ["add_arguments", "run_cli"]


def add_arguments(p: Any) -> None:
    """The ``costaware compare`` options besides the training configuration's."""
    p.add_argument(
        "--devices",
        "-d",
        action="append",
        metavar="NAMES",
        help="devices to compare, comma-separated or repeated (catalog names or aliases, "
        "see 'costaware devices'; default every catalog GPU)",
    )
    p.add_argument(
        "--device-file",
        action="append",
        metavar="PATH",
        help="a JSON or TOML file of your own devices (docs/compare.md), compared besides "
        "the catalog's GPUs or named in --devices",
    )
    p.add_argument(
        "--price",
        action="append",
        metavar="PRICE",
        help="price of one GPU-hour: one number for every device (--price 2.5) or NAME=PRICE "
        "per device (--price A10G=1.2,H100=3.0); devices without one take the default list "
        "price (docs/compare.md)",
    )
    p.add_argument(
        "--no-default-prices",
        action="store_true",
        help="no list prices: only the devices given --price have a cost",
    )
    p.add_argument(
        "--currency",
        default="$",
        help="currency symbol of --price (default $; the default prices are US dollars and "
        "are not used with another currency)",
    )
    p.add_argument(
        "--sort",
        choices=SORT_KEYS,
        help="order of the rows: cost (per epoch; the default with prices), time (per "
        "iteration; the default without), batch (largest batch size first) or name",
    )
    p.add_argument("--max-memory", help="a memory budget below each device's, e.g. 20GiB or 90%%")
    p.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"the largest batch size searched (default {DEFAULT_LIMIT})",
    )
    p.add_argument("--model-dir", help="a saved CostModel directory (default: the shipped model)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")


def run_cli(args: Any, spec: TrainingSpec) -> int:
    """``costaware compare``: the table (or ``--json``) of ``spec`` on the devices asked.

    Exit status 0 when the step fits at its batch size on at least one device, 1 when it
    fits only at a smaller batch size; a spec that fits nowhere raises NothingFitsError.
    """
    if args.limit < 1:
        raise CompareError(f"--limit must be at least 1, but got {args.limit}.")
    extra: list[Device] = []
    for path in args.device_file or ():
        try:
            extra += load_devices(path)
        except ValueError as e:
            raise CompareError(str(e)) from None
    names = None
    if args.devices:
        names = [n.strip() for item in args.devices for n in item.split(",") if n.strip()]
        if not names:
            raise CompareError("--devices names no device; give names such as A10G,L4,H100.")
    prices = parse_prices(args.price) if args.price else None
    budget = Budget(max_memory=args.max_memory) if args.max_memory else None
    model = CostModel.load(args.model_dir) if args.model_dir else CostModel.default()
    status: Any = None
    if sys.stderr.isatty() and not args.json:
        from rich.console import Console

        status = Console(stderr=True).status("dry-running ...")
        status.start()
    try:
        result = compare(
            model,
            spec,
            names,
            prices,
            budget,
            sort=args.sort,
            currency=args.currency,
            limit=args.limit,
            extra_devices=extra,
            default_prices=not args.no_default_prices,
            on_device=(lambda name: status.update(f"predicting on the {name} ..."))
            if status is not None
            else None,
        )
    finally:
        if status is not None:
            status.stop()
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        print(result.table())
    return 0 if any(o.fits for o in result.options) else 1
