"""costaware.runtime.calibrate: measure a few corpus models here and give the online refit its
first rows. Real measurements on this CPU and a real SQLite store; a stand-in measure
only where the test needs a machine of a known speed."""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest

import costaware as ca
from costaware import zoo
from costaware.cli import main as cli
from costaware.integrations.optuna import CostAwarePruner
from costaware.measure.corpus import Config, corpus
from costaware.measure.profile import Measurement
from costaware.runtime.calibrate import (
    SEED,
    STUDY,
    CalibrationRow,
    calibrate,
    calibration_configs,
    judge,
)
from costaware.runtime.refit import OnlineRefit
from costaware.runtime.store import ObservationStore


def _fast_cpu_configs(n: int) -> list[Config]:
    """The n quickest default-allocator configurations of the CPU corpus, one per family."""
    seen: dict[str, Config] = {}
    for c in sorted(corpus("cpu", seed=SEED), key=lambda c: c.fwd_flops * c.batch_size):
        if c.family not in seen and c.family not in ("rnn", "random_conv"):
            seen[c.family] = c
    return list(seen.values())[:n]


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_calibration_configs_span_families_and_precisions(kind: str) -> None:
    picks = calibration_configs(kind, 20)
    assert picks == calibration_configs(kind, 20)  # deterministic
    assert len(picks) == 20 and len({c.id for c in picks}) == 20
    families = {c.family for c in corpus(kind, seed=SEED)}
    assert {c.family for c in picks} == families  # 16 families: each comes in
    counts = [sum(c.precision == p for c in picks) for p in {c.precision for c in picks}]
    assert len(counts) >= 2 and max(counts) - min(counts) <= 1  # precisions in turn
    # one process, one allocator; no cuDNN search (its peak measures the card)
    assert all(c.allocator == "default" and not c.cudnn_benchmark for c in picks)
    assert calibration_configs(kind, 3) == picks[:3]
    with pytest.raises(ValueError, match="n must be"):
        calibration_configs(kind, 0)


def _rows(ratios: list[float], precision: str = "fp32") -> list[CalibrationRow]:
    return [
        CalibrationRow(
            id=f"c{i}",
            family="f",
            precision=precision,
            status="ok",
            predicted_time=0.01 * (i + 1),
            measured_time=0.01 * (i + 1) * r,
        )
        for i, r in enumerate(ratios)
    ]


def test_judge_finds_a_shift_worth_correcting_and_noise_not() -> None:
    rng = np.random.default_rng(0)
    shifted = _rows(list(1.6 * np.exp(rng.normal(0, 0.05, 12))))
    before, after = judge(shifted)
    assert before is not None and after is not None
    assert before == pytest.approx(1 - 1 / 1.6, abs=0.05)  # the model 1.6x too fast
    assert after < 0.1 < before
    noise = _rows([float(np.exp(0.15 * (-1) ** i)) for i in range(12)])  # no shift, no trend
    before, after = judge(noise)
    assert before is not None and after is not None and after > 0.9 * before
    # too few rows to leave one out, or no precision with two rows: nothing to judge
    assert judge(_rows([1.5, 1.5])) == (None, None)
    lone = _rows([1.5]) + _rows([1.5], "bf16") + _rows([1.5], "fp16")
    assert judge(lone) == (None, None)


def test_calibrate_measures_here_and_the_refit_learns_the_rows(tmp_path: Path) -> None:
    store = ObservationStore(f"sqlite:///{tmp_path / 'c.db'}")
    configs = _fast_cpu_configs(4)
    result = calibrate("cpu", store=store, record="always", configs=configs, progress=False)
    assert result.device == "CPU" and len(result.rows) == 4
    assert all(r.status == "ok" and r.measured_time and r.predicted_time for r in result.rows)
    assert all(r.measured_memory and r.predicted_memory for r in result.rows)
    assert set(result.host_speed) == {"dispatch_us", "matmul_gflops", "add_gbs"}
    assert result.recorded == 4 and result.study == STUDY
    obs = store.observations(study=STUDY)
    assert sorted(o.family or "" for o in obs) == sorted(c.family for c in configs)
    assert {o.device for o in obs} == {"CPU"} and all(o.iteration_time for o in obs)
    measured = {r.family: r.measured_time for r in result.rows}
    assert {o.family: o.iteration_time for o in obs} == measured
    # the integrations' online refit (study=None: the whole store) starts from them
    refit = OnlineRefit(store, background=False)
    assert refit.pending() == 4
    assert refit.refit_now().training_["rows"] == 4
    # a real Optuna study's pruner over the same store: its first trial is already judged
    # by a model refitted on the calibration
    pruner = CostAwarePruner(spec_fn=_digits_spec, budget=ca.Budget(max_memory="1GiB"), device="CPU",
                             store=store, refit_every=5)  # fmt: skip
    assert pruner.refit is not None
    pruner.refit.background = False
    study = optuna.create_study(study_name="after-calibration", pruner=pruner)

    def objective(trial: optuna.Trial) -> float:
        trial.suggest_categorical("width", [32, 64])
        if trial.should_prune():
            raise optuna.TrialPruned()
        return 0.0

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.optimize(objective, n_trials=2)
    assert [t.user_attrs["costaware:refit_rows"] for t in study.trials] == [4, 4]
    text = str(result)
    assert "calibration on CPU: 4 of 4 configurations measured" in text
    assert f"4 rows recorded as study '{STUDY}'" in text
    assert json.loads(json.dumps(result.to_dict()))["recorded"] == 4


