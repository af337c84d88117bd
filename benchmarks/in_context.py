"""Ops inside a model against the op model: where a step's kernels cost what the op
benchmark says, and where not.

The op model (:mod:`costaware.core.optime`) learns each kernel's time from ops timed one at a
time (:mod:`costaware.measure.opbench`); a step's op sum adds them up. Rows collected with
``costaware collect --in-context`` (on a GPU machine: ``bash data/gpu_window.sh repeat``)
also carry each op's time inside the profiled step
(:func:`costaware.measure.profile.in_context_op_times`). For each such row this script dry-runs
the configuration as its device runs it, costs the trace's nodes with the op model, and
compares the two per operator group and phase:

- ``measured``: the profiled time of the group's ops per step (on a GPU their kernels'
  time, on a CPU their own CPU time); an op is put in the group of the outermost aten
  call of its chain that :func:`costaware.core.features.op_group` knows (``conv2d`` is a
  composite; its ``convolution`` is what a dry run records);
- ``predicted``: the op model's time for the trace's nodes of that group;
- ``ratio``: the median over rows of measured / predicted, where both are above 1 us.

A ratio far from 1 in a group with a large share is where the op sum misses a model's
step. The parts of the step the op model does not cost (making the batch, ``zero_grad``,
time outside any op) are listed apart.

Usage:
    python benchmarks/in_context.py [ROWS.jsonl.gz ...] [--model DIR] [--out FILE.md]

With no file it reads every ``data/**/*.jsonl.gz`` and keeps the rows with in-context
times. A CPU row takes about a second (its dry run); a GPU row a few.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: profiled phases the op model costs, and the trace's phase code of each
COSTED = {"forward": 0, "backward": 1, "optimizer": 2}


def measured_groups(context: dict[str, Any]) -> dict[tuple[str, str], float]:
    """Seconds per step by (phase, op group) from a row's ``in_context`` record; the
    optimizer phase is one group, and time outside any aten op is ``(phase, "outside
    ops")``."""
    from costaware.core.features import op_group

    out: dict[tuple[str, str], float] = {}
    for phase, chain, _calls, secs in context.get("ops", []):
        if phase == "optimizer":
            group = "optimizer"
        else:
            names = str(chain).split(">")
            group = next((g for g in map(op_group, names) if g != "other"), "other")
        out[(phase, group)] = out.get((phase, group), 0.0) + float(secs)
    for phase, secs in (context.get("unattributed_s") or {}).items():
        out[(phase, "outside ops")] = out.get((phase, "outside ops"), 0.0) + float(secs)
    return out


def predicted_groups(row: dict[str, Any], model: Any) -> dict[tuple[str, str], float] | None:
    """The op model's seconds per step by (phase, op group) for ``row``'s configuration on
    its device (None where the model has no op model of that device's kind)."""
    from costaware.core.model import _attention_mode
    from costaware.core.optime import GROUPS, catalog_device, node_table
    from costaware.devices import get_device
    from costaware.measure.collect import _as_measured, measured_cpu_device
    from costaware.measure.corpus import Config

    name = catalog_device(row)
    device = get_device(measured_cpu_device(row) if name == "CPU" else name)
    op_model = model.op_model(device.kind)
    if op_model is None:
        return None
    spec = Config.from_dict(row["config"]).to_spec()
    with _as_measured(row, name):
        trace, _, _ = model.trace(spec, exact=True, attention=_attention_mode(device))
    a, per = op_model.node_times(node_table(trace), device)
    phase_name = {code: phase for phase, code in COSTED.items()}
    out: dict[tuple[str, str], float] = {}
    for g, ph, secs in zip(a.group.tolist(), a.phase.tolist(), per.tolist()):
        key = (phase_name[ph], "optimizer" if ph == 2 else GROUPS[g])
        out[key] = out.get(key, 0.0) + secs
    return out


def compare(rows: Sequence[dict[str, Any]], model: Any) -> dict[str, Any]:
    """Per (phase, group): rows, measured and predicted seconds summed over rows, the
    median ratio; and per row the whole step (op sum against profiled ops)."""
    per_key: dict[tuple[str, str], dict[str, Any]] = {}
    steps: list[dict[str, Any]] = []
    skipped: list[str] = []
    for row in rows:
        try:
            pred = predicted_groups(row, model)
        except Exception as e:  # a row that cannot be traced is reported, not fatal
            skipped.append(f"{row.get('id')}: {type(e).__name__}: {str(e)[:120]}")
            continue
        if pred is None:
            skipped.append(f"{row.get('id')}: no op model for its device")
            continue
        meas = measured_groups(row["in_context"])
        for key in set(pred) | set(meas):
            d = per_key.setdefault(
                key, {"rows": 0, "measured": 0.0, "predicted": 0.0, "ratios": []}
            )
            m, p = meas.get(key, 0.0), pred.get(key, 0.0)
            d["rows"] += 1
            d["measured"] += m
            d["predicted"] += p
            if m > 1e-6 and p > 1e-6:
                d["ratios"].append(m / p)
        costed = sum(v for (ph, g), v in meas.items() if ph in COSTED and g != "outside ops")
        steps.append(
            {
                "id": row.get("id"),
                "family": row.get("family"),
                "device": row.get("device_name"),
                "op_sum": sum(pred.values()),
                "profiled_ops": costed,
                "step": (row.get("measurement") or {}).get("iteration_time"),
            }
        )
    return {"groups": per_key, "steps": steps, "skipped": skipped}


def markdown(res: dict[str, Any]) -> str:
    """The comparison as Markdown tables."""
    groups, steps = res["groups"], res["steps"]
    total = sum(d["measured"] for d in groups.values()) or 1.0
    lines = [
        f"# Ops in context against the op model ({len(steps)} rows)",
        "",
        "| phase | group | rows | share of profiled time | measured ms/step (mean) "
        "| predicted ms/step (mean) | measured / predicted (median) |",
        "|---|---|---|---|---|---|---|",
    ]
    for (phase, group), d in sorted(groups.items(), key=lambda kv: -kv[1]["measured"]):
        ratio = f"{np.median(d['ratios']):.2f}x" if d["ratios"] else "n/a"
        lines.append(
            f"| {phase} | {group} | {d['rows']} | {d['measured'] / total:.1%} | "
            f"{1e3 * d['measured'] / d['rows']:.3f} | {1e3 * d['predicted'] / d['rows']:.3f} | "
            f"{ratio} |"
        )
    if steps:
        fams: dict[str, list[float]] = {}
        for s in steps:
            if s["op_sum"] > 0 and s["profiled_ops"] > 0:
                fams.setdefault(str(s["family"]), []).append(s["profiled_ops"] / s["op_sum"])
        lines += [
            "",
            "Whole step, by family: the profiled time of the forward, backward and optimizer "
            "ops over the op model's sum for the same step (median over rows).",
            "",
            "| family | rows | profiled ops / op sum |",
            "|---|---|---|",
        ]
        lines += [f"| {f} | {len(v)} | {np.median(v):.2f}x |" for f, v in sorted(fams.items())]
    if res["skipped"]:
        lines += ["", f"{len(res['skipped'])} rows skipped: " + "; ".join(res["skipped"][:5])]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", nargs="*", help="jsonl.gz files (default data/**/*.jsonl.gz)")
    p.add_argument(
        "--model", default=None, help="a saved CostModel folder (default: the shipped one)"
    )
    p.add_argument("--out", default=None, help="also write the tables to this Markdown file")
    args = p.parse_args(argv)
    from costaware.core.model import CostModel
    from costaware.measure.collect import read_rows

    files = [Path(f) for f in args.data] or sorted((ROOT / "data").glob("**/*.jsonl.gz"))
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        print(f"no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    rows = [
        r
        for f in files
        for r in read_rows(f)
        if r.get("status") == "ok" and (r.get("in_context") or {}).get("status") == "ok"
    ]
    if not rows:
        print(
            "no rows with in-context op times: collect some with "
            "`costaware collect --in-context` (see data/README.md)",
            file=sys.stderr,
        )
        return 2
    model = CostModel.load(args.model) if args.model else CostModel.default()
    md = markdown(compare(rows, model))
    print(md)
    if args.out:
        Path(args.out).write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
