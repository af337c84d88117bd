"""CostAwareCallback against real Lightning Trainers (both namespaces) on the CPU."""

from __future__ import annotations

import gc
import importlib.util
import pickle
import re
import sys
import time
import types
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import lightning.pytorch as L
import optuna
import pytest
import pytorch_lightning as PL
import torch
from torch.utils.data import DataLoader, TensorDataset

import costaware as ca
from costaware.integrations import lightning as cal
from costaware.integrations.lightning import (
    CostAwareCallback,
    CostAwareWarning,
    PLCostAwareCallback,
)
from costaware.measure.profile import ALLOCATOR_METHOD
from costaware.runtime.store import ObservationStore, StoreError

NAMESPACES = {"lightning": (L, CostAwareCallback), "pytorch_lightning": (PL, PLCostAwareCallback)}
# a hidden layer of 256 KiB: its gradient and AdamW states are over glibc's 64 KiB mmap
# threshold, so each one is fresh resident memory that the resident-set fallback must show
# (tensors under it can land in heap pages already resident, and the growth can be 0)
IN, HIDDEN = 32, 2048


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1)
    )


def make_module(
    ns: Any, *, fail: BaseException | None = None, fail_at: tuple[int, int] = (1, 2)
) -> Any:
    """A tiny regressor; raises ``fail`` at (epoch, batch) ``fail_at`` if given."""

    class Regressor(ns.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = _net()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if fail is not None and (self.current_epoch, batch_idx) == fail_at:
                raise fail
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return Regressor()


def loader(n: int = 64) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(n, IN, generator=g), torch.randn(n, 1, generator=g)), batch_size=8
    )


def make_trainer(ns: Any, callbacks: list[Any], **kwargs: Any) -> Any:
    opts: dict[str, Any] = {
        "accelerator": "cpu",
        "max_epochs": 2,
        "limit_train_batches": 5,
        "limit_val_batches": 2,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    opts.update(kwargs)
    return ns.Trainer(callbacks=callbacks, **opts)


def fit(ns: Any, cb: Any, module: Any = None, **kwargs: Any) -> Any:
    trainer = make_trainer(ns, [cb], **kwargs)
    trainer.fit(module if module is not None else make_module(ns), loader(), loader(16))
    return trainer


def spec() -> ca.TrainingSpec:
    return ca.TrainingSpec(
        model=_net, batch=ca.ImageBatch((IN,), classes=1), batch_size=8, dataset_size=64
    )


@pytest.fixture(autouse=True)
def _quiet_lightning() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(LeafSpec|num_workers|does not have many).*")
        yield


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'hpo.db'}"


# --------------------------------------------------------------------------------------
# recording
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(NAMESPACES))
def test_one_row_per_epoch_into_sqlite(name: str, db: str) -> None:
    ns, cls = NAMESPACES[name]
    cb = cls(store=db, study="s", trial="t0")
    trainer = fit(ns, cb, max_epochs=3, num_sanity_val_steps=2)  # the sanity check runs first
    assert trainer.current_epoch == 3
    assert cb.epochs_recorded == [0, 1, 2]
    assert [r["epoch"] for r in cb.measurements] == [0, 1, 2]
    assert [r for r in cb.records if r["kind"] == "prediction"] == []  # no spec, no prediction
    for r in cb.measurements:
        a = r["actual"]
        assert r["status"] == "ok" and r["reason"] is None and r["device"] == "CPU"
        assert a["epoch_time"] > 0 and a["iteration_time"] > 0 and a["peak_memory"] > 0
        assert a["iteration_time"] < a["epoch_time"]
        assert a["steps"] == 5 and a["device_kind"] == "cpu" and a["nvml_peak"] is None
        assert a["memory_method"].startswith(ALLOCATOR_METHOD), a["memory_method"]
        assert r["meta"]["framework"] == name
    # the parameters, their gradients and AdamW's two states are in the CPU peak; on top,
    # the for-loop AdamW's two temporaries of the largest weight and the activations
    param_bytes = sum(p.numel() * 4 for p in _net().parameters())
    peak = cb.measurements[-1]["actual"]["peak_memory"]
    assert 4 * param_bytes <= peak <= 6 * param_bytes + 8 * HIDDEN * 4 * 8
    assert cb._cpu_memory is not None and not cb._cpu_memory.profiling  # stopped after batch 2
    assert cb._exit_stack is None  # glibc's mmap threshold restored at the end of fit

    rows = ObservationStore(db).measurements(study="s")
    assert [(r["trial"], r["epoch"], r["status"]) for r in rows] == [
        ("t0", 0, "ok"),
        ("t0", 1, "ok"),
        ("t0", 2, "ok"),
    ]
    assert [r["id"] for r in rows] == [r["id"] for r in cb.measurements]
    assert rows[0]["actual"]["epoch_time"] == pytest.approx(
        cb.measurements[0]["actual"]["epoch_time"]
    )


