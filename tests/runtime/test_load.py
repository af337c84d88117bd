"""Load tests: everything that touches one observation store at once, and kill -9 mid-write.

One driver process (a fresh interpreter, so that a crash is an exit status here) runs, all
at the same time, against one store:

- WRITERS separate processes, each opening the store by its URL and writing predictions
  and measurements (workers of a parallel study);
- a pool of FORK_WORKERS processes forked (``multiprocessing`` fork context) from the
  driver after it has written through its store object, running FORK_TASKS tasks that
  write measurements through that inherited object;
- a reader thread rendering reports of the whole store (HTML and Markdown) and refitting
  the study's model on the study's trials, over and over, until the rest is done;
- an Optuna study on SQLite with ``n_jobs=2`` whose STUDY_TRIALS trials each train a real
  Lightning Trainer on the CPU with the real ``CostAwareCallback`` (a spec, so a dry run
  and a prediction per trial, and an enforced budget that stops the odd trials after their
  first epoch).

The writers and the forked tasks write at least MIN_ROWS rows each, and go on until the
study is over, so that every part overlaps every other however the machine schedules them.

The test then reads the store back: every row written is there exactly once, the study's
trials ended COMPLETE or PRUNED as their budgets say (never FAIL), each callback's records
are the store's, the refit and the reports never failed, and the driver's stderr still
reaches the parent at the end. Every wait is bounded: a hang fails the test. Nothing is
timed.

A second test kills writer processes with SIGKILL in the middle of their writes, round
after round: no row they saw committed is lost, and the store still opens, takes writes and
(SQLite) passes its integrity check.

Against SQLite always; against PostgreSQL when ``COSTAWARE_TEST_POSTGRES_URL`` is set
(``eval "$(bash .ci/postgres.sh)"``), in a schema of its own, created and dropped here, so
that it neither touches nor is touched by other tests' tables on the same server.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from costaware.runtime.store import ObservationStore

PG_ENV = "COSTAWARE_TEST_POSTGRES_URL"
ALIVE = "costaware-load-test: stderr still reaches the parent"
#: the whole scenario, imports included, must end within this (it takes far less); beyond
#: it the driver and everything it started are killed and the test fails as a hang
SCENARIO_TIMEOUT_S = 240

WRITERS = 8
FORK_WORKERS, FORK_TASKS = 4, 8  # the second four tasks run in children that already wrote
#: rows each writer and forked task writes at least, and at most (a bound, never reached)
MIN_ROWS, MAX_ROWS = 10, 5000
#: seconds a writer waits between rows: writes keep coming without starving the study
PAUSE_S = 0.02
STUDY_TRIALS = 4
WRITERS_STUDY, FORK_STUDY, PARENT_STUDY, OPTUNA_STUDY = (
    "load-writers",
    "load-fork",
    "load-parent",
    "load-study",
)

# one writer process: opens the store by its URL (creating the tables, maybe at the same
# moment as the others) and writes a prediction and a measurement per row, at least
# MIN_ROWS rows and on until the stop file appears (the study is over); prints how many
_WRITER = r"""
import os, sys, time
from costaware.runtime.store import ObservationStore

url, worker, study, stop_file = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
min_rows, max_rows, pause = int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
driver = os.getppid()
store = ObservationStore(url)
i = 0
while i < max_rows and (i < min_rows or not os.path.exists(stop_file)):
    if os.getppid() != driver:  # the driver is gone: nobody will read what is written
        sys.exit(3)
    tag = {"worker": worker, "i": i}
    store.record_prediction(
        study=study, trial=f"{worker}-{i}", spec={"name": "mlp", "batch_size": 8},
        features={"worker": float(worker), "i": float(i)},
        prediction={"peak_memory": 1e6 + i, "iteration_time": 0.01},
        decision={"admit": True}, device="CPU", status="admitted", meta=tag,
    )
    store.record_measurement(
        study=study, trial=f"{worker}-{i}", status="ok", epoch=0, device="CPU", meta=tag,
        actual={"peak_memory": worker * 1000 + i, "iteration_time": 0.01, "epoch_time": 0.08},
    )
    i += 1
    time.sleep(pause)
store.close()
print(i)
"""

# the driver: starts the fork pool, the writers, the reader and the study; when the study
# is over, stops the writers and waits for each part with a bound; prints what only it can
# see as one JSON line
_DRIVER = r"""
import json, multiprocessing, os, subprocess, sys, threading, time, traceback, warnings

