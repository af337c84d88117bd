"""Leave-family-out accuracy of the learned cost model on the collected measurements.

For every architecture family: fit a CostModel on the other families' rows of the same
device kind, predict the held-out family from its features, and compare with what was
measured. Per family and overall it reports

- memory MRE and iteration-time MRE of the learned model, and of the analytic estimate
  alone (the unfitted baseline: simulated allocator peak / roofline time);
- coverage of the calibrated upper bounds (share of rows whose measurement is at or
  below the bound);
- OOM decisions at simulated capacities: a trial is admitted when its memory upper bound
  fits. "admitted-but-OOM" counts admitted trials whose measured peak exceeds the
  capacity (must be 0), "good-rejected" counts rejected trials that would have fit.
  Capacities: 12 and 24 GiB for GPU data; for CPU data (MiB-scale peaks) the median and
  the 75th percentile of the measured peaks.

The memory figures count the peaks that are a configuration's need. They leave out CPU
peaks measured as resident-set growth (before the CPU allocator's peak was recorded; the
committed rows were re-measured), GPU peaks measured while the collector's process
already held reserved memory from an earlier configuration
(``costaware.measure.collect.reserved_before``), and the peaks of conv nets under cuDNN's benchmark
mode (its algorithm search takes what is free). Those rows still count for time; the last
two kinds get a table of their own, and one line gives memory MRE and coverage over every
measured peak as recorded.

Usage:
    python benchmarks/accuracy.py [DATA.jsonl.gz ...] [--out docs/accuracy.md]

With no DATA it reads every ``data/**/*.jsonl.gz`` outside ``data/archive/`` (rows that a
later measurement replaced, kept for the record). Features (one dry run per row) are
cached in the temp folder (``--cache``), keyed by row id, device and feature version.

``--graph2vec`` adds the design's graph2vec embedding of the operator graph
(:mod:`costaware.core.graph2vec`) to the features, held out as the rest: each fold fits
its embedding on the training families' graphs alone and embeds the held-out family's
graphs inductively (``g2v_0`` .. ``g2v_15`` and ``g2v_oov``, as
:meth:`costaware.CostModel.features` adds them for a model that carries one). The graphs
take one dry run per configuration apart from its batch size (the operator graph is the
same at every batch size), cached beside the features. ``--kinds gpu`` and
``--no-unseen-devices`` leave out what an ablation does not need.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MiB = 1024**2
GiB = 1024**3
#: rows superseded by a later measurement of the same host (kept for the record, not learned)
ARCHIVE = "archive"
#: OOM-boundary probes (data/oom/): labelled runs under a cap, not whole-model measurements
PROBES = "oom"
_DEFAULT_CACHE = Path(tempfile.gettempdir()) / "costaware-accuracy" / "features.json.gz"


def _read(files: Sequence[Path]) -> list[dict[str, Any]]:
    """Every row of ``files`` in the order measured (model and per-op rows, repeats
    included), so that the last of a configuration's rows is its latest measurement."""
    from costaware.measure.collect import in_measured_order, read_rows

    return in_measured_order(r for f in files for r in read_rows(f))


def _key(r: dict[str, Any]) -> tuple[str, str]:
    """A row's configuration and device: one measurement of it counts."""
    return str(r.get("id")), str(r.get("device_name"))


def _obs_key(o: Any) -> tuple[str, str]:
    """An observation's configuration and device, as :func:`_key` gives its row's."""
    return str(o.meta.get("id")), str(o.meta.get("source_device"))


