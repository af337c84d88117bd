"""``CostAwarePruner()`` as users write it: the spec from the training code itself.

Real Optuna studies on SQLite and real Lightning Trainers in both namespaces, on the CPU.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import optuna
import pytest
import pytorch_lightning as PL
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils.data import DataLoader, TensorDataset

import costaware as ca
from costaware.integrations.lightning import (
    CostAwareCallback,
    PLCostAwareCallback,
    spec_from_lightning,
)
from costaware.integrations.optuna import CostAwarePruner, admit, decision, pruned

NAMESPACES = {"lightning": (L, CostAwareCallback), "pytorch_lightning": (PL, PLCostAwareCallback)}
SMALL, HUGE = 16, 2_000_000  # widths: a few KiB of parameters, or hundreds of MiB with AdamW


def _module(ns: Any, width: int, calls: list[int]) -> Any:
    class Net(ns.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
            )

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            if not isinstance(x, FakeTensor):  # the dry run's steps are not training
                calls.append(batch_idx)
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return Net()


def _data() -> DataLoader[Any]:
    return DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=8)


def _trainer(ns: Any, callback: Any) -> Any:
    return ns.Trainer(
        accelerator="cpu", max_epochs=1, callbacks=[callback], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip


def _two_widths(
    tmp_path: Path, ns_name: str, build: Any
) -> tuple[optuna.Study, Any, dict[int, list[int]]]:
    """A study on SQLite with a 64 MiB budget, over a small and a huge width, and its
    objective: a fit of ``build(width, calls)`` with the namespace's callback; ``calls``
    holds the batches each width really trained on."""
    ns, Callback = NAMESPACES[ns_name]
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'study.db'}",
        pruner=CostAwarePruner(budget=ca.Budget(max_memory="64MiB")),
        sampler=optuna.samplers.BruteForceSampler(),
    )
    calls: dict[int, list[int]] = {}

    def objective(trial: optuna.Trial) -> float:
        width = trial.suggest_categorical("width", [SMALL, HUGE])
        calls[width] = []
        _trainer(ns, Callback(trial=trial)).fit(build(width, calls[width]), _data())
        return 1.0

    return study, objective, calls


@pytest.mark.parametrize("ns_name", sorted(NAMESPACES))
def test_a_zero_argument_pruner_and_the_callback_prune_before_the_first_batch(
    ns_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ns, _ = NAMESPACES[ns_name]
    study, objective, calls = _two_widths(tmp_path, ns_name, lambda w, c: _module(ns, w, c))
    with caplog.at_level(logging.INFO, logger="optuna"):
        study.optimize(objective, n_trials=2)
    by_width = {t.params["width"]: t for t in study.trials}
    assert by_width[SMALL].state == optuna.trial.TrialState.COMPLETE
    assert by_width[HUGE].state == optuna.trial.TrialState.PRUNED  # PRUNED, not FAIL
    assert calls[SMALL] and calls[HUGE] == []  # rejected before its first batch
    reasons = by_width[HUGE].user_attrs["costaware:reasons"]
    assert reasons and "exceeds the 64.0 MiB budget" in reasons[0]
    assert by_width[SMALL].user_attrs["costaware:admit"] is True
    # Optuna's own log line says why
    pruned_line = [r.getMessage() for r in caplog.records if "pruned" in r.getMessage()]
    assert any("exceeds the 64.0 MiB budget" in line for line in pruned_line)


def test_lightning_alone_rejects_before_the_first_batch() -> None:
    calls: list[int] = []
    callback = CostAwareCallback(budget=ca.Budget(max_memory="64MiB"), enforce=True)
    with pytest.raises(ca.TrialRejected, match=r"exceeds the 64\.0 MiB budget") as info:
        _trainer(L, callback).fit(_module(L, HUGE, calls), _data())
    assert calls == []
    assert info.value.reasons and callback.decision is not None and not callback.decision.admit
    assert callback.prediction is not None
    assert [r["status"] for r in callback.records] == ["rejected"]  # no crash recorded


def test_on_reject_stop_ends_the_fit_cleanly_and_without_enforce_it_warns() -> None:
    calls: list[int] = []
    stop = CostAwareCallback(budget=ca.Budget(max_memory="64MiB"), enforce=True, on_reject="stop")
    with pytest.warns(ca.CostAwareWarning, match="stopping before the first batch"):
        _trainer(L, stop).fit(_module(L, HUGE, calls), _data())
    assert calls == [] and stop.stopped_reason
    loose = CostAwareCallback(budget=ca.Budget(max_memory="16MiB"))
    with pytest.warns(ca.CostAwareWarning, match="training anyway"):
        _trainer(L, loose).fit(_module(L, 200_000, calls), _data())
    assert calls  # trained


def test_a_bad_on_reject_is_refused() -> None:
    with pytest.raises(ValueError, match="on_reject must be 'raise'"):
        CostAwareCallback(on_reject="skip")


def test_the_spec_from_a_lightning_fit_matches_the_fit() -> None:
    calls: list[int] = []
    module = _module(L, 64, calls)
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=3, precision="bf16-mixed", accumulate_grad_batches=2,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    seen: dict[str, Any] = {}

    class Peek(L.Callback):  # type: ignore[misc]
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            seen["spec"] = spec_from_lightning(trainer, pl_module)

    trainer.callbacks.append(Peek())
    trainer.fit(module, _data())
    spec = seen["spec"]
    assert spec.batch_size == 8 and spec.dataset_size == 32 and spec.epochs == 3
    assert spec.precision == "bf16" and spec.grad_accumulation == 2
    assert spec.optimizer_name == "adamw" and spec.optimizer_kwargs["lr"] == 1e-3
    pred = ca.CostModel().predict(spec, "cpu")
    assert pred.peak_memory > 0
    # the module was dry-run from a meta copy: its own parameters are real, on the CPU
    assert all(p.device.type == "cpu" for p in module.parameters())


def test_the_objective_reads_the_decision_and_raises_it_with_reasons(tmp_path: Path) -> None:
    def spec_fn(params: dict[str, Any]) -> ca.TrainingSpec:
        net = torch.nn.Linear(8, params["width"])
        return ca.TrainingSpec.from_module(net, torch.randn(4, 8))

    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'study.db'}",
        pruner=CostAwarePruner(spec_fn=spec_fn, budget=ca.Budget(max_memory="32MiB")),
        sampler=optuna.samplers.BruteForceSampler(),
    )
    seen: dict[int, Any] = {}

    def objective(trial: optuna.Trial) -> float:
        width = trial.suggest_categorical("width", [SMALL, HUGE])
        if trial.should_prune():
            seen[width] = (dict(trial.user_attrs), decision(trial))
            raise pruned(trial)
        return 1.0

    study.optimize(objective, n_trials=2)
    attrs, judged = seen[HUGE]
    assert attrs["costaware:admit"] is False  # visible in the objective's own Trial
    assert judged["admit"] is False and judged["reasons"] == attrs["costaware:reasons"]
    (rejected,) = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert rejected.params["width"] == HUGE


def test_a_trial_that_trains_unjudged_is_warned_about_once_per_study() -> None:
    study = optuna.create_study(pruner=CostAwarePruner())

    def objective(trial: optuna.Trial) -> float:
        trial.report(1.0, 0)
        trial.should_prune()  # the usual habit: after the first report
        return 1.0

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study.optimize(objective, n_trials=3)
    unjudged = [w for w in caught if "before costaware judged it" in str(w.message)]
    assert len(unjudged) == 1
    assert "CostAwareCallback" in str(unjudged[0].message)


def test_admit_uses_the_study_pruners_budget_and_a_spec_from_live_objects() -> None:
    study = optuna.create_study(pruner=CostAwarePruner(budget=ca.Budget(max_memory="32MiB")))
    outcome: dict[int, str] = {}

    def objective(trial: optuna.Trial) -> float:
        width = trial.suggest_categorical("width", [SMALL, HUGE])
        net = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.Linear(width, 2))
        batch = {"x": torch.randn(4, 8), "mask": torch.ones(4, 8, dtype=torch.bool)}
        spec = ca.TrainingSpec.from_module(
            net, batch, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
            loss=lambda m, b: m(b["x"] * b["mask"]).sum(),
        )  # fmt: skip
        try:
            admit(trial, spec)
        except optuna.TrialPruned as e:
            outcome[width] = str(e)
            raise
        outcome[width] = "admitted"
        return 1.0

    # both widths, whatever the sampler draws (four random draws miss one in 1 of 8 runs)
    study.enqueue_trial({"width": SMALL})
    study.enqueue_trial({"width": HUGE})
    study.optimize(objective, n_trials=4)
    assert outcome[SMALL] == "admitted"
    assert "exceeds the 32.0 MiB budget" in outcome[HUGE]


def test_a_pruner_given_first_is_the_wrapped_one() -> None:
    median = optuna.pruners.MedianPruner()
    pruner = CostAwarePruner(median, budget=ca.Budget(max_memory="1GiB"))
    assert pruner._wrapped is median
    with pytest.raises(TypeError, match="got wrapped twice: give it once"):
        CostAwarePruner(median, wrapped=median)


def test_measurements_are_recorded_as_the_device_the_fit_ran_on(tmp_path: Path) -> None:
    calls: list[int] = []
    store = ca.ObservationStore(f"sqlite:///{tmp_path / 'runs.db'}")
    callback = CostAwareCallback(store=store, study="s", trial=0, device="A10", spec=ca.TrainingSpec.from_module(
        torch.nn.Linear(8, 1), (torch.randn(8, 8), torch.randn(8, 1)),
        loss=lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]),
    ))  # fmt: skip
    with pytest.warns(ca.CostAwareWarning, match="predicts for A10-24GB|predicts for A10"):
        _trainer(L, callback).fit(_module(L, SMALL, calls), _data())
    (prediction,) = [r for r in callback.records if r["kind"] == "prediction"]
    assert prediction["device"] == "A10"  # what it was predicted for
    measured = {r["device"] for r in callback.records if r["kind"] == "measurement"}
    assert measured == {"CPU"}  # what it ran on
    # the refit does not learn an A10 prediction's features against a CPU's measurements
    with pytest.warns(ca.CostAwareWarning, match="was predicted for A10 but ran on CPU"):
        assert store.observations() == []


@pytest.mark.parametrize("ns_name", list(NAMESPACES))
def test_a_fit_judged_before_training_is_learned_from(ns_name: str, tmp_path: Path) -> None:
    """The decision made in setup is recorded with the features the online refit reads,
    so a judged and measured fit is an observation of the store."""
    ns, callback_cls = NAMESPACES[ns_name]
    calls: list[int] = []
    store = ca.ObservationStore(f"sqlite:///{tmp_path / 'runs.db'}")
    callback = callback_cls(store=store, study="s", trial=0, budget=ca.Budget(max_memory="4GiB"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ca.CostAwareWarning)  # device='auto' on a CPU
        _trainer(ns, callback).fit(_module(ns, SMALL, calls), _data())
    assert callback.decision is not None and callback.decision.admit
    (prediction,) = store.predictions(study="s")
    assert prediction["status"] == "admitted" and prediction["features"]
    (observation,) = store.observations(study="s")
    assert observation.status == "ok" and observation.features == pytest.approx(
        prediction["features"], nan_ok=True
    )


def _spec_of(trainer: Any, loader: DataLoader[Any]) -> ca.TrainingSpec:
    """The spec read off ``trainer.fit`` of a small module on ``loader``."""
    seen: dict[str, Any] = {}

    class Peek(L.Callback):  # type: ignore[misc]
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            seen["spec"] = spec_from_lightning(trainer, pl_module)

    trainer.callbacks.append(Peek())
    trainer.fit(_module(L, SMALL, []), loader)
    return seen["spec"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("trainer_kw", "loader_kw", "epoch_steps", "trial_steps"),
    [
        ({"max_epochs": 2}, {}, 5, 10),  # 40 samples in batches of 8
        ({"max_epochs": 2}, {"drop_last": True}, 5, 10),
        ({"max_epochs": 2}, {"batch_size": 12, "drop_last": True}, 3, 6),
        ({"max_epochs": 2, "limit_train_batches": 2}, {}, 2, 4),
        ({"max_epochs": 2, "limit_train_batches": 0.5}, {}, 2, 4),  # int(5 * 0.5)
        ({"max_epochs": 3, "max_steps": 4}, {}, 5, 4),
        ({"max_epochs": 3, "max_steps": 4, "accumulate_grad_batches": 2}, {}, 5, 8),
        ({"max_epochs": -1, "max_steps": 12}, {}, 5, 12),  # epochs without end
    ],
)
def test_the_trial_is_as_long_as_the_trainer_trains(
    trainer_kw: dict[str, Any], loader_kw: dict[str, Any], epoch_steps: int, trial_steps: int
) -> None:
    """Epoch and trial length as Lightning counts them: the loader's batches (its
    ``drop_last``), ``limit_train_batches``, ``max_epochs`` and ``max_steps``."""
    loader = DataLoader(
        TensorDataset(torch.randn(40, 8), torch.randn(40, 1)), **({"batch_size": 8} | loader_kw)
    )
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, **trainer_kw,
    )  # fmt: skip
    spec = _spec_of(trainer, loader)
    assert (spec.steps_per_epoch, spec.trial_steps) == (epoch_steps, trial_steps)
    assert trainer.num_training_batches == epoch_steps  # what Lightning itself counted
    assert trainer.global_step * spec.grad_accumulation == trial_steps


@pytest.mark.parametrize(
    ("trainer_kw", "epochs", "trial_steps"),
    [({"max_time": {"seconds": 1}}, None, None), ({"max_epochs": 2, "max_time": "00:01:00:00"}, 2, 10)],
)
def test_a_trainer_stopped_by_max_time_trains_at_most_that_long(
    trainer_kw: dict[str, Any], epochs: int | None, trial_steps: int | None
) -> None:
    """``Trainer(max_time=...)`` is the spec's ``max_time``. Without ``max_epochs`` the
    Trainer has no epoch limit (not Lightning's 1000 epochs, nor one): the trial is as long
    as the time; with one, the shorter of the two."""
    loader = DataLoader(TensorDataset(torch.randn(40, 8), torch.randn(40, 1)), batch_size=8)
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, **trainer_kw,
    )  # fmt: skip
    spec = _spec_of(trainer, loader)
    duration = 1.0 if epochs is None else 3600.0
    assert (spec.epochs, spec.trial_steps, spec.max_time) == (epochs, trial_steps, duration)
    pred = ca.CostModel().predict(spec, device="H100")
    if epochs is None:
        assert pred.trial_time == pred.trial_time_upper == duration
    else:
        assert pred.trial_time == pytest.approx(pred.iteration_time * trial_steps)


def test_a_callback_without_a_store_records_into_the_study_pruners(tmp_path: Path) -> None:
    """``CostAwarePruner(store=...)`` and ``CostAwareCallback(trial=trial)``: what each
    trial cost lands in the pruner's store, where the refit and the report read it."""
    url = f"sqlite:///{tmp_path / 'costaware.db'}"
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'study.db'}", pruner=CostAwarePruner(store=url)
    )

    def objective(trial: optuna.Trial) -> float:
        callback = CostAwareCallback(trial=trial)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ca.CostAwareWarning)  # device='auto' on a CPU
            _trainer(L, callback).fit(_module(L, SMALL, []), _data())
        return 0.0

    study.optimize(objective, n_trials=2)
    store = ca.ObservationStore(url)
    assert sorted(str(r["trial"]) for r in store.predictions()) == ["0", "1"]
    assert sorted(str(r["trial"]) for r in store.measurements()) == ["0", "1"]
    assert {o.status for o in store.observations()} == {"ok"}


