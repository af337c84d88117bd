"""The Optuna pruner and objective helper, against real Optuna studies."""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import os
import re
import shutil
import warnings
from collections import OrderedDict
from importlib import resources
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from optuna.trial import TrialState
from torch import nn

import costaware as ca
from costaware import zoo
from costaware.devices import UnknownDeviceError
from costaware.integrations.optuna import (
    SPENT_STREAK_LIMIT,
    CostAwareHyperbandPruner,
    CostAwarePruner,
    CostAwareWarning,
    admit,
    pruned,
)
from costaware.runtime.store import ObservationStore

optuna.logging.set_verbosity(optuna.logging.WARNING)
BUDGET = ca.Budget(max_memory="1.25GiB", max_epoch_time="1h")


def spec_fn(params: dict[str, Any]) -> ca.TrainingSpec:
    return ca.TrainingSpec(
        model=functools.partial(zoo.mlp, 784, (params["width"], params["width"]), 10),
        batch=ca.ImageBatch((784,), classes=10),
        batch_size=params["batch_size"],
        optimizer="adam",
        dataset_size=10_000,
    )


def objective(trial: optuna.Trial) -> float:
    width = trial.suggest_categorical("width", [64, 4096, 8192])
    bs = trial.suggest_categorical("batch_size", [16, 256])
    if trial.should_prune():
        raise optuna.TrialPruned()
    return float(width) / 1000 + bs / 1000


def _run(study: optuna.Study, n: int = 10) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.optimize(objective, n_trials=n)


def test_pruner_rejects_over_budget_trials_before_they_run() -> None:
    # "T4" device: 0.5 GiB context; an 8192-wide Adam MLP needs ~1.6 GiB of parameter state
    pruner = CostAwarePruner(spec_fn=spec_fn, budget=BUDGET, device="T4", refit_every=None)
    study = optuna.create_study(
        pruner=pruner,
        sampler=optuna.samplers.GridSampler({"width": [64, 4096, 8192], "batch_size": [16, 256]}),
    )
    _run(study, 6)
    by_width: dict[int, set[TrialState]] = {}
    for t in study.trials:
        by_width.setdefault(t.params["width"], set()).add(t.state)
        attrs = t.user_attrs
        assert attrs["costaware:device"] == "T4"
        assert attrs["costaware:peak_memory_upper"] >= attrs["costaware:peak_memory"] > 0
        assert set(t.constraints) == {"costaware_memory", "costaware_time"}  # on every trial
        if t.state == TrialState.PRUNED:
            assert attrs["costaware:admit"] is False
            assert "exceeds the 1.25 GiB budget" in attrs["costaware:reasons"][0]
            assert t.constraints["costaware_memory"] > 0
        else:
            assert attrs["costaware:admit"] is True and attrs["costaware:reasons"] == []
            assert t.constraints["costaware_memory"] <= 0
    assert by_width[64] == {TrialState.COMPLETE}
    assert by_width[8192] == {TrialState.PRUNED}
    # best_trial respects feasibility
    assert study.best_trial.params["width"] != 8192


def test_second_early_call_reuses_the_decision_and_later_steps_delegate() -> None:
    calls = []

    def spec_counting(params: dict[str, Any]) -> ca.TrainingSpec:
        calls.append(params)
        return spec_fn(params)

    pruner = CostAwarePruner(
        spec_fn=spec_counting,
        budget=BUDGET,
        device="T4",
        wrapped=optuna.pruners.ThresholdPruner(upper=1.0),
        refit_every=None,
    )
    study = optuna.create_study(pruner=pruner)
    trial = study.ask(
        {
            "width": optuna.distributions.CategoricalDistribution([64]),
            "batch_size": optuna.distributions.CategoricalDistribution([16]),
        }
    )
    assert trial.should_prune() is False
    assert trial.should_prune() is False
    assert len(calls) == 1
    trial.report(5.0, step=0)  # above the wrapped ThresholdPruner's upper bound
    assert trial.should_prune() is True


