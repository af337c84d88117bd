"""costaware.report: budget reports from an Optuna study, the observation store or a Ray run."""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState, create_trial
from rich.console import Console
from sqlalchemy.pool import NullPool

import costaware as ca
from costaware import zoo
from costaware.cli import main
from costaware.reporting import Report, ReportError, TrialRow, rel_errors
from costaware.runtime.store import ObservationStore, measurements_table, predictions_table

optuna.logging.set_verbosity(optuna.logging.WARNING)
MiB = 2**20
EVIL = "</script><script>alert(1)</script>"
EVIL_NAME = '<img src=x onerror="alert(2)">'


# --------------------------------------------------------------------------------------
# fixtures: a store with every outcome
# --------------------------------------------------------------------------------------
def _prediction(
    store: ObservationStore,
    trial: int | str,
    *,
    status: str = "admitted",
    memory: float = 100 * MiB,
    epoch: float | None = 10.0,
    epochs: int = 3,
    name: str = "mlp",
    kind: str = "analytic",
    reasons: list[tuple[str, str]] = (),  # type: ignore[assignment]
    study: str = "s",
) -> None:
    pred = None
    if status != "error":
        pred = {
            "peak_memory": memory,
            "peak_memory_upper": memory * 1.2,
            "epoch_time": epoch,
            "epoch_time_upper": None if epoch is None else epoch * 1.3,
            "trial_time": None if epoch is None else epoch * epochs,
            "kind": kind,
            "latency_s": 0.05,
        }
    decision = {
        "admit": status != "rejected",
        "reasons": [{"kind": k, "message": m} for k, m in reasons],
        "checked": {
            "memory": {"predicted": memory, "limit": 500 * MiB},
            "epoch_time": {"predicted": epoch, "limit": 60.0},
            "total_time": {"predicted": 0.0, "limit": 3600.0},
        },
    }
    store.record_prediction(
        study=study,
        trial=trial,
        spec={"name": name, "batch_size": 32, "epochs": epochs},
        features=None,
        prediction=pred,
        decision=decision if status != "error" else None,
        device="A10",
        status=status,
        reason="; ".join(m for _, m in reasons)
        or ("prediction failed: boom" if status == "error" else None),
    )


def _epoch(
    store: ObservationStore,
    trial: int | str,
    epoch: int,
    *,
    status: str = "ok",
    memory: float | None = 110 * MiB,
    seconds: float | None = 12.0,
    reason: str | None = None,
    study: str = "s",
) -> None:
    store.record_measurement(
        study=study,
        trial=trial,
        epoch=epoch,
        status=status,
        device="A10",
        actual={"peak_memory": memory, "epoch_time": seconds, "iteration_time": 0.01},
        reason=reason,
    )


@pytest.fixture
def store(tmp_path: Path) -> ObservationStore:
    """Trials 0-1 completed, 2 rejected (memory), 3 rejected (time), 4 OOM, 5 stopped,
    6 failed, 7 admitted but never measured, 8 prediction failed but ran."""
    s = ObservationStore(tmp_path / "costaware.db")
    for t in (0, 1):
        _prediction(s, t, memory=(100 + 20 * t) * MiB, epoch=10.0 + t)
        for e in range(3):
            _epoch(s, t, e, memory=(110 + 20 * t) * MiB, seconds=12.0 + t)
    _prediction(s, 2, status="rejected", memory=900 * MiB, reasons=[("memory", "too much memory")])
    _prediction(
        s, 3, status="rejected", epoch=100.0, epochs=2, reasons=[("epoch_time", "too slow")]
    )
    _prediction(s, 4, memory=400 * MiB)
    _epoch(s, 4, 0, memory=300 * MiB, seconds=12.0)
    _epoch(s, 4, 1, status="oom", memory=480 * MiB, seconds=4.0, reason="CUDA out of memory")
    _prediction(s, 5, epoch=20.0)
    _epoch(s, 5, 0, seconds=90.0, status="stopped", reason="measured epoch time 90 s exceeds 60 s")
    _prediction(s, 6)
    _epoch(s, 6, 0, status="error", memory=None, seconds=None, reason="ValueError: nan loss")
    _prediction(s, 7)
    _prediction(s, 8, status="error")
    _epoch(s, 8, 0, memory=50 * MiB, seconds=5.0)
    return s


