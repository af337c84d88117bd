"""The trial side of ``benchmarks/hpo.py``: one real training run in a memory-capped process.

Everything here runs in a child process forked from a multiprocessing fork server that
imported torch, Lightning, Optuna and costaware's Lightning callback once. A child caps
its own address space with ``resource.setrlimit(RLIMIT_AS, ...)`` before it builds
anything, so a configuration that needs more memory than the budget really fails to
allocate (``DefaultCPUAllocator: can't allocate memory``), then trains a small
Transformer sequence classifier with Lightning on a synthetic task and reports what
happened: ``ok``, ``oom``, ``timeout`` (an epoch ran past ``max_epoch_time``) or
``error``, with its wall time, epoch times, validation accuracy and address-space peak.

The task: sequences of ``FULL_LEN`` tokens; the label says whether token 1 occurs more
often than token 2 in the *whole* sequence. A trial sees only the first ``seq_len`` tokens, so
longer sequences (which cost memory and time) reach higher accuracy.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
import traceback
import warnings
from typing import Any

import lightning.pytorch as pl
import optuna
import torch
from _rlimit import cap_address_space, is_oom, mmap_large_allocations, vm_status
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from costaware.integrations.lightning import CostAwareCallback
from costaware.runtime.store import ObservationStore  # noqa: F401  (imported here: part of the baseline)

VOCAB = 4
CLASSES = 2
FULL_LEN = 128
TRAIN_SIZE = 256
VAL_SIZE = 256
EPOCHS = 2


class SeqClassifier(nn.Module):
    """Token embedding, learned positions, pre-norm Transformer encoder, mean-pooled head."""

    def __init__(self, width: int, depth: int, seq_len: int) -> None:
        super().__init__()
        heads = max(1, width // 32)
        self.embed = nn.Embedding(VOCAB, width)
        self.pos = nn.Embedding(seq_len, width)
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        h = self.encoder(self.embed(ids) + self.pos(positions))
        return self.head(self.norm(h).mean(dim=1))


def build_model(width: int, depth: int, seq_len: int) -> SeqClassifier:
    """The model of a configuration (a module-level factory: costaware fingerprints it)."""
    return SeqClassifier(width, depth, seq_len)


def make_data(seq_len: int, seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """The synthetic task, the same for every trial; truncated to ``seq_len`` tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (TRAIN_SIZE + VAL_SIZE, FULL_LEN), generator=g)
    labels = ((ids == 1).sum(1) > (ids == 2).sum(1)).long()
    x = ids[:, :seq_len].contiguous()
    return (
        TensorDataset(x[:TRAIN_SIZE], labels[:TRAIN_SIZE]),
        TensorDataset(x[TRAIN_SIZE:], labels[TRAIN_SIZE:]),
    )


