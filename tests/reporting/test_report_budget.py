"""What the report says of the study's budget, and that it agrees with what the
integrations did: the spent figure of the study-wide caps is the pruner's, a saving never
reads as a bound that its estimate passes, direction words follow the bias beside them,
and Ray runs are read as Ray restores them."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console

import costaware as ca
from costaware import zoo
from costaware.integrations.optuna import study_spent
from costaware.reporting import Report, TrialRow
from costaware.runtime.store import ObservationStore

optuna.logging.set_verbosity(optuna.logging.WARNING)
MiB = 2**20
T0 = dt.datetime(2026, 1, 1, 12, 0, 0)


def _terminal(rep: Report) -> str:
    console = Console(record=True, width=200)
    rep.print(console)
    return console.export_text()


def _trial(number: int, seconds: float, *, state: TrialState, attrs: dict[str, Any]) -> FrozenTrial:
    start = T0 + dt.timedelta(seconds=100 * number)
    return FrozenTrial(
        number=number, state=state, value=1.0 if state == TrialState.COMPLETE else None,
        datetime_start=start, datetime_complete=start + dt.timedelta(seconds=seconds),
        params={"width": 64}, distributions={"width": CategoricalDistribution([64, 4096])},
        user_attrs=attrs, system_attrs={}, intermediate_values={}, trial_id=number,
    )  # fmt: skip


def _rejected_attrs(kind: str, message: str) -> dict[str, Any]:
    return {
        "costaware:admit": False, "costaware:reasons": [message],
        "costaware:reason_kinds": [kind], "costaware:peak_memory": 50 * MiB,
        "costaware:epoch_time": 1.0, "costaware:trial_time": 2.0,
    }  # fmt: skip


# --------------------------------------------------------------------------------------
# the study's spent figure is the pruner's
# --------------------------------------------------------------------------------------
def test_the_cap_line_counts_what_the_pruner_counts(tmp_path: Path) -> None:
    """Two trials ran 20 s each; a rejected one took 16 s to be judged (a slow dry run):
    the pruner counts 56 s of the 50 s cap, and so does the report's cap line."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'hpo.db'}", study_name="s")
    ran = {"costaware:admit": True, "costaware:peak_memory": 50 * MiB}
    study.add_trial(_trial(0, 20.0, state=TrialState.COMPLETE, attrs=ran))
    study.add_trial(_trial(1, 20.0, state=TrialState.COMPLETE, attrs=ran))
    study.add_trial(
        _trial(2, 16.0, state=TrialState.PRUNED, attrs=_rejected_attrs("memory", "too big"))
    )
    budget = ca.Budget(max_total_time=50, max_cost=0.02, price_per_hour=1.0)
    rep = ca.report(study, budget=budget)
    s = rep.summary()
    assert s["budget_spent_s"] == pytest.approx(study_spent(study)) == pytest.approx(56.0)
    assert s["spent_s"] == pytest.approx(40.0)  # the trials that ran: unchanged
    assert s["budget_spent_cost"] == pytest.approx(56.0 / 3600)
    markdown = rep.to_markdown()
    assert "Used 112% of the study's total time: 56.0 s of 50.0 s." in markdown
    assert "Used 78% of the study's cost cap: $0.016 of $0.020." in markdown
    assert "the time the rejected trials took to be judged counts too" in markdown
    assert "112% used: 56.0 s spent" in rep.to_html()
    assert "Used 112% of the study's total time" in _terminal(rep)


# --------------------------------------------------------------------------------------
# what the rejections saved
# --------------------------------------------------------------------------------------
def _rows_with_low_time_predictions() -> list[TrialRow]:
    """Three trials that ran 4x slower than predicted; a memory rejection (no OOM
    measured: an upper bound of 50 s), a time rejection (predicted 10 s) and a trial
    rejected for the study's cap alone (predicted 30 s)."""
    times = {"pred_epoch_time": 1.0, "actual_epoch_time": 4.0, "epochs_planned": 1}
    rows = [TrialRow(trial=str(i), number=i, outcome="completed", **times) for i in range(3)]
    rows += [
        TrialRow(trial="3", number=3, outcome="rejected", pred_trial_time=50.0,
                 reason_kinds=["memory"], params={"width": 8192}),
        TrialRow(trial="4", number=4, outcome="rejected", pred_trial_time=10.0,
                 reason_kinds=["epoch_time"], params={"width": 2048}),
        TrialRow(trial="5", number=5, outcome="rejected", pred_trial_time=30.0,
                 reason_kinds=["total_time"], params={"width": 64},
                 reasons=["60.6 s spent + 30.0 s for this trial exceeds the study's 60.0 s"]),
    ]  # fmt: skip
    return rows


