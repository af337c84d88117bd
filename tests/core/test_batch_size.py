"""The largest batch size that fits (``CostModel.max_batch_size`` and its CLI)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import costaware as ca
from costaware import zoo
from costaware.core.batch_size import DEFAULT_HEADROOM

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model() -> ca.CostModel:
    return ca.CostModel.default()


def _cnn(batch_size: int = 16) -> ca.TrainingSpec:
    return ca.TrainingSpec(
        model=functools.partial(zoo.resnet, depth=18, width=16, classes=10),
        batch=ca.ImageBatch((3, 64, 64), classes=10),
        batch_size=batch_size,
    )


def test_the_size_found_fits_and_the_next_does_not(model: ca.CostModel) -> None:
    budget = ca.Budget(max_memory="3GiB")
    found = model.max_batch_size(_cnn(), "H100", budget, headroom=0)
    assert found.fits and found.limited_by == "memory"
    h100 = ca.get_device("H100")
    need = found.prediction.min_capacity_upper + h100.context_overhead_bytes
    assert need <= 3 * 2**30
    assert found.decision.admit
    # the decision it rests on is the study's: the same prediction, the same budget
    again = budget.decide(model.predict(_cnn(found.batch_size), "H100"), device="H100")
    assert again.admit
    bigger = budget.decide(model.predict(_cnn(found.batch_size + 1), "H100"), device="H100")
    assert not bigger.admit and bigger.reasons[0].kind == "memory"
    assert found.rejected is not None and not found.rejected.admit
    # the bisection closed on the answer: the size just above it was tried and rejected
    assert found.batch_size + 1 in found.tried
    assert found.rejected_batch_size == found.batch_size + 1
    assert str(found).startswith(f"largest batch size on the H100-SXM: {found.batch_size:,} ")
    assert f"; batch size {found.batch_size + 1:,} is rejected: predicted memory" in str(found)
    assert json.loads(json.dumps(found.to_dict(), default=str))["batch_size"] == found.batch_size


def test_the_search_keeps_its_headroom_free_below_the_limit(model: ca.CostModel) -> None:
    budget = ca.Budget(max_memory="3GiB")
    context = ca.get_device("H100").context_overhead_bytes
    edge = model.max_batch_size(_cnn(), "H100", budget, headroom=0)
    kept = model.max_batch_size(_cnn(), "H100", budget)  # the default headroom
    wide = model.max_batch_size(_cnn(), "H100", budget, headroom=0.2)
    assert wide.batch_size < kept.batch_size <= edge.batch_size
    for found, room in ((kept, DEFAULT_HEADROOM), (wide, 0.2)):
        assert found.prediction.min_capacity_upper * (1 + room) + context <= 3 * 2**30
        assert found.decision.checked["headroom"] == room
    # the size above the one found is rejected for the headroom, and says so
    assert wide.rejected is not None and not wide.rejected.admit
    assert "its step grown by the 20% headroom to" in str(wide)
    assert "passes the 3.000 GiB limit" in str(wide)  # written apart from 3.001 GiB
    # the study's own decision (no headroom) admits it: the headroom is the search's alone
    above = model.predict(_cnn(wide.rejected_batch_size), "H100")
    assert budget.decide(above, device="H100").admit


@pytest.mark.parametrize("headroom", [-0.1, 1.0, "2%", True])
def test_a_bad_headroom_is_refused(model: ca.CostModel, headroom: object) -> None:
    with pytest.raises(ValueError, match="headroom must be a share of the memory need"):
        model.max_batch_size(_cnn(), "H100", headroom=headroom)  # type: ignore[arg-type]


def test_without_a_budget_the_device_is_the_limit(model: ca.CostModel) -> None:
    small = model.max_batch_size(_cnn(), "T4", limit=1 << 16)
    large = model.max_batch_size(_cnn(), "H100", limit=1 << 16)
    assert small.fits and large.fits
    assert small.batch_size < large.batch_size
    assert "all of the T4's memory" in str(small)


def test_nothing_fits_says_so_with_what_batch_one_needs(model: ca.CostModel) -> None:
    found = model.max_batch_size(_cnn(), "H100", ca.Budget(max_memory="1GiB"))
    assert not found.fits and found.batch_size == 0 and found.limited_by == "nothing fits"
    text = str(found)
    assert "nothing fits on the H100-SXM, not even a batch of 1" in text
    assert "at batch size 1" in text


def test_everything_fits_up_to_the_search_limit_says_so(model: ca.CostModel) -> None:
    found = model.max_batch_size(_cnn(), "H100", limit=64)
    assert found.batch_size == 64 and found.limited_by == "search limit"
    assert "every batch size up to the search limit of 64 fits" in str(found)


@pytest.mark.parametrize("limit", [0, -3, 2.5, True])
def test_a_bad_limit_is_refused(model: ca.CostModel, limit: object) -> None:
    with pytest.raises(ValueError, match="limit must be a whole number from 1 to"):
        model.max_batch_size(_cnn(), "H100", limit=limit)  # type: ignore[arg-type]


def test_the_cli_prints_the_size_and_exits_1_when_nothing_fits() -> None:
    base = [sys.executable, "-m", "costaware.cli", "max-batch-size", "examples/models.py:resnet18"]
    args = ["--input", "3x64x64", "--classes", "10", "--device", "H100"]
    ok = subprocess.run(
        [*base, *args, "--max-memory", "4GiB", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert result["fits"] and result["limited_by"] == "memory" and result["batch_size"] >= 1
    assert result["decision"]["checked"]["headroom"] == DEFAULT_HEADROOM
    bad = subprocess.run(
        [*base, *args, "--headroom", "5"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert bad.returncode == 2 and "--headroom must be a share of the memory need" in bad.stderr
    none = subprocess.run(
        [*base, *args, "--max-memory", "1GiB"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert none.returncode == 1
    assert "nothing fits on the H100-SXM" in none.stdout


def _finder_net(ns: Any, seen: list[int], late: bool = False) -> Any:
    """A module whose ``batch_size`` its loader reads; ``seen`` gets the batch sizes it
    really trained on; with ``late``, its layers exist only after ``configure_model``."""
    from torch.utils.data import DataLoader, TensorDataset

    def layers() -> torch.nn.Module:
        return torch.nn.Sequential(
            torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)
        )

    class Net(ns.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.batch_size = 2
            self.net: torch.nn.Module | None = None if late else layers()

        def configure_model(self) -> None:
            if self.net is None:
                self.net = layers()

        def train_dataloader(self) -> DataLoader[Any]:
            data = TensorDataset(torch.randn(4096, 64), torch.randn(4096, 1))
            return DataLoader(data, batch_size=self.batch_size)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            if not isinstance(x, FakeTensor):
                seen.append(x.shape[0])
            assert self.net is not None
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Net()


@pytest.mark.parametrize("ns_name", ["lightning.pytorch", "pytorch_lightning"])
def test_the_lightning_finder_sets_the_largest_batch_size_before_training(ns_name: str) -> None:
    import importlib

    from costaware.integrations import lightning as cal

    ns = importlib.import_module(ns_name)
    Finder = (
        cal.CostAwareBatchSizeFinder
        if ns_name == "lightning.pytorch"
        else cal.PLCostAwareBatchSizeFinder
    )
    seen: list[int] = []

    finder = Finder(budget=ca.Budget(max_memory="8MiB"), device="cpu", limit=4096)
    trainer = ns.Trainer(
        accelerator="cpu", max_steps=2, callbacks=[finder], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    module = _finder_net(ns, seen)
    trainer.fit(module)
    found = finder.result
    assert found.fits and found.limited_by == "memory" and 2 < found.batch_size < 4096
    assert module.batch_size == found.batch_size == finder.optimal_batch_size
    assert seen and seen[0] == found.batch_size  # the training ran at the size found
    cpu = ca.get_device("cpu")
    # the step's need is grown by the default headroom
    need = found.prediction.min_capacity_upper * (1 + DEFAULT_HEADROOM)
    assert need + cpu.context_overhead_bytes <= 8 * 2**20
    assert found.decision.checked["headroom"] == DEFAULT_HEADROOM


def test_the_finder_and_the_callback_wait_for_a_module_built_in_configure_model() -> None:
    """A module whose layers exist only after ``configure_model``: the finder sets the
    batch size once they do, and the callback after it judges the size set."""
    import lightning.pytorch as L

    from costaware.integrations.lightning import CostAwareBatchSizeFinder, CostAwareCallback

    finder = CostAwareBatchSizeFinder(budget=ca.Budget(max_memory="8MiB"), device="cpu")
    judge = CostAwareCallback(budget=ca.Budget(max_memory="8MiB"), device="cpu")
    trainer = L.Trainer(
        accelerator="cpu", max_steps=1, callbacks=[finder, judge], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    module = _finder_net(L, [], late=True)
    trainer.fit(module)
    assert finder.result.fits and module.batch_size == finder.result.batch_size > 2
    assert judge.decision.admit and judge.prediction.spec["batch_size"] == module.batch_size


def test_the_finder_takes_the_budget_the_fit_is_judged_against(tmp_path: Any) -> None:
    """``CostAwareBatchSizeFinder()`` beside ``CostAwareCallback(trial=trial)`` in a study
    whose ``CostAwarePruner`` has a budget: the finder sets the largest size that budget
    admits, so the callback admits the trial (a finder that searched the device's memory
    set a size every trial was then pruned for). Without a budget it stops at the samples
    an epoch has: a larger batch never occurs."""
    import lightning.pytorch as L
    import optuna

    from costaware.integrations.lightning import CostAwareBatchSizeFinder, CostAwareCallback
    from costaware.integrations.optuna import CostAwarePruner

    def fit(callbacks: list[Any]) -> Any:
        module = _finder_net(L, [])
        L.Trainer(
            accelerator="cpu", max_steps=1, callbacks=callbacks, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        ).fit(module)  # fmt: skip
        return module

    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path}/s.db",
        pruner=CostAwarePruner(budget=ca.Budget(max_memory="8MiB"), device="cpu"),
    )
    finders: list[Any] = []

    def objective(trial: optuna.Trial) -> float:
        finders.append(CostAwareBatchSizeFinder(device="cpu"))
        fit([finders[-1], CostAwareCallback(trial=trial, device="cpu")])
        return 0.0

    study.optimize(objective, n_trials=1)
    (trial,) = study.trials
    assert trial.state == optuna.trial.TrialState.COMPLETE  # admitted at the size set
    found = finders[0].result
    assert found.fits and found.limited_by == "memory" and 2 < found.batch_size < 4096
    alone = CostAwareBatchSizeFinder(device="cpu")
    assert fit([alone]).batch_size == alone.result.batch_size == 4096  # the epoch's samples


def test_the_lightning_finder_refuses_when_nothing_fits_or_no_attribute() -> None:
    import lightning.pytorch as L

    from costaware.integrations.lightning import CostAwareBatchSizeFinder

    class Net(L.LightningModule):  # type: ignore[misc]
        def __init__(self, with_attr: bool) -> None:
            super().__init__()
            if with_attr:
                self.batch_size = 4
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 4096), torch.nn.Linear(4096, 1))

        def train_dataloader(self) -> Any:
            from torch.utils.data import DataLoader, TensorDataset

            return DataLoader(TensorDataset(torch.randn(16, 64), torch.randn(16, 1)), batch_size=4)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def fit(module: Any, finder: Any) -> None:
        L.Trainer(
            accelerator="cpu", max_steps=1, callbacks=[finder], logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        ).fit(module)  # fmt: skip

    with pytest.raises(AttributeError, match="has an attribute 'batch_size'"):
        fit(Net(with_attr=False), CostAwareBatchSizeFinder(device="cpu"))
    # Lightning's own finder names the attribute batch_arg_name
    with pytest.raises(AttributeError, match="has an attribute 'bs'"):
        fit(Net(with_attr=True), CostAwareBatchSizeFinder(device="cpu", batch_arg_name="bs"))
    with pytest.raises(ValueError, match="name two attributes"):
        CostAwareBatchSizeFinder(attr_name="size", batch_arg_name="bs")
    assert CostAwareBatchSizeFinder().optimal_batch_size is None
    with pytest.raises(ValueError, match="headroom must be a share of the memory need"):
        CostAwareBatchSizeFinder(headroom=1.5)
    with pytest.raises(ca.NothingFitsError, match="not even a batch of 1"):
        fit(
            Net(with_attr=True),
            CostAwareBatchSizeFinder(budget=ca.Budget(max_memory="64KiB"), device="cpu"),
        )
