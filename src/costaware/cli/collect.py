"""``costaware collect``: measure a corpus shard (:mod:`costaware.measure.collect` does the work)."""

from __future__ import annotations

import argparse

from costaware.cli._common import (
    CliError,
    _Parser,
)

__all__ = ["HELP", "add_parser", "run"]

#: the command's line in ``costaware --help``
HELP = "measure a corpus shard for real and append rows to a .jsonl.gz file"


def add_parser(sub: argparse._SubParsersAction[_Parser]) -> _Parser:
    """The ``costaware collect`` command and its options, on the sub-parsers ``sub``."""
    from costaware.measure.collect import add_arguments

    p = sub.add_parser(
        "collect",
        help=HELP,
        description=(
            "Measure a shard of the costaware corpus (peak memory, step time) on this machine and "
            "append one JSON row per configuration to a gzip JSONL file; resumes by default. "
            "Example: costaware collect --corpus gpu --shard 0 --device cuda "
            "--out data/gpu/h100-shard0.jsonl.gz --max-minutes 9"
        ),
    )
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from costaware.measure import collect

    if not args.out and not args.list:
        raise CliError(
            "--out FILE.jsonl.gz is required (for example data/gpu/h100-shard0.jsonl.gz)."
        )
    return collect.run(args)
