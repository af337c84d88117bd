"""Tests for costaware.runtime.store on SQLite and, when COSTAWARE_TEST_POSTGRES_URL is set, PostgreSQL.

Start the PostgreSQL server with ``eval "$(bash .ci/postgres.sh)"``; without it the
PostgreSQL cases are skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import math
import multiprocessing
import os
import pathlib
import pickle
import re
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from costaware.errors import CostawareError, CostAwareWarning
from costaware.runtime.store import (
    SCHEMA_VERSION,
    ObservationStore,
    StoreError,
    StoreUnreachable,
    measurements_table,
    predictions_table,
)

PG_ENV = "COSTAWARE_TEST_POSTGRES_URL"
TABLES = ("costaware_measurements", "costaware_predictions", "costaware_meta")


def _drop_tables(url: str) -> None:
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            for table in TABLES:
                conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> str:
    """A URL to an empty store: a fresh SQLite file, or the test server with no tables."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f'{PG_ENV} is not set; run eval "$(bash .ci/postgres.sh)" first')
    _drop_tables(url)
    return url


@pytest.fixture
def store(store_url: str) -> Iterator[ObservationStore]:
    with ObservationStore(store_url) as s:
        yield s


def _predict(store: ObservationStore, trial: Any, **kw: Any) -> int:
    args: dict[str, Any] = {
        "study": "s",
        "trial": trial,
        "spec": {"name": "mlp", "batch_size": 32},
        "features": {"analytic_reserved_mib": 100.0, "x": 1.0},
        "prediction": {"peak_memory": 1.0e9},
        "decision": {"admit": True},
        "device": "H100",
        "status": "admitted",
    }
    args.update(kw)
    return int(store.record_prediction(**args))


def _measure(store: ObservationStore, trial: Any, status: str = "ok", **actual: Any) -> int:
    study = actual.pop("study", "s")
    epoch = actual.pop("epoch", None)
    return int(
        store.record_measurement(
            study=study, trial=trial, status=status, actual=actual, device="cuda:0", epoch=epoch
        )
    )


# --------------------------------------------------------------------------------------
# round trips and filters
# --------------------------------------------------------------------------------------
def test_prediction_round_trip_with_nested_json_and_nan(store: ObservationStore) -> None:
    before = dt.datetime.now(dt.timezone.utc)
    spec = {
        "name": "resnet",
        "layers": [1, 2, {"width": np.int64(64), "ratio": np.float32(0.5)}],
        "shape": np.arange(3),
        "opt": {"lr": float("nan"), "betas": (0.9, 0.999), "eps": float("inf")},
    }
    row_id = store.record_prediction(
        study="study-a",
        trial=7,
        spec=spec,
        features={"f1": np.float64(1.5), "f2": float("nan"), "f3": 3},
        prediction={"peak_memory": np.int64(2**33), "epoch_time": -math.inf},
        decision={"admit": False, "reasons": [{"kind": "memory", "text": "too big"}]},
        device="H100",
        status="rejected",
        reason="peak memory over budget",
        meta={"sampler": "TPE"},
    )
    (row,) = store.predictions()
    assert row["id"] == row_id
    assert row["study"] == "study-a"
    assert row["trial"] == "7"
    assert row["status"] == "rejected"
    assert row["device"] == "H100"
    assert row["spec"] == {
        "name": "resnet",
        "layers": [1, 2, {"width": 64, "ratio": 0.5}],
        "shape": [0, 1, 2],
        "opt": {"lr": None, "betas": [0.9, 0.999], "eps": None},
    }
    assert row["features"] == {"f1": 1.5, "f2": None, "f3": 3.0}
    assert row["prediction"] == {"peak_memory": 2**33, "epoch_time": None}
    assert row["decision"]["reasons"][0]["text"] == "too big"
    assert row["reason"] == "peak memory over budget"
    assert row["meta"] == {"sampler": "TPE"}
    created = row["created_at"]
    assert created.tzinfo is not None and created.utcoffset() == dt.timedelta(0)
    assert before - dt.timedelta(seconds=5) <= created <= before + dt.timedelta(seconds=60)


def test_measurement_round_trip(store: ObservationStore) -> None:
    actual = {
        "peak_memory": 3 * 2**30,
        "peak_allocated": 2 * 2**30,
        "iteration_time": np.float64(0.125),
        "epoch_time": 12.5,
        "nvml_peak": float("nan"),
        "memory_method": "max_memory_reserved",
        "device_kind": "cuda",
        "steps": 100,
    }
    row_id = store.record_measurement(
        study="s", trial="ray_0001", status="oom", actual=actual, device="NVIDIA H100",
        epoch=np.int64(3), reason="CUDA out of memory", meta={"host": "node1"},
    )  # fmt: skip
    (row,) = store.measurements()
    assert row["id"] == row_id
    assert (row["study"], row["trial"], row["epoch"], row["status"]) == ("s", "ray_0001", 3, "oom")
    assert row["actual"] == {**actual, "iteration_time": 0.125, "nvml_peak": None}
    assert row["reason"] == "CUDA out of memory"
    assert row["meta"] == {"host": "node1"}
    assert row["created_at"].tzinfo is not None


