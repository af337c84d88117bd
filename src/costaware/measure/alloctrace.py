"""The caching allocator's own record of training steps at the edge of a memory cap.

The capacity decision (:attr:`~costaware.Prediction.min_capacity`) rests on two models:
the dry run's allocation events (what the step allocates and frees, in which order) and
the allocator simulation that replays them (:mod:`costaware.core.allocator`). The
OOM-boundary probes (:mod:`costaware.measure.oomprobe`) score the two together. This
module records what tells them apart: the allocator's own event stream
(``torch.cuda.memory._record_memory_history``) for the runs on either side of each
boundary the probes bisected. ``benchmarks/alloc_fidelity.py`` then replays the *real*
events through the simulation (is the allocator model right?) and sets the real events
against the dry run's (is the trace right, and which allocations does it lack?). With
``--rnn-layers`` it records uncapped recurrent models of 1-4 layers instead
(:func:`rnn_layer_runs`).

For each (configuration, cap) of the probe files, three runs, each a row:

- the largest batch size that fitted, under the cap (``"capped": true``);
- the smallest that ran out of memory, under the cap;
- the largest that fitted, without a cap (its reserved peak is the unlimited one).

A row holds the probe's figures (:class:`~costaware.measure.oomprobe._Prober`'s run) and
``history``: the blocks live before the steps (``initial``: address, requested bytes:
the parameters), and the allocator's events in order (``events``: ``[action, address,
bytes, frame]``, with ``action`` one of :data:`ACTIONS` and ``frame`` an index into
``frames``, the innermost Python frames of the allocation, or -1). It imports torch and
costaware's torch-only modules alone, and appends one gzip member per row, so an
interrupted run keeps what it recorded and a rerun skips what the file holds.

Example (on a GPU, about 8 minutes)::

    python -m costaware.measure.alloctrace --probes data/oom/h200-oom-seed0.jsonl.gz \\
        --out h200-alloctrace-seed0.jsonl.gz --max-minutes 8
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from costaware.core.allocator import RELEASE_CACHED
from costaware.measure.collect import _now, append_row, read_rows
from costaware.measure.corpus import Config
from costaware.measure.oomprobe import GiB, _allocator_mode, _Prober, boundaries
from costaware.measure.profile import _failure

__all__ = [
    "ACTIONS",
    "RNN_LAYOUTS",
    "SCHEMA_VERSION",
    "boundary_runs",
    "history_events",
    "main",
    "real_events",
    "rnn_layer_runs",
]

#: Version of the row layout (see data/README.md).
SCHEMA_VERSION = 1
#: The allocator actions a row keeps, by their index in ``events`` (the names are
#: ``torch.cuda.memory._snapshot``'s): allocations, completed frees, the segments the
#: allocator reserved and gave back, and an out-of-memory error (its bytes: the request).
ACTIONS = ("alloc", "free_completed", "segment_alloc", "segment_free", "oom")
#: Python frames kept per allocation, innermost first
FRAMES_KEPT = 2
#: the allocator's history ring holds at most this many events (more are dropped, oldest first)
MAX_ENTRIES = 2_000_000


@dataclasses.dataclass(frozen=True)
class BoundaryRun:
    """One run to record: a configuration at a batch size, under ``cap`` or not."""

    config: Config
    cap: int
    batch_size: int
    capped: bool
    #: what the probe saw at this batch size and cap: "fits" or "oom" ("listed": a run
    #: chosen for itself, no probe)
    probed: str

    @property
    def key(self) -> tuple[str, int, int, bool]:
        return (self.config.id, self.cap, self.batch_size, self.capped)


def boundary_runs(probe_rows: Iterable[dict[str, Any]]) -> list[BoundaryRun]:
    """The runs on either side of every boundary in ``probe_rows`` (oomprobe's rows):
    per (configuration, cap) that has both a fitting run and one that ran out of memory,
    the largest size that fitted (capped, then uncapped) and the smallest that did not;
    smallest caps first, families in order, so an interrupted recording covers every
    family at the first caps."""
    bounds = boundaries(probe_rows)
    runs: list[BoundaryRun] = []
    order = sorted(
        bounds.items(), key=lambda kv: (kv[0][1], kv[1]["row"]["config"]["family"], kv[0][0])
    )
    for (_, cap), b in order:
        if not b["fit"] or b["oom"] is None:
            continue
        cfg = Config.from_dict(b["row"]["config"])
        runs += [
            BoundaryRun(cfg, cap, b["fit"], True, "fits"),
            BoundaryRun(cfg, cap, b["oom"], True, "oom"),
            BoundaryRun(cfg, cap, b["fit"], False, "fits"),
        ]
    return runs


#: the recurrent layouts :func:`rnn_layer_runs` records: cell, layers, hidden width, precision
RNN_LAYOUTS = tuple(
    (kind, layers, hidden, precision)
    for kind in ("lstm", "gru")
    for layers in (1, 2, 3, 4)
    for hidden in (256, 1024)
    for precision in ("fp32", "bf16")
)


def rnn_layer_runs(seq_len: int = 128, batch_size: int = 32) -> list[BoundaryRun]:
    """Uncapped runs of recurrent language models over :data:`RNN_LAYOUTS`: what cuDNN
    allocates for a multi-layer LSTM or GRU call (one reserve for all layers, its work
    spaces), which the dry run traces layer by layer. A small vocabulary keeps the logits
    from hiding the recurrent layers' blocks; SGD without momentum adds no optimizer state."""
    runs = []
    for kind, layers, hidden, precision in RNN_LAYOUTS:
        record = {
            "family": "rnn",
            "factory": "rnn",
            "kwargs": {"kind": kind, "vocab": 1000, "embed": 256, "hidden": hidden,
                       "layers": layers, "dropout": 0.0},
            "batch_kind": "tokens",
            "batch_shape": [seq_len],
            "classes": 1000,
            "batch_size": batch_size,
            "optimizer": "sgd",
            "optimizer_kwargs": {"lr": 0.01},
            "precision": precision,
            "allocator": "default",
            "cudnn_benchmark": False,
        }  # fmt: skip
        digest = hashlib.sha1(json.dumps(record, sort_keys=True).encode()).hexdigest()[:12]
        cfg = Config.from_dict({**record, "id": f"rnn-{digest}", "corpus": "rnn-layers"})
        runs.append(BoundaryRun(cfg, 0, batch_size, False, "listed"))
    return runs


def _frame_text(frames: Sequence[dict[str, Any]]) -> str:
    """The innermost :data:`FRAMES_KEPT` frames as ``path:line name``, joined by `` < ``,
    paths from their package folder on (``torch/nn/...``) so that rows compare across machines."""
    parts = []
    for f in list(frames)[:FRAMES_KEPT]:
        path = str(f.get("filename", "?"))
        for marker in ("site-packages/", "src/"):
            if marker in path:
                path = path.split(marker, 1)[1]
                break
        parts.append(f"{path}:{f.get('line', '?')} {f.get('name', '?')}")
    return " < ".join(parts)


def history_events(
    trace: Iterable[dict[str, Any]],
) -> tuple[list[list[int]], list[str]]:
    """A device trace of ``torch.cuda.memory._snapshot()`` as compact rows: ``[action
    index, address, bytes, frame index]`` for the actions of :data:`ACTIONS` (others are
    dropped), and the table of frame texts the indices point into."""
    codes = {name: i for i, name in enumerate(ACTIONS)}
    frames: dict[str, int] = {}
    out: list[list[int]] = []
    for entry in trace:
        code = codes.get(str(entry.get("action")))
        if code is None:
            continue
        frame = -1
        if entry.get("frames") and ACTIONS[code] in ("alloc", "oom"):
            text = _frame_text(entry["frames"])
            frame = frames.setdefault(text, len(frames))
        out.append([code, int(entry.get("addr", 0) or 0), int(entry.get("size", 0) or 0), frame])
    return out, list(frames)


def real_events(history: dict[str, Any]) -> tuple[list[tuple[int, int]], dict[str, Any]]:
    """The allocation events of a recorded run, in the form the simulation replays
    (:func:`costaware.core.allocator.simulate`: ``(key, bytes)``, a free as ``-1``), and
    what the conversion met.

    The blocks live before the steps come first, allocated in address order (they are the
    parameters, allocated by the model's move to the device); then every allocation and
    completed free in order. A run that ran out of memory ends with the request that
    failed (key -1), so its replay asks for what the real allocator could not give;
    what the error's unwinding freed after it is left out. A refused request that the
    run went on from (an allocation follows it: cuDNN catches the error of a workspace
    that does not fit and takes an algorithm that needs less) is no allocation, but the
    release of cached memory the allocator made before refusing it is kept (an event
    :data:`~costaware.core.allocator.RELEASE_CACHED`). ``info``: ``unknown_frees`` (frees
    of blocks allocated before the recording that the snapshot did not list),
    ``oom_request`` (bytes, or None), ``caught_ooms`` (refused requests the run went on
    from), ``frame_at`` (an allocation's position in the events -> its index in
    ``history["frames"]``, where recorded)."""
    events: list[tuple[int, int]] = []
    live: set[int] = set()
    for addr, size in sorted((int(a), int(s)) for a, s in history.get("initial", [])):
        events.append((addr, size))
        live.add(addr)
    unknown = 0
    oom_request: int | None = None
    alloc, free, oom = (ACTIONS.index(a) for a in ("alloc", "free_completed", "oom"))
    frame_at: dict[int, int] = {}
    rows = history.get("events", [])
    # the request that failed the run: the last refused one, where nothing was allocated after it
    last_alloc = max((i for i, r in enumerate(rows) if r[0] == alloc), default=-1)
    caught = 0
    for i, (code, addr, size, frame) in enumerate(rows):
        if code == oom and i < last_alloc:
            # the allocator gave back its cached memory before it refused the request
            caught += 1
            events.append((0, RELEASE_CACHED))
            continue
        if code == alloc:
            if addr in live:  # a block allocated twice: its free was not recorded
                events.append((addr, -1))
            if frame >= 0:
                frame_at[len(events)] = frame
            events.append((addr, size))
            live.add(addr)
        elif code == free:
            if addr in live:
                events.append((addr, -1))
                live.discard(addr)
            else:
                unknown += 1
        elif code == oom:
            oom_request = size
            if frame >= 0:
                frame_at[len(events)] = frame
            events.append((-1, size))
            break
    info = {
        "unknown_frees": unknown,
        "oom_request": oom_request,
        "caught_ooms": caught,
        "frame_at": frame_at,
    }
    return events, info


def _live_blocks(device: torch.device) -> list[list[int]]:
    """``[address, requested bytes]`` of every block allocated on ``device`` now."""
    blocks = []
    for seg in torch.cuda.memory_snapshot():  # type: ignore[no-untyped-call]
        if seg.get("device", device.index or 0) != (device.index or 0):
            continue
        for blk in seg.get("blocks", []):
            if blk.get("state") == "active_allocated":
                blocks.append([int(blk["address"]), int(blk.get("requested_size") or blk["size"])])
    return blocks


def _start_history() -> None:
    """Start the allocator's history afresh (a run's events only), Python frames only."""
    start = torch.cuda.memory._record_memory_history
    kwargs: dict[str, Any] = {"context": "alloc", "stacks": "python", "max_entries": MAX_ENTRIES}
    try:
        start("all", clear_history=True, **kwargs)  # type: ignore[no-untyped-call]
    except TypeError:  # a torch without clear_history: stopping drops what was kept
        start(None)  # type: ignore[no-untyped-call]
        start("all", **kwargs)  # type: ignore[no-untyped-call]


def record(prober: _Prober, run: BoundaryRun, timeout_s: float) -> dict[str, Any]:
    """One run of ``prober`` at ``run``'s batch size (under its cap, or under none), with
    the allocator's history recorded: oomprobe's row plus ``history``. CUDA only."""
    if not prober.is_cuda:
        raise RuntimeError(
            "the allocator's history exists on CUDA only (torch.cuda.memory._record_memory_history)"
        )
    dev = prober.device
    initial = _live_blocks(dev)
    _start_history()
    try:
        row = prober.run(run.batch_size, run.cap if run.capped else prober.total, timeout_s)
        trace = torch.cuda.memory._snapshot(dev)["device_traces"][dev.index or 0]
    finally:
        torch.cuda.memory._record_memory_history(None)  # type: ignore[no-untyped-call]
    events, frames = history_events(trace)
    row["history"] = {
        "initial": initial,
        "events": events,
        "frames": frames,
        "dropped": len(trace) >= MAX_ENTRIES,
    }
    return row


def _done(path: str) -> set[tuple[str, int, int, bool]]:
    if not os.path.exists(path):
        return set()
    return {
        (str(r["config_id"]), int(r["cap_bytes"]), int(r["batch_size"]), bool(r["capped"]))
        for r in read_rows(path)
        if r.get("kind") == "alloctrace"
    }


def _todo(runs: list[BoundaryRun], done: set[tuple[str, int, int, bool]]) -> Iterator[BoundaryRun]:
    return (r for r in runs if r.key not in done)


def run(args: argparse.Namespace) -> int:
    if args.rnn_layers:
        runs = rnn_layer_runs()
    else:
        probe_rows = [r for path in args.probes or () for r in read_rows(path)]
        runs = boundary_runs(probe_rows)
    # the allocator's mode is fixed when CUDA starts: a probe of the other mode cannot run here
    mode = _allocator_mode()
    other = sorted({r.config.allocator for r in runs if r.config.allocator != mode})
    if other:
        print(
            f"costaware alloctrace: error: this process's CUDA allocator is {mode!r} "
            f"(PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')!r}), "
            f"but the runs are for {', '.join(map(repr, other))}: record each allocator's "
            "runs in a process started with its setting "
            "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for expandable segments).",
            file=sys.stderr,
        )
        return 2
    device = torch.device(args.device)
    if device.type != "cuda" or not torch.cuda.is_available():
        print(
            "costaware alloctrace: error: the allocator's history needs a CUDA GPU "
            f"(got --device {args.device}, CUDA available: {torch.cuda.is_available()}).",
            file=sys.stderr,
        )
        return 2
    if device.index is None:
        device = torch.device("cuda", 0)
    if args.families:
        wanted = {f.strip() for f in args.families.split(",")}
        runs = [r for r in runs if r.config.family in wanted]
    if not runs:
        print(
            "costaware alloctrace: error: no bisected boundary in the probe files.", file=sys.stderr
        )
        return 2
    todo = list(_todo(runs, _done(args.out)))
    started = time.monotonic()
    deadline = started + 60 * args.max_minutes if args.max_minutes else None
    models: dict[str, torch.nn.Module] = {}
    n = 0
    for r in todo:
        if deadline is not None and time.monotonic() > deadline - 10:
            print(f"[alloctrace] out of time after {n} runs, {len(todo) - n} left", flush=True)
            return 0
        try:
            prober = _Prober(r.config, device, args.steps, models.pop(r.config.id, None))
        except Exception as e:
            status, message = _failure(e)
            print(f"[alloctrace] {r.config.family}: build failed ({status}): {message}", flush=True)
            continue
        row = record(prober, r, args.timeout)
        row.update(
            {
                "kind": "alloctrace",
                "schema": SCHEMA_VERSION,
                "config": r.config.to_dict(),
                "config_id": r.config.id,
                "family": r.config.family,
                "cap_bytes": r.cap,
                "capped": r.capped,
                "probed": r.probed,
                "gpu_total": prober.total,
                "gpu_name": torch.cuda.get_device_name(device),
                "torch": torch.__version__,
                "device": str(device),
                "finished_at": _now(),
            }
        )
        append_row(args.out, row)
        models[r.config.id] = prober.release()
        del prober
        n += 1
        print(
            f"[alloctrace] {r.config.family:<18} cap {r.cap / GiB:5.1f} GiB "
            f"{'capped' if r.capped else 'uncapped':<8} batch {r.batch_size:>6}  "
            f"{row['status']:<5} (probe: {r.probed})  {len(row['history']['events'])} events",
            flush=True,
        )
    print(f"[alloctrace] done: {n} runs in {time.monotonic() - started:.0f} s", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m costaware.measure.alloctrace``: the allocator's events at each probed
    boundary (torch-only, CUDA)."""
    p = argparse.ArgumentParser(
        prog="python -m costaware.measure.alloctrace",
        description=(
            "Record the CUDA caching allocator's events (torch.cuda.memory._record_memory_history) "
            "for the runs on either side of every boundary the OOM probes bisected: the largest "
            "batch size that fitted and the smallest that did not, under the cap, and the largest "
            "that fitted without one. Each run is appended as a row to a .jsonl.gz file "
            "(resumes); benchmarks/alloc_fidelity.py reads it."
        ),
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--probes", nargs="+", help="oomprobe files whose boundaries to record")
    which.add_argument(
        "--rnn-layers",
        action="store_true",
        help="record uncapped LSTM and GRU language models of 1-4 layers instead (what cuDNN "
        "allocates for a multi-layer call)",
    )
    p.add_argument("--out", required=True, help="output .jsonl.gz file (appended to; resumes)")
    p.add_argument("--device", default="cuda", help="the CUDA device (default cuda)")
    p.add_argument("--families", default="", help="only these families (comma-separated)")
    p.add_argument("--steps", type=int, default=3, help="training steps per run (default 3)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds allowed per run")
    p.add_argument("--max-minutes", type=float, default=None, help="stop cleanly after this")
    return run(p.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