@pytest.mark.parametrize("ns_name", sorted(NAMESPACES))
def test_the_shortest_form_reports_how_far_off_the_predictions_were(
    ns_name: str, tmp_path: Path
) -> None:
    """``CostAwarePruner()`` and ``CostAwareCallback(trial=trial)``, no store: the callback
    keeps each trial's measurements in its user attributes, so the report of the study
    alone holds the measured figures beside the predictions, and says where they came
    from."""
    ns, Callback = NAMESPACES[ns_name]
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=storage, pruner=CostAwarePruner())

    def objective(trial: optuna.Trial) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ca.CostAwareWarning)  # device='auto' on a CPU
            trainer = _trainer(ns, Callback(trial=trial))
            trainer.fit_loop.max_epochs = 2
            trainer.fit(_module(ns, SMALL, []), _data())
        return 0.0

    study.optimize(objective, n_trials=2)
    kept = study.trials[0].user_attrs["costaware:measured"]
    assert [m["status"] for m in kept] == ["ok", "ok"] and kept[0]["actual"]["epoch_time"] > 0
    rep = ca.report(storage=storage)
    for row in rep.trials:
        assert row.measured and row.epochs_measured == 2
        assert row.actual_epoch_time is not None and row.actual_memory is not None
        assert row.pred_epoch_time is not None and row.device_kind == "cpu"
    assert rep.summary()["time_error"]["n"] == 2
    notes = " ".join(rep.notes)
    assert "those CostAwareCallback kept in the trials' user attributes" in notes
    assert "pass it with --store" not in notes