def test_filters_by_study_and_status(store: ObservationStore) -> None:
    _predict(store, 0, study="a", status="admitted")
    _predict(store, 1, study="a", status="rejected")
    _predict(store, 0, study="b", status="rejected")
    _predict(store, 1, study=None, status="error", features=None, reason="trace failed")
    _measure(store, 0, study="a")
    _measure(store, 0, "oom", study="a")
    _measure(store, 0, "stopped", study="b")

    assert [(r["study"], r["trial"]) for r in store.predictions()] == [
        ("a", "0"), ("a", "1"), ("b", "0"), (None, "1"),
    ]  # fmt: skip
    assert [r["trial"] for r in store.predictions(study="a")] == ["0", "1"]
    assert [r["study"] for r in store.predictions(status="rejected")] == ["a", "b"]
    assert [r["study"] for r in store.predictions(study="b", status="rejected")] == ["b"]
    assert store.predictions(study="b", status="admitted") == []
    assert store.predictions(status="error")[0]["features"] is None
    assert [r["status"] for r in store.measurements(study="a")] == ["ok", "oom"]
    assert [r["study"] for r in store.measurements(status="stopped")] == ["b"]
    ids = [r["id"] for r in store.measurements()]
    assert ids == sorted(ids) and len(set(ids)) == 3


# --------------------------------------------------------------------------------------
# observations
# --------------------------------------------------------------------------------------
def test_observations_join_and_aggregate(store: ObservationStore) -> None:
    # trial 0: two predictions (the latest counts), three usable epochs
    _predict(store, 0, features={"analytic_reserved_mib": 1.0, "x": 1.0})
    _predict(store, 0, features={"analytic_reserved_mib": 2.0, "x": float("nan")})
    _measure(
        store, 0, epoch=0, peak_memory=100, peak_allocated=80, iteration_time=0.1, epoch_time=10
    )
    _measure(
        store, 0, epoch=1, peak_memory=300, peak_allocated=90, iteration_time=0.3, epoch_time=30
    )
    _measure(store, 0, "stopped", epoch=2, peak_memory=200, iteration_time=0.2, epoch_time=20)
    # trial 1: one good epoch, then out of memory
    _predict(store, 1, spec={"family": "resnet", "name": "resnet18"})
    _measure(store, 1, epoch=0, peak_memory=500, iteration_time=0.5, epoch_time=50)
    _measure(store, 1, "oom", epoch=1)
    # trial 2: rejected, never ran; trial 3: ran without a prediction
    _predict(store, 2, status="rejected")
    _measure(store, 3, peak_memory=1)
    # trial 4: the prediction failed (no features), the trial ran anyway
    _predict(store, 4, features=None, status="error", reason="trace failed")
    _measure(store, 4, peak_memory=1)
    # trial 5: crashed for another reason before any epoch completed
    _predict(store, 5)
    _measure(store, 5, "error")
    # the same trial number in another study is another trial
    _predict(store, 0, study="other", device="A100")
    _measure(store, 0, study="other", peak_memory=7, iteration_time=0.7)

    obs = store.observations(study="s")
    assert [o.meta["trial"] for o in obs] == ["0", "1", "5"]
    t0, t1, t5 = obs
    assert t0.status == "ok"
    assert t0.features["analytic_reserved_mib"] == 2.0 and math.isnan(t0.features["x"])
    assert t0.peak_memory == 300.0 and t0.peak_allocated == 90.0
    assert t0.iteration_time == pytest.approx(0.2)
    assert t0.meta["epoch_time"] == pytest.approx(20.0)
    assert t0.meta["study"] == "s" and t0.meta["epochs"] == 3
    assert t0.device == "H100" and t0.family == "mlp"

    assert t1.status == "oom" and t1.peak_memory is None and t1.peak_allocated is None
    assert t1.iteration_time == pytest.approx(0.5)
    assert t1.family == "resnet"

    assert t5.status == "error" and t5.peak_memory is None and t5.iteration_time is None

    every = store.observations()
    assert len(every) == 4
    (other,) = [o for o in every if o.meta["study"] == "other"]
    assert other.peak_memory == 7.0 and other.device == "A100"
    assert store.count_observations(study="s") == len(obs) == 3
    assert store.count_observations() == len(every) == 4
    assert store.count_observations(study="nobody") == len(store.observations(study="nobody")) == 0


def test_observations_learn_the_step_and_the_time_between_steps(
    store: ObservationStore,
) -> None:
    """The time target is the median step; with the steps per epoch known, the epoch's
    time per step beyond it (loading and hooks between steps) is kept as the step gap, a
    cost per step that a refit adds rather than multiplies."""
    pred = {"peak_memory": 1.0e9, "spec": {"steps_per_epoch": 10}}
    _predict(store, 0, prediction=pred)
    _measure(store, 0, epoch=0, iteration_time=0.1, epoch_time=1.4)
    _measure(store, 0, epoch=1, iteration_time=0.1, epoch_time=1.2)
    _measure(store, 0, "stopped", epoch=2, iteration_time=0.1, epoch_time=0.3)  # partial epoch
    _predict(store, 1, prediction=pred)  # an epoch shorter than its steps: keep the step
    _measure(store, 1, epoch=0, iteration_time=0.2, epoch_time=1.0)
    _predict(store, 2)  # no steps per epoch predicted: the median step
    _measure(store, 2, epoch=0, iteration_time=0.3, epoch_time=9.0)
    _predict(store, 3, prediction=pred)  # an epoch cut short: the steps it measured count
    _measure(store, 3, epoch=0, iteration_time=0.1, epoch_time=0.6, steps=4)
    _predict(store, 4, prediction=pred)  # no median step (a Ray trainable): the epoch's
    _measure(store, 4, epoch=0, epoch_time=2.0)
    t0, t1, t2, t3, t4 = store.observations(study="s")
    assert t0.iteration_time == pytest.approx(0.1) and t0.meta["step_time"] == pytest.approx(0.1)
    assert t0.meta["step_gap"] == pytest.approx(0.03)
    assert t1.iteration_time == pytest.approx(0.2) and t1.meta["step_gap"] == 0.0
    assert t2.iteration_time == pytest.approx(0.3) and "step_gap" not in t2.meta
    assert t3.iteration_time == pytest.approx(0.1) and t3.meta["step_gap"] == pytest.approx(0.05)
    assert t4.iteration_time == pytest.approx(0.2) and "step_gap" not in t4.meta


