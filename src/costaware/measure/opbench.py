"""Per-operation microbenchmarks: time single operations over many random shapes on a device.

In the spirit of Habitat and PreNeT: rather than whole training steps (:mod:`costaware.measure.collect`),
this times one operation at a time (a convolution, a matmul, attention, a norm, an optimizer
step...) over thousands of random shapes, dtypes and directions, so that an op-level time
model can be fitted. Runs on a bare GPU machine: it imports only torch, the standard library
and :mod:`costaware.measure.collect` (for the ``.jsonl.gz`` row format).

- :func:`cases` draws a deterministic list of :class:`OpCase` s from a seed; ``cases(s, n)``
  is a prefix of ``cases(s, m)`` for ``n <= m``, so a larger ``--n`` extends a run. Sizes are
  log-uniform over realistic ranges, redrawn until a case's estimated peak allocation fits
  the scale's cap (4 GiB and 5e11 forward FLOPs on a GPU; 64 MiB and 3e7 FLOPs on a CPU).
- Each case records analytic ``flops`` and ``bytes`` (ideal bytes read + written) per phase
  (``fwd``, ``bwd``, or ``step`` for optimizers).
- Timing: ``warmup`` untimed repetitions, then ``reps`` timed ones; on CUDA with
  ``torch.cuda.Event`` pairs (one synchronisation per case), on a CPU with
  ``time.perf_counter``. A ``fwd+bwd`` case times the forward and the backward of each
  repetition separately. When a warm-up repetition takes over ``slow_rep_s`` (0.5 s), only 3
  repetitions are timed (``times.capped``).
- Held timing (schema 2, CUDA): the timed repetitions queue up behind a spin kernel
  (``torch.cuda._sleep``) that outlasts the CPU's issuing of them, so the events time the
  GPU's own kernels back to back (``times.timer`` "cuda_held"), and the CPU's issue time of
  each phase is recorded apart (``fwd_issue_s``, ``bwd_issue_s``, ``step_issue_s``). Schema 1
  rows (``timer`` "cuda_event") time each call from an idle GPU: the CPU's launch latency,
  tens of microseconds, is inside every sample. A ``fwd+bwd`` case on CUDA also records the
  peak allocation of one forward and of its backward apart (``peak_alloc_phase``).
- One row per case, each its own gzip member appended to the file (the format of
  :func:`costaware.measure.collect.append_row`; rows are written as they come and synced every few
  seconds). An OOM or any error is a row (``status`` "oom" / "error"), never a crash; a case
  that killed the process is recorded as ``status="crash"`` on the next run (from the
  ``.inflight`` marker next to the file). Re-running resumes: ids already in the file are
  skipped. ``max_minutes`` stops cleanly between cases.

Example (an H100, 8 minutes)::

    PYTHONPATH=src python -m costaware.measure.opbench --device cuda --seed 0 --n 30000 \\
        --out data/ops/h100-ops-seed0.jsonl.gz --max-minutes 8
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import gzip
import hashlib
import json
import math
import os
import platform
import random
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.nn.functional as F
from torch import nn

from costaware.measure.collect import CollectSummary, _fmt_s, _inflight_path, done_ids, read_rows
from costaware.measure.profile import host_speed, nvml_driver

__all__ = [
    "OPS",
    "OP_SCHEMA_VERSION",
    "OpBenchSummary",
    "OpCase",
    "bench",
    "cases",
    "load_op_rows",
    "main",
]

#: Version of the op row layout.
OP_SCHEMA_VERSION = 2
#: seconds between two host-speed probes (:func:`costaware.measure.profile.host_speed`, about
#: 20 ms), whose latest figures every row carries in ``env["host_speed"]``
HOST_SPEED_EVERY_S = 60.0

#: Every operation and its weight in :func:`cases` (common operations dominate).
OPS: dict[str, float] = {
    "conv2d": 16,
    "linear": 12,
    "matmul": 5,
    "bmm": 5,
    "sdpa": 8,
    "layer_norm": 5,
    "batch_norm": 5,
    "group_norm": 2,
    "softmax": 4,
    "add": 3,
    "mul": 2,
    "relu": 2,
    "gelu": 2,
    "silu": 2,
    "dropout": 2,
    "embedding": 3,
    "max_pool2d": 2,
    "avg_pool2d": 1,
    "adaptive_avg_pool2d": 1,
    "cross_entropy": 3,
    "lstm": 3,
    "sgd": 2,
    "adam": 2,
    "adamw": 3,
}
_STEP_OPS = frozenset({"sgd", "adam", "adamw"})
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_ESZ = {"fp32": 4, "bf16": 2, "fp16": 2}
_TRIES = 200  # redraws of one op's shape before giving up on the cap


@dataclass(frozen=True)
class _Scale:
    max_mem: int  # estimated peak allocation of one case, bytes
    max_flops: float  # forward FLOPs of one case
    big: bool  # GPU-sized ranges


#: "cpu" keeps cases small enough for tests; "cpu-large" reaches the kernels a CPU's
#: training steps run (half the FLOPs of the CPU corpus's steps are in kernels over 7e7,
#: a twentieth over 1e9)
_SCALES = {
    "gpu": _Scale(4 << 30, 5e11, True),
    "cpu": _Scale(64 << 20, 3e7, False),
    "cpu-large": _Scale(256 << 20, 1e9, False),
}


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------------------- cases
@dataclass
class OpCase:
    """One operation on one shape: ``op`` (a key of :data:`OPS`), its ``params``, ``dtype``
    ("fp32", "bf16", "fp16") and ``direction`` ("fwd", "fwd+bwd", or "step" for optimizers).

    ``id`` (``op-<sha1 of the record>[:12]``), ``flops`` and ``nbytes`` (analytic FLOPs and
    bytes read + written per phase: ``fwd``/``bwd``/``step``) and ``mem`` (the estimated peak
    allocation, bytes) are derived from the record.
    """

    op: str
    params: dict[str, Any]
    dtype: str = "fp32"
    direction: str = "fwd"
    id: str = field(init=False)
    flops: dict[str, int] = field(init=False)
    nbytes: dict[str, int] = field(init=False)
    mem: int = field(init=False)

    def __post_init__(self) -> None:
        record = {
            "op": self.op,
            "params": self.params,
            "dtype": self.dtype,
            "direction": self.direction,
        }
        digest = hashlib.sha1(json.dumps(record, sort_keys=True).encode()).hexdigest()[:12]
        self.id = f"{self.op}-{digest}"
        try:
            self.flops, self.nbytes, self.mem = _analyze(
                self.op, self.params, _ESZ.get(self.dtype, 4), self.direction
            )
        except (KeyError, TypeError, ValueError, ZeroDivisionError):  # a malformed record
            self.flops, self.nbytes, self.mem = {}, {}, 0

    def to_dict(self) -> dict[str, Any]:
        """The record plus its derived fields (``nbytes`` as ``bytes``), JSON-ready."""
        return {
            "id": self.id,
            "op": self.op,
            "params": self.params,
            "dtype": self.dtype,
            "direction": self.direction,
            "flops": self.flops,
            "bytes": self.nbytes,
            "mem_est": self.mem,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OpCase:
        """Rebuild a case from :meth:`to_dict` (or a row); derived fields are recomputed."""
        return cls(
            op=str(d["op"]),
            params=dict(d["params"]),
            dtype=str(d.get("dtype", "fp32")),
            direction=str(d.get("direction", "fwd")),
        )


def _lu(r: random.Random, lo: float, hi: float) -> int:
    """A log-uniform integer in ``[lo, hi]``."""
    return max(1, round(math.exp(r.uniform(math.log(lo), math.log(hi)))))


def _ch(r: random.Random, lo: float, hi: float) -> int:
    """A log-uniform channel count, a multiple of 8 seven times in ten (as real models)."""
    c = _lu(r, lo, hi)
    if c >= 8 and r.random() < 0.7:
        c = max(8, round(c / 8) * 8)
    return c


def _draw_conv(r: random.Random, big: bool) -> dict[str, Any]:
    n = _lu(r, 1, 256 if big else 16)
    ci = 3 if r.random() < 0.05 else _ch(r, 4, 1024 if big else 128)
    co = _ch(r, 8, 1024 if big else 128)
    k = r.choice((1, 1, 3, 3, 3, 3, 5, 7))
    mode = r.random()
    if mode < 0.15:  # depthwise
        ci = co = max(ci, 8)
        g = ci
    elif mode < 0.3:  # grouped
        g = r.choice((2, 4, 8, 16, 32))
        ci, co = g * max(1, -(-ci // g)), g * max(1, -(-co // g))
    else:
        g = 1
    return {
        "N": n,
        "C_in": ci,
        "C_out": co,
        "H": _lu(r, 4, 256 if big else 64),
        "kernel": k,
        "stride": 1 if r.random() < 0.75 else 2,
        "groups": g,
        "bias": r.random() < 0.4,
    }


def _draw_linear(r: random.Random, big: bool) -> dict[str, Any]:
    return {
        "M": _lu(r, 1, 65536 if big else 2048),
        "K": _ch(r, 8, 16384 if big else 1024),
        "N": _ch(r, 8, 32768 if big else 1024),
        "bias": r.random() < 0.7,
    }


def _draw_matmul(r: random.Random, big: bool) -> dict[str, Any]:
    hi = 16384 if big else 512
    return {"M": _ch(r, 8, hi), "K": _ch(r, 8, hi), "N": _ch(r, 8, hi)}


def _draw_bmm(r: random.Random, big: bool) -> dict[str, Any]:
    hi = 4096 if big else 256
    return {
        "B": _lu(r, 2, 1024 if big else 32),
        "M": _ch(r, 8, hi),
        "K": _ch(r, 8, hi),
        "N": _ch(r, 8, hi),
    }


def _draw_sdpa(r: random.Random, big: bool) -> dict[str, Any]:
    dims = (32, 64, 64, 64, 80, 96, 128, 128, 128, 256) if big else (16, 32, 64)
    return {
        "B": _lu(r, 1, 64 if big else 4),
        "heads": _lu(r, 1, 32 if big else 8),
        "seq": _ch(r, 16, 8192 if big else 256),
        "head_dim": r.choice(dims),
        "causal": r.random() < 0.5,
    }


def _draw_rows(r: random.Random, big: bool) -> dict[str, Any]:
    return {"M": _lu(r, 1, 131072 if big else 4096), "D": _ch(r, 8, 16384 if big else 1024)}


def _draw_softmax(r: random.Random, big: bool) -> dict[str, Any]:
    return {"M": _lu(r, 1, 1 << 20 if big else 4096), "D": _lu(r, 2, 65536 if big else 4096)}


def _draw_image(r: random.Random, big: bool) -> dict[str, Any]:
    return {
        "N": _lu(r, 1, 256 if big else 16),
        "C": _ch(r, 3, 2048 if big else 128),
        "H": _lu(r, 1, 256 if big else 64),
    }


def _draw_group_norm(r: random.Random, big: bool) -> dict[str, Any]:
    p = _draw_image(r, big)
    g = r.choice((8, 16, 32))
    p["C"] = g * max(1, -(-p["C"] // g))
    p["groups"] = g
    return p


def _draw_eltwise(r: random.Random, big: bool) -> dict[str, Any]:
    return {"numel": _lu(r, 1e3 if big else 1e2, 5e8 if big else 2e6)}


def _draw_dropout(r: random.Random, big: bool) -> dict[str, Any]:
    p = _draw_eltwise(r, big)
    p["p"] = r.choice((0.1, 0.1, 0.2, 0.5))
    return p


def _draw_gelu(r: random.Random, big: bool) -> dict[str, Any]:
    p = _draw_eltwise(r, big)
    p["approximate"] = "tanh" if r.random() < 0.3 else "none"
    return p


def _draw_embedding(r: random.Random, big: bool) -> dict[str, Any]:
    return {
        "V": _lu(r, 1000 if big else 100, 262144 if big else 32768),
        "D": _ch(r, 8, 8192 if big else 512),
        "T": _lu(r, 1, 65536 if big else 4096),
    }


def _draw_pool(r: random.Random, big: bool) -> dict[str, Any]:
    p = _draw_image(r, big)
    p["H"] = max(p["H"], 4)
    p["kernel"], p["padding"] = r.choice(((2, 0), (3, 1), (3, 0)))
    p["stride"] = 2
    return p


def _draw_adaptive(r: random.Random, big: bool) -> dict[str, Any]:
    p = _draw_image(r, big)
    p["out"] = r.choice((1, 1, 1, 7))
    return p


def _draw_ce(r: random.Random, big: bool) -> dict[str, Any]:
    return {"N": _lu(r, 1, 65536 if big else 2048), "C": _lu(r, 2, 262144 if big else 8192)}


def _draw_lstm(r: random.Random, big: bool) -> dict[str, Any]:
    return {
        "T": _lu(r, 1, 512 if big else 64),
        "B": _lu(r, 1, 256 if big else 32),
        "I": _ch(r, 16, 2048 if big else 256),
        "H": _ch(r, 16, 2048 if big else 256),
    }


def _draw_opt(r: random.Random, big: bool) -> dict[str, Any]:
    numel = _lu(r, 1e4 if big else 1e3, 5e8 if big else 2e6)
    return {
        "numel": numel,
        "tensors": min(numel, _lu(r, 1, 2000 if big else 64)),
        "split_seed": r.randrange(1 << 30),
    }


_DRAW: dict[str, Callable[[random.Random, bool], dict[str, Any]]] = {
    "conv2d": _draw_conv,
    "linear": _draw_linear,
    "matmul": _draw_matmul,
    "bmm": _draw_bmm,
    "sdpa": _draw_sdpa,
    "layer_norm": _draw_rows,
    "batch_norm": _draw_image,
    "group_norm": _draw_group_norm,
    "softmax": _draw_softmax,
    "add": _draw_eltwise,
    "mul": _draw_eltwise,
    "relu": _draw_eltwise,
    "gelu": _draw_gelu,
    "silu": _draw_eltwise,
    "dropout": _draw_dropout,
    "embedding": _draw_embedding,
    "max_pool2d": _draw_pool,
    "avg_pool2d": _draw_pool,
    "adaptive_avg_pool2d": _draw_adaptive,
    "cross_entropy": _draw_ce,
    "lstm": _draw_lstm,
    "sgd": _draw_opt,
    "adam": _draw_opt,
    "adamw": _draw_opt,
}

# (fwd flops, bwd flops, fwd traffic, bwd traffic) per element, for the pointwise ops
_POINTWISE = {
    "add": (1, 0, 3, 3),
    "mul": (1, 2, 3, 5),
    "relu": (1, 1, 2, 3),
    "gelu": (8, 12, 2, 3),
    "silu": (4, 6, 2, 3),
    "dropout": (3, 1, 2, 2),
}


def _pool_out(h: int, k: int, s: int, pad: int) -> int:
    return max(1, (h + 2 * pad - k) // s + 1)


def _analyze(
    op: str, p: dict[str, Any], esz: int, direction: str
) -> tuple[dict[str, int], dict[str, int], int]:
    """Analytic ``(flops, bytes, estimated peak allocation)`` of one case."""
    bwd = direction == "fwd+bwd"
    f = f_b = t = t_b = 0.0  # flops and traffic, forward and backward
    if op == "conv2d":
        n, ci, co, h = p["N"], p["C_in"], p["C_out"], p["H"]
        k, s, g = p["kernel"], p["stride"], p["groups"]
        ho = _pool_out(h, k, s, k // 2)
        x, y, w = n * ci * h * h, n * co * ho * ho, co * (ci // g) * k * k
        b = co if p.get("bias") else 0
        f = 2.0 * y * (ci // g) * k * k + (y if b else 0)
        f_b = 2 * f
        t, t_b = esz * (x + w + y + b), esz * (y + 2 * x + 2 * w + b)
        live = x + w + y + b
        mem = esz * (2 * live if bwd else live) * 1.25 + (32 << 20)  # + cuDNN workspace
    elif op in ("linear", "matmul", "bmm"):
        bb = p.get("B", 1)
        m, kk, nn_ = p["M"], p["K"], p["N"]
        x, w, y = bb * m * kk, (bb if op == "bmm" else 1) * nn_ * kk, bb * m * nn_
        b = nn_ if p.get("bias") else 0
        f = 2.0 * bb * m * kk * nn_ + (y if b else 0)
        f_b = 2 * f
        t, t_b = esz * (x + w + y + b), esz * (y + 2 * x + 2 * w + b)
        mem = esz * (2 * (x + w + y + b) if bwd else x + w + y + b) + (8 << 20)
    elif op == "sdpa":
        u = p["B"] * p["heads"] * p["seq"] * p["head_dim"]
        f = 4.0 * u * p["seq"] * (0.5 if p["causal"] else 1.0)
        f_b = 2.5 * f
        t, t_b = 4 * esz * u, 8 * esz * u
        attn = p["B"] * p["heads"] * p["seq"] ** 2 * 4 if esz == 4 else 0  # fp32 fallbacks
        mem = esz * (8 * u if bwd else 4 * u) + attn * (2 if bwd else 1) + (8 << 20)
    elif op in ("layer_norm", "softmax", "batch_norm", "group_norm"):
        if op in ("layer_norm", "softmax"):
            x, c = p["M"] * p["D"], p["D"] if op == "layer_norm" else 0
        else:
            x, c = p["N"] * p["C"] * p["H"] * p["H"], p["C"]
        per = {"layer_norm": (7, 10, 2, 3), "softmax": (5, 4, 2, 3)}.get(op, (8, 12, 3, 4))
        f, f_b = per[0] * x, per[1] * x
        pesz = 4 if op == "batch_norm" else esz  # batch norm keeps fp32 weights (as AMP)
        t, t_b = per[2] * esz * x + 2 * pesz * c, per[3] * esz * x + 4 * pesz * c
        mem = esz * (4 * x if bwd else 2 * x) + 6 * pesz * c + (1 << 20)
    elif op in _POINTWISE:
        n = p["numel"]
        ff, fb, tf, tb = _POINTWISE[op]
        f, f_b = ff * n, fb * n
        t, t_b = tf * esz * n, tb * esz * n
        ins = 2 if op in ("add", "mul") else 1
        mask = n if op == "dropout" else 0
        t, t_b = t + mask, t_b + mask
        mem = esz * n * ((2 * ins + 2) if bwd else ins + 1) + mask + (1 << 20)
    elif op == "embedding":
        w, y, tok = p["V"] * p["D"], p["T"] * p["D"], p["T"]
        f, f_b = 0, y
        t, t_b = 2 * esz * y + 8 * tok, esz * (w + 3 * y) + 8 * tok
        mem = esz * (2 * (w + y) if bwd else w + y) + 48 * tok + (1 << 20)
    elif op in ("max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"):
        h = p["H"]
        if op == "adaptive_avg_pool2d":
            ho, kk = p["out"], max(1, (h // max(p["out"], 1)) ** 2)
        else:
            ho, kk = _pool_out(h, p["kernel"], p["stride"], p["padding"]), p["kernel"] ** 2
        x, y = p["N"] * p["C"] * h * h, p["N"] * p["C"] * ho * ho
        idx = 8 * y if op == "max_pool2d" and bwd else 0
        f, f_b = kk * y, (y if op == "max_pool2d" else kk * y)
        t, t_b = esz * (x + y) + idx, esz * (x + y) + idx
        mem = esz * (2 * (x + y) if bwd else x + y) + idx + (1 << 20)
    elif op == "cross_entropy":
        x = p["N"] * p["C"]
        f, f_b = 5 * x, 2 * x
        t, t_b = 2 * esz * x + 8 * p["N"], 2 * esz * x + 8 * p["N"]
        mem = esz * (3 * x if bwd else 2 * x) + 8 * p["N"] + (1 << 20)
    elif op == "lstm":
        tt, b, i, h = p["T"], p["B"], p["I"], p["H"]
        w = 4 * h * (i + h) + 8 * h
        x, y, gates = tt * b * i, tt * b * h, 4 * tt * b * h
        f = 2.0 * tt * b * 4 * h * (i + h) + 10 * tt * b * h
        f_b = 2 * f
        t, t_b = esz * (x + y + w + 2 * gates), esz * (2 * x + 2 * y + 2 * w + 3 * gates)
        mem = esz * (2 * (x + w + y) + 3 * gates if bwd else x + w + y + gates) + (8 << 20)
    elif op in _STEP_OPS:
        n = p["numel"]
        if op == "sgd":  # momentum: buf = m*buf + g; p -= lr*buf
            f, t, live = 3 * n, 5 * esz * n, 3 * n
        else:  # ideal (fused) traffic: read p, g, m, v; write p, m, v
            f, t, live = (13 if op == "adamw" else 12) * n, 7 * esz * n, 6 * n
        mem = esz * live + (1 << 20)
        return {"step": int(f)}, {"step": int(t)}, int(mem)
    else:
        raise KeyError(op)
    flops, traffic = {"fwd": int(f)}, {"fwd": int(t)}
    if bwd:
        flops["bwd"], traffic["bwd"] = int(f_b), int(t_b)
    return flops, traffic, int(mem)


def cases(
    seed: int,
    n: int,
    *,
    scale: str = "gpu",
    ops: Sequence[str] | None = None,
    max_mem: int | None = None,
) -> list[OpCase]:
    """``n`` random :class:`OpCase` s, deterministic in ``seed`` (ids are stable).

    Args:
        seed: the random seed; ``cases(seed, n)`` is a prefix of ``cases(seed, m)`` for
            ``n <= m``.
        n: how many cases (all ids distinct).
        scale: "gpu" (sizes for a big GPU; each case under 4 GiB and 5e11 forward FLOPs) or
            "cpu" (under 64 MiB and 3e7 FLOPs: fast enough for tests) or "cpu-large" (under
            256 MiB and 1e9 FLOPs: the sizes of a CPU's training steps).
        ops: draw only these operations (keys of :data:`OPS`), in their relative weights.
        max_mem: override the scale's cap on a case's estimated peak allocation (bytes).

    Returns:
        The cases, in drawing order (operations interleaved).
    """
    if scale not in _SCALES:
        raise ValueError(f"scale must be one of {sorted(_SCALES)}, not {scale!r}")
    sc = _SCALES[scale]
    cap = sc.max_mem if max_mem is None else int(max_mem)
    names = list(ops) if ops is not None else list(OPS)
    unknown = [o for o in names if o not in OPS]
    if unknown or not names:
        raise ValueError(f"unknown operations {unknown}; choose from {sorted(OPS)}")
    weights = [OPS[o] for o in names]
    dtypes, dweights = (
        (("fp32", "bf16", "fp16"), (35, 45, 20)) if sc.big else (("fp32", "bf16"), (75, 25))
    )
    opt_dweights = (70, 20, 10) if sc.big else (80, 20)
    r = random.Random(f"costaware.opbench:{seed}:{scale}")
    out: list[OpCase] = []
    seen: set[str] = set()
    while len(out) < n:
        op = r.choices(names, weights)[0]
        step = op in _STEP_OPS
        dtype = r.choices(dtypes, opt_dweights if step else dweights)[0]
        direction = "step" if step else ("fwd+bwd" if r.random() < 0.7 else "fwd")
        for _ in range(_TRIES):
            c = OpCase(op, _DRAW[op](r, sc.big), dtype, direction)
            if c.mem <= cap and c.flops.get("fwd", 0) <= sc.max_flops and c.id not in seen:
                break
        else:  # pragma: no cover - the ranges always leave small shapes
            raise RuntimeError(f"no {op} shape fits under {cap} bytes after {_TRIES} draws")
        seen.add(c.id)
        out.append(c)
    return out


# ------------------------------------------------------------------------------- building
@dataclass
class _Prepared:
    """What one timed repetition calls: ``fwd`` (returns the output) or ``step``."""

    fwd: Callable[[], torch.Tensor] | None = None
    step: Callable[[], Any] | None = None
    leaves: list[torch.Tensor] = field(default_factory=list)
    keep: list[Any] = field(default_factory=list)  # modules and optimizers kept alive


def _split_sizes(numel: int, tensors: int, seed: int) -> list[int]:
    """Deterministic tensor sizes (log-uniform over four decades) summing to ``numel``."""
    r = random.Random(seed)
    tensors = max(1, min(tensors, numel))
    w = [math.exp(r.uniform(0.0, math.log(1e4))) for _ in range(tensors)]
    total = sum(w)
    sizes = [max(1, int(numel * x / total)) for x in w]
    diff = numel - sum(sizes)
    big = max(range(tensors), key=sizes.__getitem__)
    sizes[big] = max(1, sizes[big] + diff)
    return sizes


def _build(case: OpCase, dev: torch.device) -> _Prepared:
    """Allocate a case's inputs on ``dev`` (once) and return the closures to time."""
    p, op = case.params, case.op
    dt = _DTYPES[case.dtype]
    grad = case.direction == "fwd+bwd"

    def rnd(*shape: int, dtype: torch.dtype = dt, g: bool = grad) -> torch.Tensor:
        return torch.randn(shape, dtype=dtype, device=dev, requires_grad=g)

    if op == "conv2d":
        x = rnd(p["N"], p["C_in"], p["H"], p["H"])
        w = rnd(p["C_out"], p["C_in"] // p["groups"], p["kernel"], p["kernel"])
        b = rnd(p["C_out"]) if p["bias"] else None
        s, pad, g = p["stride"], p["kernel"] // 2, p["groups"]
        leaves = [x, w] + ([b] if b is not None else [])
        return _Prepared(lambda: F.conv2d(x, w, b, s, pad, 1, g), leaves=leaves)
    if op == "linear":
        x, w = rnd(p["M"], p["K"]), rnd(p["N"], p["K"])
        b = rnd(p["N"]) if p["bias"] else None
        leaves = [x, w] + ([b] if b is not None else [])
        return _Prepared(lambda: F.linear(x, w, b), leaves=leaves)
    if op == "matmul":
        a, m = rnd(p["M"], p["K"]), rnd(p["K"], p["N"])
        return _Prepared(lambda: torch.matmul(a, m), leaves=[a, m])
    if op == "bmm":
        a, m = rnd(p["B"], p["M"], p["K"]), rnd(p["B"], p["K"], p["N"])
        return _Prepared(lambda: torch.bmm(a, m), leaves=[a, m])
    if op == "sdpa":
        shape = (p["B"], p["heads"], p["seq"], p["head_dim"])
        q, k, v = rnd(*shape), rnd(*shape), rnd(*shape)
        causal = bool(p["causal"])
        return _Prepared(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), leaves=[q, k, v]
        )
    if op == "layer_norm":
        x, w, b = rnd(p["M"], p["D"]), rnd(p["D"]), rnd(p["D"])
        d = (p["D"],)
        return _Prepared(lambda: F.layer_norm(x, d, w, b), leaves=[x, w, b])
    if op == "softmax":
        x = rnd(p["M"], p["D"])
        return _Prepared(lambda: torch.softmax(x, -1), leaves=[x])
    if op == "batch_norm":
        x = rnd(p["N"], p["C"], p["H"], p["H"])
        c = p["C"]
        w, b = rnd(c, dtype=torch.float32), rnd(c, dtype=torch.float32)
        rm = torch.zeros(c, device=dev)
        rv = torch.ones(c, device=dev)
        return _Prepared(
            lambda: F.batch_norm(x, rm, rv, w, b, training=True), leaves=[x, w, b], keep=[rm, rv]
        )
    if op == "group_norm":
        x = rnd(p["N"], p["C"], p["H"], p["H"])
        w, b = rnd(p["C"]), rnd(p["C"])
        groups = p["groups"]
        return _Prepared(lambda: F.group_norm(x, groups, w, b), leaves=[x, w, b])
    if op in _POINTWISE:
        x = rnd(p["numel"])
        if op == "add":
            y = rnd(p["numel"])
            return _Prepared(lambda: torch.add(x, y), leaves=[x, y])
        if op == "mul":
            y = rnd(p["numel"])
            return _Prepared(lambda: torch.mul(x, y), leaves=[x, y])
        if op == "dropout":
            pr = float(p["p"])
            return _Prepared(lambda: F.dropout(x, pr, True), leaves=[x])
        if op == "gelu":
            approx = str(p["approximate"])
            return _Prepared(lambda: F.gelu(x, approximate=approx), leaves=[x])
        fn = F.relu if op == "relu" else F.silu
        return _Prepared(lambda: fn(x), leaves=[x])
    if op == "embedding":
        w = rnd(p["V"], p["D"])
        idx = torch.randint(p["V"], (p["T"],), device=dev)
        return _Prepared(lambda: F.embedding(idx, w), leaves=[w], keep=[idx])
    if op in ("max_pool2d", "avg_pool2d"):
        x = rnd(p["N"], p["C"], p["H"], p["H"])
        k, s, pad = p["kernel"], p["stride"], p["padding"]
        if op == "max_pool2d":
            return _Prepared(lambda: F.max_pool2d(x, k, s, pad), leaves=[x])
        return _Prepared(lambda: F.avg_pool2d(x, k, s, pad), leaves=[x])
    if op == "adaptive_avg_pool2d":
        x = rnd(p["N"], p["C"], p["H"], p["H"])
        o = p["out"]
        return _Prepared(lambda: F.adaptive_avg_pool2d(x, o), leaves=[x])
    if op == "cross_entropy":
        x = rnd(p["N"], p["C"])
        tgt = torch.randint(p["C"], (p["N"],), device=dev)
        return _Prepared(lambda: F.cross_entropy(x, tgt), leaves=[x], keep=[tgt])
    if op == "lstm":
        lstm = nn.LSTM(p["I"], p["H"], device=dev, dtype=dt)
        lstm.requires_grad_(grad)
        x = rnd(p["T"], p["B"], p["I"])
        return _Prepared(
            lambda: lstm(x)[0], leaves=[x, *lstm.parameters()] if grad else [], keep=[lstm]
        )
    if op in _STEP_OPS:
        sizes = _split_sizes(p["numel"], p["tensors"], p["split_seed"])
        flat = torch.randn(sum(sizes), dtype=dt, device=dev)
        grads = torch.randn(sum(sizes), dtype=dt, device=dev)
        params = list(torch.split(flat, sizes))
        for prm, gr in zip(params, torch.split(grads, sizes)):
            prm.grad = gr
        opt: torch.optim.Optimizer
        if op == "sgd":
            opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
        elif op == "adam":
            opt = torch.optim.Adam(params, lr=1e-3)
        else:
            opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
        return _Prepared(step=opt.step, keep=[opt, flat, grads])
    raise ValueError(f"unknown operation {op!r}")


# ------------------------------------------------------------------------------- timing
class _Clock:
    """Timestamps: CUDA events recorded on the stream, or ``perf_counter`` on a CPU.

    On CUDA every mark also takes a ``perf_counter`` stamp: the CPU's side of the same
    moment, from which the time the CPU spent issuing each phase is read (``issue``).
    """

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.events: list[Any] = []
        self.stamps: list[float] = []
        self.k = 0

    def reset(self, marks: int) -> None:
        self.k = 0
        if self.cuda:
            while len(self.events) < marks:
                self.events.append(torch.cuda.Event(enable_timing=True))  # type: ignore[no-untyped-call]
        if len(self.stamps) < marks:
            self.stamps.extend([0.0] * (marks - len(self.stamps)))

    def mark(self) -> None:
        if self.cuda:
            self.events[self.k].record()
        self.stamps[self.k] = time.perf_counter()
        self.k += 1

    def seconds(self, a: int, b: int) -> float:
        if self.cuda:
            return float(self.events[a].elapsed_time(self.events[b])) / 1e3
        return self.issue(a, b)  # on a CPU, the work is done as it is issued

    def issue(self, a: int, b: int) -> float:
        """CPU seconds between marks ``a`` and ``b`` (what issuing the work between took)."""
        return self.stamps[b] - self.stamps[a]


#: the GPU's ``torch.cuda._sleep`` cycles per second, measured once per process
_SLEEP_RATE: list[float] = []


def _sleep_rate() -> float:
    """Cycles per second of ``torch.cuda._sleep`` on the current GPU (measured once)."""
    if not _SLEEP_RATE:
        a, b = (torch.cuda.Event(enable_timing=True) for _ in range(2))  # type: ignore[no-untyped-call]
        torch.cuda._sleep(1_000_000)  # type: ignore[no-untyped-call]  # warm the kernel
        cycles = 20_000_000
        a.record()
        torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]
        b.record()
        torch.cuda.synchronize()
        _SLEEP_RATE.append(cycles / max(float(a.elapsed_time(b)) / 1e3, 1e-6))
    return _SLEEP_RATE[0]


