"""``compare`` against what a device measured: the figures it gives for a device, set
against the same configurations trained on that device.

Each whole-model row of the files given (``data/gpu/*.jsonl.gz``, measured by
``bash data/gpu_window.sh corpus|broad|small``; or a CPU's, ``data/cpu/*.jsonl.gz``) is a
configuration trained on one device. Its spec is compared on that device
(``CostModel.default().compare(spec, devices=[name])``, the shipped model unless
``--model-dir``), and the comparison's figures are set against the row's measurement:

- **iteration time** against the measured median step: the mean and median relative
  error, the median of predicted / measured - 1 (bias), and the share of rows at or
  below the upper bound (coverage);
- **peak memory** (the prediction's reserved peak) against the measured reserved peak;
- **fits**: the comparison's decision at the row's batch size against whether the run
  fitted (a row that ran out of memory should not fit; one that ran should).

A row whose configuration the model was fitted on as measured on the same GPU is left
out and counted (the files named in the model's ``data.json``, where this checkout has
them): figures on the training data would say nothing about a configuration a user
brings. A configuration the model learned as measured on another GPU is kept, and its
rows are summarised apart ("config seen elsewhere"): that is the question ``compare``
answers for a GPU the user does not have. Run it on rows measured after the model was
fitted, such as the broad families' shards. A CPU's rows test the host as much as the
model: a CPU step's time is its host's, and the CPU model learned the development
container's CPU as it ran on the day its data was timed (``data/README.md`` records each
file's host speed).

Usage: python benchmarks/compare_check.py FILE.jsonl.gz [...] [--model-dir DIR] [--json OUT]
[--update-docs]

``--update-docs`` writes the table into ``docs/accuracy.md`` (its section between the
``compare_check`` markers), with the command and the files.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
START = "<!-- compare_check:start -->"
END = "<!-- compare_check:end -->"


def trained_ids(model_dir: Path | None) -> tuple[set[tuple[str, str]], list[str]]:
    """The (configuration id, GPU name) of the rows the model was fitted on, and the
    training files this checkout lacks (whose rows cannot be excluded)."""
    from costaware.measure.collect import read_rows

    if model_dir is None:
        from importlib.resources import files

        model_dir = Path(str(files("costaware") / "data" / "default_model"))
    manifest = model_dir / "data.json"
    if not manifest.is_file():
        return set(), [f"{manifest} (no list of the training files)"]
    ids: set[tuple[str, str]] = set()
    missing = []
    for name in json.loads(manifest.read_text()).get("files", {}):
        path = ROOT / name
        if not path.is_file():
            missing.append(name)
            continue
        ids.update((str(r["id"]), str(r.get("device_name"))) for r in read_rows(path) if "id" in r)
    return ids, missing


def whole_model_rows(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The rows of ``paths`` that measured (or ran out of memory on) a whole training step:
    the latest of each configuration and device, as the accuracy benchmark counts them (a
    repeat measurement replaces the earlier one)."""
    from accuracy import _load, _read

    return [
        r
        for r in _load(_read(list(paths)))
        if "config" in r and r.get("kind") != "op" and r.get("status") in ("ok", "oom")
    ]


def check_row(model: Any, row: dict[str, Any], seen_elsewhere: bool = False) -> dict[str, Any]:
    """One row's comparison on the device it was measured on, beside what was measured."""
    from costaware.measure.corpus import Config

    spec = Config.from_dict(row["config"]).to_spec()
    name = str(row["device_name"])
    option = model.compare(spec, devices=[name], default_prices=False).option(name)
    m = row.get("measurement") or {}
    out: dict[str, Any] = {
        "id": row["id"],
        "family": row.get("family") or row["config"].get("family"),
        "precision": row["config"].get("precision", "fp32"),
        "device": option.device,
        "seen_elsewhere": seen_elsewhere,
        "measured_fits": row["status"] == "ok",
        "fits": option.fits,
        "iteration_time": option.iteration_time,
        "iteration_time_upper": option.iteration_time_upper,
        "peak_memory": option.prediction.peak_memory if option.prediction else None,
    }
    if row["status"] == "ok":
        out["measured_time"] = m.get("iteration_time")
        out["measured_reserved"] = m.get("max_reserved")
    return out