def test_observations_leave_out_peaks_partly_held_by_something_else(
    store: ObservationStore,
) -> None:
    """A trial whose process already held more than MAX_HELD_BEFORE reserved bytes when
    its training started (the Lightning callback's ``held_before``) keeps its time but not
    its peak: the memory model must not learn an earlier trial's leftovers."""
    from costaware.runtime.store import MAX_HELD_BEFORE

    _predict(store, 0)
    _measure(store, 0, epoch=0, peak_memory=5 * 2**30, peak_allocated=4 * 2**30,
             iteration_time=0.2, held_before=MAX_HELD_BEFORE + 2**20)  # fmt: skip
    _predict(store, 1)  # a workspace-sized remainder is the trial's own business
    _measure(store, 1, epoch=0, peak_memory=3 * 2**30, iteration_time=0.1, held_before=64 * 2**20)
    t0, t1 = store.observations(study="s")
    assert t0.peak_memory is None and t0.peak_allocated is None and t0.status == "ok"
    assert t0.iteration_time == pytest.approx(0.2)
    assert t0.meta["memory_left_out"].startswith("257 MiB was reserved before training started")
    assert t1.peak_memory == 3 * 2**30 and "memory_left_out" not in t1.meta


def test_observations_without_study_or_trial(store: ObservationStore) -> None:
    _predict(store, 1, study=None)
    _measure(store, 1, study=None, peak_memory=10)
    _predict(store, None)  # no trial id: nothing to join on
    _measure(store, None, peak_memory=10)
    obs = store.observations()
    assert [(o.meta["study"], o.meta["trial"]) for o in obs] == [(None, "1")]
    assert store.count_observations() == 1