def _hold_gpu(seconds: float) -> tuple[Any, float]:
    """Enqueue a spin kernel of about ``seconds`` on the current stream, so that the work
    the CPU issues next queues up behind it and runs back to back, with no launch gaps.

    Returns an event recorded before the spin and the CPU time of that record: after a
    synchronisation, ``elapsed(event, first mark)`` is how long the GPU spun.
    """
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    t = time.perf_counter()
    torch.cuda._sleep(max(1, int(seconds * _sleep_rate())))  # type: ignore[no-untyped-call]
    return start, t


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


#: how much longer than the CPU's expected issue time a held GPU spins before the reps
_HOLD_MARGIN = 2.0
#: spin tries per case: a hold the CPU outran is retried once, twice as long
_HOLD_TRIES = 2


def _time_prepared(
    prep: _Prepared,
    direction: str,
    clock: _Clock,
    warmup: int,
    reps: int,
    slow_rep_s: float,
    hold: bool = False,
) -> dict[str, Any]:
    """Warm up, then time ``reps`` repetitions (3 when a warm-up one is slow).

    With ``hold`` (CUDA only), the timed repetitions queue up behind a spin kernel
    (:func:`_hold_gpu`) long enough to cover the time the CPU takes to issue them, so
    that the events time the GPU's own work, back to back (``timer="cuda_held"``), and
    the ``*_issue_s`` times are what the CPU took to issue each phase. Without it, an
    event pair around an op also times the CPU's launch latency while the GPU waits
    (``timer="cuda_event"``): tens of microseconds, which drown small kernels. When
    the CPU outruns the spin twice, the times are the unheld kind and say so.
    """
    cuda = clock.cuda
    leaves = prep.leaves
    bwd = direction == "fwd+bwd"
    gout: list[torch.Tensor | None] = []  # the output gradient, made once

    def rep(marks: bool) -> None:
        if prep.step is not None:
            if marks:
                clock.mark()
            prep.step()
            if marks:
                clock.mark()
            return
        assert prep.fwd is not None
        for t in leaves:
            t.grad = None
        if marks:
            clock.mark()
        out = prep.fwd()
        if bwd:
            if marks:
                clock.mark()
            if not gout:
                gout.append(None if out.dim() == 0 else torch.randn_like(out))
            out.backward(gout[0])  # type: ignore[no-untyped-call]
        del out
        if marks:
            clock.mark()

    held: dict[str, Any] = {}
    with torch.set_grad_enabled(bwd):
        warm: list[float] = []
        issue = math.inf  # the CPU's time to issue one repetition (no synchronisation)
        for i in range(max(1, warmup)):
            t0 = time.perf_counter()
            rep(False)
            issue = min(issue, time.perf_counter() - t0)
            _sync(cuda)
            warm.append(time.perf_counter() - t0)
            if i >= 1 and warm[-1] > slow_rep_s:
                break
        capped = warm[-1] > slow_rep_s
        n = min(3, reps) if capped else reps
        per = 3 if bwd else 2
        holding = hold and cuda
        hold_s = _HOLD_MARGIN * n * issue + 1e-3
        for _ in range(_HOLD_TRIES if holding else 1):
            clock.reset(per * n)
            start = _hold_gpu(hold_s) if holding else None
            for _ in range(n):
                rep(True)
            _sync(cuda)
            if start is None:
                break
            # the GPU ran the reps back to back if it was still spinning when the CPU had
            # issued the last of them
            spun = float(start[0].elapsed_time(clock.events[0])) / 1e3
            cpu = clock.stamps[per * n - 1] - start[1]
            held = {"held": spun > cpu, "hold_s": spun, "issue_all_s": cpu}
            if held["held"]:
                break
            hold_s = 2 * max(hold_s, cpu)
    times: dict[str, Any] = {}
    phases = ["fwd", "bwd"] if bwd else ["step" if prep.step is not None else "fwd"]
    for j, ph in enumerate(phases):
        xs = [clock.seconds(per * i + j, per * i + j + 1) for i in range(n)]
        times[f"{ph}_s"], times[f"{ph}_p10_s"] = _pct(xs, 0.5), _pct(xs, 0.1)
        times[f"{ph}_p90_s"] = _pct(xs, 0.9)
        if cuda:
            cpu_xs = [clock.issue(per * i + j, per * i + j + 1) for i in range(n)]
            times[f"{ph}_issue_s"] = _pct(cpu_xs, 0.5)
    tot = [clock.seconds(per * i, per * i + per - 1) for i in range(n)]
    times["total_s"], times["total_p10_s"] = _pct(tot, 0.5), _pct(tot, 0.1)
    times["total_p90_s"] = _pct(tot, 0.9)
    timer = "perf_counter"
    if cuda:
        timer = "cuda_held" if held.get("held") else "cuda_event"
    times.update(
        reps=n,
        warmup=len(warm),
        capped=capped,
        warm_first_s=warm[0],
        timer=timer,
        **held,
    )
    return times