def _fit_watching_malloc(cb: Any, **kwargs: Any) -> list[bool]:
    """Fit with ``cb``; per training batch, whether glibc's mmap threshold was set then."""
    seen: list[bool] = []

    class Watch(L.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, *args: Any) -> None:
            seen.append(cb._exit_stack is not None)

    make_trainer(L, [cb, Watch()], max_epochs=1, **kwargs).fit(make_module(L), loader(), loader(16))
    return seen


def test_cpu_training_runs_under_glibcs_own_settings(db: str) -> None:
    # the mmap threshold makes every large tensor fault its pages in at each step
    cb = CostAwareCallback(store=db, study="s", trial="malloc")
    assert _fit_watching_malloc(cb) == [False] * 5
    assert cb.measurements[-1]["actual"]["memory_method"].startswith(ALLOCATOR_METHOD)


def test_cpu_memory_falls_back_to_the_resident_set_under_lightnings_profiler(
    db: str, tmp_path: Path
) -> None:
    from lightning.pytorch.profilers import PyTorchProfiler

    cb = CostAwareCallback(store=db, study="s", trial="prof")
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="trace")
    assert _fit_watching_malloc(cb, profiler=profiler) == [True] * 5  # frees leave the RSS
    assert cb._exit_stack is None  # and the threshold is set back when fit ends
    a = cb.measurements[-1]["actual"]
    assert "another torch profiler is running" in a["memory_method"]
    assert "RssFile" in a["memory_method"] and "64 KiB" in a["memory_method"]
    param_bytes = sum(p.numel() * 4 for p in _net().parameters())
    assert a["peak_memory"] >= param_bytes  # the parameters, counted apart, at least


def test_in_memory_only_without_store() -> None:
    cb = CostAwareCallback()
    fit(L, cb)
    assert len(cb.measurements) == 2
    assert all(r["id"] is None and r["study"] is None and r["trial"] is None for r in cb.records)


def test_warmup_longer_than_an_epoch_still_gives_an_iteration_time() -> None:
    cb = CostAwareCallback(warmup_steps=100)
    fit(L, cb, max_epochs=2)
    assert all(r["actual"]["iteration_time"] > 0 for r in cb.measurements)


