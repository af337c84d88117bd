"""Find where a configuration stops fitting: batch sizes bisected under a memory cap.

The ground truth for the capacity decision (``benchmarks/oom_boundary.py``). For each
corpus configuration and each cap, the batch size is searched until the largest size that
runs and the smallest that runs out of memory are within ``--tolerance`` (6%) of each
other. Every run is one labelled row: ``fits`` or ``oom``, with the allocator's peaks
under the cap, so a decision rule can be scored on the fitting runs (how many it rejects)
and on the ones that ran out of memory (how many it admits).

How a cap is made, and why it stands for a smaller card: on CUDA,
``torch.cuda.set_per_process_memory_fraction(cap / total)`` limits what the caching
allocator may reserve. When a new segment would pass the limit, the allocator behaves as
it does when ``cudaMalloc`` fails on a full card: it frees its cached, unused segments and
tries again before it raises ``torch.OutOfMemoryError``. The limit covers the allocator's
reserved memory only, not the CUDA context, so ``cap`` is the memory left to PyTorch.

- The model is built once per configuration (on the CPU, then moved, as a training script
  does) with no cap. Each run then sets the cap, makes a fresh optimizer, runs ``steps``
  training steps (the optimizer state appears in the first, the steady peak by the
  second), and frees everything but the parameters. The parameters' segments are the
  same as a fresh process's, and everything else is released before the next run.
- Memory counters per run: ``max_memory_allocated``, ``max_memory_reserved``, and the
  allocator's ``num_alloc_retries`` (a run with retries fitted only because cached
  blocks were freed) and ``num_ooms``.
- Each process records the device memory it held before any model existed
  (``kind: "context"``): NVML's used memory minus what torch reserved, after CUDA
  started, after the first cuBLAS matmul and after the first cuDNN convolution.
- It imports torch and costaware's torch-only modules alone (a bare GPU machine has
  neither catboost nor optuna). Rows are appended one gzip member each, so an interrupted
  run keeps what it measured; a rerun with the same file skips each (configuration, cap)
  already searched.
- On the CPU (for tests) no cap can be set: a run counts as ``oom`` when the CPU
  allocator's peak is over the cap, ``simulated: true`` in its row.

Example (on a GPU, 12 and 24 GiB caps, 6 minutes)::

    python -m costaware.measure.oomprobe --out h200-oom-seed0.jsonl.gz --caps 12,24 --max-minutes 6
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import os
import statistics
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from costaware.measure.collect import _now, _time_limit, append_row, read_rows
from costaware.measure.corpus import Config, full_corpus
from costaware.measure.profile import (
    _failure,
    _train_step,
    clear_cuda_cache,
    environment,
    nvml_driver,
)

__all__ = [
    "SCHEMA_VERSION",
    "boundaries",
    "boundary_configs",
    "context_memory",
    "main",
    "probe_boundary",
]

#: Version of the probe row layout (see data/README.md).
SCHEMA_VERSION = 1
GiB = 1 << 30
#: the largest batch size searched: a configuration that fits there is recorded as such
MAX_BATCH = 1 << 16


def boundary_configs(
    seed: int = 0, per_family: int = 1, allocator: str = "default", kind: str = "gpu"
) -> list[Config]:
    """The configurations probed: per family of the ``kind`` corpus (seed ``seed``), the
    ``per_family`` with the most forward FLOPs per sample (the ones whose boundary lies at
    batch sizes a study would use), with cuDNN's benchmark search off (it sizes its
    workspaces from the memory free at the time, which a cap changes) and the allocator
    set to the process's own (``allocator``), families in a fixed order."""
    by_family: dict[str, list[Config]] = {}
    for cfg in full_corpus(kind, seed):
        by_family.setdefault(cfg.family, []).append(cfg)
    chosen: list[Config] = []
    for family in sorted(by_family):
        ranked = sorted(by_family[family], key=lambda c: (-c.fwd_flops, c.id))
        for cfg in ranked[:per_family]:
            chosen.append(dataclasses.replace(cfg, cudnn_benchmark=False, allocator=allocator))
    return chosen