def test_torchmetrics_in_the_training_step_are_skipped_by_the_dry_run_not_by_the_fit() -> None:
    """A metric updated in ``training_step`` (as most Lightning modules do) computes on
    values a dry run lacks; its copy does nothing there, the fit is predicted, and the
    module's own metric still counts every real batch."""
    import torchmetrics

    class Net(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 3)
            self.acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3)
            self.both = torchmetrics.MetricCollection(
                [torchmetrics.classification.MulticlassPrecision(num_classes=3)]
            )

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            logits = self.net(x)
            self.log("acc", self.acc(logits, y))
            self.both.update(logits, y)
            return torch.nn.functional.cross_entropy(logits, y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Net()
    callback = CostAwareCallback(budget=ca.Budget(max_memory="4GiB"), device="cpu")
    data = DataLoader(TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,))), batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ca.CostAwareWarning)  # no prediction failed
        _trainer(L, callback).fit(module, data)
    assert callback.prediction is not None and callback.decision.admit
    assert any(
        "MulticlassAccuracy" in n and "MetricCollection" in n for n in callback.prediction.notes
    )
    assert module.acc.update_count == 4 and module.both.compute()  # the real ones ran


def test_enforce_takes_the_study_pruners_budget(tmp_path: Path) -> None:
    """``CostAwareCallback(trial=trial, enforce=True)`` enforces the budget the study's
    pruner holds; without a budget or such a study, enforce=True is refused."""
    budget = ca.Budget(max_epoch_time="10min")
    study = optuna.create_study(pruner=CostAwarePruner(budget=budget))
    trial = study.ask()
    callback = CostAwareCallback(trial=trial, enforce=True)
    assert callback.budget is None  # the study's gate still judges before training
    said = callback._over_budget({"epoch_time": 3600.0, "peak_memory": None})
    assert said is not None and "10.0 min" in said
    assert callback._over_budget({"epoch_time": 60.0, "peak_memory": None}) is None
    with pytest.raises(ValueError, match="enforce=True needs a budget"):
        CostAwareCallback(enforce=True)
    with pytest.raises(ValueError, match="enforce=True needs a budget"):
        CostAwareCallback(enforce=True, trial=optuna.create_study().ask())  # another pruner


