"""The examples a new user runs first keep working."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_optuna_quickstart_runs_and_rejects(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "optuna_quickstart.py"),
            "--trials",
            "8",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    assert "8 trials in" in out
    assert "rejected before they ran" in out
    # at least one rejection names its number (with more decimals when they are that close)
    assert re.search(r"exceeds the 160(\.0+)? MiB budget", out)
    # the study's predictions and the shipped model's, scored on the same measured trials
    assert re.search(r"epoch time +\d+% / \d+%", out)
    assert (tmp_path / "costaware.db").is_file() and (tmp_path / "hpo.db").is_file()
    assert (tmp_path / "costaware.db.costaware-models" / "LATEST").is_file()  # refitted and shared


@pytest.mark.slow
def test_predict_demo_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "predict_demo.py"), "--device", "A100"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        cwd=ROOT / "examples",
    ).stdout
    assert "ResNet-50" in out and "reject" in out and "What one prediction rests on" in out
