"""Online refit against a real SQLite store: does the error drop as trials are measured?"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import costaware as ca
from costaware.runtime.refit import KEEP_VERSIONS, OnlineRefit
from costaware.runtime.store import ObservationStore
from tests.conftest import tiny_cnn


def _spec(width: int, bs: int) -> ca.TrainingSpec:
    return ca.TrainingSpec(
        model=functools.partial(tiny_cnn, width=width),
        batch=ca.ImageBatch((3, 16, 16), classes=10),
        batch_size=bs,
        dataset_size=512,
    )


def _hardware(pred: ca.Prediction, spec: ca.TrainingSpec) -> tuple[float, float]:
    """A stand-in for this machine: 6x slower than the roofline and 1.2x the memory,
    with a batch-size-dependent term the prior knows nothing about."""
    return pred.peak_memory * 1.2, pred.iteration_time * (6.0 + 0.02 * spec.batch_size)


def _store_trial(
    store: ObservationStore,
    number: int,
    spec: ca.TrainingSpec,
    model: ca.CostModel,
    pred: ca.Prediction,
    measured: tuple[float, float],
    steps: int,
) -> None:
    """Record trial ``number`` of ``spec`` as the integrations do: ``model``'s features
    and prediction, then a measured (peak, seconds per step) over ``steps`` steps."""
    peak, seconds = measured
    store.record_prediction(
        study="s",
        trial=number,
        spec=spec.summary(),
        features=model.features(spec, "cpu"),
        prediction=pred.to_dict(),
        decision=None,
        device="CPU",
        status="admitted",
    )
    store.record_measurement(
        study="s",
        trial=number,
        status="ok",
        device="CPU",
        epoch=0,
        actual={"peak_memory": peak, "iteration_time": seconds, "epoch_time": seconds * steps},
    )


def _record(
    store: ObservationStore, model: ca.CostModel, number: int, spec: ca.TrainingSpec
) -> float:
    pred = model.predict(spec, device="cpu")
    peak, seconds = _hardware(ca.CostModel().predict(spec, device="cpu"), spec)
    _store_trial(store, number, spec, model, pred, (peak, seconds), 8)
    return abs(pred.iteration_time - seconds) / seconds


def test_refit_converges_on_this_machine(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = ObservationStore(tmp_path / "obs.db")
    refit = OnlineRefit(store, base=ca.CostModel(), every=3, background=False, study="s")
    assert refit.directory == tmp_path / "obs.db.costaware-models"
    configs = [(w, bs) for w in (4, 8, 12, 16) for bs in (8, 16, 32, 64)]
    errors = []
    with caplog.at_level("INFO", logger="costaware.refit"):
        for i, (w, bs) in enumerate(configs):
            refit.maybe_refit()
            errors.append(_record(store, refit.model(), i, _spec(w, bs)))
    # each refit is said at INFO (the user sees the model change), as many as were made
    said = [r.getMessage() for r in caplog.records if "refitted the cost model" in r.getMessage()]
    assert len(said) == len(refit.history) and "of study 's'" in said[0]
    first, last = sum(errors[:3]) / 3, sum(errors[-4:]) / 4
    assert len(refit.history) >= 3
    # a refitted model keeps the traces already made: a seen architecture is not traced again
    assert refit.model().predict(_spec(4, 8), "cpu").basis["trace_source"] == "cached"
    assert last < first / 3, (first, last)  # measured, not a magic number: the error drops
    # another worker sharing the directory picks the refitted model up
    other = OnlineRefit(store, base=ca.CostModel(), every=1000, study="s")
    assert other.model().is_fitted
    # (the same model; rel 1e-3 because one side may rescale a cached trace of another
    # batch size where the other traced this one)
    assert other.model().predict(_spec(8, 16), "cpu").iteration_time == pytest.approx(
        refit.model().predict(_spec(8, 16), "cpu").iteration_time, rel=1e-3
    )


def test_refit_runs_in_the_background_and_tolerates_a_broken_store(tmp_path: Path) -> None:
    store = ObservationStore(tmp_path / "obs.db")
    refit = OnlineRefit(store, base=ca.CostModel(), every=2, study="s")
    for i, (w, bs) in enumerate([(4, 8), (8, 16), (12, 32)]):
        _record(store, refit.model(), i, _spec(w, bs))
    assert refit.maybe_refit() is True
    refit.wait(60)
    assert refit.model().is_fitted and refit.history[-1]["rows"] == 3

    class Broken:
        path = None

        def count_observations(self, **kw: object) -> int:
            raise ConnectionError("down")

    broken = OnlineRefit(Broken(), base=ca.CostModel())
    assert broken.maybe_refit() is False and "down" in (broken.last_error or "")
    with pytest.raises(ValueError, match="every must be a positive integer"):
        OnlineRefit(store, every=0)


def test_a_refit_before_any_measured_trial_waits_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Trials that ran out of memory count as observations but carry no measurement: a
    refit due after two of them has nothing to learn, which is no failure to warn about.
    It waits for measured trials and fits then."""
    store = ObservationStore(tmp_path / "obs.db")
    refit = OnlineRefit(store, base=ca.CostModel(), every=5, background=False, study="s")
    for i, (w, bs) in enumerate([(4, 8), (8, 16)]):
        spec = _spec(w, bs)
        store.record_prediction(
            study="s",
            trial=i,
            spec=spec.summary(),
            features=refit.model().features(spec, "cpu"),
            prediction=refit.model().predict(spec, device="cpu").to_dict(),
            decision=None,
            device="CPU",
            status="admitted",
        )
        store.record_measurement(
            study="s", trial=i, status="oom", device="CPU", epoch=0, actual={"peak_memory": None}
        )
    assert refit.pending() == 2
    with caplog.at_level(logging.WARNING, logger="costaware"):
        assert refit.maybe_refit() is True  # it tried
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert refit.last_error is None and refit.history == []
    with pytest.raises(ca.NotEnoughObservations, match="at least 2 observations"):
        refit.refit_now()
    for i, (w, bs) in enumerate([(12, 32), (4, 16)], start=2):
        _record(store, refit.model(), i, _spec(w, bs))
    assert refit.maybe_refit() is True
    assert [h["rows"] for h in refit.history] == [4] and refit.model().is_fitted


