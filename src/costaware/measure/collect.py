"""Measure corpus configurations for real and append the results to a ``.jsonl.gz`` file.

Runs on a bare GPU machine: it imports only torch, the standard library and costaware's
torch-only modules (:mod:`costaware.spec`, :mod:`costaware.measure.profile`, :mod:`costaware.zoo`,
:mod:`costaware.measure.corpus`), never catboost, gensim, SQLAlchemy, rich or tqdm.

- One JSON line per configuration, each line its own gzip member appended to the file
  (gzip readers read concatenated members as one stream), so an interrupted run loses at
  most the configuration in flight; :func:`read_rows` also tolerates a truncated tail.
- ``resume=True`` skips the config ids already in the file. A configuration that killed
  the process (a segfault, the machine's time limit) is recorded as ``status="crash"``
  on the next run, from the ``.inflight`` marker written next to the file, and skipped.
- An OOM or any error is a row too (``status`` "oom" / "error"), never a crash.
- ``max_minutes`` stops cleanly between configurations, before one that would not finish
  in time (judged on the corpus's rough estimate, scaled by the pace seen so far).
- On CUDA, each allocator mode (``PYTORCH_CUDA_ALLOC_CONF``) is measured in its own child
  process, since the allocator is fixed when CUDA starts; a child that dies is restarted
  after its configuration is recorded as a crash.

Example (this machine's CPU, 15 minutes)::

    python -m costaware.measure.collect --corpus cpu --device cpu --out data/cpu/cpu-shard0.jsonl.gz \\
        --max-minutes 15
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import gzip
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from costaware.devices import cpu_device, cpu_half_flags
from costaware.measure.corpus import KINDS, Config, corpus, recommended_shards, shard_estimates
from costaware.measure.profile import (
    ALLOCATOR_METHOD,
    Measurement,
    host_speed,
    in_context_op_times,
    measure,
)

__all__ = [
    "SCHEMA_VERSION",
    "CollectSummary",
    "append_row",
    "collect",
    "done_ids",
    "main",
    "observations",
    "read_rows",
    "reserved_before",
]

#: Version of the row layout (see data/README.md).
SCHEMA_VERSION = 1
_ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------------------- file I/O
def append_row(path: str | os.PathLike[str], row: dict[str, Any]) -> None:
    """Append ``row`` as one JSON line, in a gzip member of its own, and flush it to disk."""
    data = gzip.compress((json.dumps(row, separators=(",", ":")) + "\n").encode(), mtime=0)
    with open(path, "ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def in_measured_order(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` in the order they were measured (``finished_at``; a row without one first),
    rows of equal time in the order given.

    Where one configuration was measured more than once, the last row is the one that
    counts (``costaware fit``, the accuracy benchmark). Reading files in name order is not
    measured order: a later window's repeat of a shard (``data/gpu_window.sh repeat``,
    ``h100-repeat-DATE-shard0``) sorts before the shard's own file. In this order, too,
    ``fit`` gives the same model whatever order its files are named in (a CatBoost fit
    depends on the order of its rows).
    """
    return sorted(rows, key=lambda r: str(r.get("finished_at") or ""))