# --------------------------------------------------------------------------------------
# the observation store
# --------------------------------------------------------------------------------------
def test_store_report_counts_every_outcome(store: ObservationStore) -> None:
    rep = ca.report(store)
    by = {r.trial: r for r in rep.trials}
    assert {k: by[k].outcome for k in by} == {
        "0": "completed",
        "1": "completed",
        "2": "rejected",
        "3": "rejected",
        "4": "oom",
        "5": "stopped",
        "6": "failed",
        "7": "unmeasured",
        "8": "completed",
    }
    s = rep.summary()
    assert (s["trials"], s["rejected"], s["oom"], s["stopped"], s["failed"]) == (9, 2, 1, 1, 1)
    assert s["admitted"] == 7 and s["completed"] == 3
    assert by["2"].reasons == ["too much memory"] and by["2"].reason_kinds == ["memory"]
    assert by["4"].reasons == ["CUDA out of memory"] and by["4"].oom_memory_reached == 480 * MiB
    assert by["4"].actual_memory == 300 * MiB  # the OOM record's figure is a lower bound
    assert by["5"].reasons[0].startswith("measured epoch time")
    assert by["8"].prediction_error == "prediction failed: boom"
    assert rep.rejections()["by_kind"] == {"memory": 1, "epoch_time": 1}
    # the terminal summary's outcome rows add up to its trials: the unmeasured one too
    from rich.console import Console

    console = Console(record=True, width=200)
    rep.print(console)
    assert re.search(r"admitted, no actuals\s+1", console.export_text())
    # saved: trial 2 was rejected for memory, so it would have crashed: counted at the
    # measured time to the crash of trial 4, the study's OOM (12 s + 4 s), not at its
    # predicted 10 s x 3 epochs; trial 3 (time) at its predicted run, 100 s x 2 epochs
    assert s["saved_s"] == pytest.approx(16.0 + 200.0)
    assert s["time_to_oom_s"] == pytest.approx(16.0) and s["time_to_oom_trials"] == 1
    assert not s["saved_upper_bound"]
    # spent: the store has no wall time, so the sum of measured epoch times
    assert by["0"].spent == pytest.approx(36.0) and by["4"].spent == pytest.approx(16.0)
    assert s["oom_wasted_s"] == pytest.approx(16.0)
    assert s["spent_s"] == pytest.approx(36 + 39 + 16 + 90 + 5)
    # caps from the recorded decisions
    assert rep.caps == {"memory": 500 * MiB, "epoch_time": 60.0, "total_time": 3600.0}
    assert s["gate_latency_median_s"] == pytest.approx(0.05)
    # the never-measured trial is named, with the fix
    assert any("1 of 5 admitted trials that did not crash" in n for n in rep.notes)
    assert any("no objective values" in n for n in rep.notes)
    json.dumps(rep.to_dict())  # plain data all the way down


def test_prediction_errors_and_coverage(store: ObservationStore) -> None:
    acc = ca.report(store).accuracy()
    mem, tim = acc["memory"], acc["time"]
    # trials 0, 1 and 5 (stopped) have both; 4 ran out of memory: its peak is unknown, but
    # its first epoch's time was measured
    assert mem["n"] == 3 and tim["n"] == 4
    # trial 0: predicted 100 MiB, measured 110 (-9%), the upper bound 120 covers it
    assert mem["coverage"] == 1.0 and mem["median"] == pytest.approx(100 / 110 - 1)
    assert tim["n_upper"] == 4 and tim["coverage"] == pytest.approx(3 / 4)
    assert acc["oom_with_prediction"] == 1
    assert [g["group"] for g in acc["by_model"]] == ["analytic"]


def test_peaks_partly_held_by_an_earlier_trial_are_shown_not_scored(
    store: ObservationStore,
) -> None:
    """A trial that started with memory already reserved beyond its own tensors (the
    callback's ``held_before``) keeps its measured peak in the table, is left out of the
    memory error, and the notes say why."""
    _prediction(store, 9, memory=100 * MiB)
    store.record_measurement(
        study="s", trial=9, epoch=0, status="ok", device="A10",
        actual={"peak_memory": 900 * MiB, "epoch_time": 12.0, "held_before": 800 * MiB},
    )  # fmt: skip
    rep = ca.report(store)
    (row,) = [r for r in rep.trials if r.trial == "9"]
    assert row.actual_memory == 900 * MiB and row.memory_held_before == 800 * MiB
    assert rep.accuracy()["memory"]["n"] == 3  # trials 0, 1 and 5, as without trial 9
    assert rep.accuracy()["time"]["n"] == 5
    (note,) = [n for n in rep.notes if "already reserved" in n]
    assert note.startswith("1 trial(s)") and "800 MiB" in note


def test_rel_errors() -> None:
    e = rel_errors([(100.0, 200.0, 250.0), (300.0, 100.0, None), (0.0, 1.0, 2.0)])
    assert e["n"] == 2
    assert e["median"] == pytest.approx(((100 / 200 - 1) + (300 / 100 - 1)) / 2)
    assert e["coverage"] == 1.0 and e["n_upper"] == 1
    assert rel_errors([])["n"] == 0


def test_timeline_is_cumulative(store: ObservationStore) -> None:
    tl = ca.report(store).timeline()
    spent = [p["spent"] for p in tl]
    assert spent == sorted(spent) and tl[-1]["avoided"] == pytest.approx(216.0)


def test_store_url_and_study_filter(store: ObservationStore, tmp_path: Path) -> None:
    _prediction(store, 0, study="other")
    rep = ca.report(f"sqlite:///{tmp_path / 'costaware.db'}")
    assert any(r.trial == "other:0" for r in rep.trials)  # several studies: prefixed
    only = ca.report(store.path, study="other")
    assert [r.trial for r in only.trials] == ["0"] and only.title.endswith("other")
    # a study the store does not hold is named with the ones it does, not "no trials yet"
    with pytest.raises(ReportError, match=r"no study named 'othr'.*it holds: .*other"):
        ca.report(store.path, study="othr")


def test_calibration_rows_are_no_studys_trials(store: ObservationStore) -> None:
    from costaware.measure.profile import Measurement
    from costaware.runtime.calibrate import STUDY, calibrate, calibration_configs

    def measure(spec: ca.TrainingSpec, device: str) -> Measurement:  # a machine of known speed
        return Measurement(status="ok", device=device, iteration_time=0.01, max_reserved=MiB)

    cal = calibrate("cpu", store=store, record="always", measure_fn=measure, progress=False,
                    configs=calibration_configs("cpu", 2))  # fmt: skip
    assert cal.recorded == 2
    # a store-wide report leaves them out, and says how to see them
    rep = ca.report(store)
    assert len(rep.trials) == 9 and not any(STUDY in r.trial for r in rep.trials)
    assert any("2 calibration measurements" in n and f"--study {STUDY}" in n for n in rep.notes)
    assert rep.summary()["spent_s"] == pytest.approx(36 + 39 + 16 + 90 + 5)
    # asked for, they are reported
    only = ca.report(store, study=STUDY)
    assert len(only.trials) == 2 and all(r.outcome == "completed" for r in only.trials)


