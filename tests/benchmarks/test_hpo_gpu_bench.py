"""benchmarks/hpo.py --gpu on the CPU: every arm runs end to end, and a cut-off run resumes.

The GPU mode trains its trials on a GPU under a capped caching allocator. Here it runs
with ``--device cpu --tiny`` (models of a few thousand parameters, a simulated CUDA
out-of-memory error over the cap), so that its code is not first run on a lent GPU.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
ARMS = ("baseline", "baseline-pruned", "costaware", "oracle", "batch-size-finder")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    return env


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        str(BENCH / "hpo.py"),
        "--gpu",
        "--device",
        "cpu",
        "--tiny",
        "--tasks",
        "lm",
        "--seeds",
        "1",
        "--trials",
        "2",
        "--startup",
        "1",
        "--card-gib",
        "0.004",  # 4 MiB: about half of the tiny space is over it
        "--results",
        str(tmp_path / "results.jsonl"),
        "--json",
        str(tmp_path / "report.json"),
        "--doc",
        str(tmp_path / "doc.md"),
        *extra,
    ]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=420, env=_env(), cwd=tmp_path
    )


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
@pytest.mark.timeout(900)  # two runs of the benchmark, each importing torch and Lightning
def test_gpu_mode_runs_every_arm_on_the_cpu_and_resumes_where_it_stopped(
    tmp_path: Path,
) -> None:
    pytest.importorskip("optuna")
    pytest.importorskip("lightning")
    # the first invocation stops after three trials, as a device window's end would
    first = _run(tmp_path, "--stop-after", "3")
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-4000:]
    assert "rerun to continue" in first.stdout, out[-4000:]
    cut = _lines(tmp_path / "results.jsonl")
    assert [x["kind"] for x in cut].count("trial") == 3
    # a line half written when the process was killed is dropped on reading
    with open(tmp_path / "results.jsonl", "a") as f:
        f.write('{"kind": "trial", "task": "lm", "se')
    second = _run(tmp_path)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-4000:]
    assert "resuming" in second.stdout and "every task, seed and arm is done" in second.stdout
    lines = _lines_tolerant(tmp_path / "results.jsonl")
    assert [x["kind"] for x in lines].count("setup") == 1  # the setup is not measured again
    trials = [x for x in lines if x["kind"] == "trial"]
    # the three trials of the first run are kept, none is run twice, every arm finished
    assert trials[:3] == [x for x in cut if x["kind"] == "trial"]
    per_arm = collections.Counter((x["arm"], x["number"]) for x in trials)
    assert set(per_arm.values()) == {1}
    assert {arm for arm, _ in per_arm} == set(ARMS)
    assert all(sum(1 for a, _ in per_arm if a == arm) == 2 for arm in ARMS)
    assert {x["arm"] for x in lines if x["kind"] == "arm_done"} == set(ARMS)
    # the simulated card is small enough that some trial ran out of memory for real
    assert any((x["run"] or {}).get("status") == "oom" for x in trials), trials
    # the costaware arm predicted every trial it was proposed
    assert all("prediction" in x["record"] for x in trials if x["arm"] == "costaware")
    # identical trials of the baselines and the oracle are run once and replayed
    replayed = [x for x in trials if (x["run"] or {}).get("replayed")]
    assert all(x["arm"] in ("baseline-pruned", "oracle") for x in replayed)
    report = json.loads((tmp_path / "report.json").read_text())
    lm = report["tasks"]["lm"]
    assert lm["finished_seeds"] == [0]
    assert [row[0] for row in lm["table"]] == list(ARMS)
    doc = (tmp_path / "doc.md").read_text()
    assert "<!-- gpu-hpo:start -->" in doc and "| batch-size-finder |" in doc
    # the section is regenerated from the JSONL alone, in place
    again = subprocess.run(
        [
            sys.executable,
            str(BENCH / "hpo.py"),
            "--gpu",
            "--report-only",
            "--results",
            str(tmp_path / "results.jsonl"),
            "--doc",
            str(tmp_path / "doc.md"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert again.returncode == 0, again.stderr[-4000:]
    assert (tmp_path / "doc.md").read_text().count("<!-- gpu-hpo:start -->") == 1


def _lines_tolerant(path: Path) -> list[dict]:
    out = []
    for raw in path.read_text().splitlines():
        try:
            out.append(json.loads(raw))
        except json.JSONDecodeError:
            continue
    return out


def test_gpu_mode_refuses_an_unknown_task() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "hpo.py"), "--gpu", "--results", "x.jsonl", "--tasks", "nlp"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert proc.returncode == 2
    assert "--tasks must name some of ['lm', 'vision']" in proc.stderr
