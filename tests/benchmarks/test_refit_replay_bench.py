"""benchmarks/refit_replay.py on synthetic held-out rows whose errors are known."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import refit_replay  # noqa: E402


def _rows(bias: float, n: int = 24) -> list[dict[str, object]]:
    """Two families, each off by its own factor plus +-1% of noise, sizes over 3 decades."""
    rng = np.random.default_rng(0)
    out = []
    for fam, off in (("a", bias), ("b", -bias)):
        for i, pred in enumerate(np.geomspace(1e-3, 1.0, n)):
            noise = 0.01 * (1 if i % 2 else -1)
            out.append(
                {"kind": "cuda", "family": fam, "precision": "bf16" if rng.random() < 0.5 else "fp32",
                 "p_secs": float(pred), "secs": float(pred * math.exp(off + noise))}
            )  # fmt: skip
    return out


def test_a_family_wide_factor_is_learned_by_every_rule() -> None:
    res = refit_replay.replay(_rows(0.4), refit_replay.SCENARIOS["as measured"], 3, 0)
    for k in refit_replay.STEPS:
        expected = (abs(math.exp(-0.4) - 1) + abs(math.exp(0.4) - 1)) / 2  # |pred / meas - 1|
        assert res["no refit"][k] == pytest.approx(expected, abs=0.02)
        # one factor per precision: exact but for the noise, once each precision is seen
        assert res["one factor"][k] < (0.05 if k >= 8 else res["no refit"][k])
    shift = refit_replay.replay(_rows(0.0), refit_replay.SCENARIOS["1.6x slower"], 3, 0)
    assert shift["no refit"][13] == pytest.approx(1 - 1 / 1.6, abs=0.01)
    assert shift["one factor"][13] < 0.03


def test_command_line_prints_a_table_per_device_kind(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _rows(0.2)) + "\n")
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "refit_replay.py"), str(path), "--orders", "2"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "## GPU: 48 rows, 2 families" in out
    assert out.count("| as measured |") == len(refit_replay.STEPS)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    bad = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "refit_replay.py"), str(empty)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode != 0 and "accuracy.py --rows" in bad.stderr


def test_calibration_corrects_a_device_shift_and_leaves_a_fitting_model_alone() -> None:
    rows = _rows(0.0, n=30)  # the model fits both families (1% noise)
    fits = refit_replay.replay_calibration(rows, refit_replay.SCENARIOS["as measured"], 3, 0)
    slow = refit_replay.replay_calibration(rows, refit_replay.SCENARIOS["1.6x slower"], 3, 0)
    for k in refit_replay.CALIBRATION_STEPS:
        # nothing to correct: --record auto declines, and the error stays the noise
        assert fits["taken"][k] == 0.0 and fits["auto"][k] == fits["no refit"][k] < 0.02
        # every time 1.6x: the other family's rows carry the shift, and auto takes it
        assert slow["no refit"][k] == pytest.approx(1 - 1 / 1.6, abs=0.01)
        assert slow["taken"][k] == 1.0 and slow["auto"][k] == slow["always"][k] < 0.03


def test_command_line_calibration_table(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _rows(0.0, n=30)) + "\n")
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "refit_replay.py"), str(path),
         "--orders", "2", "--calibration"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "| scenario | k | no refit | always | auto | auto took it |" in out
    assert out.count("| 1.6x slower |") == len(refit_replay.CALIBRATION_STEPS)


def test_unseen_device_rows_are_replayed_apart_and_only_when_asked(tmp_path: Path) -> None:
    """accuracy.py writes a GPU's rows as predicted by models that never saw it beside the
    leave-family-out rows: the plain replay leaves them out, --unseen-device replays them
    alone, by device and by whether the families were seen."""
    plain = _rows(0.2)
    unseen = [
        {**r, "device": "H200", "unseen_device": how}
        for how in ("families_seen", "families_unseen")
        for r in _rows(0.3)
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [*plain, *unseen]) + "\n")
    assert len(refit_replay.load([str(path)])) == len(plain)
    assert len(refit_replay.load([str(path)], unseen_device=True)) == len(unseen)
    script = str(ROOT / "benchmarks" / "refit_replay.py")
    for extra in ([], ["--calibration"]):
        out = subprocess.run(
            [sys.executable, script, str(path), "--orders", "2", "--unseen-device", *extra],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "## H200, never seen by the model, families seen on other GPUs: 48 rows" in out
        assert "## H200, never seen by the model, families unseen: 48 rows" in out
        assert "1.6x slower" not in out  # the other device is real: nothing simulated
    # no unseen-device rows: one clear line, not a traceback
    path.write_text("\n".join(json.dumps(r) for r in plain) + "\n")
    bad = subprocess.run(
        [sys.executable, script, str(path), "--unseen-device"], capture_output=True, text=True
    )
    assert bad.returncode != 0 and "no timed unseen-device rows" in bad.stderr