url, workdir, alive, writer_code = sys.argv[1:5]
(writers, fork_workers, fork_tasks, min_rows, max_rows, trials) = map(int, sys.argv[5:11])
pause = float(sys.argv[11])
WRITERS_STUDY, FORK_STUDY, PARENT_STUDY, OPTUNA_STUDY = (
    "load-writers", "load-fork", "load-parent", "load-study"
)
WAIT_S = 120  # for all the parts together, after the study: beyond it, a part has hung

import optuna
import lightning.pytorch as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import costaware as ca
from costaware import ObservationStore, OnlineRefit, report
from costaware.integrations.lightning import CostAwareCallback

torch.set_num_threads(1)
optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", message=".*(LeafSpec|num_workers|does not have many).*")
stderr_at_start = os.fstat(2)
stop_file = os.path.join(workdir, "stop")

# the driver writes through its store object before forking: the pool's children inherit
# a store that holds a pooled connection (PostgreSQL) and must not use it
STORE = ObservationStore(url)
STORE.record_measurement(study=PARENT_STUDY, trial="before", status="ok", device="CPU",
                         actual={"peak_memory": 1})
fork = multiprocessing.get_context("fork")
stop_forked = fork.Event()


def fork_task(task):
    # in a forked child, through the store object inherited from the driver
    i = 0
    while i < max_rows and (i < min_rows or not stop_forked.is_set()):
        STORE.record_measurement(
            study=FORK_STUDY, trial=f"{task}-{i}", status="ok", device="CPU", epoch=0,
            actual={"peak_memory": i}, meta={"task": task, "i": i, "pid": os.getpid()},
        )
        i += 1
        time.sleep(pause)
    return task, i, os.getpid()


# forked before any thread of the driver starts (forking a process that runs threads may
# deadlock in any library's locks, which would be this test's doing, not costaware's)
pool = fork.Pool(fork_workers)
forked = pool.map_async(fork_task, range(fork_tasks), chunksize=1)
procs = [
    subprocess.Popen(
        [sys.executable, "-c", writer_code, url, str(w), WRITERS_STUDY, stop_file,
         str(min_rows), str(max_rows), str(pause)],
        stdout=subprocess.PIPE, text=True,
    )
    for w in range(writers)
]

# the reader: reports of the whole store and refits on the study, until told to stop
stop_reading = threading.Event()
reader = {"reports": 0, "refits": 0, "errors": [], "trials_seen": []}
refit = OnlineRefit(ObservationStore(url), study=OPTUNA_STUDY,
                    directory=os.path.join(workdir, "models"), background=False)


def read_once():
    rep = report(store=refit.store)
    rep.to_html()
    rep.to_markdown()
    reader["reports"] += 1
    reader["trials_seen"].append(len(rep.trials))
    if refit.maybe_refit():
        reader["refits"] += 1


def read():
    while not stop_reading.is_set():
        try:
            read_once()
        except Exception:
            reader["errors"].append(traceback.format_exc())
            stop_reading.wait(0.5)


reader_thread = threading.Thread(target=read, name="load-reader")
reader_thread.start()


class Regressor(L.LightningModule):
    def __init__(self, width):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def net(width):
    return lambda: Regressor(width).net


callbacks = {}
generous = ca.Budget(max_memory="4GiB", max_epoch_time="10min")
# any measured epoch is over it (its peak, or, where no peak is measured, its time):
# stopped after its first epoch, PRUNED
tight = ca.Budget(max_memory="1KiB", max_epoch_time=0.001)


def objective(trial):
    width = trial.suggest_categorical("width", [32, 64])
    g = torch.Generator().manual_seed(trial.number)
    data = DataLoader(
        TensorDataset(torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)),
        batch_size=8,
    )
    spec = ca.TrainingSpec(model=net(width), batch=ca.ImageBatch((16,), classes=1),
                           batch_size=8, dataset_size=32)
    # the tight trials train (judge_before=False), so that their measured epoch stops
    # them: a write of the measured stop under load
    cb = CostAwareCallback(store=url, spec=spec, trial=trial, enforce=True,
                           budget=tight if trial.number % 2 else generous,
                           judge_before=not trial.number % 2)
    callbacks[trial.number] = cb
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=2, callbacks=[cb], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Regressor(width), data)
    return float(width)


study = optuna.create_study(study_name=OPTUNA_STUDY,
                            storage=f"sqlite:///{os.path.join(workdir, 'optuna.db')}")
study.optimize(objective, n_trials=trials, n_jobs=2, catch=())
out = {"states": {t.number: t.state.name for t in study.trials}}