def test_validation_time_is_not_epoch_time() -> None:
    class SlowVal(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _net()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            out: torch.Tensor = self.net(batch[0])
            return out.pow(2).mean()

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            time.sleep(SLEEP)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class BatchClock(L.Callback):
        """The wall time spent inside training batches (what an epoch time may contain)."""

        def __init__(self) -> None:
            self.total, self._t0 = 0.0, 0.0

        def on_train_batch_start(self, *args: Any) -> None:
            self._t0 = time.perf_counter()

        def on_train_batch_end(self, *args: Any) -> None:
            self.total += time.perf_counter() - self._t0

    SLEEP = 1.0
    cb, clock = CostAwareCallback(), BatchClock()
    # validation twice per epoch: once in the middle (between batches), once at the end
    trainer = make_trainer(L, [cb, clock], max_epochs=1, limit_train_batches=4,
                           val_check_interval=2, limit_val_batches=1, num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(SlowVal(), loader(), loader(16))
    # Without the validation in the middle, the epoch is the batches plus a little loop
    # overhead; with it, the epoch would be at least SLEEP longer. No fixed time limit: the
    # batches themselves may be slow on a loaded machine.
    assert cb.measurements[0]["actual"]["epoch_time"] < clock.total + SLEEP / 2


def test_spec_records_a_prediction(db: str) -> None:
    cb = CostAwareCallback(store=db, spec=spec(), study="s", trial=7)
    fit(L, cb)
    assert cb.prediction is not None and cb.prediction.peak_memory > 0
    store = ObservationStore(db)
    (pred,) = store.predictions(study="s")
    assert (pred["trial"], pred["status"], pred["device"]) == ("7", "admitted", "CPU")
    assert pred["decision"] is None and pred["spec"]["batch_size"] == 8
    assert pred["features"]["batch_size"] == 8
    assert pred["prediction"]["peak_memory"] == cb.prediction.peak_memory
    # predicted + measured = one training row for the refit
    (obs,) = store.observations(study="s")
    assert obs.status == "ok" and obs.peak_memory == max(
        r["actual"]["peak_memory"] for r in cb.measurements
    )


def test_prediction_already_recorded_by_the_pruner_is_not_duplicated(db: str) -> None:
    store = ObservationStore(db)
    store.record_prediction(study="s", trial=3, spec={"name": "x"}, features={"a": 1.0},
                            prediction={"peak_memory": 1}, decision={"admit": True},
                            device="CPU", status="admitted")  # fmt: skip
    cb = CostAwareCallback(store=store, spec=spec(), study="s", trial=3)
    fit(L, cb, max_epochs=1)
    assert len(store.predictions(study="s")) == 1
    assert cb.prediction is None
    assert len(store.measurements(study="s")) == 1


def test_failing_prediction_warns_once_and_training_goes_on(db: str) -> None:
    class Broken(ca.CostModel):
        def predict(self, *args: Any, **kwargs: Any) -> ca.Prediction:
            raise ca.UntraceableModelError("data-dependent .item() in forward")

    cb = CostAwareCallback(store=db, spec=spec(), model=Broken(), study="s", trial=1)
    with pytest.warns(CostAwareWarning, match="could not predict") as caught:
        fit(L, cb)
    assert sum("could not predict" in str(w.message) for w in caught) == 1
    assert len(cb.measurements) == 2
    (pred,) = ObservationStore(db).predictions(study="s")
    assert pred["status"] == "error" and "UntraceableModelError" in pred["reason"]
    assert pred["features"] is None and pred["prediction"] is None


# --------------------------------------------------------------------------------------
# crashes
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (
            RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79 GiB total)"),
            "oom",
        ),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"), "oom"),
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
                "can't allocate memory: you tried to allocate 1099511627776 bytes."
            ),
            "oom",
        ),
        (ValueError("shapes do not match\nmore detail"), "error"),
    ],
)
@pytest.mark.parametrize("name", list(NAMESPACES))
def test_exception_is_recorded_and_propagates(
    name: str, exc: BaseException, status: str, db: str
) -> None:
    ns, cls = NAMESPACES[name]
    cb = cls(store=db, study="s", trial="crash")
    with pytest.raises(type(exc)) as info:
        fit(ns, cb, make_module(ns, fail=exc, fail_at=(1, 2)), max_epochs=3)
    assert info.value is exc
    ok, crash = cb.measurements
    assert ok["status"] == "ok" and ok["epoch"] == 0
    assert crash["status"] == status and crash["epoch"] == 1
    assert crash["reason"] == f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    assert crash["actual"]["peak_memory"] > 0 and crash["actual"]["steps"] == 2
    # two steps of an epoch are no epoch's time: kept as the time the trial spent
    assert crash["actual"].get("epoch_time") is None and crash["actual"]["partial_epoch_time"] > 0
    assert cb._exit_stack is None  # restored although on_fit_end never ran
    rows = ObservationStore(db).measurements(study="s")
    assert [r["status"] for r in rows] == ["ok", status]