def _digits_spec(params: dict[str, Any]) -> ca.TrainingSpec:
    return ca.TrainingSpec(
        model=functools.partial(zoo.mlp, 64, (params["width"],), 10),
        batch=ca.ImageBatch((64,), classes=10),
        batch_size=32,
        dataset_size=1000,
    )


def _machine(model: ca.CostModel, speed: float, noise: float = 0.0) -> Any:
    """A measure of a machine ``speed`` times slower than ``model`` predicts, each time off
    by ``noise`` in the log, up, up, down, down (no shift, no trend, in either precision)."""
    calls = [0]

    def measure(spec: ca.TrainingSpec, device: str) -> Measurement:
        sign = 1 if calls[0] % 4 < 2 else -1
        calls[0] += 1
        t = model.predict(spec, device="CPU").iteration_time * speed * np.exp(sign * noise)
        return Measurement(status="ok", device=device, iteration_time=float(t), max_reserved=1)

    return measure


def test_record_auto_records_only_a_correction_that_helps(tmp_path: Path) -> None:
    configs = calibration_configs("cpu", 6)
    model = ca.CostModel.default()  # one model: each architecture is traced once
    kw: dict[str, Any] = {"configs": configs, "model": model, "progress": False}
    slow = ObservationStore(f"sqlite:///{tmp_path / 'slow.db'}")
    result = calibrate("cpu", store=slow, measure_fn=_machine(model, 2.0), **kw)
    assert result.useful and result.recorded == 6 and len(slow.observations()) == 6
    assert result.time_ratio == pytest.approx(2.0)
    same = ObservationStore(f"sqlite:///{tmp_path / 'same.db'}")
    result = calibrate("cpu", store=same, measure_fn=_machine(model, 1.0, 0.2), **kw)
    assert not result.useful and result.recorded == 0 and same.observations() == []
    assert "nothing recorded" in str(result)
    never = calibrate("cpu", store=same, measure_fn=_machine(model, 2.0), record="never", **kw)
    assert never.useful and never.recorded == 0 and same.observations() == []


def test_a_configuration_that_fails_is_a_row_not_a_stop() -> None:
    def broken(spec: ca.TrainingSpec, device: str) -> Measurement:
        raise RuntimeError("the device went away")

    result = calibrate("cpu", configs=calibration_configs("cpu", 2), measure_fn=broken)
    assert [r.status for r in result.rows] == ["error", "error"]
    assert all("the device went away" in (r.error or "") for r in result.rows)
    assert result.time_error is None and not result.useful and result.recorded == 0


def test_bad_arguments_are_clear() -> None:
    with pytest.raises(ValueError, match="record must be one of"):
        calibrate("cpu", record="sometimes")
    with pytest.raises(ValueError, match="device must be"):
        calibrate("tpu")
    with pytest.raises(ValueError, match="study must name the study"):
        calibrate("cpu", study=" ")
    # a store that cannot be opened fails before anything is measured, not after
    measured: list[object] = []
    with pytest.raises(Exception, match=r"driver is not installed|mysql"):
        calibrate(
            "cpu", store="mysql://nobody@nowhere/x", measure_fn=lambda *a: measured.append(a)
        )
    assert measured == []


def test_cli_calibrate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["calibrate", "-n", "0"]) == 2
    assert "-n must be at least 1" in capsys.readouterr().err
    assert cli(["calibrate", "--record", "always"]) == 2
    assert "--record always needs --store" in capsys.readouterr().err
    if not __import__("torch").cuda.is_available():
        assert cli(["calibrate", "--device", "cuda"]) == 2
        said = capsys.readouterr().err
        assert "needs a visible CUDA GPU" in said and "unexpected" not in said
    url = f"sqlite:///{tmp_path / 'c.db'}"
    args = ["calibrate", "--device", "cpu", "-n", "2", "--store", url, "--record", "never"]
    assert cli([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device"] == "CPU" and len(out["rows"]) == 2 and out["recorded"] == 0
    assert [r["id"] for r in out["rows"]] == [c.id for c in calibration_configs("cpu", 2)]


def test_a_gpu_is_predicted_as_its_catalog_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    from costaware.runtime import calibrate as cal

    # no GPU here: torch's name of one stands in
    monkeypatch.setattr("torch.cuda.get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    assert cal._target_device("cuda").name == "H100-SXM"
    assert cal._target_device("cpu").name == "CPU"
    # a GPU the catalog lacks, with no NVML to describe it, is a clear error, not a CPU
    monkeypatch.setattr("torch.cuda.get_device_name", lambda i=0: "NVIDIA Foo 9000")
    monkeypatch.setattr(cal, "get_device", _no_nvml(cal.get_device))
    with pytest.raises(RuntimeError, match="'NVIDIA Foo 9000': it is not in the catalog"):
        cal._target_device("cuda:1")


def _no_nvml(get_device: Any) -> Any:
    def lookup(name: str) -> Any:
        return get_device("cpu") if name == "auto" else get_device(name)

    return lookup
