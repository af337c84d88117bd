"""Held-out accuracy of the op-level time model (``costaware.core.optime``) on opbench rows.

Splits the op rows into ``--folds`` folds by case (a case's forward and backward samples
stay together), fits :class:`~costaware.core.optime.OpTimeModel` (the shipped settings) on the
other folds and predicts each held-out sample's kernel time. Per op and overall it
prints the mean and median relative error of the predicted time, over every sample and
over the samples above ``--min-us`` microseconds (where the kernel, not the harness,
should dominate). The predicted and measured times compared are the model's target:
seconds with the harness floor taken off schema 1 ("cuda_event") timings, untouched for
held ones ("cuda_held", see :mod:`costaware.measure.opbench`).

Usage:
    python benchmarks/op_accuracy.py [OPS.jsonl.gz ...] [--folds 5] [--min-us 50]

With no file it reads ``data/gpu/*-ops-*.jsonl.gz``. Each device's rows are evaluated
apart (one op model learns one device). About 4 minutes on 2 cores for the committed
9,284 H100 rows.
"""

from __future__ import annotations

import argparse
import glob
import sys
from collections.abc import Sequence

import numpy as np

from costaware.core.optime import OpTimeModel, op_samples, preferred_op_rows
from costaware.measure.opbench import load_op_rows


def _evaluate(device: str, device_rows: list[dict], folds: int, seed: int, min_us: float) -> None:
    """``folds``-fold cross-validation by case over one device's op rows, printed."""
    # a held re-run supersedes its case's schema 1 row (op_samples sees one row at a time)
    rows = preferred_op_rows(device_rows)
    ids = sorted({str(r["id"]) for r in rows})
    rng = np.random.default_rng(seed)
    fold_of = dict(zip(ids, (rng.permutation(len(ids)) % folds).tolist()))
    ops: list[str] = []
    measured: list[float] = []
    predicted: list[float] = []
    for k in range(folds):
        model = OpTimeModel().fit([r for r in rows if fold_of[str(r["id"])] != k], device=device)
        test = [r for r in rows if fold_of[str(r["id"])] == k]
        for r in test:
            x, y = op_samples([r])  # a row's forward and backward (or step) samples
            if len(y):
                ops += [str(r["op"])] * len(y)
                measured += np.exp(y).tolist()
                predicted += np.exp(np.asarray(model.model_.predict(x), dtype=float)).tolist()
        print(f"{device} fold {k + 1}/{folds}: {len(test)} rows", file=sys.stderr, flush=True)
    op_arr, m, pr = np.asarray(ops), np.asarray(measured), np.asarray(predicted)
    rel = np.abs(pr - m) / m
    big = m >= min_us * 1e-6
    print(f"\n{device}: {len(ids)} cases, {len(m)} kernel samples, {folds}-fold by case")
    head = f"{'op':22s} {'n':>6s} {'MRE':>7s} {'median':>7s} | {'n>' + str(int(min_us)) + 'µs':>8s} {'MRE':>7s} {'median':>7s}"
    print(head)
    print("-" * len(head))
    for op in [*sorted(set(ops)), "overall"]:
        s = np.ones(len(m), bool) if op == "overall" else op_arr == op
        b = s & big
        big_part = (
            f"{int(b.sum()):8d} {rel[b].mean():7.1%} {np.median(rel[b]):7.1%}"
            if b.any()
            else f"{0:8d} {'-':>7s} {'-':>7s}"
        )
        print(
            f"{op:22s} {int(s.sum()):6d} {rel[s].mean():7.1%} {np.median(rel[s]):7.1%} | {big_part}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="*", help="opbench .jsonl.gz files (default data/gpu/*-ops-*)")
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds (default 5)")
    p.add_argument(
        "--min-us", type=float, default=50.0, help="the 'large' threshold, in µs (default 50)"
    )
    p.add_argument("--seed", type=int, default=0, help="fold assignment seed (default 0)")
    args = p.parse_args(argv)
    paths = args.data or sorted(glob.glob("data/gpu/*-ops-*.jsonl.gz"))
    if not paths:
        p.error("no op rows: pass opbench .jsonl.gz files")
    if args.folds < 2:
        p.error("--folds must be at least 2")
    from costaware.core.optime import catalog_device

    # one op model learns one device's timings: each device's rows are evaluated apart
    by_device: dict[str, list[dict]] = {}
    for r in load_op_rows(paths):
        if r.get("kind") == "op":
            by_device.setdefault(catalog_device(r), []).append(r)
    for device, device_rows in sorted(by_device.items()):
        _evaluate(device, device_rows, args.folds, args.seed, args.min_us)
    return 0


if __name__ == "__main__":
    sys.exit(main())
