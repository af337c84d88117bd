"""The GPU mode of ``benchmarks/hpo.py``: the same arms, trials of a realistic length,
real CUDA out-of-memory errors.

Each task is one Optuna study per seed and arm; every trial trains a real model with
Lightning on the GPU, in this process (as a user's study runs its trials):

- ``lm``: a GPT decoder (``costaware.zoo.gpt``, the corpus's GPT family) on a synthetic
  language (each token follows from the two before it, or is noise), validation
  next-token accuracy maximised;
- ``vision``: a ResNet (``costaware.zoo.resnet``, the corpus's ResNet family) on synthetic
  images (a class's template under noise, generated on the device), validation accuracy
  maximised.

The memory budget is a smaller card: ``torch.cuda.set_per_process_memory_fraction`` caps
the caching allocator at the card's memory less this process's CUDA context (NVML's used
memory less torch's reserved, measured at the start), so a trial over it raises
``torch.OutOfMemoryError`` for real, and costaware's ``Budget(max_memory=<card>)`` (which
adds the context) judges the same limit. The epoch-time budget and the trial length are
set at the start from a reference configuration's measured speed (``--trial-seconds``).

Arms: ``baseline`` (plain TPE; OOM and over-time trials end as FAIL through ``catch=``),
``baseline-pruned`` (they end as PRUNED), ``costaware`` (``CostAwarePruner`` with the
shipped model, a store and its online refit, and ``CostAwareCallback(enforce=True)`` in
every trial), ``oracle`` (skips what the ground truth says is infeasible) and
``batch-size-finder`` (Lightning's ``BatchSizeFinder(mode="power")`` in every trial,
starting from the suggested batch size: what Lightning users do about OOM today; it
trains at the largest power-of-two multiple of the suggested size that fits, or at the
suggested size halved until one fits).

Resumable: every finished trial is one line of ``--results`` (JSONL), written as soon as
it ends. A rerun with the same file skips what is there, rebuilds each unfinished study
from its lines (``study.add_trial``) and continues it; ``--minutes`` stops cleanly between
trials. Trials of the baselines and the oracle with exactly the same parameters in the same
task are run once and replayed (their measured compute charged again): the same seed
proposes the same start-up trials to every arm, and GPU time is scarce.

On a machine without a GPU (``--device cpu``, for tests) there is no allocator to cap: a
trial whose parameters, gradients, optimizer state and activations (a rough count,
:meth:`Task.cpu_footprint`) exceed the cap raises a simulated ``CUDA out of memory``
error at its first batch, so every arm's OOM path runs.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import gc
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

GPU_ARMS = ("baseline", "baseline-pruned", "costaware", "oracle", "batch-size-finder")
#: per seed: the baselines fill the ground truth first; the replayed arms follow them
GPU_RUN_ORDER = ("baseline", "baseline-pruned", "oracle", "costaware", "batch-size-finder")
#: arms whose trials are the same training run, so equal parameters are replayed
REPLAYED = ("baseline", "baseline-pruned", "oracle")
EPOCHS = 2
LR_RANGE = (1e-4, 1e-1)
WASTE = ("oom", "crash", "timeout", "stopped")
GiB = 2**30
MiB = 2**20
SCHEMA = 1


# --------------------------------------------------------------------------------------
# tasks
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Task:
    """One benchmark task: its search space, model, data and reference configuration."""

    name: str
    space: dict[str, list[Any]]
    reference: dict[str, Any]
    val_size: int
    vocab: int = 8192  # the language model's vocabulary

    @property
    def cost_keys(self) -> tuple[str, ...]:
        return tuple(self.space)  # memory and time do not depend on the learning rate

    def key(self, params: dict[str, Any]) -> str:
        return json.dumps({k: params[k] for k in self.cost_keys}, sort_keys=True)

    def build_model(self, params: dict[str, Any]) -> Any:
        return model_factory(self, params)()

    def spec(self, params: dict[str, Any], dataset_size: int) -> Any:
        """The costaware TrainingSpec of a trial: the model, batch and optimizer it runs."""
        import costaware as ca

        kwargs: dict[str, Any] = {"lr": params["lr"]}
        if params["optimizer"] == "sgd":
            kwargs["momentum"] = 0.9
        if self.name == "lm":
            batch: Any = ca.TokenBatch(params["seq_len"], self.vocab)
            label = f"gpt-w{params['width']}-d{params['depth']}"
        else:
            size = params["image_size"]
            batch = ca.ImageBatch((3, size, size), classes=VISION_CLASSES)
            label = f"resnet{params['depth']}-w{params['width']}"
        return ca.TrainingSpec(
            model=model_factory(self, params),
            batch=batch,
            batch_size=params["batch_size"],
            optimizer=params["optimizer"],
            optimizer_kwargs=kwargs,
            precision=params["precision"],
            dataset_size=dataset_size,
            epochs=EPOCHS,
            name=label,
        )

    def cpu_footprint(self, params: dict[str, Any], batch_size: int) -> int:
        """A rough byte count of a training step (weights, gradients, two optimizer
        states, activations): the stand-in for the allocator's peak on a CPU, where no
        cap can be set. Only for running the GPU mode's code paths without a GPU."""
        w, d = params["width"], params["depth"]
        if self.name == "lm":
            n_params = 12 * d * w * w + self.vocab * w
            acts = batch_size * params["seq_len"] * (16 * d * w + 2 * self.vocab)
        else:
            n_params = 30 * d * w * w
            acts = batch_size * 3 * params["image_size"] ** 2 * (d * w // 16 + 4)
        return 4 * (4 * n_params + acts)


VISION_CLASSES = 10

TASKS: dict[str, Task] = {
    "lm": Task(
        name="lm",
        space={
            "width": [256, 512, 768, 1024],
            "depth": [4, 8, 12],
            "seq_len": [256, 512, 1024, 2048],
            "batch_size": [8, 16, 32, 64],
            "precision": ["bf16", "fp32"],
            "optimizer": ["adamw", "sgd"],
        },
        reference={
            "width": 512,
            "depth": 8,
            "seq_len": 1024,
            "batch_size": 16,
            "precision": "bf16",
            "optimizer": "adamw",
            "lr": 1e-3,
        },
        val_size=256,
    ),
    "vision": Task(
        name="vision",
        space={
            "width": [32, 64, 96, 128],
            "depth": [18, 34, 50],
            "image_size": [64, 128, 224],
            "batch_size": [64, 128, 256, 512],
            "precision": ["bf16", "fp32"],
            "optimizer": ["adamw", "sgd"],
        },
        reference={
            "width": 64,
            "depth": 34,
            "image_size": 128,
            "batch_size": 128,
            "precision": "bf16",
            "optimizer": "adamw",
            "lr": 1e-3,
        },
        val_size=1024,
    ),
}

#: a tiny space for running the GPU mode's code on a CPU in seconds (``--tiny``)
TINY_TASKS: dict[str, Task] = {
    "lm": Task(
        name="lm",
        space={
            "width": [32, 64],
            "depth": [1, 2],
            "seq_len": [16, 64],
            "batch_size": [4, 16],
            "precision": ["fp32"],
            "optimizer": ["adamw", "sgd"],
        },
        reference={
            "width": 32,
            "depth": 1,
            "seq_len": 16,
            "batch_size": 4,
            "precision": "fp32",
            "optimizer": "adamw",
            "lr": 1e-3,
        },
        val_size=16,
        vocab=16,
    ),
    "vision": Task(
        name="vision",
        space={
            "width": [8, 16],
            "depth": [18],
            "image_size": [16, 32],
            "batch_size": [4, 16],
            "precision": ["fp32"],
            "optimizer": ["adamw", "sgd"],
        },
        reference={
            "width": 8,
            "depth": 18,
            "image_size": 16,
            "batch_size": 4,
            "precision": "fp32",
            "optimizer": "adamw",
            "lr": 1e-3,
        },
        val_size=16,
    ),
}


def model_factory(task: Task, params: dict[str, Any]) -> Callable[[], Any]:
    """A zero-argument model factory (module-level functions: costaware fingerprints it)."""
    from costaware import zoo

    if task.name == "lm":
        return functools.partial(
            zoo.gpt,
            vocab=task.vocab,
            seq_len=params["seq_len"],
            dim=params["width"],
            depth=params["depth"],
            heads=max(1, params["width"] // 64),
        )
    return functools.partial(
        zoo.resnet, depth=params["depth"], width=params["width"], classes=VISION_CLASSES
    )


def lm_tokens(n: int, length: int, seed: int, vocab: int) -> Any:
    """``n`` sequences of ``length`` tokens of a synthetic language: each token is a fixed
    function of the two before it, except one in four, which is drawn at random. A model
    learns the table from the data; more capacity and more steps learn more of it."""
    import torch

    g = torch.Generator().manual_seed(1234)  # the language is the same in every trial
    table = torch.randint(0, vocab, (vocab * 8,), generator=g)
    g.manual_seed(seed)
    out = torch.empty(n, length, dtype=torch.long)
    out[:, :2] = torch.randint(0, vocab, (n, 2), generator=g)
    noise = torch.rand(n, length, generator=g) < 0.25
    rand = torch.randint(0, vocab, (n, length), generator=g)
    for t in range(2, length):
        nxt = table[(out[:, t - 2] * 7 + out[:, t - 1]) % table.numel()]
        out[:, t] = torch.where(noise[:, t], rand[:, t], nxt)
    return out


def vision_templates(size: int) -> Any:
    """One template per class: coarse random patterns, the same in every trial."""
    import torch

    g = torch.Generator().manual_seed(4321)
    coarse = torch.randn(VISION_CLASSES, 3, 8, 8, generator=g)
    return torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear")


# --------------------------------------------------------------------------------------
# one trial, in this process
# --------------------------------------------------------------------------------------
def _lightning() -> Any:
    import lightning.pytorch as pl

    return pl


def make_module(
    task: Task, params: dict[str, Any], dataset_size: int, simulated_cap: int | None = None
) -> Any:
    """The LightningModule of a trial. Its dataloaders read ``self.batch_size`` (as
    Lightning's BatchSizeFinder requires), and its loss is costaware's default loss on
    the batch the spec describes, so the step run is the step predicted.

    ``simulated_cap`` (a CPU only): a training step whose :meth:`Task.cpu_footprint` is
    over it raises a simulated CUDA out-of-memory error. It is checked in the module, not
    in a callback, because Lightning's BatchSizeFinder removes the callbacks while it
    searches."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from costaware.spec import default_loss

    pl = _lightning()

    class TrialModule(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.params = params
            self.batch_size = params["batch_size"]
            self.net = task.build_model(params)
            if task.name == "lm":
                n = dataset_size + task.val_size
                toks = lm_tokens(n, params["seq_len"] + 1, seed=0, vocab=task.vocab)
                self.train_set = TensorDataset(toks[:dataset_size])
                self.val_set = TensorDataset(toks[dataset_size:])
            else:
                self.register_buffer(
                    "templates", vision_templates(params["image_size"]), persistent=False
                )
                self.train_set = TensorDataset(torch.arange(dataset_size))
                self.val_set = TensorDataset(torch.arange(10**6, 10**6 + task.val_size))

        def _batch(self, batch: Any) -> Any:
            (x,) = batch
            if task.name == "lm":
                return {"input_ids": x[:, :-1], "labels": x[:, 1:]}
            y = (x * 2654435761 % 1000003) % VISION_CLASSES
            g = torch.Generator(device=x.device).manual_seed(int(x[0]))
            noise = torch.randn((len(x), *self.templates.shape[1:]), generator=g, device=x.device)
            return self.templates[y] + 2.0 * noise, y

        def train_dataloader(self) -> Any:
            return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

        def val_dataloader(self) -> Any:
            return DataLoader(self.val_set, batch_size=self.batch_size)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if simulated_cap is not None:
                need = task.cpu_footprint(self.params, len(batch[0]))
                if need > simulated_cap:
                    raise torch.OutOfMemoryError(
                        f"CUDA out of memory (simulated on the CPU: {need / MiB:.1f} MiB "
                        f"needed, cap {simulated_cap / MiB:.1f} MiB)"
                    )
            return default_loss(self.net, self._batch(batch))

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            b = self._batch(batch)
            if task.name == "lm":
                pred = self.net(b["input_ids"]).argmax(-1)
                acc = (pred == b["labels"]).float().mean()
            else:
                x, y = b
                acc = (self.net(x).argmax(1) == y).float().mean()
            self.log("val_acc", acc, batch_size=len(batch[0]))

        def configure_optimizers(self) -> Any:
            p = self.params
            if p["optimizer"] == "sgd":
                return torch.optim.SGD(self.parameters(), lr=p["lr"], momentum=0.9)
            return torch.optim.AdamW(self.parameters(), lr=p["lr"])

    return TrialModule()


def _callbacks() -> Any:
    pl = _lightning()

    class EpochGuard(pl.Callback):  # type: ignore[misc,name-defined]
        """Times each training epoch (its batches; validation excluded) and stops the
        trial at the first batch end past ``max_epoch_time``: the same check in every
        arm. Paused while a BatchSizeFinder searches (its steps are not epochs)."""

        def __init__(self, max_epoch_time: float) -> None:
            self.max_epoch_time = max_epoch_time
            self.epoch_times: list[float] = []
            self.over: float | None = None
            self.paused = False
            self._start: float | None = None
            self._last: float | None = None

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            if not self.paused:
                self._start = self._last = time.perf_counter()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            if self.paused or self._start is None:
                return
            if pl_module.device.type == "cuda":
                import torch

                torch.cuda.synchronize(pl_module.device)
            self._last = time.perf_counter()
            elapsed = self._last - self._start
            if elapsed > self.max_epoch_time:
                import optuna

                self.over = elapsed
                raise optuna.TrialPruned(
                    f"measured epoch time passed {elapsed:.2f} s, over the "
                    f"{self.max_epoch_time:.2f} s budget"
                )

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if not self.paused and self._start is not None and self._last is not None:
                self.epoch_times.append(self._last - self._start)
            self._start = None

    return EpochGuard


def _finder(guard: Any, init_val: int, max_trials: int = 25) -> Any:
    """Lightning's BatchSizeFinder, with the epoch guard paused while it searches."""
    from lightning.pytorch.callbacks import BatchSizeFinder

    class TimedFinder(BatchSizeFinder):  # type: ignore[misc]
        search_s = 0.0

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            guard.paused = True
            t0 = time.perf_counter()
            try:
                super().on_fit_start(trainer, pl_module)
            finally:
                self.search_s = time.perf_counter() - t0
                guard.paused = False

    return TimedFinder(mode="power", init_val=init_val, steps_per_trial=3, max_trials=max_trials)


def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    msg = str(exc).lower()
    return "out of memory" in msg or "can't allocate memory" in msg


def run_trial(
    ctx: Context,
    task: Task,
    params: dict[str, Any],
    *,
    costaware: dict[str, Any] | None = None,
    finder: bool = False,
) -> dict[str, Any]:
    """Train ``params`` in this process; never raises (an error is a result)."""
    import optuna
    import torch

    pl = _lightning()
    EpochGuard = _callbacks()
    cuda = ctx.device == "cuda"
    t0 = time.perf_counter()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        start_allocated = torch.cuda.memory_allocated()
    res: dict[str, Any] = {"status": "ok", "value": None, "error": None}
    guard = EpochGuard(ctx.max_epoch_time[task.name])
    callbacks: list[Any] = [guard]
    bsf = None
    if finder:
        bsf = _finder(guard, params["batch_size"], max_trials=2 if ctx.tiny else 25)
        callbacks.append(bsf)
    ca_cb = None
    if costaware is not None:
        from costaware.integrations.lightning import CostAwareCallback

        ca_cb = CostAwareCallback(enforce=True, **costaware)
        callbacks.append(ca_cb)
    module = trainer = None
    try:
        torch.manual_seed(0)
        module = make_module(task, params, ctx.dataset_size[task.name], None if cuda else ctx.cap)
        trainer = pl.Trainer(
            max_epochs=EPOCHS,
            accelerator="gpu" if cuda else "cpu",
            devices=1,
            precision="bf16-mixed" if params["precision"] == "bf16" else "32-true",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=callbacks,
            default_root_dir=tempfile.gettempdir(),  # the finder's checkpoint goes there
        )
        trainer.fit(module)
        if len(guard.epoch_times) < EPOCHS or "val_acc" not in trainer.callback_metrics:
            res["status"] = "stopped"  # costaware's callback stopped it over budget
            res["error"] = (getattr(ca_cb, "stopped_reason", None) or "stopped early")[:300]
        else:
            res["value"] = float(trainer.callback_metrics["val_acc"])
    except BaseException as e:
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            # Lightning turns an interrupt during fit into sys.exit(1): the window's end
            raise KeyboardInterrupt from e
        if guard.over is not None or isinstance(e, optuna.TrialPruned):
            res["status"] = "timeout" if guard.over is not None else "stopped"
        elif is_oom(e):
            res["status"] = "oom"
        else:
            res["status"] = "error"
            res["traceback"] = traceback.format_exc()[-2000:]
        res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        del e
    finally:
        batch_used = getattr(module, "batch_size", params["batch_size"])
        del module, trainer
        gc.collect()
        if cuda:
            torch.cuda.synchronize()
            res["max_reserved"] = int(torch.cuda.max_memory_reserved())
            res["max_allocated"] = int(torch.cuda.max_memory_allocated())
            res["num_ooms"] = int(torch.cuda.memory_stats().get("num_ooms", 0))
            torch.cuda.empty_cache()
            res["left_allocated"] = int(torch.cuda.memory_allocated()) - start_allocated
    res["epoch_times"] = [*guard.epoch_times, *([guard.over] if guard.over else [])]
    res["batch_size_used"] = batch_used
    if bsf is not None:
        res["finder_s"] = bsf.search_s
    res["compute_s"] = time.perf_counter() - t0
    return res


# --------------------------------------------------------------------------------------
# the run's state: one JSONL file
# --------------------------------------------------------------------------------------
@dataclass
class Context:
    """The run's settings, fixed at its first start and read back on a resume."""

    device: str
    tasks: list[str]
    seeds: list[int]
    trials: int
    startup: int
    card_bytes: int
    cap: int
    context_bytes: int | None
    dataset_size: dict[str, int]
    max_epoch_time: dict[str, float]
    reference_epoch_s: dict[str, float]
    tiny: bool
    epoch_seconds: float = 10.0
    time_factor: float = 3.0
    probe_samples: int = 0
    machine: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


class Results:
    """The JSONL file: a ``setup`` line, then one line per trial, check and finished arm."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[dict[str, Any]] = []  # in the file's order
        if path.is_file():
            text = path.read_text()
            if text and not text.endswith("\n"):  # a line cut off by a kill: dropped
                text = text[: text.rfind("\n") + 1]
                path.write_text(text)
            for raw in text.splitlines():
                if not raw.strip():
                    continue
                try:
                    self.lines.append(json.loads(raw))
                except json.JSONDecodeError:  # a line cut off by a kill: dropped
                    continue

    def append(self, line: dict[str, Any]) -> None:
        self.lines.append(line)
        with open(self.path, "a") as f:
            f.write(json.dumps(line, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def setup(self) -> dict[str, Any] | None:
        """The run's settings, with each task's calibration (``task_setup``) merged in."""
        setup = next((x for x in self.lines if x["kind"] == "setup"), None)
        if setup is None:
            return None
        setup = json.loads(json.dumps(setup))
        for x in self.lines:
            if x["kind"] == "task_setup":
                for k in ("dataset_size", "max_epoch_time", "reference_epoch_s"):
                    setup.setdefault(k, {})[x["task"]] = x[k]
        return setup

    def trials(self, task: str, seed: int, arm: str) -> list[dict[str, Any]]:
        return [
            x
            for x in self.lines
            if x["kind"] == "trial" and x["task"] == task and x["seed"] == seed and x["arm"] == arm
        ]

    def done(self, task: str, seed: int, arm: str) -> dict[str, Any] | None:
        return next(
            (
                x
                for x in self.lines
                if x["kind"] == "arm_done"
                and x["task"] == task
                and x["seed"] == seed
                and x["arm"] == arm
            ),
            None,
        )

    def runs(self, task: str) -> list[dict[str, Any]]:
        """Every real training run of ``task`` (trials that ran and checks), with its key."""
        out = []
        for x in self.lines:
            if x.get("task") != task or x["kind"] not in ("trial", "check"):
                continue
            run = x.get("run")
            if run is not None and not run.get("replayed"):
                out.append(x)
        return out


class Truth:
    """Feasibility per cost key, from every real run of a task (any arm, any lr)."""

    def __init__(self, results: Results, task: Task) -> None:
        self.task = task
        self.runs: dict[str, list[dict[str, Any]]] = {}
        for x in results.runs(task.name):
            self.add(x["params"], x["run"], source=f"{x.get('arm', 'check')}/seed{x['seed']}")

    def add(self, params: dict[str, Any], run: dict[str, Any], *, source: str) -> None:
        if run.get("finder"):
            return  # a BatchSizeFinder trial trained another batch size
        self.runs.setdefault(self.task.key(params), []).append(
            {
                "status": run["status"],
                "source": source,
                "compute_s": run["compute_s"],
                "epoch_times": run.get("epoch_times", []),
                "max_reserved": run.get("max_reserved"),
            }
        )

    def feasible(self, key: str) -> bool | None:
        runs = self.runs.get(key)
        if not runs:
            return None
        return 2 * sum(r["status"] == "ok" for r in runs) >= len(runs)

    def flaky(self) -> tuple[int, int]:
        multi = [r for r in self.runs.values() if len(r) > 1]
        return sum(len({x["status"] == "ok" for x in r}) > 1 for r in multi), len(multi)


# --------------------------------------------------------------------------------------
# the studies
# --------------------------------------------------------------------------------------
def suggest(trial: Any, task: Task) -> dict[str, Any]:
    params = {name: trial.suggest_categorical(name, c) for name, c in task.space.items()}
    params["lr"] = trial.suggest_float("lr", *LR_RANGE, log=True)
    return params


def distributions(task: Task) -> dict[str, Any]:
    import optuna

    d: dict[str, Any] = {
        name: optuna.distributions.CategoricalDistribution(c) for name, c in task.space.items()
    }
    d["lr"] = optuna.distributions.FloatDistribution(*LR_RANGE, log=True)
    return d


class OutOfTime(Exception):
    """The run's --minutes are spent: stop between trials."""


@dataclass
class Runner:
    ctx: Context
    results: Results
    workdir: Path
    deadline: float
    progress: Callable[[str], None] = print
    store_factory: Callable[[str, int], Any] | None = None
    refit_every: int = 5

    stop_after: int | None = None  # trials this invocation may run (tests)
    started: int = 0

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def out_of_time(self, task: Task) -> bool:
        """Whether another trial would not end before the deadline (or --stop-after)."""
        if self.stop_after is not None and self.started >= self.stop_after:
            return True
        return self.time_left() < self.ctx.max_epoch_time[task.name] * EPOCHS + 30

    def replay(self, task: Task, params: dict[str, Any]) -> dict[str, Any] | None:
        """A run of the same parameters by a replayed arm earlier in this task."""
        for x in self.results.lines:
            if (
                x["kind"] == "trial"
                and x["task"] == task.name
                and x["arm"] in REPLAYED
                and x.get("run") is not None
                and not x["run"].get("replayed")
                and x["params"] == params
            ):
                return {**x["run"], "replayed": f"{x['arm']}/seed{x['seed']}#{x['number']}"}
        return None

    def arm(self, task: Task, seed: int, arm: str) -> None:
        """Run (or continue) one arm's study; raises OutOfTime between trials."""
        import optuna

        import costaware as ca

        done = self.results.trials(task.name, seed, arm)
        if self.results.done(task.name, seed, arm) is not None:
            return
        truth = Truth(self.results, task)
        name = f"{task.name}-{arm}-seed{seed}"
        budget = ca.Budget(
            max_memory=self.ctx.card_bytes, max_epoch_time=self.ctx.max_epoch_time[task.name]
        )
        pruner: Any = None
        store: Any = None
        if arm == "costaware":
            from costaware.integrations.optuna import CostAwarePruner
            from costaware.runtime.store import ObservationStore

            db = self.workdir / f"costaware-{task.name}-seed{seed}.db"
            store = ObservationStore(db)
            device = "cpu" if self.ctx.device == "cpu" else "auto"
            pruner = CostAwarePruner(
                spec_fn=functools.partial(_spec_fn, task, self.ctx.dataset_size[task.name]),
                budget=budget,
                device=device,
                store=store,
                model=ca.CostModel.default(),
                refit_every=self.refit_every,
            )
        study = optuna.create_study(
            study_name=name,
            direction="maximize",
            sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=self.ctx.startup),
            pruner=pruner if pruner is not None else optuna.pruners.NopPruner(),
        )
        dists = distributions(task)
        for x in done:  # the trials of an earlier, cut-off run of this study
            rec = x["record"]
            state = {
                "ok": optuna.trial.TrialState.COMPLETE,
                "fail": optuna.trial.TrialState.FAIL,
            }.get(x["optuna_state"], optuna.trial.TrialState.PRUNED)
            study.add_trial(
                optuna.trial.create_trial(
                    params=x["params"],
                    distributions=dists,
                    value=rec["value"] if state == optuna.trial.TrialState.COMPLETE else None,
                    state=state,
                )
            )
        remaining = self.ctx.trials - len(done)

        def objective(trial: optuna.Trial) -> float:
            if self.out_of_time(task):
                raise OutOfTime
            self.started += 1
            params = suggest(trial, task)
            key = task.key(params)
            rec: dict[str, Any] = {
                "number": trial.number,
                "params": params,
                "key": key,
                "status": None,
                "compute_s": 0.0,
                "pred_s": 0.0,
                "value": None,
            }
            line = {
                "kind": "trial",
                "task": task.name,
                "seed": seed,
                "arm": arm,
                "number": trial.number,
                "params": params,
                "record": rec,
                "run": None,
                "optuna_state": "pruned",
            }
            try:
                return self._trial(
                    trial, study, arm, task, seed, params, rec, line, truth, budget, store, pruner
                )
            except KeyboardInterrupt:  # the window's timeout: this trial is not recorded
                line["interrupted"] = True
                raise
            finally:
                if not line.get("interrupted"):
                    self.results.append(line)
                    run = line["run"]
                    if run is not None and not run.get("replayed"):
                        truth.add(params, run, source=f"{arm}/seed{seed}")
                    self.progress(
                        f"{task.name} seed {seed} {arm} #{trial.number}: {rec['status']} "
                        f"{rec['compute_s']:.1f} s"
                        + (f", value {rec['value']:.3f}" if rec["value"] is not None else "")
                    )

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if remaining > 0:
                study.optimize(
                    objective,
                    n_trials=remaining,
                    catch=(RuntimeError, MemoryError),
                    gc_after_trial=True,
                )
        import hpo

        refit = hpo.refit_summary(pruner)
        self.results.append(
            {"kind": "arm_done", "task": task.name, "seed": seed, "arm": arm, "refit": refit}
        )

    def _trial(
        self,
        trial: Any,
        study: Any,
        arm: str,
        task: Task,
        seed: int,
        params: dict[str, Any],
        rec: dict[str, Any],
        line: dict[str, Any],
        truth: Truth,
        budget: Any,
        store: Any,
        pruner: Any,
    ) -> float:
        import optuna

        known = truth.feasible(rec["key"])
        costaware = None
        if arm == "costaware":
            import hpo

            hpo.judge(trial, study, pruner, rec, (*hpo.PREDICTION_KEYS, "min_capacity_upper"))
            costaware = {
                "store": store,
                "trial": trial,
                "budget": budget,
                "spec": task.spec(params, self.ctx.dataset_size[task.name]),
                "device": "cpu" if self.ctx.device == "cpu" else "auto",
            }
        if arm == "oracle" and known is False:
            rec["status"] = "skipped"
            raise optuna.TrialPruned("infeasible (oracle)")
        run = self.replay(task, params) if arm in REPLAYED else None
        if run is None:
            run = run_trial(
                self.ctx, task, params, costaware=costaware, finder=arm == "batch-size-finder"
            )
            if arm == "batch-size-finder":
                run["finder"] = True
        line["run"] = run
        status = run["status"]
        rec["epoch_times"] = run.get("epoch_times", [])
        rec["error"] = run.get("error")
        rec["max_reserved"] = run.get("max_reserved")
        if arm == "oracle" and known is None and status != "ok":
            rec["status"] = "skipped"  # this run only established the ground truth
            rec["probe_s"] = run["compute_s"]
            raise optuna.TrialPruned("infeasible (oracle)")
        rec["status"] = status
        rec["compute_s"] = run["compute_s"]
        if status == "ok":
            rec["value"] = run["value"]
            line["optuna_state"] = "ok"
            return float(run["value"])
        if arm == "baseline" or (arm == "costaware" and status in ("oom", "crash", "error")):
            line["optuna_state"] = "fail"
            raise RuntimeError(run.get("error") or status)  # caught by catch=: FAIL
        raise optuna.TrialPruned(run.get("error") or status)

    def check_rejections(self, task: Task, seed: int) -> None:
        """Run, uncharged, each configuration the costaware arm rejected that nobody ran."""
        truth = Truth(self.results, task)
        for x in self.results.trials(task.name, seed, "costaware"):
            if (
                x["record"]["status"] != "rejected"
                or truth.feasible(x["record"]["key"]) is not None
            ):
                continue
            if self.out_of_time(task):
                raise OutOfTime
            self.started += 1
            run = run_trial(self.ctx, task, x["params"])
            self.results.append(
                {
                    "kind": "check",
                    "task": task.name,
                    "seed": seed,
                    "params": x["params"],
                    "run": run,
                }
            )
            truth.add(x["params"], run, source=f"check/seed{seed}")
            self.progress(f"{task.name} seed {seed} checking a rejection: {run['status']}")


def _spec_fn(task: Task, dataset_size: int, params: dict[str, Any]) -> Any:
    return task.spec(params, dataset_size)


# --------------------------------------------------------------------------------------
# setup: the card, the context, the trial length
# --------------------------------------------------------------------------------------
def context_bytes() -> int | None:
    """What this process holds on the GPU outside the caching allocator once CUDA, cuBLAS
    and cuDNN have started (NVML's used memory less torch's reserved), or None."""
    import torch

    with contextlib.suppress(Exception):
        from costaware.measure.oomprobe import context_memory

        stages = context_memory(torch.device("cuda", 0))
        held = stages.get("after_cudnn")
        before = stages.get("before_cuda") or 0
        if held is not None:
            return int(held) - int(before)
    return None


def measure_reference(ctx: Context, task: Task, dataset_size: int) -> tuple[float, dict[str, Any]]:
    """The reference configuration's epoch time at ``dataset_size`` (no budget)."""
    saved = dict(ctx.max_epoch_time), dict(ctx.dataset_size)
    ctx.max_epoch_time[task.name] = 1e9
    ctx.dataset_size[task.name] = dataset_size
    try:
        res = run_trial(ctx, task, dict(task.reference))
    finally:
        ctx.max_epoch_time, ctx.dataset_size = dict(saved[0]), dict(saved[1])
    if res["status"] != "ok" or not res["epoch_times"]:
        raise RuntimeError(f"the {task.name} reference configuration failed: {res.get('error')}")
    return float(statistics.median(res["epoch_times"])), res


def make_context(args: Any, progress: Callable[[str], None]) -> Context:
    import torch

    cuda = args.device == "cuda"
    card = int(args.card_gib * GiB)
    ctxb = None
    if cuda:
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA GPU is visible (use --device cpu to test)")
        ctxb = context_bytes()
        from costaware.devices import detect_device

        ctx_est = ctxb if ctxb is not None else detect_device().context_overhead_bytes
        cap = card - ctx_est
        total = torch.cuda.get_device_properties(0).total_memory
        if cap >= total:
            raise SystemExit(f"--card-gib {args.card_gib} is not smaller than this GPU")
    else:
        cap = card
    ctx = Context(
        device=args.device,
        tasks=list(args.tasks),
        seeds=list(range(args.seeds)),
        trials=args.trials,
        startup=args.startup,
        card_bytes=card,
        cap=cap,
        context_bytes=ctxb,
        dataset_size={},
        max_epoch_time={},
        reference_epoch_s={},
        tiny=args.tiny,
        epoch_seconds=args.epoch_seconds,
        time_factor=args.time_factor,
        probe_samples=args.probe_samples,
    )
    apply_cap(ctx)
    return ctx


def calibrate(ctx: Context, task: Task) -> dict[str, Any]:
    """Size a task's epoch: the reference configuration's speed over a probe of a few
    samples, then as many samples an epoch as take ``epoch_seconds`` at that speed, and
    ``max_epoch_time`` = ``time_factor`` x that epoch. Run when the task is first
    reached, so that a window spends no time on tasks it will not get to."""
    probe = ctx.probe_samples or (16 if ctx.tiny else 512 if task.name == "lm" else 4096)
    epoch, _ = measure_reference(ctx, task, probe)
    per_sample = epoch / probe
    size = (
        probe
        if ctx.tiny
        else max(2 * task.reference["batch_size"], int(ctx.epoch_seconds / per_sample))
    )
    ref = per_sample * size
    return {
        "kind": "task_setup",
        "task": task.name,
        "probe_samples": probe,
        "probe_epoch_s": round(epoch, 3),
        "dataset_size": size,
        "reference_epoch_s": round(ref, 3),
        "max_epoch_time": round(ctx.time_factor * ref, 2),
    }


def apply_cap(ctx: Context) -> None:
    if ctx.device == "cuda":
        import torch

        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(ctx.cap / total, 0)


def machine(device: str) -> dict[str, Any]:
    import lightning
    import optuna
    import torch

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "lightning": lightning.__version__,
        "optuna": optuna.__version__,
        "platform": platform.platform(),
        "cores": os.cpu_count(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        out["gpu"] = props.name
        out["gpu_memory_gib"] = round(props.total_memory / GiB, 1)
        with contextlib.suppress(Exception):
            import pynvml

            pynvml.nvmlInit()
            out["driver"] = pynvml.nvmlSystemGetDriverVersion()
    with contextlib.suppress(Exception):
        import subprocess

        out["commit"] = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7", "--exclude=*"],
            cwd=HERE.parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    return out


# --------------------------------------------------------------------------------------
# figures and the report (hpo.py's figures, with the finder arm added)
# --------------------------------------------------------------------------------------
def unit_results(results: Results, task: str, seed: int) -> dict[str, dict[str, Any]] | None:
    """One seed's per-arm records in hpo.py's shape, if every arm finished."""
    out = {}
    for arm in GPU_ARMS:
        if results.done(task, seed, arm) is None:
            return None
        out[arm] = {
            "arm": arm,
            "seed": seed,
            "records": [x["record"] for x in results.trials(task, seed, arm)],
            "refit": results.done(task, seed, arm)["refit"],  # type: ignore[index]
        }
    return out


def report(results: Results, tiny: bool = False) -> dict[str, Any]:
    """Every figure of the finished (task, seed) units, per task."""
    import hpo

    setup = results.setup() or {}
    tasks = TINY_TASKS if setup.get("tiny", tiny) else TASKS
    out: dict[str, Any] = {"setup": setup, "tasks": {}}
    for name in [t for t in setup.get("tasks", []) if t in setup.get("dataset_size", {})]:
        task = tasks[name]
        truth = Truth(results, task)
        units = [
            (seed, u)
            for seed in setup.get("seeds", [])
            if (u := unit_results(results, name, seed)) is not None
        ]
        started = sum(
            1 for seed in setup.get("seeds", []) if results.trials(name, seed, "baseline")
        )
        entry: dict[str, Any] = {"finished_seeds": [s for s, _ in units], "started": started}
        if units:
            bench = _FigureBench(truth)
            per_seed = [hpo.seed_figures(bench, u, arms=GPU_ARMS) for _, u in units]
            summary = hpo.summarize(per_seed, arms=GPU_ARMS)
            entry["table"] = hpo.table_rows(summary, len(units), arms=GPU_ARMS)
            entry["curve"] = hpo.curve_rows(per_seed, arms=GPU_ARMS)
            entry["targets"] = hpo.targets(summary, len(units))
            entry["per_seed"] = [
                {arm: {k: v for k, v in f.items() if k not in ("curve",)} for arm, f in s.items()}
                for s in per_seed
            ]
            entry["finder"] = finder_figures([u for _, u in units], results, name)
            entry["memory"] = memory_figures([u for _, u in units], truth)
            entry["flaky"] = truth.flaky()
            entry["gpu_s"] = sum(x["run"]["compute_s"] for x in results.runs(name))
        out["tasks"][name] = entry
    return out


@dataclass
class _FigureBench:
    truth: Truth


def finder_figures(
    units: list[dict[str, dict[str, Any]]], results: Results, task: str
) -> dict[str, Any]:
    """The BatchSizeFinder arm: time in its search, and the batch sizes it trained at."""
    search, ratio = [], []
    for u in units:
        seed = u["baseline"]["seed"]
        for x in results.trials(task, seed, "batch-size-finder"):
            run = x.get("run") or {}
            if "finder_s" in run:
                search.append(run["finder_s"])
            if run.get("batch_size_used"):
                ratio.append(run["batch_size_used"] / x["params"]["batch_size"])
    return {
        "search_s": sum(search),
        "search_mean_s": statistics.fmean(search) if search else None,
        "batch_ratio": sorted(ratio),
    }


def memory_figures(units: list[dict[str, dict[str, Any]]], truth: Truth) -> dict[str, Any]:
    """costaware's predicted memory need against the reserved peak measured for the same
    cost key in runs that completed."""
    ratios = []
    for u in units:
        for rec in u["costaware"]["records"]:
            pred = (rec.get("prediction") or {}).get("peak_memory")
            peaks = [
                r["max_reserved"]
                for r in truth.runs.get(rec["key"], [])
                if r["status"] == "ok" and r.get("max_reserved")
            ]
            if pred and peaks:
                ratios.append(pred / max(peaks))
    if not ratios:
        return {"text": "-"}
    s = sorted(ratios)
    return {
        "text": f"median {statistics.median(s):.2f}x, range {s[0]:.2f}-{s[-1]:.2f}x, "
        f"{sum(x < 1 for x in s)} of {len(s)} below 1",
        "ratios": s,
    }


START, END = "<!-- gpu-hpo:start -->", "<!-- gpu-hpo:end -->"


def section(rep: dict[str, Any], command: str) -> str:
    """The docs/benchmarks.md section of the GPU mode, from a report."""
    import hpo

    s = rep["setup"]
    m = s.get("machine", {})
    lines = [
        START,
        "### The GPU run (`benchmarks/hpo.py --gpu`)",
        "",
        "*Generated by `python benchmarks/hpo.py --gpu --report-only --results "
        f"{command}`; do not edit by hand.*",
        "",
    ]
    if not s:
        return "\n".join([*lines, "No GPU run yet.", END])
    lines += [
        f"- **Machine**: {m.get('gpu', s.get('device'))}"
        f"{', driver ' + str(m['driver']) if m.get('driver') else ''}; torch {m.get('torch')}"
        f" (CUDA {m.get('cuda')}), Lightning {m.get('lightning')}, Optuna {m.get('optuna')}; "
        f"costaware at `{m.get('commit', '?')}`; started {s.get('started', '?')}.",
        f"- **Simulated card**: {s['card_bytes'] / GiB:g} GiB: the caching allocator capped at "
        f"{s['cap'] / GiB:.2f} GiB (`set_per_process_memory_fraction`), the card less the "
        "CUDA context "
        + (
            f"measured at the start ({s['context_bytes'] / MiB:.0f} MiB)"
            if s.get("context_bytes")
            else "(costaware's catalog figure)"
        )
        + f"; `Budget(max_memory={s['card_bytes'] / GiB:g} GiB)`.",
        f"- **Trials**: {s['trials']} per arm and seed ({s['startup']} TPE start-up), "
        f"{EPOCHS} epochs each; seeds planned {s['seeds']}.",
    ]
    for name, e in rep["tasks"].items():
        lines += [
            "",
            f"#### Task `{name}`",
            "",
            f"{s['dataset_size'][name]} samples an epoch (the reference configuration's "
            f"epoch: {s['reference_epoch_s'][name]:.1f} s); `max_epoch_time` "
            f"{s['max_epoch_time'][name]:.1f} s. Finished seeds: "
            f"{e['finished_seeds'] or 'none yet'}.",
        ]
        if "table" not in e:
            continue
        lines += [
            "",
            hpo.md_table(e["table"], hpo.TABLE_COLUMNS),
            "",
            "Best value reached (mean over seeds) against compute spent, as a share of the "
            "baseline's:",
            "",
            hpo.md_table(e["curve"]),
            "",
            "| target | this run | |",
            "|---|---|---|",
        ]
        for tname, fig, met in e["targets"]:
            mark = "met" if met else ("**missed**" if met is False else "n/a")
            lines.append(f"| {tname} | {fig} | {mark} |")
        f = e["finder"]
        ratio = f["batch_ratio"]
        lines += [
            "",
            f"- BatchSizeFinder: {f['search_s']:.0f} s of GPU time in its searches"
            + (f" ({f['search_mean_s']:.1f} s a trial)" if f["search_mean_s"] else "")
            + (
                f"; it trained at {statistics.median(ratio):g}x the suggested batch size "
                f"(median; {ratio[0]:g}-{ratio[-1]:g}x)"
                if ratio
                else ""
            )
            + ".",
            f"- costaware's predicted memory need / the reserved peak measured: "
            f"{e['memory']['text']}.",
            f"- Keys whose runs disagreed on feasibility: {e['flaky'][0]} of {e['flaky'][1]} "
            f"run more than once. GPU time of every real run of the task: {e['gpu_s']:.0f} s.",
        ]
    lines.append(END)
    return "\n".join(lines)


def splice(doc: Path, text: str) -> None:
    """Put ``text`` between the GPU markers of ``doc`` (appended if it has none)."""
    from _docs import splice as splice_section

    splice_section(doc, text, START, END)


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> Any:
    import argparse

    p = argparse.ArgumentParser(
        prog="python benchmarks/hpo.py --gpu",
        description="The GPU mode of the HPO benchmark (resumable; see benchmarks/_hpo_gpu.py).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--results", required=True, help="the JSONL file (appended; resumed)")
    p.add_argument("--workdir", default=None, help="costaware's stores (default: beside --results)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tasks", default="lm,vision", help="tasks, in order")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--trials", type=int, default=12, help="trials per arm and seed")
    p.add_argument("--startup", type=int, default=None, help="TPE start-up (default trials/3)")
    p.add_argument("--card-gib", type=float, default=16.0, help="the simulated card's memory")
    p.add_argument(
        "--epoch-seconds",
        type=float,
        default=10.0,
        help="the reference configuration's epoch time the dataset is sized for",
    )
    p.add_argument(
        "--time-factor", type=float, default=3.0, help="max_epoch_time = this x the reference epoch"
    )
    p.add_argument("--probe-samples", type=int, default=0, help="samples of the speed probe")
    p.add_argument("--minutes", type=float, default=1e9, help="stop cleanly after this long")
    p.add_argument(
        "--stop-after",
        type=int,
        default=None,
        help="stop cleanly after this many trials (a test of resuming)",
    )
    p.add_argument("--tiny", action="store_true", help="tiny models (a CPU test)")
    p.add_argument("--refit-every", type=int, default=5)
    p.add_argument(
        "--report-only",
        action="store_true",
        help="no training: write the report of what --results holds",
    )
    p.add_argument("--json", default=None, help="write the report's figures here")
    p.add_argument("--doc", default=None, help="splice the report's section into this file")
    args = p.parse_args(argv)
    args.tasks = [t for t in args.tasks.split(",") if t]
    bad = [t for t in args.tasks if t not in TASKS]
    if bad or not args.tasks:
        p.error(f"--tasks must name some of {sorted(TASKS)}, got {args.tasks}")
    if args.startup is None:
        args.startup = max(1, args.trials // 3)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.monotonic()
    results_path = Path(args.results)
    if not args.report_only:
        results_path.parent.mkdir(parents=True, exist_ok=True)
    results = Results(results_path)
    cmd = str(results_path)
    if not args.report_only:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.ERROR)
        warnings.filterwarnings("ignore")
        _lightning()  # imported first: it sets its loggers' levels when imported
        for name in ("lightning.pytorch", "lightning.fabric", "lightning_fabric"):
            logging.getLogger(name).setLevel(logging.ERROR)
        workdir = Path(args.workdir) if args.workdir else results_path.parent
        workdir.mkdir(parents=True, exist_ok=True)
        setup = results.setup()
        if setup is None:
            ctx = make_context(args, lambda s: print(f"hpo-gpu: {s}", flush=True))
            ctx.machine = machine(args.device)
            results.append(
                {
                    "kind": "setup",
                    "schema": SCHEMA,
                    "started": _dt.datetime.now().astimezone().isoformat(timespec="minutes"),
                    **ctx.to_json(),
                }
            )
        else:
            setup = results.setup() or setup
            fields = set(Context.__dataclass_fields__)
            ctx = Context(**{k: v for k, v in setup.items() if k in fields})
            if ctx.device != args.device:
                raise SystemExit(
                    f"{results_path} was started on {ctx.device}, not {args.device}: "
                    "give another --results to start afresh"
                )
            print(f"hpo-gpu: resuming {results_path} ({len(results.lines)} lines)", flush=True)
            apply_cap(ctx)
        tasks = TINY_TASKS if ctx.tiny else TASKS
        runner = Runner(
            ctx,
            results,
            workdir,
            deadline=t_start + 60 * args.minutes,
            progress=lambda s: print(f"hpo-gpu: {s}", flush=True),
            refit_every=args.refit_every,
            stop_after=args.stop_after,
        )
        try:
            for name in ctx.tasks:
                if name not in ctx.dataset_size:
                    line = calibrate(ctx, tasks[name])
                    results.append(line)
                    for k in ("dataset_size", "max_epoch_time", "reference_epoch_s"):
                        getattr(ctx, k)[name] = line[k]
                    runner.progress(
                        f"{name}: {line['dataset_size']} samples an epoch (reference epoch "
                        f"{line['reference_epoch_s']:.2f} s); max_epoch_time "
                        f"{line['max_epoch_time']:.2f} s"
                    )
                for seed in ctx.seeds:
                    for arm in GPU_RUN_ORDER:
                        runner.arm(tasks[name], seed, arm)
                    runner.check_rejections(tasks[name], seed)
            print("hpo-gpu: every task, seed and arm is done", flush=True)
        except (OutOfTime, KeyboardInterrupt):
            print("hpo-gpu: out of time (--minutes, --stop-after); rerun to continue", flush=True)
    rep = report(Results(results_path), tiny=args.tiny)
    text = section(rep, cmd)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1, default=str))
    if args.doc:
        splice(Path(args.doc), text)
        print(f"hpo-gpu: wrote the section into {args.doc}")
    return 0
