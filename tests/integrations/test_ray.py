"""The Ray Tune searcher wrapper, scheduler wrapper and packing helper, on a real local cluster."""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("optuna")

import optuna  # noqa: E402
from optuna.trial import TrialState  # noqa: E402
from ray import tune  # noqa: E402
from ray.tune.search.optuna import OptunaSearch  # noqa: E402

import costaware as ca  # noqa: E402
from costaware import zoo  # noqa: E402
from costaware.integrations.ray import (  # noqa: E402
    CostAwareScheduler,
    CostAwareSearcher,
    CostAwareWarning,
    EpochMeter,
    limit_memory,
    resources,
)
from costaware.runtime.store import ObservationStore  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)
MODEL = ca.CostModel.default()
# on the CPU: width 64 needs ~1 MiB (upper bound), width 8192 ~155-220 MiB
BUDGET = ca.Budget(max_memory="100MiB", max_epoch_time="5s")
SPACE = {"width": tune.choice([64, 8192]), "bs": tune.choice([32, 1024])}


def spec_fn(cfg: dict[str, Any]) -> ca.TrainingSpec:
    return ca.TrainingSpec(
        model=functools.partial(zoo.mlp, 784, (cfg["width"],), 10),
        batch=ca.ImageBatch((784,), classes=10),
        batch_size=cfg["bs"],
    )


def trainable(cfg: dict[str, Any]) -> None:
    """Reports a fake actual cost: ``slow`` configs take 10 s an epoch."""
    for epoch in range(3):
        epoch_time = 10.0 if cfg.get("slow") else 0.01
        held = {"held_before_bytes": cfg["held"]} if "held" in cfg else {}
        tune.report(
            {"loss": 1.0 / (epoch + 1), "epoch": epoch, "epoch_time_s": epoch_time,
             "peak_memory_bytes": 2**20, **held}
        )  # fmt: skip


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _fit(tmp_path: Path, name: str, search_alg: Any, scheduler: Any, space: Any, n: int) -> Any:
    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", num_samples=n, search_alg=search_alg, scheduler=scheduler
        ),
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0),
    )
    return tuner.fit()


def test_rejected_suggestions_teach_optuna_and_never_run(ray_session: None, tmp_path: Path) -> None:
    store = ObservationStore(tmp_path / "costaware.db")
    searcher = CostAwareSearcher(
        OptunaSearch(seed=0), spec_fn=spec_fn, budget=BUDGET, device="cpu", model=MODEL, store=store,
        refit_every=None,
    )  # fmt: skip
    results = _fit(tmp_path, "reject", searcher, CostAwareScheduler(store=store), SPACE, 4)

    assert len(results) == 4  # rejected suggestions do not count towards num_samples
    assert not results.errors
    assert all(r.config["width"] == 64 for r in results)
    assert searcher.rejections, "the budget rules out width 8192: some must be rejected"
    for rej in searcher.rejections:
        assert rej["config"]["width"] == 8192
        assert rej["reason_kinds"] == ["memory"]
        assert "exceeds the 100 MiB budget" in rej["reasons"][0]
        assert rej["peak_memory_upper"] > 100 * 2**20
    states = [t.state for t in searcher.searcher._ot_study.trials]
    assert states.count(TrialState.PRUNED) == len(searcher.rejections)
    assert states.count(TrialState.COMPLETE) == 4
    assert len(store.predictions(status="rejected")) == len(searcher.rejections)
    admitted = store.predictions(status="admitted")
    assert sorted(p["trial"] for p in admitted) == sorted(r.metrics["trial_id"] for r in results)
    ok = store.measurements(status="ok")
    assert len(ok) == 12  # 4 trials x 3 epochs, joinable to the predictions by trial id
    assert {m["trial"] for m in ok} == {p["trial"] for p in admitted}
    # the store is the only record of a rejected suggestion's config: the report shows it
    rep = ca.report(tmp_path / "reject", store=store)
    rejected = [r for r in rep.trials if r.outcome == "rejected"]
    assert len(rejected) == len(searcher.rejections)
    assert all(set(r.params) == {"width", "bs"} and r.params["width"] == 8192 for r in rejected)