# the study is over: stop the writers, and wait for every part, all within WAIT_S
open(stop_file, "w").close()
stop_forked.set()
deadline = time.monotonic() + WAIT_S
left = lambda: max(1.0, deadline - time.monotonic())
try:
    out["fork"] = {"tasks": forked.get(timeout=left())}
except multiprocessing.TimeoutError:
    out["fork"] = {"error": "hung"}
except Exception:
    out["fork"] = {"error": traceback.format_exc()}
pool.terminate()
pool.join()
out["writers"] = []
for p in procs:
    try:
        rows, _ = p.communicate(timeout=left())
        out["writers"].append([p.returncode, int(rows) if p.returncode == 0 else None])
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        out["writers"].append(["hung", None])
stop_reading.set()
reader_thread.join(left())
out["reader_hung"] = reader_thread.is_alive()
if not out["reader_hung"]:
    try:
        read_once()  # once more, with the study's trials all measured
    except Exception:
        reader["errors"].append(traceback.format_exc())
out["reader"] = reader
out["refit"] = {"history": refit.history, "failures": refit.failures,
                "last_error": refit.last_error}

# the driver's own store object still works after its children used their copies
STORE.record_measurement(study=PARENT_STUDY, trial="after", status="ok", device="CPU",
                         actual={"peak_memory": 1})
