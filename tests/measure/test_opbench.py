"""The per-op microbenchmark: deterministic cases, caps, CPU timing rows, resume, failures, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from costaware.measure import opbench
from costaware.measure.collect import read_rows
from costaware.measure.opbench import OPS, OpCase, bench, cases, load_op_rows

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "costaware.measure.opbench", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def _small(n: int, ops: list[str] | None = None, seed: int = 0) -> list[OpCase]:
    return cases(seed, n, scale="cpu", ops=ops)


# ----------------------------------------------------------------------------- cases
def test_cases_are_deterministic_prefix_stable_and_unique() -> None:
    a = [c.id for c in cases(0, 300)]
    assert a == [c.id for c in cases(0, 300)]
    assert a[:100] == [c.id for c in cases(0, 100)]
    assert len(set(a)) == len(a)
    assert set(a).isdisjoint(c.id for c in cases(1, 300))
    assert [c.id for c in _small(50)] == [c.id for c in _small(50)]
    for c in cases(3, 50):
        again = OpCase.from_dict(json.loads(json.dumps(c.to_dict())))
        assert again.id == c.id and again.flops == c.flops and again.mem == c.mem
        assert c.id.startswith(c.op + "-")


@pytest.mark.parametrize("scale", ["gpu", "cpu", "cpu-large"])
def test_every_op_appears_with_sensible_fields(scale: str) -> None:
    cs = cases(0, 1000, scale=scale)
    assert {c.op for c in cs} == set(OPS)
    assert {c.dtype for c in cs} == (
        {"fp32", "bf16", "fp16"} if scale == "gpu" else {"fp32", "bf16"}
    )
    for c in cs:
        if c.op in ("sgd", "adam", "adamw"):
            assert c.direction == "step" and set(c.flops) == {"step"}
        else:
            assert c.direction in ("fwd", "fwd+bwd")
            want = {"fwd", "bwd"} if c.direction == "fwd+bwd" else {"fwd"}
            assert set(c.flops) == want and set(c.nbytes) == want
        assert all(v >= 0 for v in c.flops.values()) and all(v > 0 for v in c.nbytes.values())
    # common operations dominate
    count = {op: sum(c.op == op for c in cs) for op in OPS}
    assert count["conv2d"] > count["avg_pool2d"] * 4


def test_caps_hold() -> None:
    gpu = cases(0, 3000)
    assert max(c.mem for c in gpu) <= 4 << 30
    assert max(c.flops.get("fwd", 0) for c in gpu) <= 5e11
    assert max(c.mem for c in gpu) > 1 << 30  # the ranges do reach the cap
    cpu = _small(3000)
    assert max(c.mem for c in cpu) <= 64 << 20
    assert max(c.flops.get("fwd", 0) for c in cpu) <= 3e7
    assert max(c.mem for c in cases(0, 500, max_mem=256 << 20)) <= 256 << 20
    # the CPU's training-step sizes: past the small scale's caps, within their own
    large = cases(1, 2000, scale="cpu-large")
    assert max(c.mem for c in large) <= 256 << 20
    assert 3e7 < max(c.flops.get("fwd", 0) for c in large) <= 1e9
    assert {c.dtype for c in large} == {"fp32", "bf16"}
    opt = [c for c in gpu if c.op in ("sgd", "adam", "adamw")]
    assert min(c.params["numel"] for c in opt) >= 1e4
    assert max(c.params["numel"] for c in opt) > 5e7


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        cases(0, 5, ops=["nope"])
    with pytest.raises(ValueError):
        cases(0, 5, scale="tpu")
    assert {c.op for c in cases(0, 40, ops=["relu", "sdpa"])} == {"relu", "sdpa"}


def test_split_sizes_sum_and_count() -> None:
    sizes = opbench._split_sizes(123_457, 40, 7)
    assert sum(sizes) == 123_457 and len(sizes) == 40 and min(sizes) >= 1
    assert sizes == opbench._split_sizes(123_457, 40, 7)
    assert opbench._split_sizes(3, 10, 0) == [1, 1, 1]


# ----------------------------------------------------------------------------- running on a CPU
def _one_per_kind() -> list[OpCase]:
    """The smallest case of each (op, direction) among a few hundred CPU cases."""
    best: dict[tuple[str, str], OpCase] = {}
    for c in _small(600):
        k = (c.op, c.direction)
        if k not in best or c.mem < best[k].mem:
            best[k] = c
    return list(best.values())


def test_every_builder_runs_on_cpu(tmp_path: Path) -> None:
    todo = _one_per_kind()
    assert {c.op for c in todo} == set(OPS)
    out = tmp_path / "ops.jsonl.gz"
    s = bench(todo, out, "cpu", warmup=1, reps=2, progress=False)
    rows = list(read_rows(out))
    bad = [(r["id"], r["error"]) for r in rows if r["status"] != "ok"]
    assert not bad
    assert s.measured == len(todo) == len(rows) and s.statuses == {"ok": len(todo)}
    for r in rows:
        t = r["times"]
        assert t["reps"] == 2 and t["timer"] == "perf_counter"
        phases = {"fwd+bwd": ["fwd", "bwd"], "fwd": ["fwd"], "step": ["step"]}[r["direction"]]
        for ph in phases:
            assert t[f"{ph}_s"] > 0 and t[f"{ph}_p10_s"] <= t[f"{ph}_s"] <= t[f"{ph}_p90_s"]
        assert t["total_s"] >= max(t[f"{ph}_s"] for ph in phases) * 0.999


def test_cpu_run_writes_ok_rows(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "ops.jsonl.gz"
    todo = _small(30)
    s = bench(todo, out, "cpu", progress=False)
    assert s.measured == 30 and s.statuses == {"ok": 30} and not s.stopped_early
    assert s.rate > 0 and "30 cases" in str(s)
    rows = list(read_rows(out))
    assert [r["id"] for r in rows] == [c.id for c in todo]
    keys = {
        "schema",
        "kind",
        "id",
        "op",
        "params",
        "dtype",
        "direction",
        "flops",
        "bytes",
        "status",
        "times",
        "device",
        "device_name",
        "env",
    }
    for r in rows:
        assert keys <= set(r) and r["schema"] == 2 and r["kind"] == "op"
        # held timing, issue times and per-phase peaks are CUDA's; a CPU row has none
        assert r["times"]["timer"] == "perf_counter" and r["peak_alloc_phase"] is None
        assert not any(k.endswith("_issue_s") for k in r["times"]) and "held" not in r["times"]
        assert r["device"] == "cpu" and r["device_name"] == "CPU"
        assert r["env"]["torch"] == torch.__version__ and r["env"]["cudnn_benchmark"] is False
        # a case whose warm-up rep is slow (a loaded machine) is timed with 3 reps
        assert r["times"]["total_s"] > 0
        assert r["times"]["reps"] == (3 if r["times"]["capped"] else 10)
        # the warm-up stops early (after 2) once a rep is slow
        warm = r["times"]["warmup"]
        assert warm == 3 or (r["times"]["capped"] and warm == 2)
        assert r["times"]["wall_s"] > 0
    assert load_op_rows(out) == rows
    assert load_op_rows([out, out]) == rows + rows
    assert not (out.parent / (out.name + ".inflight")).exists()
    with pytest.raises(FileNotFoundError):
        load_op_rows(tmp_path / "missing.jsonl.gz")


def test_rows_carry_the_latest_host_speed_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probes: list[dict[str, float]] = []

    def probe() -> dict[str, float]:
        probes.append({"dispatch_us": float(len(probes) + 1)})
        return probes[-1]

    monkeypatch.setattr(opbench, "host_speed", probe)
    bench(_small(4), tmp_path / "a.jsonl.gz", "cpu", progress=False)
    # a short run is probed once, at its start
    assert [r["env"]["host_speed"] for r in read_rows(tmp_path / "a.jsonl.gz")] == [probes[0]] * 4
    monkeypatch.setattr(opbench, "HOST_SPEED_EVERY_S", 0.0)
    bench(_small(3), tmp_path / "b.jsonl.gz", "cpu", progress=False)
    # probed again once the interval has passed: each row carries the probe before it
    assert [r["env"]["host_speed"] for r in read_rows(tmp_path / "b.jsonl.gz")] == probes[1:]


def test_resume_skips_done_ids(tmp_path: Path) -> None:
    out = tmp_path / "ops.jsonl.gz"
    todo = _small(12, ops=["relu", "add", "linear"])
    first = bench(todo[:5], out, "cpu", warmup=1, reps=2, progress=False)
    assert first.measured == 5
    second = bench(todo, out, "cpu", warmup=1, reps=2, progress=False)
    assert second.skipped == 5 and second.measured == 7 and second.remaining == 0
    ids = [r["id"] for r in read_rows(out)]
    assert sorted(ids) == sorted(c.id for c in todo) and len(ids) == len(set(ids))
    again = bench(todo, out, "cpu", warmup=1, reps=2, progress=False, resume=False)
    assert again.measured == 12 and len(list(read_rows(out))) == 24


def test_max_minutes_stops_early(tmp_path: Path) -> None:
    out = tmp_path / "ops.jsonl.gz"
    s = bench(_small(20, ops=["relu"]), out, "cpu", max_minutes=1e-6, progress=False)
    assert s.stopped_early and s.measured == 1 and s.remaining == 19
    assert len(list(read_rows(out))) == 1


def test_failing_case_is_an_error_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "ops.jsonl.gz"
    broken = OpCase(
        "conv2d",
        {
            "N": 1,
            "C_in": 6,
            "C_out": 8,
            "H": 8,
            "kernel": 3,
            "stride": 1,
            "groups": 4,
            "bias": False,
        },
        "fp32",
        "fwd",
    )
    unknown = OpCase("not_an_op", {"x": 1})
    assert unknown.flops == {} and unknown.id.startswith("not_an_op-")
    good = _small(2, ops=["relu"])
    s = bench([broken, unknown, *good], out, "cpu", warmup=1, reps=2, progress=False)
    rows = {r["id"]: r for r in read_rows(out)}
    assert rows[broken.id]["status"] == "error" and "RuntimeError" in rows[broken.id]["error"]
    assert rows[unknown.id]["status"] == "error" and "not_an_op" in rows[unknown.id]["error"]
    assert all(rows[c.id]["status"] == "ok" for c in good)
    assert s.statuses == {"error": 2, "ok": 2}
    assert load_op_rows(out, statuses=("error",)) == [rows[broken.id], rows[unknown.id]]

    def oom(case: OpCase, dev: torch.device) -> opbench._Prepared:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")

    monkeypatch.setattr(opbench, "_build", oom)
    more = _small(3, ops=["silu"])
    s2 = bench(more, out, "cpu", progress=False)
    assert s2.statuses == {"oom": 3}
    assert all(r["status"] == "oom" for r in read_rows(out) if r["op"] == "silu")


def test_crash_marker_becomes_a_crash_row(tmp_path: Path) -> None:
    out = tmp_path / "ops.jsonl.gz"
    todo = _small(3, ops=["relu"])
    marker = tmp_path / "ops.jsonl.gz.inflight"
    marker.write_text(json.dumps(todo[1].to_dict()))
    s = bench(todo, out, "cpu", warmup=1, reps=2, progress=False)
    rows = {r["id"]: r for r in read_rows(out)}
    assert rows[todo[1].id]["status"] == "crash"
    assert s.skipped == 1 and s.measured == 2 and s.statuses == {"crash": 1, "ok": 2}
    assert not marker.exists()


def test_progress_lines(tmp_path: Path) -> None:
    import io

    buf = io.StringIO()
    bench(_small(4, ops=["relu"]), tmp_path / "o.jsonl.gz", "cpu", warmup=1, reps=2, stream=buf)
    text = buf.getvalue()
    assert "[opbench] 4/4" in text and "/s" in text and "ETA" in text and "ok=4" in text


# ----------------------------------------------------------------------------- command line
def test_cli_help_and_list_subprocess() -> None:
    r = _cli("--help")
    assert r.returncode == 0 and "--max-minutes" in r.stdout and "--reps" in r.stdout
    assert "--timer" in r.stdout and "{held,event}" in r.stdout
    r = _cli("--list", "--n", "25", "--seed", "2")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [d["id"] for d in lines] == [c.id for c in cases(2, 25)]
    assert "25 cases (gpu scale)" in r.stderr


def test_cli_list_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        opbench.main(["--list", "--n", "5", "--device", "cpu", "--ops", "sdpa,adam", "--quiet"])
        == 0
    )
    out, err = capsys.readouterr()
    assert err == "" and len(out.splitlines()) == 5
    assert {json.loads(x)["op"] for x in out.splitlines()} <= {"sdpa", "adam"}
    assert [json.loads(x)["id"] for x in out.splitlines()] == [
        c.id for c in cases(0, 5, scale="cpu", ops=["sdpa", "adam"])
    ]
    for bad in (["--n", "3", "--device", "cpu"], ["--list", "--ops", "bogus"], ["--reps", "0"]):
        with pytest.raises(SystemExit) as e:
            opbench.main(bad)
        assert e.value.code == 2


def test_cli_cpu_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.jsonl.gz"
    args = ["--device", "cpu", "--n", "6", "--ops", "relu,linear", "--out", str(out)]
    assert opbench.main([*args, "--reps", "2", "--warmup", "1"]) == 0
    assert "measured 6 cases" in capsys.readouterr().err
    assert len(load_op_rows(out)) == 6
    assert opbench.main([*args, "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")
    assert len(list(read_rows(out))) == 6  # resumed: nothing left


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("hold", [True, False])
def test_cuda_held_timing_and_phase_peaks(tmp_path: Path, hold: bool) -> None:
    out = tmp_path / "ops.jsonl.gz"
    todo = [c for c in cases(0, 400) if c.op in ("linear", "add", "adam")][:6]
    s = bench(todo, out, "cuda", progress=False, hold=hold)
    assert s.statuses == {"ok": 6}
    for r in read_rows(out):
        t = r["times"]
        assert r["schema"] == 2 and t["total_s"] > 0
        phases = (
            ["step"]
            if r["direction"] == "step"
            else ["fwd", "bwd"][: 1 + (r["direction"] == "fwd+bwd")]
        )
        # the CPU's issue time of every phase is recorded beside the GPU's
        assert all(t[f"{ph}_issue_s"] > 0 for ph in phases)
        if hold:
            # small cases: the spin outlasts the CPU's issuing, so the GPU ran them back to back
            assert t["timer"] == "cuda_held" and t["held"] and t["hold_s"] > t["issue_all_s"] > 0
        else:
            assert t["timer"] == "cuda_event" and "held" not in t
        if r["direction"] == "fwd+bwd":
            peaks = r["peak_alloc_phase"]
            assert 0 < peaks["fwd"] <= r["peak_alloc"] and 0 < peaks["bwd"] <= r["peak_alloc"]
        else:
            assert r["peak_alloc_phase"] is None