def test_trials_judged_at_once_from_several_threads_start_one_refit(tmp_path: Path) -> None:
    """Optuna's ``n_jobs``: every thread asks for the refit that is due; one runs."""
    import threading

    store = ObservationStore(tmp_path / "obs.db")
    refit = OnlineRefit(store, base=ca.CostModel(), every=2, study="s")
    for i, (w, bs) in enumerate([(4, 8), (8, 16), (12, 32)]):
        _record(store, refit.model(), i, _spec(w, bs))
    go = threading.Barrier(4)
    started: list[bool] = []

    def ask() -> None:
        go.wait()
        started.append(refit.maybe_refit())

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    refit.wait(60)
    assert started.count(True) == 1 and len(refit.history) == 1


def test_first_refits_come_early(tmp_path: Path) -> None:
    """After 2, 4 and 8 measured trials, then every ``every``: the schedule a study sees."""
    store = ObservationStore(tmp_path / "obs.db")
    refit = OnlineRefit(store, base=ca.CostModel(), every=5, background=False, study="s")
    configs = [(w, bs) for w in (4, 8, 12) for bs in (8, 16, 32)]
    for i, (w, bs) in enumerate(configs):
        refit.maybe_refit()
        _record(store, refit.model(), i, _spec(w, bs))
    refit.maybe_refit()
    assert [h["rows"] for h in refit.history] == [2, 4, 8]
    assert refit.due_after() == 5 and refit.pending() == 1


def _measure(store: ObservationStore, number: int, spec: ca.TrainingSpec, seconds: float) -> None:
    """Record a trial of ``spec`` that measured ``seconds`` per step."""
    model = ca.CostModel()
    _store_trial(store, number, spec, model, model.predict(spec, "cpu"), (1e6, seconds), 16)


def _with_lr(spec: ca.TrainingSpec, lr: float) -> ca.TrainingSpec:
    return dataclasses.replace(spec, optimizer_kwargs={"lr": lr})


