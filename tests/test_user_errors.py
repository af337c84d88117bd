"""The user's bug fails fast, costaware's own failure fails open: one message per case.

Each of the user's mistakes that issue 41 lists (``spec_fn`` raising, a factory that needs
arguments, a class passed instead of a factory, a shape mismatch, wrong channels, a ViT
given the wrong image size, an exception in the factory or forward) fails the first trial
of a real Optuna study on SQLite, with its own message, the user's exception chained as
the cause, and nothing of torch's logging on stderr. A model that is genuinely
untraceable (a data-dependent output, a value read, an operator without a fake
implementation) or a dry run past its time limit admits the trial with a warning.
"""

from __future__ import annotations

import functools
import logging
import pickle
import re
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from optuna.trial import TrialState
from torch import nn

import costaware as ca
from costaware import zoo
from costaware.integrations.optuna import CostAwarePruner, admit
from costaware.runtime.gate import Gate

optuna.logging.set_verbosity(optuna.logging.WARNING)
BUDGET = ca.Budget(max_memory="4GiB")


# --------------------------------------------------------------------------------------
# the user's models and mistakes
# --------------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(784, width)
        self.out = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc(x.flatten(1))))


def make_mlp(width: int) -> nn.Module:
    return MLP(width)


class RGBNet(nn.Module):
    def __init__(self, in_channels: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(in_channels, 8, 3, padding=1)
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stem(x).mean((2, 3)))


