"""What `costaware calibrate` is worth on this machine, on architectures nobody trained on.

1. Calibrates: measures the calibration configurations (``costaware.runtime.calibrate``: small
   corpus models of every family, from a corpus seed the shipped model did not learn) and
   records them in a fresh SQLite store, as ``costaware calibrate --record always`` does.
2. Refits the shipped model on them, as the integrations' online refit does first.
3. Measures a set of architectures outside the corpus and its families (frozen layers,
   activation checkpointing, tied embeddings, LoRA adapters, ``nn.MultiheadAttention``,
   a forward partly under ``no_grad``, einsum and FFT) with ``costaware.measure.profile.measure``
   and prints their step time predicted by the shipped model and by the calibrated one.

The shipped CPU model learned one 2-core container in one window (``data/README.md``),
whose speed had moved 2x between its first collection and the second, and moves by tens
of percent from one minute to the next; on a CPU this measures the calibration against
that real drift, not a simulated one. On a GPU it measures it against whatever separates
this GPU from the H100 the model learned.

Usage:
    python benchmarks/calibration.py [--device auto|cpu|cuda] [-n 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.utils.checkpoint as checkpoint
from torch import nn

import costaware as ca
from costaware.measure.profile import measure
from costaware.runtime.calibrate import calibrate
from costaware.runtime.refit import OnlineRefit
from costaware.runtime.store import ObservationStore


def _mlp(d: int = 768, h: int = 1024, layers: int = 4, inplace: bool = False) -> nn.Module:
    mods: list[nn.Module] = [nn.Flatten()]
    for i in range(layers):
        mods += [nn.Linear(d if i == 0 else h, h), nn.ReLU(inplace=inplace)]
    return nn.Sequential(*mods, nn.Linear(h, 10))


def _frozen_backbone() -> nn.Module:
    model = _mlp(512, 2048, 6)
    for p in list(model.parameters())[:-4]:  # fine-tune the last two layers only
        p.requires_grad_(False)
    return model


class _Blocks(nn.Module):
    def __init__(self, ckpt: bool) -> None:
        super().__init__()
        self.ckpt = ckpt
        self.inp, self.head = nn.Linear(512, 512), nn.Linear(512, 10)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)) for _ in range(4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x.flatten(1))
        for b in self.blocks:
            x = x + (checkpoint.checkpoint(b, x, use_reentrant=False) if self.ckpt else b(x))
        return self.head(x)


class _LM(nn.Module):
    def __init__(self, tied: bool, vocab: int = 8000, d: int = 256) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layer = nn.TransformerEncoderLayer(d, 4, 4 * d, batch_first=True)
        self.out = nn.Linear(d, vocab, bias=False)
        if tied:
            self.out.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.layer(self.emb(ids)))


class _LoRA(nn.Module):
    def __init__(self, d: int = 1024, r: int = 8, layers: int = 4) -> None:
        super().__init__()
        self.inp, self.head = nn.Linear(768, d), nn.Linear(d, 10)
        self.base = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.inp.requires_grad_(False)
        self.base.requires_grad_(False)
        self.a = nn.ParameterList(nn.Parameter(torch.randn(d, r) * 0.01) for _ in range(layers))
        self.b = nn.ParameterList(nn.Parameter(torch.zeros(r, d)) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x.flatten(1))
        for lin, a, b in zip(self.base, self.a, self.b, strict=True):
            x = torch.relu(lin(x) + x @ a @ b)
        return self.head(x)


class _MHA(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.out = nn.Embedding(4000, 256), nn.Linear(256, 4000)
        self.attn = nn.MultiheadAttention(256, 8, batch_first=True)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        return self.out(self.attn(h, h, h, need_weights=True)[0])


class _PartlyFrozen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(768, 2048), nn.Linear(2048, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            h = self.a(x.flatten(1))
        return self.b(torch.relu(h))


class _Spectral(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.out = nn.Linear(768, 512), nn.Linear(512, 10)
        self.w = nn.Parameter(torch.randn(8, 64, 64) * 0.05)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.einsum("bhd,hde->bhe", self.a(x.flatten(1)).view(-1, 8, 64), self.w)
        h = torch.fft.rfft(h, dim=-1).abs()[..., :32].flatten(1)
        return self.out(torch.cat([h, h], 1))


_IMG = ca.ImageBatch((3, 16, 16), classes=10)
_VEC = ca.ImageBatch((2, 16, 16), classes=10)
#: (name, factory, batch, batch size, optimizer): none of them is a corpus family
HELD_OUT: list[tuple[str, Callable[[], nn.Module], ca.spec.BatchLike, int, str]] = [
    ("MLP 768-1024x4", _mlp, _IMG, 128, "adam"),
    ("MLP, in-place ReLU", lambda: _mlp(inplace=True), _IMG, 128, "adam"),
    ("frozen backbone", _frozen_backbone, _VEC, 128, "adam"),
    ("checkpointed blocks", lambda: _Blocks(True), _VEC, 256, "adamw"),
    ("the same, no checkpoints", lambda: _Blocks(False), _VEC, 256, "adamw"),
    ("tied-embedding LM", lambda: _LM(True), ca.TokenBatch(64, 8000), 16, "adamw"),
    ("untied LM", lambda: _LM(False), ca.TokenBatch(64, 8000), 16, "adamw"),
    ("LoRA adapters", _LoRA, _IMG, 64, "adamw"),
    ("nn.MultiheadAttention", _MHA, ca.TokenBatch(64, 4000), 16, "sgd"),
    ("forward partly no_grad", _PartlyFrozen, _IMG, 128, "sgd"),
    ("einsum + FFT", _Spectral, _IMG, 64, "adam"),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto", help="auto (CUDA if any), cpu or cuda")
    p.add_argument("-n", type=int, default=20, help="calibration configurations (default 20)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = p.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)
    shipped = ca.CostModel.default()
    with tempfile.TemporaryDirectory() as tmp:
        store = ObservationStore(f"sqlite:///{Path(tmp) / 'calibration.db'}")
        cal = calibrate(args.device, n=args.n, store=store, record="always", model=shipped)
        print(cal, "\n")
        calibrated = OnlineRefit(store, base=shipped, background=False).refit_now()
        store.close()
    run_on = "cuda" if cal.device != "CPU" else "cpu"
    print(
        "| architecture (not in the corpus) | measured step | shipped model | calibrated |\n"
        "|---|---|---|---|"
    )
    errors: dict[str, list[float]] = {"shipped": [], "calibrated": []}
    t0 = time.perf_counter()
    for name, factory, batch, bs, opt in HELD_OUT:
        spec = ca.TrainingSpec(model=factory, batch=batch, batch_size=bs, optimizer=opt, name=name)
        m = measure(spec, run_on)
        if m.status != "ok" or not m.iteration_time:
            print(f"| {name} | {m.status}: {m.error} | | |")
            continue
        cells = []
        for label, model in (("shipped", shipped), ("calibrated", calibrated)):
            t = model.predict(spec, device=cal.device).iteration_time
            errors[label].append(abs(t / m.iteration_time - 1))
            cells.append(f"{1e3 * t:.1f} ms ({t / m.iteration_time - 1:+.0%})")
        print(f"| {name} | {1e3 * m.iteration_time:.1f} ms | {cells[0]} | {cells[1]} |")
    print(
        f"\nmean relative error over {len(errors['shipped'])} architectures: shipped model "
        f"{100 * statistics.mean(errors['shipped']):.1f}%, calibrated "
        f"{100 * statistics.mean(errors['calibrated']):.1f}% "
        f"(calibration {cal.seconds:.0f} s, held-out measurements "
        f"{time.perf_counter() - t0:.0f} s; the correction was judged "
        f"{'useful' if cal.useful else 'not useful'}, so --record auto would "
        f"{'record' if cal.useful else 'not record'} it)"
    )


if __name__ == "__main__":
    main()