def test_a_configuration_measured_before_is_predicted_as_measured(tmp_path: Path) -> None:
    """A study runs one architecture and batch at several learning rates: once measured,
    the refit predicts that configuration's step as measured, at any learning rate."""
    store = ObservationStore(tmp_path / "obs.db")
    seen = _spec(8, 16)
    for i, (lr, secs) in enumerate([(1e-3, 0.030), (1e-2, 0.034), (3e-4, 0.031)]):
        _measure(store, i, _with_lr(seen, lr), secs)
    _measure(store, 3, _spec(12, 16), 0.050)
    _measure(store, 4, _spec(4, 32), 0.020)
    refit = OnlineRefit(store, base=ca.CostModel(), background=False, study="s")
    model = refit.refit_now()
    again = model.predict(_with_lr(seen, 5e-3), "cpu")
    assert again.iteration_time == pytest.approx(0.031)  # the median of its three trials
    assert again.basis["time_measured_trials"] == 3
    assert again.iteration_time_upper >= again.iteration_time
    assert any("as measured" in n and "3 earlier trials" in n for n in again.notes)
    # a configuration measured once is its measurement too, whatever the model predicts
    once = model.predict(_spec(4, 32), "cpu")
    assert once.iteration_time == pytest.approx(0.020)
    assert once.basis["time_measured_trials"] == 1
    assert abs(once.basis["time_predicted"] / 0.020 - 1) > 0.01
    # another batch size is another configuration: the model predicts it
    other = model.predict(_spec(8, 32), "cpu")
    assert "time_measured_trials" not in other.basis
    # kept where the refit is saved: another worker's copy predicts the same
    loaded = ca.CostModel.load(refit.directory / refit.history[-1]["version"])
    assert loaded.predict(_with_lr(seen, 0.1), "cpu").iteration_time == pytest.approx(0.031)
    # a model fitted without a base (the shipped kind) predicts every configuration
    plain = ca.CostModel().fit(store.observations(study="s"))
    assert "time_measured_trials" not in plain.predict(seen, "cpu").basis


# --------------------------------------------------------------------------------------
# failures: a refit that cannot be saved, rows that cannot be read
# --------------------------------------------------------------------------------------
CONFIGS = [(w, bs) for w in (4, 8, 12, 16) for bs in (8, 16, 32)]