class PatchViT(nn.Module):
    """A ViT that checks its input as torchvision's does (``image_size`` attribute)."""

    def __init__(self, image_size: int = 224, patch: int = 16) -> None:
        super().__init__()
        self.image_size = image_size
        self.embed = nn.Conv2d(3, 16, patch, patch)
        self.pos = nn.Parameter(torch.zeros(1, (image_size // patch) ** 2, 16))
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.shape[2]
        torch._assert(h == self.image_size, f"Wrong image height! Expected {self.image_size} but got {h}!")  # fmt: skip
        tokens = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(tokens.mean(1))


def factory_with_a_bug() -> nn.Module:
    config: dict[str, int] = {"depth": 2}
    return MLP(config["width"])


class ForwardRaises(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("this model takes token ids, not images")


class IndexesOutput(nn.Module):
    """A forward written for a dict output (a Hugging Face habit): torch's error, raised by
    the user's indexing, reaches it through costaware's torch-function mode."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))["logits"]  # type: ignore[index]


class Nonzero(nn.Module):
    """Genuinely untraceable: an output whose size depends on the values."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y[y > 0].sum().reshape(1, 1).expand(x.shape[0], 10)


class ReadsAValue(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = float(x.abs().max().item())
        return self.fc(x) / scale


@torch.library.custom_op("costaware_test::scaled", mutates_args=())
def _scaled(x: torch.Tensor) -> torch.Tensor:  # no register_fake: no fake implementation
    return x * 2


class CustomOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(_scaled(x))


class Spins(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(784, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pass
        return self.fc(x)


def _spec(model: Any, shape: tuple[int, ...] = (784,), batch_size: int = 4) -> ca.TrainingSpec:
    return ca.TrainingSpec(
        model=model, batch=ca.ImageBatch(shape, classes=10), batch_size=batch_size
    )


def spec_fn_key_error(params: dict[str, Any]) -> ca.TrainingSpec:
    return _spec(functools.partial(MLP, params["width"]), batch_size=params["batch_size"])


#: case -> (spec_fn, the error, patterns its message must match, the user's own error type)
USER_BUGS: dict[str, tuple[Callable[[dict[str, Any]], ca.TrainingSpec], type, list[str], Any]] = {
    "spec_fn raises": (
        spec_fn_key_error,
        ca.UserCodeError,
        [
            r"spec_fn raised KeyError: 'batch_size'",
            r"test_user_errors\.py:\d+",
            r"not among the parameters it was given \(width\)",
            r"suggest every parameter it reads before trial\.should_prune\(\)",
        ],
        KeyError,
    ),
    "factory needs arguments": (
        lambda p: _spec(make_mlp),
        ca.SpecError,
        [
            r"TrainingSpec\(model=make_mlp\) is called with no arguments",
            r"make_mlp\(\) needs `width`",
            r"model=lambda: make_mlp\(width=\.\.\.\)",
            r"functools\.partial\(make_mlp, width=\.\.\.\)",
        ],
        None,
    ),
    "class instead of a factory": (
        lambda p: _spec(MLP),
        ca.SpecError,
        [
            r"TrainingSpec\(model=MLP\) passes the class MLP",
            r"MLP\(\) needs `width`",
            r"model=lambda: MLP\(width=\.\.\.\)",
            r"an instance, model=MLP\(width=\.\.\.\)",
        ],
        None,
    ),
    "shape mismatch": (
        lambda p: _spec(functools.partial(MLP, p["width"]), shape=(3, 32, 32)),
        ca.UserCodeError,
        [
            r"The model's forward fails on a shape mismatch",
            r"in `fc` \(Linear\(in_features=784",
            r"given an input of shape \(4, 3072\)",
            r"ImageBatch\(shape=\(3, 32, 32\), classes=10\) at batch_size=4",
            r"inputs of shape \(4, 3, 32, 32\)",
            r"A real training step fails the same way",
            r"`fc` takes in_features=784 per sample but gets 3072",
            r"build the layer with in_features=3072",
        ],
        RuntimeError,
    ),
    "wrong channels": (
        lambda p: _spec(RGBNet, shape=(1, 28, 28)),
        ca.UserCodeError,
        [
            r"shape mismatch",
            r"in `stem` \(Conv2d\(3, 8",
            r"given an input of shape \(4, 1, 28, 28\)",
            r"`stem` takes in_channels=3 but gets 1 channels",
            r"ImageBatch\(shape=\(3, 28, 28\), \.\.\.\)",
            r"build the layer with in_channels=1",
        ],
        RuntimeError,
    ),
    "vit image size": (
        lambda p: _spec(PatchViT, shape=(3, 32, 32)),
        ca.UserCodeError,
        [
            r"shape mismatch",
            r"Wrong image height! Expected 224 but got 32",
            r"the model was built for image_size=224 but the batch's images are 32x32",
            r"ImageBatch\(shape=\(3, 224, 224\), \.\.\.\)",
            r"build the model with image_size=32",
        ],
        AssertionError,
    ),
    "zoo vit image size": (
        lambda p: _spec(
            functools.partial(zoo.vit, image_size=224, dim=32, depth=1, heads=2, classes=10),
            shape=(3, 32, 32),
        ),
        ca.UserCodeError,
        [
            r"shape mismatch",
            r"zoo/\S+\.py:\d+",
            r"in the model \(ViT, given an input of shape "
            r"\(4, 3, 32, 32\)\)",
            r"broadcast",
            r"the shape the model was built for",
        ],
        RuntimeError,
    ),
    "factory raises": (
        lambda p: _spec(factory_with_a_bug),
        ca.UserCodeError,
        [
            r"the model factory factory_with_a_bug raised KeyError: 'width'",
            r"test_user_errors\.py:\d+ \(`return MLP\(config\[\"width\"\]\)`\)",
            r"fails the same way when built for real",
            r"Fix the factory",
        ],
        KeyError,
    ),
    "forward raises": (
        lambda p: _spec(ForwardRaises),
        ca.UserCodeError,
        [
            r"The model's forward raised ValueError: this model takes token ids, not images",
            r"`raise ValueError\(",
            r"A real training step runs the same code",
        ],
        ValueError,
    ),
    "forward indexes a tensor as a dict": (
        lambda p: _spec(IndexesOutput),
        ca.UserCodeError,
        [
            r"The model's forward raised IndexError: too many indices",
            r"test_user_errors\.py:\d+ \(`return self\.fc\(x\.flatten\(1\)\)\[\"logits\"\]",
            r"A real training step runs the same code",
        ],
        IndexError,
    ),
}


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


@pytest.fixture
def torch_log() -> Any:
    """What torch's fake-tensor logger hands its handlers (stderr, by default)."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    keep = _Keep()
    logger.addHandler(keep)
    yield keep.seen
    logger.removeHandler(keep)


def objective(trial: optuna.Trial) -> float:
    trial.suggest_categorical("width", [16, 32])
    if trial.should_prune():
        raise optuna.TrialPruned()
    return 1.0


def _study(tmp_path: Path, pruner: Any = None) -> optuna.Study:
    return optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", pruner=pruner)


def _check_message(error: BaseException, patterns: list[str], cause: Any) -> None:
    message = str(error)
    for pattern in patterns:
        assert re.search(pattern, message), f"{pattern!r} not in {message!r}"
    assert "data-dependent" not in message  # the one misleading message is gone
    if cause is not None:
        assert isinstance(error.__cause__, cause)  # the user's own error, traceback intact
        frames = traceback.extract_tb(error.__cause__.__traceback__)
        files = {f.filename for f in frames}  # through the user's code or the zoo's
        zoo_dir = Path(zoo.__file__).parent
        assert __file__ in files or any(Path(f).parent == zoo_dir for f in files)


# --------------------------------------------------------------------------------------
# the user's bug fails the first trial
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", list(USER_BUGS))
def test_the_users_bug_fails_the_first_trial_with_its_own_message(
    case: str, tmp_path: Path, torch_log: list[str]
) -> None:
    spec_fn, error, patterns, cause = USER_BUGS[case]
    study = _study(
        tmp_path, CostAwarePruner(spec_fn=spec_fn, budget=BUDGET, device="T4", refit_every=None)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", ca.CostAwareWarning)  # never admitted with a warning
        with pytest.raises(error) as info:
            study.optimize(objective, n_trials=5)
    assert [t.state for t in study.trials] == [TrialState.FAIL]  # the study stopped on trial 0
    _check_message(info.value, patterns, cause)
    assert torch_log == []


@pytest.mark.parametrize("case", [c for c in USER_BUGS if c != "spec_fn raises"])
def test_admit_raises_the_users_bug(case: str, tmp_path: Path) -> None:
    spec_fn, error, patterns, cause = USER_BUGS[case]

    def objective(trial: optuna.Trial) -> float:
        spec = spec_fn({"width": trial.suggest_categorical("width", [16])})
        admit(trial, spec, BUDGET, device="T4")
        return 1.0

    study = _study(tmp_path)
    with pytest.raises(error) as info:
        study.optimize(objective, n_trials=3)
    assert [t.state for t in study.trials] == [TrialState.FAIL]
    _check_message(info.value, patterns, cause)


def test_a_study_that_catches_the_error_fails_each_trial_visibly(tmp_path: Path) -> None:
    pruner = CostAwarePruner(
        spec_fn=spec_fn_key_error, budget=BUDGET, device="T4", refit_every=None
    )
    study = _study(tmp_path, pruner)
    study.optimize(objective, n_trials=2, catch=(ca.UserCodeError,))
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.FAIL]
    assert all("costaware:admit" not in t.user_attrs for t in study.trials)  # never admitted


def test_a_spec_fn_that_returns_something_else_is_a_spec_error(tmp_path: Path) -> None:
    pruner = CostAwarePruner(spec_fn=lambda p: MLP(8), budget=BUDGET, device="T4", refit_every=None)
    with pytest.raises(ca.SpecError, match=r"spec_fn must return a costaware\.TrainingSpec"):
        _study(tmp_path, pruner).optimize(objective, n_trials=1)


# --------------------------------------------------------------------------------------
# costaware's own failure admits the trial
# --------------------------------------------------------------------------------------
OURS = {
    "data-dependent output": (Nonzero, r"the operator aten\.nonzero .*size depends on the values"),
    "value read": (ReadsAValue, r"reads a tensor's value .*\.item\(\)"),
    "no fake implementation": (CustomOp, r"has no fake \(meta\) implementation"),
}


@pytest.mark.parametrize("case", list(OURS))
def test_an_untraceable_model_fails_open_with_its_own_message(
    case: str, tmp_path: Path, torch_log: list[str]
) -> None:
    model, pattern = OURS[case]
    pruner = CostAwarePruner(
        spec_fn=lambda p: _spec(model), budget=BUDGET, device="T4", refit_every=None
    )
    study = _study(tmp_path, pruner)
    with pytest.warns(ca.CostAwareWarning, match="UntraceableModelError") as caught:
        study.optimize(objective, n_trials=1)
    t = study.trials[0]
    assert t.state == TrialState.COMPLETE and t.user_attrs["costaware:admit"] is True
    reason = t.user_attrs["costaware:error"]
    assert re.search(pattern, reason), reason
    assert "The model cannot run on fake tensors" in reason
    assert "limit of costaware's dry run, not a bug in the model" in reason
    assert len([w for w in caught if issubclass(w.category, ca.CostAwareWarning)]) == 1
    assert torch_log == []


def test_fail_closed_rejects_an_untraceable_model_but_still_raises_the_users_bug(
    tmp_path: Path,
) -> None:
    pruner = CostAwarePruner(
        spec_fn=lambda p: _spec(Nonzero),
        budget=BUDGET,
        device="T4",
        refit_every=None,
        fail_open=False,
    )
    study = _study(tmp_path, pruner)
    with pytest.warns(ca.CostAwareWarning, match="rejecting it"):
        study.optimize(objective, n_trials=1)
    assert study.trials[0].state == TrialState.PRUNED
    closed = CostAwarePruner(spec_fn=spec_fn_key_error, budget=BUDGET, device="T4", fail_open=False)
    (tmp_path / "closed").mkdir()
    with pytest.raises(ca.UserCodeError):
        _study(tmp_path / "closed", closed).optimize(objective, n_trials=1)


def test_a_dry_run_timeout_admits_the_trial(tmp_path: Path) -> None:
    pruner = CostAwarePruner(
        spec_fn=lambda p: _spec(Spins), budget=BUDGET, device="T4", refit_every=None,
        model=ca.CostModel(trace_timeout=0.5),
    )  # fmt: skip
    study = _study(tmp_path, pruner)
    with pytest.warns(ca.CostAwareWarning, match="TraceTimeout"):
        study.optimize(objective, n_trials=1)
    assert study.trials[0].state == TrialState.COMPLETE
    assert "time limit" in study.trials[0].user_attrs["costaware:error"]


def test_an_internal_error_of_costaware_fails_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in costaware's own dry run (here its table of memory categories is missing,
    so its bookkeeping raises KeyError) is costaware's: the trial is admitted, and the
    reason says whose bug it is."""
    from costaware.core.trace import step

    monkeypatch.setattr(step, "_CAT_CODE", {})
    gate = Gate(BUDGET, device="T4", model=ca.CostModel())
    with pytest.warns(ca.CostAwareWarning, match="could not judge trial 3"):
        verdict = gate.judge(_spec(functools.partial(MLP, 8)), study=None, trial=3)
    assert verdict.admit
    assert re.search(r"inside costaware at step\.py:\d+: KeyError", verdict.info["error"])
    assert "costaware's bug, not the model's" in verdict.info["error"]


def test_a_torch_error_in_costaware_s_preparation_is_costaware_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error raised inside torch, called by costaware's own preparation of the step
    (no model, loss, optimizer or user code running), is costaware's failure, named at
    costaware's line, and fails open: not a user's bug that "a real step hits too"."""
    from costaware.core.trace import step

    # torch's Python code raises when costaware hands it the model
    monkeypatch.setattr(step, "_to_fake", torch.nn.utils.vector_to_parameters)
    gate = Gate(BUDGET, device="T4", model=ca.CostModel())
    with pytest.warns(ca.CostAwareWarning, match="could not judge trial 4"):
        verdict = gate.judge(_spec(functools.partial(MLP, 8)), study=None, trial=4)
    assert verdict.admit
    assert re.search(r"inside costaware at step\.py:\d+: TypeError", verdict.info["error"])


# --------------------------------------------------------------------------------------
# nothing floods stderr, and the user's logging stays theirs
# --------------------------------------------------------------------------------------
def test_the_dry_run_leaves_the_users_logging_as_it_was(torch_log: list[str]) -> None:
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    filters, level, handlers = list(logger.filters), logger.level, list(logger.handlers)
    with pytest.raises(ca.UserCodeError):
        ca.dry_run(USER_BUGS["shape mismatch"][0]({"width": 8}))
    assert torch_log == []  # torch's "failed while attempting to run meta" traceback
    assert (logger.filters, logger.level, logger.handlers) == (filters, level, handlers)
    logger.error("the user's own record")  # logged as before, once the dry run is over
    assert torch_log == ["the user's own record"]


def test_a_study_of_one_model_costaware_cannot_judge_warns_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every trial of a model costaware cannot dry-run fails the same way: the first one
    warns, the others are admitted with the reason recorded and no warning each."""
    from costaware.core.trace import step

    monkeypatch.setattr(step, "_CAT_CODE", {})
    gate = Gate(BUDGET, device="T4", model=ca.CostModel())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        verdicts = [
            gate.judge(_spec(functools.partial(MLP, w)), study=None, trial=t)
            for t, w in enumerate((8, 16, 32))
        ]
    said = [str(w.message) for w in caught if "could not judge" in str(w.message)]
    assert len(said) == 1 and said[0].startswith("costaware could not judge trial 0")
    assert "without another warning" in said[0]
    assert all(v.admit and "KeyError" in v.info["error"] for v in verdicts)


def test_only_the_dry_runs_thread_is_silenced() -> None:
    """While one thread is inside a dry run, another thread's torch log records pass."""
    from costaware.core.trace import _quiet_torch_logs

    logger = logging.getLogger("torch._subclasses.fake_tensor")
    handler = _Keep()
    seen = handler.seen
    logger.addHandler(handler)
    inside, done = threading.Event(), threading.Event()

    def dry_run_thread() -> None:
        with _quiet_torch_logs():
            logger.error("from the dry run")
            inside.set()
            done.wait(30)

    worker = threading.Thread(target=dry_run_thread)
    try:
        worker.start()
        assert inside.wait(30)
        logger.error("from another thread")
        done.set()
        worker.join(30)
    finally:
        logger.removeHandler(handler)
    assert seen == ["from another thread"]
    assert logger.filters == []  # the filter is gone once no dry run runs


# --------------------------------------------------------------------------------------
# Ray Tune's searcher and Lightning's callback take the same path
# --------------------------------------------------------------------------------------
def test_ray_searcher_raises_the_users_bug_and_admits_on_ours() -> None:
    pytest.importorskip("ray")
    from ray.tune.search.optuna import OptunaSearch

    from costaware.integrations.ray import CostAwareSearcher

    space = {"width": optuna.distributions.CategoricalDistribution([16])}

    def make(spec_fn: Callable[[dict[str, Any]], ca.TrainingSpec]) -> CostAwareSearcher:
        return CostAwareSearcher(
            OptunaSearch(space=space, metric="loss", mode="min", seed=0), spec_fn=spec_fn, budget=BUDGET,
            device="T4", refit_every=None,
        )  # fmt: skip

    with pytest.raises(ca.UserCodeError) as info:
        make(spec_fn_key_error).suggest("t0")
    assert "the searcher suggests the searched parameters alone" in str(info.value)
    with pytest.raises(ca.UserCodeError, match="shape mismatch"):
        make(USER_BUGS["shape mismatch"][0]).suggest("t0")
    with pytest.warns(ca.CostAwareWarning, match="UntraceableModelError"):
        assert make(lambda p: _spec(Nonzero)).suggest("t0") == {"width": 16}


@pytest.mark.parametrize("namespace", ["lightning", "pytorch_lightning"])
def test_lightning_callback_raises_the_users_bug_before_the_first_batch(namespace: str) -> None:
    import importlib

    from costaware.integrations import lightning as cal

    ns = importlib.import_module("lightning.pytorch" if namespace == "lightning" else namespace)
    callback_cls = cal.CostAwareCallback if namespace == "lightning" else cal.PLCostAwareCallback
    steps: list[int] = []

    class Module(ns.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = MLP(8)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            steps.append(batch_idx)
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(8, 784), torch.randint(0, 10, (8,))),
        batch_size=4,
    )

    def fit(spec: ca.TrainingSpec) -> None:
        trainer = ns.Trainer(
            accelerator="cpu", max_epochs=1, callbacks=[callback_cls(spec=spec, device="cpu")],
            logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(Module(), data)

    with pytest.raises(ca.UserCodeError, match=r"in `fc` \(Linear\(in_features=784"):
        fit(USER_BUGS["shape mismatch"][0]({"width": 8}))
    assert steps == []  # before the first batch
    with pytest.warns(ca.CostAwareWarning, match="could not predict"):
        fit(_spec(Nonzero))  # costaware's own failure: training goes on
    assert steps == [0, 1]


def test_a_functional_torchmetrics_call_that_cannot_run_says_what_can() -> None:
    """A functional metric on values (an AUROC sorts and cuts at the distinct scores)
    cannot run on fake tensors; the error says that a metric module's update is skipped
    instead."""
    import torchmetrics.functional as tmf

    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        out = model(x)
        tmf.classification.binary_auroc(out[:, 0].sigmoid(), (y > 4).long())
        return nn.functional.cross_entropy(out, y)

    spec = ca.TrainingSpec(
        model=functools.partial(nn.Linear, 8, 10), batch=ca.ImageBatch((8,), classes=10),
        batch_size=4, loss=loss,
    )  # fmt: skip
    with pytest.raises(ca.UntraceableModelError, match="fake tensors") as info:
        ca.dry_run(spec)
    assert "It is a torchmetrics computation: the dry run skips a metric module's update" in str(
        info.value
    )


def test_a_count_of_classes_with_minlength_takes_that_many_bins() -> None:
    """``bincount(labels, minlength=C)`` (class weights, a confusion matrix) has C bins
    for labels below C, as a dry run's labels are; without a minlength its size is the
    values', and the dry run says it cannot know it."""
    import torchmetrics.functional as tmf

    def weighted(model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        out = model(x)
        counts = torch.bincount(y, minlength=10)
        assert counts.shape == (10,) and counts.dtype == torch.int64
        weights = torch.bincount(y, torch.ones(y.shape, dtype=torch.float32), 10)
        assert weights.shape == (10,) and weights.dtype == torch.float32
        tmf.classification.multiclass_confusion_matrix(out, y, num_classes=10)
        return nn.functional.cross_entropy(out, y, weight=1.0 / counts.clamp(min=1).float())

    def unbounded(model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return model(x).sum() + torch.bincount(y).sum()

    def spec(loss: Callable[[nn.Module, Any], torch.Tensor]) -> ca.TrainingSpec:
        return ca.TrainingSpec(
            model=functools.partial(nn.Linear, 8, 10), batch=ca.ImageBatch((8,), classes=10),
            batch_size=4, loss=loss,
        )  # fmt: skip

    assert ca.dry_run(spec(weighted)).peak_live > 0
    with pytest.raises(ca.UntraceableModelError, match=r"aten\.bincount .*minlength=n"):
        ca.dry_run(spec(unbounded))


class _NeedsTwo(Exception):
    def __init__(self, code: int, where: str) -> None:
        super().__init__(f"{code} at {where}")


def _factory_raising(error: Exception) -> Callable[[], nn.Module]:
    def factory() -> nn.Module:
        raise error

    return factory


@pytest.mark.parametrize(
    "error", [KeyError("width"), ValueError("bad width"), _NeedsTwo(3, "here"), OSError(2, "gone")]
)
def test_the_users_error_is_caught_as_its_own_type(error: Exception) -> None:
    """``except ValueError`` (Optuna's ``catch=``) catches the user's ValueError although
    costaware raised it as a UserCodeError that says where and what to change."""
    spec = ca.TrainingSpec(
        model=_factory_raising(error), batch=ca.ImageBatch((3, 8, 8), classes=2), batch_size=2
    )
    with pytest.raises(ca.UserCodeError) as raised:
        ca.CostModel.default().predict(spec, device="cpu")
    got = raised.value
    assert isinstance(got, type(error)) and got.__cause__ is error
    assert type(got).__name__ == "UserCodeError"
    assert str(got).startswith("the model factory") and "raised" in str(got)  # not a repr
    again = pickle.loads(pickle.dumps(got))  # Ray ships errors between processes
    assert isinstance(again, ca.UserCodeError) and isinstance(again, type(error))
    assert str(again) == str(got)


def test_optunas_catch_lets_a_study_go_on_past_a_users_error_of_that_type() -> None:
    """A hyperparameter that makes the user's model fail (a kernel larger than the image)
    fails that trial with the user's RuntimeError, which ``catch=`` names, and the study
    goes on, as without costaware."""

    def spec_fn(params: dict[str, Any]) -> ca.TrainingSpec:
        return ca.TrainingSpec(
            model=lambda: nn.Sequential(
                nn.Conv2d(3, 4, params["k"]), nn.Flatten(), nn.LazyLinear(2)
            ),
            batch=ca.ImageBatch((3, 8, 8), classes=2),
            batch_size=2,
        )

    study = optuna.create_study(
        pruner=CostAwarePruner(spec_fn=spec_fn, device="cpu"),
        sampler=optuna.samplers.GridSampler({"k": [3, 11]}),
    )

    def objective(trial: optuna.Trial) -> float:
        trial.suggest_categorical("k", [3, 11])
        if trial.should_prune():
            raise optuna.TrialPruned()
        return 1.0

    study.optimize(objective, n_trials=2, catch=(RuntimeError,))
    states = {t.params["k"]: t.state for t in study.trials}
    assert states == {3: TrialState.COMPLETE, 11: TrialState.FAIL}


def test_a_batch_function_is_blamed_for_its_own_error_and_must_take_the_batch_size() -> None:
    class ShardMissing(Exception):
        pass

    def missing_shard(batch_size: int) -> Any:
        raise ShardMissing("dataset shard /data/x missing")

    def takes_nothing() -> Any:
        return torch.randn(4, 10)

    def mlp() -> nn.Module:
        return nn.Sequential(nn.Linear(10, 8), nn.ReLU(), nn.Linear(8, 2))

    spec = ca.TrainingSpec(model=mlp, batch=missing_shard, batch_size=4)
    with pytest.raises(ca.UserCodeError, match="The batch function raised ShardMissing") as got:
        ca.CostModel.default().predict(spec, device="cpu")
    assert isinstance(got.value, ShardMissing) and "loss" not in str(got.value).split(":")[0]
    with pytest.raises(ca.SpecError, match=r"batch=.*takes_nothing is called with the batch size"):
        ca.TrainingSpec(model=mlp, batch=takes_nothing, batch_size=4)


def test_a_dict_batch_the_default_loss_cannot_feed_says_how_it_called_the_model() -> None:
    """The default loss calls ``model(**batch)`` with a dict; a training loop that calls
    ``model(batch["x"])`` does not fail, so the message says to pass the loss, and shows
    the example batch's shapes rather than an internal name."""
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    batch = {"x": torch.randn(32, 16), "labels": torch.randint(0, 4, (32,))}
    spec = ca.TrainingSpec.from_module(model, batch)
    with pytest.raises(ca.UserCodeError) as got:
        ca.CostModel.default().predict(spec, device="cpu")
    said = str(got.value)
    assert "costaware's default loss called the model (model(**batch) for a dict" in said
    assert "TrainingSpec(loss=callable(model, batch))" in said
    assert "{'x': (32, 16), 'labels': (32,)}" in said and "BatchLikeExample" not in said


def test_a_spec_fn_reading_a_missing_parameter_is_told_where_to_find_it() -> None:
    """A nested search space holds the key one level down; a flat one lacks it."""
    from costaware.runtime.gate import spec_build_error

    def spec_fn(cfg: dict[str, Any]) -> Any:
        return cfg["width"]

    for params, words in (
        ({"model": {"width": 64}, "lr": 0.1}, "read it as cfg['model']['width']"),
        ({"lr": 0.1}, "not among the parameters it was given (lr): search it"),
    ):
        try:
            spec_fn(params)
        except KeyError as e:
            said = str(spec_build_error(e, what="spec_fn", params=params, missing="search it"))
        assert words in said, said