def test_count_observations_is_fast_on_10k_rows(store_url: str) -> None:
    n = 5000  # 5k predictions + 5k measurements
    with ObservationStore(store_url) as store:
        now = dt.datetime.now(dt.timezone.utc)
        feats = {f"f{j}": float(j) for j in range(50)}
        common = {"created_at": now, "study": "big", "device": "H100"}
        preds = [
            {**common, "trial": str(i), "status": "admitted", "spec": {"name": "m"},
             "features": None if i % 10 == 0 else feats}
            for i in range(n)
        ]  # fmt: skip
        meas = [
            {**common, "trial": str(i), "status": "ok", "actual": {"peak_memory": i}}
            for i in range(n // 2, n + n // 2)
        ]
        engine = sa.create_engine(store_url, poolclass=NullPool)
        with engine.begin() as conn:
            conn.execute(predictions_table.insert(), preds)
            conn.execute(measurements_table.insert(), meas)
        engine.dispose()

        expected = sum(1 for i in range(n // 2, n) if i % 10)
        t0 = time.perf_counter()
        count = store.count_observations(study="big")
        elapsed = time.perf_counter() - t0
        assert count == expected
        assert elapsed < 1.0, f"count_observations took {elapsed:.2f} s on {2 * n} rows"
        assert store.count_observations() == len(store.observations()) == expected


# --------------------------------------------------------------------------------------
# schema, errors, URLs
# --------------------------------------------------------------------------------------
def test_schema_version_recorded_and_newer_refused(store_url: str) -> None:
    ObservationStore(store_url).close()
    ObservationStore(store_url).close()  # reopening is idempotent
    engine = sa.create_engine(store_url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            rows = conn.exec_driver_sql("SELECT key, value FROM costaware_meta").all()
            assert [tuple(r) for r in rows] == [("schema_version", str(SCHEMA_VERSION))]
            conn.exec_driver_sql(
                f"UPDATE costaware_meta SET value = '{SCHEMA_VERSION + 1}' "
                "WHERE key = 'schema_version'"
            )
    finally:
        engine.dispose()
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}"):
        ObservationStore(store_url)


def test_unreachable_server_raises_store_error_without_password() -> None:
    pytest.importorskip("psycopg")
    t0 = time.perf_counter()
    with pytest.raises(StoreError) as info:
        ObservationStore("postgresql+psycopg://u:secret@127.0.0.1:1/db")
    assert time.perf_counter() - t0 < 5
    message = str(info.value)
    assert "secret" not in message
    assert message.startswith("cannot open the observation store at postgresql+psycopg://u:***@")
    assert isinstance(info.value, CostawareError) and isinstance(info.value, RuntimeError)


def test_server_url_and_repr_hide_the_password(store: ObservationStore) -> None:
    url = sa.engine.make_url(store.url)
    if url.get_backend_name() == "sqlite":
        assert store.path is not None and store.path.exists()
        assert repr(store) == f"ObservationStore('sqlite:///{store.path}')"
    else:
        assert store.path is None
        assert ":***@" in store.url and "costaware:costaware@" not in repr(store)


def test_unopenable_sqlite_file_raises_store_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        ObservationStore(tmp_path / "missing" / "store.db")


@pytest.mark.parametrize("kind", ["str", "path"])
def test_plain_path_is_a_sqlite_file(
    kind: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "runs.db"
    arg: str | pathlib.Path = str(target) if kind == "str" else target
    with ObservationStore(arg) as store:
        _measure(store, 1, peak_memory=5)
        assert store.path == target and target.exists()
        assert store.url == f"sqlite:///{target}"
    with ObservationStore(f"sqlite:///{target}") as again:  # the same file by URL
        assert len(again.measurements()) == 1

    monkeypatch.chdir(tmp_path)
    relative = ObservationStore("relative.db" if kind == "str" else pathlib.Path("relative.db"))
    assert relative.path == tmp_path / "relative.db"  # resolved now, not at each connect
    default = ObservationStore()
    assert default.path == tmp_path / "costaware.db" and default.path.exists()


def test_in_memory_store_shared_by_threads() -> None:
    store = ObservationStore("sqlite://")
    assert store.path is None

    def write(worker: int) -> None:
        for i in range(25):
            _measure(store, f"{worker}-{i}", peak_memory=i)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r["trial"] for r in store.measurements()}) == 100


def test_pickled_store_reopens_the_same_database(tmp_path: pathlib.Path) -> None:
    store = ObservationStore(tmp_path / "p.db")
    _measure(store, 1, peak_memory=1)
    copy = pickle.loads(pickle.dumps(store))
    assert copy.url == store.url and len(copy.measurements()) == 1


def test_bad_arguments(store: ObservationStore) -> None:
    with pytest.raises(ValueError, match=r"'admitted', 'rejected', 'error', but got 'maybe'"):
        _predict(store, 0, status="maybe")
    with pytest.raises(ValueError, match=r"'ok', 'oom', 'error', 'stopped', but got 'crashed'"):
        _measure(store, 0, "crashed")
    with pytest.raises(ValueError, match="status must be one of"):
        store.predictions(status="ok")
    with pytest.raises(ValueError, match="status must be one of"):
        store.measurements(status="admitted")
    with pytest.raises(TypeError, match=r"spec\['model'\] must be JSON-serialisable"):
        _predict(store, 0, spec={"model": object()})
    with pytest.raises(TypeError, match=r"features\['x'\] must be a number, but got str"):
        _predict(store, 0, features={"x": "big"})
    not_a_mapping: Any = []
    with pytest.raises(TypeError, match="actual must be a mapping, but got list"):
        store.record_measurement(study="s", trial=0, status="ok", actual=not_a_mapping, device=None)
    with pytest.raises(ValueError, match="epoch must be at least 0"):
        _measure(store, 0, epoch=-1)
    not_a_url: Any = 42
    with pytest.raises(TypeError, match="url must be a str"):
        ObservationStore(not_a_url)
    with pytest.raises(ValueError, match="cannot parse"):
        ObservationStore("postgresql+psycopg://u:p@host:notaport/db")
    assert store.predictions() == [] and store.measurements() == []  # nothing half-written


# --------------------------------------------------------------------------------------
# many processes at once
# --------------------------------------------------------------------------------------
WORKERS = 4
ROWS_PER_KIND = 50


def _write_rows(url: str, worker: int, n: int) -> None:
    """Open the store (creating it, maybe at the same moment as others) and write 2n rows."""
    store = ObservationStore(url)
    for i in range(n):
        tag = {"worker": worker, "i": i}
        store.record_prediction(
            study="concurrent",
            trial=f"{worker}-{i}",
            spec={"name": "mlp", **tag, "nested": {"layers": [worker, i]}},
            features={"worker": float(worker), "i": float(i)},
            prediction={"peak_memory": 1e9 + i},
            decision={"admit": True},
            device="H100",
            status="admitted",
            meta=tag,
        )
        store.record_measurement(
            study="concurrent",
            trial=f"{worker}-{i}",
            status="ok",
            actual={"peak_memory": worker * 1000 + i, "iteration_time": 0.01},
            device="H100",
            epoch=0,
            meta=tag,
        )
    store.close()


def _writer_process(worker: int, tasks: Any, results: Any, barrier: Any) -> None:
    """A spawned worker: for each URL it is sent, wait for the others, then write at once."""
    while True:
        url = tasks.get()
        try:
            barrier.wait(timeout=60)
            t0 = time.perf_counter()
            _write_rows(url, worker, ROWS_PER_KIND)
            results.put((worker, None, time.perf_counter() - t0))
        except BaseException as e:  # report it to the test instead of dying silently
            results.put((worker, f"{type(e).__name__}: {e}", 0.0))


@dataclasses.dataclass
class WriterPool:
    tasks: list[Any]
    results: Any


@pytest.fixture(scope="module")
def writers() -> Iterator[WriterPool]:
    """WORKERS spawned processes, started once for both backends (importing is the slow part)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    results = ctx.Queue()
    tasks = [ctx.Queue() for _ in range(WORKERS)]
    procs = [
        ctx.Process(target=_writer_process, args=(w, tasks[w], results, barrier), daemon=True)
        for w in range(WORKERS)
    ]
    for p in procs:
        p.start()
    yield WriterPool(tasks, results)
    for p in procs:  # idle by now; a clean exit would spend seconds unloading torch
        p.kill()
        p.join(timeout=10)


def test_concurrent_writers_lose_no_rows(store_url: str, writers: WriterPool) -> None:
    for q in writers.tasks:
        q.put(store_url)
    outcomes = sorted(writers.results.get(timeout=120) for _ in range(WORKERS))
    assert [(w, error) for w, error, _ in outcomes] == [(w, None) for w in range(WORKERS)]

    store = ObservationStore(store_url)
    preds, meas = store.predictions(), store.measurements()
    expected = {(w, i) for w in range(WORKERS) for i in range(ROWS_PER_KIND)}
    assert len(preds) + len(meas) == 2 * WORKERS * ROWS_PER_KIND == 400
    assert len({r["id"] for r in preds}) == len(preds)
    assert len({r["id"] for r in meas}) == len(meas)
    for rows in (preds, meas):
        seen = [(r["meta"]["worker"], r["meta"]["i"]) for r in rows]
        assert len(seen) == len(set(seen)) and set(seen) == expected
    for r in preds:  # every row whole
        w, i = r["meta"]["worker"], r["meta"]["i"]
        assert r["trial"] == f"{w}-{i}" and r["status"] == "admitted"
        assert r["spec"]["nested"] == {"layers": [w, i]}
        assert r["features"] == {"worker": w, "i": i}
        assert r["prediction"] == {"peak_memory": 1e9 + i} and r["decision"] == {"admit": True}
    for r in meas:
        w, i = r["meta"]["worker"], r["meta"]["i"]
        assert r["trial"] == f"{w}-{i}" and r["actual"]["peak_memory"] == w * 1000 + i
    assert store.count_observations(study="concurrent") == WORKERS * ROWS_PER_KIND
    store.close()


# --------------------------------------------------------------------------------------
# fork: children of a parent that has already used the store
# --------------------------------------------------------------------------------------
FORKED = 4
FORKED_ROWS = 50


def _forked_writer(store: ObservationStore, worker: int, start: Any = None) -> None:
    """In a forked child: write FORKED_ROWS rows through the parent's store object (all
    children at once, when given a barrier ``start``)."""
    if start is not None:
        start.wait(60)
    for i in range(FORKED_ROWS):
        store.record_measurement(
            study="forked",
            trial=f"{worker}-{i}",
            status="ok",
            actual={"peak_memory": i},
            device="cpu",
            meta={"worker": worker, "i": i},
        )


@pytest.mark.parametrize("via", ["at-fork hook", "process id check"])
def test_forked_writers_of_a_parent_that_already_wrote(store_url: str, via: str) -> None:
    """The parent's pooled connection is not the children's: each child drops the pool it
    inherited before its first query (from ``os.register_at_fork``, or, for a store the
    hook does not know, from the process-id check before every use) and opens its own.
    Sharing the parent's PostgreSQL connection hung most runs for ever."""
    import costaware.runtime.store as store_module

    store = ObservationStore(store_url)
    _measure(store, "parent-before", study="forked-parent")  # a pooled connection now
    if via == "process id check":
        store_module._LIVE_STORES.discard(store)
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(FORKED)
    children = [ctx.Process(target=_forked_writer, args=(store, w, start)) for w in range(FORKED)]
    for child in children:
        child.start()
    deadline = time.monotonic() + 120
    for child in children:
        child.join(max(0.1, deadline - time.monotonic()))
    hung = [c.pid for c in children if c.is_alive()]
    for child in children:
        if child.is_alive():
            child.kill()
            child.join()
    assert not hung, f"{len(hung)} of {FORKED} forked writers hung"
    assert [c.exitcode for c in children] == [0] * FORKED
    # the parent's own connection still works: no child closed or confused it
    _measure(store, "parent-after", study="forked-parent")
    assert [m["trial"] for m in store.measurements(study="forked-parent")] == [
        "parent-before",
        "parent-after",
    ]
    rows = store.measurements(study="forked")
    seen = [(r["meta"]["worker"], r["meta"]["i"]) for r in rows]
    assert len(seen) == len(set(seen)) == FORKED * FORKED_ROWS  # each row exactly once
    assert set(seen) == {(w, i) for w in range(FORKED) for i in range(FORKED_ROWS)}
    store.close()


def test_a_forked_child_leaves_an_in_memory_store_its_own_copy() -> None:
    """An in-memory SQLite store is one process's; a forked child works on its copy."""
    store = ObservationStore("sqlite://")
    _measure(store, 0)
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_forked_writer, args=(store, 0))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert [m["trial"] for m in store.measurements()] == ["0"]  # the child's rows are its own