def _phase_peaks(prep: _Prepared, dev: torch.device, base: int) -> dict[str, int]:
    """Peak allocation (above ``base``) of one forward, and of the backward that follows.

    What one ``fwd+bwd`` repetition holds in each phase, the inputs and the output
    gradient included: a kernel's workspace shows as the phase's peak above its tensors.
    """
    assert prep.fwd is not None
    for t in prep.leaves:
        t.grad = None
    with torch.enable_grad():
        torch.cuda.reset_peak_memory_stats(dev)
        out = prep.fwd()
        fwd = torch.cuda.max_memory_allocated(dev) - base
        gout = None if out.dim() == 0 else torch.randn_like(out)
        torch.cuda.reset_peak_memory_stats(dev)
        out.backward(gout)  # type: ignore[no-untyped-call]
        bwd = torch.cuda.max_memory_allocated(dev) - base
    del out, gout
    for t in prep.leaves:
        t.grad = None
    return {"fwd": int(fwd), "bwd": int(bwd)}


# ------------------------------------------------------------------------------- running
@dataclass
class OpBenchSummary(CollectSummary):
    """What one :func:`bench` call did (a collect summary, counting cases)."""

    fatal: str | None = None

    @property
    def rate(self) -> float:
        """Cases measured per second."""
        return self.measured / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in sorted(self.statuses.items())) or "none"
        stop = " (stopped at the time limit)" if self.stopped_early else ""
        fatal = f"; STOPPED: {self.fatal}" if self.fatal else ""
        return (
            f"measured {self.measured} cases in {_fmt_s(self.seconds)} ({self.rate:.1f}/s; "
            f"{counts}); skipped {self.skipped} already recorded; {self.remaining} left{stop}"
            f"{fatal} -> {self.out_path}"
        )