def _stats(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Time and memory errors, coverage and decision agreement over checked rows."""
    timed = [r for r in rows if r.get("measured_time")]
    rel = [(r["iteration_time"] - r["measured_time"]) / r["measured_time"] for r in timed]
    mem = [
        (r["peak_memory"] - r["measured_reserved"]) / r["measured_reserved"]
        for r in rows
        if r.get("measured_reserved") and r.get("peak_memory") is not None
    ]
    return {
        "n": len(rows),
        "time_n": len(timed),
        "time_mre": statistics.fmean(abs(e) for e in rel) if rel else None,
        "time_median_re": statistics.median(abs(e) for e in rel) if rel else None,
        "time_bias": statistics.median(rel) if rel else None,
        "time_coverage": (
            sum(r["measured_time"] <= r["iteration_time_upper"] for r in timed) / len(timed)
            if timed
            else None
        ),
        "memory_n": len(mem),
        "memory_mre": statistics.fmean(abs(e) for e in mem) if mem else None,
        "ran_but_not_admitted": sum(r["measured_fits"] and not r["fits"] for r in rows),
        "oom_but_admitted": sum(not r["measured_fits"] and r["fits"] for r in rows),
    }


def summarise(checked: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """:func:`_stats` per (device, family), per (device, precision), per device, and
    overall."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in checked:
        groups[f"{r['device']} / {r['family']}"].append(r)
        groups[f"{r['device']} / {r.get('precision', 'fp32')}"].append(r)
        groups[f"{r['device']} / all"].append(r)
        if r["seen_elsewhere"]:
            groups[f"{r['device']} / config seen elsewhere"].append(r)
    groups["all"] = list(checked)
    return {k: _stats(v) for k, v in sorted(groups.items())}


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def table(summary: dict[str, dict[str, Any]]) -> str:
    head = (
        "| rows | n | time MRE | time median RE | time bias (median) | time cov "
        "| mem MRE | ran, not admitted | OOM, admitted |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for key, s in summary.items():
        lines.append(
            f"| {key} | {s['n']} | {_pct(s['time_mre'])} | {_pct(s['time_median_re'])} "
            f"| {_pct(s['time_bias'], signed=True)} | {_pct(s['time_coverage'])} "
            f"| {_pct(s['memory_mre'])} | {s['ran_but_not_admitted']} | {s['oom_but_admitted']} |"
        )
    return "\n".join(lines)


def section(summary: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    """The docs section: what was checked, by which command, and the table."""
    from accuracy import _rel

    files = ", ".join(_rel(p) for p in args.files)
    model = _rel(args.model_dir) if args.model_dir else "the shipped model"
    command = "python benchmarks/compare_check.py " + " ".join(_rel(p) for p in args.files)
    if args.model_dir:
        command += f" --model-dir {_rel(args.model_dir)}"
    return "\n".join(
        [
            START,
            "## Measured after the fit: configurations the model never learned",
            "",
            f"Generated by `{command} --update-docs` on {datetime.date.today()} from {files}: "
            f"{model}'s comparison on the device each row was measured on (`CostModel.compare`), "
            "set against the measurement. Rows of configurations the model was fitted on, on "
            "that device, are left out. Time bias is the median of predicted / measured - 1; "
            "time cov the share of rows at or below the upper bound.",
            "",
            table(summary),
            "",
            END,
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("files", nargs="+", type=Path, help="jsonl.gz files of whole-model rows")
    parser.add_argument("--model-dir", type=Path, help="a model saved by `costaware fit`")
    parser.add_argument("--json", type=Path, help="write every checked row and the figures")
    parser.add_argument(
        "--update-docs", action="store_true", help="write the table into docs/accuracy.md"
    )
    args = parser.parse_args(argv)

    import costaware as ca

    model = ca.CostModel.load(args.model_dir) if args.model_dir else ca.CostModel.default()
    seen, missing = trained_ids(args.model_dir)
    rows = whole_model_rows(args.files)
    fresh = [r for r in rows if (str(r["id"]), str(r["device_name"])) not in seen]
    seen_ids = {i for i, _ in seen}
    print(
        f"{len(rows)} rows; {len(rows) - len(fresh)} left out as configurations the "
        f"model was fitted on; {len(fresh)} checked",
        file=sys.stderr,
    )
    for name in missing:
        print(f"not here, so its configurations could not be left out: {name}", file=sys.stderr)
    checked = []
    for i, row in enumerate(fresh, 1):
        checked.append(check_row(model, row, seen_elsewhere=str(row["id"]) in seen_ids))
        if i % 10 == 0 or i == len(fresh):
            print(f"  compared {i}/{len(fresh)}", file=sys.stderr)
    if not checked:
        print("nothing to check: every row is of a configuration the model was fitted on")
        return 1
    summary = summarise(checked)
    print(table(summary))
    if args.update_docs:
        from _docs import splice

        splice(ROOT / "docs" / "accuracy.md", section(summary, args), START, END)
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rows": checked}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
