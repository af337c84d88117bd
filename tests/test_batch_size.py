"""The largest batch size that fits (``CostModel.max_batch_size`` and its CLI)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

import costaware as ca
from costaware import zoo

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def model() -> ca.CostModel:
    return ca.CostModel.default()


def _cnn(batch_size: int = 16) -> ca.TrainingSpec:
    return ca.TrainingSpec(
        model=functools.partial(zoo.resnet, depth=18, width=16, classes=10),
        batch=ca.ImageBatch((3, 64, 64), classes=10),
        batch_size=batch_size,
    )


def test_the_size_found_fits_and_the_next_does_not(model: ca.CostModel) -> None:
    budget = ca.Budget(max_memory="3GiB")
    found = model.max_batch_size(_cnn(), "H100", budget)
    assert found.fits and found.limited_by == "memory"
    h100 = ca.get_device("H100")
    need = found.prediction.min_capacity_upper + h100.context_overhead_bytes
    assert need <= 3 * 2**30
    assert found.decision.admit
    # the decision it rests on is the study's: the same prediction, the same budget
    again = budget.decide(model.predict(_cnn(found.batch_size), "H100"), device="H100")
    assert again.admit
    bigger = budget.decide(model.predict(_cnn(found.batch_size + 1), "H100"), device="H100")
    assert not bigger.admit and bigger.reasons[0].kind == "memory"
    assert found.rejected is not None and not found.rejected.admit
    # the bisection closed on the answer: the size just above it was tried and rejected
    assert found.batch_size + 1 in found.tried
    assert str(found).startswith(f"largest batch size on the H100-SXM: {found.batch_size} ")
    assert json.loads(json.dumps(found.to_dict(), default=str))["batch_size"] == found.batch_size


def test_without_a_budget_the_device_is_the_limit(model: ca.CostModel) -> None:
    small = model.max_batch_size(_cnn(), "T4", limit=1 << 16)
    large = model.max_batch_size(_cnn(), "H100", limit=1 << 16)
    assert small.fits and large.fits
    assert small.batch_size < large.batch_size
    assert "all of the T4's memory" in str(small)


def test_nothing_fits_says_so_with_what_batch_one_needs(model: ca.CostModel) -> None:
    found = model.max_batch_size(_cnn(), "H100", ca.Budget(max_memory="1GiB"))
    assert not found.fits and found.batch_size == 0 and found.limited_by == "nothing fits"
    text = str(found)
    assert "nothing fits on the H100-SXM, not even a batch of 1" in text
    assert "at batch size 1" in text


def test_everything_fits_up_to_the_search_limit_says_so(model: ca.CostModel) -> None:
    found = model.max_batch_size(_cnn(), "H100", limit=64)
    assert found.batch_size == 64 and found.limited_by == "search limit"
    assert "every batch size up to the search limit of 64 fits" in str(found)


@pytest.mark.parametrize("limit", [0, -3, 2.5, True])
def test_a_bad_limit_is_refused(model: ca.CostModel, limit: object) -> None:
    with pytest.raises(ValueError, match="limit must be a whole number of at least 1"):
        model.max_batch_size(_cnn(), "H100", limit=limit)  # type: ignore[arg-type]


def test_the_cli_prints_the_size_and_exits_1_when_nothing_fits() -> None:
    base = [sys.executable, "-m", "costaware.cli", "max-batch-size", "examples/models.py:resnet18"]
    args = ["--input", "3x64x64", "--classes", "10", "--device", "H100"]
    ok = subprocess.run(
        [*base, *args, "--max-memory", "4GiB", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert result["fits"] and result["limited_by"] == "memory" and result["batch_size"] >= 1
    none = subprocess.run(
        [*base, *args, "--max-memory", "1GiB"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert none.returncode == 1
    assert "nothing fits on the H100-SXM" in none.stdout
