"""How much wider a time bound must be on a GPU the model has no rows of.

The leave-family-out predictions of ``benchmarks/accuracy.py`` on the GPU rows (each
family predicted by a model fitted on the other families, every device seen) against the
same rows predicted with the device unseen as well (for each device and family, a model
fitted on the other devices' rows of the other families): for each, the 95% quantile of
the absolute log error ``|log(predicted / measured)|`` of the iteration time, the spread a
two-sided 95% bound needs, and the mean relative error.

The ratio of the unseen 95% quantile of the absolute log error to the seen one (pooled
over the GPUs, and per GPU) is the spread a bound needs on a GPU without rows of its own
over the spread it is calibrated on: :data:`costaware.core.model.UNSEEN_DEVICE_WIDENING`
is the pooled ratio rounded up to 0.05 (docs/compare.md). The log error is taken both ways
because the direction a GPU of another generation errs in is not known. The mean relative
errors' ratio is printed alongside, for comparison with docs/accuracy.md.

For the bound the widening makes, it also prints the coverage of the upper bound on the
rows with neither the device nor the family seen: unwidened, widened by the shipped
constant, and widened by each GPU's own ratio applied to the other GPU's rows (the check
that is held out: the factor is measured on one GPU and judged on the other).

Usage:
    python benchmarks/unseen_device_bound.py [--cache FEATURES.json.gz] [--iterations 400]
        [--out FIGURES.json] [--rows PREDICTIONS.jsonl]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import accuracy as acc  # noqa: E402


def _spread(recs: list[dict[str, Any]], q: float = 0.95) -> dict[str, float]:
    t = [r for r in recs if r.get("secs") and r.get("p_secs")]
    if not t:  # a group with no timed rows: say so rather than stop the run
        nan = float("nan")
        return {"n": 0, "abs_log_q95": nan, "under_log_q95": nan, "mre": nan, "coverage": nan}
    logs = np.array([math.log(r["p_secs"] / r["secs"]) for r in t])
    return {
        "n": len(t),
        "abs_log_q95": float(np.quantile(np.abs(logs), q)),
        "under_log_q95": float(np.quantile(-logs, q)),  # what an upper bound must cover
        "mre": float(np.mean([abs(r["p_secs"] - r["secs"]) / r["secs"] for r in t])),
        "coverage": float(np.mean([r["secs"] <= r["p_secs_hi"] for r in t])),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", help="a features cache (.json.gz) to read and update")
    p.add_argument("--iterations", type=int, default=400)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", help="write the figures as JSON here")
    p.add_argument("--rows", help="write every prediction (one JSON object per row) here")
    args = p.parse_args(argv)

    files = sorted(
        f
        for f in (ROOT / "data" / "gpu").glob("*.jsonl.gz")
        if acc.ARCHIVE not in f.parts and acc.PROBES not in f.parts
    )
    cache = Path(args.cache) if args.cache else None
    _, obs, skipped = acc._gpu_observations(files, cache, trace_timeout=600.0)
    settings = {
        "iterations": args.iterations,
        "thread_count": args.threads,
        "time_baseline": "optime",
        "random_state": 0,
        "memory_model": "line",
    }
    seen = acc._evaluate(obs, "gpu", settings)["records"]
    unseen = acc._evaluate_unseen_devices(obs, "gpu", settings)
    out: dict[str, Any] = {
        "files": [acc._rel(f) for f in files],
        "skipped": len(skipped),
    }
    out["seen"] = _spread(seen)
    for dev, u in unseen.items():
        for how in ("families_seen", "families_unseen"):
            out[f"{dev}, {how}"] = _spread(u["records"][how])
    both = [r for u in unseen.values() for r in u["records"]["families_unseen"]]
    out["unseen, families unseen"] = _spread(both)
    out["ratio_abs_log_q95"] = (
        out["unseen, families unseen"]["abs_log_q95"] / out["seen"]["abs_log_q95"]
    )
    out["ratio_mre"] = out["unseen, families unseen"]["mre"] / out["seen"]["mre"]
    ratios: dict[str, float] = {}
    for dev, u in unseen.items():
        mine = _spread([r for r in seen if r["device"] == dev])
        out[f"{dev}, seen"] = mine
        ratios[dev] = _spread(u["records"]["families_unseen"])["abs_log_q95"] / mine["abs_log_q95"]
        out[f"{dev}, ratio_abs_log_q95"] = ratios[dev]
    out["coverage_widened"] = _widened_coverage(unseen, ratios)
    out["settings"] = {k: v for k, v in settings.items() if k != "thread_count"}
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.rows:
        with open(args.rows, "w") as f:
            for r in seen:
                f.write(json.dumps({"unseen_device": None, **r}) + "\n")
            for u in unseen.values():
                for how, recs in u["records"].items():
                    for r in recs:
                        f.write(json.dumps({"unseen_device": how, **r}) + "\n")
    return 0


def _widened(r: dict[str, Any], w: float) -> float:
    """``r``'s upper time bound widened ``w`` times in log terms, as the model widens it."""
    point = r["p_secs"]
    return float(point * (max(r["p_secs_hi"], point) / point) ** w)


def _widened_coverage(unseen: dict[str, Any], ratios: dict[str, float]) -> dict[str, Any]:
    """Coverage of the upper bound on each GPU's rows with neither it nor the family seen:
    unwidened, widened by the shipped constant, and widened by the other GPU's ratio."""
    from costaware.core.model import UNSEEN_DEVICE_WIDENING

    out: dict[str, Any] = {"shipped_widening": UNSEEN_DEVICE_WIDENING}
    for dev, u in unseen.items():
        t = [r for r in u["records"]["families_unseen"] if r.get("secs") and r.get("p_secs")]
        others = [w for d, w in ratios.items() if d != dev]
        row = {
            "n": len(t),
            "unwidened": float(np.mean([r["secs"] <= r["p_secs_hi"] for r in t])),
            "shipped": float(
                np.mean([r["secs"] <= _widened(r, UNSEEN_DEVICE_WIDENING) for r in t])
            ),
        }
        if others:
            row["other_gpu_ratio"] = max(others)
            row["by_other_gpu_ratio"] = float(
                np.mean([r["secs"] <= _widened(r, max(others)) for r in t])
            )
        out[dev] = row
    return out


if __name__ == "__main__":
    sys.exit(main())
