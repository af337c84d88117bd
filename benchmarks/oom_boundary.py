"""The memory decision at a card's edge: OOM-boundary probes, two decision rules, held out
by family.

The probes (``data/oom/*.jsonl.gz``, measured by ``bash data/gpu_window.sh oom`` with
:mod:`costaware.measure.oomprobe`) are training runs of one configuration per corpus family under
a memory cap (``torch.cuda.set_per_process_memory_fraction``), at batch sizes bisected to
within 6% of the largest that runs: every run either fitted or raised out of memory. A
rule is scored on both kinds: how many runs that ran out of memory it admits (must be 0)
and what share of the runs that fitted it rejects.

- **old**: admit when the calibrated upper bound of the *reserved peak* fits the cap
  (``Prediction.peak_memory_upper``).
- **new**: admit when the calibrated upper bound of the *smallest capacity the step runs
  in* fits the cap (``Prediction.min_capacity_upper``, what ``Budget`` decides on): the
  allocator gives back its cached blocks before it raises, so a step runs in less than
  its unlimited reserved peak.

**Held out by family:** for each probed family, the memory line and both bounds are
fitted on the GPU rows the shipped model learns from (:data:`CORPUS`) of the *other* families, as
``CostModel.fit`` fits them: a Theil-Sen line over the simulated reserved peak; its bound
cross-conformal by family at 95%; the capacity bound (:func:`costaware.core.model.capacity_quantile`)
over the measured allocated peaks. Then the family's probes are predicted from their own
dry runs. The probes themselves are never fitted on. The shipped model (fitted on every
corpus family) is shown beside it. A cap is the memory left to PyTorch's allocator (the
fraction does not cover the CUDA context), so no context is added here.

Usage:
    python benchmarks/oom_boundary.py [PROBES.jsonl.gz ...] [--json OUT.json] [--update-docs]

Without files it reads ``data/oom/*-oom-*.jsonl.gz`` (the probes) and
``data/oom/*-found-*.jsonl.gz`` (the sizes ``CostModel.max_batch_size`` found, each run
once under its cap: ``python -m costaware.measure.oomprobe --runs``).

The corpus rows' features come from the accuracy benchmark's cache in the temp folder
(``benchmarks/accuracy.py`` fills it; without it, each corpus row is dry-run once, about
20 minutes on 2 cores). With ``--update-docs`` the table replaces the marked section of
``docs/accuracy.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GiB = 1024**3
MiB = 1024**2
#: the GPU rows the shipped model's memory line and bounds learn from: the corpus shards
#: and the small models measured on a GPU (``data/README.md``)
CORPUS = ("data/gpu/*-shard*.jsonl.gz", "data/gpu/*-small-*.jsonl.gz")
START = "<!-- oom_boundary:start -->"
END = "<!-- oom_boundary:end -->"


def _probes(paths: Sequence[Path]) -> list[dict[str, Any]]:
    from costaware.measure.collect import read_rows

    rows = []
    for path in paths:
        gpu = ""
        for r in read_rows(path):
            if r.get("kind") == "context":  # each process's header: the GPU it ran on
                gpu = str(r.get("env", {}).get("gpu", ""))
            if r.get("kind") == "probe" and r.get("status") in ("fits", "oom"):
                rows.append({**r, "gpu_name": gpu})
    return rows


def _corpus_observations() -> list[Any]:
    """The GPU corpus rows with their features, dry-run once and cached.

    The features this needs (the simulated peaks) do not depend on an op-level time model,
    so the features the accuracy benchmark cached under any op model of this feature
    version are reused: they seed this benchmark's own cache.
    """
    import gzip

    from costaware.core.features import FEATURE_VERSION
    from costaware.core.model import CostModel
    from costaware.measure.collect import observations, read_rows

    rows = [
        r
        for pattern in CORPUS
        for f in sorted(glob.glob(str(ROOT / pattern)))
        for r in read_rows(f)
    ]
    temp = Path(tempfile.gettempdir())
    cache = temp / "costaware-oom-boundary" / "features.json.gz"
    seed = temp / "costaware-accuracy" / "features.json.gz"
    if not cache.is_file() and seed.is_file():
        stored = json.loads(gzip.decompress(seed.read_bytes())).get("versions", {})
        merged: dict[str, Any] = {}
        for version, section in stored.items():
            if version.split("+")[0] == FEATURE_VERSION:
                merged.update(section)
        cache.parent.mkdir(parents=True, exist_ok=True)
        payload = {"versions": {FEATURE_VERSION: merged}}
        cache.write_bytes(gzip.compress(json.dumps(payload).encode(), mtime=0))
    t0 = time.perf_counter()

    def progress(i: int, row: dict[str, Any]) -> None:
        print(f"  dry run of corpus row {i} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr)

    obs, _ = observations(rows, model=CostModel(trace_timeout=600.0), cache=cache, on_row=progress)
    return obs


@dataclasses.dataclass(frozen=True)
class _Fitted:
    """What the decision needs, fitted on some corpus rows."""

    line: Any  # the memory line (costaware.core.model._Affine)
    mem_q: float  # log factor of the reserved peak's bound
    cap_q: float  # the capacity bound's quantile
    rows: int


def _fit(obs: list[Any], coverage: float | None = None) -> _Fitted:
    from costaware.core.model import (
        _conformal_quantile,
        _fit_affine,
        benchmark_search_peak,
        capacity_quantile,
    )

    mem = [o for o in obs if o.peak_memory and not benchmark_search_peak(o.features)]
    base = np.asarray([o.features["analytic_reserved_mib"] * MiB for o in mem])
    measured = np.asarray([o.peak_memory for o in mem])
    fams = np.asarray([o.family for o in mem])
    line = _fit_affine(base, measured)
    oof = np.zeros(len(mem))  # cross-conformal by family, as fit does
    for fam in np.unique(fams).tolist():
        rest, out = fams != fam, fams == fam
        held = _fit_affine(base[rest], measured[rest])
        oof[out] = [held.correction(b) for b in base[out]]
    mem_q, _ = _conformal_quantile(np.log(measured / base) - oof, 0.95)
    pairs = [
        (
            o.features["analytic_allocated_mib"] * MiB * math.exp(line.correction(b)),
            o.peak_allocated,
        )
        for o, b in zip(mem, base, strict=True)
        if o.peak_allocated
    ]
    cap = (
        capacity_quantile(pairs)
        if coverage is None
        else capacity_quantile(pairs, coverage=coverage)
    )
    assert cap is not None
    return _Fitted(line=line, mem_q=float(mem_q), cap_q=float(cap[0]), rows=len(mem))


def _decide(fitted: _Fitted, basis: dict[str, Any]) -> tuple[float, float, float]:
    """(old upper bound, new upper bound, the capacity's point) in bytes from a
    prediction's simulated figures."""
    from costaware.core.model import CAPACITY_SHIFT

    sim_res = float(basis["simulated_reserved"])
    point = sim_res * math.exp(fitted.line.correction(sim_res))
    old = point * math.exp(max(fitted.mem_q, 0.0))
    capacity = min(float(basis["simulated_min_capacity"]) * point / sim_res, point)
    new = (capacity + CAPACITY_SHIFT) * math.exp(fitted.cap_q) - CAPACITY_SHIFT
    return old, min(max(new, capacity), old), capacity


def _score(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    fits = [r for r in rows if r["status"] == "fits"]
    ooms = [r for r in rows if r["status"] == "oom"]
    admitted_oom = sum(1 for r in ooms if r[key] <= r["cap"])
    rejected_fit = sum(1 for r in fits if r[key] > r["cap"])
    return {
        "oom": len(ooms),
        "fits": len(fits),
        "admitted_oom": admitted_oom,
        "rejected_fit": rejected_fit,
        "rejected_share": rejected_fit / len(fits) if fits else math.nan,
    }


def _coverage_table(rows: list[dict[str, Any]], levels: Sequence[float]) -> list[str]:
    """What the capacity bound at each coverage level (``new@<level>``) admits and rejects,
    and what the point itself does (``Budget(bound="point")``)."""
    lines = ["| coverage | admitted OOM | fits rejected |", "|---|---|---|"]
    for label, key in [
        *((f"{level:.1%}", f"new@{level}") for level in levels),
        ('the point (`Budget(bound="point")`)', "point"),
    ]:
        sc = _score(rows, key)
        lines.append(
            f"| {label} | {sc['admitted_oom']} / {sc['oom']} | "
            f"{sc['rejected_fit']} / {sc['fits']} ({_pct(sc['rejected_share'])}) |"
        )
    return lines


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}%"


def _table(results: list[dict[str, Any]], group: str, groups: Sequence[Any]) -> list[str]:
    lines = [
        f"| {group} | runs (fits / OOM) | old: admitted OOM | old: fits rejected | "
        "new: admitted OOM | new: fits rejected | shipped model, new: admitted OOM | "
        "shipped model, new: fits rejected |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in groups:
        rows = [r for r in results if g == "all" or r[group] == g]
        if not rows:
            continue
        old, new, shipped = (_score(rows, k) for k in ("old", "new", "shipped_new"))
        name = f"{g} GiB" if group == "cap_gib" and g != "all" else str(g)
        lines.append(
            f"| {name} | {new['fits']} / {new['oom']} | {old['admitted_oom']} | "
            f"{old['rejected_fit']} ({_pct(old['rejected_share'])}) | {new['admitted_oom']} | "
            f"{new['rejected_fit']} ({_pct(new['rejected_share'])}) | {shipped['admitted_oom']} | "
            f"{shipped['rejected_fit']} ({_pct(shipped['rejected_share'])}) |"
        )
    return lines


def safe_margin(oom_ratios: Sequence[float], fit_ratios: Sequence[float]) -> tuple[float, int]:
    """The smallest margin, in steps of 0.1%, at which a decision ``point x (1 + margin)
    <= cap`` admits none of the runs that ran out of memory, and the fitting runs it
    rejects; each ratio is a run's cap over its point. Chosen on these runs themselves,
    so an optimistic bound, not a rule (``alloc_fidelity.py`` scores its capacity points
    with it too)."""
    m = max(0.0, max(oom_ratios, default=1.0) - 1)
    m = math.floor(m * 1000 + 1) / 1000  # the next 0.1% step above it
    return m, sum(1 for x in fit_ratios if x < 1 + m)


def _floor(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The fewest fitting runs a single margin over the capacity's point (in 0.1% steps)
    can reject while it admits no run that ran out of memory (:func:`safe_margin`); what
    is left is the point's own error at the boundary."""
    fits = [r["cap"] / r["point"] for r in rows if r["status"] == "fits"]
    margin, rejected = safe_margin(
        [r["cap"] / r["point"] for r in rows if r["status"] == "oom"], fits
    )
    return {
        "margin": 1 + margin,
        "rejected": rejected,
        "fits": len(fits),
        "within_1pct": sum(
            1
            for r in rows
            if r["status"] == "fits"
            and r["measured_reserved"]
            and r["measured_reserved"] >= 0.99 * r["cap"]
        ),
    }


def _closest_call(rows: list[dict[str, Any]]) -> str:
    """How near the rule came to admitting a run that ran out of memory: per rule (held
    out, shipped), the OOM run whose upper bound lay closest above its cap (or under it:
    admitted). The rule's safety on these runs rests on that margin."""
    parts = []
    for key, name in (("new", "held out by family"), ("shipped_new", "the shipped model")):
        ooms = [(r[key] / r["cap"], r) for r in rows if r["status"] == "oom"]
        if not ooms:
            continue
        ratio, r = min(ooms, key=lambda pair: pair[0])
        where = f"{r['family']} at {r['cap_gib']} GiB, batch {r['batch_size']}"
        parts.append(
            f"{name}, {where}: its bound {'over' if ratio > 1 else 'under'} the cap by "
            f"{abs(ratio - 1):.2%}"
        )
    return (
        "**How near the rule came to admitting a run that ran out of memory** (the OOM run "
        "whose capacity bound lay closest to its cap): " + "; ".join(parts) + ". A change "
        "that moves the bound's margin over the point by that much at the card's scale (the "
        "memory line's slope, or the capacity quantile) decides whether such a run is "
        "admitted."
    )


#: a fitting run's reserved peak this far below the capacity simulated for it counts as
#: having run in less: more than 1%, twice the tolerance the capacity is bisected to
_UNDER = 0.99


def _ran_under(r: dict[str, Any]) -> float | None:
    """A fitting run's measured reserved peak over the capacity the allocator simulation
    says its step needs, that capacity taken in proportion to the measured allocated peak
    (so the dry run's own error in the live bytes cancels); None without the figures. The
    reserved peak is more than the step needed, never less: below 1, the simulation
    overstated the capacity (its replay packs the blocks worse than the allocator did)."""
    if not (r.get("measured_reserved") and r.get("measured_allocated")):
        return None
    if not (r.get("simulated_allocated") and r.get("simulated_min_capacity")):
        return None
    ratio = float(r["simulated_min_capacity"]) / float(r["simulated_allocated"])
    return float(r["measured_reserved"]) / (ratio * float(r["measured_allocated"]))


def _overstating(fits: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
    """The fitting runs of ``fits`` that held over 1% less than their simulated capacity,
    each with its :func:`_ran_under` ratio."""
    return [(r, u) for r in fits if (u := _ran_under(r)) is not None and u < _UNDER]


def _point_error_table(rows: list[dict[str, Any]], families: Sequence[str]) -> list[str]:
    """Per family, over its fitting runs: the dry run's simulated allocated peak against
    the measured one, the ratio of cap to the capacity's point (held out) on both sides
    of the boundary, and the fitting runs that held less reserved memory than the
    simulated capacity (:func:`_ran_under`)."""
    lines = [
        "| family | allocated peak: simulated / measured (fits) | cap / capacity point: "
        "smallest among fits | largest among OOMs | fits that ran in over 1% less than "
        "the simulated capacity |",
        "|---|---|---|---|---|",
    ]
    for fam in families:
        mine = [r for r in rows if r["family"] == fam]
        fits = [r for r in mine if r["status"] == "fits" and r["measured_allocated"]]
        if not fits:
            continue
        ratios = sorted(r["simulated_allocated"] / r["measured_allocated"] for r in fits)
        fit_r = min(r["cap"] / r["point"] for r in fits)
        oom_r = [r["cap"] / r["point"] for r in mine if r["status"] == "oom"]
        under = [u for _, u in _overstating(fits)]
        lines.append(
            f"| {fam} | {ratios[len(ratios) // 2]:.3f} (range {ratios[0]:.3f}-{ratios[-1]:.3f}) | "
            f"{fit_r:.3f} | {max(oom_r) if oom_r else math.nan:.3f} | "
            + (f"{len(under)} of {len(fits)} (down to {min(under):.3f}x)" if under else "0")
            + " |"
        )
    return lines


def _overstated(rows: list[dict[str, Any]]) -> str:
    """The sentence on the fitting runs that ran in less than the simulated capacity."""
    fits = [r for r in rows if r["status"] == "fits"]
    under = [r for r, _ in _overstating(fits)]
    if not under:
        return (
            "No fitting run held over 1% less reserved memory than the simulated capacity: "
            "where the point was over the cap, so were the predicted live bytes (the dry run's "
            "allocated peak, moved by the memory line)."
        )
    fams = sorted({str(r["family"]) for r in under})
    rejected = sum(1 for r in under if r["new"] > r["cap"])
    return (
        f"{len(under)} of the {len(fits)} fitting runs held over 1% less reserved memory than "
        f"the simulated capacity (last column; {', '.join(fams)}): there the allocator "
        "simulation itself overstated what the step needs, whatever the dry run's events; "
        f"{rejected} of them were rejected by the rule. Elsewhere a point over the cap came "
        "from the predicted live bytes (the dry run's allocated peak, moved by the memory "
        "line)."
    )


def _measured_runs(paths: Sequence[Path]) -> dict[tuple[str, int], dict[int, str]]:
    """Every run measured under a cap with the default allocator, by (configuration, cap):
    batch size -> "fits" or "oom". The probes' bisection runs, and the ``listed`` runs
    (``oomprobe --runs``: the sizes ``CostModel.max_batch_size`` found, each run once)."""
    from costaware.measure.collect import read_rows

    runs: dict[tuple[str, int], dict[int, str]] = {}
    for path in paths:
        for r in read_rows(path):
            if r.get("kind") not in ("probe", "listed") or r.get("status") not in ("fits", "oom"):
                continue
            if r.get("allocator", "default") != "default":
                continue
            key = (str(r["config_id"]), int(r["cap_bytes"]))
            runs.setdefault(key, {})[int(r["batch_size"])] = str(r["status"])
    return runs


def _outcome(size: int, measured: dict[int, str]) -> str:
    """What the runs say of batch size ``size``: ``"fits"`` or ``"oom"`` where it was run;
    ``"below a fit"`` under a size that ran (and over none that did not); ``"above an
    OOM"`` over a size that ran out of memory; else ``"not measured"``."""
    if size in measured:
        return measured[size]
    if any(s == "oom" and b < size for b, s in measured.items()):
        return "above an OOM"
    if any(s == "fits" and b > size for b, s in measured.items()):
        return "below a fit"
    return "not measured"


def _batch_size_searches(
    probes: list[dict[str, Any]], shipped: Any, runs: dict[tuple[str, int], dict[int, str]]
) -> list[dict[str, Any]]:
    """For each (configuration, cap) the probes bisected, the largest batch size that ran
    and the smallest that ran out of memory, against what ``CostModel.max_batch_size``
    (the shipped model) finds for a budget of the cap (plus the context the budget adds),
    with no headroom (``found_edge``) and with its default one (``found``), and what the
    measured runs say of each (:func:`_outcome`)."""
    import costaware as ca
    from costaware.measure.corpus import Config
    from costaware.measure.oomprobe import boundaries

    bounds = {
        key: {
            "family": b["row"]["family"],
            "config": b["row"]["config"],
            "gpu": b["row"]["gpu_name"],
            "fit": b["fit"],
            "oom": b["oom"],
        }
        for key, b in boundaries(
            r for r in probes if r.get("allocator", "default") == "default"
        ).items()
    }
    out = []
    for (cid, cap), b in sorted(bounds.items(), key=lambda kv: (kv[1]["family"], kv[0][1])):
        device = ca.get_device(b["gpu"] or "H200")
        budget = ca.Budget(max_memory=cap + device.context_overhead_bytes)
        spec = Config.from_dict(b["config"]).to_spec()
        edge = shipped.max_batch_size(spec, device, budget, headroom=0).batch_size
        found = shipped.max_batch_size(spec, device, budget).batch_size
        measured = runs.get((cid, cap), {})
        out.append(
            {
                **{k: v for k, v in b.items() if k != "config"},
                "cap": cap,
                "found_edge": edge,
                "edge_outcome": _outcome(edge, measured),
                "found": found,
                "outcome": _outcome(found, measured),
            }
        )
    return out


def _batch_size_table(searches: list[dict[str, Any]]) -> list[str]:
    from collections import Counter

    from costaware.core.batch_size import DEFAULT_HEADROOM

    complete = [s for s in searches if s["oom"] is not None and s["fit"] > 0]
    edge = Counter(s["edge_outcome"] for s in searches)
    kept = Counter(s["outcome"] for s in searches)
    ran_out = [s for s in searches if s["edge_outcome"] in ("oom", "above an OOM")]
    # of the sizes 1..largest that ran, the share the search leaves out (0 where it found
    # a size above the largest that ran: not counted as a loss)
    lost = [max(0, s["fit"] - s["found"]) / s["fit"] for s in complete]
    mean_lost = sum(lost) / len(lost) if lost else math.nan

    def counts(c: Counter[str]) -> str:
        order = ("fits", "below a fit", "not measured", "oom", "above an OOM")
        return ", ".join(f"{c[k]} {k}" for k in order if c[k])

    lines = [
        f"`CostModel.max_batch_size` (the shipped model, a budget of each cap) on the "
        f"{len(searches)} (configuration, cap) pairs the probes bisected. Its search ends "
        "where the predicted need meets the limit, the one place a study's own decision "
        "rarely lands, and where the capacity bound (calibrated on uncapped runs) does not "
        "cover the allocator simulation's own error under a cap (next section). **Without "
        f"headroom** (the size where the predicted need meets the cap), each size found was "
        f"run once under its cap (`python -m costaware.measure.oomprobe --runs "
        f"data/oom/h200-found-runs.json`, `data/oom/h200-found-seed0.jsonl.gz`): "
        f"{counts(edge)}"
        + (
            " ("
            + "; ".join(
                f"{s['family']} at {s['cap'] / GiB:.0f} GiB, batch {s['found_edge']}"
                + (f", where {s['fit']} had fitted" if s["fit"] > s["found_edge"] else "")
                for s in ran_out
            )
            + "; near a cap, whether a step fits is not monotone in the batch size to the "
            "sample)"
            if ran_out
            else ""
        )
        + f". **With the default headroom** (the step's need grown by {DEFAULT_HEADROOM:.0%}: "
        "`headroom=`, `--headroom`, `CostAwareBatchSizeFinder(headroom=)`; set from the "
        "allocator simulation's largest miss on the recorded boundary runs, not from these "
        f"runs): {counts(kept)}; where not run, what the measured runs of the "
        "same configuration and cap say (below a size that ran, above one that did not). "
        "Of the batch sizes that ran (1 to the largest), the ones above the size found "
        f"are a mean {_pct(mean_lost)} of the range (at most "
        f"{_pct(max(lost) if lost else math.nan)}): what a study drawing batch sizes "
        "uniformly would lose at the edge.",
        "",
        "| family | cap | largest that ran | smallest OOM | found, no headroom | found |",
        "|---|---|---|---|---|---|",
    ]
    for s in searches:
        oom = s["oom"] if s["oom"] is not None else "none"
        lines.append(
            f"| {s['family']} | {s['cap'] / GiB:.0f} GiB | {s['fit']} | {oom} | "
            f"{s['found_edge']} ({s['edge_outcome']}) | {s['found']} ({s['outcome']}) |"
        )
    return [*lines, ""]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("probes", nargs="*", help="probe files (default data/oom/*.jsonl.gz)")
    p.add_argument("--json", help="write every probe's figures and the scores here")
    p.add_argument(
        "--update-docs", action="store_true", help="replace the marked section of docs/accuracy.md"
    )
    args = p.parse_args(argv)
    from costaware.core.model import CostModel
    from costaware.measure.corpus import Config

    oom = ROOT / "data" / "oom"
    # the probes, and the runs of the sizes max_batch_size found (the allocator's event
    # records there are benchmarks/alloc_fidelity.py's)
    paths = [Path(f) for f in args.probes] or sorted(
        [*oom.glob("*-oom-*.jsonl.gz"), *oom.glob("*-found-*.jsonl.gz")]
    )
    probes = _probes(paths)
    if not probes:
        print("no probe rows: run `bash data/gpu_window.sh oom` on a GPU first", file=sys.stderr)
        return 2
    print(f"{len(probes)} probe runs from {len(paths)} file(s); corpus features", file=sys.stderr)
    obs = [o for o in _corpus_observations() if o.device != "CPU"]
    families = sorted({str(r["family"]) for r in probes})
    fitted = {f: _fit([o for o in obs if o.family != f]) for f in families}
    levels = (0.8, 0.9, 0.95, 0.99, 0.999)
    sensitivity = {
        level: {f: _fit([o for o in obs if o.family != f], level) for f in families}
        for level in levels
    }
    analytic, shipped = CostModel(trace_timeout=600.0), CostModel.default()
    results = []
    t0 = time.perf_counter()
    for i, r in enumerate(probes):
        cfg = dataclasses.replace(Config.from_dict(r["config"]), batch_size=int(r["batch_size"]))
        spec = cfg.to_spec()
        device = r["gpu_name"] or "H200"
        basis = analytic.predict(spec, device).basis
        old, new, point = _decide(fitted[r["family"]], dict(basis))
        by_level = {
            f"new@{level}": _decide(sensitivity[level][r["family"]], dict(basis))[1]
            for level in levels
        }
        ship = shipped.predict(spec, device)
        results.append(
            {
                "family": r["family"],
                "config_id": r["config_id"],
                "allocator": r.get("allocator", "default"),
                "cap": int(r["cap_bytes"]),
                "cap_gib": round(r["cap_bytes"] / GiB),
                "batch_size": int(r["batch_size"]),
                "status": r["status"],
                "measured_allocated": r.get("max_allocated"),
                "measured_reserved": r.get("max_reserved"),
                "old": old,
                "new": new,
                "point": point,
                "shipped_old": ship.peak_memory_upper,
                "shipped_new": ship.min_capacity_upper,
                "simulated_min_capacity": basis["simulated_min_capacity"],
                "simulated_allocated": basis["simulated_allocated"],
                **by_level,
            }
        )
        if (i + 1) % 50 == 0:
            print(f"  {i + 1} probes ({time.perf_counter() - t0:.0f}s)", file=sys.stderr)
    searches = _batch_size_searches(probes, shipped, _measured_runs(paths))
    default = [x for x in results if x["allocator"] == "default"]
    expandable = [x for x in results if x["allocator"] != "default"]
    caps = sorted({x["cap_gib"] for x in default})
    lines = [
        START,
        "## The memory decision at the card's edge (OOM-boundary probes)",
        "",
        f"Generated by `python benchmarks/oom_boundary.py --update-docs` from "
        f"{', '.join(p.relative_to(ROOT).as_posix() for p in paths)}: {len(default)} runs "
        "with the default allocator, one configuration per corpus family, each at batch "
        "sizes bisected to within 6% of the largest that runs under a cap "
        "(`set_per_process_memory_fraction`). Held out by family: the memory line and both "
        "bounds were fitted on the other families' GPU rows that the shipped model learns "
        "from, the corpus and the small models (`docs` of the script). "
        "*old* admits when the reserved peak's upper bound fits the cap, *new* when the "
        "upper bound of the smallest capacity the step runs in does (what `Budget` "
        "checks). The target is 0 admitted OOMs and at most 5% of the fitting runs rejected.",
        "",
        *_table(default, "cap_gib", [*caps, "all"]),
        "",
        "By family (held out), all caps:",
        "",
        *_table(default, "family", families),
        "",
    ]
    from costaware.core.model import CAPACITY_COVERAGE

    lines += [
        "The capacity bound's coverage against the two errors (held out by family, default "
        f"allocator, all caps; the shipped rule calibrates at {CAPACITY_COVERAGE:.0%}, chosen "
        "before these probes were measured: an OOM costs a trial, a rejection one "
        "configuration of many):",
        "",
        *_coverage_table(default, levels),
        "",
    ]
    floor = _floor(default)
    lines += [
        "**What limits the rule: the point at the boundary, not the bound's calibration.** "
        f"No single margin over the capacity's point does much better on these runs: the "
        f"smallest margin that admits none of the {sum(r['status'] == 'oom' for r in default)} "
        "runs that ran out of memory, chosen on these runs themselves (so optimistic), is "
        f"x{floor['margin']:.3f}, and it rejects {floor['rejected']} of the {floor['fits']} "
        f"fitting runs ({_pct(floor['rejected'] / max(floor['fits'], 1))}). The bisection puts "
        f"the fitting runs at the edge: {floor['within_1pct']} of them held 99% or more of "
        "their cap (measured reserved peak), so at most 5% of them rejected needs a capacity "
        "right to about 1%. Per family (held out), the dry run's allocated peak against the "
        "measured one, and the ratio of cap to the capacity's point on each side of the "
        "boundary (a fit below 1: the point was over the cap; an OOM above 1: under it):",
        "",
        *_point_error_table(default, families),
        "",
        _closest_call(default),
        "",
        _overstated(default),
        "Which allocations the simulation places differently, these runs cannot say; the "
        "allocator's own events at each boundary can (`bash data/gpu_window.sh "
        "alloctrace`, then `python benchmarks/alloc_fidelity.py`: the next section).",
        "",
    ]
    lines += _batch_size_table(searches)
    if expandable:
        lines += [
            f"With `expandable_segments:True` ({len(expandable)} runs, six families at 12 GiB):",
            "",
            *_table(expandable, "cap_gib", ["all"]),
            "",
        ]
    lines.append(END)
    text = "\n".join(lines)
    print(text)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "probes": results,
                    "fitted": {
                        f: dataclasses.asdict(v) | {"line": vars(v.line)} for f, v in fitted.items()
                    },
                },
                indent=1,
            )
        )
    if args.update_docs:
        from _docs import splice

        splice(ROOT / "docs" / "accuracy.md", text, START, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
