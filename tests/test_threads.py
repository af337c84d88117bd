"""Measurement from several threads of one process: Optuna's ``n_jobs``, plain threads.

Each scenario runs in a fresh interpreter: a crash there (a segfault in torch's profiler)
is an exit status here, not the end of the test run. The child writes a line to its
stderr as its last act, so that a file descriptor 2 left pointing elsewhere shows too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from costaware.measure.profile import ALLOCATOR_METHOD

ALIVE = "costaware-test: stderr still reaches the parent"

# two threads, each measuring the CPU allocator's peak over a few training steps of its own
# model, several times; the peak each thread measures must be the one it measures alone
_PLAIN_THREADS = r"""
import json, os, sys, threading
import torch
from costaware.measure.profile import AllocatorPeak

torch.set_num_threads(1)

def make(width):
    torch.manual_seed(width)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
    )
    opt = torch.optim.Adam(model.parameters())
    def steps():
        for _ in range(3):
            loss = model(torch.randn(32, 64)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    steps()  # the optimizer's state exists: every later window measures the same steps
    return steps

def peak(steps):
    with AllocatorPeak() as p:
        steps()
    return p.peak, p.why

widths = (256, 1024)
alone = {w: peak(make(w)) for w in widths}
seen = {w: [] for w in widths}

def work(width):
    steps = make(width)
    for _ in range(6):
        seen[width].append(peak(steps))

threads = [threading.Thread(target=work, args=(w,)) for w in widths]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"alone": {str(w): alone[w] for w in widths},
                  "threads": {str(w): seen[w] for w in widths}}))
sys.stdout.flush()
sys.stderr.write(sys.argv[1] + "\n")
sys.stderr.flush()
"""

# a real Optuna study on SQLite, two trials at once, each a real Lightning Trainer with the
# real callback writing to a costaware store
_OPTUNA_LIGHTNING = r"""
import json, sys, warnings
import optuna
import torch
from torch.utils.data import DataLoader, TensorDataset

namespace, workdir, alive = sys.argv[1], sys.argv[2], sys.argv[3]
if namespace == "lightning":
    import lightning.pytorch as ns
    from costaware.integrations.lightning import CostAwareCallback as Callback
else:
    import pytorch_lightning as ns
    from costaware.integrations.lightning import PLCostAwareCallback as Callback

warnings.filterwarnings("ignore")
optuna.logging.set_verbosity(optuna.logging.WARNING)
torch.set_num_threads(1)


class Regressor(ns.LightningModule):
    def __init__(self, width):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


callbacks = {}


def fit(width, seed, trial=None):
    g = torch.Generator().manual_seed(seed)
    data = DataLoader(
        TensorDataset(torch.randn(48, 16, generator=g), torch.randn(48, 1, generator=g)),
        batch_size=8,
    )
    cb = Callback(store=f"sqlite:///{workdir}/costaware.db", trial=trial)
    trainer = ns.Trainer(
        accelerator="cpu", max_epochs=2, limit_train_batches=4, callbacks=[cb],
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0,
    )
    trainer.fit(Regressor(width), data)
    return cb


def objective(trial):
    width = trial.suggest_categorical("width", [64, 256])
    callbacks[trial.number] = (width, fit(width, trial.number, trial))
    return float(width)


# each width trained alone first, in this thread: the peak a trial has to itself
alone = {w: fit(w, 0).measurements[-1]["actual"]["peak_memory"] for w in (64, 256)}
study = optuna.create_study(
    study_name="threads", storage=f"sqlite:///{workdir}/optuna.db"
)
study.optimize(objective, n_trials=int(sys.argv[4]), n_jobs=2)
rows = {
    n: [
        {"width": width} | {k: m["actual"].get(k) for k in ("peak_memory", "memory_method", "steps")}
        for m in cb.measurements
    ]
    for n, (width, cb) in callbacks.items()
}
states = [t.state.name for t in study.trials]
print(json.dumps({"states": states, "rows": rows, "alone": alone}))
sys.stdout.flush()
sys.stderr.write(alive + "\n")
sys.stderr.flush()
"""


# where torch has no thread-local profiler, kineto measures, one thread at a time: a second
# thread that asks while the first one profiles records why it has no peak, and no crash
_KINETO_ONE_AT_A_TIME = r"""
import json, sys, threading
import torch
import costaware.measure.profile as profile