@pytest.mark.parametrize("fail_open", [True, False])
def test_costawares_own_failure_in_spec_fn_never_crashes_the_study(fail_open: bool) -> None:
    def broken(params: dict[str, Any]) -> ca.TrainingSpec:  # the user's bug: test_user_errors
        raise ca.TraceTimeout("the dry run took longer than its time limit of 60 s")

    study = optuna.create_study(
        pruner=CostAwarePruner(spec_fn=broken, budget=BUDGET, device="T4", fail_open=fail_open)
    )
    with pytest.warns(CostAwareWarning, match="could not judge trial 0"):
        _run(study, 1)
    t = study.trials[0]
    assert t.state == (TrialState.COMPLETE if fail_open else TrialState.PRUNED)
    assert "TraceTimeout" in t.user_attrs["costaware:error"]
    assert set(t.constraints) == {"costaware_memory", "costaware_time"}


def test_an_untraceable_model_fails_open() -> None:
    def untraceable(params: dict[str, Any]) -> ca.TrainingSpec:
        return ca.TrainingSpec(
            model=_data_dependent, batch=ca.ImageBatch((8,), classes=8), batch_size=2
        )

    study = optuna.create_study(
        pruner=CostAwarePruner(spec_fn=untraceable, budget=BUDGET, device="T4")
    )
    with pytest.warns(CostAwareWarning, match="UntraceableModelError"):
        _run(study, 1)
    assert study.trials[0].state == TrialState.COMPLETE


def _data_dependent() -> Any:
    import torch

    class DataDependent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            return y if y.sum() > 0 else -y

    return DataDependent()


def test_hyperband_keeps_its_brackets() -> None:
    with pytest.warns(CostAwareWarning, match="CostAwareHyperbandPruner") as said:
        CostAwarePruner(spec_fn=spec_fn, budget=BUDGET, wrapped=optuna.pruners.HyperbandPruner())
    assert said[0].filename == __file__  # the user's line, not costaware's
    hb = CostAwareHyperbandPruner(
        spec_fn=spec_fn,
        budget=BUDGET,
        device="T4",
        min_resource=1,
        max_resource=9,
        refit_every=None,
    )
    assert isinstance(hb, optuna.pruners.HyperbandPruner)
    study = optuna.create_study(pruner=hb)
    _run(study, 4)
    assert any(t.state == TrialState.PRUNED for t in study.trials) or all(
        t.params["width"] != 8192 for t in study.trials
    )


def _optimize_logged(
    study: optuna.Study, obj: Any, n_trials: int, caplog: pytest.LogCaptureFixture
) -> None:
    """``study.optimize`` with Optuna's INFO log lines captured by ``caplog``."""
    optuna.logging.enable_propagation()
    optuna.logging.set_verbosity(optuna.logging.INFO)
    try:
        with caplog.at_level("INFO"):
            study.optimize(obj, n_trials=n_trials)
    finally:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        optuna.logging.disable_propagation()


@pytest.mark.parametrize("bare", [True, False])
def test_a_rejection_by_the_pruner_is_logged_with_its_reasons(
    caplog: pytest.LogCaptureFixture, bare: bool
) -> None:
    """After ``should_prune()``, whether the objective raises a bare ``TrialPruned()`` or
    ``pruned(trial)``: an INFO line says which trial and why; with ``pruned(trial)``,
    Optuna's own line says it too, worded as :func:`admit`'s."""

    def obj(trial: optuna.Trial) -> float:
        trial.suggest_categorical("width", [64, 8192])
        trial.suggest_categorical("batch_size", [16])
        if trial.should_prune():
            raise optuna.TrialPruned() if bare else pruned(trial)
        return 1.0

    pruner = CostAwarePruner(spec_fn=spec_fn, budget=BUDGET, device="T4", refit_every=None)
    study = optuna.create_study(
        pruner=pruner, sampler=optuna.samplers.GridSampler({"width": [64, 8192], "batch_size": [16]})
    )
    _optimize_logged(study, obj, 2, caplog)
    (rejected,) = [t for t in study.trials if t.state == TrialState.PRUNED]
    said = sorted(  # distinct lines (the capture sees each record twice)
        {r.getMessage() for r in caplog.records if r.levelname == "INFO" and "exceeds" in r.getMessage()}
    )
    why = "rejected by costaware before it ran: " + "; ".join(
        rejected.user_attrs["costaware:reasons"]
    )
    ours = f"Trial {rejected.number} {why}"
    assert said == ([ours] if bare else sorted([ours, f"Trial {rejected.number} pruned. {why}"]))