def test_empty_store_gives_a_sensible_page(tmp_path: Path) -> None:
    rep = ca.report(ObservationStore(tmp_path / "empty.db"))
    assert rep.trials == [] and "No trials recorded yet" in rep.notes[0]
    page = rep.to_html(tmp_path / "empty.html")
    assert "No trials recorded yet" in page and "</html>" in page
    assert "Plotly.newPlot" not in page  # nothing to plot, no empty figures
    md = rep.to_markdown(tmp_path / "empty.md")
    assert "No trials recorded yet" in md
    console = Console(record=True, width=100)
    rep.print(console)
    assert "No trials recorded yet" in console.export_text()


# --------------------------------------------------------------------------------------
# Optuna
# --------------------------------------------------------------------------------------
def _attrs(admit: bool, memory: float, epoch: float, **more: Any) -> dict[str, Any]:
    return {
        "costaware:admit": admit,
        "costaware:reasons": [] if admit else ["predicted peak memory exceeds the budget"],
        "costaware:reason_kinds": [] if admit else ["memory"],
        "costaware:peak_memory": memory,
        "costaware:peak_memory_upper": memory * 1.1,
        "costaware:epoch_time": epoch,
        "costaware:epoch_time_upper": epoch * 1.2,
        "costaware:trial_time": epoch * 2,
        "costaware:device": "A10",
        "costaware:model": "analytic",
        "costaware:latency_ms": 40.0,
        **more,
    }


def _study(storage: Any = None, name: str = "hpo") -> optuna.Study:
    dist = {"width": optuna.distributions.CategoricalDistribution([64, 4096, EVIL])}
    study = optuna.create_study(storage=storage, study_name=name, direction="maximize")
    trials = [
        create_trial(value=0.9, params={"width": 64}, distributions=dist,
                     user_attrs=_attrs(True, 50 * MiB, 5.0)),
        create_trial(value=0.95, params={"width": 4096}, distributions=dist,
                     user_attrs=_attrs(True, 200 * MiB, 20.0)),
        create_trial(state=TrialState.PRUNED, params={"width": EVIL}, distributions=dist,
                     user_attrs=_attrs(False, 900 * MiB, 50.0)),
        create_trial(state=TrialState.PRUNED, params={"width": 64}, distributions=dist,
                     user_attrs=_attrs(True, 50 * MiB, 5.0, costaware_stopped="measured epoch time too long")),
        create_trial(state=TrialState.FAIL, params={"width": 4096}, distributions=dist,
                     user_attrs=_attrs(True, 300 * MiB, 20.0, costaware_oom="CUDA out of memory")),
        create_trial(state=TrialState.PRUNED, params={"width": 64}, distributions=dist,
                     user_attrs=_attrs(True, 50 * MiB, 5.0), intermediate_values={3: 0.1}),
        create_trial(state=TrialState.FAIL, params={"width": 64}, distributions=dist,
                     user_attrs=_attrs(True, 50 * MiB, 5.0)),
    ]  # fmt: skip
    study.add_trials(trials)
    return study


def test_optuna_study_outcomes_best_trials_and_store_join(tmp_path: Path) -> None:
    study = _study()
    store = ObservationStore(tmp_path / "s.db")
    for e in range(2):  # trial 1's actuals, recorded under the study's name
        _epoch(store, 1, e, memory=220 * MiB, seconds=25.0, study="hpo")
    rep = ca.report(study, store=store)
    assert [r.outcome for r in rep.trials] == [
        "completed", "completed", "rejected", "stopped", "oom", "stopped", "failed",
    ]  # fmt: skip
    assert rep.trials[3].reasons == ["measured epoch time too long"]
    assert rep.trials[4].reasons == ["CUDA out of memory"]
    assert rep.trials[5].reasons == ["pruned by the study's pruner at step 3"]
    assert rep.direction == "maximize"
    assert [r.number for r in rep.best()] == [1, 0]
    one = rep.trials[1]
    assert one.actual_memory == 220 * MiB and one.actual_epoch_time == 25.0
    assert one.pred_memory == 200 * MiB and one.wall_time is not None
    # the OOM trial has no recorded time: the memory rejection is counted at its whole
    # predicted run (50 s x 2 epochs), and the figure says it is an upper bound
    assert rep.summary()["saved_s"] == pytest.approx(100.0)
    assert rep.summary()["saved_upper_bound"] and rep.summary()["time_to_oom_s"] is None
    assert rep.summary()["memory_error"]["n"] == 1
    assert rep.study == "hpo" and "Optuna study 'hpo'" in rep.source


def test_optuna_without_a_store_says_where_the_actuals_are() -> None:
    rep = ca.report(_study())
    assert any("No observation store given" in n for n in rep.notes)
    assert not any(n.startswith("No actuals recorded") for n in rep.notes)