def _rel(path: Path | str) -> str:
    """``path`` relative to the checkout where it lies in it (as the docs name files), else
    as given."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(path)


def _kind(device: str) -> str:
    """The device kind a row or observation is evaluated with: "cpu" or "gpu"."""
    return "cpu" if device == "CPU" else "gpu"


def _load(raw: Sequence[dict[str, Any]], kind: str | None = None) -> list[dict[str, Any]]:
    """Model rows (``kind`` None), or the per-op timing rows (``kind="op"``), the latest
    row of each configuration and device."""
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for r in raw:
        if (r.get("kind") == "op") == (kind == "op"):
            seen[_key(r)] = r
    return list(seen.values())


def _repeats(raw: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """How far two measurements of one configuration on one device lie apart, by device kind.

    Different seeds of a corpus can draw the same configuration (ids are content hashes);
    ``_load`` keeps the latest row, so the model learns from one measurement. The pairs give
    the measurements' own noise: a prediction scored against one noisy measurement cannot be
    expected to do much better. For each configuration measured ok more than once, the first
    and the last measurement are compared: |a / b - 1| of the step time, and of the peak
    where both are memory targets (for the CPU, the allocator's peak).
    """
    from costaware.measure.collect import cpu_allocator_peak

    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in raw:
        if r.get("kind") != "op" and r.get("status") == "ok":
            groups.setdefault(_key(r), []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for (_, device), rs in groups.items():
        if len(rs) < 2:
            continue
        kind = _kind(device)
        a, b = rs[0]["measurement"], rs[-1]["measurement"]
        d = out.setdefault(kind, {"n": 0, "time": [], "mem": []})
        d["n"] += 1
        if a.get("iteration_time") and b.get("iteration_time"):
            d["time"].append(abs(a["iteration_time"] / b["iteration_time"] - 1))
        targets = kind != "cpu" or (cpu_allocator_peak(a) and cpu_allocator_peak(b))
        if targets and min(a.get("max_reserved") or 0, b.get("max_reserved") or 0) > 0:
            d["mem"].append(abs(a["max_reserved"] / b["max_reserved"] - 1))
    return out


def _step_noise(rows: Sequence[dict[str, Any]], draws: int = 1000) -> dict[str, dict[str, Any]]:
    """How far each row's step time (the median of its timed steps) moves when its timed
    steps are resampled, by device kind: the noise within one measurement.

    For each ok row that recorded its timed steps, ``draws`` bootstrap resamples of them
    give the mean |resampled median / median - 1|; the figure is its mean over the rows,
    overall and by family (seeded: the same data gives the same figures). It leaves out
    what moves a whole run (the host's load, the clocks), which only repeat measurements
    show (:func:`_repeats`).
    """
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        m = r.get("measurement") or {}
        steps = np.asarray(m.get("step_times") or [], dtype=np.float64)
        if r.get("status") != "ok" or len(steps) < 2 or not np.all(steps > 0):
            continue
        med = float(np.median(steps))
        resampled = np.median(rng.choice(steps, size=(draws, len(steps))), axis=1)
        dev = float(np.mean(np.abs(resampled / med - 1)))
        d = out.setdefault(
            _kind(str(r.get("device_name"))), {"all": [], "by_family": {}, "steps": []}
        )
        d["all"].append(dev)
        d["by_family"].setdefault(str(r.get("family")), []).append(dev)
        d["steps"].append(len(steps))
    return {
        k: {
            "n": len(d["all"]),
            "mean": float(np.mean(d["all"])),
            "steps": int(np.median(d["steps"])),
            "by_family": {f: float(np.mean(v)) for f, v in sorted(d["by_family"].items())},
        }
        for k, d in out.items()
    }


def _step_noise_lines(noise: dict[str, Any] | None, time_mre: float) -> list[str]:
    if not noise:
        return []
    worst = sorted(noise["by_family"].items(), key=lambda kv: -kv[1])[:3]
    return [
        "",
        f"**Noise within a measurement.** Each row's step time is the median of its timed "
        f"steps (a median {noise['steps']} per row). Resampled (bootstrap, over the "
        f"{noise['n']} rows that recorded their steps), that median moves by a mean "
        f"{_pct(noise['mean'])}; the most in "
        + ", ".join(f"{f} ({_pct(v)})" for f, v in worst)
        + f". Against the time MRE of {_pct(time_mre)}, the measurements' own spread within a "
        "run is a small part of the error; what moves a whole run (the host's load, its "
        "clocks) only repeat measurements show.",
    ]


def _same_configurations(raw: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Configurations measured on two GPUs: how far the two measurements lie apart.

    For each pair of GPUs with configurations in common (the latest ok row of each): the
    second's step time over the first's, by family and overall, and how often the peaks
    are the same to the byte. Peaks measured with memory held from before, and those of
    runs with cuDNN's benchmark mode on (its search is sized to the card's free memory),
    are no memory targets and are left out of the memory comparison.
    """
    from costaware.core.optime import catalog_device
    from costaware.measure.collect import reserved_before
    from costaware.runtime.store import MAX_HELD_BEFORE

    latest: dict[str, dict[str, dict[str, Any]]] = {}
    for r in raw:
        if r.get("kind") == "op" or r.get("status") != "ok":
            continue
        if not str(r.get("device", "")).startswith("cuda"):
            continue
        latest.setdefault(str(r.get("id")), {})[catalog_device(r)] = r
    pairs: dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for by_dev in latest.values():
        devs = sorted(by_dev)
        for i, a in enumerate(devs):
            for b in devs[i + 1 :]:
                pairs.setdefault((a, b), []).append((by_dev[a], by_dev[b]))
    out = []
    for (a, b), got in sorted(pairs.items()):
        ratio: dict[str, list[float]] = {}
        alloc_same = reserved_same = 0
        mem_dev: list[float] = []
        for ra, rb in got:
            ma, mb = ra["measurement"], rb["measurement"]
            ratio.setdefault(str(ra.get("family")), []).append(
                mb["iteration_time"] / ma["iteration_time"]
            )
            held = max(reserved_before(ma) or 0, reserved_before(mb) or 0) > MAX_HELD_BEFORE
            if held or (ra.get("config") or {}).get("cudnn_benchmark"):
                continue
            alloc_same += ma.get("max_allocated") == mb.get("max_allocated")
            reserved_same += ma.get("max_reserved") == mb.get("max_reserved")
            if ma.get("max_reserved") and mb.get("max_reserved"):
                mem_dev.append(mb["max_reserved"] / ma["max_reserved"])
        every = [x for xs in ratio.values() for x in xs]
        out.append(
            {
                "devices": [a, b],
                "n": len(got),
                "time_ratio": [float(np.quantile(every, q)) for q in (0.1, 0.5, 0.9)],
                "time_ratio_by_family": {
                    f: float(np.median(xs)) for f, xs in sorted(ratio.items())
                },
                "mem_n": len(mem_dev),
                "alloc_same": alloc_same,
                "reserved_same": reserved_same,
                "reserved_ratio": [
                    float(np.quantile(mem_dev, q)) for q in (0.0, 0.1, 0.5, 0.9, 1.0)
                ]
                if mem_dev
                else [],
                "reserved_within_1pct": sum(abs(x - 1) <= 0.01 for x in mem_dev),
            }
        )
    return out


def _same_configuration_lines(same: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for c in same:
        a, b = c["devices"]
        t10, t50, t90 = c["time_ratio"]
        lines += [
            "",
            f"### The same configurations on {a} and {b}",
            "",
            f"{c['n']} configurations were measured on both. Step time on {b} over {a}: median "
            f"{t50:.2f}x (10th-90th percentile {t10:.2f}-{t90:.2f}x). By family (median): "
            + ", ".join(f"{f} {r:.2f}x" for f, r in c["time_ratio_by_family"].items())
            + ".",
        ]
        if c["reserved_ratio"]:
            lo, p10, med, p90, hi = c["reserved_ratio"]
            lines += [
                "",
                f"Memory, over the {c['mem_n']} of them that are memory targets on both "
                "(cuDNN's benchmark mode off, no memory held from before): the allocated peak is "
                f"the same to the byte in {c['alloc_same']}, the reserved peak in "
                f"{c['reserved_same']} and within 1% in {c['reserved_within_1pct']}; the reserved "
                f"peak on {b} over {a} ran {lo:.2f}-{hi:.2f}x (median {med:.2f}x, 10th-90th percentile "
                f"{p10:.2f}-{p90:.2f}x). The libraries pick kernels, and so workspaces, per GPU, "
                "so a peak measured on one GPU is not exactly another's, even of one generation.",
            ]
    return lines


def _repeat_lines(rep: dict[str, Any] | None) -> list[str]:
    if not rep:
        return []

    def spread(xs: list[float]) -> str:
        if not xs:
            return "no pairs"
        return (
            f"median {_pct(float(np.median(xs)))}, mean {_pct(float(np.mean(xs)))}, "
            f"90th percentile {_pct(float(np.quantile(xs, 0.9)))} over {len(xs)} "
            + ("pair" if len(xs) == 1 else "pairs")
        )

    def floor(xs: list[float]) -> str:
        return _pct(float(np.mean(xs)) / math.sqrt(2)) if xs else "n/a"

    return [
        "",
        f"**Repeat measurements.** {rep['n']} configurations were measured more than once "
        "(another seed drew the same configuration, or a later window measured it again: "
        "`data/gpu_window.sh repeat`; the figures above use the latest measurement). The "
        "first and the last measurement of one configuration lie apart by |a / b - 1|: "
        f"step time {spread(rep['time'])}; peak memory {spread(rep['mem'])}. That is the "
        "measurements' own noise: with independent noise of this size, even a prediction of "
        "each configuration's true mean would be off by about 1/sqrt(2) of it against one "
        f"measurement (a mean {floor(rep['time'])} for time, {floor(rep['mem'])} for memory).",
    ]


def _observations(
    rows: list[dict[str, Any]],
    use_cache: bool,
    trace_timeout: float,
    op_rows: list[dict[str, Any]],
    cache: Path | None = None,
) -> tuple[list[Any], list[str]]:
    from costaware.core.model import CostModel
    from costaware.measure.collect import observations

    model = CostModel(trace_timeout=trace_timeout)
    if op_rows:  # the op-level time models: per-op timings, no model rows, so no leak
        from costaware.core.optime import fit_op_models

        t = time.perf_counter()
        op_models, no_model = fit_op_models(op_rows)
        for op_model in op_models:
            model.add_op_model(op_model)
        for why in no_model:
            print(why, file=sys.stderr)
        kinds = ", ".join(m.kind for m in op_models) or "none"
        print(
            f"op models ({kinds}): {len(op_rows)} op rows, {time.perf_counter() - t:.0f}s",
            file=sys.stderr,
        )
    cache = cache if cache is not None else _DEFAULT_CACHE
    t0 = time.perf_counter()
    count = [0]

    def on_row(i: int, r: dict[str, Any]) -> None:
        count[0] += 1
        if count[0] % 25 == 0:
            print(f"  traced {count[0]} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr)

    obs, skipped = observations(
        rows,
        model=model,
        on_row=on_row,
        cache=cache if use_cache else None,
    )
    return list(obs), list(skipped)


def _gpu_observations(
    files: Sequence[Path], cache: Path | None, trace_timeout: float
) -> tuple[list[dict[str, Any]], list[Any], list[str]]:
    """The GPU whole-model rows of ``files`` and their observations (features from
    ``cache``, every one computed without it; op-level sums from the files' op timings),
    and the rows skipped."""
    raw = _read(files)
    rows = [r for r in _load(raw) if _kind(str(r.get("device_name"))) == "gpu"]
    op_rows = _load(raw, kind="op")
    print(f"{len(rows)} GPU rows from {len(files)} file(s); computing features", file=sys.stderr)
    obs, skipped = _observations(rows, cache is not None, trace_timeout, op_rows, cache)
    return rows, [o for o in obs if _kind(o.device) == "gpu"], skipped


def _predict(model: Any, feats: dict[str, float]) -> tuple[float, float, float, float, float]:
    """Point and upper predictions (memory, memory upper, time, time upper) from features,
    and the time baseline they correct."""
    from costaware.core.analytic import time_upper

    # the roofline, or the step model of time_baseline (op-level sum, CPU step model)
    mem, secs = model.baseline(feats)
    # the model's own corrections and bounds (trees, a line, or one factor per precision)
    corrected: tuple[float, float, float, float] = model.correct(
        feats, (mem, mem, secs, time_upper(secs))
    )
    return (*corrected, secs)


def _mre(pred: list[float], actual: list[float]) -> float:
    if not actual:
        return float("nan")
    return float(np.mean([abs(p - a) / a for p, a in zip(pred, actual, strict=True)]))


def _mdre(pred: list[float], actual: list[float]) -> float:
    if not actual:
        return float("nan")
    return float(np.median([abs(p - a) / a for p, a in zip(pred, actual, strict=True)]))


def _capacities(obs: list[Any], kind: str) -> dict[str, float]:
    """The simulated capacities the OOM decisions are judged at."""
    if kind == "cpu":
        peaks = sorted(o.peak_memory for o in obs if o.peak_memory)
        return {
            "p50 of peaks": float(np.percentile(peaks, 50)),
            "p75 of peaks": float(np.percentile(peaks, 75)),
        }
    return {"12 GiB": 12.0 * GiB, "24 GiB": 24.0 * GiB}


def _fit(train: list[Any], settings: dict[str, Any]) -> Any:
    """A CostModel fitted on ``train`` with ``settings`` (CostModel's keyword arguments)."""
    from costaware.core.model import CostModel

    return CostModel(**settings).fit(train)


def _records(model: Any, test: list[Any]) -> list[dict[str, Any]]:
    """The held-out rows ``test`` as predicted by ``model``."""
    from costaware.core.model import benchmark_search_peak

    out = []
    for o in test:
        mem, mem_hi, secs, secs_hi, base_secs = _predict(model, o.features)
        out.append(
            {
                "family": o.family,
                "id": o.meta.get("id"),
                "device": o.device,
                "source_device": o.meta.get("source_device"),
                "status": o.status,
                "mem": o.peak_memory,
                "secs": o.iteration_time,
                "p_mem": mem,
                "p_mem_hi": mem_hi,
                "p_secs": secs,
                "p_secs_hi": secs_hi,
                "a_mem": o.features["analytic_reserved_mib"] * MiB,
                "a_secs": o.features["analytic_time_ms"] / 1e3,
                # the fold's time baseline alone, uncorrected
                "b_secs": base_secs,
                # the peak holds cuDNN's benchmark search (sized to the free memory)
                "search": bool(o.peak_memory) and benchmark_search_peak(o.features),
                "precision": _precision(o.features),
                "left_out": o.meta.get("memory_left_out"),
                "left_out_kind": o.meta.get("memory_left_out_kind"),
                "recorded_mem": o.peak_memory or o.meta.get("measured_peak"),
            }
        )
    return out


def _summarise(recs: list[dict[str, Any]], caps: dict[str, float]) -> dict[str, Any]:
    """Errors, bound coverage and OOM decisions of held-out predictions ``recs``."""
    # memory rows: a peak that is the configuration's need (no CPU resident-set growth,
    # no GPU peaks measured with memory held from before, no benchmark-search peaks)
    m = [r for r in recs if r["mem"] and not r["search"]]
    t = [r for r in recs if r["secs"]]
    s: dict[str, Any] = {
        "n": len(recs),
        "mem_n": len(m),
        "mem_mre": _mre([r["p_mem"] for r in m], [r["mem"] for r in m]),
        "time_mre": _mre([r["p_secs"] for r in t], [r["secs"] for r in t]),
        "mem_cov": float(np.mean([r["mem"] <= r["p_mem_hi"] for r in m])) if m else math.nan,
        "time_cov": float(np.mean([r["secs"] <= r["p_secs_hi"] for r in t])) if t else math.nan,
        "mem_mdre": _mdre([r["p_mem"] for r in m], [r["mem"] for r in m]),
        "time_mdre": _mdre([r["p_secs"] for r in t], [r["secs"] for r in t]),
        "a_mem_mre": _mre([r["a_mem"] for r in m], [r["mem"] for r in m]),
        "a_time_mre": _mre([r["a_secs"] for r in t], [r["secs"] for r in t]),
        # signed: the median of predicted / measured - 1 (below 0: under-predicted)
        "time_bias": float(np.median([r["p_secs"] / r["secs"] - 1 for r in t])) if t else math.nan,
    }
    # OOM decisions: the rows whose need is known (a memory row, or a real OOM)
    d = [*m, *(r for r in recs if r["status"] == "oom")]
    s["decided"] = len(d)
    for name, cap in caps.items():
        oom = [r["status"] == "oom" or (r["mem"] or 0) > cap for r in d]
        admitted = [r["p_mem_hi"] <= cap for r in d]
        a_admitted = [r["a_mem"] <= cap for r in d]
        misses = [
            f"{r['id']} (measured {r['mem'] / MiB:,.1f} MiB, bound {r['p_mem_hi'] / MiB:,.1f} MiB)"
            if r["mem"]
            else f"{r['id']} (OOM)"
            for r, a, o in zip(d, admitted, oom, strict=True)
            if a and o
        ]
        s[f"cap:{name}"] = {
            "misses": misses,
            "would_oom": sum(oom),
            "admitted_but_oom": sum(a and o for a, o in zip(admitted, oom, strict=True)),
            "good_rejected": sum(not a and not o for a, o in zip(admitted, oom, strict=True)),
            "analytic_admitted_but_oom": sum(a and o for a, o in zip(a_admitted, oom, strict=True)),
            "analytic_good_rejected": sum(
                not a and not o for a, o in zip(a_admitted, oom, strict=True)
            ),
        }
    return s


#: a fold's features from its training and held-out observations (``--graph2vec``)
Refeature = Callable[[list[Any], list[Any]], tuple[list[Any], list[Any]]]


def _evaluate(
    obs: list[Any],
    kind: str,
    settings: dict[str, Any],
    refeature: Refeature | None = None,
    fold_of: Callable[[Any], str] | None = None,
) -> dict[str, Any]:
    """Each fold predicted by a model fitted on the others. The folds are the families
    (``fold_of`` None: leave-family-out), or the groups ``fold_of`` names; the figures are
    summarised by family either way."""
    families = sorted({o.family for o in obs})
    fold = fold_of if fold_of is not None else (lambda o: str(o.family))
    caps = _capacities(obs, kind)
    records: list[dict[str, Any]] = []
    for name in sorted({fold(o) for o in obs}):
        train = [o for o in obs if fold(o) != name]
        test = [o for o in obs if fold(o) == name]
        if refeature is not None:
            train, test = refeature(train, test)
        model = _fit(train, settings)
        records += _records(model, test)
        print(f"  fold {name}: {len(test)} held out, {len(train)} trained", file=sys.stderr)

    per_family = {f: _summarise([r for r in records if r["family"] == f], caps) for f in families}
    devices = sorted({r["device"] for r in records})
    measured = [r for r in records if r["recorded_mem"]]
    return {
        "records": records,
        "families": per_family,
        "overall": _summarise(records, caps),
        # the same held-out predictions, by the device they were measured on
        "devices": {d: _summarise([r for r in records if r["device"] == d], caps) for d in devices}
        if len(devices) > 1
        else {},
        "capacities": caps,
        "rows": len(obs),
        "left_out": [
            (r["left_out_kind"], f"{r['id']} ({r['left_out']})") for r in records if r["left_out"]
        ],
        "search": _search_summary([r for r in records if r["search"]]),
        # every measured peak, the left-out kinds included, as the collector recorded it
        "as_measured": {
            "n": len(measured),
            "mem_mre": _mre([r["p_mem"] for r in measured], [r["recorded_mem"] for r in measured]),
            "mem_cov": float(np.mean([r["recorded_mem"] <= r["p_mem_hi"] for r in measured]))
            if measured
            else math.nan,
        },
    }


def _evaluate_unseen_devices(obs: list[Any], kind: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Each device of a kind with more than one, predicted by models that never saw it.

    Two ways per held-out device: a model fitted on every other device's rows (the families
    were seen, on another GPU: what the shipped model does on a GPU it has no rows of), and
    for each family a model fitted on the other devices' rows of the other families (neither
    the device nor the family seen).
    """
    devices = sorted({o.device for o in obs})
    caps = _capacities(obs, kind)
    out: dict[str, Any] = {}
    if len(devices) < 2:
        return out
    for dev in devices:
        test = [o for o in obs if o.device == dev]
        others = [o for o in obs if o.device != dev]
        trained_on = sorted({o.device for o in others})
        model = _fit(others, settings)
        seen = _records(model, sorted(test, key=lambda o: o.family))  # by family, as below
        unseen: list[dict[str, Any]] = []
        for fam in sorted({o.family for o in test}):
            train = [o for o in others if o.family != fam]
            if not train:
                continue
            fold = _fit(train, settings)
            unseen += _records(fold, [o for o in test if o.family == fam])
        print(f"  unseen device {dev}: {len(test)} rows, trained on {trained_on}", file=sys.stderr)
        out[dev] = {
            "trained_on": trained_on,
            "families_seen": _summarise(seen, caps),
            "families_unseen": _summarise(unseen, caps),
            "per_family": {
                f: _summarise([r for r in unseen if r["family"] == f], caps)
                for f in sorted({r["family"] for r in unseen})
            },
            "records": {"families_seen": seen, "families_unseen": unseen},
        }
    return out


def _graph_key(row: dict[str, Any]) -> str:
    """A row's operator graph: its configuration apart from the batch size, and whether
    its dry run is a GPU's (fused attention) or a CPU's."""
    skip = {"id", "batch_size", "fwd_flops", "est_seconds", "corpus"}
    config = {k: v for k, v in (row.get("config") or {}).items() if k not in skip}
    return json.dumps(config, sort_keys=True) + f"|{_kind(str(row.get('device_name')))}"


def _graph_key_of(rows: Sequence[dict[str, Any]]) -> Callable[[Any], str]:
    """Each observation's :func:`_graph_key`, from the rows it was measured in."""
    keys = {_key(r): _graph_key(r) for r in rows}
    return lambda o: keys[_obs_key(o)]


def _graphs(rows: Sequence[dict[str, Any]], cache: Path, trace_timeout: float) -> dict[str, Any]:
    """The operator graph (``networkx.DiGraph``, nodes labelled ``op``) of each of ``rows``'
    configurations apart from the batch size (:func:`_graph_key`): one dry run each, at the
    smallest batch size measured, kept in ``cache`` (a ``.json.gz`` of op names and edges
    per feature version) so that a later run repeats none."""
    import gzip

    import networkx as nx

    from costaware.core.features import FEATURE_VERSION
    from costaware.core.trace import dry_run
    from costaware.measure.collect import Config, _as_measured

    stored: dict[str, Any] = {}
    if cache.is_file():
        stored = json.loads(gzip.decompress(cache.read_bytes())).get(FEATURE_VERSION, {})
    first: dict[str, dict[str, Any]] = {}
    for r in rows:
        key = _graph_key(r)
        if key not in first or r["config"]["batch_size"] < first[key]["config"]["batch_size"]:
            first[key] = r
    todo = [k for k in first if k not in stored]
    t0 = time.perf_counter()

    def save() -> None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(cache.name + ".tmp")
        tmp.write_bytes(gzip.compress(json.dumps({FEATURE_VERSION: stored}).encode(), mtime=0))
        tmp.replace(cache)

    for i, key in enumerate(todo):
        r = first[key]
        device = str(r.get("device_name"))
        try:
            spec = Config.from_dict(r["config"]).to_spec()
            with _as_measured(r, device):
                t = dry_run(
                    spec,
                    timeout=trace_timeout,
                    attention="native" if _kind(device) == "cpu" else "fused",
                )
        except Exception as e:  # listed, left without a graph: its embedding is zeros
            print(f"  no graph for {r.get('id')}: {type(e).__name__}: {e}", file=sys.stderr)
            stored[key] = None
            continue
        g = nx.convert_node_labels_to_integers(t.graph, ordering="sorted")
        stored[key] = {
            "ops": [str(g.nodes[n]["op"]) for n in range(g.number_of_nodes())],
            "edges": [[int(a), int(b)] for a, b in g.edges],
        }
        if (i + 1) % 25 == 0:
            save()
            print(
                f"  graphs {i + 1}/{len(todo)} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr
            )
    if todo:
        save()
    out: dict[str, Any] = {}
    for key, g in stored.items():
        graph = nx.DiGraph()
        if g is not None:
            graph.add_nodes_from((n, {"op": op}) for n, op in enumerate(g["ops"]))
            graph.add_edges_from(map(tuple, g["edges"]))
        out[key] = graph
    return out


def _graph2vec_features(
    rows: Sequence[dict[str, Any]], cache: Path, trace_timeout: float
) -> Refeature:
    """A fold's observations with the graph2vec embedding of their operator graphs, the
    embedding fitted on the training observations' graphs alone (as
    :meth:`costaware.CostModel.features` adds it: ``g2v_<i>`` and ``g2v_oov``)."""
    import dataclasses

    from costaware.core.graph2vec import Graph2Vec

    graphs = _graphs(rows, cache, trace_timeout)
    key = _graph_key_of(rows)

    #: each fold's embeddings, by its training graphs and the graphs it embeds: a fold
    #: that comes back (another variant of the same split) is not fitted again
    folds: dict[tuple[tuple[str, ...], tuple[str, ...]], dict[str, dict[str, float]]] = {}

    def embed(seen: list[str], wanted: list[str]) -> dict[str, dict[str, float]]:
        t = time.perf_counter()
        g2v = Graph2Vec().fit([graphs[k] for k in seen])
        vectors = g2v.transform([graphs[k] for k in wanted])
        feats: dict[str, dict[str, float]] = {}
        for k, vec in zip(wanted, vectors, strict=True):
            feats[k] = {f"g2v_{i}": float(v) for i, v in enumerate(vec)}
            feats[k]["g2v_oov"] = float(g2v.oov_fraction(graphs[k]))
        print(
            f"  graph2vec: {len(seen)} training graphs, {len(wanted)} embedded "
            f"({time.perf_counter() - t:.0f}s)",
            file=sys.stderr,
        )
        return feats

    def refeature(train: list[Any], test: list[Any]) -> tuple[list[Any], list[Any]]:
        seen = sorted({key(o) for o in train})
        wanted = sorted({key(o) for o in [*train, *test]})
        fold = (tuple(seen), tuple(wanted))
        if fold not in folds:
            folds[fold] = embed(seen, wanted)
        feats = folds[fold]

        def add(os_: list[Any]) -> list[Any]:
            return [dataclasses.replace(o, features={**o.features, **feats[key(o)]}) for o in os_]

        return add(train), add(test)

    return refeature


def _precision(feats: dict[str, float]) -> str:
    from costaware.spec import PRECISIONS

    return next((p for p in PRECISIONS if feats.get(f"precision_is_{p}") == 1.0), "?")


def _search_summary(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Benchmark-mode conv rows: the measured peak over the predicted need, per precision."""
    out: dict[str, Any] = {}
    for name, group in (
        ("fp32", [r for r in recs if r["precision"] == "fp32"]),
        ("bf16/fp16", [r for r in recs if r["precision"] in ("bf16", "fp16")]),
    ):
        if not group:
            continue
        ratio = sorted(r["mem"] / r["p_mem"] for r in group)
        out[name] = {
            "n": len(group),
            "median": float(np.median(ratio)),
            "min": ratio[0],
            "max": ratio[-1],
            "over_bound": sum(r["mem"] > r["p_mem_hi"] for r in group),
        }
    return out


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}%"


def _cap_label(name: str, cap: float) -> str:
    return f"{name} ({cap / MiB:,.0f} MiB)" if cap < GiB else name


def _other_sections(doc: Path, md: str) -> str:
    """The sections other benchmarks generated into ``doc`` (each between its
    ``<!-- name:start -->`` and ``<!-- name:end -->`` markers), in their order, that ``md``
    does not hold: rewriting the page keeps them."""
    import re

    if not doc.is_file():
        return ""
    old = doc.read_text()
    kept = [
        m.group(0)
        for m in re.finditer(r"<!-- ([\w-]+):start -->.*?<!-- \1:end -->", old, flags=re.S)
        if m.group(0).split("\n", 1)[0] not in md
    ]
    return "".join(f"\n{block}\n" for block in kept)


def _markdown(results: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        "# Accuracy: leave-family-out cross-validation",
        "",
        "Generated by `python benchmarks/accuracy.py` "
        f"on {meta['date']} from {', '.join(meta['files'])}.",
        "",
        f"**Measured on: {', '.join(meta['devices'])}.** "
        + (
            "There is no GPU data yet: every figure below is for the CPU (the CPU allocator's "
            "peak and CPU step times, see data/README.md), not for a GPU."
            if not any(k != "cpu" for k in results)
            else ""
        ),
        "",
        "For each family the model is fitted on all the other families of the same device kind "
        f"(CatBoost, {meta['iterations']} trees, seed {meta.get('seed', 0)}, upper bounds at 95%) and predicts the "
        "held-out family from its dry-run features. The bounds are the conformal quantile of "
        "log((measured + shift) / (predicted + shift)) over cross-conformal residuals: "
        "within the training families, each row's residual comes from trees fitted without "
        "its fold of families (5 folds), and the trees themselves from every training row; "
        "the shift is chosen on their in-sample predictions. "
        + (
            "Memory is learned as a line over the simulated peak (`memory_model='line'`, "
            "Theil-Sen), on GPUs and CPUs alike: its residuals come from a line fitted "
            "without the row's family, and there is no shift. "
            if meta.get("memory_model", "line") == "line"
            else "Memory is learned by trees as well (`memory_model='trees'`). "
        )
        + (
            "The features include the graph2vec embedding of the operator graph, fitted in "
            "each fold on the training families' graphs alone (`--graph2vec`). "
            if meta.get("graph2vec")
            else ""
        )
        + "MRE = mean |predicted - measured| / measured. "
        "`analytic` is the unfitted baseline (simulated allocator peak, roofline time). "
        "Coverage is the share of rows at or below the upper bound (nominal 95%).",
        "",
        "GPU dry runs trace attention as one fused (flash) kernel and recurrent layers as "
        "fused cuDNN kernels, as the GPU runs them. "
        + (
            "The time residual is learned over the op-level sum (`costaware.core.optime`: per-kernel "
            "times learned from the per-op H100 timings, fitted on op rows only) where there is "
            "one, i.e. on GPUs: the step is a soft maximum of g x kernel time and the CPU's "
            "issue time, (k^p + i^p)^(1/p) with p fitted, the issue time a cost per forward, "
            "backward and optimizer op, per view (an op that launches no kernel) and per "
            "parameter tensor plus a constant, each of the two times a factor under autocast, "
            "the ten constants fitted on each fold's training rows. On CPUs it is learned over a CPU step model "
            "(`_CpuSteps`): the roofline's compute and memory parts and, where the data has a "
            "CPU's per-op timings, the op-level sum of its own op model, each times a factor, "
            "plus a cost per kernel and per parameter tensor and a constant, the constants "
            "fitted on each fold's training rows."
            if meta.get("time_baseline") == "optime"
            else "The time residual is learned over the roofline time."
        ),
        "",
    ]
    for kind, res in results.items():
        caps = res["capacities"]
        lines += [f"## {kind.upper()} data ({res['rows']} rows)", ""]
        if kind == "cpu":
            lines += [
                "OOM capacities for CPU data: the median and the 75th percentile of the measured "
                "peaks (GPU capacities such as 12/24 GiB would admit every CPU-scale row). "
                "CPU memory is the peak of the bytes PyTorch's CPU allocator held (profiler "
                "memory events, see data/README.md); a row "
                "measured as resident-set growth would count for time only. CPU times come "
                "from a shared 2-core container (1 torch thread, under `nice`), so they carry "
                "scheduling noise.",
                "",
            ]
        head = (
            "| family | n | mem n | mem MRE | mem MRE (analytic) | mem median RE | time MRE "
            "| time MRE (analytic) | time median RE | mem cov | time cov |"
        )
        lines += [head, "|" + "---|" * 11]
        items = [*list(res["families"].items()), ("**overall**", res["overall"])]
        for fam, s in items:
            lines.append(
                f"| {fam} | {s['n']} | {s['mem_n']} | {_pct(s['mem_mre'])} | {_pct(s['a_mem_mre'])} | "
                f"{_pct(s['mem_mdre'])} | {_pct(s['time_mre'])} | {_pct(s['a_time_mre'])} | "
                f"{_pct(s['time_mdre'])} | {_pct(s['mem_cov'])} | {_pct(s['time_cov'])} |"
            )
        lines += [
            "",
            f"OOM decisions (overall, over the {res['overall']['decided']} rows whose need is "
            "known: the memory rows and real OOMs; admitted when the memory upper bound fits, "
            "the analytic baseline admits on its point estimate):",
            "",
            "| capacity | would OOM | admitted but OOM | good rejected | analytic: admitted but OOM "
            "| analytic: good rejected |",
            "|---|---|---|---|---|---|",
        ]
        for name, cap in caps.items():
            c = res["overall"][f"cap:{name}"]
            lines.append(
                f"| {_cap_label(name, cap)} | {c['would_oom']} | {c['admitted_but_oom']} | "
                f"{c['good_rejected']} | {c['analytic_admitted_but_oom']} | "
                f"{c['analytic_good_rejected']} |"
            )
        for name, cap in caps.items():
            misses = res["overall"][f"cap:{name}"]["misses"]
            if misses:
                lines += ["", f"Admitted but OOM at {_cap_label(name, cap)}: " + "; ".join(misses)]
        lines += _device_lines(res)
        lines += _corpus_lines(res)
        if kind == "gpu":
            lines += _same_configuration_lines(meta.get("same_configurations", []))
        lines += _unseen_device_lines(meta.get("unseen_devices", {}).get(kind))
        lines += _repeat_lines(meta.get("repeats", {}).get(kind))
        lines += _step_noise_lines(meta.get("step_noise", {}).get(kind), res["overall"]["time_mre"])
        lines += _left_out_lines(res)
        lines.append("")
    return "\n".join(lines)


_SUMMARY_HEAD = [
    "| | n | mem MRE | mem median RE | time MRE | time median RE | time bias (median) "
    "| mem cov | time cov | admitted but OOM (12 / 24 GiB) |",
    "|" + "---|" * 10,
]


def _summary_row(name: str, s: dict[str, Any]) -> str:
    ooms = " / ".join(str(v["admitted_but_oom"]) for k, v in s.items() if k.startswith("cap:"))
    return (
        f"| {name} | {s['n']} | {_pct(s['mem_mre'])} | {_pct(s['mem_mdre'])} | "
        f"{_pct(s['time_mre'])} | {_pct(s['time_mdre'])} | {s['time_bias'] * 100:+.1f}% | "
        f"{_pct(s['mem_cov'])} | {_pct(s['time_cov'])} | {ooms} |"
    )


def _device_lines(res: dict[str, Any]) -> list[str]:
    """The leave-family-out figures above, by the GPU the rows were measured on."""
    if not res.get("devices"):
        return []
    return [
        "",
        "The same held-out predictions by device (each fold's model learned the other "
        "families on every device; time bias is the median of predicted / measured - 1):",
        "",
        *_SUMMARY_HEAD,
        *(_summary_row(d, s) for d, s in res["devices"].items()),
    ]


def _corpus_lines(res: dict[str, Any]) -> list[str]:
    """The leave-family-out figures above, by the corpus the rows were drawn from."""
    if len(res.get("corpora") or {}) < 2:
        return []
    return [
        "",
        "The same held-out predictions by the corpus each configuration was drawn from "
        "(`costaware.measure.corpus`: `gpu` sized for a GPU, `cpu` the small models sized "
        "for a CPU, here measured on a GPU):",
        "",
        *_SUMMARY_HEAD,
        *(_summary_row(f"`{c}` corpus", s) for c, s in res["corpora"].items()),
    ]


def by_corpus(
    results: dict[str, dict[str, Any]], rows: Sequence[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """``results`` with each kind's held-out predictions also summarised by the corpus
    their rows were drawn from (``corpora``)."""
    corpus = {_key(r): str((r.get("config") or {}).get("corpus")) for r in rows}
    for res in results.values():
        recs = res["records"]
        of = [corpus.get((str(r["id"]), str(r["source_device"])), "None") for r in recs]
        res["corpora"] = {
            c: _summarise([r for r, k in zip(recs, of, strict=True) if k == c], res["capacities"])
            for c in sorted(set(of))
        }
    return results


def _unseen_device_lines(unseen: dict[str, Any] | None) -> list[str]:
    """Each device predicted by models fitted on the other devices' rows alone."""
    if not unseen:
        return []
    lines = [
        "",
        "### A device the model never saw",
        "",
        "Each device's rows predicted by models fitted without a single row of that device "
        "(the op-level time model stays the one learned from per-op timings, scaled to the "
        "device by the roofline's ratio where it was timed on another). *Families seen*: one "
        "model fitted on every row of the other devices, so the same configurations were "
        "learned as measured on another GPU: what the shipped model does on a GPU it has no "
        "rows of. *Families unseen*: for each family a model fitted on the other devices' "
        "rows of the other families, so neither the device nor the family was seen.",
        "",
        *_SUMMARY_HEAD,
    ]
    for dev, u in unseen.items():
        trained = ", ".join(u["trained_on"])
        lines.append(
            _summary_row(f"{dev}, families seen (trained on {trained})", u["families_seen"])
        )
        lines.append(_summary_row(f"{dev}, families unseen", u["families_unseen"]))
    for dev, u in unseen.items():
        lines += [
            "",
            f"{dev} by family, neither the device nor the family seen:",
            "",
            *_SUMMARY_HEAD,
            *(_summary_row(f, s) for f, s in u["per_family"].items()),
        ]
    return lines


def _left_out_lines(res: dict[str, Any]) -> list[str]:
    """What the memory figures leave out, and how the prediction does on it."""
    from costaware.core.analytic import CUBLAS_WORKSPACE_BYTES
    from costaware.measure.collect import LEFT_OUT_RSS, LEFT_OUT_WORKSPACE
    from costaware.runtime.store import MAX_HELD_BEFORE

    lines: list[str] = []
    left, search, every = res["left_out"], res["search"], res["as_measured"]
    if not left and not search:
        return lines
    lines += ["", "### Peaks left out of the memory figures", ""]
    workspace = [text for kind, text in left if kind == LEFT_OUT_WORKSPACE]
    rss = [text for kind, text in left if kind == LEFT_OUT_RSS]
    held = [text for kind, text in left if kind not in (LEFT_OUT_WORKSPACE, LEFT_OUT_RSS)]

    def some(xs: list[str]) -> str:
        return "; ".join(xs[:6]) + ("; ..." if len(xs) > 6 else "") + "."

    if held:
        lines += [
            f"{len(held)} GPU rows were measured while the collector's process already held "
            f"more than {MAX_HELD_BEFORE >> 20} MiB reserved from an earlier configuration "
            "(a cached segment pinned "
            "by a workspace; see `costaware.measure.collect.reserved_before`). Their reserved peak is "
            "partly that earlier configuration's, so they count for time only: " + some(held),
            "",
        ]
    if rss:
        lines += [
            f"{len(rss)} CPU rows were measured as the process's resident-set growth, before "
            "the collector read the CPU allocator's peak: another quantity than the one "
            "learned, so they count for time only: " + some(rss),
            "",
        ]
    if workspace:
        lines += [
            f"{len(workspace)} GPU rows are models that call no cuBLAS (convolutions only), "
            "measured while the collector's process still held the cuBLAS workspace of an "
            f"earlier configuration ({CUBLAS_WORKSPACE_BYTES >> 20} MiB; the H100 collector "
            "kept it, the H200 one drops it first). Their peak is that much over what the "
            "step needs in a fresh process, so they count for time only: " + some(workspace),
            "",
        ]
    if search:
        n = sum(v["n"] for v in search.values())
        lines += [
            f"{n} GPU rows are conv nets measured with cuDNN's benchmark mode on. Its algorithm "
            "search takes a workspace sized to the free memory (PyTorch keeps the plans that fit "
            "the largest free block and halves the allocation on OOM), so their peak on an "
            "80 or 141 GB card measures the card, not what the step needs: it is no memory target, "
            "and the model predicts the need. Measured peak over the predicted need:",
            "",
            "| precision | n | median | min | max | above the upper bound |",
            "|---|---|---|---|---|---|",
        ]
        for name, v in search.items():
            lines.append(
                f"| {name} | {v['n']} | {v['median']:.2f}x | {v['min']:.2f}x | "
                f"{v['max']:.2f}x | {v['over_bound']} |"
            )
        lines.append("")
    lines.append(
        f"On every peak as the collector recorded it ({every['n']} rows, all of the above "
        f"included), memory MRE is {_pct(every['mem_mre'])} and the upper bound covers "
        f"{_pct(every['mem_cov'])}."
    )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "data", nargs="*", help="jsonl.gz files (default data/**/*.jsonl.gz outside data/archive/)"
    )
    p.add_argument("--out", default=str(ROOT / "docs" / "accuracy.md"), help="markdown output")
    p.add_argument("--iterations", type=int, default=400, help="CatBoost trees per fit")
    p.add_argument("--threads", type=int, default=2, help="CatBoost threads")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="CatBoost's seed and the calibration folds' (CostModel random_state; default 0, "
        "the shipped model's): other seeds show how much of a figure is the fit's chance",
    )
    p.add_argument("--no-cache", action="store_true", help="recompute every feature")
    p.add_argument(
        "--cache",
        default=str(_DEFAULT_CACHE),
        help="the features cache (.json.gz) to read and update; the graphs of --graph2vec "
        "are cached beside it",
    )
    p.add_argument(
        "--graph2vec",
        action="store_true",
        help="add the graph2vec embedding of the operator graph to the features, fitted "
        "per fold on the training families' graphs (the ablation of docs/accuracy.md)",
    )
    p.add_argument(
        "--kinds",
        default="cpu,gpu",
        help="the device kinds to evaluate, comma-separated (default cpu,gpu)",
    )
    p.add_argument(
        "--no-unseen-devices",
        action="store_true",
        help="leave out the evaluation of each GPU by models that never saw it (always "
        "with --graph2vec, whose embedding that evaluation does not refit)",
    )
    p.add_argument(
        "--rows",
        default=None,
        help="also write every held-out prediction (one JSON object per row) to this .jsonl file",
    )
    p.add_argument(
        "--time-baseline",
        choices=("roofline", "optime"),
        default="optime",
        help="what the time residual is learned over (default optime: the op-level sum on "
        "GPUs, the CPU step model on CPUs)",
    )
    p.add_argument(
        "--memory-model",
        choices=("line", "trees"),
        default="line",
        help="how the memory residual is learned (CostModel memory_model; default line, the "
        "shipped model's): a Theil-Sen line over the simulated peak, or CatBoost trees",
    )
    p.add_argument(
        "--trace-timeout",
        type=float,
        default=600.0,
        help="seconds allowed for one dry run; rows over it are skipped and listed (default 600)",
    )
    p.add_argument(
        "--repeats-only",
        action="store_true",
        help="print only how far repeat measurements of one configuration lie apart, by "
        "device kind (no features, no fits: seconds)",
    )
    args = p.parse_args(argv)
    files = [Path(f) for f in args.data] or sorted(
        f
        for f in (ROOT / "data").glob("**/*.jsonl.gz")
        if ARCHIVE not in f.parts and PROBES not in f.parts
    )
    if not files:
        print("no data files: run `costaware collect` first (see data/README.md)", file=sys.stderr)
        return 2
    raw = _read(files)
    if args.repeats_only:
        for kind, rep in sorted(_repeats(raw).items()):
            print(f"{kind.upper()}: " + "\n".join(_repeat_lines(rep)).strip())
        return 0
    rows = _load(raw)
    op_rows = _load(raw, kind="op")
    print(f"{len(rows)} rows from {len(files)} file(s); computing features", file=sys.stderr)
    cache = Path(args.cache)
    obs, skipped = _observations(rows, not args.no_cache, args.trace_timeout, op_rows, cache)
    kinds = {k.strip() for k in args.kinds.split(",") if k.strip()}
    if not kinds <= {"cpu", "gpu"}:
        p.error(f"--kinds takes cpu and/or gpu, but got {args.kinds!r}")
    by_kind: dict[str, list[Any]] = {}
    for o in obs:
        if _kind(o.device) in kinds:
            by_kind.setdefault(_kind(o.device), []).append(o)
    refeature = None
    if args.graph2vec:
        measured = {_obs_key(o) for o in obs}
        refeature = _graph2vec_features(
            [r for r in rows if _key(r) in measured],
            cache.with_name("graphs.json.gz"),
            args.trace_timeout,
        )
    devices = sorted({str(r.get("device_name")) for r in rows})
    settings = {
        "iterations": args.iterations,
        "thread_count": args.threads,
        "time_baseline": args.time_baseline,
        "random_state": args.seed,
        "memory_model": args.memory_model,
    }
    results = by_corpus({k: _evaluate(v, k, settings, refeature) for k, v in by_kind.items()}, rows)
    unseen = (
        {}
        if args.no_unseen_devices or args.graph2vec
        else {k: _evaluate_unseen_devices(v, k, settings) for k, v in by_kind.items()}
    )
    meta = {
        "unseen_devices": unseen,
        "date": time.strftime("%Y-%m-%d"),
        "files": [_rel(f) for f in files],
        "devices": devices,
        "iterations": args.iterations,
        "seed": args.seed,
        "time_baseline": args.time_baseline,
        "memory_model": args.memory_model,
        "graph2vec": args.graph2vec,
        "trace_timeout": args.trace_timeout,
        "repeats": _repeats(raw),
        "step_noise": _step_noise(rows),
        "same_configurations": _same_configurations(raw),
    }
    md = _markdown(results, meta)
    if skipped:
        md += f"\n{len(skipped)} rows were skipped (errors, crashes or untraceable): "
        md += "; ".join(skipped[:10]) + ("; ..." if len(skipped) > 10 else "") + "\n"
    print(md)
    if args.rows:
        with open(args.rows, "w") as f:
            for kind, res in results.items():
                for r in res["records"]:
                    f.write(json.dumps({"kind": kind, **r}) + "\n")
            # the unseen-device predictions, marked by how they were made
            for kind, per_dev in unseen.items():
                for u in per_dev.values():
                    for how, recs in u["records"].items():
                        for r in recs:
                            f.write(json.dumps({"kind": kind, "unseen_device": how, **r}) + "\n")
        print(f"wrote {args.rows}", file=sys.stderr)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(md + _other_sections(Path(args.out), md))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
