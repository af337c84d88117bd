"""Per-op peak memory: the GPU dry run against the opbench's measured peaks.

``costaware.measure.opbench`` records each forward-and-backward case's peak allocation on the GPU
(``peak_alloc``: ``torch.cuda.max_memory_allocated`` over the warm-up and timed
repetitions, above what was allocated before the case). This script rebuilds each case as
a one-layer model whose input is a learned tensor (so the input gets a gradient, as the
opbench's leaves do), dry-runs it as a GPU runs it (``attention="fused"``: cuDNN's fused
recurrent layers), replays the allocations and compares the replay's allocated peak
with the measurement.

- ``lstm``: one ``nn.LSTM`` layer. cuDNN's recurrent backward takes work space the dry run
  cannot see; :func:`costaware.core.trace.transients._cudnn_rnn_transient` is a formula fitted on
  these rows. The script prints the error without the block, with the shipped formula (fitted
  on these same rows, so in-sample), and with the formula refitted on ``--folds`` folds
  of cases and applied to the held-out fold.
- ``linear``: ``nn.Linear`` with and without bias, for reference: nothing is fitted there.

Usage:
    python benchmarks/op_memory.py [OPS.jsonl.gz ...] [--ops lstm linear] [--folds 5]

With no file it reads ``data/gpu/*-ops-*.jsonl.gz``. About a minute on 2 cores for the
committed H100 rows (191 LSTM and 821 linear forward-and-backward cases). Errors are
``|predicted / measured - 1|``; "under" is the share of cases predicted below their peak.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from scipy.optimize import nnls
from torch import nn

import costaware as ca
from costaware.core.allocator import simulate
from costaware.core.trace import Trace
from costaware.core.trace.transients import _CUDNN_RNN_TERMS, _cudnn_rnn_terms
from costaware.measure.opbench import load_op_rows

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class _LearnedInput(nn.Module):
    """``layer(x)`` for a learned input ``x``: the opbench's case as a model."""

    def __init__(self, x_shape: tuple[int, ...], layer: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.x = nn.Parameter(torch.randn(x_shape, dtype=dtype))
        self.layer = layer.to(dtype)

    def forward(self, _batch: object) -> torch.Tensor:
        out = self.layer(self.x)
        return out[0] if isinstance(out, tuple) else out


def _model(op: str, p: dict[str, Any], dtype: torch.dtype) -> Callable[[], nn.Module]:
    if op == "lstm":
        return lambda: _LearnedInput((p["T"], p["B"], p["I"]), nn.LSTM(p["I"], p["H"]), dtype)
    if op == "linear":
        return lambda: _LearnedInput(
            (p["M"], p["K"]), nn.Linear(p["K"], p["N"], bias=bool(p["bias"])), dtype
        )
    raise ValueError(f"no model for op {op!r}")


def _trace(op: str, row: dict[str, Any]) -> Trace:
    spec = ca.TrainingSpec(
        model=_model(op, row["params"], _DTYPES[row["dtype"]]),
        batch=lambda n: torch.zeros(n),
        batch_size=1,
        optimizer="sgd",  # no momentum: no optimizer state, as the opbench has none
        loss=lambda m, batch: m(batch).float().sum(),
    )
    return ca.dry_run(spec, attention="fused")


def _mre(pred: np.ndarray, meas: np.ndarray) -> str:
    err = np.abs(pred / meas - 1)
    return (
        f"mean {100 * err.mean():5.1f}%  median {100 * np.median(err):5.1f}%  "
        f"p90 {100 * np.quantile(err, 0.9):5.1f}%  under {100 * np.mean(pred < meas):3.0f}%"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="*", help="opbench .jsonl.gz files (default data/gpu/*-ops-*)")
    p.add_argument("--ops", nargs="+", default=["lstm", "linear"], choices=["lstm", "linear"])
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds (default 5)")
    p.add_argument("--seed", type=int, default=0, help="fold assignment seed (default 0)")
    args = p.parse_args(argv)
    files = args.data or sorted(glob.glob("data/gpu/*-ops-*.jsonl.gz"))
    if not files:
        p.error("no opbench files given and none under data/gpu/")
    rows = [
        r
        for r in load_op_rows(files)
        if r.get("status") == "ok" and r.get("direction") == "fwd+bwd" and r.get("peak_alloc")
    ]
    for op in args.ops:
        cases = [r for r in rows if r["op"] == op]
        if not cases:
            print(f"{op}: no measured forward-and-backward cases", file=sys.stderr)
            continue
        meas, shipped, bare, live_b, terms = [], [], [], [], []
        for r in cases:
            tr = _trace(op, r)
            meas.append(float(r["peak_alloc"]))
            shipped.append(float(simulate(tr.allocator_events()).peak_allocated))
            no_block = dataclasses.replace(tr, transients=tr.transients[:0])
            bare.append(float(simulate(no_block.allocator_events()).peak_allocated))
            if op == "lstm":  # the live bytes where each backward block sits
                live_b.append(max(float(tr.timeline[int(i) - 1]) for i in tr.transients[:, 0]))
                q, esz = r["params"], 4 if r["dtype"] == "fp32" else 2
                w = 4 * q["H"] * (q["I"] + q["H"]) + 8 * q["H"]  # weights and biases
                terms.append(_cudnn_rnn_terms(q["T"], q["B"], q["I"], q["H"], 1, 4, w, esz))
        m = np.asarray(meas)
        print(f"{op}: {len(cases)} cases, the replayed allocated peak against the measured one")
        if op != "lstm":
            print(f"  dry run as shipped:                 {_mre(np.asarray(shipped), m)}")
            continue
        print(f"  dry run without a work-space block: {_mre(np.asarray(bare), m)}")
        print(f"  with the shipped block (in-sample): {_mre(np.asarray(shipped), m)}")
        x, lb, b0 = np.asarray(terms), np.asarray(live_b), np.asarray(bare)
        order = np.random.default_rng(args.seed).permutation(len(m))
        held = np.empty(len(m))
        for fold in np.array_split(order, args.folds):
            train = np.setdiff1d(order, fold)
            wt = 1.0 / m[train]  # relative least squares, coefficients >= 0
            coef, _ = nnls(x[train] * wt[:, None], (m[train] - lb[train]) * wt)
            held[fold] = np.maximum(b0[fold], lb[fold] + x[fold] @ coef)
        print(f"  block refitted, held out by case:   {_mre(held, m)}  ({args.folds} folds)")
        wt = 1.0 / m
        coef, _ = nnls(x * wt[:, None], (m - lb) * wt)
        print(
            "  fitted on all:",
            ", ".join(f"{c:.3g} x {n}" for c, n in zip(coef, _CUDNN_RNN_TERMS)),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