# --------------------------------------------------------------------------------------
# a server that is down, or does not answer
# --------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TcpProxy:
    """A real TCP forwarder to the test server, on a port of its own.

    ``start()`` begins listening (the "server" comes up), ``freeze()`` makes every
    connection open so far swallow what it is sent and never answer (a server that
    accepts data and says nothing), while new connections are forwarded normally;
    ``freeze(new=True)`` freezes the connections to come too (a server stopped with
    SIGSTOP: the kernel still accepts them), until ``thaw()``.
    """

    def __init__(self, target: tuple[str, int], port: int) -> None:
        self.target = target
        self.port = port
        self.frozen: set[int] = set()
        self.freeze_new = False
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.listener: socket.socket | None = None

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.listener = listener
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.pairs.append((client, upstream))
            key = id(client)
            if self.freeze_new:
                self.frozen.add(key)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst, key), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, key: int) -> None:
        try:
            while data := src.recv(65536):
                if key not in self.frozen:
                    dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def freeze(self, *, new: bool = False) -> None:
        self.frozen.update(id(client) for client, _ in self.pairs)
        self.freeze_new = new

    def thaw(self) -> None:
        """New connections are forwarded again (the frozen ones stay frozen)."""
        self.freeze_new = False

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
        for pair in self.pairs:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()