class _Bar:
    """A ``\\r`` line on a TTY (at most 4 a second), else a log line every ``every_s``."""

    def __init__(
        self, total: int, budget_s: float | None, enabled: bool, stream: TextIO, every_s: float
    ) -> None:
        self.total, self.budget_s, self.enabled, self.stream = total, budget_s, enabled, stream
        self.tty = enabled and hasattr(stream, "isatty") and stream.isatty()
        self.every_s = 0.25 if self.tty else every_s
        self.t0 = self.last = time.perf_counter()
        self.done = 0
        self.counts: dict[str, int] = {}

    def update(self, status: str, last: str) -> None:
        self.done += 1
        self.counts[status] = self.counts.get(status, 0) + 1
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.last < self.every_s and self.done != self.total:
            return
        self.last = now
        elapsed = now - self.t0
        rate = self.done / max(elapsed, 1e-9)
        eta = (self.total - self.done) / max(rate, 1e-9)
        if self.budget_s is not None:
            eta = min(eta, max(0.0, self.budget_s - elapsed))
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        msg = (
            f"{self.done}/{self.total} {rate:.1f}/s {_fmt_s(elapsed)} ETA {_fmt_s(eta)} "
            f"{counts} | {last}"
        )
        if self.tty:
            width = 20
            filled = int(width * self.done / max(self.total, 1))
            line = f"\r[{'#' * filled}{'.' * (width - filled)}] {msg}"
            self.stream.write(line[:150].ljust(150))
        else:
            self.stream.write(f"[opbench] {msg}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


class _Writer:
    """Appends rows as gzip members (the format of :func:`costaware.measure.collect.append_row`).

    Each row reaches the OS at once (a crashed process loses nothing); the file is synced to
    disk every ``sync_s`` seconds and on close, not after every row.
    """

    def __init__(self, path: Path, sync_s: float = 5.0) -> None:
        self.f = open(path, "ab")  # noqa: SIM115 - closed in close()
        self.sync_s = sync_s
        self.last = time.monotonic()

    def write(self, row: dict[str, Any]) -> None:
        line = json.dumps(row, separators=(",", ":")) + "\n"
        self.f.write(gzip.compress(line.encode(), mtime=0))
        self.f.flush()
        if time.monotonic() - self.last > self.sync_s:
            os.fsync(self.f.fileno())
            self.last = time.monotonic()

    def close(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()


def _environment(dev: torch.device, cudnn_benchmark: bool) -> dict[str, Any]:
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "cudnn_benchmark": cudnn_benchmark,
        "matmul_precision": torch.get_float32_matmul_precision(),
        "collector": "costaware.opbench",
    }
    if dev.type == "cuda":
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        env["gpu"] = torch.cuda.get_device_name(idx)
        env["gpu_memory"] = int(props.total_memory)
        env["sm"] = f"{props.major}.{props.minor}"
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
        env["cudnn_tf32"] = bool(torch.backends.cudnn.allow_tf32)
        env["driver"] = nvml_driver()
    else:
        env["cpu"] = platform.processor() or platform.machine()
        env["cpu_count"] = os.cpu_count()
    return env


def _base_row(case: OpCase, device: str, device_name: str, env: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": OP_SCHEMA_VERSION,
        "kind": "op",
        "id": case.id,
        "op": case.op,
        "params": case.params,
        "dtype": case.dtype,
        "direction": case.direction,
        "flops": case.flops,
        "bytes": case.nbytes,
        "mem_est": case.mem,
        "status": "ok",
        "times": {},
        "peak_alloc": None,
        "peak_alloc_phase": None,
        "error": None,
        "device": device,
        "device_name": device_name,
        "env": env,
        "finished_at": None,
    }


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    msg = str(e).lower()
    return "out of memory" in msg or "alloc_failed" in msg


def _measure_one(
    case: OpCase,
    dev: torch.device,
    clock: _Clock,
    warmup: int,
    reps: int,
    slow_rep_s: float,
    row: dict[str, Any],
    hold: bool = False,
) -> None:
    """Time ``case`` into ``row`` (status, times, peaks, error); never raises an Exception."""
    cuda = dev.type == "cuda"
    t0 = time.perf_counter()
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
            base = torch.cuda.memory_allocated(dev)
        prep = _build(case, dev)
        row["times"] = _time_prepared(
            prep, case.direction, clock, warmup, reps, slow_rep_s, hold=hold
        )
        if cuda:
            row["peak_alloc"] = int(torch.cuda.max_memory_allocated(dev) - base)
            if case.direction == "fwd+bwd" and prep.fwd is not None:
                row["peak_alloc_phase"] = _phase_peaks(prep, dev, base)
        del prep
    except Exception as e:
        row["status"] = "oom" if _is_oom(e) else "error"
        row["error"] = f"{type(e).__name__}: {e}"[:400]
    row["times"]["wall_s"] = time.perf_counter() - t0


def _cuda_healthy(dev: torch.device) -> str | None:
    """None if CUDA still works after an error, else the error (a dead context)."""
    try:
        torch.cuda.synchronize(dev)
        if float(torch.ones(1, device=dev).add_(1).item()) != 2.0:
            return "CUDA returned a wrong result after an error"
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:300]
    return None


