"""``costaware report``: the budget report of a study, a store or a Ray Tune run (:func:`costaware.reporting.report` does the work)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from costaware.cli._common import (
    CliError,
    _Parser,
    _stderr_console,
)

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[_Parser]) -> _Parser:
    """The ``costaware report`` command and its options, on the sub-parsers ``sub``."""
    p = sub.add_parser(
        "report",
        help="budget report of an Optuna study, the observation store or a Ray Tune run",
        description=(
            "Where the compute went, which trials were rejected and why, what the rejections "
            "saved, and how far the predictions were from the measurements. Prints a summary; "
            "--html writes one self-contained page (opens offline), --markdown a page for a PR "
            "or a wiki. Examples: "
            "costaware report --storage sqlite:///hpo.db --study digits --store "
            "sqlite:///costaware.db --html report.html | "
            "costaware report --store sqlite:///costaware.db --markdown report.md | "
            "costaware report --ray-dir ~/ray_results/digits --store sqlite:///costaware.db "
            "--mode max --html report.html"
        ),
    )
    p.add_argument(
        "source",
        nargs="?",
        metavar="SOURCE",
        help="a database URL or SQLite file (an Optuna storage and/or an observation store), "
        "or a Ray Tune experiment directory",
    )
    p.add_argument("--storage", help="the Optuna storage URL, e.g. sqlite:///hpo.db")
    p.add_argument("--study", help="the study name (needed when the storage holds several)")
    p.add_argument(
        "--store",
        help="the observation store the pruner and CostAwareCallback wrote to, "
        "e.g. sqlite:///costaware.db (its measurements join the study's trials)",
    )
    p.add_argument(
        "--ray-dir", help="a Ray Tune experiment directory (RunConfig storage_path/name)"
    )
    p.add_argument("--html", metavar="PATH", help="write the HTML report here")
    p.add_argument("--markdown", "--md", metavar="PATH", help="write the Markdown report here")
    p.add_argument("--json", metavar="PATH", help="write every figure as JSON here ('-': stdout)")
    p.add_argument("--price-per-hour", type=float, help="price of one GPU-hour, to show costs")
    p.add_argument("--currency", default="$", help="currency symbol for costs (default $)")
    p.add_argument("--max-total-time", help="the study's GPU-time cap, e.g. 8h, if not recorded")
    p.add_argument("--max-cost", type=float, help="the study's cost cap (needs --price-per-hour)")
    p.add_argument(
        "--mode",
        choices=("max", "min"),
        help="rank a Ray Tune run's trials (Ray does not record it)",
    )
    p.add_argument("--title", help="the report's title")
    p.add_argument("--quiet", "-q", action="store_true", help="no summary, no progress bar")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from costaware.reporting import report

    if args.study and not (args.storage or args.store or args.source):
        raise CliError("--study names a study in --storage (or in --store); give one of them.")
    if not (args.source or args.storage or args.store or args.ray_dir):
        raise CliError(
            "say what to report on: --storage URL --study NAME (an Optuna study), "
            "--store URL (the observation store) or --ray-dir PATH (a Ray Tune run)."
        )
    if args.source and (args.storage or args.ray_dir):
        raise CliError("give the source once: either SOURCE or --storage / --ray-dir.")
    budget = None
    if args.max_total_time or args.max_cost is not None:
        import costaware as ca

        budget = ca.Budget(
            max_total_time=args.max_total_time,
            max_cost=args.max_cost,
            price_per_hour=args.price_per_hour,
        )
    console = _stderr_console(args.quiet)
    from rich.progress import Progress

    with Progress(console=console, transient=True, disable=console is None) as progress:
        task = progress.add_task("reading", total=None)

        def on_progress(what: str, done: int, total: int) -> None:
            progress.update(task, description=what, completed=done, total=total or None)

        rep = report(
            args.source,
            study=args.study,
            store=args.store,
            storage=args.storage,
            ray_dir=args.ray_dir,
            budget=budget,
            price_per_hour=args.price_per_hour,
            currency=args.currency,
            mode=args.mode,
            title=args.title,
            progress=on_progress,
        )
        written = []
        if args.html:
            rep.to_html(args.html, progress=on_progress)
            written.append(args.html)
        if args.markdown:
            rep.to_markdown(args.markdown)
            written.append(args.markdown)
        if args.json:
            text = json.dumps(rep.to_dict(), indent=2, default=str)
            if args.json == "-":
                print(text)
            else:
                try:
                    Path(args.json).write_text(text + "\n", encoding="utf-8")
                except OSError as e:
                    raise CliError(f"cannot write {args.json}: {e.strerror or e}") from None
                written.append(args.json)
    if not args.quiet and args.json != "-":
        from rich.console import Console

        rep.print(Console())
    for path in written:
        size = Path(path).stat().st_size
        print(
            f"wrote {path} ({size / 1e6:.1f} MB)" if size > 1e5 else f"wrote {path}",
            file=sys.stderr,
        )
    return 0