@pytest.mark.parametrize("name", list(NAMESPACES))
def test_a_trial_pruned_at_an_epochs_end_records_that_epoch_once(name: str, db: str) -> None:
    """A pruner's callback after costaware's (Optuna's MedianPruner asked in
    ``on_train_epoch_end``) stops the trial once the epoch is recorded: the stop is a row of
    its own without figures, and the report counts the epochs that ran."""
    ns, cls = NAMESPACES[name]

    class Pruner(ns.Callback):  # type: ignore[misc, name-defined]
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if trainer.current_epoch == 1:
                raise optuna.TrialPruned("median pruned at epoch 1")

    cb = cls(store=db, study="s", trial="pruned")
    with pytest.raises(optuna.TrialPruned):
        make_trainer(ns, [cb, Pruner()], max_epochs=3).fit(make_module(ns), loader(), loader(16))
    first, second, stop = cb.measurements
    assert [m["status"] for m in cb.measurements] == ["ok", "ok", "stopped"]
    assert first["epoch"] == 0 and second["epoch"] == stop["epoch"] == 1
    assert second["actual"]["epoch_time"] > 0
    assert stop["reason"] == "pruned by Optuna: TrialPruned: median pruned at epoch 1"
    assert not {"epoch_time", "partial_epoch_time", "iteration_time", "peak_memory"} & set(
        stop["actual"]
    )
    (row,) = ca.report(db, study="s").trials
    assert row.epochs_measured == 2
    assert row.train_time == pytest.approx(first["actual"]["epoch_time"] + second["actual"]["epoch_time"])


def test_trial_pruned_by_someone_else_is_recorded_as_stopped() -> None:
    cb = CostAwareCallback()
    with pytest.raises(optuna.TrialPruned):
        fit(
            L,
            cb,
            make_module(L, fail=optuna.TrialPruned("trial was pruned at epoch 0"), fail_at=(0, 1)),
        )
    (row,) = cb.measurements
    assert row["status"] == "stopped" and row["reason"].startswith("pruned by Optuna")


# --------------------------------------------------------------------------------------
# enforcement
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("budget", "words"),
    [
        (ca.Budget(max_epoch_time=1e-6), r"measured epoch time \S+ \S+ exceeds the 1 µs budget"),
        (
            ca.Budget(max_memory="1KiB"),
            r"measured peak memory \S+ \w?i?B exceeds the 1.0 KiB budget",
        ),
        (
            ca.Budget(max_trial_time=1e-6),
            r"measured training time so far \S+ \S+ exceeds the 1 µs trial budget",
        ),
    ],
)
@pytest.mark.parametrize("name", list(NAMESPACES))
def test_enforce_stops_training(name: str, budget: ca.Budget, words: str, db: str) -> None:
    ns, cls = NAMESPACES[name]
    # the measured checks alone (a fit predicted over budget is rejected before it runs)
    cb = cls(store=db, budget=budget, enforce=True, study="s", trial=0, judge_before=False)
    trainer = fit(ns, cb, max_epochs=5)
    assert trainer.should_stop and trainer.current_epoch == 1  # stopped after the first epoch
    (row,) = cb.measurements
    assert row["status"] == "stopped" and re.search(words, row["reason"]), row["reason"]
    assert cb.stopped_reason == row["reason"]
    assert [r["status"] for r in ObservationStore(db).measurements()] == ["stopped"]


def test_budget_without_enforce_only_records() -> None:
    cb = CostAwareCallback(budget=ca.Budget(max_epoch_time=1e-6), judge_before=False)
    trainer = fit(L, cb, max_epochs=2)
    assert trainer.current_epoch == 2 and cb.stopped_reason is None
    assert [r["status"] for r in cb.measurements] == ["ok", "ok"]


@pytest.mark.parametrize("name", list(NAMESPACES))
def test_enforce_under_optuna_prunes_the_trial(name: str, db: str) -> None:
    ns, cls = NAMESPACES[name]
    callbacks: list[Any] = []

    def objective(trial: optuna.Trial) -> float:
        trial.suggest_int("width", 8, 64)
        cb = cls(
            store=db,
            budget=ca.Budget(max_epoch_time=1e-6),
            enforce=True,
            trial=trial,
            judge_before=False,
        )
        callbacks.append(cb)
        fit(ns, cb, max_epochs=5)
        return 0.0

    study = optuna.create_study(study_name="cost-study")
    study.optimize(objective, n_trials=1)
    (frozen,) = study.trials
    assert frozen.state == optuna.trial.TrialState.PRUNED
    (cb,) = callbacks
    assert frozen.user_attrs["costaware_stopped"] == cb.stopped_reason
    assert "measured epoch time" in cb.stopped_reason
    (row,) = cb.measurements  # on_exception saw our own TrialPruned and did not record twice
    assert (row["study"], row["trial"], row["status"]) == ("cost-study", 0, "stopped")
    rows = ObservationStore(db).measurements(study="cost-study")
    assert [(r["trial"], r["status"]) for r in rows] == [("0", "stopped")]


