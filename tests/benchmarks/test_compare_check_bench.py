"""benchmarks/compare_check.py: rows of a device's run set against ``compare`` on it."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import compare_check  # noqa: E402

import costaware as ca  # noqa: E402
from costaware.measure.corpus import full_corpus  # noqa: E402


def _row(cfg: dict[str, object], status: str, **measured: float) -> dict[str, object]:
    return {
        "id": cfg["id"],
        "family": cfg["family"],
        "status": status,
        "device": "cuda",
        "device_name": "H100-SXM",
        "config": cfg,
        "measurement": {"status": status, **measured},
    }


def test_errors_coverage_and_decisions_are_scored_against_the_measurement() -> None:
    model = ca.CostModel()  # unfitted: the analytic figures, enough to score against
    cfg = full_corpus("cpu", 0)[0].to_dict()  # a small configuration
    predicted = compare_check.check_row(model, _row(cfg, "oom"))
    t, mem = predicted["iteration_time"], predicted["peak_memory"]
    slow = _row(cfg, "ok", iteration_time=t * 1.25, max_reserved=mem / 0.9)
    fast = _row(cfg, "ok", iteration_time=t / 1.25, max_reserved=mem / 1.1)
    checked = [compare_check.check_row(model, r) for r in (slow, fast)]
    checked.append(predicted)  # ran out of memory, yet the small step fits: admitted
    s = compare_check.summarise(checked)["all"]
    assert s["n"] == 3 and s["time_n"] == 2 and s["memory_n"] == 2
    assert s["time_mre"] == pytest.approx((0.2 + 0.25) / 2)
    assert s["memory_mre"] == pytest.approx((0.1 + 0.1) / 2)
    assert s["oom_but_admitted"] == 1 and s["ran_but_not_admitted"] == 0
    upper = predicted["iteration_time_upper"]
    assert s["time_coverage"] == (sum(m <= upper for m in (t * 1.25, t / 1.25)) / 2)


def test_configurations_the_model_learned_on_that_device_are_left_out(tmp_path: Path) -> None:
    cfgs = [c.to_dict() for c in full_corpus("cpu", 0)[:2]]
    path = tmp_path / "rows.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for cfg in cfgs:
            f.write(json.dumps(_row(cfg, "ok", iteration_time=0.01, max_reserved=1e6)) + "\n")
        f.write(json.dumps({**_row(cfgs[0], "ok"), "device": "cpu", "device_name": "CPU"}) + "\n")
        f.write(json.dumps({**_row(cfgs[1], "ok"), "kind": "op"}) + "\n")  # an op case
    rows = compare_check.whole_model_rows([path])
    # each device's whole-model rows, the CPU's too; no op case
    assert sorted(r["device_name"] for r in rows) == ["CPU", "H100-SXM", "H100-SXM"]
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    trained = {"files": {str(path): {}}}  # an absolute path: the files need not be in data/
    (model_dir / "data.json").write_text(json.dumps(trained))
    seen, missing = compare_check.trained_ids(model_dir)
    assert missing == []
    assert seen == {(c["id"], "H100-SXM") for c in cfgs} | {(cfgs[0]["id"], "CPU")}


def test_a_repeat_measurement_replaces_the_earlier_one(tmp_path: Path) -> None:
    cfg = full_corpus("cpu", 0)[0].to_dict()
    later = {**_row(cfg, "ok", iteration_time=0.02), "finished_at": "2026-11-27T10:00:00"}
    earlier = {**_row(cfg, "ok", iteration_time=0.01), "finished_at": "2026-11-26T10:00:00"}
    path = tmp_path / "rows.jsonl.gz"
    with gzip.open(path, "wt") as f:  # the repeat written first, as a file of its own sorts
        f.write(json.dumps(later) + "\n" + json.dumps(earlier) + "\n")
    (row,) = compare_check.whole_model_rows([path])
    assert row["measurement"]["iteration_time"] == 0.02


def test_the_docs_section_names_its_command_and_splits_by_precision(tmp_path: Path) -> None:
    model = ca.CostModel()
    cfg = full_corpus("cpu", 0)[0].to_dict()
    checked = [
        compare_check.check_row(model, _row(c, "ok", iteration_time=0.01, max_reserved=1e6))
        for c in ({**cfg, "precision": "fp32"}, {**cfg, "precision": "bf16"})
    ]
    summary = compare_check.summarise(checked)
    assert summary["H100-SXM / fp32"]["n"] == 1 and summary["H100-SXM / bf16"]["n"] == 1
    args = compare_check.argparse.Namespace(files=[ROOT / "data" / "x.jsonl.gz"], model_dir=None)
    text = compare_check.section(summary, args)
    assert text.startswith(compare_check.START) and text.endswith(compare_check.END)
    assert "`python benchmarks/compare_check.py data/x.jsonl.gz --update-docs`" in text
    assert "| H100-SXM / bf16 | 1 |" in text
