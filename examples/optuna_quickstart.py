"""costaware quickstart: an Optuna study that stops crashing into its budget.

A real Optuna study (TPE) tunes a small Lightning CNN on noisy seven-segment digits drawn
with torch (no download, no data set package), on the CPU. Part of the search space does not fit the budget: some
configurations need more memory than allowed, others take longer per epoch. costaware's
pruner judges every trial before it is built, the Lightning callback records what each
admitted trial really cost (and stops one that breaks the budget anyway), and the cost
model refits on those measurements every few trials. The shipped CPU model was fitted on
one 2-core machine and calibrated on architecture families it never saw (so its time
bound is about 3x its prediction); on yours it is off at first, and the refit pulls it in
and, once it has a few trials to calibrate on, tightens the bound.

Needs: ``pip install 'costaware[optuna,lightning]'`` (and nothing else).

Run: ``python examples/optuna_quickstart.py`` (``--help`` for options). About a minute (two on a busy machine).
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import optuna
import torch
from rich import box
from rich.console import Console
from rich.table import Table
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import costaware as ca
from costaware.integrations.lightning import CostAwareCallback
from costaware.integrations.optuna import CostAwarePruner
from costaware.runtime.store import ObservationStore


class DigitsCNN(nn.Module):
    """Two conv layers and a classifier head, for 1x8x8 digit images."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.ReLU(),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(width * 64, hidden), nn.ReLU(), nn.Linear(hidden, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class LitDigits(pl.LightningModule):
    def __init__(self, width: int, hidden: int, lr: float) -> None:
        super().__init__()
        self.net = DigitsCNN(width, hidden)
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(1) == y).float().mean(), prog_bar=False)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


#: the strokes of a seven-segment display on a 7x5 grid, as (rows, columns)
_SEGMENTS = {
    "a": (slice(0, 1), slice(0, 5)), "b": (slice(0, 4), slice(4, 5)),
    "c": (slice(3, 7), slice(4, 5)), "d": (slice(6, 7), slice(0, 5)),
    "e": (slice(3, 7), slice(0, 1)), "f": (slice(0, 4), slice(0, 1)),
    "g": (slice(3, 4), slice(0, 5)),
}  # fmt: skip
#: the segments lit for each digit, 0 to 9
_DIGITS = ("abcdef", "bc", "abdeg", "abcdg", "bcfg", "acdfg", "acdefg", "abc", "abcdefg", "abcdfg")