out["callbacks"] = {
    n: [[r["kind"], r["id"], r.get("status"), r.get("epoch")] for r in cb.records]
    for n, cb in callbacks.items()
}
out["stderr_same"] = os.path.samestat(stderr_at_start, os.fstat(2))
print(json.dumps(out))
sys.stdout.flush()
sys.stderr.write(alive + "\n")
sys.stderr.flush()
"""


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL to an empty store: a fresh SQLite file, or a fresh schema on the test server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    url = os.environ.get(PG_ENV)
    if not url:
        pytest.skip(f'{PG_ENV} is not set; run eval "$(bash .ci/postgres.sh)" first')
    schema = f"costaware_load_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
        # every connection of the store (libpq's options) sees this schema first, and only it
        yield (
            sa.engine.make_url(url)
            .update_query_dict({"options": f"-csearch_path={schema}"})
            .render_as_string(hide_password=False)
        )
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        engine.dispose()


def _run_driver(url: str, workdir: Path) -> tuple[dict[str, Any], str]:
    """Run the driver in a session of its own; its JSON result and its stderr.

    Its output goes to files, not pipes: a writer or forked child that outlives a crashed
    driver holds a pipe open, and waiting for the pipe's end would call a crash a hang.
    Whatever of the session is left when the driver ends (or is killed, past
    SCENARIO_TIMEOUT_S) is killed with it.
    """
    args = [
        sys.executable,
        "-c",
        _DRIVER,
        url,
        str(workdir),
        ALIVE,
        _WRITER,
        *map(str, (WRITERS, FORK_WORKERS, FORK_TASKS, MIN_ROWS, MAX_ROWS, STUDY_TRIALS)),
        str(PAUSE_S),
    ]
    out_path, err_path = workdir / "driver.out", workdir / "driver.err"
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=err,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            proc.wait(timeout=SCENARIO_TIMEOUT_S)
            hung = False
        except subprocess.TimeoutExpired:
            hung = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the driver if hung, and what it left
        proc.wait()
    stdout, stderr = out_path.read_text(), err_path.read_text()
    tail = stderr[-3000:]
    if hung:
        pytest.fail(
            f"the load scenario hung: still running after {SCENARIO_TIMEOUT_S} s; stderr:\n{tail}"
        )
    assert proc.returncode == 0, f"exit status {proc.returncode}; stderr:\n{tail}"
    assert stderr.rstrip().endswith(ALIVE), f"stderr lost its end:\n{tail}"
    return json.loads(stdout.strip().splitlines()[-1]), stderr


def _once(keys: list[tuple[Any, ...]], expected: set[tuple[Any, ...]], what: str) -> None:
    """Each of ``expected`` appears in ``keys`` exactly once, and nothing else does."""
    twice = [k for k, n in Counter(keys).items() if n > 1]
    assert not twice, f"{what}: {len(twice)} rows written twice, e.g. {twice[:3]}"
    lost = expected - set(keys)
    assert not lost, f"{what}: {len(lost)} of {len(expected)} rows lost, e.g. {sorted(lost)[:3]}"
    assert set(keys) == expected, f"{what}: rows nobody wrote: {sorted(set(keys) - expected)[:3]}"


@pytest.mark.slow
def test_writers_fork_pool_reader_and_a_threaded_study_share_one_store(
    store_url: str, tmp_path: Path
) -> None:
    result, stderr = _run_driver(store_url, tmp_path)

    # every part ended, none hung, none failed
    assert [code for code, _ in result["writers"]] == [0] * WRITERS, result["writers"]
    assert "error" not in result["fork"], result["fork"]["error"]
    written_by = {w: rows for w, (_, rows) in enumerate(result["writers"])}
    forked = {task: (rows, pid) for task, rows, pid in result["fork"]["tasks"]}
    assert sorted(forked) == list(range(FORK_TASKS))
    for rows in [*written_by.values(), *(rows for rows, _ in forked.values())]:
        assert MIN_ROWS <= rows <= MAX_ROWS
    assert not result["reader_hung"], "the reader thread hung"
    reader = result["reader"]
    assert reader["errors"] == [], "the reader failed:\n" + "\n".join(reader["errors"][:2])
    assert reader["reports"] >= 1
    assert result["stderr_same"], "file descriptor 2 was redirected and not restored"
    assert "could not write to the observation store" not in stderr, stderr[-3000:]

    # the study: the budget decides each trial's end, costaware never fails one
    states = {int(n): s for n, s in result["states"].items()}
    assert states == {n: "PRUNED" if n % 2 else "COMPLETE" for n in range(STUDY_TRIALS)}, (
        f"trial states {states}; stderr:\n{stderr[-3000:]}"
    )

    # the refit learned from the study's trials, and never failed
    refit = result["refit"]
    assert refit["failures"] == 0 and refit["last_error"] is None, refit
    assert refit["history"], "the study's measured trials were never refitted on"

    store = ObservationStore(store_url)
    try:
        # the writer processes: every row each one says it wrote, once
        expected = {(w, i) for w, rows in written_by.items() for i in range(rows)}
        for rows in (
            store.predictions(study=WRITERS_STUDY),
            store.measurements(study=WRITERS_STUDY),
        ):
            _once([(r["meta"]["worker"], r["meta"]["i"]) for r in rows], expected, "writers")
            for r in rows:
                assert r["trial"] == f"{r['meta']['worker']}-{r['meta']['i']}", r
        assert store.count_observations(study=WRITERS_STUDY) == len(expected)

        # the fork pool: every row once, each written by the forked child that ran its task
        rows = store.measurements(study=FORK_STUDY)
        _once(
            [(r["meta"]["task"], r["meta"]["i"]) for r in rows],
            {(t, i) for t, (n, _) in forked.items() for i in range(n)},
            "fork pool",
        )
        assert all(r["meta"]["pid"] == forked[r["meta"]["task"]][1] for r in rows)
        assert len({pid for _, pid in forked.values()}) > 1  # more than one child wrote
        # the driver's own store object, before the fork and after its children used theirs
        assert [r["trial"] for r in store.measurements(study=PARENT_STUDY)] == [
            "before",
            "after",
        ]

        # the study: each callback's records are the store's rows, each once
        predictions = store.predictions(study=OPTUNA_STUDY)
        measurements = store.measurements(study=OPTUNA_STUDY)
        by_id = {("prediction", r["id"]): r for r in predictions} | {
            ("measurement", r["id"]): r for r in measurements
        }
        written = []
        for n, records in result["callbacks"].items():
            n = int(n)
            kinds = [(kind, status, epoch) for kind, _, status, epoch in records]
            if states[n] == "COMPLETE":
                assert kinds == [
                    ("prediction", "admitted", None),
                    ("measurement", "ok", 0),
                    ("measurement", "ok", 1),
                ], (n, records)
            else:  # over the tight budget after its first epoch
                assert kinds == [
                    ("prediction", "admitted", None),
                    ("measurement", "stopped", 0),
                ], (n, records)
            for kind, row_id, status, epoch in records:
                assert row_id is not None, f"trial {n}: a {kind} was not written: {records}"
                row = by_id[(kind, row_id)]
                got = (row["trial"], row["status"], row.get("epoch"))
                assert got == (str(n), status, epoch), (row, records)
                written.append((kind, row_id))
        _once(written, set(by_id), "the study's callbacks")
        assert store.count_observations(study=OPTUNA_STUDY) == STUDY_TRIALS
        assert store.skipped == []
    finally:
        store.close()
    fork_rows = sum(rows for rows, _ in forked.values())
    print(  # the figures behind docs/reliability.md (pytest -rP shows them)
        f"{WRITERS} writers: {2 * len(expected)} rows; {FORK_TASKS} forked tasks: "
        f"{fork_rows} rows; {reader['reports']} reports and {len(refit['history'])} refits "
        f"read meanwhile; {STUDY_TRIALS} trials: {sorted(Counter(states.values()).items())}"
    )


# --------------------------------------------------------------------------------------
# kill -9 in the middle of writes
# --------------------------------------------------------------------------------------
#: rounds of writers killed at once (COSTAWARE_TEST_KILL_ROUNDS for more)
KILL_ROUNDS = int(os.environ.get("COSTAWARE_TEST_KILL_ROUNDS", "3"))
KILL_WRITERS = 4

# a writer that says which row it has written once the store has committed it: a line
# "i id" on stdout after each record_measurement returns
_KILLED_WRITER = r"""
import sys
from costaware.runtime.store import ObservationStore