profile._thread_profiler = lambda: None  # as on a torch without it
first_started, second_tried, first_done = (threading.Event() for _ in range(3))
out = {}

def first():
    with profile.AllocatorPeak() as p:
        first_started.set()
        second_tried.wait()
        x = torch.empty(2**20, dtype=torch.uint8)
    out["first"] = [p.profiler, p.peak, p.why]
    first_done.set()

def second():
    first_started.wait()
    with profile.AllocatorPeak() as p:
        second_tried.set()
        x = torch.empty(2**20, dtype=torch.uint8)
    out["second"] = [p.profiler, p.peak, p.why]
    first_done.wait()
    with profile.AllocatorPeak() as p:  # the first has ended: kineto is free again
        x = torch.empty(2**20, dtype=torch.uint8)
    out["after"] = [p.profiler, p.peak, p.why]

threads = [threading.Thread(target=first), threading.Thread(target=second)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(out))
sys.stdout.flush()
sys.stderr.write(sys.argv[1] + "\n")
sys.stderr.flush()
"""


def _run(code: str, *args: str, timeout: float = 240) -> tuple[dict[str, Any], str]:
    """Run ``code`` in a fresh interpreter; its JSON result and its stderr. The child must
    exit 0 (a segfault is -11 here) and its stderr must end with :data:`ALIVE`."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    tail = out.stderr[-3000:]
    assert out.returncode == 0, f"exit status {out.returncode}; stderr:\n{tail}"
    assert out.stderr.rstrip().endswith(ALIVE), f"stderr lost its end:\n{tail}"
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_two_threads_measure_the_cpu_allocator_peak_at_once() -> None:
    result, _ = _run(_PLAIN_THREADS, ALIVE)
    for width, alone in result["alone"].items():
        assert alone[0] is not None and alone[0] > 0, alone
        # each thread's peak is its own steps' alone, however the two interleave
        assert result["threads"][width] == [alone] * 6, (width, result)


def test_without_a_thread_local_profiler_kineto_measures_one_thread_at_a_time() -> None:
    result, _ = _run(_KINETO_ONE_AT_A_TIME, ALIVE)
    assert result["first"] == ["kineto", 2**20, None]
    profiler, peak, why = result["second"]
    assert profiler is None and peak is None and "another thread" in why
    assert result["after"] == ["kineto", 2**20, None]


@pytest.mark.slow
@pytest.mark.parametrize("namespace", ["lightning", "pytorch_lightning"])
def test_optuna_n_jobs_2_with_the_lightning_callback_on_a_cpu(
    namespace: str, tmp_path: Path
) -> None:
    n_trials = 4 if namespace == "lightning" else 2  # the second namespace: a lighter check
    result, _ = _run(_OPTUNA_LIGHTNING, namespace, str(tmp_path), ALIVE, str(n_trials))
    assert result["states"] == ["COMPLETE"] * n_trials
    assert len(result["rows"]) == n_trials
    alone = {int(w): peak for w, peak in result["alone"].items()}
    for rows in result["rows"].values():
        assert [r["steps"] for r in rows] == [4, 4]
        for r in rows:
            # every trial's peak is its own thread's allocator peak, measured while the
            # other trial trained: the same as its width's trained alone
            assert r["memory_method"].startswith(ALLOCATOR_METHOD), r
            assert "thread-local" in r["memory_method"], r
            assert r["peak_memory"] == alone[r["width"]] > 0, (r, alone)
