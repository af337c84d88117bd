"""costaware + Ray Tune quickstart: a Tune run that keeps infeasible trials off the cluster.

A real Ray Tune experiment on a local two-CPU cluster tunes a small CNN on noisy
seven-segment digits drawn with torch (no download, no data set package). Optuna's TPE
proposes configurations through Tune's ``OptunaSearch``;
:class:`~costaware.integrations.ray.CostAwareSearcher` judges each one before Tune creates a
trial and rejects those predicted to break the budget (Optuna sees them as PRUNED and
learns to avoid them). ASHA stops poor trials early, wrapped in
:class:`~costaware.integrations.ray.CostAwareScheduler`, which also records each epoch's
measured time and memory in an ObservationStore and stops a trial whose actual cost breaks
the budget.

Needs: ``pip install 'costaware[ray,optuna]'`` (Optuna proposes the configurations).

Run: ``python examples/ray_tune_quickstart.py`` (``--help`` for options). About a minute.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local demo cluster needs no token

import optuna
import ray
import torch
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search.optuna import OptunaSearch
from torch import nn

import costaware as ca
from costaware.integrations.ray import (
    CostAwareScheduler,
    CostAwareSearcher,
    CostAwareWarning,
    EpochMeter,
)
from costaware.runtime.store import ObservationStore

EPOCHS = 3
TRAIN_SIZE = 1400


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


def spec_fn(cfg: dict[str, Any]) -> ca.TrainingSpec:
    """The training configuration a Tune config describes, for costaware."""
    return ca.TrainingSpec(
        model=functools.partial(DigitsCNN, cfg["width"], cfg["hidden"]),
        batch=ca.ImageBatch((1, 8, 8), classes=10),
        batch_size=cfg["batch_size"],
        optimizer="adam",
        optimizer_kwargs={"lr": cfg["lr"]},
        dataset_size=TRAIN_SIZE,
        epochs=EPOCHS,
        name=f"cnn-w{cfg['width']}-h{cfg['hidden']}",
    )


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


def train_digits(cfg: dict[str, Any]) -> None:
    """The Tune trainable: trains for real and reports accuracy plus the measured cost."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y = synthetic_digits()
    train, val = torch.arange(TRAIN_SIZE), torch.arange(TRAIN_SIZE, len(x))
    meter = EpochMeter("cpu")  # before the model is built: its memory counts
    model = DigitsCNN(cfg["width"], cfg["hidden"])
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    bs = cfg["batch_size"]
    for epoch in range(EPOCHS):
        model.train()
        with meter:
            perm = train[torch.randperm(len(train))]
            for i in range(0, len(perm), bs):
                idx = perm[i : i + bs]
                loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
                meter.step()  # on a CPU, memory is profiled over the first two steps
        model.eval()
        with torch.no_grad():
            acc = (model(x[val]).argmax(1) == y[val]).float().mean().item()
        tune.report({"val_acc": acc, "epoch": epoch, **meter.metrics()})


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--samples", type=int, default=10, help="trials to run (default 10)")
    parser.add_argument("--max-memory", default="160MiB", help="memory budget (default 160MiB)")
    parser.add_argument("--max-epoch-time", default="3s", help="epoch-time budget (default 3s)")
    parser.add_argument("--workdir", default=None, help="results and store (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("ray").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=CostAwareWarning)  # reasons are printed below
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="costaware-ray-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    store = ObservationStore(workdir / "costaware.db")
    budget = ca.Budget(max_memory=args.max_memory, max_epoch_time=args.max_epoch_time)
    print(
        f"costaware + Ray Tune: {args.samples} trials, budget: memory {args.max_memory}, "
        f"epoch time {args.max_epoch_time}, device CPU\nstore {store.url}"
    )

    searcher = CostAwareSearcher(
        OptunaSearch(seed=args.seed),
        spec_fn=spec_fn,
        budget=budget,
        device="cpu",
        store=store,
        study="digits",
        refit_every=None,
    )
    scheduler = CostAwareScheduler(
        ASHAScheduler(max_t=EPOCHS, grace_period=1, reduction_factor=2),
        budget=budget,
        device="cpu",
        store=store,
        study="digits",
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    t0 = time.perf_counter()
    try:
        tuner = tune.Tuner(
            tune.with_resources(train_digits, {"cpu": 1}),
            param_space={
                "width": tune.choice([8, 32, 128, 256]),
                "hidden": tune.choice([64, 256, 1024]),
                "batch_size": tune.choice([16, 64, 256]),
                "lr": tune.loguniform(1e-4, 3e-2),
            },
            tune_config=tune.TuneConfig(
                metric="val_acc",
                mode="max",
                num_samples=args.samples,
                search_alg=searcher,
                scheduler=scheduler,
            ),
            run_config=tune.RunConfig(name="digits", storage_path=str(workdir), verbose=0),
        )
        results = tuner.fit()
    finally:
        ray.shutdown()
    elapsed = time.perf_counter() - t0

    print(f"\n{'trial':<18}{'width hidden batch':>20}  {'epochs':>6}  {'val_acc':>7}  outcome")
    for r in sorted(results, key=lambda r: r.metrics.get("trial_id", "")):
        c, m = r.config, r.metrics
        tid = m.get("trial_id", "?")
        outcome = "stopped: over budget" if tid in scheduler.stopped else "ok"
        print(
            f"{tid:<18}{c['width']:>6} {c['hidden']:>6} {c['batch_size']:>6}  "
            f"{m.get('training_iteration', 0):>6}  {m.get('val_acc', float('nan')):>7.3f}  {outcome}"
        )
    print(
        f"\n{len(results)} trials ran in {elapsed:.0f} s; {len(searcher.rejections)} suggestions "
        f"were rejected before they ran, {len(scheduler.stopped)} trials stopped for breaking "
        "the budget."
    )
    if searcher.rejections:
        print(
            "Rejected before they ran (the check uses the predicted memory upper bound and "
            "the predicted epoch time):"
        )
        for rej in searcher.rejections:
            c = rej["config"]
            print(
                f"  w{c['width']} h{c['hidden']} bs{c['batch_size']}: " + "; ".join(rej["reasons"])
            )
    if scheduler.stopped:
        print("Stopped while running (measured):")
        for tid, stop in scheduler.stopped.items():
            print(f"  {tid} epoch {stop['epoch']}: " + "; ".join(stop["reasons"]))
    pruned = sum(
        t.state == optuna.trial.TrialState.PRUNED for t in searcher.searcher._ot_study.trials
    )
    print(f"Optuna's study holds {pruned} PRUNED trials: TPE learnt from every rejection.")
    print(
        f"store: {len(store.predictions(study='digits'))} predictions, "
        f"{len(store.measurements(study='digits'))} epoch measurements"
    )
    best = results.get_best_result()
    print(f"best: val_acc {best.metrics['val_acc']:.3f} with {best.config}")


if __name__ == "__main__":
    main()