url, round_, worker = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = ObservationStore(url)
i = 0
while True:
    row = store.record_measurement(
        study="kill", trial=f"{round_}-{worker}-{i}", status="ok", device="CPU", epoch=0,
        actual={"peak_memory": i, "iteration_time": 0.01},
        meta={"round": round_, "worker": worker, "i": i},
    )
    print(i, row, flush=True)
    i += 1
"""


def _lines(path: Path) -> list[tuple[int, int]]:
    """The whole lines ``i id`` a killed writer printed (a last line cut short is left out)."""
    text = path.read_text()
    whole = text[: text.rfind("\n") + 1]
    return [(int(i), int(row)) for i, row in (line.split() for line in whole.splitlines())]


@pytest.mark.slow
def test_writers_killed_mid_write_lose_no_committed_row(store_url: str, tmp_path: Path) -> None:
    """KILL_ROUNDS times, KILL_WRITERS processes writing at once are killed with SIGKILL at
    a random moment: every row a writer saw committed is in the store, once; at most the
    one it was writing when killed is there besides; the store opens and takes writes
    after every round, and a SQLite file passes its integrity check."""
    rng = random.Random(46)
    committed = 0
    for r in range(KILL_ROUNDS):
        outs = [tmp_path / f"kill-{r}-{w}.out" for w in range(KILL_WRITERS)]
        errs = [path.with_suffix(".err") for path in outs]
        procs = []
        for w, (out_path, err_path) in enumerate(zip(outs, errs)):
            with out_path.open("w") as out, err_path.open("w") as err:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", _KILLED_WRITER, store_url, str(r), str(w)],
                        stdout=out,
                        stderr=err,
                    )
                )
        try:
            # every writer has committed a row, then a random moment later: all killed
            deadline = time.monotonic() + 60
            while not all(path.read_text().count("\n") >= 1 for path in outs):
                ended = [w for w, proc in enumerate(procs) if proc.poll() is not None]
                assert not ended, "writers ended before they were killed:\n" + "\n".join(
                    f"writer {w}: exit status {procs[w].returncode}, stderr:\n"
                    f"{errs[w].read_text()[-2000:]}"
                    for w in ended
                )
                assert time.monotonic() < deadline, "the writers wrote nothing in 60 s"
                time.sleep(0.02)
            time.sleep(rng.uniform(0.05, 0.5))
        finally:
            for proc in procs:
                proc.kill()
            for proc in procs:
                proc.wait(timeout=60)

        with ObservationStore(store_url) as store:  # opens after the kill, and takes writes
            rows = store.measurements(study="kill")
            store.record_measurement(
                study="kill-after", trial=str(r), status="ok", device="CPU", actual={}
            )
        for w, path in enumerate(outs):
            printed = _lines(path)
            mine = [x for x in rows if x["meta"]["round"] == r and x["meta"]["worker"] == w]
            stored = {(x["meta"]["i"], x["id"]) for x in mine}
            assert len(stored) == len(mine), f"round {r}, writer {w}: a row written twice"
            lost = set(printed) - stored
            assert not lost, f"round {r}, writer {w}: committed rows lost: {sorted(lost)[:5]}"
            extra = {i for i, _ in stored} - {i for i, _ in printed}
            # the row in flight when the kill came may have been committed, unprinted
            assert extra <= {len(printed)}, f"round {r}, writer {w}: rows {sorted(extra)}"
            committed += len(printed)
    assert committed >= KILL_ROUNDS * KILL_WRITERS
    # the figures behind docs/reliability.md (pytest -rP shows them)
    print(f"{KILL_ROUNDS} rounds of {KILL_WRITERS} writers killed: {committed} committed rows")

    with ObservationStore(store_url) as store:
        assert len(store.measurements(study="kill-after")) == KILL_ROUNDS
        assert store.skipped == []
        if store.path is not None:
            with contextlib.closing(sqlite3.connect(store.path)) as db:
                assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