def test_scheduler_stops_an_over_budget_trial(ray_session: None, tmp_path: Path) -> None:
    store = ObservationStore(tmp_path / "costaware.db")
    scheduler = CostAwareScheduler(budget=BUDGET, device="cpu", store=store)
    space = {"slow": tune.grid_search([0, 1]), "held": 512 * 2**20}  # an EpochMeter's on CUDA
    results = _fit(tmp_path, "stop", None, scheduler, space, 1)

    by_slow = {r.config["slow"]: r for r in results}
    assert by_slow[1].metrics["training_iteration"] == 1  # stopped after its first epoch
    assert by_slow[0].metrics["training_iteration"] == 3
    assert list(scheduler.stopped) == [by_slow[1].metrics["trial_id"]]
    stop = scheduler.stopped[by_slow[1].metrics["trial_id"]]
    assert stop["reason_kinds"] == ["epoch_time"]
    assert stop["epoch"] == 0
    stopped = store.measurements(status="stopped")
    assert len(stopped) == 1 and "exceeds the 5.0 s budget" in stopped[0]["reason"]
    assert stopped[0]["actual"]["epoch_time"] == 10.0
    # what the trial's process held before it is kept: the store's refit leaves such peaks out
    assert {m["actual"]["held_before"] for m in store.measurements()} == {512 * 2**20}


def reports_thrice_an_epoch(cfg: dict[str, Any]) -> None:
    """Two epochs of 1.5 s each on this CPU, each reported three times (a trainable that
    reports as it validates), as an EpochMeter's metrics."""
    for epoch in range(2):
        for loss in (3.0, 2.0, 1.0):
            tune.report(
                {"loss": loss, "epoch": epoch, "epoch_time_s": 1.5,
                 "peak_memory_bytes": 2**20, "measured_on": "CPU"}
            )  # fmt: skip


