"""Re-measure the memory of the committed CPU rows as the CPU allocator's peak.

The CPU corpus was first collected with the growth of the process's peak resident set as
its memory. In a collector that runs configurations one after another in one process, the
heap that earlier configurations freed is reused, and the resident set grew by as little
as 1 MiB for models whose weights and optimizer state alone take 8 MiB. This script
rebuilds each ``ok`` row's configuration from its ``config`` record and measures what
:func:`costaware.measure.profile.measure` now records on a CPU: the peak of the bytes held by
PyTorch's CPU allocator over the model's build and the row's warm-up steps
(:func:`costaware.measure.profile.allocator_peak`, 1 torch thread). It writes that into
``measurement.max_allocated`` / ``max_reserved``, keeps the old resident-set figure as
``rss_growth``, says so in ``memory_method`` and ``memory_measured_at``, and leaves the
timings alone. Rows already re-measured are skipped, so an interrupted run resumes; each
file is replaced only when all of its rows are done.

    python data/remeasure_cpu_memory.py data/cpu/*.jsonl.gz
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import sys
from pathlib import Path

import torch
from rich.progress import track

from costaware.measure.corpus import Config
from costaware.measure.profile import ALLOCATOR_METHOD, allocator_peak

METHOD = (
    f"{ALLOCATOR_METHOD} over the model's build and the "
    "warm-up steps (torch.profiler memory events), re-measured apart from the timings "
    "by data/remeasure_cpu_memory.py; rss_growth: the resident-set growth first recorded"
)


def remeasure(path: Path) -> tuple[int, int]:
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f]
    todo = [r for r in rows if r["status"] == "ok" and "rss_growth" not in r["measurement"]]
    failed = 0
    for row in track(todo, description=path.name):
        m = row["measurement"]
        m["rss_growth"] = m["max_reserved"]
        try:
            peak = allocator_peak(Config.from_dict(row["config"]).to_spec(), steps=m["warmup"])
            value, why = peak.peak, peak.why
        except Exception as e:  # recorded in the row, never a crash
            value, why = None, f"{type(e).__name__}: {e}"
        m["max_allocated"] = m["max_reserved"] = value
        m["memory_method"] = METHOD if value is not None else f"not re-measured: {why}"
        m["memory_measured_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        failed += value is None
    if todo:
        tmp = path.with_suffix(".tmp")
        with gzip.open(tmp, "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        os.replace(tmp, path)
    return len(todo), failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("files", nargs="+", type=Path, help="CPU corpus files (.jsonl.gz)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    for path in args.files:
        done, failed = remeasure(path)
        print(f"{path}: {done} rows re-measured, {failed} failed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
