"""benchmarks/op_memory.py on a slice of the committed H100 op rows."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from costaware.measure.collect import append_row
from costaware.measure.opbench import load_op_rows

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import op_memory  # noqa: E402

OPS = ROOT / "data" / "gpu" / "h100-ops-seed0.jsonl.gz"


@pytest.mark.skipif(not OPS.is_file(), reason="the committed H100 op rows are not here")
def test_the_cudnn_block_brings_the_lstm_cases_close_to_their_measured_peaks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lstm = [r for r in load_op_rows(OPS) if r["op"] == "lstm" and r["direction"] == "fwd+bwd"][:15]
    out = tmp_path / "ops.jsonl.gz"
    for r in lstm:
        append_row(out, r)
    assert op_memory.main([str(out), "--ops", "lstm", "--folds", "3"]) == 0
    text = capsys.readouterr().out
    means = {
        label: float(m.group(1))
        for label in ("without a work-space block", "with the shipped block", "held out")
        if (m := re.search(label + r".*?mean\s+([\d.]+)%", text))
    }
    assert len(means) == 3, text
    # the dry run alone misses cuDNN's work space; the fitted block comes close
    assert means["without a work-space block"] > 40
    assert means["with the shipped block"] < 12