class LitSeq(pl.LightningModule):
    def __init__(self, params: dict[str, Any]) -> None:
        super().__init__()
        self.params = params
        self.net = build_model(params["width"], params["depth"], params["seq_len"])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.net(ids)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x).float(), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        acc = (self.net(x).argmax(1) == y).float().mean()
        self.log("val_acc", acc, prog_bar=False, batch_size=len(y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        p = self.params
        if p["optimizer"] == "sgd":
            return torch.optim.SGD(self.parameters(), lr=p["lr"], momentum=0.9)
        return torch.optim.AdamW(self.parameters(), lr=p["lr"])


class EpochTimeGuard(pl.Callback):
    """Times each training epoch (its batches, validation excluded, as costaware's callback
    does) and stops a trial as soon as the epoch in progress passes ``max_epoch_time``: the
    same check in every arm, so that no arm waits out a hopelessly slow trial.

    At a batch end it raises ``optuna.TrialPruned`` (Lightning hands it to every callback's
    ``on_exception``, so costaware's callback records the run as ``stopped``). A single
    batch that alone runs far past the budget is ended by :class:`Watchdog` instead.
    """

    def __init__(self, max_epoch_time: float) -> None:
        self.max_epoch_time = max_epoch_time
        self.epoch_times: list[float] = []
        self.batch_times: list[float] = []
        self.over: float | None = None
        self.epoch_start: float | None = None
        self._batch_start: float | None = None
        self._last: float | None = None

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.epoch_start = self._last = time.perf_counter()
        self.batch_times = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        self._last = time.perf_counter()
        if self._batch_start is not None:
            self.batch_times.append(self._last - self._batch_start)
        assert self.epoch_start is not None
        elapsed = self._last - self.epoch_start
        if elapsed > self.max_epoch_time:
            self.over = elapsed
            raise optuna.TrialPruned(
                f"measured epoch time passed {elapsed:.2f} s, over the "
                f"{self.max_epoch_time:.2f} s budget"
            )

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self.epoch_start is not None and self._last is not None:
            self.epoch_times.append(self._last - self.epoch_start)
        self.epoch_start = None


class Reporter:
    """Sends exactly one result to the parent, from the trainer or from the watchdog."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self._lock = threading.Lock()
        self._sent = False

    def send(self, result: dict[str, Any]) -> bool:
        with self._lock:
            if self._sent:
                return False
            self._sent = True
            try:
                self.conn.send(result)
                self.conn.close()
            except OSError:
                pass
            return True


class Watchdog(threading.Thread):
    """Ends the process when one epoch runs ``grace`` seconds past the budget while a
    batch is still in progress (torch releases the GIL inside its kernels)."""

    def __init__(
        self, guard: EpochTimeGuard, reporter: Reporter, t_start: float, grace: float
    ) -> None:
        super().__init__(daemon=True, name="hpo-watchdog")
        self.guard, self.reporter, self.t_start, self.grace = guard, reporter, t_start, grace

    def run(self) -> None:
        limit = self.guard.max_epoch_time + self.grace
        while True:
            time.sleep(0.02)
            start = self.guard.epoch_start
            now = time.perf_counter()
            if start is None or now - start <= limit:
                continue
            done = self.guard.batch_times
            result = {
                "status": "timeout",
                "value": None,
                "error": f"killed: the epoch ran {now - start:.2f} s, a batch still running",
                "killed": True,
                "epoch_times": [*self.guard.epoch_times, now - start],
                "iteration_time": statistics.median(done) if done else now - start,
                "steps": len(done),
                "vm_end": vm_status(),
                "wall_s": now - self.t_start,
            }
            if self.reporter.send(result):
                os._exit(0)
            return


def quiet() -> None:
    for name in (
        "lightning.pytorch",
        "lightning.fabric",
        "pytorch_lightning",
        "lightning_fabric",
        "optuna",
    ):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")


def train(
    params: dict[str, Any], settings: dict[str, Any], reporter: Reporter | None = None
) -> dict[str, Any]:
    """Run one configuration in this process; never raises (an error is a result).

    ``settings``: ``limit`` (address-space cap in bytes, or None), ``threads``,
    ``max_epoch_time`` (seconds), ``costaware`` (None, or the keyword arguments of a
    :class:`CostAwareCallback`: ``store``, ``study``, ``trial``, ``budget``, ``device``).
    """
    t_start = time.perf_counter()
    result: dict[str, Any] = {"status": "ok", "value": None, "error": None}
    if settings.get("limit"):
        cap_address_space(int(settings["limit"]))
    mmap_large_allocations()
    torch.set_num_threads(int(settings.get("threads", 1)))
    quiet()
    guard = EpochTimeGuard(float(settings["max_epoch_time"]))
    if reporter is not None:
        grace = float(settings.get("grace", 0.25 * guard.max_epoch_time))
        Watchdog(guard, reporter, t_start, grace).start()
    result["vm_start"] = vm_status()
    try:
        torch.manual_seed(int(settings.get("torch_seed", 0)))
        train_set, val_set = make_data(params["seq_len"])
        callbacks: list[Any] = [guard]
        if settings.get("costaware"):
            callbacks.append(CostAwareCallback(enforce=True, **settings["costaware"]))
        module = LitSeq(params)
        trainer = pl.Trainer(
            max_epochs=EPOCHS,
            accelerator="cpu",
            devices=1,
            precision="bf16-mixed" if params["precision"] == "bf16" else "32-true",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            callbacks=callbacks,
        )
        trainer.fit(
            module,
            DataLoader(train_set, batch_size=params["batch_size"], shuffle=True),
            DataLoader(val_set, batch_size=params["batch_size"]),
        )
        if len(guard.epoch_times) < EPOCHS or "val_acc" not in trainer.callback_metrics:
            # costaware's callback stopped it (trainer.should_stop) after a budget breach
            result["status"] = "stopped"
            stopped = [c.stopped_reason for c in callbacks if hasattr(c, "stopped_reason")]
            result["error"] = next((r for r in stopped if r), "stopped early")
        else:
            result["value"] = float(trainer.callback_metrics["val_acc"])
    except BaseException as e:
        if guard.over is not None or isinstance(e, optuna.TrialPruned):
            result["status"] = "timeout"
        elif is_oom(e):
            result["status"] = "oom"
        else:
            result["status"] = "error"
            result["traceback"] = traceback.format_exc()[-2000:]
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    result["epoch_times"] = list(guard.epoch_times)
    if guard.over is not None:
        result["epoch_times"].append(guard.over)
    result["iteration_time"] = statistics.median(guard.batch_times) if guard.batch_times else None
    result["vm_end"] = vm_status()
    result["wall_s"] = time.perf_counter() - t_start
    return result


def child_main(conn: Any, params: dict[str, Any], settings: dict[str, Any]) -> None:
    """Entry point of a trial process: train, send the result, exit without cleanup."""
    reporter = Reporter(conn)
    try:
        result = train(params, settings, reporter)
    except BaseException as e:
        result = {"status": "error", "error": f"{type(e).__name__}: {e}", "wall_s": None}
    try:
        reporter.send(result)
    finally:
        os._exit(0)


def probe_main(conn: Any, limit: int, sizes: list[int]) -> None:
    """Entry point of a check process: under ``limit``, try to allocate each of ``sizes``."""
    from _rlimit import try_allocate

    cap_address_space(limit)
    mmap_large_allocations()
    out = {"vm_start": vm_status(), "results": [try_allocate(n) for n in sizes]}
    try:
        conn.send(out)
        conn.close()
    finally:
        os._exit(0)
