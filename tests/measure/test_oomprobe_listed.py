"""``python -m costaware.measure.oomprobe --runs``: each listed (configuration, cap,
batch size) run once under its cap, on the CPU's simulated cap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from costaware.measure.collect import read_rows
from costaware.measure.oomprobe import boundary_configs, main

GiB = 1 << 30


def test_listed_runs_run_once_each_under_their_cap_and_resume(tmp_path: Path) -> None:
    cfg = next(c for c in boundary_configs(kind="cpu") if c.family == "mlp")
    runs = tmp_path / "runs.json"
    runs.write_text(
        json.dumps(
            [
                {"config": cfg.to_dict(), "cap_bytes": 4 * GiB, "batch_size": 2, "why": "a"},
                {"config": cfg.to_dict(), "cap_bytes": 1024, "batch_size": 2, "why": "b"},
            ]
        )
    )
    out = tmp_path / "out.jsonl.gz"
    args = ["--runs", str(runs), "--out", str(out), "--device", "cpu", "--steps", "2", "--quiet"]
    assert main(args) == 0
    listed = [r for r in read_rows(out) if r.get("kind") == "listed"]
    assert [(r["cap_bytes"], r["status"], r["why"]) for r in listed] == [
        (4 * GiB, "fits", "a"),
        (1024, "oom", "b"),  # the CPU allocator's peak is over a cap of 1 KiB
    ]
    assert all(r["config_id"] == cfg.id and r["batch_size"] == 2 for r in listed)
    assert main(args) == 0  # a rerun resumes: nothing listed twice
    assert len([r for r in read_rows(out) if r.get("kind") == "listed"]) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_a_cuda_device_without_a_gpu_is_refused_in_either_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs.json"
    runs.write_text("[]")
    out = str(tmp_path / "out.jsonl.gz")
    for extra in (["--runs", str(runs)], ["--families", "mlp"]):
        assert main([*extra, "--out", out, "--device", "cuda", "--quiet"]) == 2
        assert "no CUDA GPU here; use --device cpu" in capsys.readouterr().err
    assert not Path(out).exists()
