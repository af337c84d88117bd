"""``costaware devices``: the device catalog."""

from __future__ import annotations

import argparse
import json
import sys

from costaware.cli._common import (
    _Parser,
)

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[_Parser]) -> _Parser:
    """The ``costaware devices`` command and its options, on the sub-parsers ``sub``."""
    p = sub.add_parser(
        "devices",
        help="list the device catalog",
        description="List the GPUs (and the local CPU) costaware knows, with the specs it uses.",
    )
    p.add_argument("--json", action="store_true", help="print the catalog as JSON")
    p.add_argument(
        "--sources", action="store_true", help="also say where each device's figures come from"
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    import costaware as ca
    from costaware._format import fmt_bytes

    if args.json:
        print(json.dumps({n: ca.CATALOG[n].to_dict() for n in ca.known_devices()}, indent=2))
        return 0
    if args.sources or not sys.stdout.isatty():  # a pipe gets every name whole
        from costaware.devices import catalog_text

        print(catalog_text(sources=args.sources))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Device catalog", title_justify="left")
    for col in ("name", "memory", "bandwidth", "fp32", "bf16", "SMs", "generation"):
        table.add_column(col, justify="left" if col in ("name", "generation") else "right")
    for name in ca.known_devices():
        d = ca.CATALOG[name]
        table.add_row(
            name,
            fmt_bytes(d.memory_bytes),
            f"{d.bandwidth / 1e9:,.0f} GB/s",
            f"{d.peak_flops('fp32') / 1e12:,.1f} TF",
            f"{d.peak_flops('bf16') / 1e12:,.1f} TF" + ("" if d.has_bf16 else " (no bf16)"),
            str(d.sm_count),
            d.generation,
        )
    Console().print(table)
    return 0