def _pg_url() -> str:
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f'{PG_ENV} is not set; run eval "$(bash .ci/postgres.sh)" first')
    _drop_tables(url)
    return url


@pytest.fixture
def proxy() -> Iterator[tuple[TcpProxy, str]]:
    """A proxy (not yet listening) to the test server, and the store URL through it."""
    url = sa.engine.make_url(_pg_url())
    p = TcpProxy((str(url.host), int(url.port or 5432)), _free_port())
    yield p, url.set(port=p.port).render_as_string(hide_password=False)
    p.close()


def _once_it_answers(write: Callable[[], Any]) -> None:
    """``write()``, tried again while the store says it is down, for at most a minute."""
    deadline = time.monotonic() + 60
    while True:
        try:
            write()
            return
        except StoreUnreachable:
            assert time.monotonic() < deadline, "the store never reconnected"
            time.sleep(0.05)


def _down_url() -> str:
    pytest.importorskip("psycopg")
    return f"postgresql+psycopg://u:secret@127.0.0.1:{_free_port()}/db"  # nothing listens


def test_libpq_waits_are_bounded(store: ObservationStore) -> None:
    """Connecting gives up, and a dead server or network is noticed (TCP keepalives, the
    user timeout); a timeout in the URL wins."""
    if store.path is not None:
        pytest.skip("a SQLite file has no network to wait on")
    raw = store._engine.raw_connection()
    try:
        params = raw.driver_connection.info.get_parameters()  # type: ignore[union-attr]
    finally:
        raw.close()
    assert params["connect_timeout"] == "10"
    assert params["keepalives"] == "1" and params["keepalives_idle"] == "30"
    assert params["tcp_user_timeout"] == "60000"
    url = sa.engine.make_url(store.url.replace("***", "costaware")).update_query_dict(
        {"keepalives_idle": "7"}
    )
    mine = ObservationStore(url.render_as_string(hide_password=False))
    raw = mine._engine.raw_connection()
    try:
        assert raw.driver_connection.info.get_parameters()["keepalives_idle"] == "7"  # type: ignore[union-attr]
    finally:
        raw.close()
        mine.close()