def test_admit_helper_inside_the_objective(caplog: pytest.LogCaptureFixture) -> None:
    def obj(trial: optuna.Trial) -> float:
        width = trial.suggest_categorical("width", [64, 8192])
        admit(trial, spec_fn({"width": width, "batch_size": 16}), BUDGET, device="T4")
        return 1.0

    study = optuna.create_study(sampler=optuna.samplers.GridSampler({"width": [64, 8192]}))
    _optimize_logged(study, obj, 2, caplog)
    # one line says why, Optuna's own: "Trial 1 pruned. rejected by costaware before it ran: ..."
    said = sorted({r.getMessage() for r in caplog.records if "exceeds" in r.getMessage()})
    assert len(said) == 1 and "pruned. rejected by costaware before it ran: " in said[0]
    states = {t.params["width"]: t for t in study.trials}
    assert (
        states[64].state == TrialState.COMPLETE and states[64].user_attrs["costaware:admit"] is True
    )
    assert states[8192].state == TrialState.PRUNED
    assert states[8192].constraints["costaware_memory"] > 0


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="spec_fn must be callable"):
        CostAwarePruner(spec_fn=42, budget=BUDGET)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"costaware\.Budget"):
        CostAwarePruner(spec_fn=spec_fn, budget={"max_memory": "1GiB"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="optuna pruner"):
        CostAwarePruner(spec_fn=spec_fn, budget=BUDGET, wrapped="median")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"device": "H1000"}, UnknownDeviceError, "unknown device 'H1000'"),
        ({"device": "gpu"}, UnknownDeviceError, "unknown device 'gpu'"),
        ({"device": 5}, TypeError, "device must be a device name"),
        ({"model": "default"}, TypeError, "model must be a costaware.CostModel"),
        ({"store": 123}, TypeError, "store must be an ObservationStore"),
        ({"fail_open": "no"}, TypeError, "fail_open must be True"),
        ({"refit_every": 0}, ValueError, "refit_every must be a whole number"),
        ({"refit_every": "5"}, ValueError, "refit_every must be a whole number"),
    ],
)
def test_a_mistaken_option_is_refused_when_the_pruner_is_built(
    kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    """Found when the study is set up, not admitted unjudged trial after trial."""
    for make in (CostAwarePruner, CostAwareHyperbandPruner):
        with pytest.raises(error, match=re.escape(words)):
            make(**kwargs)


def test_a_misspelt_option_names_the_public_class_and_the_option_meant() -> None:
    with pytest.raises(
        TypeError,
        match=r"CostAwarePruner\(\) got an unexpected keyword argument 'fail_opne': did you mean fail_open=\?",
    ):
        CostAwarePruner(fail_opne=False)  # type: ignore[call-arg]


def test_a_pruner_class_where_an_instance_belongs_says_so() -> None:
    with pytest.raises(TypeError, match=r"write MedianPruner\(\)"):
        CostAwarePruner(optuna.pruners.MedianPruner)  # type: ignore[arg-type]


class _BrokenStore:
    def record_prediction(self, **kw: Any) -> int:
        raise ConnectionError("database is down")

    def count_observations(self, **kw: Any) -> int:
        raise ConnectionError("database is down")


def test_an_unreachable_store_does_not_stop_the_study() -> None:
    """Every trial is judged and keeps the store's error; the study is warned once per
    outage, not at every trial."""
    store = _BrokenStore()
    study = optuna.create_study(
        pruner=CostAwarePruner(spec_fn=spec_fn, budget=BUDGET, device="T4", store=store)
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _run(study, 3)
    said = [str(w.message) for w in seen if "could not write to the store" in str(w.message)]
    assert len(said) == 1 and "database is down" in said[0], said
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.trials)
    assert all(
        "database is down" in t.user_attrs["costaware:store_error"] for t in study.trials
    )
    store.record_prediction = lambda **kw: 1  # type: ignore[method-assign]  # it answers again
    _run(study, 1)
    del store.record_prediction  # and goes down again: a new outage is said again
    with pytest.warns(CostAwareWarning, match="could not write to the store"):
        _run(study, 1)


def _worker(url: str, n: int) -> None:
    pruner = CostAwarePruner(spec_fn=spec_fn, budget=BUDGET, device="T4", refit_every=None)
    study = optuna.load_study(study_name="shared", storage=url, pruner=pruner)
    _run(study, n)


@pytest.mark.slow
def test_two_processes_share_a_sqlite_study(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    optuna.create_study(study_name="shared", storage=url)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(url, 4)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    study = optuna.load_study(study_name="shared", storage=url)
    assert len(study.trials) == 8
    for t in study.trials:  # written through the storage: visible from any process
        assert "costaware:admit" in t.user_attrs
        assert set(t.constraints) == {"costaware_memory", "costaware_time"}
    assert any(t.state == TrialState.PRUNED for t in study.trials) or all(
        t.params["width"] != 8192 for t in study.trials
    )


def test_trials_say_whether_the_shipped_model_or_a_refit_predicted(tmp_path: Path) -> None:
    """``costaware:refit_rows`` is 0 until the online refit has been fitted on the study's
    measured trials, then the number of trials it was fitted on."""
    store = ObservationStore(f"sqlite:///{tmp_path / 'obs.db'}")
    pruner = CostAwarePruner(
        spec_fn=spec_fn, budget=BUDGET, device="T4", store=store, refit_every=2
    )
    study = optuna.create_study(study_name="refit-rows", pruner=pruner)
    refit = pruner.refit
    assert refit is not None
    refit.background = False  # refit inside the pruner call, so the next trial sees it

    def measured_objective(trial: optuna.Trial) -> float:
        trial.suggest_categorical("width", [64, 128])  # both fit the budget
        trial.suggest_categorical("batch_size", [16, 256])
        if trial.should_prune():
            raise optuna.TrialPruned()
        feats = pruner._gate.model().features(spec_fn(trial.params), "T4")
        store.record_measurement(
            study="refit-rows",
            trial=trial.number,
            device="T4",
            status="ok",
            actual={
                "peak_memory": feats["analytic_reserved_mib"] * 2**20 * 1.2,
                "iteration_time": feats["analytic_time_ms"] / 1e3 * 1.5,
                "epoch_time": feats["analytic_time_ms"] / 1e3 * 1.5 * 625,
            },
        )
        return 0.0

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.optimize(measured_objective, n_trials=6)
    rows = [t.user_attrs["costaware:refit_rows"] for t in study.trials]
    assert rows[0] == 0 and rows[1] == 0
    assert max(rows) >= 2 and rows == sorted(rows)
    # the store keeps each trial's parameters: a report from the store alone shows them
    by_number = {t.number: t.params for t in study.trials}
    assert {int(r.trial): r.params for r in ca.report(store).trials} == by_number


def _rss_mib() -> float:
    """This process's resident memory (Linux)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.fixture
def shipped_loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """As in a fresh process: the shipped model not yet loaded, admit's gates not yet
    made; returns a list that grows by one on every load of the shipped model."""
    import costaware.core.model as cm
    import costaware.integrations.optuna as co

    loads: list[int] = []
    real = cm._load_shipped

    def counted() -> ca.CostModel | None:
        loads.append(1)
        return real()

    monkeypatch.setattr(cm, "_load_shipped", counted)
    monkeypatch.setattr(cm, "_shipped", None)
    monkeypatch.setattr(co, "_GATES", OrderedDict())
    return loads


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc for RSS")
def test_admit_with_a_budget_built_in_every_trial_does_not_leak(shipped_loads: list[int]) -> None:
    """``admit(trial, spec, ca.Budget(...))``, the Budget built inline as admit's docstring
    does: one gate for them all and one load of the shipped model, and no memory growth
    per trial (each trial cost a gate and a copy of the shipped model, ~13 MiB)."""
    import costaware.integrations.optuna as co

    def objective(trial: optuna.Trial) -> float:
        width = trial.suggest_categorical("width", [64, 128])
        budget = ca.Budget(max_memory="1.25GiB", max_epoch_time="1h")
        admit(trial, spec_fn({"width": width, "batch_size": 16}), budget, device="T4")
        return 1.0

    study = optuna.create_study()
    study.optimize(objective, n_trials=5)
    before = _rss_mib()
    study.optimize(objective, n_trials=40)
    grown = _rss_mib() - before
    assert len(co._GATES) == 1 and len(shipped_loads) == 1
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    assert grown < 100, f"resident memory grew {grown:.0f} MiB over 40 trials"

    # a new model object in every trial: the gates kept stay bounded, the load is shared
    def with_a_model(trial: optuna.Trial) -> float:
        spec = spec_fn({"width": 64, "batch_size": 16})
        admit(trial, spec, BUDGET, device="T4", model=ca.CostModel.default())
        return 1.0

    study.optimize(with_a_model, n_trials=co._GATES_MAX + 4)
    assert len(co._GATES) == co._GATES_MAX and len(shipped_loads) == 1


def test_a_damaged_shipped_model_admits_trials_with_the_reason(
    shipped_loads: list[int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The shipped model is costaware's own: a damaged file fails open, in the pruner (with
    a store, whose refit has no base then) and in admit, every trial saying why."""
    import costaware.core.model as cm

    with resources.as_file(resources.files("costaware") / "data" / "default_model") as src:
        shutil.copytree(src, tmp_path / "shipped")
    cbm = tmp_path / "shipped" / "cpu" / "time.cbm"
    data = bytearray(cbm.read_bytes())
    data[len(data) // 2] ^= 0x10
    cbm.write_bytes(bytes(data))
    monkeypatch.setattr(cm, "_load_shipped", lambda: ca.CostModel.load(tmp_path / "shipped"))
    pruner = CostAwarePruner(
        spec_fn=spec_fn, budget=BUDGET, device="T4", store=f"sqlite:///{tmp_path / 'o.db'}"
    )
    assert pruner.refit is None  # no base to refit over; constructing it did not fail
    study = optuna.create_study(pruner=pruner)
    with pytest.warns(CostAwareWarning, match="could not judge trial"):
        _run(study, 3)

    def objective(trial: optuna.Trial) -> float:
        admit(trial, spec_fn({"width": 8192, "batch_size": 256}), BUDGET, device="T4")
        return 1.0

    with pytest.warns(CostAwareWarning, match="could not judge trial"):
        study.optimize(objective, n_trials=2)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 5
    for t in study.trials:
        assert t.user_attrs["costaware:admit"] is True
        error = t.user_attrs["costaware:error"]
        assert "shipped with costaware cannot be used" in error
        assert f"{cbm} is damaged" in error


# --------------------------------------------------------------------------------------
# one constructor shape: the wrapped pruner first, the options keyword-only
# --------------------------------------------------------------------------------------
def _grid_states(pruner: optuna.pruners.BasePruner, db: Path) -> dict[int, set[TrialState]]:
    """Each width's trial states over a real study on SQLite judged by ``pruner``."""
    study = optuna.create_study(
        storage=f"sqlite:///{db}",
        pruner=pruner,
        sampler=optuna.samplers.GridSampler({"width": [64, 8192], "batch_size": [16]}),
    )
    _run(study, 2)
    by_width: dict[int, set[TrialState]] = {}
    for t in study.trials:
        by_width.setdefault(t.params["width"], set()).add(t.state)
    return by_width


def test_the_positional_form_warns_naming_the_keywords_and_judges_the_same(
    tmp_path: Path,
) -> None:
    with pytest.warns(FutureWarning, match=r"CostAwarePruner\(spec_fn=\.\.\., budget=\.\.\., "):
        old = CostAwarePruner(spec_fn, BUDGET, "T4", refit_every=None)  # type: ignore[misc]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the keyword form warns about nothing
        new = CostAwarePruner(spec_fn=spec_fn, budget=BUDGET, device="T4", refit_every=None)
    assert old._spec_fn is spec_fn and old._gate.budget is BUDGET
    got = _grid_states(old, tmp_path / "old.db")
    assert got == _grid_states(new, tmp_path / "new.db")
    assert got == {64: {TrialState.COMPLETE}, 8192: {TrialState.PRUNED}}


def test_a_wrapped_pruner_first_then_positional_options_warn() -> None:
    median = optuna.pruners.MedianPruner()
    with pytest.warns(FutureWarning, match=r"CostAwarePruner\(wrapped, budget=\.\.\.\)"):
        pruner = CostAwarePruner(median, BUDGET)  # type: ignore[misc]
    assert pruner._wrapped is median and pruner._gate.budget is BUDGET
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        keyed = CostAwarePruner(median, spec_fn=spec_fn, budget=BUDGET, device="T4")
    assert keyed._wrapped is median and keyed._spec_fn is spec_fn
    with pytest.raises(TypeError, match="at most 4 positional arguments"):
        CostAwarePruner(spec_fn, BUDGET, "T4", median, 5)  # type: ignore[misc]
    with pytest.raises(TypeError, match="multiple values for argument 'budget'"):
        CostAwarePruner(spec_fn, BUDGET, budget=BUDGET)  # type: ignore[misc]


def test_the_hyperband_pruner_takes_keywords_and_still_its_positional_form(
    tmp_path: Path,
) -> None:
    def make(positional: bool) -> CostAwareHyperbandPruner:
        if positional:
            return CostAwareHyperbandPruner(  # type: ignore[misc]
                spec_fn, BUDGET, "T4", min_resource=1, max_resource=9, refit_every=None
            )
        return CostAwareHyperbandPruner(
            spec_fn=spec_fn,
            budget=BUDGET,
            device="T4",
            min_resource=1,
            max_resource=9,
            refit_every=None,
        )

    with pytest.warns(FutureWarning, match=r"takes spec_fn, budget, device as keyword"):
        old = make(positional=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        new = make(positional=False)
    got = _grid_states(old, tmp_path / "old.db")
    assert got == _grid_states(new, tmp_path / "new.db")
    assert got == {64: {TrialState.COMPLETE}, 8192: {TrialState.PRUNED}}


@pytest.mark.parametrize(
    "budget",
    [
        ca.Budget(max_total_time="0.6s"),
        ca.Budget(price_per_hour=3600.0, max_cost=0.6),  # a dollar a second
    ],
    ids=["max_total_time", "max_cost"],
)
def test_a_spent_study_budget_rejects_and_then_stops_the_study(budget: ca.Budget) -> None:
    """``max_total_time`` and ``max_cost`` count what the study has spent (its cost at
    ``price_per_hour``): the trial that would pass them is rejected, and once they are
    used up the study stops instead of asking for trials it must reject, without end."""
    import time as _time

    def short(params: dict[str, Any]) -> ca.TrainingSpec:  # ten steps: a trial of ms
        return dataclasses.replace(spec_fn(params), dataset_size=160)

    study = optuna.create_study(pruner=CostAwarePruner(spec_fn=short, budget=budget, device="T4"))

    def slow(trial: optuna.Trial) -> float:
        trial.suggest_categorical("width", [64])
        trial.suggest_categorical("batch_size", [16])
        if trial.should_prune():
            raise optuna.TrialPruned()
        _time.sleep(0.25)
        return 0.0

    with pytest.warns(ca.CostAwareWarning, match="stopping it"):
        study.optimize(slow, n_trials=40)
    states = [t.state for t in study.trials]
    done = states.count(TrialState.COMPLETE)
    assert 1 <= done <= 3  # 0.25 s each (the first with its cold dry run), 0.6 s to spend
    # stopped: when spent, or after a streak of trials the rest of the budget fits none of
    assert states[-1] == TrialState.PRUNED and len(states) <= done + SPENT_STREAK_LIMIT + 1
    last = study.trials[-1].user_attrs["costaware:reasons"][0]
    assert "spent" in last and ("cost cap" in last or "exceeds the study's" in last)


def test_admit_after_the_pruner_judged_keeps_its_decision_and_pruned_names_who_pruned(
    tmp_path: Path,
) -> None:
    """``admit`` in a study whose pruner already judged the trial returns that decision
    (one prediction recorded, no constraint set twice); ``pruned`` says the wrapped
    pruner pruned a trial costaware admitted."""
    store = ObservationStore(f"sqlite:///{tmp_path / 's.db'}")
    pruner = CostAwarePruner(
        optuna.pruners.ThresholdPruner(upper=1.0), spec_fn=spec_fn, budget=BUDGET, device="T4",
        store=store,
    )  # fmt: skip
    study = optuna.create_study(pruner=pruner)
    said: list[str] = []

    def twice(trial: optuna.Trial) -> float:
        trial.suggest_categorical("width", [64])
        trial.suggest_categorical("batch_size", [16])
        assert not trial.should_prune()  # costaware admits it
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # Optuna warns on a constraint set twice
            attrs = admit(trial, spec_fn(trial.params))
        assert attrs["admit"] is True
        trial.report(5.0, step=1)  # over the threshold: the wrapped pruner prunes
        if trial.should_prune():
            error = pruned(trial)
            said.append(str(error))
            raise error
        return 0.0

    study.optimize(twice, n_trials=1)
    assert len(store.predictions()) == 1
    assert said == ["pruned by the study's pruner (costaware admitted it)"]


def test_a_pruner_without_spec_fn_says_when_nothing_judges_its_trials() -> None:
    """``CostAwarePruner()`` judges through the callback or ``admit``; an objective that
    calls neither has its trials checked by nothing, and is told so once, at the next
    trial after one completed."""
    study = optuna.create_study(pruner=CostAwarePruner(device="T4"))

    def unjudged(trial: optuna.Trial) -> float:
        trial.suggest_categorical("width", [64])
        if trial.should_prune():
            raise optuna.TrialPruned()
        return 0.0

    with pytest.warns(CostAwareWarning, match="finished without costaware judging it") as said:
        study.optimize(unjudged, n_trials=3)
    assert sum("finished without" in str(w.message) for w in said) == 1


def test_a_factory_reading_a_parameter_not_suggested_says_which() -> None:
    """``model=lambda: build(cfg)``, the factory reading a key the trial never suggested:
    the user's KeyError, with the key and the parameters there are."""

    def typo(params: dict[str, Any]) -> ca.TrainingSpec:
        return ca.TrainingSpec(
            model=lambda: nn.Linear(16, params["widht"]),
            batch=ca.ImageBatch((16,), classes=10),
            batch_size=params["bs"],
        )

    def obj(trial: optuna.Trial) -> float:
        trial.suggest_int("width", 8, 16)
        trial.suggest_int("bs", 8, 16)
        trial.should_prune()
        return 1.0

    study = optuna.create_study(
        pruner=CostAwarePruner(spec_fn=typo, budget=BUDGET, device="T4", refit_every=None)
    )
    with pytest.raises(KeyError) as info:
        study.optimize(obj, n_trials=1)
    assert isinstance(info.value, ca.UserCodeError)
    assert "It reads 'widht', which is not among the parameters it was given (bs, width)" in str(
        info.value
    )


class _ReadsAValue(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum().item() > 0:  # a value the dry run cannot read: costaware's limit
            x = x * 2
        return self.fc(x)  # type: ignore[no-any-return]


def test_a_warning_about_a_trial_points_at_the_users_line() -> None:
    """Not at Optuna's _trial.py or costaware's own files: at the objective."""

    def unreadable(params: dict[str, Any]) -> ca.TrainingSpec:
        return ca.TrainingSpec(model=_ReadsAValue, batch=ca.ImageBatch((16,), classes=10), batch_size=4)

    def obj(trial: optuna.Trial) -> float:
        trial.suggest_int("w", 1, 2)
        trial.should_prune()
        return 1.0

    study = optuna.create_study(
        pruner=CostAwarePruner(spec_fn=unreadable, budget=BUDGET, device="T4", refit_every=None)
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        study.optimize(obj, n_trials=1)
    (said,) = [w for w in seen if "could not judge" in str(w.message)]
    assert said.filename == __file__, said.filename
