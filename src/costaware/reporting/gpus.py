"""The report's "On other GPUs" section: what the study would have taken, and cost, on
each GPU of the catalog.

From what the store holds for each admitted trial: the device time it used (its wall
time, else its measured training time, else its predicted trial time) on the GPU it ran
on, and its prediction's step (FLOPs, bytes moved, precision, memory need). On another
GPU the trial's time is that time scaled by the step's roofline there over its roofline
where it ran, ``max(flops / peak FLOP/s at the precision, bytes / bandwidth)``; a trial
whose memory need (the prediction's upper bound of the smallest capacity, plus the
GPU's CUDA context) exceeds the GPU's memory does not fit it and is counted apart.

This is a coarse transfer, not a prediction: the store holds no model code to dry-run
again, the whole trial (data loading included) is scaled by the step's roofline, and a
roofline ratio is what the time model itself falls back on for a GPU it has no
timings of (docs/compare.md says how far that went for the H100 and H200). Costs use
the report's price for the GPU the study ran on, and :data:`costaware.core.compare.DEFAULT_PRICES`
for the others (US dollars: with another currency only the study's own GPU is priced).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from costaware._format import fmt_money, fmt_seconds
from costaware.devices import CATALOG, Device, get_device

if TYPE_CHECKING:
    from costaware.reporting import Report, TrialRow

__all__ = ["gpu_costs", "markdown_lines", "section_rows", "step_of", "transfer_ratio"]

#: the prediction's figures a trial row keeps for this section (:func:`step_of`)
STEP_KEYS = ("flops", "bytes_moved", "precision", "min_capacity_upper")


def step_of(prediction: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of a store prediction record this section needs (empty if it lacks
    them): the step's FLOPs and bytes moved, its precision and its memory need."""
    basis = prediction.get("basis")
    basis = basis if isinstance(basis, Mapping) else {}
    step = {
        "flops": basis.get("flops"),
        "bytes_moved": basis.get("bytes_moved"),
        "precision": spec.get("precision") or _spec_of(prediction).get("precision") or "fp32",
        "min_capacity_upper": prediction.get("min_capacity_upper")
        or prediction.get("peak_memory_upper"),
    }
    if not all(isinstance(step[k], (int, float)) for k in ("flops", "bytes_moved")):
        return {}
    return step


def _spec_of(prediction: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = prediction.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _roofline(step: Mapping[str, Any], dev: Device) -> float:
    try:
        peak = dev.peak_flops(str(step.get("precision") or "fp32"))
    except ValueError:
        peak = dev.peak_flops("fp32")
    return max(float(step["flops"]) / peak, float(step["bytes_moved"]) / dev.bandwidth)


def transfer_ratio(step: Mapping[str, Any], origin: Device, target: Device) -> float:
    """The step's roofline time on ``target`` over the one on ``origin`` (1 where it has
    no FLOPs or bytes)."""
    here = _roofline(step, origin)
    return _roofline(step, target) / here if here > 0 else 1.0


def _seconds(r: TrialRow) -> float | None:
    return r.spent if r.spent is not None else r.predicted_cost


def gpu_costs(rep: Report, devices: Iterable[str | Device] | None = None) -> dict[str, Any]:
    """The study's admitted trials moved to each GPU (default: every catalog GPU).

    Returns ``{"trials": n, "left_out": n, "ran_on": [...], "devices": [...]}``: ``trials``
    the admitted trials with a time, a recorded step and a catalog GPU they ran on;
    ``left_out`` the admitted ones without; per device ``{"device", "fit", "too_big",
    "seconds", "price_per_hour", "price_source", "cost", "ran_here"}``.
    """
    from costaware.core.compare import DEFAULT_PRICES

    wanted = (
        [CATALOG[n] for n in sorted(CATALOG) if CATALOG[n].kind == "cuda"]
        if devices is None
        else [get_device(d) for d in devices]
    )
    admitted = [r for r in rep.trials if r.admitted and _seconds(r)]
    usable: list[tuple[TrialRow, Mapping[str, Any], Device]] = []
    for r in admitted:
        if not r.pred_step or r.device is None:
            continue
        try:
            origin = get_device(r.device)
        except ValueError:
            continue
        if origin.kind == "cuda":
            usable.append((r, r.pred_step, origin))
    ran_on = sorted({o.name for _, _, o in usable})
    rows: list[dict[str, Any]] = []
    for dev in wanted:
        fit = too_big = 0
        seconds = 0.0
        for r, step, origin in usable:
            need = step.get("min_capacity_upper")
            if (
                isinstance(need, (int, float))
                and need + dev.context_overhead_bytes > dev.memory_bytes
            ):
                too_big += 1
                continue
            fit += 1
            seconds += float(_seconds(r) or 0.0) * transfer_ratio(step, origin, dev)
        price: float | None = None
        source: str | None = None
        if rep.price_per_hour is not None and ran_on == [dev.name]:
            price, source = float(rep.price_per_hour), "the report's price"
        elif rep.currency == "$" and dev.name in DEFAULT_PRICES:
            price, source = DEFAULT_PRICES[dev.name]
        rows.append(
            {
                "device": dev.name,
                "fit": fit,
                "too_big": too_big,
                "seconds": seconds,
                "price_per_hour": price,
                "price_source": source,
                "cost": None if price is None else seconds / 3600.0 * price,
                "ran_here": dev.name in ran_on,
            }
        )
    rows.sort(key=lambda d: (d["too_big"] > 0, d["cost"] is None, float(d["cost"] or d["seconds"])))
    return {
        "trials": len(usable),
        "left_out": len(admitted) - len(usable),
        "ran_on": ran_on,
        "devices": rows,
    }


def _rows(rep: Report, found: Mapping[str, Any]) -> list[list[str]]:
    out = []
    n = found["trials"]
    for d in found["devices"]:
        name = d["device"] + (" (ran here)" if d["ran_here"] else "")
        price = fmt_money(d["price_per_hour"], rep.currency)
        if d["price_source"] not in (None, "the report's price"):
            price = "~" + price
        out.append(
            [
                name,
                f"{d['fit']} of {n}",
                fmt_seconds(d["seconds"]),
                price,
                fmt_money(d["cost"], rep.currency),
            ]
        )
    return out


_HEAD = ["GPU", "trials that fit", "time", "price/hour", "cost"]
_LEAD = (
    "The admitted trials' time scaled to each GPU by the roofline of their predicted step "
    "(FLOPs at the precision's peak, bytes at the bandwidth): a coarse transfer, not a "
    "prediction. Trials whose predicted memory need does not fit a GPU are left out of "
    "its time. ~: a public list price (docs/compare.md), not a quote."
)


def markdown_lines(rep: Report) -> list[str]:
    """The section in Markdown (no lines when no trial can be moved)."""
    found = gpu_costs(rep)
    if not found["trials"]:
        return []
    lines = ["## On other GPUs", "", _LEAD, ""]
    lines.append("| " + " | ".join(_HEAD) + " |")
    lines.append("|---|---:|---:|---:|---:|")
    lines += [
        "| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in _rows(rep, found)
    ]
    lines.append("")
    if found["left_out"]:
        lines += [
            f"{found['left_out']} admitted trials have no recorded step or GPU and are left out.",
            "",
        ]
    return lines


def section_rows(rep: Report) -> tuple[list[str], list[list[str]], str, int] | None:
    """The section's header, rows, lead and the number of trials left out, for a renderer
    (None when no trial can be moved)."""
    found = gpu_costs(rep)
    if not found["trials"]:
        return None
    return list(_HEAD), _rows(rep, found), _LEAD, int(found["left_out"])