def test_the_estimate_scales_only_point_predictions_and_no_bound_is_passed() -> None:
    rep = Report(_rows_with_low_time_predictions(), title="t", source="rows")
    s = rep.summary()
    # the cap-only rejection would not have run within the budget: not counted
    assert rep.saving(rep.trials[5]) == (None, "cap_only")
    assert s["saved_s"] == pytest.approx(60.0) and s["saved_trials"] == 2
    # only the time rejection's point prediction is corrected (x4); the memory bound stays
    assert s["saved_adjusted_factor"] == pytest.approx(4.0)
    assert s["saved_adjusted_s"] == pytest.approx(50.0 + 4 * 10.0)
    # the whole is no upper bound, so it does not read "at most"; the part that is, says so
    assert not s["saved_all_upper_bound"] and s["saved_upper_bound_s"] == pytest.approx(50.0)
    for shown in (_terminal(rep), re.sub(r"\\(.)", r"\1", rep.to_markdown()), rep.to_html()):
        text = " ".join(shown.split())  # as it reads, the terminal's wrapping undone
        assert "at most 1.0 min" not in text and "≤ 1.0 min" not in text
        assert "(50.0 s of it an upper bound)" in text
        assert "would not have run within the budget anyway" in text


def test_an_all_bound_saving_reads_at_most() -> None:
    rows = [TrialRow(trial="0", number=0, outcome="rejected", pred_trial_time=50.0,
                     reason_kinds=["memory"])]  # fmt: skip
    s = Report(rows, title="t", source="rows").summary()
    assert s["saved_all_upper_bound"] and s["saved_adjusted_s"] is None
    assert "at most 50.0 s" in _terminal(Report(rows, title="t", source="rows"))


def test_a_configuration_rejected_again_counts_once(tmp_path: Path) -> None:
    """A searcher that proposes one refused configuration three times: its run would
    have been made once, though a refit in between predicted it anew."""
    store = ObservationStore(tmp_path / "c.db")
    for t, width in enumerate([4096, 4096, 4096, 2048]):
        epoch = 5.0 if t != 2 else 60.0  # the third time, after a refit
        store.record_prediction(
            study="s", trial=f"abc_rej{t}", spec={"name": "mlp", "epochs": 2}, features=None,
            prediction={"peak_memory": width * MiB, "epoch_time": epoch, "trial_time": 2 * epoch},
            decision={"admit": False, "reasons": [{"kind": "memory", "message": "too big"}]},
            device="A10", status="rejected", reason="too big", meta={"params": {"width": width}},
        )  # fmt: skip
    rep = ca.report(store)
    s = rep.summary()
    assert [rep.saving(r)[1] for r in rep.trials] == [
        "upper_bound", "repeat", "repeat", "upper_bound",
    ]  # fmt: skip
    assert s["saved_s"] == pytest.approx(20.0) and s["saved_trials"] == 2
    assert "2 trials rejected with the same parameters as an earlier rejected trial" in (
        rep.to_markdown()
    )


# --------------------------------------------------------------------------------------
# direction words
# --------------------------------------------------------------------------------------
def test_the_direction_words_follow_the_signed_median() -> None:
    """Errors -95%, -60%, +120%, +150%: the median signed error is +30% (too high), while
    the median of measured / predicted (x1.48) alone would read "too low"."""
    rows = [
        TrialRow(trial=str(i), number=i, outcome="completed", pred_epoch_time=p,
                 actual_epoch_time=1.0)
        for i, p in enumerate([0.05, 0.4, 2.2, 2.5])
    ]  # fmt: skip
    rep = Report(rows, title="t", source="rows")
    err = rep.summary()["time_error"]
    assert err["median"] == pytest.approx(0.30) and err["median_ratio"] > 1.25
    for text in (_terminal(rep), rep.to_markdown(), rep.to_html()):
        assert "bias +30%: predictions too high" in text
        assert "predictions too low" not in text and "×1.5 too low" not in text


# --------------------------------------------------------------------------------------
# Ray Tune
# --------------------------------------------------------------------------------------
def _state(exp: Path, stamp: str, ids: list[str]) -> Path:
    data = []
    for i, tid in enumerate(ids):
        info = {"trial_id": tid, "config": {"width": 32}, "status": "TERMINATED",
                "relative_logdir": f"t_{tid}", "experiment_tag": f"{i + 1}_width=32"}  # fmt: skip
        data.append([json.dumps(info), json.dumps({"start_time": 1.79e9 + i})])
    path = exp / f"experiment_state-{stamp}.json"
    path.write_text(json.dumps({"trial_data": data, "runner_data": {"_metric": "loss"}}))
    return path


def test_a_restored_run_is_read_from_its_newest_state_by_name(tmp_path: Path) -> None:
    """Tuner.restore writes a new state file and rewrites the old one after it: the old
    one is the newest by time, the new one by the timestamp in its name (what Ray reads)."""
    exp = tmp_path / "exp"
    exp.mkdir()
    new = _state(exp, "2026-12-07_20-54-51", ["a", "b", "c"])
    old = _state(exp, "2026-12-07_20-54-05", ["a"])
    os.utime(new, (1_000_000, 1_000_000))
    os.utime(old, (2_000_000, 2_000_000))
    rep = ca.report(exp)
    assert [r.trial for r in rep.trials] == ["a", "b", "c"]