def _built_later(ns: Any, hook: str, width: int, calls: list[int]) -> Any:
    """A module whose layers do not exist until Lightning calls its ``hook``."""

    class Late(ns.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net: torch.nn.Module | None = None

        def _build(self) -> None:
            if self.net is None:
                self.net = torch.nn.Sequential(
                    torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
                )

        def setup(self, stage: str) -> None:
            if hook == "setup":
                self._build()

        def configure_model(self) -> None:
            if hook == "configure_model":
                self._build()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            if not isinstance(x, FakeTensor):
                calls.append(batch_idx)
            assert self.net is not None
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return Late()


@pytest.mark.parametrize("hook", ["setup", "configure_model"])
@pytest.mark.parametrize("ns_name", sorted(NAMESPACES))
def test_a_module_that_builds_its_layers_in_a_hook_is_judged_once_they_exist(
    ns_name: str, hook: str, tmp_path: Path
) -> None:
    """Lightning calls the module's ``setup`` and ``configure_model`` after the callbacks'
    ``setup``: the fit is judged after them, still before its first batch."""
    ns, _ = NAMESPACES[ns_name]
    study, objective, calls = _two_widths(
        tmp_path, ns_name, lambda w, c: _built_later(ns, hook, w, c)
    )
    study.optimize(objective, n_trials=2)
    by_width = {t.params["width"]: t for t in study.trials}
    assert by_width[SMALL].state == optuna.trial.TrialState.COMPLETE
    assert by_width[SMALL].user_attrs["costaware:admit"] is True
    assert "costaware:error" not in by_width[SMALL].user_attrs  # judged, not admitted unjudged
    assert by_width[HUGE].state == optuna.trial.TrialState.PRUNED
    assert "exceeds the 64.0 MiB budget" in by_width[HUGE].user_attrs["costaware:reasons"][0]
    assert calls[SMALL] and calls[HUGE] == []


def test_a_training_step_that_skips_the_first_batch_is_admitted_as_a_limit_of_the_dry_run() -> None:
    """Lightning skips a batch whose ``training_step`` returns None; the dry run has no
    step to predict then, which is costaware's limit (fail open), not the module's bug."""

    class Skips(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
            if batch_idx == 0:
                return None
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    study = optuna.create_study(pruner=CostAwarePruner(device="cpu"))
    trial = study.ask()
    with pytest.warns(ca.CostAwareWarning, match="A limit of the dry run, not a bug in the module"):
        _trainer(L, CostAwareCallback(trial=trial)).fit(Skips(), _data())
    attrs = study.trials[0].user_attrs
    assert attrs["costaware:admit"] is True and "UntraceableModelError" in attrs["costaware:error"]


def test_a_training_step_that_logs_loss_item_and_guards_on_nan_is_judged() -> None:
    """``self.log("loss", loss.item())`` and ``if torch.isnan(loss)`` read a value the dry
    run's tensors lack; in the step's own code they are read as 0 (False) and noted, and
    the fit is judged. A value read in the model's forward still fails open."""

    class Reads(L.LightningModule):
        def __init__(self, in_forward: bool) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)
            self.in_forward = in_forward

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.in_forward and x.abs().max().item() > 100:  # a value deciding the step
                x = x / 100
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self(x), y)
            self.log("loss_value", loss.item())
            if torch.isnan(loss):
                raise FloatingPointError("the loss is NaN")
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = CostAwareCallback(budget=ca.Budget(max_memory="4GiB"), device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ca.CostAwareWarning)  # judged: no prediction failed
        _trainer(L, callback).fit(Reads(in_forward=False), _data())
    assert callback.decision.admit and callback.prediction is not None
    note = next(n for n in callback.prediction.notes if "read a tensor's value" in n)
    assert note.count("test_zero_boilerplate.py:") == 2  # the .item() and the `if`
    unjudged = CostAwareCallback(budget=ca.Budget(max_memory="4GiB"), device="cpu")
    with pytest.warns(ca.CostAwareWarning, match="reads a tensor's value"):
        _trainer(L, unjudged).fit(Reads(in_forward=True), _data())