def boundaries(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """What the probe ``rows`` found per (configuration id, cap in bytes): ``fit``, the
    largest batch size that fitted (0 where none did), ``oom``, the smallest that ran out
    of memory (None where none did), and ``row``, the first of its rows (its
    configuration, family, ...). Rows that are not a probe that fitted or ran out of
    memory are left out."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for r in rows:
        if r.get("kind") != "probe" or r.get("status") not in ("fits", "oom"):
            continue
        b = found.setdefault(
            (str(r["config_id"]), int(r["cap_bytes"])), {"row": r, "fit": 0, "oom": None}
        )
        size = int(r["batch_size"])
        if r["status"] == "fits":
            b["fit"] = max(b["fit"], size)
        elif b["oom"] is None or size < b["oom"]:
            b["oom"] = size
    return found


def _nvml_used(index: int) -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # NVML is optional
        return None


def context_memory(device: torch.device) -> dict[str, Any]:
    """What this process holds on ``device`` outside the caching allocator, at each stage
    of starting up: NVML's used memory minus torch's reserved memory (bytes; None without
    NVML), and NVML's used memory before CUDA started (other processes, usually 0)."""
    index = device.index or 0
    stages: dict[str, Any] = {"before_cuda": _nvml_used(index)}

    def held() -> int | None:
        torch.cuda.synchronize(device)
        used = _nvml_used(index)
        return None if used is None else used - int(torch.cuda.memory_reserved(device))

    torch.cuda.init()  # type: ignore[no-untyped-call]
    torch.zeros(1, device=device)
    stages["after_init"] = held()
    a = torch.randn(256, 256, device=device)
    (a @ a).sum().item()
    stages["after_cublas"] = held()
    x = torch.randn(1, 3, 16, 16, device=device, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, device=device, requires_grad=True)
    torch.nn.functional.conv2d(x, w).sum().backward()  # type: ignore[no-untyped-call]
    stages["after_cudnn"] = held()
    del a, x, w
    clear_cuda_cache(device)
    return stages


class _Prober:
    """Runs one configuration's training steps at a batch size under a cap."""

    def __init__(
        self, cfg: Config, device: torch.device, steps: int, model: torch.nn.Module | None = None
    ) -> None:
        self.cfg = cfg
        self.device = device
        self.steps = steps
        self.is_cuda = device.type == "cuda"
        if self.is_cuda:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
            clear_cuda_cache(device)
        if model is None:
            spec = cfg.to_spec()
            model = spec.model() if callable(spec.model) else spec.model
        self.model = model.to(device).train()
        self.param_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.buffer_bytes = sum(b.numel() * b.element_size() for b in self.model.buffers())
        self.total = torch.cuda.get_device_properties(device).total_memory if self.is_cuda else 0

    def release(self) -> torch.nn.Module:
        """The model, moved back to the CPU (kept there for the next cap's search)."""
        model = self.model.cpu()
        del self.model
        gc.collect()
        if self.is_cuda:
            clear_cuda_cache(self.device)
        return model

    def run(self, batch_size: int, cap: int, timeout_s: float) -> dict[str, Any]:
        spec = dataclasses.replace(self.cfg, batch_size=batch_size).to_spec()
        row: dict[str, Any] = {"batch_size": batch_size, "status": "fits"}
        dev = self.device
        opt: torch.optim.Optimizer | None = None
        times: list[float] = []
        peak_meter: Any = None
        if self.is_cuda:
            clear_cuda_cache(dev)
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / self.total), dev)
            torch.cuda.reset_peak_memory_stats(dev)
            torch.cuda.reset_accumulated_memory_stats(dev)  # type: ignore[no-untyped-call]
            torch.backends.cudnn.benchmark = False
        else:
            from costaware.measure.profile import AllocatorPeak

            peak_meter = AllocatorPeak().start()
        try:
            with _time_limit(timeout_s) as fired:
                opt = spec.optimizer_class(self.model.parameters(), **dict(spec.optimizer_kwargs))
                for _ in range(self.steps):
                    t0 = time.perf_counter()
                    _train_step(spec, self.model, opt, dev)
                    if self.is_cuda:
                        torch.cuda.synchronize(dev)
                    times.append(time.perf_counter() - t0)
                fired[1] = False
        except Exception as e:  # an OOM is the answer; anything else is recorded
            status, message = _failure(e)
            row["status"] = "timeout" if type(e).__name__ == "_ConfigTimeout" else status
            row["error"] = message[:300]
            del e
        finally:
            self.model.zero_grad(set_to_none=True)
            del opt
            gc.collect()
        if self.is_cuda:
            stats = torch.cuda.memory_stats(dev)
            row["max_allocated"] = int(torch.cuda.max_memory_allocated(dev))
            row["max_reserved"] = int(torch.cuda.max_memory_reserved(dev))
            row["num_alloc_retries"] = int(stats.get("num_alloc_retries", 0))
            row["num_ooms"] = int(stats.get("num_ooms", 0))
            clear_cuda_cache(dev)
            torch.cuda.set_per_process_memory_fraction(1.0, dev)
        else:
            peak_meter.stop()
            peak = peak_meter.peak
            row["max_allocated"] = row["max_reserved"] = peak
            row["simulated"] = True
            if row["status"] == "fits" and peak is not None and peak > cap:
                row["status"] = "oom"
                row["error"] = "simulated: the CPU allocator's peak is over the cap"
        if row["status"] == "fits" and times:
            row["step_times"] = [round(t, 6) for t in times]
            row["steady_step_s"] = statistics.median(times[1:] or times)
        return row