def _recover_crash(
    out: Path, writer: _Writer, known: set[str], device: str, name: str, env: dict[str, Any]
) -> bool:
    """Record the case a killed run was timing as ``status="crash"``; True if it did."""
    marker = _inflight_path(out)
    if not marker.is_file():
        return False
    try:
        case = OpCase.from_dict(json.loads(marker.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        marker.unlink(missing_ok=True)
        return False
    marker.unlink(missing_ok=True)
    if case.id in known:
        return False
    row = _base_row(case, device, name, env)
    row.update(
        status="crash",
        error="the process died while timing this case (segfault, kill or time limit)",
        finished_at=_now(),
    )
    writer.write(row)
    known.add(case.id)
    return True


def bench(
    todo_cases: Sequence[OpCase],
    out_path: str | os.PathLike[str],
    device: str = "cuda",
    *,
    max_minutes: float | None = None,
    resume: bool = True,
    warmup: int = 3,
    reps: int = 10,
    slow_rep_s: float = 0.5,
    cudnn_benchmark: bool = False,
    progress: bool = True,
    stream: TextIO | None = None,
    housekeeping_every: int = 200,
    hold: bool = True,
) -> OpBenchSummary:
    """Time ``todo_cases`` on ``device`` and append one row per case to ``out_path``.

    Args:
        todo_cases: the cases (:func:`cases`), timed in this order.
        out_path: a ``.jsonl.gz`` file; created (with its folder) if missing.
        device: "cpu" or "cuda" ("cuda:1"...).
        max_minutes: stop cleanly between cases once this much time has passed (the first
            case always runs; one case takes a few seconds at most).
        resume: skip the ids already in ``out_path`` (else time them again).
        warmup: untimed repetitions (at least 1: the first makes the output gradient).
        reps: timed repetitions (3 when a warm-up repetition took over ``slow_rep_s``).
        cudnn_benchmark: ``torch.backends.cudnn.benchmark`` during the run (restored after).
        progress: a ``\\r`` line on a TTY, else a log line every 10 s.
        stream: where progress goes (default stderr).
        housekeeping_every: run the garbage collector and empty the CUDA cache every this
            many cases (and after every OOM or error); never in between.
        hold: on CUDA, queue the timed repetitions behind a spin kernel so that the events
            time the GPU's work alone (``timer="cuda_held"``; see :func:`_time_prepared`);
            ``False`` times each call with the CPU's launch latency in it, as schema 1 did.

    Returns:
        An :class:`OpBenchSummary`; ``fatal`` is set when CUDA stopped working (an illegal
        memory access...) and the run ended early: re-run to resume in a fresh process.
    """
    t0 = time.perf_counter()
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    stream = stream if stream is not None else sys.stderr
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    if cuda and dev.index is not None:
        torch.cuda.set_device(dev)
    env = _environment(dev, cudnn_benchmark)
    name = str(env.get("gpu") or "cuda") if cuda else "CPU"
    summary = OpBenchSummary(out_path=str(out))
    known = done_ids(out) if resume else set()
    writer = _Writer(out)
    marker = _inflight_path(out)
    old_bench = torch.backends.cudnn.benchmark
    gc_was = gc.isenabled()
    todo: list[OpCase] = []
    try:
        if resume and _recover_crash(out, writer, known, device, name, env):
            summary.statuses["crash"] = 1
        todo = [c for c in todo_cases if c.id not in known]
        summary.skipped = len(todo_cases) - len(todo)
        budget = None if max_minutes is None else max_minutes * 60.0
        bar = _Bar(len(todo), budget, progress, stream, every_s=10.0)
        clock = _Clock(cuda)
        torch.backends.cudnn.benchmark = cudnn_benchmark
        gc.disable()  # collections only between cases
        probed = -math.inf
        for i, case in enumerate(todo):
            now = time.perf_counter()
            if budget is not None and i > 0 and now - t0 >= budget:
                summary.stopped_early = True
                break
            if now - probed >= HOST_SPEED_EVERY_S:  # the host's speed, beside its timings
                env = {**env, "host_speed": host_speed()}
                probed = now
            marker.write_text(json.dumps(case.to_dict(), separators=(",", ":")))
            row = _base_row(case, device, name, env)
            _measure_one(case, dev, clock, warmup, reps, slow_rep_s, row, hold=hold)
            row["finished_at"] = _now()
            writer.write(row)
            status = str(row["status"])
            summary.measured += 1
            summary.statuses[status] = summary.statuses.get(status, 0) + 1
            bar.update(status, f"{case.id} {status}")
            if status != "ok" or (i + 1) % housekeeping_every == 0:
                gc.collect(2 if status != "ok" else 1)  # a full pass only after a failure
                if cuda:
                    torch.cuda.empty_cache()
            if status == "error" and cuda:
                summary.fatal = _cuda_healthy(dev)
                if summary.fatal:
                    break
        bar.close()
        marker.unlink(missing_ok=True)
    finally:
        writer.close()
        torch.backends.cudnn.benchmark = old_bench
        if gc_was:
            gc.enable()
    summary.remaining = len(todo) - summary.measured
    summary.seconds = time.perf_counter() - t0
    return summary


def load_op_rows(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    statuses: Sequence[str] = ("ok",),
) -> list[dict[str, Any]]:
    """The op rows (``kind == "op"``) of one or more ``.jsonl.gz`` files with a status in
    ``statuses`` (default: measured ones), in file order, for an op-level time model."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    wanted = set(statuses)
    rows: list[dict[str, Any]] = []
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(str(path))
        rows.extend(
            r for r in read_rows(path) if r.get("kind") == "op" and r.get("status") in wanted
        )
    return rows


# ------------------------------------------------------------------------------- command line
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m costaware.measure.opbench``: time random single operations (torch-only)."""
    p = argparse.ArgumentParser(
        prog="python -m costaware.measure.opbench",
        description=(
            "Time single operations (conv2d, linear, matmul, bmm, attention, norms, softmax, "
            "pointwise ops, embedding, pooling, cross-entropy, LSTM, optimizer steps) over "
            "random shapes and dtypes, and append one row per case to a .jsonl.gz file, for "
            "an op-level time model. Imports only torch and the standard library. Re-running "
            "the same command resumes."
        ),
        epilog=(
            "example: PYTHONPATH=src python -m costaware.measure.opbench --device cuda --seed 0 "
            "--n 30000 --out data/ops/h100-ops-seed0.jsonl.gz --max-minutes 8"
        ),
    )
    p.add_argument("--device", default="cuda", help="cpu or cuda[:N] (default cuda)")
    p.add_argument("--seed", type=int, default=0, help="case seed (default 0)")
    p.add_argument("--n", type=int, default=30000, help="number of cases (default 30000)")
    p.add_argument("--out", help="output .jsonl.gz file (appended to; resumed)")
    p.add_argument(
        "--scale",
        choices=sorted(_SCALES),
        default=None,
        help=(
            "case sizes: gpu (<= 4 GiB a case), cpu (<= 64 MiB and 3e7 forward FLOPs) or "
            "cpu-large (<= 256 MiB and 1e9 FLOPs); default gpu on cuda, cpu on a CPU"
        ),
    )
    p.add_argument(
        "--ops", help="comma-separated operations to draw (default all): " + ",".join(OPS)
    )
    p.add_argument(
        "--max-gib", type=float, default=None, help="cap on a case's estimated peak (GiB)"
    )
    p.add_argument("--max-minutes", type=float, default=None, help="stop cleanly after this")
    p.add_argument("--warmup", type=int, default=3, help="untimed repetitions (default 3)")
    p.add_argument("--reps", type=int, default=10, help="timed repetitions (default 10)")
    p.add_argument(
        "--slow-rep",
        type=float,
        default=0.5,
        help="time only 3 reps when a warm-up rep takes over this many seconds (default 0.5)",
    )
    p.add_argument(
        "--cudnn-benchmark", action="store_true", help="cudnn.benchmark on (default off)"
    )
    p.add_argument(
        "--timer",
        choices=("held", "event"),
        default="held",
        help=(
            "CUDA timing: 'held' queues the reps behind a spin kernel so that the events time "
            "the GPU's own work and the CPU's issue time is recorded apart (default); 'event' "
            "times each call with its launch latency in it (schema 1's timings)"
        ),
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default torch's)")
    p.add_argument("--no-resume", action="store_true", help="time ids already in the file again")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--list", action="store_true", help="print the cases as JSON lines and exit")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.warmup < 1 or args.reps < 1 or args.n < 0:
        p.error("--warmup and --reps must be at least 1, --n at least 0")
    scale = args.scale or ("gpu" if args.device.startswith("cuda") else "cpu")
    ops = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else None
    max_mem = int(args.max_gib * (1 << 30)) if args.max_gib is not None else None
    try:
        todo = cases(args.seed, args.n, scale=scale, ops=ops, max_mem=max_mem)
    except ValueError as e:
        p.error(str(e))
    if args.list:
        counts: dict[str, int] = {}
        for c in todo:
            print(json.dumps(c.to_dict(), separators=(",", ":")))
            counts[c.op] = counts.get(c.op, 0) + 1
        if not args.quiet:
            mix = ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
            print(f"[opbench] {len(todo)} cases ({scale} scale): {mix}", file=sys.stderr)
        return 0
    if not args.out:
        p.error("--out FILE.jsonl.gz is required (or --list)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda needs a visible CUDA GPU; use --device cpu")
    if not args.quiet:
        print(
            f"[opbench] {len(todo)} cases (seed {args.seed}, {scale} scale) on {args.device} "
            f"-> {args.out}",
            file=sys.stderr,
            flush=True,
        )
    summary = bench(
        todo,
        args.out,
        args.device,
        max_minutes=args.max_minutes,
        resume=not args.no_resume,
        warmup=args.warmup,
        reps=args.reps,
        slow_rep_s=args.slow_rep,
        cudnn_benchmark=args.cudnn_benchmark,
        progress=not args.quiet,
        hold=args.timer == "held",
    )
    if not args.quiet or summary.fatal:
        print(f"[opbench] {summary}", file=sys.stderr, flush=True)
    return 3 if summary.fatal else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
