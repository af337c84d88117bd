"""What the report says the rejections saved: a memory rejection saves the time until the
crash it avoided, not a whole run; what the figure rests on is said; CPU time is called CPU
time; each missing-data note is shown once."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch
from rich.console import Console
from torch import nn

import costaware as ca
from costaware.reporting import Report, TrialRow
from costaware.runtime.store import ObservationStore

optuna.logging.set_verbosity(optuna.logging.WARNING)
MiB = 2**20
HOUR = 3600.0


def _rejected(
    store: ObservationStore,
    trial: int,
    kind: str,
    *,
    epoch: float | None = 0.6 * HOUR,
    epochs: int = 2,
    device: str = "A10",
) -> None:
    """A rejection as the pruner records it: the prediction, the decision and its reason."""
    store.record_prediction(
        study="s", trial=trial, spec={"name": "gpt2", "epochs": epochs}, features=None,
        prediction={
            "peak_memory": 30 * 2**30, "peak_memory_upper": 33 * 2**30,
            "epoch_time": epoch, "epoch_time_upper": None if epoch is None else epoch * 1.2,
            "trial_time": None if epoch is None else epoch * epochs, "kind": "analytic",
        },
        decision={"admit": False, "reasons": [{"kind": kind, "message": f"too much {kind}"}],
                  "checked": {"memory": {"predicted": 33 * 2**30, "limit": 24 * 2**30}}},
        device=device, status="rejected", reason=f"too much {kind}",
    )  # fmt: skip


def _ran(
    store: ObservationStore,
    trial: int,
    *,
    seconds: list[float],
    oom: bool = False,
    device: str = "A10",
    device_kind: str | None = "cuda",
) -> None:
    """An admitted trial and its measured epochs; with ``oom``, the last one crashed."""
    store.record_prediction(
        study="s", trial=trial, spec={"name": "gpt2", "epochs": len(seconds)}, features=None,
        prediction={"peak_memory": 20 * 2**30, "peak_memory_upper": 22 * 2**30,
                    "epoch_time": 60.0, "epoch_time_upper": 70.0, "kind": "analytic"},
        decision={"admit": True, "reasons": [], "checked": {}},
        device=device, status="admitted", reason=None,
    )  # fmt: skip
    for i, sec in enumerate(seconds):
        last = i == len(seconds) - 1
        store.record_measurement(
            study="s", trial=trial, epoch=i, device=device,
            status="oom" if oom and last else "ok",
            actual={"peak_memory": 21 * 2**30, "epoch_time": sec, "device_kind": device_kind},
            reason="CUDA out of memory. Tried to allocate 2.00 GiB" if oom and last else None,
        )  # fmt: skip


def _twelve_memory_rejections(store: ObservationStore) -> None:
    """The issue's study: 12 trials rejected for memory, each predicted at 1.2 h (14.40 h in
    all, $10.08 at $0.70 an hour), and one admitted trial that ran."""
    for t in range(12):
        _rejected(store, t, "memory")
    _ran(store, 12, seconds=[50.0, 50.0])


def _texts(rep: Report) -> dict[str, str]:
    console = Console(record=True, width=200)
    rep.print(console)
    page = rep.to_html()
    body = re.sub(r"<script.*?</script>", "", page, flags=re.S)  # the figures' data aside
    return {
        "markdown": re.sub(r"\\(.)", r"\1", rep.to_markdown()),  # as it reads, unescaped
        "terminal": console.export_text(),
        "html": html.unescape(re.sub(r"<[^>]+>", " ", body)),
    }


# --------------------------------------------------------------------------------------
# memory rejections: the time until the crash
# --------------------------------------------------------------------------------------
def test_a_measured_oom_sets_what_a_memory_rejection_saved(tmp_path: Path) -> None:
    store = ObservationStore(tmp_path / "c.db")
    _twelve_memory_rejections(store)
    _ran(store, 13, seconds=[30.0], oom=True)  # crashed 30 s in
    _ran(store, 14, seconds=[10.0, 20.0], oom=True)  # crashed in its second epoch, 30 s in
    _rejected(store, 15, "epoch_time", epoch=0.25 * HOUR, epochs=2)  # a time rejection
    rep = ca.report(store, price_per_hour=0.70)
    s = rep.summary()
    assert s["time_to_oom_s"] == pytest.approx(30.0) and s["time_to_oom_trials"] == 2
    # 12 x 30 s until the crash they avoided, + the time rejection's whole predicted run
    assert s["saved_s"] == pytest.approx(12 * 30.0 + 0.5 * HOUR)
    assert s["saved_by_basis"] == {
        "until_oom": {"seconds": pytest.approx(360.0), "trials": 12},
        "predicted_run": {"seconds": pytest.approx(1800.0), "trials": 1},
    }
    assert not s["saved_upper_bound"] and s["saved_cost"] == pytest.approx(2160 / 3600 * 0.70)
    by = {r.trial: r for r in rep.trials}
    assert rep.saving(by["0"]) == (pytest.approx(30.0), "until_oom")
    assert rep.saving(by["15"]) == (pytest.approx(1800.0), "predicted_run")
    assert rep.saving(by["12"]) == (None, "ran")
    assert rep.to_dict()["trials"][0]["saved_basis"] == "until_oom"
    assert rep.timeline()[-1]["avoided"] == pytest.approx(2160.0)
    why = (
        "12 trials rejected for memory: each counted at 30.0 s, the median time from start to "
        "crash of the 2 trials of this study that ran out of memory"
    )
    for where, text in _texts(rep).items():
        flat = " ".join(text.split())
        assert "14.40 h" not in flat and "$10.08" not in flat, where
        assert "36.0 min ($0.42)" in flat, where  # 2,160 s at $0.70 an hour
        assert why in flat, where
        assert "1 trial rejected for time or cost: counted at its whole predicted run" in flat
        assert "at most 3" not in flat and "≤" not in flat, where  # no upper bound in it
        assert "to measure how soon" not in flat, where


def test_without_a_measured_oom_the_saving_is_an_upper_bound_and_says_why(
    tmp_path: Path,
) -> None:
    store = ObservationStore(tmp_path / "c.db")
    _twelve_memory_rejections(store)
    rep = ca.report(store, price_per_hour=0.70)
    s = rep.summary()
    assert s["saved_s"] == pytest.approx(14.4 * HOUR) and s["saved_upper_bound"]
    assert s["time_to_oom_s"] is None and s["saved_by_basis"]["upper_bound"]["trials"] == 12
    texts = _texts(rep)
    for where, text in texts.items():
        flat = " ".join(text.split())
        assert "at most 14.40 h ($10.08)" in flat or "≤ 14.40 h" in flat, where
        assert (
            "12 trials rejected for memory: counted at their whole predicted run (14.40 h), an "
            "upper bound. They would have crashed when they ran out of memory, most likely in "
            "the first steps, and no trial of this study ran out of memory to measure how soon."
        ) in flat, where
    assert "at most 14.40 h ($10.08)" in texts["markdown"] and "≤ 14.40 h" in texts["html"]


def test_a_memory_rejection_without_a_predicted_time_counts_the_crash(tmp_path: Path) -> None:
    """No dataset_size, so no predicted run: the measured crash still says what it saved;
    without one, nothing is counted and the note says so once."""
    store = ObservationStore(tmp_path / "c.db")
    _rejected(store, 0, "memory", epoch=None)
    _rejected(store, 1, "memory", epoch=None)
    _ran(store, 2, seconds=[5.0])
    alone = ca.report(store)
    assert alone.summary()["saved_s"] is None and alone.summary()["saved_unknown"] == 2
    note = next(n for n in alone.notes if "2 rejected trials have no predicted" in n)
    assert "Give the spec dataset_size." in note
    for where, text in _texts(alone).items():
        assert " ".join(text.split()).count(" ".join(note.split())) == 1, where
    _ran(store, 3, seconds=[12.0], oom=True)
    rep = ca.report(store)
    assert rep.summary()["saved_s"] == pytest.approx(24.0)
    assert rep.summary()["saved_unknown"] == 0
    assert not any("have no predicted" in n for n in rep.notes)


# --------------------------------------------------------------------------------------
# CPU time is CPU time
# --------------------------------------------------------------------------------------
def test_cpu_time_is_called_cpu_time(tmp_path: Path) -> None:
    """Predicted for an A10, measured on a CPU: the time spent is CPU time."""
    store = ObservationStore(tmp_path / "c.db")
    _rejected(store, 0, "epoch_time")
    _ran(store, 1, seconds=[3.0, 3.0], device="A10", device_kind="cpu")
    rep = ca.report(store)
    assert rep.device_word == "CPU"
    for where, text in _texts(rep).items():
        assert "CPU time spent" in text or "of CPU time spent" in text, where
        assert "GPU time" not in text, where
    # measured on a GPU, or nothing recorded about the device
    gpu = ObservationStore(tmp_path / "g.db")
    _ran(gpu, 0, seconds=[3.0], device="cpu", device_kind="cuda")
    assert ca.report(gpu).device_word == "GPU"
    rows = [TrialRow(trial="0", outcome="completed", wall_time=5.0)]
    assert Report(rows, title="t", source="rows").device_word == "device"


# --------------------------------------------------------------------------------------
# each missing-data note once
# --------------------------------------------------------------------------------------
def test_each_note_is_shown_once(tmp_path: Path) -> None:
    store = ObservationStore(tmp_path / "c.db")
    _rejected(store, 0, "memory", epoch=None)
    _rejected(store, 1, "epoch_time", epoch=None)
    _ran(store, 2, seconds=[5.0])
    store.record_prediction(
        study="s", trial=3, spec={"name": "gpt2"}, features=None, prediction=None,
        decision=None, device="A10", status="admitted", reason=None,
    )  # fmt: skip
    rep = Report(
        ca.report(store).trials,
        title="t",
        source="store",
        notes=["given twice", "given twice"],
    )
    assert rep.notes.count("given twice") == 1
    assert len(rep.notes) == len(set(rep.notes)) >= 3
    for where, text in _texts(rep).items():
        flat = " ".join(text.split())
        for note in rep.notes:
            assert flat.count(" ".join(note.split())) == 1, (where, note)


def test_a_note_given_as_a_warning_is_not_printed_again(tmp_path: Path) -> None:
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    store = ObservationStore(tmp_path / "c.db")
    _ran(store, 0, seconds=[5.0])
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'c.db'}", poolclass=NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO costaware_predictions (created_at, study, trial, status, spec) "
            "VALUES ('2026-01-01 00:00:00', 's', '9', 'maybe', '{}')"
        )
    engine.dispose()
    with pytest.warns(ca.CostAwareWarning, match="malformed row") as caught:
        rep = ca.report(store)
    (warned,) = [str(w.message) for w in caught if "malformed" in str(w.message)]
    assert warned in rep.notes and warned in rep.warned
    console = Console(record=True, width=400)
    rep.print(console)
    assert "malformed" not in console.export_text()  # once, as the warning
    assert rep.to_html().count("malformed row(s)") == 1  # the page has it, once
    assert rep.to_markdown().count("malformed row(s)") == 1


# --------------------------------------------------------------------------------------
# a real study: Optuna, a Lightning Trainer on the CPU, one trial that runs out of memory
# --------------------------------------------------------------------------------------
class _Net(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_a_real_study_counts_its_memory_rejections_until_the_measured_crash(
    tmp_path: Path,
) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from torch.utils.data import DataLoader, TensorDataset

    from costaware.integrations.lightning import CostAwareCallback
    from costaware.integrations.optuna import CostAwarePruner

    class Lit(pl.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self, width: int, crash: bool) -> None:
            super().__init__()
            self.net, self.crash = _Net(width), crash

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.crash and batch_idx == 3:  # what a GPU does to a step over its memory
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    def spec_fn(params: dict[str, Any]) -> ca.TrainingSpec:
        return ca.TrainingSpec(
            model=lambda: _Net(params["width"]),
            batch=ca.ImageBatch((64,), classes=10),
            batch_size=16,
            optimizer="adam",
            dataset_size=50_000_000,  # a long predicted run: hours, against a quick crash
        )

    store = ObservationStore(tmp_path / "costaware.db")
    budget = ca.Budget(max_memory="64MiB")
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'hpo.db'}",
        study_name="s",
        pruner=CostAwarePruner(
            spec_fn=spec_fn, budget=budget, device="cpu", store=store, refit_every=None
        ),
        sampler=optuna.samplers.GridSampler({"width": [32, 65536], "crash": [False, True]}),
    )
    data = TensorDataset(torch.randn(128, 64), torch.randint(0, 10, (128,)))

    def objective(trial: optuna.Trial) -> float:
        width = trial.suggest_categorical("width", [32, 65536])
        crash = trial.suggest_categorical("crash", [False, True])
        if trial.should_prune():
            raise optuna.TrialPruned()
        trainer = pl.Trainer(
            max_epochs=1, accelerator="cpu", devices=1, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[CostAwareCallback(store=store, trial=trial, device="cpu")],
        )  # fmt: skip
        trainer.fit(Lit(width, crash), DataLoader(data, batch_size=16))
        return 1.0

    study.optimize(objective, n_trials=4, catch=(torch.OutOfMemoryError,))
    rep = ca.report(study, store=store)
    outcomes = sorted((r.params["width"], r.params["crash"], r.outcome) for r in rep.trials)
    assert outcomes == [
        (32, False, "completed"),
        (32, True, "oom"),
        (65536, False, "rejected"),
        (65536, True, "rejected"),
    ]
    s = rep.summary()
    (oom,) = [r for r in rep.trials if r.outcome == "oom"]
    assert oom.wall_time and s["time_to_oom_s"] == pytest.approx(oom.wall_time)
    rejected = [r for r in rep.trials if r.outcome == "rejected"]
    assert all(r.reason_kinds == ["memory"] and r.predicted_cost for r in rejected)
    predicted = sum(r.predicted_cost or 0.0 for r in rejected)
    assert s["saved_s"] == pytest.approx(2 * oom.wall_time) and s["saved_s"] < predicted / 100
    assert s["device_word"] == "CPU" and not s["saved_upper_bound"]
    md = rep.to_markdown()
    assert "CPU time saved by the rejections" in md and "GPU time" not in md
    assert "2 trials rejected for memory: each counted at" in md