def _crossing(points: list[tuple[int, int]], cap: int) -> float | None:
    """Where the line through the fitting runs' allocated peaks meets ``cap``: through the
    largest batch size run and the smallest at most half of it (a longer base than two
    neighbours, whose peaks can differ by less than the allocator's rounding), or None."""
    if len(points) < 2:
        return None
    ordered = sorted(points)
    b2, m2 = ordered[-1]
    base = [p for p in ordered if p[0] * 2 <= b2] or ordered[:-1]
    b1, m1 = base[0] if base[0][0] * 2 <= b2 else base[-1]
    if b2 <= b1 or m2 <= m1:
        return None
    guess = b2 + (cap - m2) * (b2 - b1) / (m2 - m1)
    return guess if math.isfinite(guess) and guess > 0 else None


def _next_batch(
    lo: int | None,
    hi: int | None,
    points: list[tuple[int, int]],
    cap: int,
    static: int,
    tolerance: float,
    bisect: bool = False,
) -> int | None:
    """The next batch size to run, or None when the search is done.

    ``lo`` is the largest size that fitted, ``hi`` the smallest that did not; ``points``
    the (batch size, allocated peak) of runs that fitted. The allocated peak is near linear
    in the batch size, so the next size is where the line through the fitting runs (or
    through ``static``, the batch-independent bytes, when one run fitted) meets the cap,
    kept strictly inside (lo, hi). With ``bisect`` (the caller's two last runs landed on
    the same side of the boundary, so the line is misleading) or when the line says
    nothing useful, the bracket is halved (geometrically).
    """
    if lo is not None and lo >= MAX_BATCH:
        return None
    if lo is not None and hi is not None and (hi <= lo + 1 or hi <= lo * (1 + tolerance)):
        return None
    guess = _crossing(points, cap)
    if guess is None and len(points) == 1:
        b1, m1 = points[0]
        if m1 > static and cap > static:
            guess = (cap - static) / ((m1 - static) / b1)
    if lo is None:  # nothing fitted at this cap yet
        assert hi is not None
        if hi <= 1:
            return None
        if guess is not None and not bisect:  # just under the line's crossing, and under hi
            return max(1, min(int(guess * 0.97), int(hi * 0.9), hi - 1))
        return max(1, hi // 4)
    if hi is not None and bisect:
        guess = math.sqrt(lo * hi) / 1.02
    if guess is None:
        guess = lo * 4 if hi is None else math.sqrt(lo * hi) / 1.02
    nxt = round(guess * 1.02)  # a little past the crossing: the bracket closes from both sides
    if hi is None:
        nxt = min(max(nxt, lo + 1), lo * 8, MAX_BATCH)
    else:  # off the bracket's ends, where a run learns almost nothing
        margin = max(1, (hi - lo) // 8)
        nxt = min(max(nxt, lo + margin), hi - margin)
    if nxt <= lo or (hi is not None and nxt >= hi):
        return None
    return nxt


def probe_boundary(
    prober: _Prober,
    cap: int,
    start: int,
    *,
    tolerance: float = 0.06,
    max_runs: int = 10,
    timeout_s: float = 60.0,
    deadline: float | None = None,
    points: list[tuple[int, int]] | None = None,
) -> Iterator[dict[str, Any]]:
    """Search the batch size at which ``prober``'s configuration stops fitting under
    ``cap`` bytes; yields each run's row (``run`` numbers them).

    ``points`` are (batch size, allocated peak) pairs of runs that fitted, from earlier
    searches of the same configuration (the allocated peak does not depend on the cap):
    with two, the search starts where their line meets the cap, else at ``start``. The
    list is extended with this search's own fitting runs.
    """
    static_mult = {"sgd": 3, "adam": 4, "adamw": 4}.get(prober.cfg.optimizer, 4)
    static = static_mult * prober.param_bytes + prober.buffer_bytes
    lo: int | None = None
    hi: int | None = None
    points = [] if points is None else points
    b: int | None = max(1, min(start, MAX_BATCH))
    crossing = _crossing(points, cap)
    if crossing is not None:
        b = max(1, min(int(crossing), MAX_BATCH))
    statuses: list[str] = []
    for run in range(max_runs):
        if b is None or (deadline is not None and time.monotonic() > deadline):
            return
        row = prober.run(b, cap, timeout_s)
        row["run"] = run
        yield row
        statuses.append(str(row["status"]))
        if row["status"] == "fits":
            lo = b
            if row.get("max_allocated"):
                points.append((b, int(row["max_allocated"])))
        elif row["status"] == "oom":
            hi = b
        else:  # an error or a timeout ends this search
            return
        same_side = len(statuses) >= 2 and statuses[-1] == statuses[-2]
        b = _next_batch(lo, hi, points, cap, static, tolerance, bisect=same_side)


def _done(path: str) -> set[tuple[str, int]]:
    """The (configuration, cap) searches ``path`` already holds to their end."""
    if not os.path.exists(path):
        return set()
    return {
        (str(r["config_id"]), int(r["cap_bytes"]))
        for r in read_rows(path)
        if r.get("kind") == "search_end" and not str(r.get("status")).startswith("build_")
    }


def _parse_caps(text: str) -> list[int]:
    caps = []
    for part in text.split(","):
        part = part.strip()
        try:
            gib = float(part)
        except ValueError:
            raise SystemExit(
                f"costaware oomprobe: error: --caps takes GiB numbers separated by commas, "
                f"such as 12,24; got {part!r}."
            ) from None
        if not gib > 0:
            raise SystemExit(f"costaware oomprobe: error: a cap must be above 0 GiB, not {part}.")
        caps.append(int(gib * GiB))
    return caps


def _probe_device(name: str) -> torch.device | None:
    """The device to probe on, with an index for a CUDA one (the memory fraction wants
    one); None, with the error printed, where a CUDA device is asked for and none is here."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("costaware oomprobe: error: no CUDA GPU here; use --device cpu.", file=sys.stderr)
        return None
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    return device


def run(args: argparse.Namespace) -> int:
    """Search each configuration's boundary under each cap, caps outermost, appending
    every run to ``args.out``; stops cleanly at ``--max-minutes``. Returns the exit code
    (2: no CUDA GPU for a CUDA device)."""
    device = _probe_device(args.device)
    if device is None:
        return 2
    caps = _parse_caps(args.caps)
    allocator = _allocator_mode()
    configs = _chosen_configs(args, allocator)
    done = _done(args.out)
    started = time.monotonic()
    deadline = started + 60 * args.max_minutes if args.max_minutes else None
    append_row(args.out, _context_row(device, allocator))
    n_runs = n_searches = 0
    models: dict[str, torch.nn.Module] = {}  # built once, kept on the CPU between caps
    points = _fitting_points(args.out)
    # caps outermost: an interrupted run has every family at the first caps
    for cap in caps:
        for cfg in configs:
            if (cfg.id, cap) in done:
                continue
            if deadline is not None and time.monotonic() > deadline - 10:
                print(
                    f"[oomprobe] out of time after {n_searches} searches, {n_runs} runs", flush=True
                )
                return 0
            runs, searched = _search(
                args, cfg, cap, device, allocator, deadline, models, points.setdefault(cfg.id, [])
            )
            n_runs += runs
            n_searches += searched
    print(
        f"[oomprobe] done: {n_searches} searches, {n_runs} runs in "
        f"{time.monotonic() - started:.0f} s",
        flush=True,
    )
    return 0


def run_listed(args: argparse.Namespace) -> int:
    """Run each (configuration, cap, batch size) of the JSON list ``args.runs`` once under
    its cap, appending a ``listed`` row (the probe's fields) to ``args.out``: the sizes a
    search found (``CostModel.max_batch_size``), checked on the GPU. Resumes; stops
    cleanly at ``--max-minutes``. Returns the exit code."""
    import json

    device = _probe_device(args.device)
    if device is None:
        return 2
    with open(args.runs) as f:
        wanted = json.load(f)
    done = set()
    if os.path.exists(args.out):
        done = {
            (str(r["config_id"]), int(r["cap_bytes"]), int(r["batch_size"]))
            for r in read_rows(args.out)
            if r.get("kind") == "listed"
        }
    allocator = _allocator_mode()
    append_row(args.out, _context_row(device, allocator))
    deadline = time.monotonic() + 60 * args.max_minutes if args.max_minutes else None
    models: dict[str, torch.nn.Module] = {}
    n = 0
    for item in wanted:
        cfg = Config.from_dict(item["config"])
        cap, batch = int(item["cap_bytes"]), int(item["batch_size"])
        if (cfg.id, cap, batch) in done:
            continue
        if deadline is not None and time.monotonic() > deadline - 10:
            print(f"[oomprobe] out of time after {n} listed runs", flush=True)
            return 0
        prober = _Prober(cfg, device, args.steps, models.pop(cfg.id, None))
        row = prober.run(batch, cap, args.timeout)
        row.update(_run_fields("listed", prober, cap, allocator))
        row["why"] = item.get("why", "")
        append_row(args.out, row)
        n += 1
        if not args.quiet:
            print(_run_line(cfg, cap, row), flush=True)
        models[cfg.id] = prober.release()
        del prober
    print(f"[oomprobe] done: {n} listed runs", flush=True)
    return 0


def _allocator_mode() -> str:
    """The CUDA allocator mode this process runs with, from ``PYTORCH_CUDA_ALLOC_CONF``:
    ``"expandable_segments"`` or ``"default"`` (fixed when CUDA starts)."""
    return (
        "expandable_segments"
        if "expandable_segments:true"
        in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()
        else "default"
    )


def _chosen_configs(args: argparse.Namespace, allocator: str) -> list[Config]:
    """The configurations to search: ``--per-family`` of each family of the corpus, with
    this process's allocator, narrowed to ``--families`` and cut at ``--limit``."""
    configs = boundary_configs(args.seed, args.per_family, allocator, args.corpus)
    if args.families:
        wanted = {f.strip() for f in args.families.split(",")}
        configs = [c for c in configs if c.family in wanted]
    if args.limit is not None:
        configs = configs[: args.limit]
    return configs


def _context_row(device: torch.device, allocator: str) -> dict[str, Any]:
    """The run's first row: its environment, and on CUDA the device memory held before
    any model exists (measured first, since :func:`environment` starts CUDA)."""
    # the context first: environment() starts CUDA
    context = context_memory(device) if device.type == "cuda" else None
    return {
        "kind": "context",
        "schema": SCHEMA_VERSION,
        "env": environment(str(device)),
        "started_at": _now(),
        "device": str(device),
        "allocator": allocator,
        "context": context,
        "driver": nvml_driver() if context is not None else None,
    }


def _fitting_points(out: str) -> dict[str, list[tuple[int, int]]]:
    """Each configuration's (batch size, allocated peak) of the fitting runs already in
    ``out``: a resumed file's runs guide the new searches."""
    points: dict[str, list[tuple[int, int]]] = {}
    if os.path.exists(out):  # a resumed file's fitting runs guide the new searches
        for r in read_rows(out):
            if r.get("kind") == "probe" and r.get("status") == "fits" and r.get("max_allocated"):
                points.setdefault(str(r["config_id"]), []).append(
                    (int(r["batch_size"]), int(r["max_allocated"]))
                )
    return points


def _search(
    args: argparse.Namespace,
    cfg: Config,
    cap: int,
    device: torch.device,
    allocator: str,
    deadline: float | None,
    models: dict[str, torch.nn.Module],
    points: list[tuple[int, int]],
) -> tuple[int, int]:
    """One configuration's search under one cap: each run appended as a ``probe`` row,
    then a ``search_end`` row unless the deadline cut it short (or the model could not
    be built: a ``search_end`` row with the failure). The model is kept in ``models``
    for the next cap. Returns (runs made, searches completed)."""
    try:
        prober = _Prober(cfg, device, args.steps, models.pop(cfg.id, None))
    except Exception as e:
        status, message = _failure(e)
        append_row(
            args.out,
            {
                "kind": "search_end",
                "config_id": cfg.id,
                "cap_bytes": cap,
                "status": "build_" + status,
                "error": message,
                "finished_at": _now(),
            },
        )
        return 0, 0
    runs = searched = 0
    last: dict[str, Any] = {}
    for row in probe_boundary(
        prober,
        cap,
        cfg.batch_size,
        tolerance=args.tolerance,
        timeout_s=args.timeout,
        deadline=deadline,
        points=points,
    ):
        row.update(_run_fields("probe", prober, cap, allocator))
        append_row(args.out, row)
        runs += 1
        last = row
        if not args.quiet:
            print(_run_line(cfg, cap, row), flush=True)
    timed_out = deadline is not None and time.monotonic() > deadline
    if last and not timed_out:
        append_row(
            args.out,
            {
                "kind": "search_end",
                "config_id": cfg.id,
                "cap_bytes": cap,
                "status": last.get("status"),
                "finished_at": _now(),
            },
        )
        searched = 1
    models[cfg.id] = prober.release()
    del prober
    return runs, searched


def _run_fields(kind: str, prober: _Prober, cap: int, allocator: str) -> dict[str, Any]:
    """What a run's row says besides the run itself: its kind, the configuration, the cap,
    the device and the allocator mode."""
    cfg = prober.cfg
    return {
        "kind": kind,
        "schema": SCHEMA_VERSION,
        "config": cfg.to_dict(),
        "config_id": cfg.id,
        "family": cfg.family,
        "cap_bytes": cap,
        "gpu_total": prober.total,
        "param_bytes": prober.param_bytes,
        "allocator": allocator,
        "device": str(prober.device),
        "finished_at": _now(),
    }


def _run_line(cfg: Config, cap: int, row: Mapping[str, Any]) -> str:
    """One run's progress line: the family, cap and batch size, whether it fitted, and
    the allocator's peaks and retries under the cap."""
    return (
        f"[oomprobe] {cfg.family:<18} cap {cap / GiB:5.1f} GiB  "
        f"batch {row['batch_size']:>6}  {row['status']:<7} "
        f"alloc {(row.get('max_allocated') or 0) / GiB:6.2f}  "
        f"reserved {(row.get('max_reserved') or 0) / GiB:6.2f} GiB  "
        f"retries {row.get('num_alloc_retries', '-')}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m costaware.measure.oomprobe``: bisect batch sizes under memory caps (torch-only)."""
    p = argparse.ArgumentParser(
        prog="python -m costaware.measure.oomprobe",
        description=(
            "For one configuration per corpus family, search the largest batch size that "
            "trains under each memory cap (set_per_process_memory_fraction on CUDA), and "
            "append every run as a labelled row (fits / oom, the peaks under the cap) to a "
            ".jsonl.gz file. The allocator mode is PYTORCH_CUDA_ALLOC_CONF's."
        ),
    )
    p.add_argument("--out", required=True, help="output .jsonl.gz file (appended to; resumes)")
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a simulated cap (tests)")
    p.add_argument(
        "--caps", default="12,24,8", help="caps in GiB, in the order searched (default 12,24,8)"
    )
    p.add_argument("--seed", type=int, default=0, help="corpus seed the configurations come from")
    p.add_argument(
        "--corpus",
        choices=("gpu", "cpu"),
        default="gpu",
        help="which corpus the configurations come from (default gpu; cpu for tests)",
    )
    p.add_argument(
        "--per-family", type=int, default=1, help="configurations per family (default 1)"
    )
    p.add_argument("--families", default="", help="only these families (comma-separated)")
    p.add_argument("--limit", type=int, default=None, help="at most this many configurations")
    p.add_argument("--steps", type=int, default=3, help="training steps per run (default 3)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=0.06,
        help="stop when the largest fit and smallest OOM are this close (default 0.06)",
    )
    p.add_argument(
        "--timeout", type=float, default=60.0, help="seconds allowed per run (default 60)"
    )
    p.add_argument("--max-minutes", type=float, default=None, help="stop cleanly after this")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument(
        "--runs",
        help="instead of searching, run each {config, cap_bytes, batch_size} of this JSON "
        "list once under its cap (rows of kind 'listed')",
    )
    args = p.parse_args(argv)
    return run_listed(args) if args.runs else run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