def test_a_ray_run_whose_every_suggestion_was_rejected_shows_them(tmp_path: Path) -> None:
    exp = tmp_path / "reject_all"
    exp.mkdir()
    _state(exp, "2026-12-07_20-58-40", [])
    store = ObservationStore(tmp_path / "c.db")
    for t in range(3):
        store.record_prediction(
            study="reject_all", trial=f"ddd_rej{t}", spec={"name": "mlp", "epochs": 2},
            features=None, prediction={"peak_memory": 30 * 2**30, "trial_time": 10.0 + t},
            decision={"admit": False, "reasons": [{"kind": "memory", "message": "too big"}]},
            device="A10", status="rejected", reason="too big",
            meta={"params": {"width": 4096 + t}},
        )  # fmt: skip
    rep = ca.report(exp, store=store)
    assert [r.outcome for r in rep.trials] == ["rejected"] * 3
    notes = " ".join(rep.notes)
    assert "holds no records" not in notes and "No trials recorded" not in notes


def test_trials_that_crashed_before_reporting_ask_for_no_scheduler(tmp_path: Path) -> None:
    exp = tmp_path / "raises"
    exp.mkdir()
    state = _state(exp, "2026-12-07_20-57-14", ["a", "b"])
    text = state.read_text().replace("TERMINATED", "ERROR")
    state.write_text(text)
    rep = ca.report(exp, store=ObservationStore(tmp_path / "c.db"))
    assert [r.outcome for r in rep.trials] == ["failed", "failed"]
    notes = " ".join(rep.notes)
    assert "No actuals recorded" not in notes
    assert "Every admitted trial (2) crashed before recording a measurement" in notes
    assert re.search(r"failed\s+2", _terminal(rep))


# --------------------------------------------------------------------------------------
# words of the measurements and the money
# --------------------------------------------------------------------------------------
def test_the_cpu_peak_is_described_by_its_recorded_method(tmp_path: Path) -> None:
    store = ObservationStore(tmp_path / "c.db")
    method = "peak of the bytes held by PyTorch's CPU allocator over the first 2 training batches"
    store.record_measurement(
        study="s", trial=0, epoch=0, device="cpu", status="ok",
        actual={"peak_memory": MiB, "epoch_time": 1.0, "device_kind": "cpu",
                "memory_method": method},
    )  # fmt: skip
    page = ca.report(store).to_html()
    assert method.replace("'", "&#x27;") in page
    assert "growth of the resident set" not in page


def test_cost_reasons_are_written_in_the_reports_currency() -> None:
    reason = "0.0017 spent + 5.4e-05 for this trial (2 GPUs) exceeds the 0.0040 cost cap"
    row = TrialRow(trial="0", number=0, outcome="rejected", reasons=[reason],
                   reason_kinds=["cost"])  # fmt: skip
    rep = Report([row], title="t", source="rows", currency="€")
    assert rep.trials[0].reasons == [
        "€0.0017 spent + €5.4e-05 for this trial (2 GPUs) exceeds the €0.0040 cost cap"
    ]
    assert "€0.0017 spent + €5.4e-05" in rep.to_markdown()


def test_the_budgets_price_is_recorded_and_prices_the_report(tmp_path: Path) -> None:
    """A study judged under Budget(price_per_hour=...) records the price with its
    decisions: its report shows money without being told the price again."""
    from costaware.runtime.gate import Gate

    store = ObservationStore(tmp_path / "costaware.db")
    gate = Gate(ca.Budget(max_cost=5.0, price_per_hour=3.0), device="cpu", store=store)
    spec = ca.TrainingSpec(
        model=lambda: zoo.mlp(32, (64,), 10), batch=ca.ImageBatch((32,), classes=10),
        batch_size=16, dataset_size=256, epochs=2,
    )  # fmt: skip
    assert gate.judge(spec, study="s", trial=0).admit
    store.record_measurement(
        study="s", trial=0, status="ok", actual={"epoch_time": 36.0}, device="CPU", epoch=0
    )
    rep = ca.report(store)
    assert rep.price_per_hour == 3.0
    assert rep.summary()["spent_cost"] == pytest.approx(36.0 / 3600 * 3.0)
    assert "$" in rep.to_markdown()
    assert ca.report(store, price_per_hour=6.0).price_per_hour == 6.0  # the caller's wins


def test_an_optuna_journal_file_is_reported_as_a_study(tmp_path: Path) -> None:
    """A study on ``JournalStorage(JournalFileBackend(path))``: the report takes the file
    as the source or as ``storage=``, where it was opened as a SQLite database."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    path = tmp_path / "journal.log"
    storage = JournalStorage(JournalFileBackend(str(path)))
    study = optuna.create_study(study_name="j", storage=storage)
    study.add_trial(_trial(0, 5.0, state=TrialState.COMPLETE, attrs={"costaware:admit": True}))
    study.add_trial(_trial(1, 0.2, state=TrialState.PRUNED, attrs=_rejected_attrs("memory", "m")))
    for rep in (ca.report(str(path)), ca.report(storage=str(path), study="j")):
        assert rep.study == "j" and [r.outcome for r in rep.trials] == ["completed", "rejected"]
    with pytest.raises(ca.ReportError, match="holds no study 'k'"):
        ca.report(storage=str(path), study="k")
