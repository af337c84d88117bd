"""benchmarks/accuracy.py: the repeat-measurement figures (the data's own noise)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from costaware.measure.collect import append_row
from costaware.measure.profile import ALLOCATOR_METHOD

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import accuracy  # noqa: E402


def _row(
    cid: str,
    device: str,
    secs: float,
    peak: int,
    status: str = "ok",
    method: str = ALLOCATOR_METHOD,
) -> dict[str, Any]:
    return {
        "schema": 1,
        "id": cid,
        "family": cid.split("-")[0],
        "status": status,
        "device_name": device,
        "measurement": {"iteration_time": secs, "max_reserved": peak, "memory_method": method},
    }


def test_repeats_compare_first_and_last_measurement_per_device(tmp_path: Path) -> None:
    mib = 2**20
    a, b = tmp_path / "seed0.jsonl.gz", tmp_path / "seed1.jsonl.gz"
    append_row(a, _row("mlp-1", "CPU", 0.10, 10 * mib))
    # a CPU peak measured as resident-set growth is not a memory target
    append_row(a, _row("mlp-2", "CPU", 0.20, mib // 2, method="peak resident-set growth"))
    append_row(a, _row("vgg-1", "NVIDIA H100 80GB HBM3", 0.05, 900 * mib))
    append_row(a, _row("vit-1", "CPU", 0.30, 30 * mib))
    append_row(b, _row("mlp-1", "CPU", 0.125, 8 * mib))
    append_row(b, _row("mlp-2", "CPU", 0.10, mib // 2))
    append_row(b, _row("vgg-1", "NVIDIA H100 80GB HBM3", 0.04, 1000 * mib))
    append_row(b, _row("vit-1", "CPU", 0.9, 90 * mib, status="error"))  # not a measurement
    append_row(b, _row("vgg-1", "CPU", 1.0, 50 * mib))  # another device: no pair

    rep = accuracy._repeats(accuracy._read([a, b]))

    assert rep["cpu"]["n"] == 2
    assert sorted(rep["cpu"]["time"]) == pytest.approx([0.2, 1.0])  # 0.1/0.125, 0.2/0.1
    assert rep["cpu"]["mem"] == pytest.approx([0.25])  # 10/8; mlp-2's first is a resident set
    assert rep["gpu"]["n"] == 1
    assert rep["gpu"]["time"] == pytest.approx([0.25])
    assert rep["gpu"]["mem"] == pytest.approx([0.1])

    text = "\n".join(accuracy._repeat_lines(rep["cpu"]))
    assert "2 configurations were measured more than once" in text
    assert "over 2 pairs" in text and "over 1 pair." in text
    assert accuracy._repeat_lines(None) == []


def test_no_repeats_no_paragraph(tmp_path: Path) -> None:
    a = tmp_path / "seed0.jsonl.gz"
    append_row(a, _row("mlp-1", "CPU", 0.10, 10 * 2**20))
    assert accuracy._repeats(accuracy._read([a])) == {}


def test_the_latest_measurement_counts_whatever_the_file_names(tmp_path: Path) -> None:
    # a later window's repeat of a shard sorts before the shard's own file by name
    gpu = "NVIDIA H100 80GB HBM3"
    shard, repeat = (
        tmp_path / "h100-shard0.jsonl.gz",
        tmp_path / "h100-repeat-20261201-shard0.jsonl.gz",
    )
    append_row(
        shard, {**_row("vgg-1", gpu, 0.05, 900 * 2**20), "finished_at": "2026-11-22T17:15:48+00:00"}
    )
    append_row(
        repeat,
        {**_row("vgg-1", gpu, 0.04, 900 * 2**20), "finished_at": "2026-12-01T09:00:00+00:00"},
    )

    raw = accuracy._read(sorted([shard, repeat]))

    (latest,) = accuracy._load(raw)
    assert latest["measurement"]["iteration_time"] == 0.04
    assert accuracy._repeats(raw)["gpu"]["time"] == pytest.approx([0.25])  # first 0.05, last 0.04


def test_each_gpu_is_also_predicted_by_models_that_never_saw_it() -> None:
    """With rows of two GPUs, the GPU section gives the leave-family-out figures by device,
    and each device is predicted by models fitted on the other device's rows alone: of every
    family (the families seen), and of the other families (neither seen)."""
    import functools

    import costaware as ca
    from costaware.core.model import CostModel, Observation
    from tests.conftest import tiny_cnn

    model = CostModel()
    obs = []
    for device, speed in (("H100", 1.0), ("H200", 0.9)):
        for fam, widths in (("a", (4, 8)), ("b", (12, 16)), ("c", (20, 24))):
            for w in widths:
                for bs in (4, 16, 64):
                    spec = ca.TrainingSpec(
                        model=functools.partial(tiny_cnn, width=w),
                        batch=ca.ImageBatch((3, 32, 32), classes=10),
                        batch_size=bs,
                        optimizer="sgd",
                    )
                    f = model.features(spec, device)
                    obs.append(
                        Observation(
                            features=f,
                            device=device,
                            peak_memory=f["analytic_reserved_mib"] * 2**20 * 1.1,
                            iteration_time=speed * (1e-3 + f["analytic_time_ms"] / 1e3),
                            family=fam,
                            meta={"id": f"{fam}-{w}-{bs}"},
                        )
                    )
    res = accuracy._evaluate(obs, "gpu", {"iterations": 20, "thread_count": 1})
    assert sorted(res["devices"]) == ["H100", "H200"]
    assert {d: s["n"] for d, s in res["devices"].items()} == {"H100": 18, "H200": 18}
    unseen = accuracy._evaluate_unseen_devices(obs, "gpu", {"iterations": 20, "thread_count": 1})
    assert sorted(unseen) == ["H100", "H200"]
    for dev, other in (("H100", "H200"), ("H200", "H100")):
        u = unseen[dev]
        assert u["trained_on"] == [other]
        assert u["families_seen"]["n"] == u["families_unseen"]["n"] == 18
        assert sorted(u["per_family"]) == ["a", "b", "c"]
        assert {r["device"] for r in u["records"]["families_unseen"]} == {dev}
    md = accuracy._markdown(
        {"gpu": res}, {"date": "d", "files": [], "devices": ["H100", "H200"], "iterations": 20,
                       "unseen_devices": {"gpu": unseen}},
    )  # fmt: skip
    assert "### A device the model never saw" in md
    assert "| H200, families seen (trained on H100) | 18 |" in md
    assert "| H200, families unseen | 18 |" in md
    # one device alone: nothing to hold out
    assert accuracy._evaluate_unseen_devices(obs[:18], "gpu", {"iterations": 20}) == {}


def test_left_out_peaks_are_sorted_by_their_reason_code_not_their_wording() -> None:
    """Each kind of left-out peak gets its own paragraph, from the code the collector
    sets (``meta["memory_left_out_kind"]``), whatever its words say."""
    from costaware.measure.collect import LEFT_OUT_HELD, LEFT_OUT_RSS, LEFT_OUT_WORKSPACE

    res: dict[str, Any] = {
        "left_out": [
            (LEFT_OUT_HELD, "a-1 (820 MiB reserved before it began)"),
            (LEFT_OUT_WORKSPACE, "unet-2 (64 MiB reserved before it began)"),  # same words
            (LEFT_OUT_WORKSPACE, "squeezenet-3 (66 MiB reserved before it began)"),
            (LEFT_OUT_RSS, "mlp-4 (a resident-set growth)"),
        ],
        "search": {},
        "as_measured": {"n": 10, "mem_mre": 0.05, "mem_cov": 0.95},
    }
    text = "\n".join(accuracy._left_out_lines(res))
    paragraphs = {p.split(" ", 1)[0] + " " + p.split(" ")[1]: p for p in text.split("\n") if p}
    assert paragraphs["1 GPU"].endswith("a-1 (820 MiB reserved before it began).")
    assert "cuBLAS" not in paragraphs["1 GPU"]
    assert paragraphs["2 GPU"].startswith("2 GPU rows are models that call no cuBLAS")
    assert "unet-2" in paragraphs["2 GPU"] and "squeezenet-3" in paragraphs["2 GPU"]
    assert paragraphs["1 CPU"].startswith("1 CPU rows were measured as the process's resident")
    assert "mlp-4" in paragraphs["1 CPU"]


def test_step_noise_is_the_spread_of_each_rows_own_timed_steps() -> None:
    """Steady steps give no noise, scattered ones some; rows without their steps and
    failed rows are left out, and the figure is the same on every run."""

    def row(cid: str, device: str, steps: list[float] | None, status: str = "ok") -> Any:
        r = _row(cid, device, 0.01, 1 << 20, status=status)
        if steps is not None:
            r["measurement"]["step_times"] = steps
        return r

    rows = [
        row("mlp-a", "NVIDIA H100 80GB HBM3", [0.01] * 10),
        row("vgg-b", "NVIDIA H100 80GB HBM3", [0.01, 0.012, 0.009, 0.015, 0.01] * 2),
        row("vgg-c", "NVIDIA H100 80GB HBM3", None),  # recorded no steps
        row("vgg-d", "NVIDIA H100 80GB HBM3", [0.5, 0.01] * 5, status="oom"),
        row("mlp-e", "CPU", [0.02] * 10),
    ]
    noise = accuracy._step_noise(rows)
    gpu = noise["gpu"]
    assert gpu["n"] == 2 and gpu["steps"] == 10
    assert gpu["by_family"]["mlp"] == 0.0
    assert 0.0 < gpu["by_family"]["vgg"] < 0.2
    assert gpu["mean"] == pytest.approx(gpu["by_family"]["vgg"] / 2)
    assert noise["cpu"]["n"] == 1 and noise["cpu"]["mean"] == 0.0
    assert accuracy._step_noise(rows) == noise  # seeded
    text = "\n".join(accuracy._step_noise_lines(gpu, 0.17))
    assert "a mean" in text and "17.0%" in text and "vgg" in text


def test_held_out_predictions_are_also_summarised_by_corpus() -> None:
    def rec(cid: str, secs: float, predicted: float) -> dict[str, Any]:
        return {
            "id": cid, "source_device": "NVIDIA H200", "family": "mlp", "status": "ok",
            "mem": 2**30, "p_mem": 2**30, "p_mem_hi": 2**30, "a_mem": 2**30, "search": False,
            "secs": secs, "p_secs": predicted, "p_secs_hi": predicted * 2, "a_secs": secs,
        }  # fmt: skip

    rows = [
        {"id": "big", "device_name": "NVIDIA H200", "config": {"corpus": "gpu"}},
        {"id": "small", "device_name": "NVIDIA H200", "config": {"corpus": "cpu"}},
        {"id": "small2", "device_name": "NVIDIA H200", "config": {"corpus": "cpu"}},
    ]
    res = {"records": [rec("big", 1.0, 1.1), rec("small", 1.0, 1.5), rec("small2", 1.0, 1.3)]}
    res["capacities"] = {"12 GiB": 12.0 * 2**30}
    out = accuracy.by_corpus({"gpu": res}, rows)["gpu"]["corpora"]
    assert sorted(out) == ["cpu", "gpu"]
    assert out["gpu"]["n"] == 1 and out["gpu"]["time_mre"] == pytest.approx(0.1)
    assert out["cpu"]["n"] == 2 and out["cpu"]["time_mre"] == pytest.approx(0.4)
    text = "\n".join(accuracy._corpus_lines({"corpora": out}))
    assert "| `cpu` corpus | 2 |" in text and "| `gpu` corpus | 1 |" in text
    assert accuracy._corpus_lines({"corpora": {"gpu": out["gpu"]}}) == []


def test_rewriting_the_page_keeps_the_sections_other_benchmarks_generated(tmp_path: Path) -> None:
    doc = tmp_path / "accuracy.md"
    doc.write_text(
        "# old page\n\n<!-- a:start -->\nA's table\n<!-- a:end -->\n\nprose\n\n"
        "<!-- b:start -->\nB's\n<!-- b:end -->\n"
    )
    kept = accuracy._other_sections(doc, "# new page\n<!-- b:start -->\nB, anew\n<!-- b:end -->\n")
    assert kept == "\n<!-- a:start -->\nA's table\n<!-- a:end -->\n"  # b is the page's own now
    assert accuracy._other_sections(tmp_path / "none.md", "x") == ""


def test_repeats_only_prints_how_far_two_windows_lie_apart_without_fitting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def row(when: str, seconds: float) -> dict[str, Any]:
        m = {"iteration_time": seconds, "max_reserved": 2**30}
        return {"id": "mlp-1", "device_name": "H200", "status": "ok", "family": "mlp",
                "finished_at": when, "measurement": m}  # fmt: skip

    first, later = tmp_path / "h200-shard0.jsonl.gz", tmp_path / "h200-repeat-shard0.jsonl.gz"
    append_row(first, row("2026-11-26T05:00:00+00:00", 1.0))
    append_row(later, row("2026-11-28T01:00:00+00:00", 1.25))
    assert accuracy.main([str(later), str(first), "--repeats-only"]) == 0
    out = capsys.readouterr().out
    # |1.0 / 1.25 - 1| = 20%: the first measurement against the last, in measured order
    assert out.startswith("GPU: **Repeat measurements.** 1 configurations")
    assert "step time median 20.0%" in out and "peak memory median 0.0%" in out