def test_an_error_raised_in_training_step_itself_is_the_training_steps() -> None:
    class Broken(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            raise KeyError("metrics")

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = CostAwareCallback(budget=ca.Budget(max_memory="4GiB"), device="cpu")
    with pytest.raises(
        ca.UserCodeError, match="The LightningModule's training_step raised KeyError"
    ) as got:
        _trainer(L, callback).fit(Broken(), _data())
    assert isinstance(got.value, KeyError)  # the user's own type, as the fit would raise it


@pytest.mark.parametrize("ns_name", sorted(NAMESPACES))
def test_a_training_step_that_reads_its_trainer_optimizer_and_scheduler_is_judged(
    ns_name: str,
) -> None:
    """``self.trainer``, ``self.optimizers()`` and ``self.lr_schedulers()`` in
    ``training_step`` (a logged learning rate, a warm-up by epoch) work in the dry run as in
    training: the trial is predicted, not failed as the user's bug."""
    ns, callback_class = NAMESPACES[ns_name]
    seen: list[float] = []

    class Logged(ns.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Linear(64, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            lr = self.optimizers().param_groups[0]["lr"]
            seen.append(lr)
            self.log("lr", self.lr_schedulers().get_last_lr()[0])
            warm = min(1.0, (self.current_epoch + 1) / self.trainer.max_epochs)
            return torch.nn.functional.mse_loss(self.net(x), y) * warm  # type: ignore[no-any-return]

        def configure_optimizers(self) -> Any:
            opt = torch.optim.AdamW(self.parameters(), lr=3e-4)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    callback = callback_class(budget=ca.Budget(max_memory="8GiB"), device="H100", enforce=True)
    _trainer(ns, callback).fit(Logged(), _data())
    assert callback.prediction is not None and callback.decision.admit
    assert "error" not in callback.decision.info
    assert seen and set(seen) == {3e-4}  # the dry run's read, then the real steps'


@dataclasses.dataclass
class _Pair:
    x: torch.Tensor
    y: torch.Tensor


class _Opaque:  # a batch class costaware cannot see into (no dataclass, no mapping)
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y


def _pairs(items: list[tuple[torch.Tensor, torch.Tensor]]) -> _Pair:
    return _Pair(torch.stack([a for a, _ in items]), torch.stack([b for _, b in items]))


def _opaque(items: list[tuple[torch.Tensor, torch.Tensor]]) -> _Opaque:
    return _Opaque(torch.stack([a for a, _ in items]), torch.stack([b for _, b in items]))


@pytest.mark.parametrize("form", ["after_transfer", "two_loaders", "dataclass", "opaque"])
def test_the_batch_is_read_as_training_step_receives_it(form: str) -> None:
    """The dry run's batch is the one ``training_step`` gets: after the module's
    ``on_after_batch_transfer`` (uint8 images made float), one batch of each loader where
    ``fit`` was given several, or a collate function's dataclass. A batch read otherwise
    failed the fit as the user's bug. A batch costaware cannot see into is its own limit:
    the trial is admitted with a warning and trains."""
    images = TensorDataset(
        torch.randint(0, 255, (32, 3, 8, 8), dtype=torch.uint8), torch.randint(0, 4, (32,))
    )

    class Net(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 4))

        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            if form != "after_transfer":
                return batch
            x, y = batch
            return {"img": x.float() / 255, "target": y}

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if form == "after_transfer":
                x, y = batch["img"], batch["target"]
            elif form == "two_loaders":
                (x, y), (x2, _) = batch["a"], batch["b"]
                x = torch.cat([x.float(), x2.float()])[: len(y)]
            else:  # a dataclass, or the opaque batch
                x, y = batch.x, batch.y
            return torch.nn.functional.cross_entropy(self.net(x.float()), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    if form == "two_loaders":
        data: Any = {"a": DataLoader(images, batch_size=8), "b": DataLoader(images, batch_size=8)}
    elif form in ("dataclass", "opaque"):
        data = DataLoader(images, batch_size=8, collate_fn=_pairs if form == "dataclass" else _opaque)
    else:
        data = DataLoader(images, batch_size=8)
    callback = CostAwareCallback(budget=ca.Budget(max_memory="8GiB"), device="H100", enforce=True)
    if form == "opaque":
        with pytest.warns(ca.CostAwareWarning, match="cannot read the training batch"):
            _trainer(L, callback).fit(Net(), data)
        assert callback.decision.admit and callback.prediction is None
        return
    _trainer(L, callback).fit(Net(), data)
    assert callback.decision.admit and "error" not in callback.decision.info
    assert callback.prediction is not None and callback.prediction.spec["batch_size"] == 8


def test_a_lazy_module_is_measured_without_a_warning() -> None:
    """A module of lazy layers has no shaped parameters until its first batch: the
    callback's measurement starts without them, not with a failure."""

    class Lazy(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.LazyLinear(16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)  # type: ignore[no-any-return]

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = CostAwareCallback(budget=ca.Budget(max_memory="8GiB"), device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(L, callback).fit(Lazy(), _data())
    ours = [str(w.message) for w in caught if issubclass(w.category, ca.CostAwareWarning)]
    assert not [m for m in ours if "failed" in m], ours
    assert callback.records and callback.prediction is not None


def test_a_module_without_an_optimizer_is_predicted_without_optimizer_state() -> None:
    """``configure_optimizers`` returning None: Lightning trains with no optimizer, so
    the step holds no optimizer state (SGD without momentum), not AdamW's two copies."""
    seen: dict[str, Any] = {}

    class NoOpt(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def setup(self, stage: str) -> None:
            seen["spec"] = spec_from_lightning(self.trainer, self)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)  # type: ignore[no-any-return]

        def configure_optimizers(self) -> None:
            return None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's own "no optimizer" warning
        _trainer(L, CostAwareCallback(device="cpu")).fit(NoOpt(), _data())
    assert seen["spec"].optimizer_name == "sgd" and seen["spec"].optimizer_state_per_param == 0


def test_a_store_the_callback_cannot_write_keeps_the_measurements_in_the_trial(
    tmp_path: Path,
) -> None:
    """The store's server is down (nothing listens on its port): the training goes on,
    and each trial's measurements are kept in its user attributes, where the report of
    the study finds them, where they were lost to the report."""
    down = "postgresql+psycopg://costaware:x@127.0.0.1:9/costaware"
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=storage)

    def objective(trial: optuna.Trial) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ca.CostAwareWarning)
            _trainer(L, CostAwareCallback(trial=trial, store=down)).fit(_module(L, SMALL, []), _data())
        return 0.0

    study.optimize(objective, n_trials=1)
    (trial,) = study.trials
    assert [m["status"] for m in trial.user_attrs["costaware:measured"]] == ["ok"]
    (row,) = ca.report(storage=storage).trials
    assert row.measured and row.actual_epoch_time is not None