def test_a_connection_check_with_no_answer_gives_up(
    proxy: tuple[TcpProxy, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pooled connection to a server that takes data and never answers: the check before
    its next use hangs it up after PING_TIMEOUT_S, and the write goes through a new one."""
    import costaware.runtime.store as store_module

    monkeypatch.setattr(store_module, "PING_TIMEOUT_S", 1.0)
    p, url = proxy
    p.start()
    store = ObservationStore(url)
    _measure(store, 0)  # one pooled connection, through the proxy
    p.freeze()  # it will never answer again
    done: list[Any] = []
    writer = threading.Thread(target=lambda: done.append(_measure(store, 1)), daemon=True)
    writer.start()
    writer.join(60)
    assert not writer.is_alive(), "the write waited on a connection that never answers"
    assert len(done) == 1
    assert [m["trial"] for m in store.measurements()] == ["0", "1"]
    store.close()


def test_a_server_that_stops_answering_holds_one_write_not_every_one(
    proxy: tuple[TcpProxy, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that takes connections and never answers (stopped with SIGSTOP), met by a
    store opened with ``retry``: the write that finds it out waits for the connection
    check and one connection timeout, and raises StoreUnreachable with a warning; the
    writes after it raise at once (a try that is due holds them RETRY_WAIT_S at most),
    and once the server answers again, writes go through."""
    import costaware.runtime.store as store_module

    monkeypatch.setattr(store_module, "PING_TIMEOUT_S", 1.0)
    monkeypatch.setattr(store_module, "CONNECT_TIMEOUT_S", 2)  # libpq's least
    monkeypatch.setattr(store_module, "RETRY_FIRST_S", 0.05)
    monkeypatch.setattr(store_module, "RETRY_WAIT_S", 0.2)
    p, url = proxy
    p.start()
    store = ObservationStore(url, retry=True)
    _measure(store, 0)
    p.freeze(new=True)
    with (
        pytest.warns(CostAwareWarning, match="connection timeout expired.*goes on without it"),
        pytest.raises(StoreUnreachable, match="cannot write to the observation store"),
    ):
        _measure(store, "lost")
    for trial in range(3):
        t0 = time.monotonic()
        with pytest.raises(StoreUnreachable, match="tries again in"):
            _measure(store, f"lost{trial}")
        with pytest.raises(StoreUnreachable):
            store.count_observations()
        assert time.monotonic() - t0 < 1.5, "a write waited on the server that never answers"
        time.sleep(0.1)  # a try is due at the next write, and runs in the background
    p.thaw()
    _once_it_answers(lambda: _measure(store, 1))
    assert [m["trial"] for m in store.measurements()] == ["0", "1"]
    store.close()


def test_an_unreachable_server_raises_unless_retry() -> None:
    url = _down_url()
    with pytest.raises(StoreUnreachable, match="cannot open the observation store"):
        ObservationStore(url)
    with pytest.warns(CostAwareWarning, match="goes on without it.*tries again in 1 s"):
        store = ObservationStore(url, retry=True)
    for _ in range(3):  # until the next try is due: at once, without touching the network
        with pytest.raises(StoreUnreachable, match="tries again in"):
            _predict(store, 0)
        with pytest.raises(StoreUnreachable):
            store.observations()
    assert "secret" not in repr(store) + store.url
    with pytest.warns(CostAwareWarning, match="goes on without it"):
        copy = pickle.loads(pickle.dumps(store))  # a worker's copy retries too
    assert copy._retry and not copy._ready


def test_a_server_that_refuses_is_no_reason_to_retry() -> None:
    """A wrong password is the caller's to fix: it raises even with ``retry``."""
    url = sa.engine.make_url(_pg_url()).set(password="not-the-password")
    with pytest.raises(StoreError, match="password authentication failed") as info:
        ObservationStore(url.render_as_string(hide_password=False), retry=True)
    assert not isinstance(info.value, StoreUnreachable)


def test_a_server_that_comes_back_gets_the_writes(
    proxy: tuple[TcpProxy, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import costaware.runtime.store as store_module

    monkeypatch.setattr(store_module, "RETRY_FIRST_S", 0.05)
    p, url = proxy
    with pytest.warns(CostAwareWarning, match="cannot open the observation store"):
        store = ObservationStore(url, retry=True)
    with pytest.raises(StoreUnreachable):
        _predict(store, "lost")
    p.start()  # the server is back
    _once_it_answers(lambda: _predict(store, 1))
    _measure(store, 1)
    assert [r["trial"] for r in store.predictions()] == ["1"]
    assert store.count_observations() == 1
    store.close()


def test_a_study_whose_store_is_down_at_start_up_runs_and_records_once_it_is_back(
    proxy: tuple[TcpProxy, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``CostAwarePruner(store=URL)`` with the database down: the study starts and runs,
    each trial judged and warned about; once the database answers, predictions land."""
    pytest.importorskip("optuna")
    import optuna

    import costaware.runtime.store as store_module
    from costaware.integrations.optuna import CostAwarePruner
    from tests.integrations.test_optuna import BUDGET, _run, spec_fn

    monkeypatch.setattr(store_module, "RETRY_FIRST_S", 0.01)
    p, url = proxy
    with pytest.warns(CostAwareWarning, match="goes on without it"):
        pruner = CostAwarePruner(
            spec_fn=spec_fn, budget=BUDGET, device="T4", store=url, refit_every=2
        )
    study = optuna.create_study(study_name="down", pruner=pruner)
    with pytest.warns(CostAwareWarning, match="could not write to the store"):
        _run(study, 2)
    assert len(study.trials) == 2
    assert all("costaware:admit" in t.user_attrs for t in study.trials)
    assert all("costaware:store_error" in t.user_attrs for t in study.trials)
    p.start()  # the database is back: a trial soon after the next try is recorded
    deadline = time.monotonic() + 60
    while True:
        _run(study, 1)
        if "costaware:store_error" not in study.trials[-1].user_attrs:
            break
        assert time.monotonic() < deadline, "the store never reconnected"
        time.sleep(0.1)
    recorded = {r["trial"] for r in ObservationStore(url).predictions(study="down")}
    assert str(study.trials[-1].number) in recorded and not recorded & {"0", "1"}


# --------------------------------------------------------------------------------------
# malformed rows
# --------------------------------------------------------------------------------------
def _raw_insert(url: str, table: str, **values: Any) -> None:
    """Insert one row with raw SQL, around every check this module makes."""
    engine = sa.create_engine(url, poolclass=NullPool)
    pg = engine.dialect.name == "postgresql"
    values.setdefault("created_at", "2026-01-01 00:00:00")
    columns = ", ".join(values)
    casts = {k: "jsonb" for k in _JSON_COLUMNS} | {"created_at": "timestamptz"}
    marks = ", ".join(f"CAST(:{k} AS {casts[k]})" if pg and k in casts else f":{k}" for k in values)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"INSERT INTO {table} ({columns}) VALUES ({marks})"), values)
    finally:
        engine.dispose()


_JSON_COLUMNS = ("spec", "features", "prediction", "decision", "meta", "actual")


def _damage(url: str) -> dict[str, set[str]]:
    """Write malformed rows of trials "bad-*" with raw SQL; the reasons expected, by table."""
    p, m = "costaware_predictions", "costaware_measurements"
    good_p = {"study": "s", "status": "admitted", "device": "H100", "spec": '{"name": "mlp"}'}
    good_m = {"study": "s", "status": "ok", "device": "H100", "actual": '{"peak_memory": 5}'}
    _raw_insert(url, p, **good_p, trial="bad-1", features="[1, 2]")
    _raw_insert(url, p, **good_p, trial="bad-2", features='{"x": "abc"}')
    _raw_insert(url, p, **{**good_p, "status": "maybe"}, trial="bad-3", features='{"x": 1}')
    _raw_insert(url, m, **{**good_m, "actual": '"a string"'}, trial="bad-1")
    _raw_insert(url, m, **good_m, trial="bad-2", epoch=-1)
    expected = {
        p: {
            "features is not a JSON object (a list)",
            "features['x'] is not a number (a string)",
            "status 'maybe' is unknown",
        },
        m: {
            "actual is not a JSON object (a string)",
            "epoch is not a whole number >= 0 (a number)",
        },
    }
    if sa.engine.make_url(url).get_backend_name() == "sqlite":  # no types to stop these
        _raw_insert(url, p, **good_p, trial="bad-4", features="{not json")
        _raw_insert(url, m, **{**good_m, "created_at": "yesterday"}, trial="bad-4")
        _raw_insert(url, m, **{**good_m, "actual": "{'peak_memory': 5}"}, trial="0")
        expected[p].add("features is not valid JSON")
        expected[m] |= {"created_at is unreadable", "actual is not valid JSON"}
    return expected


def test_malformed_rows_are_skipped_counted_and_reported(store: ObservationStore) -> None:
    """Rows that this module would never write (written by other means, or damaged) are
    left out of every reader, each once, with one warning naming how many and why."""
    url = store.url.replace("***", "costaware")
    for trial in range(3):
        _predict(store, trial)
        _measure(store, trial, peak_memory=1e8 + trial, iteration_time=0.01)
    expected = _damage(url)
    n_bad = sum(len(v) for v in expected.values())

    with pytest.warns(CostAwareWarning) as caught:
        observations = store.observations(study="s")
    assert sorted(o.meta["trial"] for o in observations) == ["0", "1", "2"]
    (warning,) = [w for w in caught if "malformed" in str(w.message)]
    text = str(warning.message)
    assert f"skipped {n_bad} malformed row(s)" in text
    named = [why for reasons in expected.values() for why in reasons if why in text]
    assert len(named) == min(5, n_bad)  # the five commonest reasons, then how many others
    if n_bad > 5:
        assert f"and {n_bad - 5} other kinds" in text
    by_table: dict[str, set[str]] = {}
    for row in store.skipped:
        by_table.setdefault(row["table"], set()).add(row["reason"])
    assert by_table == expected

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rows already reported are not warned about again
        predictions = store.predictions(study="s")
        measurements = store.measurements(study="s")
        again = store.observations(study="s")
    assert [r["trial"] for r in predictions] == ["0", "1", "2"]
    assert {r["trial"] for r in measurements} <= {"0", "1", "2", "bad-3"}
    assert [o.meta["trial"] for o in again] == [o.meta["trial"] for o in observations]
    assert len(store.skipped) == n_bad


def test_a_drivers_message_masks_the_password_not_every_word_like_it() -> None:
    from costaware.runtime.store import _reason

    url = sa.engine.make_url("postgresql+psycopg://costaware:costaware@127.0.0.1:5432/x")
    message = _reason(
        RuntimeError(
            "costaware: connection to postgresql://costaware:costaware@host/x failed "
            "(password=costaware): timeout expired"
        ),
        url,
    )
    assert "costaware:***@host" in message and "password=***" in message
    assert message.startswith("costaware: connection")  # the word itself is left alone
    short = sa.engine.make_url("postgresql+psycopg://u:p@h/x")
    assert _reason(RuntimeError("connection timeout expired"), short) == "connection timeout expired"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("sqllite:///x.db", "no database is called 'sqllite'; did you mean sqlite?"),
        ("postgress://u@h/db", "no database is called 'postgress'; did you mean postgresql?"),
        ("postgresql+nosuchdriver://u@h/db", "its database driver is not installed"),
        ("postgresql+pyscopg://u@h/db", "no driver is called 'pyscopg'; did you mean psycopg?"),
    ],
)
def test_a_misspelt_database_in_the_url_says_which_was_meant(url: str, words: str) -> None:
    with pytest.raises(StoreError, match=re.escape(words)):
        ObservationStore(url)


@pytest.mark.parametrize(
    ("url", "meant"),
    [("sqlite:/tmp/x.db", "sqlite:////tmp/x.db"), ("postgresql:/h/db", "postgresql://h/db")],
)
def test_a_url_that_lacks_its_slashes_is_not_taken_for_a_path(url: str, meant: str) -> None:
    """``sqlite:/tmp/x.db`` became a file in a folder named ``sqlite:`` under the current
    directory; it is refused with the URL meant."""
    with pytest.raises(ValueError, match=re.escape(f"did you mean '{meant}'?")):
        ObservationStore(url)


def test_a_store_whose_tables_went_away_creates_them_again(
    store: ObservationStore, store_url: str
) -> None:
    """The store's tables dropped while it is in use (a SQLite file deleted under a running
    study leaves a new empty file; a database reset): the next write creates them again,
    says so once, and what follows is kept, where every later write failed."""
    _predict(store, 0)
    _drop_tables(store_url)
    with pytest.warns(CostAwareWarning, match="lost its tables while in use"):
        _predict(store, 1)
    _measure(store, 1, epoch=0, iteration_time=0.1)
    assert [p["trial"] for p in store.predictions()] == ["1"]
    assert len(store.measurements()) == 1


def test_a_store_in_a_directory_it_cannot_write_says_so(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite cannot open a store whose directory is read-only (a read-only mount), even
    one that exists, and says only "unable to open database file": the message names the
    directory and why."""
    import sqlite3

    store = ObservationStore(tmp_path / "store.db")
    error = sa.exc.OperationalError("open", {}, sqlite3.OperationalError("unable to open database file"))
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if pathlib.Path(p) == tmp_path else real_access(p, mode)
    )
    said = store._cannot_open(error)
    assert "unable to open database file" in said
    assert f"the directory {tmp_path} is not writable" in said