def test_the_scheduler_counts_an_epoch_once_and_records_the_device_measured(
    ray_session: None, tmp_path: Path
) -> None:
    """An epoch reported three times is one epoch of the trial's time (3 s of a 4 s
    budget, not 4.5 s), stored once; trials measured on the CPU while the scheduler
    predicts for an A10 are recorded as the CPU's, with one warning, so the refit never
    learns them as the A10's."""
    store = ObservationStore(tmp_path / "costaware.db")
    scheduler = CostAwareScheduler(
        budget=ca.Budget(max_trial_time="4s"), device="A10", store=store
    )
    tuner = tune.Tuner(
        tune.with_resources(reports_thrice_an_epoch, {"cpu": 1}),
        param_space={"seed": tune.grid_search([0, 1])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler),
        run_config=tune.RunConfig(name="thrice", storage_path=str(tmp_path), verbose=0),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = tuner.fit()
    assert not results.errors and not scheduler.stopped
    assert all(r.metrics["training_iteration"] == 6 for r in results)
    rows = store.measurements()
    assert sorted((m["trial"], m["epoch"]) for m in rows) == sorted(
        (r.metrics["trial_id"], e) for r in results for e in (0, 1)
    )
    assert {m["device"] for m in rows} == {"CPU"}
    said = [str(w.message) for w in caught if "but the trials measure on CPU" in str(w.message)]
    assert len(said) == 1 and "costaware predicts for A10" in said[0]


def test_failing_spec_fn_fails_open(ray_session: None, tmp_path: Path) -> None:
    def broken(cfg: dict[str, Any]) -> ca.TrainingSpec:  # costaware's own failure
        raise ca.UntraceableModelError("cannot build this model")

    searcher = CostAwareSearcher(
        OptunaSearch(seed=1), spec_fn=broken, budget=BUDGET, device="cpu", model=MODEL
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = _fit(tmp_path, "failopen", searcher, None, SPACE, 2)
    assert len(results) == 2 and not results.errors
    assert not searcher.rejections
    infos = list(searcher.admitted.values())
    assert len(infos) == 2
    assert all("UntraceableModelError: cannot build this model" in i["error"] for i in infos)
    assert any(issubclass(w.category, CostAwareWarning) for w in caught)


def test_a_bug_in_spec_fn_stops_the_experiment_before_any_trial(
    ray_session: None, tmp_path: Path
) -> None:
    """The user's bug fails fast: Tune raises it out of fit() and runs no trial."""

    def buggy(cfg: dict[str, Any]) -> ca.TrainingSpec:
        return spec_fn({"width": cfg["width"], "bs": cfg["batch_size"]})

    searcher = CostAwareSearcher(
        OptunaSearch(seed=1), spec_fn=buggy, budget=BUDGET, device="cpu", model=MODEL
    )
    with pytest.raises(ca.UserCodeError, match=r"spec_fn raised KeyError: 'batch_size'") as info:
        _fit(tmp_path, "userbug", searcher, None, SPACE, 2)
    assert isinstance(info.value.__cause__, KeyError)
    assert "not among the parameters it was given (bs, width)" in str(info.value)
    assert not searcher.admitted and not searcher.rejections


def _failing_closed(max_retries: int, max_consecutive_rejections: int | None) -> Any:
    """A searcher whose every prediction fails (costaware's own failure), with
    ``fail_open=False``: each suggestion is rejected."""

    def broken(cfg: dict[str, Any]) -> ca.TrainingSpec:
        raise ca.TraceTimeout("nope")

    return CostAwareSearcher(
        OptunaSearch(seed=0, metric="loss", mode="min", space=SPACE), spec_fn=broken, budget=BUDGET,
        device="cpu", fail_open=False, max_retries=max_retries,
        max_consecutive_rejections=max_consecutive_rejections,
    )  # fmt: skip


@pytest.mark.filterwarnings("ignore:costaware could not judge")
def test_fail_closed_rejects_and_gives_up() -> None:
    searcher = _failing_closed(max_retries=2, max_consecutive_rejections=5)
    with pytest.warns(CostAwareWarning, match="no trial this step"):
        assert searcher.suggest("a") is None  # 3 rejected: Tune will ask again
    with pytest.warns(CostAwareWarning, match="ending the search"):
        assert searcher.suggest("b") == "FINISHED"  # 5 in a row
    assert len(searcher.rejections) == 5
    assert all(r["reasons"][0].startswith("prediction failed") for r in searcher.rejections)


@pytest.mark.filterwarnings("ignore:costaware could not judge")
def test_a_step_without_a_trial_is_said_once() -> None:
    searcher = _failing_closed(max_retries=1, max_consecutive_rejections=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [searcher.suggest(t) for t in "abc"] == [None, None, None]
    said = [str(w.message) for w in caught if "no trial this step" in str(w.message)]
    assert len(said) == 1 and "for trial a" in said[0]
    assert len(searcher.rejections) == 6


def test_a_spent_study_budget_ends_the_search() -> None:
    """Once the trials have spent the budget's max_total_time, every suggestion would be
    rejected: the searcher ends the search instead of proposing them."""
    searcher = CostAwareSearcher(
        OptunaSearch(seed=0, metric="loss", mode="min", space=SPACE), spec_fn=spec_fn,
        budget=ca.Budget(max_total_time="1min"), device="cpu",
    )  # fmt: skip
    searcher.spent_time = 61.0
    with pytest.warns(CostAwareWarning, match="spent 61.0 s of its 60.0 s max_total_time"):
        assert searcher.suggest("a") == "FINISHED"
    assert not searcher.rejections and not searcher.admitted


def test_checkpoint_restore_round_trip(tmp_path: Path) -> None:
    def make() -> CostAwareSearcher:
        return CostAwareSearcher(
            OptunaSearch(seed=0, metric="loss", mode="min", space=SPACE), spec_fn=spec_fn, budget=BUDGET,
            device="cpu", model=MODEL,
        )  # fmt: skip

    first = make()
    for i in range(3):
        cfg = first.suggest(f"t{i}")
        assert isinstance(cfg, dict) and cfg["width"] == 64
    first.on_trial_complete("t0", {"loss": 0.5, "time_total_s": 2.0})
    assert first.rejections
    path = tmp_path / "searcher.pkl"
    first.save(str(path))

    second = make()
    second.restore(str(path))
    assert second.get_state() == first.get_state()
    assert second.spent_time == 2.0
    assert len(second.searcher._ot_study.trials) == len(first.searcher._ot_study.trials)
    # the restored wrapper still routes an accepted trial to its inner id
    second.on_trial_complete("t1", {"loss": 0.25})
    states = [t.state for t in second.searcher._ot_study.trials]
    assert states.count(TrialState.COMPLETE) == 2


def test_resources_packs_by_predicted_memory() -> None:
    device = ca.get_device("A10")
    g = 0.05
    cfg = {"width": 8192, "bs": 1024}
    upper = MODEL.predict(spec_fn(cfg), device=device).peak_memory_upper
    expected = min(
        1.0, math.ceil((upper + device.context_overhead_bytes) / device.memory_bytes / g) * g
    )
    fn = resources(spec_fn, device="A10", granularity=g, model=MODEL, cpu=2)
    got = fn(cfg)
    assert got == {"cpu": 2, "gpu": pytest.approx(expected)}
    assert 0 < got["gpu"] < 1.0
    # a huge batch needs the whole GPU (capped at 1.0); a failing spec asks for one too
    assert fn({"width": 8192, "bs": 2**20})["gpu"] == 1.0
    with pytest.warns(CostAwareWarning, match="whole GPU"):
        assert fn({"width": 64})["gpu"] == 1.0
    # trials that train on a CPU ask for no share of a GPU the cluster may lack (they
    # would stay pending), and an unknown device name fails when the function is made
    assert resources(spec_fn, device="cpu", model=MODEL)(cfg) == {"cpu": 1}
    import torch

    if not torch.cuda.is_available():
        auto = resources(spec_fn, model=MODEL)
        with pytest.warns(CostAwareWarning, match="found no GPU where it runs"):
            assert auto(cfg) == {"cpu": 1}
    with pytest.raises(ca.UnknownDeviceError, match="H1000"):
        resources(spec_fn, device="H1000")


def test_resources_for_a_gpu_on_a_cluster_without_one_says_so(ray_session: None) -> None:
    """This local cluster has no GPU: a trial asking for a share of an A10 would wait until
    one joins (an autoscaler may add one), so that is said once, and nothing changes."""
    assert not ray.cluster_resources().get("GPU")
    fn = resources(spec_fn, device="A10", model=MODEL)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shares = [fn({"width": 64, "bs": 32})["gpu"] for _ in range(3)]
    said = [str(w.message) for w in caught if "this Ray cluster has none" in str(w.message)]
    assert len(said) == 1 and "pass device='cpu'" in said[0]
    assert all(0 < g <= 1.0 for g in shares)


def test_argument_errors_say_what_was_expected() -> None:
    from ray.tune.search import BasicVariantGenerator

    with pytest.raises(TypeError, match=r"searcher must be a ray\.tune\.search\.Searcher"):
        CostAwareSearcher(object(), spec_fn=spec_fn, budget=BUDGET)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keep the default search and judge the running trials"):
        CostAwareSearcher(BasicVariantGenerator(), spec_fn=spec_fn, budget=BUDGET)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_retries must be an integer >= 0, but got"):
        CostAwareSearcher(OptunaSearch(), spec_fn=spec_fn, budget=BUDGET, max_retries=-1)
    with pytest.raises(TypeError, match=r"budget must be a costaware\.Budget"):
        CostAwareScheduler(budget="24GiB")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="granularity must be in"):
        resources(spec_fn, device="A10", granularity=0)
    with pytest.raises(TypeError, match="study must name the study"):
        CostAwareSearcher(OptunaSearch(), spec_fn=spec_fn, budget=BUDGET, study=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="enforce must be True"):
        CostAwareScheduler(budget=BUDGET, enforce="no")  # type: ignore[arg-type]
    from ray.tune.schedulers import ASHAScheduler

    with pytest.raises(TypeError, match="instance, but got the class AsyncHyperBandScheduler"):
        CostAwareScheduler(ASHAScheduler, budget=BUDGET)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="device must be a device name"):
        CostAwareScheduler(budget=BUDGET, device=123)  # type: ignore[arg-type]
    # a budget the scheduler could never check, or that no trial could meet, is said now
    with pytest.raises(ca.BudgetError, match="relative to a device; pass device="):
        CostAwareScheduler(budget=ca.Budget(max_memory="90%"))
    with pytest.raises(ca.BudgetError, match="leaves no room for a trial on the A10"):
        CostAwareScheduler(budget=ca.Budget(max_memory="1GiB"), device="A10")
    with pytest.raises(ca.BudgetError, match="leaves no room for a trial on the A10"):
        CostAwareSearcher(OptunaSearch(), spec_fn=spec_fn, budget=ca.Budget(max_memory="1GiB"),
                          device="A10")  # fmt: skip


def test_limit_memory_without_cuda_and_epoch_meter() -> None:
    import torch

    if not torch.cuda.is_available():
        with pytest.warns(CostAwareWarning, match="CUDA is not available"):
            assert limit_memory(0.5) is False
        with pytest.raises(ValueError, match=r"EpochMeter\('cuda'\) needs a GPU"):
            EpochMeter("cuda")
    meter = EpochMeter()
    with meter:
        x = torch.ones(4 * 2**20 // 4)
        del x
    m = meter.metrics()
    assert set(m) == {"epoch_time_s", "peak_memory_bytes", "measured_on"}
    assert m["epoch_time_s"] >= 0 and m["peak_memory_bytes"] >= 0  # type: ignore[operator]
    assert m["measured_on"] == ca.devices.cpu_device().name


def test_epoch_meter_on_a_cpu_is_the_allocators_peak_until_the_second_step() -> None:
    import torch

    from costaware.measure.profile import ALLOCATOR_METHOD

    meter = EpochMeter("cpu")
    with meter:
        x = torch.ones(4 * 2**20 // 4)  # 4 MiB, freed before the step
        del x
        meter.step()
        y = torch.ones(2**20 // 4)
        meter.step()  # profiling ends here: what follows is not seen
        z = torch.ones(16 * 2**20 // 4)
    assert meter.memory_method.startswith(ALLOCATOR_METHOD)
    assert meter.metrics()["peak_memory_bytes"] == 4 * 2**20
    del y, z


def _suggestions(searcher: CostAwareSearcher, n: int = 4) -> list[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CostAwareWarning)
        return [searcher.suggest(f"t{i}") for i in range(n)]


def test_the_positional_forms_warn_naming_the_keywords_and_work_the_same() -> None:
    from ray.tune.schedulers import FIFOScheduler

    def inner() -> OptunaSearch:
        return OptunaSearch(space=SPACE, metric="loss", mode="min", seed=3)

    with pytest.warns(FutureWarning, match=r"CostAwareSearcher\(searcher, spec_fn=\.\.\., budget"):
        old = CostAwareSearcher(inner(), spec_fn, BUDGET, "cpu", model=MODEL)  # type: ignore[misc]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the keyword form does not warn
        new = CostAwareSearcher(inner(), spec_fn=spec_fn, budget=BUDGET, device="cpu", model=MODEL)
    assert (old.spec_fn, old.budget) == (new.spec_fn, new.budget) == (spec_fn, BUDGET)
    got = _suggestions(old)
    assert got == _suggestions(new)
    assert all(cfg["width"] == 64 for cfg in got if cfg)  # 8192 is over the budget
    assert len(old.rejections) == len(new.rejections) > 0

    fifo = FIFOScheduler()  # type: ignore[no-untyped-call]
    with pytest.warns(FutureWarning, match=r"CostAwareScheduler\(scheduler, budget=\.\.\., dev"):
        sched = CostAwareScheduler(fifo, BUDGET, "cpu")  # type: ignore[misc]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        keyed = CostAwareScheduler(fifo, budget=BUDGET, device="cpu")
    assert (sched.scheduler, sched.budget, sched.device) == (fifo, BUDGET, keyed.device)
    assert keyed.device is not None and keyed.device.name == ca.get_device("cpu").name


def test_a_cost_that_is_not_a_number_is_said_once_not_ignored(tmp_path: Path) -> None:
    """``epoch_time_s="30s"`` or ``peak_memory_bytes="1GB"`` cannot be checked against
    the budget: one warning per key says it must be a number of seconds or bytes and what
    came; a number (a numpy one too) is checked as ever."""
    import numpy as np
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import TrialScheduler

    scheduler = CostAwareScheduler(
        budget=ca.Budget(max_memory="1GiB", max_epoch_time="10s"), device="cpu"
    )
    trial = Trial("train", config={"w": 1}, trial_id="t-str", stub=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(2):
            result = {"loss": 1.0, "epoch": epoch, "epoch_time_s": "30s",
                      "peak_memory_bytes": "1GB", "held_before_bytes": None}  # fmt: skip
            assert scheduler.on_trial_result(None, trial, result) == TrialScheduler.CONTINUE
    said = [str(w.message) for w in caught if issubclass(w.category, ca.CostAwareWarning)]
    assert len(said) == 2, said  # one per key, not one per result; None is not measured
    assert "'epoch_time_s' must be a number of seconds" in said[0] and "'30s'" in said[0]
    assert "'peak_memory_bytes' must be a number of bytes" in said[1] and "'1GB'" in said[1]
    assert not scheduler.stopped
    numpy_trial = Trial("train", config={"w": 2}, trial_id="t-np", stub=True)
    result = {"loss": 1.0, "epoch": 0, "epoch_time_s": np.float32(30.0)}
    assert scheduler.on_trial_result(None, numpy_trial, result) == TrialScheduler.STOP
    assert list(scheduler.stopped) == ["t-np"]