def test_optuna_trial_ids_and_oom_user_attr() -> None:
    study = optuna.create_study(study_name="ids")
    trial = study.ask()
    cb = CostAwareCallback(trial=trial)
    assert (cb.study_name, cb.trial_id) == ("ids", 0)
    oom = RuntimeError("CUDA out of memory. Tried to allocate 1 GiB")
    with pytest.raises(RuntimeError):
        fit(L, cb, make_module(L, fail=oom, fail_at=(0, 1)))
    assert (
        study.trials[0].user_attrs["costaware_oom"].startswith("RuntimeError: CUDA out of memory")
    )
    assert CostAwareCallback(trial=trial, study="mine").study_name == "mine"


# --------------------------------------------------------------------------------------
# failing open
# --------------------------------------------------------------------------------------
def test_store_that_cannot_be_written_does_not_crash_fit(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(self: ObservationStore, **kwargs: Any) -> int:
        raise StoreError("cannot write to the observation store: disk I/O error")

    monkeypatch.setattr(ObservationStore, "record_measurement", refuse)
    cb = CostAwareCallback(store=db, study="s", trial=1)
    with pytest.warns(CostAwareWarning, match="could not write") as caught:
        fit(L, cb, max_epochs=3)
    assert sum("could not write" in str(w.message) for w in caught) == 1  # warned once
    assert [r["id"] for r in cb.measurements] == [None, None, None]


def test_a_failure_in_the_callback_itself_does_not_crash_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def boom(self: Any) -> dict[str, Any]:
        raise RuntimeError("cannot read the memory stats")

    monkeypatch.setattr(cal._CostAwareCallbackBase, "_actual", boom)
    cb = CostAwareCallback()
    with pytest.warns(CostAwareWarning, match="failed while recording an epoch"):
        trainer = fit(L, cb, max_epochs=2)
    assert trainer.current_epoch == 2 and cb.measurements == []


def test_store_that_cannot_be_opened_does_not_crash_fit(tmp_path: Path) -> None:
    cb = CostAwareCallback(store=tmp_path / "no" / "such" / "dir" / "hpo.db", spec=spec(), trial=1)
    with pytest.warns(CostAwareWarning, match="could not open the observation store"):
        fit(L, cb)
    assert len(cb.measurements) == 2 and cb.prediction is not None


# --------------------------------------------------------------------------------------
# state, namespaces, arguments, import
# --------------------------------------------------------------------------------------
def test_state_dict_round_trip_and_resume(tmp_path: Path) -> None:
    cb = CostAwareCallback(study="s", trial=2)
    trainer = fit(L, cb, max_epochs=2)
    state = cb.state_dict()
    assert state["epochs_recorded"] == [0, 1] and len(state["records"]) == 2
    other = CostAwareCallback(study="s", trial=2)
    other.load_state_dict(state)
    assert other.state_dict() == state and other.records == cb.records
    assert cb.state_key == "CostAwareCallback{'study': 's', 'trial': 2}"

    ckpt = tmp_path / "last.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=True)["callbacks"][cb.state_key]
    assert saved == state
    resumed = CostAwareCallback(study="s", trial=2)
    trainer = make_trainer(L, [resumed], max_epochs=3)
    trainer.fit(make_module(L), loader(), loader(16), ckpt_path=ckpt)
    assert resumed.epochs_recorded == [0, 1, 2]
    assert [r["epoch"] for r in resumed.measurements] == [0, 1, 2]


def test_callback_pickles_after_fit(db: str) -> None:  # Ray ships callbacks to workers
    cb = CostAwareCallback(store=db, study="s", trial=1)
    fit(L, cb, max_epochs=1)
    copy = pickle.loads(pickle.dumps(cb))
    assert copy.records == cb.records and copy.store == db
    fit(L, copy, max_epochs=1)  # reopens the store from its URL
    assert [r["status"] for r in ObservationStore(db).measurements()] == ["ok", "ok"]


def test_callback_of_the_other_namespace_warns() -> None:
    cb = PLCostAwareCallback()
    with pytest.warns(CostAwareWarning, match="use CostAwareCallback"):
        fit(L, cb, max_epochs=1)
    assert len(cb.measurements) == 1  # still runs when passed in a list
    assert not isinstance(CostAwareCallback(), PL.Callback)
    assert isinstance(PLCostAwareCallback(), PL.Callback)
    assert not isinstance(PLCostAwareCallback(), L.Callback)
    # passed alone, a callback of the other namespace is rejected; the matching one is not
    with pytest.raises(TypeError, match="not iterable"):
        PL.Trainer(callbacks=CostAwareCallback(), logger=False)
    with pytest.raises(TypeError, match="not iterable"):
        L.Trainer(callbacks=PLCostAwareCallback(), logger=False)
    PL.Trainer(callbacks=PLCostAwareCallback(), logger=False)
    L.Trainer(callbacks=CostAwareCallback(), logger=False)


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="warmup_steps=-1"):
        CostAwareCallback(warmup_steps=-1)
    with pytest.raises(ValueError, match="enforce=True needs a budget"):
        CostAwareCallback(enforce=True)
    with pytest.raises(TypeError, match="store must be"):
        CostAwareCallback(store=cast(Any, 42))
    with pytest.raises(TypeError, match="budget must be"):
        CostAwareCallback(budget=cast(Any, {"max_memory": "1GiB"}))
    with pytest.raises(ca.UnknownDeviceError):
        CostAwareCallback(device="H1000-imaginary")
    assert CostAwareCallback(device="H100").device == "H100"


