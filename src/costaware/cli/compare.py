"""``costaware compare``: one configuration on every catalog GPU, as a table or JSON
(:func:`costaware.core.compare.compare` does the work)."""

from __future__ import annotations

import json
import sys
import warnings
from typing import TYPE_CHECKING, Any

from costaware.cli._common import _SEARCH_LIMIT, _device_file_argument, _own_devices

if TYPE_CHECKING:
    from costaware.spec import TrainingSpec

# what the parser shows, without importing costaware.core.compare (and torch with it) for
# `costaware --help`; tests/cli check they are that module's
_SORT_KEYS = ("cost", "time", "batch", "name")

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
    _device_file_argument(
        p, "compared besides the catalog's GPUs, or the ones --devices names among them"
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
        choices=_SORT_KEYS,
        help="order of the rows: cost (per epoch; the default with prices), time (per "
        "iteration; the default without), batch (largest batch size first) or name",
    )
    p.add_argument("--max-memory", help="a memory budget below each device's, e.g. 20GiB or 90%%")
    p.add_argument(
        "--limit",
        type=int,
        default=_SEARCH_LIMIT,
        help=f"the largest batch size searched (default {_SEARCH_LIMIT})",
    )
    p.add_argument("--model-dir", help="a saved CostModel directory (default: the shipped model)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")


def run_cli(args: Any, spec: TrainingSpec) -> int:
    """``costaware compare``: the table (or ``--json``) of ``spec`` on the devices asked.

    Exit status 0 when the step fits at its batch size on at least one device, 1 when it
    fits only at a smaller batch size; a spec that fits nowhere raises NothingFitsError.
    """
    from costaware.budget import Budget
    from costaware.core.compare import CompareError, UnusedPriceWarning, compare, parse_prices
    from costaware.core.model import CostModel
    from costaware.devices import Device

    if args.limit < 1:
        raise CompareError(f"--limit must be at least 1, but got {args.limit}.")
    extra: list[Device] = _own_devices(args)
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
        with warnings.catch_warnings():  # a price the comparison leaves unused is an error
            warnings.simplefilter("error", UnusedPriceWarning)
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
    except UnusedPriceWarning as w:
        them = "it" if len(w.names) == 1 else "them"
        raise CompareError(
            f"--price prices {', '.join(w.names)}, which {'is' if them == 'it' else 'are'} "
            f"not among the devices compared ({', '.join(w.compared)}): add {them} to "
            f"--devices, or drop {'its price' if them == 'it' else 'their prices'}."
        ) from None
    finally:
        if status is not None:
            status.stop()
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        print(result.table())
    return 0 if any(o.fits for o in result.options) else 1