_FULL_DISK = """
import json, pathlib, resource, signal, sys
sys.path.insert(0, sys.argv[2])
import costaware as ca
from costaware.runtime.refit import OnlineRefit
from costaware.runtime.store import ObservationStore
from tests.runtime.test_refit import CONFIGS, _record, _spec

models = pathlib.Path(sys.argv[1])
store = ObservationStore("sqlite://")  # in memory: the file-size limit is for the models
refit = OnlineRefit(store, base=ca.CostModel(), every=2, background=False, directory=models)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
tries = []
for i, (w, bs) in enumerate(CONFIGS):
    _record(store, ca.CostModel(), i, _spec(w, bs))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY))  # "disk full"
    tries.append(refit.maybe_refit())
    resource.setrlimit(resource.RLIMIT_FSIZE, unlimited)
left = sorted(p.name for p in models.iterdir() if p.name != ".refit.lock")  # the workers' lock
failures, error = refit.failures, refit.last_error
refit.refit_now()  # room again
print(json.dumps({"tries": tries, "left": left, "failures": failures, "error": error,
                  "after": sorted(p.name for p in models.iterdir()), "now": refit.failures}))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_a_refit_on_a_full_disk_backs_off_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """A save that fails midway (a real EFBIG from a file-size limit, as on a full disk)
    leaves no folder behind, and the next try waits twice as long each time."""
    repo = Path(__file__).resolve().parents[2]
    models = tmp_path / "models"
    out = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(models), str(repo)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # due after 2 measured trials; failed at 2, so 2 * 2 more (6), then 2 * 4 more (14: never)
    assert [i + 1 for i, tried in enumerate(result["tries"]) if tried] == [2, 6]
    assert result["failures"] == 2 and "File too large" in result["error"]
    assert "online refit failed (2 in a row" in out.stderr
    assert result["left"] == []  # no half-written version, no temporary folder
    versions = [n for n in result["after"] if n.startswith("v")]
    assert len(versions) == 1 and set(result["after"]) == {
        *versions,
        "LATEST",
        "refits.jsonl",
        ".refit.lock",
    }
    assert result["now"] == 0


def test_a_save_that_fails_midway_is_removed_and_versions_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ObservationStore(tmp_path / "obs.db")
    refit = OnlineRefit(store, base=ca.CostModel(), every=1, background=False, study="s")
    assert refit.directory is not None
    for i, (w, bs) in enumerate(CONFIGS[:2]):
        _record(store, ca.CostModel(), i, _spec(w, bs))
    real_save = ca.CostModel.save
    calls: list[Path] = []

    def save_then_fail(self: ca.CostModel, path: str | os.PathLike[str]) -> Path:
        calls.append(Path(path))
        real_save(self, path)  # every file written, then the disk fills up
        (Path(path) / "memory.cbm").write_bytes(b"\0" * 1000)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ca.CostModel, "save", save_then_fail)
    assert refit.maybe_refit() is True
    assert refit.failures == 1 and "No space left" in (refit.last_error or "")
    assert not calls[0].exists()
    assert [p.name for p in refit.directory.iterdir()] == [".refit.lock"]
    assert not refit.model().is_fitted  # the model in use is kept
    _record(store, ca.CostModel(), 2, _spec(*CONFIGS[2]))
    assert refit.maybe_refit() is False  # backing off: 1 * 2 more trials after a failure
    _record(store, ca.CostModel(), 3, _spec(*CONFIGS[3]))
    assert refit.maybe_refit() is True and refit.failures == 2 and len(calls) == 2

    monkeypatch.setattr(ca.CostModel, "save", real_save)
    stale = refit.directory / ".tmp-v1-1-abcd"  # left by a process killed mid-save
    stale.mkdir()
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    fresh = refit.directory / ".tmp-v2-2-abcd"  # another worker's save in flight
    fresh.mkdir()
    for i, (w, bs) in enumerate(CONFIGS[4:], start=4):
        _record(store, ca.CostModel(), i, _spec(w, bs))
        refit.maybe_refit()
    assert refit.failures == 0 and refit.model().is_fitted
    names = sorted(p.name for p in refit.directory.iterdir())
    versions = [n for n in names if n.startswith("v")]
    assert len(refit.history) > KEEP_VERSIONS == len(versions)
    assert (refit.directory / "LATEST").read_text() == refit.history[-1]["version"]
    assert refit.history[-1]["version"] in versions
    assert not stale.exists() and fresh.exists()


def test_malformed_rows_do_not_stop_the_refit(tmp_path: Path) -> None:
    """Damaged rows in a real store (through raw SQL) are skipped: the refit fits on the
    rest, and they do not make every later trial look due for a refit."""
    store = ObservationStore(tmp_path / "obs.db")
    refit = OnlineRefit(store, base=ca.CostModel(), every=3, background=False, study="s")
    for i, (w, bs) in enumerate(CONFIGS[:4]):
        _record(store, ca.CostModel(), i, _spec(w, bs))
    engine = sa.create_engine(f"sqlite:///{store.path}")
    with engine.begin() as conn:
        for trial, features in (("90", "[1, 2]"), ("91", '{"x": "abc"}'), ("92", "{oops")):
            conn.exec_driver_sql(
                "INSERT INTO costaware_predictions (created_at, study, trial, status, spec, "
                f"features) VALUES ('2026-01-01 00:00:00', 's', '{trial}', 'admitted', '{{}}', "
                f"'{features}')"
            )
            conn.exec_driver_sql(
                "INSERT INTO costaware_measurements (created_at, study, trial, status, actual) "
                f"VALUES ('2026-01-01 00:00:00', 's', '{trial}', 'ok', '{{}}')"
            )
    engine.dispose()
    assert refit.pending() == 7  # the database counts them
    with pytest.warns(ca.CostAwareWarning, match="skipped 3 malformed row"):
        assert refit.maybe_refit() is True
    assert refit.last_error is None and refit.history[-1]["rows"] == 4
    assert refit.model().is_fitted
    assert refit.pending() == 0 and refit.maybe_refit() is False


def test_a_model_refitted_on_a_store_that_is_gone_is_not_picked_up(tmp_path: Path) -> None:
    """The refitted models live beside a SQLite file. Deleting the file to start over
    leaves them there; a study on the new file at the same path must not use a model
    learned from records that are gone, while workers of one store share refits."""
    path = tmp_path / "obs.db"
    store = ObservationStore(path)
    assert store.store_id == ObservationStore(path).store_id  # kept in the file
    refit = OnlineRefit(store, base=ca.CostModel(), every=1, background=False, study="s")
    for i, (w, bs) in enumerate([(4, 8), (8, 16), (12, 32)]):
        _record(store, refit.model(), i, _spec(w, bs))
    refit.refit_now()
    assert OnlineRefit(store, base=ca.CostModel(), study="s").model().is_fitted  # shared
    store.close()
    path.unlink()
    fresh = ObservationStore(path)
    assert fresh.store_id != store.store_id
    assert (tmp_path / "obs.db.costaware-models" / "LATEST").exists()  # left behind
    later = OnlineRefit(fresh, base=ca.CostModel(), study="s")
    assert not later.model().is_fitted  # the stale model is not used


def test_a_store_that_stops_answering_mid_refit_is_no_failure_of_the_refit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's outage (said by the store when it began) does not put the refit on
    back-off: the first measured trial after the store answers again refits."""
    from costaware.runtime.store import StoreUnreachable

    store = ObservationStore(tmp_path / "obs.db")
    refit = OnlineRefit(store, base=ca.CostModel(), every=1, background=False, study="s")
    for i, (w, bs) in enumerate(CONFIGS[:2]):
        _record(store, ca.CostModel(), i, _spec(w, bs))
    read = ObservationStore.observations

    def down(self: ObservationStore, **kw: Any) -> Any:
        raise StoreUnreachable("cannot read the observation store: connection timeout expired")

    monkeypatch.setattr(ObservationStore, "observations", down)
    assert refit.maybe_refit() is True
    assert refit.failures == 0 and "connection timeout" in (refit.last_error or "")
    monkeypatch.setattr(ObservationStore, "observations", read)
    assert refit.maybe_refit() is True and refit.model().is_fitted