def test_optuna_storage_url_and_one_file_holding_both(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    _study(storage=url, name="one")
    _epoch(ObservationStore(url), 1, 0, memory=220 * MiB, seconds=25.0, study="one")
    rep = ca.report(url)  # one database: the study and the store
    assert rep.trials[1].actual_memory == 220 * MiB
    assert ca.report(storage=url, study="one").trials[1].measured
    optuna.create_study(storage=url, study_name="two")
    with pytest.raises(ReportError, match=r"holds 2 studies \(one, two\): pass --study NAME"):
        ca.report(storage=url)
    with pytest.raises(ReportError, match="no study named 'three'"):
        ca.report(storage=url, study="three")
    # a study that exists, with no trial costaware recorded yet, is reported, not refused
    empty = ca.report(storage=url, study="two", store=url)
    assert empty.trials == [] and empty.study == "two"


def test_a_real_pruned_study_reports_its_rejections() -> None:
    budget = ca.Budget(max_memory="1.25GiB")

    def spec_fn(params: dict[str, Any]) -> ca.TrainingSpec:
        return ca.TrainingSpec(
            model=functools.partial(zoo.mlp, 784, (params["width"],) * 2, 10),
            batch=ca.ImageBatch((784,), classes=10),
            batch_size=16,
            optimizer="adam",
            dataset_size=1000,
        )

    from costaware.integrations.optuna import CostAwarePruner

    study = optuna.create_study(
        pruner=CostAwarePruner(spec_fn=spec_fn, budget=budget, device="T4", refit_every=None),
        sampler=optuna.samplers.GridSampler({"width": [64, 8192]}),
    )

    def objective(trial: optuna.Trial) -> float:
        trial.suggest_categorical("width", [64, 8192])
        if trial.should_prune():
            raise optuna.TrialPruned()
        return 1.0

    study.optimize(objective, n_trials=2)
    rep = ca.report(study)
    by_width = {r.params["width"]: r for r in rep.trials}
    assert by_width[8192].outcome == "rejected" and by_width[64].outcome == "completed"
    assert "exceeds the 1.25 GiB budget" in by_width[8192].reasons[0]
    assert by_width[8192].reason_kinds == ["memory"] and by_width[8192].predicted_cost
    assert by_width[64].device == "T4" and by_width[64].model_kind


# --------------------------------------------------------------------------------------
# Ray Tune
# --------------------------------------------------------------------------------------
def _ray_dir(root: Path) -> Path:
    """The JSON a Ray Tune 2.x run leaves (experiment_state + per-trial result.json)."""
    exp = root / "digits"
    exp.mkdir(parents=True)
    trial_data = []
    t0 = 1_790_000_000.0
    for i, (tid, status, epochs) in enumerate(
        [("aaa", "TERMINATED", 3), ("bbb", "TERMINATED", 1), ("ccc", "ERROR", 1)]
    ):
        logdir = f"train_{tid}_{i + 1}_width=32_2026"
        (exp / logdir).mkdir()
        results = [
            {
                "val_acc": 0.5 + 0.1 * i + 0.01 * e,
                "epoch": e,
                "epoch_time_s": 2.0 + i,
                "peak_memory_bytes": (100 + i) * MiB,
                "time_total_s": (e + 1) * (2.5 + i),
                "timestamp": t0 + 10 * i + e,
                "trial_id": tid,
                "config": {"width": 32, "tag": EVIL},
            }
            for e in range(epochs)
        ]
        (exp / logdir / "result.json").write_text("\n".join(json.dumps(r) for r in results) + "\n")
        if status == "ERROR":
            (exp / logdir / "error.txt").write_text(
                "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n"
            )
        info = {
            "trial_id": tid,
            "config": {"width": 32, "tag": EVIL},
            "status": status,
            "relative_logdir": logdir,
            "experiment_tag": f"{i + 1}_width=32",
        }
        runtime = {"start_time": t0 + 10 * i, "last_result": results[-1], "error_filename": None}
        trial_data.append([json.dumps(info), json.dumps(runtime)])
    state = {"trial_data": trial_data, "runner_data": {"_metric": "val_acc"}, "stats": {}}
    (exp / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps(state))
    (exp / "searcher-state-2026.pkl").write_bytes(b"\x80\x05not unpickled")
    return exp


def test_ray_directory_with_the_store(tmp_path: Path) -> None:
    exp = _ray_dir(tmp_path / "ray")
    store = ObservationStore(tmp_path / "costaware.db")
    _prediction(store, "aaa", study="digits", memory=90 * MiB, epoch=1.5)
    _prediction(store, "bbb", study="digits")
    _epoch(store, "bbb", 0, status="stopped", seconds=3.0, reason="over budget", study="digits")
    _prediction(
        store, "bbb_rej0", study="digits", status="rejected", reasons=[("memory", "too big")]
    )
    rep = ca.report(tmp_path / "ray", store=store, mode="max")  # the parent directory works too
    by = {r.trial: r for r in rep.trials}
    assert by["aaa"].outcome == "completed" and by["aaa"].epochs_measured == 3
    assert by["aaa"].pred_memory == 90 * MiB and by["aaa"].actual_memory == 100 * MiB
    assert by["bbb"].outcome == "stopped" and by["bbb"].reasons == ["over budget"]
    assert by["ccc"].outcome == "oom" and "CUDA out of memory" in by["ccc"].reasons[0]
    assert by["bbb_rej0"].outcome == "rejected"
    assert by["aaa"].wall_time == pytest.approx(7.5)
    assert rep.metric == "val_acc" and [r.trial for r in rep.best(2)] == ["ccc", "bbb"]
    assert str(exp) in rep.source


def test_ray_directory_alone_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no costaware.db of another run in the current directory
    _ray_dir(tmp_path / "ray")
    rep = ca.report(ray_dir=tmp_path / "ray" / "digits")
    assert {r.outcome for r in rep.trials} == {"completed", "oom"}
    assert rep.trials[0].actual_epoch_time == 2.0  # straight from result.json
    notes = " ".join(rep.notes)
    assert "pass the store" in notes.lower() or "--store" in notes
    assert "--mode max or --mode min" in notes and rep.best() == []
    assert "A store lies" not in notes
    # a store beside the experiments that holds another run's records is no hint
    beside = ObservationStore(tmp_path / "ray" / "costaware.db")
    _prediction(beside, "zzz", study="another-run")
    notes = " ".join(ca.report(ray_dir=tmp_path / "ray" / "digits").notes)
    assert "A store lies" not in notes
    # one that holds this run's trials (the script wrote it to the storage path) is
    _prediction(beside, "aaa", study="digits")
    notes = " ".join(ca.report(ray_dir=tmp_path / "ray" / "digits").notes)
    assert f"--store sqlite:///{(tmp_path / 'ray' / 'costaware.db').resolve()}" in notes


def test_not_a_ray_directory(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="not a Ray Tune experiment directory"):
        ca.report(tmp_path)


# --------------------------------------------------------------------------------------
# escaping: every user-supplied string
# --------------------------------------------------------------------------------------
def _hostile_store(tmp_path: Path) -> ObservationStore:
    s = ObservationStore(tmp_path / "hostile.db")
    _prediction(s, EVIL, name=EVIL_NAME, study=EVIL, kind=EVIL)
    _epoch(s, EVIL, 0, study=EVIL, status="stopped", reason=EVIL + " [red]x[/red]")
    _prediction(s, "r|1", status="rejected", name="a|b", reasons=[("memory", EVIL)])
    return s


def test_html_escapes_every_user_string(tmp_path: Path) -> None:
    plain = ca.report(ObservationStore(tmp_path / "plain.db")).to_html()
    rep = ca.report(_hostile_store(tmp_path), title=EVIL_NAME)
    page = rep.to_html()
    assert "<script>alert(1)" not in page and "alert(1)</script>" not in page
    assert "<img src=x" not in page and EVIL_NAME not in page
    assert "&lt;img src=x onerror=&quot;alert(2)&quot;&gt;" in page  # shown, not run
    # no script element but plotly's config and plotly.js, one per figure, the resize hook
    opened = len(re.findall(r"<script\b", page, flags=re.IGNORECASE))
    assert opened == page.count('class="plotly-graph-div"') + 3
    closed = len(re.findall(r"</script\s*>", page, flags=re.IGNORECASE))
    assert closed == opened
    assert len(re.findall(r"<script\b", plain, flags=re.IGNORECASE)) == 1  # the resize hook


def test_plotly_json_cannot_end_its_script_element() -> None:
    """Defence in depth: strings reach the figures escaped, and plotly's JSON escapes
    < > / again, so even a raw one could not close the script element."""
    from costaware.reporting.html import _Fig, _Figures

    fig = _Fig({"type": "scatter", "x": [1], "y": [1], "name": EVIL})
    div = _Figures().div(fig, "t", 200, EVIL)
    assert EVIL not in div and "\\u003c\\u002fscript\\u003e" in div


def test_markdown_and_terminal_neutralise_user_strings(tmp_path: Path) -> None:
    rep = ca.report(_hostile_store(tmp_path))
    md = rep.to_markdown()
    assert "<script>" not in md and "<img" not in md and "&lt;/script&gt;" in md
    for line in md.splitlines():  # a | in a value cannot add a column
        if line.startswith("| r\\|1 "):
            assert line.count(" | ") == 5
    console = Console(record=True, width=200)
    rep.print(console)
    assert "[red]x[/red]" in console.export_text()  # printed, not read as markup


# --------------------------------------------------------------------------------------
# renderings
# --------------------------------------------------------------------------------------
def test_html_is_one_self_contained_page(store: ObservationStore, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    page = ca.report(store, price_per_hour=2.5).to_html(out)
    assert out.read_text(encoding="utf-8") == page
    assert page.count("plotly.js v") == 1  # inlined once
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=[\"']?https?:", page)
    for fig in ("fig-budget", "fig-outcomes", "fig-memory", "fig-time", "fig-ratio"):
        assert f'id="{fig}"' in page
    for section in ("budget", "trials", "saved", "accuracy", "best", "all"):
        assert f'id="{section}"' in page
    assert "$0.15" in page  # 216 s saved at $2.50 an hour


def test_figures_follow_plotlys_schema(store: ObservationStore) -> None:
    """The figures are built as plain dicts for speed; plotly's validator checks them here."""
    from costaware.reporting.html import render_html

    for rep in (
        ca.report(store),
        ca.report(store, price_per_hour=1.0, budget=ca.Budget(max_total_time="1h")),
    ):
        page = render_html(rep, validate=True)
        assert page.count("Plotly.newPlot") == 5


def test_markdown_report(store: ObservationStore) -> None:
    md = ca.report(store).to_markdown()
    assert md.startswith("# costaware report: s")
    assert "| rejected before running | 2 |" in md
    assert "## Predictions vs reality" in md and "## All trials" in md


def test_terminal_summary(store: ObservationStore) -> None:
    console = Console(record=True, width=120)
    ca.report(store).print(console)
    text = console.export_text()
    assert "rejected" in text and "Stopped, out of memory or failed" in text
    assert "CUDA out of memory" in text and "most saved: #3 3.3 min, #2 16.0 s" in text


def test_thousands_of_trials_render(tmp_path: Path) -> None:
    """3,000 trials (half rejected) through the store, the analysis and every renderer."""
    url = f"sqlite:///{tmp_path / 'big.db'}"
    ObservationStore(url).close()
    now = dt.datetime.now(dt.timezone.utc)
    preds, meas = [], []
    for i in range(3000):
        rejected = i % 2 == 1
        preds.append(
            {
                "created_at": now + dt.timedelta(seconds=i),
                "study": "big",
                "trial": str(i),
                "status": "rejected" if rejected else "admitted",
                "device": "H100",
                "spec": {"name": f"net{i % 7}", "batch_size": 2 ** (i % 8), "epochs": 3},
                "features": None,
                "prediction": {
                    "peak_memory": (1 + i % 50) * 2**28,
                    "peak_memory_upper": (1 + i % 50) * 2**28 * 1.2,
                    "epoch_time": 60.0 + i % 300,
                    "epoch_time_upper": 80.0 + i % 300,
                    "trial_time": 3 * (60.0 + i % 300),
                    "kind": "learned" if i > 1000 else "analytic",
                },
                "decision": {"reasons": [{"kind": "memory", "message": f"too big {i}"}]}
                if rejected
                else None,
            }
        )
        if not rejected:
            meas.append(
                {
                    "created_at": now + dt.timedelta(seconds=i + 1),
                    "study": "big",
                    "trial": str(i),
                    "epoch": 0,
                    "status": "oom" if i % 100 == 0 else "ok",
                    "device": "H100",
                    "actual": {"peak_memory": (1 + i % 47) * 2**28, "epoch_time": 70.0 + i % 290},
                }
            )
    engine = sa.create_engine(url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.execute(predictions_table.insert(), preds)
        conn.execute(measurements_table.insert(), meas)
    engine.dispose()

    rep = ca.report(url)
    s = rep.summary()
    assert s["trials"] == 3000 and s["rejected"] == 1500 and s["oom"] == 30
    page = rep.to_html(tmp_path / "big.html")
    assert "Showing 500 of 1,500" in page and "3,000" in page
    assert page.count("Plotly.newPlot") == 5
    assert len(rep.to_markdown().splitlines()) > 3000


def test_report_object_from_rows() -> None:
    rows = [
        TrialRow(trial="0", number=0, outcome="completed", pred_memory=1e9, actual_memory=1.1e9),
        TrialRow(trial="1", number=1, outcome="rejected", pred_trial_time=3600.0),
    ]
    rep = Report(rows, title="t", source="rows", price_per_hour=3.0)
    assert rep.summary()["saved_cost"] == pytest.approx(3.0)
    assert "2 trials, 1 rejected" in repr(rep)



def test_trials_admitted_unjudged_are_said_so_with_why_and_one_direction_note() -> None:
    why = "prediction failed: UntraceableModelError: The model cannot run on fake tensors"
    rows = [
        TrialRow(trial=str(i), number=i, outcome="completed", prediction_error=why, value=1.0)
        for i in range(3)
    ]
    rep = Report(rows, title="t", source="rows")
    said = [n for n in rep.notes if "could not be predicted" in n]
    assert len(said) == 1 and "3 admitted trial(s)" in said[0]
    assert "UntraceableModelError (3)" in said[0]
    assert sum("--mode" in n for n in rep.notes) == 1
    # a source that already says how to pass the direction is not said twice
    ray = Report(rows, title="t", source="rows", notes=["Ray Tune ...: pass --mode max."])
    assert sum("--mode" in n for n in ray.notes) == 1


# --------------------------------------------------------------------------------------
# bad sources
# --------------------------------------------------------------------------------------
def test_bad_sources_say_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no such file"):
        ca.report(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()  # not created by looking
    with pytest.raises(ReportError, match="nothing to report on"):
        ca.report()
    with pytest.raises(ReportError, match=r"takes an optuna\.Study"):
        ca.report(42)
    optuna.create_study(storage=f"sqlite:///{tmp_path / 'hpo.db'}", study_name="x")
    with pytest.raises(ReportError, match="no costaware tables"):
        ca.report(store=tmp_path / "hpo.db")
    with pytest.raises(ReportError, match="mode must be"):
        ca.report(tmp_path / "hpo.db", mode="best")


def test_importing_reporting_stays_light() -> None:
    code = (
        "import sys, costaware, costaware.reporting; costaware.report; "
        "print(sorted(m for m in ('torch', 'plotly', 'optuna', 'ray', 'lightning', 'catboost') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------------------
# malformed records
# --------------------------------------------------------------------------------------
def _damage(path: Path | None) -> int:
    """Rows no costaware writes, through raw SQL: 3 the store skips as malformed, and 2
    of the right shape whose insides are not (the report reads them as missing). Returns
    how many are malformed."""
    engine = sa.create_engine(f"sqlite:///{path}", poolclass=NullPool)
    rows = [
        ("costaware_predictions", "trial, status, spec, features", "'90', 'admitted', '{}', '[1]'"),
        ("costaware_predictions", "trial, status, spec", "'91', 'maybe', '{}'"),
        ("costaware_measurements", "trial, status, actual", "'0', 'ok', '{\"peak_memory\": 1'"),
        (  # an object, but its budget limits are a list, its reasons a number
            "costaware_predictions",
            "trial, status, spec, decision",
            "'92', 'rejected', '{\"family\": [1]}', '{\"checked\": [1], \"reasons\": 5}'",
        ),
        (
            "costaware_measurements",
            "trial, status, actual",
            "'93', 'ok', '{\"peak_memory\": \"x\"}'",
        ),
    ]
    with engine.begin() as conn:
        for table, columns, values in rows:
            conn.exec_driver_sql(
                f"INSERT INTO {table} (created_at, study, {columns}) "
                f"VALUES ('2026-01-01 00:00:00', 's', {values})"
            )
    engine.dispose()
    return 3


def test_malformed_rows_are_skipped_and_the_report_says_so(store: ObservationStore) -> None:
    malformed = _damage(store.path)
    with pytest.warns(ca.CostAwareWarning) as caught:
        rep = ca.report(store.path)
    warned = [str(w.message) for w in caught if "malformed" in str(w.message)]
    assert len(warned) == 1  # one warning for the report, not one per table
    assert warned[0].startswith(f"{malformed} malformed row(s) of the observation store")
    assert "status 'maybe' is unknown (1 row)" in warned[0]
    assert "actual is not valid JSON (1 row)" in warned[0]
    assert warned[0] in rep.notes
    labels = {r.trial for r in rep.trials}
    assert {"0", "1", "92", "93"} <= labels and not labels & {"90", "91"}
    by_trial = {r.trial: r for r in rep.trials}
    assert by_trial["0"].actual_memory == 110 * MiB  # its damaged row left out
    assert by_trial["92"].outcome == "rejected" and by_trial["92"].reasons == []
    assert by_trial["93"].actual_memory is None
    assert rep.to_dict()["notes"] and "malformed" in rep.to_markdown()


def test_cli_report_on_a_store_with_malformed_rows(store: ObservationStore, tmp_path: Path) -> None:
    """The real command: exit 0, one warning line naming how many rows and why."""
    malformed = _damage(store.path)
    out = subprocess.run(
        [sys.executable, "-m", "costaware.cli", "report", "--store", str(store.path),
         "--json", "-"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if "malformed" in line]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"costaware: warning: {malformed} malformed row(s)")
    assert "Traceback" not in out.stderr
    data = json.loads(out.stdout)
    assert any(f"{malformed} malformed row(s)" in note for note in data["notes"])
    assert data["summary"]["trials"] == 11


# --------------------------------------------------------------------------------------
# the command line
# --------------------------------------------------------------------------------------
def test_cli_report_writes_html_markdown_and_json(
    store: ObservationStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    html, md, js = tmp_path / "r.html", tmp_path / "r.md", tmp_path / "r.json"
    rc = main(
        ["report", "--store", str(store.path), "--html", str(html), "--markdown", str(md),
         "--json", str(js), "--price-per-hour", "2"]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 0
    assert "costaware report: s" in captured.out and "rejected" in captured.out
    assert f"wrote {html}" in captured.err
    assert html.read_text().startswith("<!doctype html>") and md.read_text().startswith("# ")
    assert json.loads(js.read_text())["summary"]["trials"] == 9


def test_cli_report_json_to_stdout(
    store: ObservationStore, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(store.path), "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["rejected"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "say what to report on"),
        (["--store", "/nonexistent/costaware.db"], "no such file: /nonexistent/costaware.db"),
        (["--study", "x"], "--study names a study in --storage"),
        (["--ray-dir", "/nonexistent"], "no such directory"),
        (["--store", "{db}", "--html", "/nonexistent/r.html"], "does not exist"),
        (["--store", "{db}", "--mode", "best"], "invalid choice: 'best'"),
        (["--store", "{db}", "--max-cost", "5"], "--max-cost needs --price-per-hour"),
    ],
)
def test_cli_report_errors_are_one_line(
    store: ObservationStore,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    rc = main(["report", *(a.format(db=store.path) for a in args)])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and err.startswith("costaware: error: ")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cli_report_debug_raises(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ReportError, match="no such file"):
        main(["report", "--store", "/nonexistent/costaware.db", "--debug"])


# --------------------------------------------------------------------------------------
# every command's errors: one line, with the fix; --debug for the traceback
# --------------------------------------------------------------------------------------
def _one_line(err: str) -> None:
    assert err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["predict"],
            "required: MODEL, --batch-size/-b (see 'costaware predict --help')",
        ),
        (["predict", "m:f", "-b", "x"], "invalid int value: 'x'"),
        (["nope"], "invalid choice: 'nope'"),
        (
            ["fit", "/nonexistent.jsonl.gz", "--out", "m"],
            "no such data file: /nonexistent.jsonl.gz",
        ),
        (
            ["fit", "pyproject.toml", "--out", "m"],
            "pyproject.toml is not a .jsonl.gz file of measured rows",
        ),
        (["report", "--price-per-hour", "cheap"], "invalid float value: 'cheap'"),
    ],
)
def test_usage_errors_are_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("costaware: error: ") and message in err
    _one_line(err)


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (ImportError("No module named 'optuna'", name="optuna"), "pip install 'costaware[optuna]'"),
        (PermissionError(13, "Permission denied", "/root/x.db"), "Permission denied: /root/x.db"),
        (ValueError("width must be positive\nmore detail"), "width must be positive (--debug"),
        (RuntimeError("cuda broke"), "unexpected RuntimeError: cuda broke (run with --debug"),
        (ca.SpecError("batch_size must be a positive integer"), "error: batch_size must be"),
    ],
)
def test_failures_are_one_line_with_the_fix(
    exc: Exception,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import costaware.cli as cli

    def boom(args: Any) -> int:
        raise exc

    monkeypatch.setattr(cli.devices, "run", boom)
    assert main(["devices"]) == 2
    err = capsys.readouterr().err
    assert message in err
    _one_line(err)
    with pytest.raises(type(exc)):  # --debug, after the command too, shows the real thing
        main(["devices", "--debug"])


def test_warnings_are_one_line_and_pipes_may_close(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import warnings

    import costaware.cli as cli

    def warns(args: Any) -> int:
        warnings.warn("could not predict\nsecond line", ca.CostAwareWarning, stacklevel=1)
        return 0

    monkeypatch.setattr(cli.devices, "run", warns)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["devices"]) == 0
    err = capsys.readouterr().err
    assert err == "costaware: warning: could not predict\n"

    def closed(args: Any) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli.devices, "run", closed)
    assert main(["devices"]) == 1 and capsys.readouterr().err == ""


def test_a_data_parallel_trial_spends_and_saves_the_time_of_each_gpu(tmp_path: Path) -> None:
    """A trial on world_size GPUs holds each of them: its device time is its time times
    its GPUs, spent or saved."""
    s = ObservationStore(tmp_path / "costaware.db")
    for trial, status, world in ((0, "admitted", 4), (1, "rejected", 4), (2, "admitted", 1)):
        s.record_prediction(
            study="s", trial=trial,
            spec={"name": "mlp", "batch_size": 32, "epochs": 1} | ({"world_size": world} if world > 1 else {}),
            features=None,
            prediction={"peak_memory": MiB, "peak_memory_upper": MiB, "epoch_time": 10.0,
                        "epoch_time_upper": 12.0, "trial_time": 10.0, "kind": "analytic"},
            decision={"admit": status == "admitted",
                      "reasons": [] if status == "admitted" else [{"kind": "trial_time", "message": "slow"}]},
            device="A10", status=status,
        )  # fmt: skip
    for trial in (0, 2):
        _epoch(s, trial, 0, seconds=11.0)
    rep = ca.report(s)
    by = {r.trial: r for r in rep.trials}
    assert (by["0"].gpus, by["1"].gpus, by["2"].gpus) == (4, 4, 1)
    assert by["0"].spent == pytest.approx(44.0) and by["2"].spent == pytest.approx(11.0)
    assert by["1"].predicted_cost == pytest.approx(40.0)
    summary = rep.to_dict()["summary"]
    assert summary["saved_s"] == pytest.approx(40.0)


def test_a_trial_is_named_by_its_number_only_where_that_is_its_id() -> None:
    """An Optuna trial's id is its number (``#3``); a Ray Tune trial's id may be all
    digits (``70907145``) and is not its number (its experiment tag's ``1``)."""
    assert TrialRow(trial="3", number=3, outcome="completed").label == "#3"
    assert TrialRow(trial="70907145", number=1, outcome="completed").label == "70907145"
    assert TrialRow(trial="a1b2c3d4", number=2, outcome="completed").label == "a1b2c3d4"


def test_the_metric_in_a_markdown_header_is_escaped_once() -> None:
    rows = [TrialRow(trial=str(i), number=i, outcome="completed", value=float(i)) for i in range(2)]
    page = Report(rows, title="t", source="rows", direction="maximize", metric="val_acc")
    text = page.to_markdown()
    assert "val\\_acc" in text and "val\\\\_acc" not in text


def test_the_bias_corrected_saving_is_in_every_format() -> None:
    times = {"pred_epoch_time": 10.0, "actual_epoch_time": 12.0, "epochs_planned": 1}
    ran = [TrialRow(trial=str(i), number=i, outcome="completed", **times) for i in range(3)]
    rejected = TrialRow(trial="3", number=3, outcome="rejected", pred_trial_time=100.0)
    rep = Report([*ran, rejected], title="t", source="rows")
    assert rep.summary()["saved_adjusted_s"] == pytest.approx(120.0)
    said = (
        "With the predicted runs of the trials rejected for time or cost corrected by the "
        "median epoch-time error of the trials that ran (measured ÷ predicted ×1.20)"
    )
    assert said in rep.to_markdown() and said in rep.to_html()
    console = Console(record=True, width=200)
    rep.print(console)
    assert said in console.export_text()


def test_a_study_whose_trials_were_all_rejected_asks_for_no_measurements(tmp_path: Path) -> None:
    """Nothing ran, so nothing could be measured: the report does not tell the user to
    add the callback that measures."""
    dist = {"width": optuna.distributions.CategoricalDistribution([4096])}
    study = optuna.create_study(study_name="none-ran")
    study.add_trials(
        [
            create_trial(state=TrialState.PRUNED, params={"width": 4096}, distributions=dist,
                         user_attrs=_attrs(False, 900 * MiB, 50.0))
            for _ in range(3)
        ]
    )  # fmt: skip
    rep = ca.report(study, store=ObservationStore(tmp_path / "s.db"))
    assert [r.outcome for r in rep.trials] == ["rejected"] * 3
    assert not any("has no measurements" in n for n in rep.notes)


def test_a_plain_loops_out_of_memory_failure_counts_as_an_oom() -> None:
    """Without the callback, the error Optuna kept for a failed trial says it ran out of
    memory: the report counts an OOM, not a failure."""
    dist = {"width": optuna.distributions.CategoricalDistribution([64])}
    study = optuna.create_study()
    study.add_trials(
        [
            create_trial(state=TrialState.FAIL, params={"width": 64}, distributions=dist,
                         system_attrs={"fail_reason": f"{name}: CUDA out of memory. Tried to allocate 2.00 GiB"})
            for name in ("OutOfMemoryError", "RuntimeError")
        ]
        + [create_trial(state=TrialState.FAIL, params={"width": 64}, distributions=dist,
                        system_attrs={"fail_reason": "ValueError: bad"})]
    )  # fmt: skip
    assert [r.outcome for r in ca.report(study).trials] == ["oom", "oom", "failed"]