def read_rows(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The rows of a ``.jsonl.gz`` file written by :func:`append_row`.

    A truncated last member (a run killed mid-write) is ignored; so are blank lines.
    """
    raw = Path(path).read_bytes()
    buf = b""
    while raw:
        d = zlib.decompressobj(wbits=31)
        try:
            chunk = d.decompress(raw)
        except zlib.error:
            break
        if not d.eof:  # truncated member
            break
        buf += chunk
        raw = d.unused_data
    for line in buf.decode("utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue


def done_ids(path: str | os.PathLike[str]) -> set[str]:
    """Config ids already recorded in ``path`` (any status); empty if it does not exist."""
    if not Path(path).is_file():
        return set()
    return {str(r["id"]) for r in read_rows(path) if "id" in r}


def _inflight_path(out: Path) -> Path:
    return out.with_name(out.name + ".inflight")


# ------------------------------------------------------------------------------- progress
def _fmt_s(seconds: float) -> str:
    s = int(max(0.0, seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class _Progress:
    """A ``\\r`` progress bar on a TTY, else a log line every ``every`` configurations."""

    def __init__(
        self, total: int, total_est: float, enabled: bool, stream: TextIO, every: int = 10
    ) -> None:
        self.total, self.total_est = total, max(total_est, 1e-9)
        self.enabled, self.stream, self.every = enabled, stream, every
        self.tty = enabled and hasattr(stream, "isatty") and stream.isatty()
        self.t0 = time.perf_counter()
        self.done = 0
        self.done_est = 0.0
        self.counts: dict[str, int] = {}

    def eta(self) -> float:
        elapsed = time.perf_counter() - self.t0
        if self.done_est <= 0:
            return self.total_est
        return elapsed * (self.total_est - self.done_est) / self.done_est

    def update(self, cfg: Config, status: str, seconds: float) -> None:
        self.done += 1
        self.done_est += cfg.est_seconds
        self.counts[status] = self.counts.get(status, 0) + 1
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.t0
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        if self.tty:
            width = 24
            filled = int(width * self.done / max(self.total, 1))
            bar = "#" * filled + "." * (width - filled)
            line = (
                f"\r[{bar}] {self.done}/{self.total} {_fmt_s(elapsed)} ETA {_fmt_s(self.eta())} "
                f"{counts} | {cfg.id} {status} {seconds:.1f}s"
            )
            self.stream.write(line[:160].ljust(160))
            self.stream.flush()
        elif self.done % self.every == 0 or self.done == self.total:
            self.stream.write(
                f"[collect] {self.done}/{self.total} done, {_fmt_s(elapsed)} elapsed, "
                f"ETA {_fmt_s(self.eta())}, {counts}; last {cfg.id} {status} {seconds:.1f}s\n"
            )
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


# ------------------------------------------------------------------------------- collect
@dataclass
class CollectSummary:
    """What one :func:`collect` call did."""

    out_path: str
    measured: int = 0
    skipped: int = 0
    remaining: int = 0
    stopped_early: bool = False
    seconds: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)
    #: the lowest and highest of each host-speed figure over the configurations measured
    #: (``env["host_speed"]``): how far the machine's speed moved during the run
    host_speed: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __str__(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in sorted(self.statuses.items())) or "none"
        stop = " (stopped at the time limit)" if self.stopped_early else ""
        speed = ""
        if self.host_speed:
            parts = [
                f"{name} {lo:g}-{hi:g} {unit}"
                for key, name, unit in _SPEED_FIGURES
                if key in self.host_speed
                for lo, hi in [self.host_speed[key]]
            ]
            speed = f"; host speed: {', '.join(parts)}"
        return (
            f"measured {self.measured} configurations in {_fmt_s(self.seconds)} "
            f"({counts}); skipped {self.skipped} already recorded; {self.remaining} left{stop}"
            f"{speed} -> {self.out_path}"
        )


#: host_speed key, name and unit in the summary line
_SPEED_FIGURES = (
    ("dispatch_us", "op call", "us"),
    ("matmul_gflops", "matmul", "GFLOP/s"),
    ("add_gbs", "add", "GB/s"),
)


def _speed_range(speeds: Iterable[Mapping[str, Any] | None]) -> dict[str, tuple[float, float]]:
    """Each host-speed figure's lowest and highest value over ``speeds``."""
    seen: dict[str, list[float]] = {}
    for speed in speeds:
        for key, value in (speed or {}).items():
            if isinstance(value, (int, float)):
                seen.setdefault(key, []).append(float(value))
    return {key: (min(v), max(v)) for key, v in seen.items()}


def _device_name(device: str, env: dict[str, Any]) -> str:
    if device.startswith("cuda"):
        return str(env.get("gpu") or "cuda")
    return "CPU"


def _row(
    cfg: Config,
    m: Measurement,
    device: str,
    started: str,
    extra_env: dict[str, Any],
) -> dict[str, Any]:
    md = m.to_dict()
    env = dict(md.pop("env", {}) or {})
    env.update(extra_env)
    return {
        "schema": SCHEMA_VERSION,
        "id": cfg.id,
        "family": cfg.family,
        "status": m.status,
        "device": device,
        "device_name": _device_name(device, env),
        "config": cfg.to_dict(),
        "measurement": md,
        "env": env,
        "started_at": started,
        "finished_at": _now(),
    }


def _failure_row(
    cfg: Config, device: str, status: str, error: str, extra_env: dict[str, Any]
) -> dict[str, Any]:
    m = Measurement(status=status, device=device, error=error)
    row = _row(cfg, m, device, _now(), extra_env)
    row["env"].setdefault("torch", torch.__version__)
    return row


def _alloc_matches(cfg: Config) -> bool:
    conf = os.environ.get(_ALLOC_ENV, "").replace(" ", "").lower()
    return (cfg.allocator == "expandable_segments") == ("expandable_segments:true" in conf)


def _recover_crash(out: Path, device: str, extra_env: dict[str, Any], known: set[str]) -> None:
    """Record the configuration a killed run was measuring as ``status="crash"``."""
    marker = _inflight_path(out)
    if not marker.is_file():
        return
    try:
        info = json.loads(marker.read_text())
        cfg = Config.from_dict(info["config"])
    except (OSError, ValueError, KeyError, TypeError):
        marker.unlink(missing_ok=True)
        return
    if cfg.id not in known:
        msg = "the process died while measuring this configuration (segfault, kill or time limit)"
        append_row(out, _failure_row(cfg, device, "crash", msg, extra_env))
        known.add(cfg.id)
    marker.unlink(missing_ok=True)


def collect(
    configs: Sequence[Config],
    out_path: str | os.PathLike[str],
    device: str = "cuda",
    *,
    max_minutes: float | None = None,
    resume: bool = True,
    warmup: int = 3,
    steps: int = 10,
    progress: bool = True,
    spawn: bool | None = None,
    stream: TextIO | None = None,
    timeout_s: float | None = None,
    in_context: bool = False,
) -> CollectSummary:
    """Measure ``configs`` on ``device`` and append one row per configuration to ``out_path``.

    Args:
        configs: corpus configurations (:func:`costaware.measure.corpus.corpus`).
        out_path: a ``.jsonl.gz`` file; created (with its folder) if missing.
        device: ``"cpu"`` or ``"cuda"`` (``"cuda:1"``...).
        max_minutes: stop cleanly between configurations when the next one would not finish
            in time (the first one always runs).
        resume: skip config ids already in ``out_path`` (else measure them again).
        warmup, steps: passed to :func:`costaware.measure.profile.measure`.
        progress: a progress bar on a TTY, else a log line every 10 configurations.
        spawn: measure each allocator mode in a child process (default: True on CUDA; a
            child that dies is restarted after its configuration is recorded as a crash). Without it, configurations asking for another allocator than this
            process's ``PYTORCH_CUDA_ALLOC_CONF`` are left for another run.
        stream: where progress goes (default stdout).
        timeout_s: stop one configuration after this many seconds (a ``SIGALRM`` raised
            between operations, main thread on Unix only); its row gets
            ``status="timeout"``.
        in_context: after each measurement that succeeds, profile a few more steps of the
            configuration and keep each op's time in the step
            (:func:`costaware.measure.profile.in_context_op_times`) in the row's ``in_context``:
            what an op costs inside a model, against the op model's isolated timings
            (``benchmarks/in_context.py``). The profiled steps are not the timed ones.

    Returns:
        A :class:`CollectSummary`.
    """
    t0 = time.perf_counter()
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    stream = stream if stream is not None else sys.stdout
    is_cuda = device.startswith("cuda")
    extra_env = _collector_env()
    summary = CollectSummary(out_path=str(out))
    known = done_ids(out) if resume else set()
    if resume:
        _recover_crash(out, device, extra_env, known)
    todo = [c for c in configs if c.id not in known]
    summary.skipped = len(configs) - len(todo)
    if spawn is None:
        spawn = is_cuda
    if spawn:
        return _collect_spawned(
            todo, out, device, max_minutes, warmup, steps, progress, summary, timeout_s, in_context
        )
    todo, deferred = _defer_other_allocators(todo, is_cuda, stream)
    budget = None if max_minutes is None else max_minutes * 60.0
    bar = _Progress(len(todo), sum(c.est_seconds for c in todo), progress, stream)
    pace = 1.0  # observed / estimated seconds, to judge whether the next config fits
    spent_est = spent = 0.0
    marker = _inflight_path(out)
    speeds: list[dict[str, float]] = []
    for i, cfg in enumerate(todo):
        elapsed = time.perf_counter() - t0
        if budget is not None and i > 0 and elapsed + cfg.est_seconds * pace > budget:
            summary.stopped_early = True
            break
        started = _now()
        marker.write_text(json.dumps({"config": cfg.to_dict(), "started_at": started}))
        c0 = time.perf_counter()
        row = _measure_config(
            cfg,
            device,
            started,
            extra_env,
            speeds,
            warmup=warmup,
            steps=steps,
            timeout_s=timeout_s,
            in_context=in_context,
        )
        append_row(out, row)
        marker.unlink(missing_ok=True)
        took = time.perf_counter() - c0
        spent += took
        spent_est += cfg.est_seconds
        pace = min(5.0, max(0.5, spent / max(spent_est, 1e-9)))
        summary.measured += 1
        summary.statuses[row["status"]] = summary.statuses.get(row["status"], 0) + 1
        bar.update(cfg, row["status"], took)
        del row
        gc.collect()
        if is_cuda:
            torch.cuda.empty_cache()
    bar.close()
    summary.remaining = len(todo) - summary.measured + len(deferred)
    summary.seconds = time.perf_counter() - t0
    summary.host_speed = _speed_range(speeds)
    return summary


def _collector_env() -> dict[str, Any]:
    """What every row of this process records about its host beside the measurement's
    own environment: what a CPU step's buffers and speed depend on, and which collector
    and row layout wrote it."""
    return {
        "torch_threads": torch.get_num_threads(),
        # oneDNN's kernels, and so a CPU step's buffers, depend on the instruction set
        "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        # and a CPU's half-precision speed on its native bf16/fp16 arithmetic
        "cpu_half_flags": cpu_half_flags(),
        # the host's physical memory: a CPU device's memory is a feature
        "cpu_memory_bytes": cpu_device().memory_bytes,
        "hostname_hash": _host_hash(),
        "collector": "costaware.collect",
        "schema": SCHEMA_VERSION,
    }


def _defer_other_allocators(
    todo: list[Config], is_cuda: bool, stream: TextIO
) -> tuple[list[Config], list[Config]]:
    """``(to measure here, left for another run)``: on CUDA the allocator is fixed when
    CUDA starts, so a configuration asking for another allocator mode than this
    process's ``PYTORCH_CUDA_ALLOC_CONF`` cannot be measured in it; says how many."""
    deferred = [c for c in todo if is_cuda and not _alloc_matches(c)]
    if deferred:
        todo = [c for c in todo if not (is_cuda and not _alloc_matches(c))]
        stream.write(
            f"[collect] leaving {len(deferred)} configurations whose allocator differs from "
            f"{_ALLOC_ENV}={os.environ.get(_ALLOC_ENV, '')!r} for another run\n"
        )
    return todo, deferred


def _measure_config(
    cfg: Config,
    device: str,
    started: str,
    extra_env: dict[str, Any],
    speeds: list[dict[str, float]],
    *,
    warmup: int,
    steps: int,
    timeout_s: float | None,
    in_context: bool,
) -> dict[str, Any]:
    """One configuration's row: the host's speed probed just before (added to
    ``speeds``), the measurement under the time limit and, with ``in_context``, each
    op's time in the step; a configuration that cannot become a spec is an error row."""
    try:
        spec = cfg.to_spec()
    except Exception as e:  # a record that cannot become a spec is an error row
        return _failure_row(cfg, device, "error", f"{type(e).__name__}: {e}"[:500], extra_env)
    speed = host_speed()
    speeds.append(speed)
    m, context = _measure_within_limit(
        spec, device, warmup=warmup, steps=steps, timeout_s=timeout_s, in_context=in_context
    )
    row = _row(cfg, m, device, started, {**extra_env, "host_speed": speed})
    if context is not None:
        row["in_context"] = context
    return row


def _measure_within_limit(
    spec: Any, device: str, *, warmup: int, steps: int, timeout_s: float | None, in_context: bool
) -> tuple[Measurement, dict[str, Any] | None]:
    """The measurement of ``spec`` and, with ``in_context``, its in-context op times,
    both under one ``timeout_s`` alarm. A measurement the alarm stops is a timeout; a
    profile it stops keeps the measurement and records the timeout in the profile's place.
    Gradient mode is restored whatever the alarm interrupted."""
    grad_was = torch.is_grad_enabled()
    context: dict[str, Any] | None = None
    profiling = False  # set once the measurement is done and the profile runs
    with _time_limit(timeout_s) as fired:
        try:
            m = measure(spec, device, warmup=warmup, steps=steps)
            if in_context and m.status == "ok" and not fired[0]:
                profiling = True
                # the measurement warmed the process: one warm-up step, two profiled
                context = in_context_op_times(spec, device, warmup=1, steps=2)
        except _ConfigTimeout:  # fired outside measure's own guard
            if not profiling:
                m = Measurement(status="timeout", device=device)
        finally:
            fired[1] = False  # disarmed: a late alarm is ignored
            # an alarm between a grad-mode switch and its ``try`` (an optimizer's
            # step turns gradients off) would leave them off for what follows
            torch.set_grad_enabled(grad_was)
    if fired[0]:
        limit = f"stopped after the per-configuration limit of {timeout_s:g} s"
        if not profiling:
            m.status, m.error = "timeout", limit
        else:  # the measurement stands; the profile ran out of time
            context = {"status": "timeout", "error": limit, "device": device}
    return m, context


class _ConfigTimeout(Exception):
    """Raised by the alarm inside :func:`measure` (which records it as an error)."""


@contextlib.contextmanager
def _time_limit(seconds: float | None) -> Iterator[list[bool]]:
    """``[fired, armed]``; the alarm raises only while ``armed`` (the caller clears it)."""
    fired = [False, True]
    usable = (
        seconds is not None
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield fired
        return

    def _raise(signum: int, frame: Any) -> None:
        if fired[1]:
            fired[0] = True
            raise _ConfigTimeout(f"over {seconds} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, float(seconds))  # type: ignore[arg-type]
    try:
        yield fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _host_hash() -> str:
    import hashlib

    return hashlib.sha1(platform.node().encode()).hexdigest()[:8]


def _collect_spawned(
    todo: list[Config],
    out: Path,
    device: str,
    max_minutes: float | None,
    warmup: int,
    steps: int,
    progress: bool,
    summary: CollectSummary,
    timeout_s: float | None = None,
    in_context: bool = False,
) -> CollectSummary:
    """Run each allocator group in a child process (``python -m costaware.measure.collect``)."""
    t0 = time.perf_counter()
    groups: dict[str, list[Config]] = {}
    for c in todo:
        groups.setdefault(c.allocator, []).append(c)
    base_conf = [
        p
        for p in os.environ.get(_ALLOC_ENV, "").split(",")
        if p.strip() and not p.replace(" ", "").lower().startswith("expandable_segments")
    ]
    for allocator, group in sorted(groups.items()):
        env = dict(os.environ)
        parts = list(base_conf) + (
            ["expandable_segments:True"] if allocator == "expandable_segments" else []
        )
        env[_ALLOC_ENV] = ",".join(parts)
        with tempfile.NamedTemporaryFile(
            "w", suffix=".json", delete=False, prefix="costaware-configs-"
        ) as f:
            json.dump([c.to_dict() for c in group], f)
            cfg_file = f.name
        try:
            for _attempt in range(len(group) + 1):
                remaining_min = None
                if max_minutes is not None:
                    remaining_min = max_minutes - (time.perf_counter() - t0) / 60.0
                    if remaining_min <= 0:
                        summary.stopped_early = True
                        break
                cmd = [
                    sys.executable,
                    "-m",
                    "costaware.measure.collect",
                    "--configs-file",
                    cfg_file,
                    "--device",
                    device,
                    "--out",
                    str(out),
                    "--warmup",
                    str(warmup),
                    "--steps",
                    str(steps),
                    "--no-spawn",
                ]
                if remaining_min is not None:
                    cmd += ["--max-minutes", f"{remaining_min:.4f}"]
                if not progress:
                    cmd.append("--quiet")
                if timeout_s is not None:
                    cmd += ["--timeout", str(timeout_s)]
                if in_context:
                    cmd.append("--in-context")
                rows_before = len(done_ids(out))
                rc = subprocess.call(cmd, env=env)
                if rc == 0:
                    break
                if len(done_ids(out)) == rows_before and not _inflight_path(out).is_file():
                    sys.stdout.write(f"[collect] worker exited {rc} without progress; giving up\n")
                    break
                sys.stdout.write(
                    f"[collect] worker for allocator={allocator} exited {rc}; resuming\n"
                )
        finally:
            os.unlink(cfg_file)
    rows = {r["id"]: r for r in read_rows(out)} if out.is_file() else {}
    measured = [rows[c.id]["status"] for c in todo if c.id in rows]
    summary.measured = len(measured)
    for s in measured:
        summary.statuses[s] = summary.statuses.get(s, 0) + 1
    summary.host_speed = _speed_range(
        rows[c.id].get("env", {}).get("host_speed") for c in todo if c.id in rows
    )
    summary.remaining = len(todo) - len(measured)
    if summary.remaining and not summary.stopped_early and max_minutes is not None:
        summary.stopped_early = True
    summary.seconds = time.perf_counter() - t0
    return summary


# ------------------------------------------------------------------------------- to observations
def cpu_allocator_peak(measurement: dict[str, Any]) -> bool:
    """Whether a CPU row's peak is the CPU allocator's (:class:`costaware.measure.profile.AllocatorPeak`).

    CPU rows collected before it recorded the growth of the process's peak resident set,
    which in a collector's long-lived process can be a small part of what the tensors
    need; ``data/remeasure_cpu_memory.py`` re-measured the committed ones.
    """
    return str(measurement.get("memory_method", "")).startswith(ALLOCATOR_METHOD)


def reserved_before(measurement: dict[str, Any]) -> int | None:
    """Reserved bytes the process held when a GPU measurement began, or None if unknown.

    Rows from ``costaware.measure.profile.measure`` since the ``reserved_before`` field record it.
    Older rows give a lower bound: the reserved peak minus the NVML-measured growth of the
    process's device memory over the run (NVML's baseline is taken at the start, so memory
    held then is in the reserved peak but not in the growth; CUDA's lazily loaded kernels
    add to the growth, which is why it is a lower bound).
    """
    if measurement.get("reserved_before") is not None:
        return int(measurement["reserved_before"])
    peak, growth = measurement.get("max_reserved"), measurement.get("nvml_peak_used")
    if not peak or growth is None:
        return None
    return max(0, int(peak) - int(growth))


#: why :func:`observations` left a peak out that :func:`_held_cublas_workspace` holds
HELD_WORKSPACE_NOTE = "room for a cuBLAS workspace, which this step does not call"
#: ``Observation.meta["memory_left_out_kind"]``: why :func:`observations` kept a row for
#: time only, as a code (``meta["memory_left_out"]`` says it in words, with the figures)
LEFT_OUT_RSS = "rss_growth"  # a CPU row's resident-set growth, not its allocator's peak
LEFT_OUT_HELD = "held_memory"  # more than MAX_HELD_BEFORE reserved before the step
LEFT_OUT_WORKSPACE = "held_cublas_workspace"  # a cuBLAS workspace the step never calls
#: How far :func:`reserved_before` may fall short of a cuBLAS workspace held before a
#: measurement: NVML's and the caching allocator's 2 MiB granularities (it is a lower
#: bound for rows that did not record it).
_HELD_SLACK_BYTES = 4 << 20


def _held_cublas_workspace(held: int, feats: Mapping[str, float]) -> bool:
    """Whether a GPU peak measured with ``held`` bytes reserved before it includes a
    cuBLAS workspace that the step itself never allocates (``calls_cublas`` is 0).

    The H100 collector kept the workspace from one configuration to the next: 64-162 MiB
    were held before each U-Net and SqueezeNet, whose steps call no cuBLAS, and every such
    pair also measured on the H200 (whose collector drops the workspace first, holding
    16-42 MiB) allocated 65.0-67.5 MiB more on the H100 (65.0 in 17 of the 20 pairs).
    """
    from costaware.core.analytic import CUBLAS_WORKSPACE_BYTES  # not on the bare-GPU path

    return (
        held >= CUBLAS_WORKSPACE_BYTES - _HELD_SLACK_BYTES and feats.get("calls_cublas", 1.0) == 0.0
    )


#: features versions a features cache keeps, the most recently written first
_CACHE_VERSIONS = 4


#: the instruction set of the CPU that measured the CPU rows collected before rows
#: recorded it (``env.cpu_capability``): every one of them came from the development
#: container's AVX2 CPU (2026-11-22 to 2026-11-25), whose oneDNN buffers the CPU dry run
#: was fitted to
LEGACY_CPU_CAPABILITY = "AVX2"


def measured_cpu_capability(row: dict[str, Any]) -> str | None:
    """The instruction set a CPU row was measured on (None for a GPU row): the row's
    ``env.cpu_capability``, or :data:`LEGACY_CPU_CAPABILITY` for rows from before it was
    recorded."""
    if str(row.get("device", "cpu")).startswith("cuda"):
        return None
    env: dict[str, Any] = row["env"] if isinstance(row.get("env"), dict) else {}
    return str(env.get("cpu_capability") or LEGACY_CPU_CAPABILITY)


def measured_cpu_device(row: dict[str, Any]) -> Any:
    """The CPU a CPU row was measured on, as a :class:`~costaware.devices.Device`: its
    logical cores (``env.cpu_count``), half-precision flags (``env.cpu_half_flags``; none
    for rows from before it was recorded, which :data:`LEGACY_CPU_CAPABILITY`'s AVX2 CPU
    lacks) and physical memory (``env.cpu_memory_bytes``), whatever CPU computes the
    features. A row without a core count or memory gets this CPU's (the committed CPU rows
    record no memory: their features take this machine's, a feature the trees can split on,
    so a CPU time model refitted on another machine can differ a little)."""
    env: dict[str, Any] = row["env"] if isinstance(row.get("env"), dict) else {}
    cores, flags, memory = (
        env.get("cpu_count"),
        env.get("cpu_half_flags"),
        env.get("cpu_memory_bytes"),
    )
    return cpu_device(
        cores=cores if isinstance(cores, int) and cores >= 1 else None,
        flags=flags if isinstance(flags, list) else (),
        memory_bytes=memory if isinstance(memory, int) and memory > 0 else None,
    )


def _cache_key(row: dict[str, Any]) -> str:
    """What a row's features depend on: its configuration, its device and, on a CPU, the
    torch threads it was traced with and the CPU that measured it (instruction set, cores,
    native half precision, memory: :func:`_as_measured`, :func:`measured_cpu_device`). Not
    when it was measured: a configuration timed again (a repeat, a re-collection) has the
    features it had."""
    config = json.dumps(row.get("config"), sort_keys=True, default=str)
    digest = hashlib.sha1(config.encode()).hexdigest()[:12]
    threads = row.get("env", {}).get("torch_threads") if isinstance(row.get("env"), dict) else None
    key = f"{row.get('id')}|{row.get('device_name')}|{digest}|threads={threads}"
    isa = measured_cpu_capability(row)
    if isa is None:
        return key
    cpu = measured_cpu_device(row)
    half = ",".join(h for h in ("bf16", "fp16") if cpu.flops[h] == cpu.flops["fp32"])
    return f"{key}|isa={isa}|cores={cpu.sm_count}|half={half}|mem={cpu.memory_bytes}"


def features_version(model: Any) -> str:
    """The version a features cache is valid for: the feature version, and the op model's.

    The op-level time features depend on the op model (its data and settings), so a cache
    computed with another op model, or none, is not reused.
    """
    from costaware.core.features import FEATURE_VERSION

    kinds = ("cuda", "cpu")
    op_models = (
        [m for k in kinds if (m := model.op_model(k)) is not None]
        if hasattr(model, "op_model")
        else []
    )
    if not op_models:
        return FEATURE_VERSION
    parts = [[m.info_.get("data_sha256"), m._params()] for m in op_models]
    tag = hashlib.sha256(
        json.dumps(parts[0] if len(parts) == 1 else parts, sort_keys=True).encode()
    ).hexdigest()[:12]
    return f"{FEATURE_VERSION}+optime:{tag}"


@contextlib.contextmanager
def _as_measured(row: dict[str, Any], device: str) -> Iterator[None]:
    """Trace a CPU row as the CPU that measured it ran the step: with the torch threads it
    was measured with (PyTorch picks a CPU convolution's kernel by the thread count: a 1x1
    one on one thread is its own, not oneDNN's) and its instruction set (oneDNN's blocked
    layouts pad channels to 8 floats with AVX2, 16 with AVX-512), whatever CPU computes
    the features: the kernels' buffers are features."""
    if device != "CPU":
        yield
        return
    from costaware.core.trace import simulated_cpu_capability

    threads = row.get("env", {}).get("torch_threads")
    before = torch.get_num_threads()
    if isinstance(threads, int) and threads >= 1:
        torch.set_num_threads(threads)
    try:
        with simulated_cpu_capability(measured_cpu_capability(row)):
            yield
    finally:
        torch.set_num_threads(before)


def observations(
    rows: Sequence[dict[str, Any]],
    *,
    model: Any = None,
    on_row: Any = None,
    cache: str | os.PathLike[str] | None = None,
) -> tuple[list[Any], list[str]]:
    """``Observation`` s for measured rows, with the features ``model`` computes.

    Rows with status "ok" or "oom" become observations (an OOM carries no peak); "error"
    and "crash" rows, rows whose config cannot be rebuilt or traced, and GPUs missing from
    the catalog are skipped. A CPU peak that is not the CPU allocator's (a resident-set
    growth, recorded before :func:`cpu_allocator_peak`) is dropped (kept as a time row). So
    is a GPU peak measured while
    the process already held more than :data:`costaware.observation.MAX_HELD_BEFORE` reserved
    (:func:`reserved_before`; the same limit the store applies to a trial's peak), or held
    a cuBLAS workspace that the step never calls (:func:`_held_cublas_workspace`);
    ``meta["memory_left_out"]`` says so, and ``meta["memory_left_out_kind"]`` which of
    these it is (:data:`LEFT_OUT_RSS`, :data:`LEFT_OUT_HELD`,
    :data:`LEFT_OUT_WORKSPACE`). Returns ``(observations,
    reasons for each skipped row)``.

    ``model`` defaults to an unfitted ``CostModel()``; this imports costaware.core.model, so it
    is not for the bare-GPU path. ``on_row(i, row)`` is called before each row that needs
    features, for progress. ``cache`` is a ``.json.gz`` file of features already computed
    (keyed by row id, configuration, device and, on a CPU, torch threads, per features
    version: the feature version and the op model; a row measured again reuses its
    features); it is updated, and keeps the sections of up to ``_CACHE_VERSIONS``
    versions, so that a run with another op model, or none, does not discard them.
    """
    from costaware.core.model import CostModel, Observation
    from costaware.core.optime import catalog_device

    # a generous dry-run limit: this is offline, and a busy machine slows tracing down
    cm = model if model is not None else CostModel(trace_timeout=600.0)
    feats_cache = _FeaturesCache(Path(cache) if cache is not None else None, features_version(cm))
    out: list[Any] = []
    skipped: list[str] = []
    for i, row in enumerate(rows):
        status = row.get("status")
        rid = str(row.get("id", f"row{i}"))
        if row.get("kind") == "op":  # a per-op timing (costaware.measure.opbench), not a model
            skipped.append(f"{rid}: a per-op timing row")
            continue
        if "status" not in row:
            skipped.append(f"{rid}: not a measured row (no 'status'; costaware collect writes them)")
            continue
        if status not in ("ok", "oom"):
            skipped.append(f"{rid}: status {status}")
            continue
        key = _cache_key(row)
        try:
            dev = catalog_device(row)
            feats = feats_cache.get(key)
            if feats is None:
                if on_row is not None:
                    on_row(i, row)
                feats = _row_features(cm, row, dev)
                feats_cache.add(key, feats)
        except Exception as e:
            skipped.append(f"{rid}: {type(e).__name__}: {str(e)[:200]}")
            continue
        m = row.get("measurement", {})
        ok = status == "ok"
        meta: dict[str, Any] = {"id": rid, "source_device": row.get("device_name")}
        peak = _learnable_peak(m if ok else {}, dev, feats, meta)
        secs = m.get("iteration_time") if ok else None
        alloc = m.get("max_allocated") if peak is not None else None
        out.append(
            Observation(
                features=dict(feats),
                device=dev,
                peak_memory=float(peak) if peak else None,
                iteration_time=float(secs) if secs else None,
                status=str(status),
                family=str(row.get("family") or row["config"].get("family")),
                peak_allocated=float(alloc) if alloc else None,
                meta=meta,
            )
        )
    feats_cache.save()
    return out, skipped


def _row_features(cm: Any, row: dict[str, Any], dev: Any) -> Any:
    """The features ``cm`` computes for a row's configuration on the device that measured
    it, from the row's own dry run (never a rescale of another batch size); a CPU row is
    traced as its own CPU, not this one (:func:`_as_measured`)."""
    spec = Config.from_dict(row["config"]).to_spec()
    # a CPU row's features are its own CPU's, not this one's
    target = measured_cpu_device(row) if dev == "CPU" else dev
    with _as_measured(row, dev):
        return cm.features(spec, target, exact=True)  # never a rescale


def _learnable_peak(
    m: dict[str, Any], dev: Any, feats: Mapping[str, float], meta: dict[str, Any]
) -> Any:
    """A row's peak as a memory target, or None where it is no such target: missing or
    not positive, a CPU peak that is not the CPU allocator's, or a GPU peak partly held
    before the step began (over :data:`costaware.observation.MAX_HELD_BEFORE`, or a cuBLAS
    workspace the step never calls). A peak left out says why in ``meta`` (and, when
    held, what was measured): the row stays a time row."""
    from costaware.observation import MAX_HELD_BEFORE

    peak = m.get("max_reserved")
    if peak is not None and peak <= 0:
        peak = None
    if peak is not None and dev == "CPU" and not cpu_allocator_peak(m):
        meta["memory_left_out"] = "a resident-set growth, not the CPU allocator's peak"
        meta["memory_left_out_kind"] = LEFT_OUT_RSS
        peak = None  # another quantity than the one learned: a time row only
    held = reserved_before(m) if dev != "CPU" and peak is not None else None
    why = kind = None
    if held is not None and held > MAX_HELD_BEFORE:
        why, kind = f"{held / 2**20:,.0f} MiB reserved before it began", LEFT_OUT_HELD
    elif held is not None and _held_cublas_workspace(held, feats):
        why = f"{held / 2**20:,.0f} MiB reserved before it began: {HELD_WORKSPACE_NOTE}"
        kind = LEFT_OUT_WORKSPACE
    if why is not None and peak is not None:
        meta["memory_left_out"], meta["memory_left_out_kind"] = why, kind
        meta["measured_peak"] = float(peak)  # as recorded, for reports that show it
        peak = None  # the peak is partly an earlier configuration's: a time row only
    return peak


class _FeaturesCache:
    """The features cache of :func:`observations`: a ``.json.gz`` file with one section
    of features per features version. This run's section is read and grown; the others
    are kept (a run with another op model, or none, as a CPU-only run has, does not
    discard them), up to ``_CACHE_VERSIONS`` sections. Saved every 50 new features, so
    that an interrupted run keeps what it traced, and at the end."""

    def __init__(self, path: Path | None, version: str) -> None:
        self.path = path
        self.version = version
        self.sections: dict[str, dict[str, Any]] = {}
        if path is not None and path.is_file():
            with contextlib.suppress(OSError, ValueError, EOFError):
                stored = json.loads(gzip.decompress(path.read_bytes()))
                if "versions" in stored:
                    self.sections = dict(stored["versions"])
                elif "feature_version" in stored:  # the one-version layout written before
                    self.sections = {str(stored["feature_version"]): stored.get("features", {})}
        self.features: dict[str, Any] = self.sections.pop(version, {})
        self.dirty = 0

    def get(self, key: str) -> Any:
        """The features stored under ``key`` for this version, or None."""
        return self.features.get(key)

    def add(self, key: str, feats: Any) -> None:
        """Store ``feats`` under ``key``, saving the file every 50 new entries."""
        self.features[key] = feats
        self.dirty += 1
        if self.dirty % 50 == 0:  # an interrupted run keeps what it traced
            self.save()

    def save(self) -> None:
        """Write the file (atomically) when it has a path and new entries: this
        version's section first, then up to ``_CACHE_VERSIONS - 1`` of the others."""
        if self.path is not None and self.dirty:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            kept = list(self.sections.items())[: _CACHE_VERSIONS - 1]  # this run's goes first
            payload = {"versions": {self.version: self.features, **dict(kept)}}
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_bytes(gzip.compress(json.dumps(payload).encode(), mtime=0))
            os.replace(tmp, self.path)


# ------------------------------------------------------------------------------- command line
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The collection options (shared by ``costaware collect``)."""
    p.add_argument(
        "--corpus", choices=KINDS, default="gpu", help="which corpus to measure (default gpu)"
    )
    p.add_argument("--shard", type=int, default=0, help="shard index, from 0 (default 0)")
    p.add_argument(
        "--shards",
        type=int,
        default=None,
        help="number of shards (default: the recommended count, each under ~8 min on an H100)",
    )
    p.add_argument("--seed", type=int, default=0, help="corpus seed (default 0)")
    p.add_argument("--device", default="cuda", help="cpu or cuda (default cuda)")
    p.add_argument("--out", help="output .jsonl.gz file (appended to)")
    p.add_argument("--max-minutes", type=float, default=None, help="stop cleanly after this")
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps (default 3)")
    p.add_argument("--steps", type=int, default=10, help="timed steps, at least 10 (default 10)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default torch's)")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds allowed per configuration (status 'timeout' beyond); default none",
    )
    p.add_argument(
        "--in-context",
        action="store_true",
        help="also profile a few steps of each configuration that succeeds and keep each op's "
        "time inside the step in the row ('in_context'; benchmarks/in_context.py compares it "
        "with the op model)",
    )
    p.add_argument("--limit", type=int, default=None, help="measure at most this many configs")
    p.add_argument("--no-resume", action="store_true", help="measure ids already in the file again")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--list", action="store_true", help="print the shard's configurations and exit")
    p.add_argument("--configs-file", help=argparse.SUPPRESS)
    p.add_argument("--no-spawn", action="store_true", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    """Run a parsed collection command; returns the exit status."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.configs_file:
        with open(args.configs_file) as f:
            configs = [Config.from_dict(d) for d in json.load(f)]
    else:
        shards = (
            args.shards if args.shards is not None else recommended_shards(args.corpus, args.seed)
        )
        try:
            configs = corpus(args.corpus, shard=args.shard, shards=shards, seed=args.seed)
        except ValueError as e:  # a shard out of range, a bad count
            print(f"costaware collect: error: {e}", file=sys.stderr)
            return 2
        est = shard_estimates(args.corpus, shards, args.seed)[args.shard]
        if not args.quiet:
            print(
                f"[collect] corpus={args.corpus} shard {args.shard}/{shards}: {len(configs)} "
                f"configurations, estimated {_fmt_s(est)} "
                f"({'on an H100' if args.corpus == 'gpu' else 'on one CPU core'}, rough)",
                flush=True,
                file=sys.stderr if args.list else sys.stdout,  # --list's stdout is JSON lines
            )
    if args.limit is not None:
        configs = configs[: args.limit]
    if args.list:
        for c in configs:
            print(json.dumps(c.to_dict(), separators=(",", ":")))
        return 0
    if not args.out:
        print("costaware collect: error: --out FILE.jsonl.gz is required", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "costaware collect: error: --device cuda needs a visible CUDA GPU; use --device cpu.",
            file=sys.stderr,
        )
        return 2
    summary = collect(
        configs,
        args.out,
        args.device,
        max_minutes=args.max_minutes,
        resume=not args.no_resume,
        warmup=args.warmup,
        steps=args.steps,
        progress=not args.quiet,
        spawn=False if args.no_spawn else None,
        timeout_s=args.timeout,
        in_context=args.in_context,
    )
    if not args.quiet:
        print(f"[collect] {summary}", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m costaware.measure.collect``: measure a corpus shard (torch-only)."""
    p = argparse.ArgumentParser(
        prog="python -m costaware.measure.collect",
        description=(
            "Measure a shard of the costaware corpus for real (peak memory, step time) and "
            "append the rows to a .jsonl.gz file. Imports only torch and the standard library."
        ),
    )
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