_EXIT_MID_REFIT = """
import logging, sys
sys.path.insert(0, sys.argv[2])
logging.basicConfig(level=logging.INFO, format="%(message)s")
import costaware as ca
from costaware.runtime.refit import OnlineRefit
from costaware.runtime.store import ObservationStore
from tests.runtime.test_refit import CONFIGS, _record, _spec

store = ObservationStore(sys.argv[1])
for i, (w, bs) in enumerate(CONFIGS * 3):  # past the line fit: CatBoost's trees
    _record(store, ca.CostModel(), i, _spec(w, bs))
refit = OnlineRefit(store, base=ca.CostModel(iterations=20_000), every=1)
assert refit.maybe_refit()
print("exiting", flush=True)
"""


def test_a_refit_in_flight_stops_when_the_process_exits(tmp_path: Path) -> None:
    """A script that ends while its background refit grows trees exits without waiting for
    the refit (which saves nothing), and without tearing Python down under CatBoost."""
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", _EXIT_MID_REFIT, str(tmp_path / "obs.db"), str(repo)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "online refit stopped: the process is exiting" in out.stderr, out.stderr[-3000:]
    assert "refitted the cost model" not in out.stderr
    assert not list((tmp_path / "obs.db.costaware-models").glob("v*"))


@pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")
def test_workers_sharing_a_store_refit_one_at_a_time(tmp_path: Path) -> None:
    """While another process refits on the models directory (it holds the lock), a refit
    that comes due is not run again on the same rows, nor counted as failed; once the lock
    is free, it runs."""
    import fcntl

    store = ObservationStore(tmp_path / "obs.db")
    refit = OnlineRefit(store, base=ca.CostModel(), every=1, background=False, study="s")
    for i, (w, bs) in enumerate(CONFIGS[:2]):
        _record(store, ca.CostModel(), i, _spec(w, bs))
    assert refit.directory is not None
    refit.directory.mkdir(parents=True)
    with (refit.directory / ".refit.lock").open("a") as other:  # another worker's refit
        fcntl.flock(other, fcntl.LOCK_EX)
        refit.maybe_refit()
        assert refit.history == [] and refit.failures == 0 and not refit.model().is_fitted
    refit.maybe_refit()
    assert len(refit.history) == 1 and refit.model().is_fitted
