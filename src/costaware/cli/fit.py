"""``costaware fit``: fit a CostModel on collected rows and save it."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from costaware.cli._common import (
    CliError,
    _Parser,
    _stderr_console,
)

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[_Parser]) -> _Parser:
    """The ``costaware fit`` command and its options, on the sub-parsers ``sub``."""
    p = sub.add_parser(
        "fit",
        help="fit a CostModel on collected .jsonl.gz files and save it",
        description=(
            "Rebuild every measured configuration, trace it, compute its features and fit the "
            "memory and time residual models. Per-op GPU timings (kind 'op', from "
            "costaware.measure.opbench) among the files first fit the op-level time model, whose sums "
            "over each trace become features. Example: costaware fit data/cpu/*.jsonl.gz --out model/"
        ),
    )
    p.add_argument(
        "data",
        nargs="+",
        metavar="DATA",
        help="one or more .jsonl.gz files of measured rows (costaware collect's); not a "
        "store URL: a store's rows refit the model inside a study (refit_every)",
    )
    p.add_argument("--out", required=True, help="directory to save the model to")
    p.add_argument("--iterations", type=int, default=800, help="CatBoost trees (default 800)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--threads", type=int, default=2, help="CatBoost threads (default 2)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--features-cache",
        help="a .json.gz file of features already computed (reused and updated); default none",
    )
    p.add_argument(
        "--trace-timeout",
        type=float,
        default=600.0,
        help="seconds allowed for one configuration's dry run; a row over it is skipped and "
        "listed in data.json (default 600)",
    )
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    import costaware as ca
    from costaware.measure.collect import in_measured_order, observations, read_rows

    urls = [p for p in args.data if "://" in p]
    if urls:  # a store's URL, not a file
        raise CliError(
            f"{urls[0]} is a store's URL, but costaware fit reads .jsonl.gz files of measured "
            "rows (what costaware collect writes). A store's rows refit the model online: "
            "the integrations' refit_every over that store, or in Python "
            "costaware.runtime.refit.OnlineRefit(ObservationStore(URL)).refit_now(); "
            "costaware calibrate --store URL adds calibration rows for it to start from."
        )
    files = [Path(p) for p in args.data]
    for f in files:
        if not f.is_file():
            raise CliError(f"no such data file: {f}")
        if not f.name.endswith(".jsonl.gz"):
            raise CliError(
                f"{f} is not a .jsonl.gz file of measured rows (what costaware collect writes)."
            )
    rows: list[dict[str, Any]] = []
    per_file: dict[str, dict[str, Any]] = {}
    for f in files:
        got = list(read_rows(f))
        if not got and f.stat().st_size:
            gzipped = f.read_bytes()[:2] == b"\x1f\x8b"
            why = "none of its lines is a JSON row" if gzipped else "it is not gzip-compressed"
            raise CliError(
                f"no rows in {f}: {why} (costaware collect writes .jsonl.gz files of measured "
                "rows, one JSON object per line)."
            )
        per_file[str(f)] = {"sha256": _sha256(f), "rows": len(got), "bytes": f.stat().st_size}
        rows += got
    if not rows:
        raise CliError(f"no rows in {', '.join(map(str, files))}.")
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for r in in_measured_order(rows):  # the latest row of an (id, device) wins
        seen[(str(r.get("id")), str(r.get("device_name")))] = r
    rows = list(seen.values())
    model = ca.CostModel(
        iterations=args.iterations, random_state=args.seed, thread_count=args.threads
    )
    console = _stderr_console(args.quiet)
    from rich.progress import Progress

    feature_model = ca.CostModel(trace_timeout=args.trace_timeout)
    op_rows = [r for r in rows if r.get("kind") == "op"]
    if op_rows:  # per-op timings: an op-level time model per device kind, whose sums are features
        from costaware.core.optime import fit_op_models

        try:
            op_models, no_model = fit_op_models(
                op_rows, random_state=args.seed, thread_count=args.threads
            )
        except ValueError as e:
            raise CliError(str(e)) from None
        for why in no_model:
            print(why, file=sys.stderr)
        for op_model in op_models:
            feature_model.add_op_model(op_model)
            model.add_op_model(op_model)

    configs = [r for r in rows if r.get("kind") != "op"]
    log = _LogLines(args.quiet or console is not None, len(configs))
    with Progress(console=console, transient=True, disable=console is None) as progress:
        task = progress.add_task("tracing configurations", total=len(rows))

        def on_row(i: int, r: dict[str, Any]) -> None:
            progress.update(task, completed=i, description=str(r.get("id")))
            log.traced(i, str(r.get("id")))

        obs, skipped = observations(
            configs, model=feature_model, cache=args.features_cache, on_row=on_row
        )
    if not obs:
        raise CliError(f"none of the {len(rows)} rows is usable: {'; '.join(skipped[:3])}")
    fitting = f"fitting the memory and time models on {len(obs)} observations"
    if console is not None:
        with console.status(fitting):
            model.fit(obs)
    else:
        log.line(fitting)
        model.fit(obs)
    model.training_["data_files"] = per_file
    model.training_["skipped_rows"] = len(skipped)
    out = model.save(args.out)
    info = {
        "files": per_file,
        "rows_read": len(rows),
        "op_rows": len(op_rows),
        "op_model": sorted(model.op_models_) or False,
        "observations": len(obs),
        "skipped": skipped,
        "devices": model.training_.get("devices"),
        "families": model.training_.get("families"),
        "command": "costaware fit "
        + " ".join(map(str, args.data))
        + f" --out {args.out} --trace-timeout {args.trace_timeout:g}",
        "costaware": ca.__version__,
    }
    (out / "data.json").write_text(json.dumps(info, indent=2))
    print(
        f"fitted on {len(obs)} observations ({len(skipped)} rows skipped) from "
        f"{len(files)} file(s), devices {', '.join(model.training_.get('devices', []))}; "
        f"saved to {out}"
    )
    return 0


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _LogLines:
    """Progress as plain stderr lines, for ``fit`` where no progress bar shows (a log file,
    CI): a line per ``every`` configurations dry-run (cached ones need none), with the
    elapsed time. Silent when ``quiet`` (or when a progress bar shows instead)."""

    def __init__(self, quiet: bool, total: int, every: int = 25) -> None:
        self.quiet, self.total, self.every = quiet, total, every
        self.count, self.t0 = 0, time.perf_counter()

    def line(self, text: str) -> None:
        if not self.quiet:
            print(f"[fit] {text}", file=sys.stderr, flush=True)

    def traced(self, index: int, name: str) -> None:
        self.count += 1
        if self.count == 1 or self.count % self.every == 0:
            self.line(
                f"dry-running configuration {index + 1} of {self.total} ({name}); "
                f"{self.count} traced, {time.perf_counter() - self.t0:.0f}s"
            )