def synthetic_digits(n: int = 1797, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` noisy 1x8x8 images of seven-segment digits and their labels (0-9), drawn
    with torch alone: each digit at a random place, its strokes of uneven ink, under
    Gaussian noise. Hard enough that the hyperparameters matter (a good CNN reaches
    about 95% in two epochs, a poor learning rate stays near chance)."""
    g = torch.Generator().manual_seed(seed)
    glyphs = torch.zeros(10, 7, 5)
    for digit, segments in enumerate(_DIGITS):
        for s in segments:
            glyphs[digit][_SEGMENTS[s]] = 1.0
    y = torch.randint(0, 10, (n,), generator=g)
    ink = glyphs[y] * (0.6 + 0.4 * torch.rand(n, 7, 5, generator=g))
    x = torch.zeros(n, 8, 8)
    rows = torch.randint(0, 2, (n,), generator=g).tolist()
    cols = torch.randint(0, 4, (n,), generator=g).tolist()
    for i, (r, c) in enumerate(zip(rows, cols)):
        x[i, r : r + 7, c : c + 5] = ink[i]
    x = x + 0.2 * torch.randn(n, 8, 8, generator=g)
    return x.unsqueeze(1), y


def digits() -> tuple[TensorDataset, TensorDataset]:
    x, y = synthetic_digits()
    return TensorDataset(x[:1400], y[:1400]), TensorDataset(x[1400:], y[1400:])


def spec_fn(params: dict[str, Any]) -> ca.TrainingSpec:
    """The training configuration a trial's parameters describe, for costaware."""
    return ca.TrainingSpec(
        model=functools.partial(DigitsCNN, params["width"], params["hidden"]),
        batch=ca.ImageBatch((1, 8, 8), classes=10),
        batch_size=params["batch_size"],
        optimizer="adam",
        optimizer_kwargs={"lr": params["lr"]},
        dataset_size=1400,
        epochs=EPOCHS,
        name=f"cnn-w{params['width']}-h{params['hidden']}",
    )


EPOCHS = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30, help="number of trials (default 30)")
    parser.add_argument("--max-memory", default="160MiB", help="memory budget (default 160MiB)")
    parser.add_argument("--max-epoch-time", default="3s", help="epoch-time budget (default 3s)")
    parser.add_argument(
        "--workdir", default=None, help="where the study and store live (default: a temp dir)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    # one thread: on a shared machine, two threads on two busy cores slow small steps
    # down many times over (each waits for the other), and the timings stop meaning much
    torch.set_num_threads(1)
    # Lightning's per-run banners; both package names, since either may own the logger
    for name in ("lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=UserWarning, module="lightning")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    console = Console()

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="costaware-quickstart-"))
    workdir.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{workdir / 'hpo.db'}"
    store = ObservationStore(workdir / "costaware.db")
    budget = ca.Budget(max_memory=args.max_memory, max_epoch_time=args.max_epoch_time)
    pruner = CostAwarePruner(
        spec_fn=spec_fn, budget=budget, device="cpu", store=store, refit_every=3
    )
    study = optuna.create_study(
        study_name="digits",
        storage=storage,
        direction="maximize",
        pruner=pruner,
        sampler=optuna.samplers.TPESampler(seed=args.seed, n_startup_trials=8),
        load_if_exists=True,
    )
    train, val = digits()
    console.print(
        f"[bold]costaware quickstart[/bold]: {args.trials} trials, budget: memory {args.max_memory}, "
        f"epoch time {args.max_epoch_time}, device CPU\nstudy {storage}\nstore {store.url}\n"
    )

    def objective(trial: optuna.Trial) -> float:
        params = {
            "width": trial.suggest_categorical("width", [8, 32, 128, 256]),
            "hidden": trial.suggest_categorical("hidden", [64, 256, 1024]),
            "batch_size": trial.suggest_categorical("batch_size", [16, 64, 256]),
            "lr": trial.suggest_float("lr", 1e-4, 3e-2, log=True),
        }
        if trial.should_prune():  # costaware decides here, before anything is built
            raise optuna.TrialPruned(trial_reason(trial))
        torch.manual_seed(trial.number)
        model = LitDigits(params["width"], params["hidden"], params["lr"])
        callback = CostAwareCallback(
            store=store, budget=budget, enforce=True, trial=trial, device="cpu"
        )
        trainer = pl.Trainer(
            max_epochs=EPOCHS,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[callback],
        )
        trainer.fit(
            model,
            DataLoader(train, batch_size=params["batch_size"], shuffle=True),
            DataLoader(val, batch_size=256),
        )
        return float(trainer.callback_metrics["val_acc"])

    def trial_reason(trial: optuna.Trial) -> str:
        attrs = study._storage.get_trial_user_attrs(trial._trial_id)
        return "; ".join(attrs.get("costaware:reasons", [])) or "rejected by costaware"

    t0 = time.perf_counter()
    study.optimize(objective, n_trials=args.trials)
    elapsed = time.perf_counter() - t0
    report(console, study, store, pruner, elapsed)
    console.print(
        f"\nthe whole report: costaware report --storage {storage} --study digits "
        f"--store {store.url} --html report.html",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _fmt_mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f}"


def report(
    console: Console,
    study: optuna.Study,
    store: ObservationStore,
    pruner: CostAwarePruner,
    elapsed: float,
) -> None:
    """Print each trial's outcome, what was predicted and measured, and the rejections."""
    by_trial: dict[str, list[dict[str, Any]]] = {}
    for m in store.measurements(study="digits"):
        if m["status"] in ("ok", "stopped"):
            by_trial.setdefault(m["trial"], []).append(m["actual"])
    table = Table(
        title="Trials: epoch time and peak memory, predicted / measured",
        box=box.SIMPLE_HEAD,
    )
    for col in (
        "#",
        "width hidden batch",
        "outcome",
        "epoch (s)",
        "peak (MiB)",
        "model",
    ):  # model: shipped, or refit on N trials
        table.add_column(
            col, justify="left" if col in ("width hidden batch", "outcome", "model") else "right"
        )
    rejections: list[str] = []
    stops: list[str] = []
    # (trial, measured epoch s, predicted epoch s, measured peak, predicted peak), as the
    # study predicted them: by the shipped model, or the refit one once there was one
    scored: list[tuple[optuna.trial.FrozenTrial, float, float, float | None, float | None]] = []
    for t in study.trials:
        a, p = t.user_attrs, t.params
        actual = by_trial.get(str(t.number), [])
        m_epoch = statistics.median(x["epoch_time"] for x in actual) if actual else None
        m_peak = max((x.get("peak_memory") or 0 for x in actual), default=None)
        pred_epoch = a.get("costaware:epoch_time")
        if t.state == optuna.trial.TrialState.PRUNED and not actual:
            outcome = "[red]rejected[/red]"
            rejections.append(f"  #{t.number}: " + "; ".join(a.get("costaware:reasons", [])))
        elif t.state == optuna.trial.TrialState.PRUNED:
            outcome = "[yellow]stopped[/yellow]"
            stops.append(f"  #{t.number}: {a.get('costaware_stopped', 'over budget')}")
        else:
            outcome = f"[green]acc {t.value:.3f}[/green]" if t.value is not None else t.state.name
        if m_epoch and pred_epoch:
            scored.append((t, m_epoch, pred_epoch, m_peak, a.get("costaware:peak_memory")))
        table.add_row(
            str(t.number),
            f"{p['width']:>3} {p['hidden']:>4} {p['batch_size']:>3}",
            outcome,
            f"{_fmt_s(pred_epoch)} / {_fmt_s(m_epoch)}",
            f"{_fmt_mib(a.get('costaware:peak_memory'))} / {_fmt_mib(m_peak)}",
            f"refit {a['costaware:refit_rows']}" if a.get("costaware:refit_rows") else "shipped",
        )
    console.print(table)
    done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    console.print(
        f"{len(study.trials)} trials in {elapsed:.0f} s: {done} completed, {len(rejections)} rejected "
        f"before they ran, {len(stops)} stopped by the callback for breaking the budget."
    )
    if rejections:
        console.print(
            "[bold]Rejected before they ran[/bold] (the budget check uses the memory upper "
            "bound and the predicted epoch time):"
        )
        for line in rejections:
            console.print(line, markup=False, highlight=False)
    if stops:
        console.print("[bold]Stopped while running[/bold]:")
        for line in stops:
            console.print(line, markup=False, highlight=False)
    if scored:
        _print_errors(console, scored)
    refit = pruner.refit
    if refit is not None and refit.history:
        rows = ", ".join(str(h["rows"]) for h in refit.history)
        console.print(f"online refits: {len(refit.history)}, on {rows} measured trials")
    if done:
        console.print(f"best: acc {study.best_value:.3f} with {study.best_trial.params}")


def _print_errors(
    console: Console,
    scored: list[tuple[optuna.trial.FrozenTrial, float, float, float | None, float | None]],
) -> None:
    """Mean prediction error over the measured trials: as the study predicted them, and as
    the shipped model alone predicts the same trials (so the two are compared like for like)."""
    shipped = ca.CostModel.default()
    rel: dict[str, list[float]] = {"time": [], "time0": [], "mem": [], "mem0": []}
    for t, m_epoch, pred_epoch, m_peak, pred_peak in scored:
        p0 = shipped.predict(spec_fn(t.params), device="cpu")
        rel["time"].append(abs(pred_epoch - m_epoch) / m_epoch)
        rel["time0"].append(abs((p0.epoch_time or math.nan) - m_epoch) / m_epoch)
        if m_peak and pred_peak:
            rel["mem"].append(abs(pred_peak - m_peak) / m_peak)
            rel["mem0"].append(abs(p0.peak_memory - m_peak) / m_peak)
    console.print(
        f"prediction error over the {len(scored)} measured trials (mean; as the study "
        "predicted them, with the online refits / by the shipped model alone):"
    )
    console.print(
        f"  epoch time  {statistics.fmean(rel['time']):.0%} / {statistics.fmean(rel['time0']):.0%}"
    )
    if rel["mem"]:
        console.print(
            f"  peak memory {statistics.fmean(rel['mem']):.0%} / {statistics.fmean(rel['mem0']):.0%}"
            f" (over {len(rel['mem'])} trials with a measured peak: the CPU allocator's)"
        )


def _fmt_s(s: float | None) -> str:
    return "-" if s is None else f"{s:.2f}"


if __name__ == "__main__":
    main()
