"""Which model misses at the card's edge: the allocator simulation, or the dry run's events?

The capacity decision (``Prediction.min_capacity``, ``benchmarks/oom_boundary.py``)
replays the dry run's allocation events through a simulation of PyTorch's caching
allocator under a cap. Its error at the boundary has two sources that the probes cannot
tell apart. This script reads the allocator's own event streams recorded on a GPU at
each probed boundary (``bash data/gpu_window.sh alloctrace``,
:mod:`costaware.measure.alloctrace`) and separates them:

- **the allocator model**: the *real* events replayed through the simulation. Uncapped,
  its reserved peak against the one measured; capped, whether its smallest capacity
  (:func:`costaware.core.allocator.min_capacity`) puts the run on the side of the cap the
  real run was on (a fit at or under the cap, an OOM over it).
- **the dry run's events**: the same figures from the dry run of the configuration
  (``CostModel().predict``'s simulated allocated peak and capacity, the workspace
  included), and the largest real allocations the dry run has no allocation of the same
  size for, with the Python frames that made them.

Usage:
    python benchmarks/alloc_fidelity.py [TRACES.jsonl.gz ...] [--json OUT.json] [--update-docs]

With ``--update-docs`` its summary (:func:`summary`) replaces the marked section of
``docs/accuracy.md``; the full tables are the printed output.

Without files it reads ``data/oom/*-alloctrace-*.jsonl.gz``. No model is fitted and no
figure is tuned here: both replays are the simulation as it ships.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import oom_boundary

ROOT = Path(__file__).resolve().parent.parent
GiB = 1024**3
MiB = 1024**2
#: two allocations of this relative size difference or less count as the same size
SAME_SIZE = 0.01
#: real allocations listed per run as missing from the dry run
MISSING_SHOWN = 3
START = "<!-- alloc_fidelity:start -->"
#: the docs section's heading
TITLE = "Where the capacity decision misses: the allocator model or the dry run"
END = "<!-- alloc_fidelity:end -->"


def missing_allocations(
    real: Sequence[tuple[int, int]],
    traced: Sequence[tuple[int, int]],
    frames_of: dict[int, str] | None = None,
    *,
    shown: int = MISSING_SHOWN,
) -> list[dict[str, Any]]:
    """The largest allocation sizes of ``real`` (``(key, bytes)`` events) that no
    allocation of ``traced`` matches within :data:`SAME_SIZE`: ``bytes``, how many times
    the real run allocated that size, and the frame of its first allocation (from
    ``frames_of``, by position in ``real``) where known."""
    sizes = sorted({n for _, n in traced if n > 0})
    seen: dict[int, dict[str, Any]] = {}
    for i, (_, n) in enumerate(real):
        if n <= 0:
            continue
        j = bisect.bisect_left(sizes, n * (1 - SAME_SIZE))
        if j < len(sizes) and sizes[j] <= n * (1 + SAME_SIZE):
            continue
        entry = seen.setdefault(n, {"bytes": n, "count": 0, "frame": None})
        entry["count"] += 1
        if entry["frame"] is None and frames_of is not None:
            entry["frame"] = frames_of.get(i)
    return sorted(seen.values(), key=lambda e: -e["bytes"])[:shown]


def analyse(row: dict[str, Any], traced_events: Any, basis: dict[str, Any]) -> dict[str, Any]:
    """One recorded run against the simulation of its real events and against its dry
    run (``traced_events``: the dry run's allocation events; ``basis``: its prediction's
    basis, with the simulated figures)."""
    from costaware.core.allocator import min_capacity, simulate
    from costaware.measure.alloctrace import real_events

    history = row["history"]
    events, info = real_events(history)
    # the run's allocator mode, as its configuration (and the recording process) had it
    mode = str(row.get("config", {}).get("allocator") or "default")
    uncapped = simulate(events, mode)
    capacity = min_capacity(events, mode, uncapped=uncapped)
    cap = int(row["cap_bytes"]) if row.get("capped") else None
    frames = history.get("frames", [])
    frames_of = {i: frames[f] for i, f in info["frame_at"].items() if 0 <= f < len(frames)}
    out = {
        "family": row["family"],
        "config_id": row["config_id"],
        "allocator": mode,
        # "fits" / "oom": a side of a probed boundary; "listed": a run recorded for itself
        "probed": row.get("probed"),
        "config": row.get("config", {}),
        "batch_size": int(row["batch_size"]),
        "cap": cap,
        "status": row["status"],
        "measured_allocated": row.get("max_allocated"),
        "measured_reserved": row.get("max_reserved"),
        "real_allocated": uncapped.peak_allocated,
        "real_reserved": uncapped.peak_reserved,
        "real_capacity": capacity,
        # the same events with each new segment below the earlier ones (SEGMENT_ORDERS)
        # (default mode only: expandable segments grow one segment per pool)
        "real_reserved_descending": simulate(
            events, mode, segment_order="descending"
        ).peak_reserved,
        "dry_allocated": int(basis["simulated_allocated"]),
        "dry_reserved": int(basis["simulated_reserved"]),
        "dry_capacity": int(basis["simulated_min_capacity"]),
        "unknown_frees": info["unknown_frees"],
        "caught_ooms": info["caught_ooms"],
        "oom_request": info["oom_request"],
        "missing": missing_allocations(events, traced_events, frames_of),
    }
    # the dry run's reserved peak with its new segments placed below: the workspaces the
    # prediction adds to the replay are the same in either order
    out["dry_reserved_descending"] = (
        out["dry_reserved"]
        - simulate(traced_events, mode).peak_reserved
        + simulate(traced_events, mode, segment_order="descending").peak_reserved
    )
    if cap is not None and row["status"] in ("fits", "oom"):
        fitted = row["status"] == "fits"
        # right when the capacity falls on the side of the cap the real run was on
        out["real_right"] = (capacity <= cap) == fitted
        out["dry_right"] = (out["dry_capacity"] <= cap) == fitted
        # the real events replayed under the cap itself: whether a step fits is not quite
        # monotone in the capacity, so this can differ from the capacity's side of the cap
        out["real_replay_right"] = simulate(events, mode, capacity=cap).fits == fitted
        out["real_replay_right_descending"] = (
            simulate(events, mode, capacity=cap, segment_order="descending").fits == fitted
        )
    return out


#: the margins over a capacity point that :func:`margin_table` scores
MARGINS = (0.0, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03)


def margin_table(
    results: Sequence[dict[str, Any]], margins: Sequence[float] = MARGINS
) -> list[dict[str, Any]]:
    """What a decision at ``capacity x (1 + margin) <= cap`` would do on the capped runs,
    with each capacity as its point: the one from the real events (what a dry run that
    allocated exactly as the GPU did would give the allocator simulation) and the dry
    run's. Per margin and point: ``fits_rejected`` of ``fits`` and ``ooms_admitted`` of
    ``ooms``. No bound is fitted here: the margins are the same for every run."""
    capped = [r for r in results if r["cap"] is not None and r["status"] in ("fits", "oom")]
    fits = [r for r in capped if r["status"] == "fits"]
    ooms = [r for r in capped if r["status"] == "oom"]
    table = []
    for point in ("real", "dry"):
        key = f"{point}_capacity"
        for m in margins:
            table.append(
                {
                    "point": point,
                    "margin": m,
                    "fits": len(fits),
                    "fits_rejected": sum(r[key] * (1 + m) > r["cap"] for r in fits),
                    "ooms": len(ooms),
                    "ooms_admitted": sum(r[key] * (1 + m) <= r["cap"] for r in ooms),
                }
            )
    return table


def safe_margin(results: Sequence[dict[str, Any]], point: str) -> tuple[float, int, int] | None:
    """:func:`oom_boundary.safe_margin` over ``point``'s capacity ("real" or "dry") on the
    capped runs: the margin, the fits it rejects and the fits there are; None without both
    kinds of run."""
    key = f"{point}_capacity"
    capped = [r for r in results if r["cap"] is not None]
    ooms = [r["cap"] / r[key] for r in capped if r["status"] == "oom"]
    fits = [r["cap"] / r[key] for r in capped if r["status"] == "fits"]
    if not ooms or not fits:
        return None
    return (*oom_boundary.safe_margin(ooms, fits), len(fits))


def _ratio(a: Any, b: Any) -> str:
    return f"{a / b:.3f}" if a and b else "n/a"


def report(results: list[dict[str, Any]]) -> list[str]:
    """The tables: per capped run, which model put it on the right side of the cap; per
    uncapped run, the reserved peak of each replay against the measured one."""
    capped = [r for r in results if r["cap"] is not None and r.get("real_right") is not None]
    lines = [
        f"## {TITLE}",
        "",
        "Generated by `python benchmarks/alloc_fidelity.py` from the allocator's own events "
        "(`torch.cuda.memory._record_memory_history`) at the probed boundaries. *real* replays "
        "the recorded events through the simulation; *dry run* is the prediction's own "
        "simulation of the dry run's events. A run is decided right when the smallest "
        "capacity falls on the side of the cap the real run was on.",
        "",
    ]
    if capped:
        real_ok = sum(1 for r in capped if r["real_right"])
        dry_ok = sum(1 for r in capped if r["dry_right"])
        caught = [r for r in capped if r.get("caught_ooms")]
        real_off = [r["real_capacity"] / r["cap"] for r in capped if not r["real_right"]]
        lines += [
            f"Of {len(capped)} capped runs, the allocator model on the real events puts "
            f"{real_ok} on the right side of the cap, the dry run {dry_ok}."
            + (
                f" The model's misses on the real events lie between x{min(real_off):.3f} "
                f"and x{max(real_off):.3f} of the cap (capacity / cap)."
                if real_off
                else ""
            )
            + (
                f" In {len(caught)} runs cuDNN asked for a workspace the cap refused and "
                "went on with an algorithm that needs less (the allocator gave back its "
                "cached memory first); the replay leaves the refused request out and keeps "
                "the release."
                if caught
                else ""
            ),
            "",
            "| family | cap | batch | ran | capacity: real events / cap | capacity: dry run / cap "
            "| allocated: dry run / measured | largest real allocation the dry run lacks |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in capped:
            miss = r["missing"][0] if r["missing"] else None
            lacks = (
                f"{miss['bytes'] / MiB:.0f} MiB x{miss['count']} ({miss['frame'] or 'no frame'})"
                if miss
                else "none"
            )
            lines.append(
                f"| {r['family']} | {r['cap'] / GiB:.0f} GiB | {r['batch_size']} | {r['status']} | "
                f"{_ratio(r['real_capacity'], r['cap'])}{'' if r['real_right'] else ' (wrong)'} | "
                f"{_ratio(r['dry_capacity'], r['cap'])}{'' if r['dry_right'] else ' (wrong)'} | "
                f"{_ratio(r['dry_allocated'], r['measured_allocated'])} | {lacks} |"
            )
        lines.append("")
        lines += _margin_lines(results, capped)
    free = [r for r in results if r["cap"] is None and r["status"] == "fits"]
    if free:
        lines += [
            "Without a cap: the reserved peak of each replay against the measured one.",
            "",
            "| family | batch | real events / measured | real events, new segments below "
            "/ measured | dry run / measured |",
            "|---|---|---|---|---|",
        ]
        for r in free:
            lines.append(
                f"| {r['family']} | {r['batch_size']} | "
                f"{_ratio(r['real_reserved'], r['measured_reserved'])} | "
                f"{_ratio(r.get('real_reserved_descending'), r['measured_reserved'])} | "
                f"{_ratio(r['dry_reserved'], r['measured_reserved'])} |"
            )
        lines.append("")
    return lines


def summary(results: list[dict[str, Any]], sources: Sequence[str]) -> list[str]:
    """The docs' section: how close the allocator model is on the real events, how far
    the dry run's capacity lies from theirs (by family), and the cuDNN workspaces a cap
    refused; runs with the default allocator, and a paragraph of their own for runs with
    expandable segments."""
    import statistics

    listed = [r for r in results if r.get("probed") == "listed"]
    results = [r for r in results if r.get("probed") != "listed"]
    expandable = [r for r in results if r.get("allocator") == "expandable_segments"]
    results = [r for r in results if r.get("allocator") != "expandable_segments"]
    capped = [r for r in results if r["cap"] is not None and r.get("real_right") is not None]
    free = [r for r in results if r["cap"] is None and r["status"] == "fits"]
    if not capped or not free:
        extra = _expandable_lines(expandable) + _listed_lines(listed)
        if not extra:
            return [START, "No recorded boundary runs.", END]
        return [START, f"## {TITLE}", "", *extra, "", END]
    uncapped = sorted((r["real_reserved"] / r["measured_reserved"], r["family"]) for r in free)
    close = [x for x, _ in uncapped if abs(x - 1) <= 0.003]
    others = ", ".join(f"x{x:.3f} {f}" for x, f in uncapped if abs(x - 1) > 0.003)
    real_off = sorted((r["real_capacity"] / r["cap"], r) for r in capped if not r["real_right"])
    under = [(x, r) for x, r in real_off if r["status"] == "oom"]
    dry_wrong = [r for r in capped if not r["dry_right"]]
    ratio = [r["dry_capacity"] / r["real_capacity"] for r in capped]
    by_family: dict[str, list[float]] = {}
    for r in capped:
        by_family.setdefault(r["family"], []).append(r["dry_capacity"] / r["real_capacity"])
    medians = {f: statistics.median(v) for f, v in by_family.items()}
    low = sorted((m, f) for f, m in medians.items() if m < 0.99)
    high = sorted(((max(v), f) for f, v in by_family.items() if max(v) > 1.05), reverse=True)
    caught = [r for r in capped if r.get("caught_ooms")]
    lines = [
        START,
        f"## {TITLE}",
        "",
        "Generated by `python benchmarks/alloc_fidelity.py --update-docs` from the caching "
        "allocator's own events (`torch.cuda.memory._record_memory_history`) recorded at "
        "every boundary the probes above bisected (`bash data/gpu_window.sh alloctrace`: "
        f"{', '.join(sources)}): the largest batch size that fitted and the smallest that "
        "ran out of memory under each cap, and the largest that fitted without one, "
        f"{len(results)} runs. Each run's real events are replayed through the allocator "
        "simulation as it ships, with the dry run's own simulation beside them (the full "
        "tables are the script's output).",
        "",
        "- **The allocator model is close uncapped; the dry run's events less so.** "
        f"Without a cap, the real events replayed give the measured reserved peak to within "
        f"0.3% in {len(close)} of {len(uncapped)} runs"
        + (f" (the others: {others})" if others else "")
        + ". Under a cap, the smallest capacity from the real events puts "
        f"{len(capped) - len(real_off)} of the {len(capped)} runs on the side of the cap they "
        "ran on"
        + (
            f"; its misses lie between x{real_off[0][0]:.3f} and x{real_off[-1][0]:.3f} of the "
            "cap (capacity / cap)"
            if real_off
            else ""
        )
        + (
            f", the largest under-statement a run that ran out of memory at "
            f"{1 / under[0][0] - 1:.1%} over the capacity replayed ({under[0][1]['family']}, "
            f"{under[0][1]['cap'] / GiB:.0f} GiB)"
            if under
            else ""
        )
        + f". The dry run's capacity puts {len(capped) - len(dry_wrong)} of the "
        f"{len(capped)} on the right side, "
        f"{sum(r['status'] == 'oom' for r in dry_wrong)} of its {len(dry_wrong)} misses runs "
        "that ran out of memory: against the capacity from the real events it is a median "
        f"x{statistics.median(ratio):.3f} (x{min(ratio):.3f}-x{max(ratio):.3f}), within 1% "
        f"in {sum(abs(x - 1) <= 0.01 for x in ratio)} runs and within 2% in "
        f"{sum(abs(x - 1) <= 0.02 for x in ratio)}."
        + (
            " Low by family (median): " + ", ".join(f"{f} x{m:.3f}" for m, f in low) + "."
            if low
            else ""
        )
        + (
            " High at some sizes: " + ", ".join(f"{f} up to x{m:.3f}" for m, f in high) + "."
            if high
            else ""
        ),
    ]
    lines += _order_lines(free, capped)
    lines += _margin_lines(results, capped)
    lines += _expandable_lines(expandable)
    lines += _listed_lines(listed)
    if caught:
        fams = sorted({r["family"] for r in caught})
        lines.append(
            f"- **cuDNN workspaces under a cap.** In {len(caught)} runs ({', '.join(fams)}) "
            "cuDNN asked for a convolution workspace the cap refused, caught the error and "
            f"took an algorithm that needs less (up to {max(r['caught_ooms'] for r in caught)} "
            "refusals a run; `num_ooms` counts them although the run goes on). The allocator "
            "gives its cached memory back before each refusal; the replay keeps that release "
            "(`costaware.core.allocator.RELEASE_CACHED`) and leaves the refused request out."
        )
    return [*lines, "", END]


def _order_lines(free: Sequence[dict[str, Any]], capped: Sequence[dict[str, Any]]) -> list[str]:
    """The summary's paragraph on where the driver puts a new segment
    (:data:`costaware.core.allocator.SEGMENT_ORDERS`)."""
    if not all("real_reserved_descending" in r for r in free):
        return []

    def off(r: dict[str, Any], key: str) -> float:
        return abs(r[key] / r["measured_reserved"] - 1)

    below = sum(off(r, "real_reserved_descending") <= 0.003 for r in free)
    exact = sum(r["real_reserved_descending"] == r["measured_reserved"] for r in free)
    above = sum(off(r, "real_reserved") <= 0.003 for r in free)
    right_below = sum(bool(r.get("real_replay_right_descending")) for r in capped)
    right_above = sum(bool(r.get("real_replay_right")) for r in capped)
    # the runs whose dry-run reserved peak the order moves
    changed = [r for r in free if r.get("dry_reserved_descending") not in (None, r["dry_reserved"])]
    moved = [r["dry_reserved_descending"] / r["dry_reserved"] for r in changed]
    closer = sum(off(r, "dry_reserved_descending") < off(r, "dry_reserved") for r in changed)
    return [
        "- **Where the driver puts a new segment.** The allocator takes the lowest-addressed "
        "of equally sized free blocks, so which one it takes depends on the addresses the "
        "CUDA driver gave their segments, which no replay knows. Replayed with each new "
        'segment below the earlier ones (`simulate(..., segment_order="descending")`), '
        f"the real events give the measured reserved peak to within 0.3% in {below} of the "
        f"{len(free)} uncapped runs (exactly in {exact}), against {above} with each above "
        f"(the shipped order); under their own cap they put {right_below} of the "
        f"{len(capped)} runs on the right side, against {right_above}: after a release the "
        "driver hands freed addresses out again, in an order neither rule follows. The dry "
        "run's events are not the GPU's: placed below, the dry run's reserved peak of the "
        + (
            f"same uncapped runs moves in {len(moved)} (x{min(moved):.3f}-x{max(moved):.3f}), "
            f"closer to the measured one in {closer}"
            if moved
            else "same uncapped runs does not move"
        )
        + ", and the shipped predictions keep the order their memory line was fitted with.",
    ]


def _expandable_lines(results: Sequence[dict[str, Any]]) -> list[str]:
    """The summary's paragraph on the runs recorded with expandable segments: the
    allocator model on their real events, uncapped and under their cap, and the margins
    that admit none of their OOMs (:func:`safe_margin`)."""
    capped = [r for r in results if r["cap"] is not None and r.get("real_right") is not None]
    free = [r for r in results if r["cap"] is None and r["status"] == "fits"]
    if not capped or not free:
        return []
    close = sum(abs(r["real_reserved"] / r["measured_reserved"] - 1) <= 0.003 for r in free)
    replay_right = sum(bool(r.get("real_replay_right")) for r in capped)
    real, dry = safe_margin(results, "real"), safe_margin(results, "dry")
    text = (
        f"- **With expandable segments** ({len(results)} runs; one segment per pool, so "
        "no driver address decides a tie). Without a cap, the real events replayed give the "
        f"measured reserved peak to within 0.3% in {close} of {len(free)} runs; under their "
        f"cap they put {replay_right} of the {len(capped)} runs on the right side"
    )
    if real is not None and dry is not None:
        text += (
            f". The smallest margin that admits none of their OOMs is x{1 + real[0]:.3f} over "
            f"the real events' capacity (rejecting {real[1]} of {real[2]} fits) and "
            f"x{1 + dry[0]:.3f} over the dry run's ({dry[1]})"
        )
    return [text + "."]


def _listed_lines(results: Sequence[dict[str, Any]]) -> list[str]:
    """The summary's paragraph on the recurrent runs recorded for themselves
    (``alloctrace --rnn-layers``): the dry run's allocated peak against the measured one,
    by cell and number of layers, and the largest real allocation the dry run lacks."""
    import statistics

    runs = [r for r in results if r.get("measured_allocated")]
    if not runs:
        return []
    groups: dict[tuple[str, int], list[float]] = {}
    for r in runs:
        kw = r.get("config", {}).get("kwargs", {})
        key = (str(kw.get("kind", "?")), int(kw.get("layers", 0)))
        groups.setdefault(key, []).append(r["dry_allocated"] / r["measured_allocated"])
    by_group = ", ".join(
        f"{kind} x{layers} {statistics.median(v):.3f}"
        for (kind, layers), v in sorted(groups.items())
    )
    missing = [m for r in runs for m in r.get("missing", [])[:1]]
    largest = max(missing, key=lambda m: m["bytes"], default=None)
    text = (
        f"- **Recurrent layers as cuDNN runs them** ({len(runs)} uncapped runs of LSTM and GRU "
        "language models, 1-4 layers, `python -m costaware.measure.alloctrace --rnn-layers`). "
        f"The dry run's allocated peak against the measured one, median by cell and layers: "
        f"{by_group}."
    )
    if largest is not None:
        text += (
            f" The largest real allocation the dry run has none of the size of: "
            f"{largest['bytes'] / MiB:.0f} MiB ({largest['frame'] or 'no frame'})."
        )
    return [text]


def _margin_lines(results: Sequence[dict[str, Any]], capped: Sequence[dict[str, Any]]) -> list[str]:
    """The summary's paragraph and table on what a margin over each capacity point does
    (:func:`margin_table`, :func:`safe_margin`)."""
    real, dry = safe_margin(results, "real"), safe_margin(results, "dry")
    if real is None or dry is None:
        return []
    import statistics

    n_fits = real[2]
    n_ooms = sum(r["status"] == "oom" for r in capped)
    need = {
        status: statistics.median(
            r["real_capacity"] / r["cap"] for r in capped if r["status"] == status
        )
        for status in ("fits", "oom")
    }
    replay_right = sum(bool(r.get("real_replay_right")) for r in capped)
    rows = {(t["point"], t["margin"]): t for t in margin_table(results)}
    lines = [
        "- **What a dry run that allocated exactly as the GPU does would leave.** With the "
        "capacity from the real events as the point, the smallest margin over it that admits "
        f"none of the {n_ooms} runs that ran out of memory (chosen on these runs themselves, "
        f"so an optimistic one) is x{1 + real[0]:.3f}, and it rejects {real[1]} of the "
        f"{n_fits} that fitted; the dry run's own capacity needs x{1 + dry[0]:.3f} and "
        f"rejects {dry[1]}. By the real events, the runs that fitted needed a median "
        f"x{need['fits']:.3f} of their cap and those that ran out of memory x{need['oom']:.3f}: "
        "at a bisected boundary most fits lie within a percent or two of the cap, so any "
        "margin that size rejects most of them, however exact the point. And the allocator "
        f"simulation, given the real events, puts {replay_right} of the {len(capped)} runs "
        "on the right side replayed under their own cap, its misses up to 2% (the "
        "capacity's bisection and a fit that is not quite monotone in the capacity move a "
        "few more). So making the dry run allocate as the GPU does, family by family, does "
        "not by itself bring the rejections at the boundary near 5%: that needs the "
        "allocator simulation under a cap right to a fraction of a percent as well.",
        "",
        "| margin over the point | real events: fits rejected | real events: OOMs admitted "
        "| dry run: fits rejected | dry run: OOMs admitted |",
        "|---|---|---|---|---|",
    ]
    for m in MARGINS:
        r, d = rows[("real", m)], rows[("dry", m)]
        lines.append(
            f"| x{1 + m:.3f} | {r['fits_rejected']} / {r['fits']} | {r['ooms_admitted']} / "
            f"{r['ooms']} | {d['fits_rejected']} / {d['fits']} | {d['ooms_admitted']} / "
            f"{d['ooms']} |"
        )
    return [*lines, ""]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", nargs="*", help="alloctrace files (default data/oom/*-alloctrace-*)")
    p.add_argument("--json", help="write every run's figures here")
    p.add_argument(
        "--update-docs", action="store_true", help="replace the marked section of docs/accuracy.md"
    )
    args = p.parse_args(argv)
    import costaware as ca
    from costaware.measure.collect import read_rows
    from costaware.measure.corpus import Config

    paths = [Path(f) for f in args.traces] or sorted(
        (ROOT / "data" / "oom").glob("*-alloctrace-*.jsonl.gz")
    )
    rows = [r for path in paths for r in read_rows(path) if r.get("kind") == "alloctrace"]
    if not rows:
        print(
            "no recorded runs: run `bash data/gpu_window.sh alloctrace` on a GPU first",
            file=sys.stderr,
        )
        return 2
    model = ca.CostModel(trace_timeout=600.0)
    results = []
    for row in rows:
        cfg = dataclasses.replace(
            Config.from_dict(row["config"]), batch_size=int(row["batch_size"])
        )
        spec = cfg.to_spec()
        device = ca.get_device(str(row.get("gpu_name") or "H200"))
        basis = dict(model.predict(spec, device).basis)
        trace, _, _ = model.trace(spec, attention="fused")
        results.append(analyse(row, trace.allocator_events(), basis))
    print("\n".join(report(results)))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.update_docs:
        from _docs import splice

        sources = [
            p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else str(p)
            for p in (q.resolve() for q in paths)
        ]
        text = "\n".join(summary(results, sources))
        splice(ROOT / "docs" / "accuracy.md", text, START, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