def test_import_without_lightning_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for mod in ("lightning", "lightning.pytorch", "pytorch_lightning"):
        monkeypatch.setitem(sys.modules, mod, None)  # import raises ImportError
    path = Path(cal.__file__)
    spec_ = importlib.util.spec_from_file_location("_costaware_lightning_copy", path)
    assert spec_ is not None and spec_.loader is not None
    with pytest.raises(ImportError, match=re.escape("pip install 'costaware[lightning]'")):
        spec_.loader.exec_module(importlib.util.module_from_spec(spec_))


def test_missing_namespace_class_raises_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pytorch_lightning", None)
    path = Path(cal.__file__)
    spec_ = importlib.util.spec_from_file_location("_costaware_lightning_copy2", path)
    assert spec_ is not None and spec_.loader is not None
    mod = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(mod)
    assert mod.__all__ == [
        "CostAwareWarning",
        "lightning_parallel",
        "lightning_precision",
        "lightning_step_loss",
        "lightning_trial_length",
        "spec_from_lightning",
        "CostAwareBatchSizeFinder",
        "CostAwareCallback",
    ]
    with pytest.raises(ImportError, match="pip install pytorch-lightning"):
        mod.PLCostAwareCallback  # noqa: B018


def test_module_docstring_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    doc = cal.__doc__ or ""
    block = doc.split(".. code-block:: python", 1)[1].split("\nUnder Optuna", 1)[0]
    code = "\n".join(line[4:] for line in block.splitlines())
    exec(compile(code, "<docstring example>", "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[:2] for line in lines[-2:]] == [["0", "ok"], ["1", "ok"]]


def test_cuda_start_records_what_was_held_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA branch of the training start, on a CPU-only machine: torch.cuda's calls
    are stood in for (a GPU cannot run here; the real one is the GPU test below)."""
    calls: list[str] = []
    module = _net()  # on the CPU: none of its bytes are the device's
    reserved = {"now": 900 * 2**20}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: reserved["now"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (0, 2**30))
    monkeypatch.setattr(gc, "collect", lambda: calls.append("gc") or 0)
    trainer = types.SimpleNamespace(current_epoch=0, optimizers=[])
    cb = CostAwareCallback()
    cb._kind, cb._torch_device = "cuda", torch.device("cuda", 0)
    with pytest.warns(CostAwareWarning, match="900 MiB of GPU memory was already reserved"):
        cb._start_training(trainer, module)
    assert calls[:3] == ["sync", "gc", "empty"] and "reset" in calls
    assert cb._held_before == 900 * 2**20
    cb._finish()  # its claim on the GPU ends: the next trial has the device to itself
    cb2 = CostAwareCallback()
    cb2._kind, cb2._torch_device = "cuda", torch.device("cuda", 0)
    reserved["now"] = 64 * 2**20  # a workspace's worth: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", CostAwareWarning)
        cb2._start_training(trainer, module)
    assert cb2._held_before == 64 * 2**20
    cb2._finish()
    # measured in setup, before the model is on the device: what DDP allocates beside the
    # model afterwards (its gradient buckets) is not counted as held
    trainer.strategy = types.SimpleNamespace(root_device=torch.device("cuda", 0))
    cb3 = CostAwareCallback()
    reserved["now"] = 300 * 2**20
    with pytest.warns(CostAwareWarning, match="300 MiB"):
        cb3.setup(trainer, module, "fit")
        cb3._kind, cb3._torch_device = "cuda", torch.device("cuda", 0)
        reserved["now"] = 300 * 2**20 + 2 * 2**30  # the model, its optimizer and buckets
        cb3._start_training(trainer, module)
    assert cb3._held_before == 300 * 2**20 and cb3._setup_held is None
    cb3._finish()


def test_trials_sharing_a_gpu_neither_reset_it_nor_learn_its_peak(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two trials of one process on one GPU (Optuna's n_jobs): the second neither empties the
    cache nor resets the peaks under the first, and both record the device's peak as shared,
    which the store does not learn. torch.cuda's calls are stood in for (no GPU here)."""
    calls: list[str] = []
    peaks = {"reserved": 3 * 2**30, "allocated": 2 * 2**30}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 0)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: peaks["reserved"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: peaks["allocated"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (2**30, 8 * 2**30))
    gpu = torch.device("cuda", 0)
    trainer = types.SimpleNamespace(
        current_epoch=0, optimizers=[], strategy=types.SimpleNamespace(root_device=gpu)
    )
    module = _net()

    def start(cb: Any) -> None:  # Lightning's setup hook, then the start of training
        cb.setup(trainer, module, "fit")
        cb._kind, cb._torch_device = "cuda", gpu
        cb._start_training(trainer, module)

    first, second = CostAwareCallback(), CostAwareCallback()
    start(first)
    assert calls == ["empty", "empty", "reset"]  # alone: a clean cache and fresh peaks
    own = first._memory()
    assert own["peak_memory"] == peaks["reserved"] and "shared_by" not in own
    calls.clear()
    with pytest.warns(CostAwareWarning, match="same GPU at once"):
        start(second)
    assert calls == []  # nothing emptied or reset under the first trial
    for cb in (first, second):
        mem = cb._memory()
        assert mem["peak_memory"] is None and mem["peak_allocated"] is None
        assert mem["held_before"] is None
        assert mem["device_peak_memory"] == peaks["reserved"]
        assert mem["device_peak_allocated"] == peaks["allocated"]
        assert mem["shared_by"] == 2 and "2 trials of this process" in mem["memory_method"]
    # a memory budget is not checked against a peak that is not the trial's own
    small = CostAwareCallback(budget=ca.Budget(max_memory="1GiB"), enforce=True)
    small._dev = second._dev
    assert small._over_budget(second._actual()) is None

    # the store learns the first trial's own peak (its row from before the second came),
    # and no peak for the second: its only figure is the device's
    store = ObservationStore(f"sqlite:///{tmp_path / 'shared.db'}")
    rows = {"first": [own, first._memory()], "second": [second._memory()]}
    for trial, mems in rows.items():
        store.record_prediction(
            study="s",
            trial=trial,
            spec={},
            features={"x": 1.0},
            prediction={},
            decision=None,
            device="H100",
            status="admitted",
        )
        for epoch, mem in enumerate(mems):
            actual = {k: v for k, v in mem.items() if k != "memory_method"}
            store.record_measurement(
                study="s", trial=trial, status="ok", actual=actual, device="H100", epoch=epoch
            )
    learned = {o.meta["trial"]: o.peak_memory for o in store.observations(study="s")}
    assert learned == {"first": peaks["reserved"], "second": None}

    # once both have ended, the next trial has the device to itself again
    first._finish()
    second._finish()
    calls.clear()
    third = CostAwareCallback()
    start(third)
    assert calls == ["empty", "empty", "reset"]
    assert third._memory()["peak_memory"] == peaks["reserved"]
    third._finish()


# --------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_fields(db: str) -> None:
    cb = CostAwareCallback(store=db, spec=spec(), study="gpu", trial=0)
    fit(L, cb, accelerator="gpu", devices=1, max_epochs=2)
    for r in cb.measurements:
        a = r["actual"]
        assert a["device_kind"] == "cuda" and "max_memory_reserved" in a["memory_method"]
        assert a["peak_memory"] >= a["peak_allocated"] > 0
        assert a["nvml_peak"] is not None and a["nvml_peak"] >= a["peak_memory"]
        assert a["iteration_time"] > 0 and a["epoch_time"] > a["iteration_time"]
        assert r["device"] != "CPU"
    assert cb.prediction is not None and cb.prediction.device != "CPU"
    rows = ObservationStore(db).measurements(study="gpu")
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert all(0 <= r["actual"]["held_before"] < 256 * 2**20 for r in rows)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_cuda_oom_is_recorded() -> None:
    class Hog(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _net()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if batch_idx == 1:
                _free, total = torch.cuda.mem_get_info()
                torch.empty(int(total * 2), dtype=torch.uint8, device=self.device)
            out: torch.Tensor = self.net(batch[0])
            return out.pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    cb = CostAwareCallback()
    with pytest.raises(torch.OutOfMemoryError):
        fit(L, cb, Hog(), accelerator="gpu", devices=1, max_epochs=1)
    (row,) = cb.measurements
    assert row["status"] == "oom" and "out of memory" in row["reason"]
    assert row["actual"]["peak_memory"] > 0


@pytest.mark.parametrize("namespace", sorted(NAMESPACES))
def test_a_positional_store_warns_naming_the_keyword_and_still_records(
    namespace: str, tmp_path: Path
) -> None:
    ns, callback = NAMESPACES[namespace]
    old_db, new_db = (f"sqlite:///{tmp_path / n}" for n in ("old.db", "new.db"))
    with pytest.warns(FutureWarning, match=rf"{callback.__name__}\(store=\.\.\.\)"):
        old = callback(old_db, study="s", trial=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the keyword form does not warn
        new = callback(store=new_db, study="s", trial=1)
    assert old.store == old_db
    for cb, url in ((old, old_db), (new, new_db)):
        fit(ns, cb, max_epochs=2)
        rows = ObservationStore(url).measurements(study="s")
        assert [r["epoch"] for r in rows] == [0, 1]


def test_a_trial_number_in_place_of_the_trial_is_said_once() -> None:
    """``CostAwareCallback(trial=trial.number)`` in an objective, without a budget, judges
    nothing: one warning says so and what to pass. A trial id that labels stored rows, or
    any id with a budget, is a use of its own and not warned of."""
    from costaware.integrations.optuna import CostAwarePruner

    study = optuna.create_study(pruner=CostAwarePruner(device="cpu"))
    caught: list[str] = []

    def objective(trial: optuna.Trial) -> float:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            fit(L, CostAwareCallback(trial=trial.number), max_epochs=1, limit_train_batches=2)
            fit(L, CostAwareCallback(trial=trial.study), max_epochs=1, limit_train_batches=2)
        caught.extend(str(w.message) for w in got if issubclass(w.category, CostAwareWarning))
        return 1.0

    study.optimize(objective, n_trials=1)
    said = [m for m in caught if "is not an Optuna trial" in m]
    assert len(said) == 2, caught
    assert "CostAwareCallback(trial=0)" in said[0] and "nothing is judged" in said[0]
    assert "pass trial=trial" in said[0].lower() and "budget=" in said[0]
    assert "trial=<Study>" in said[1]
    for cb in (
        CostAwareCallback(trial=3, budget=ca.Budget(max_memory="64GiB")),
        CostAwareCallback(trial=3, study="s"),
        CostAwareCallback(trial="train_fn_00003"),  # Ray's trial id
    ):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            fit(L, cb, max_epochs=1, limit_train_batches=2)
        assert not [w for w in got if "is not an Optuna trial" in str(w.message)], cb.trial
