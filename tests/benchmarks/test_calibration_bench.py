"""benchmarks/calibration.py: its held-out architectures are outside the corpus, and a
short run on this CPU prints the comparison."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import costaware as ca
from costaware.measure.corpus import corpus

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import calibration  # noqa: E402


def test_held_out_architectures_trace_and_are_no_corpus_family() -> None:
    names = [name for name, *_ in calibration.HELD_OUT]
    assert len(set(names)) == len(names) >= 10
    zoo = {c.factory for c in corpus("gpu")} | {c.factory for c in corpus("cpu")}
    model = ca.CostModel.default()
    for name, factory, batch, bs, opt in calibration.HELD_OUT:
        built = factory()
        assert type(built).__module__ != "costaware.zoo"  # none of the corpus' models
        assert getattr(factory, "__name__", "") not in zoo
        spec = ca.TrainingSpec(model=factory, batch=batch, batch_size=bs, optimizer=opt, name=name)
        p = model.predict(spec, device="CPU")
        assert p.iteration_time > 0 and p.peak_memory > 0


@pytest.mark.slow
def test_a_short_run_prints_both_errors() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "calibration.py"), "--device", "cpu", "-n", "3"],
        capture_output=True, text=True, check=True, timeout=600,
    ).stdout  # fmt: skip
    assert "calibration on CPU: 3 of 3 configurations measured" in out
    assert out.count(" ms (") == 2 * len(calibration.HELD_OUT)
    assert "mean relative error over 11 architectures: shipped model" in out
