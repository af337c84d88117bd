"""The corpus, the collector (gzip JSONL rows, resume, time limit, failures) and `costaware fit`."""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import costaware as ca
from costaware import zoo
from costaware.cli import main
from costaware.core.model import CostModel, Observation
from costaware.measure.collect import (
    LEFT_OUT_HELD,
    LEFT_OUT_WORKSPACE,
    append_row,
    collect,
    done_ids,
    in_measured_order,
    observations,
    read_rows,
    reserved_before,
)
from costaware.measure.corpus import (
    Config,
    corpus,
    full_corpus,
    recommended_shards,
    shard_estimates,
)
from costaware.runtime.store import MAX_HELD_BEFORE
from tests.conftest import tiny_cnn


def _tiny(name: str, batch_size: int = 8, **kw: object) -> Config:
    base: dict[str, object] = {
        "id": name,
        "family": "mlp",
        "factory": "mlp",
        "kwargs": {"in_features": 16, "hidden": [32], "classes": 4},
        "batch_kind": "vector",
        "batch_shape": [16],
        "classes": 4,
        "batch_size": batch_size,
        "optimizer": "sgd",
        "est_seconds": 0.1,
    }
    base.update(kw)
    return Config(**base)  # type: ignore[arg-type]


TINY_GPT = _tiny(
    "t-gpt",
    family="gpt",
    factory="gpt",
    kwargs={"vocab": 64, "seq_len": 16, "dim": 32, "depth": 1, "heads": 2},
    batch_kind="tokens",
    batch_shape=[16],
    classes=64,
    batch_size=2,
    optimizer="adamw",
)
BROKEN = _tiny(  # dim 10 is not divisible by 3 heads: the model raises when built
    "t-broken",
    family="vit",
    factory="vit",
    kwargs={"image_size": 8, "patch": 4, "dim": 10, "depth": 1, "heads": 3, "classes": 2},
    batch_kind="image",
    batch_shape=[3, 8, 8],
    classes=2,
)


# ----------------------------------------------------------------------------- corpus
@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_corpus_is_deterministic_and_spans_every_family(kind: str) -> None:
    a, b = full_corpus(kind), full_corpus(kind)
    assert [c.id for c in a] == [c.id for c in b]
    assert len({c.id for c in a}) == len(a) > 300
    assert {c.family for c in a} == set(zoo.FAMILIES)
    assert {c.optimizer for c in a} == {"sgd", "adam", "adamw"}
    assert {c.precision for c in a} >= {"fp32", "bf16"}
    assert [c.id for c in full_corpus(kind, seed=1)] != [c.id for c in a]
    first = {c.family for c in a[:60]}  # shuffled: a prefix spans most families
    assert len(first) >= 12


@pytest.mark.parametrize(("kind", "shards"), [("cpu", 3), ("gpu", 5)])
def test_shards_are_disjoint_covering_and_balanced(kind: str, shards: int) -> None:
    parts = [corpus(kind, shard=i, shards=shards) for i in range(shards)]
    ids = [c.id for p in parts for c in p]
    assert len(ids) == len(set(ids))
    assert set(ids) == {c.id for c in full_corpus(kind)}
    est = shard_estimates(kind, shards)
    assert max(est) - min(est) < 0.1 * max(est) + 15
    with pytest.raises(ValueError, match="shard must be in"):
        corpus(kind, shard=shards, shards=shards)


def test_recommended_gpu_shards_fit_the_time_target() -> None:
    n = recommended_shards("gpu")
    assert n >= 2
    assert max(shard_estimates("gpu", n)) <= 8 * 60


def test_cpu_corpus_is_small() -> None:
    assert max(c.est_seconds for c in full_corpus("cpu")) < 5
    assert {c.allocator for c in full_corpus("cpu")} == {"default"}
    assert {c.allocator for c in full_corpus("gpu")} == {"default", "expandable_segments"}


def test_config_round_trips_to_a_spec_for_every_family() -> None:
    for fam in zoo.FAMILIES:
        cfg = next(c for c in full_corpus("cpu") if c.family == fam)
        again = Config.from_dict(json.loads(json.dumps(cfg.to_dict())))
        assert again == cfg
        spec = again.to_spec()
        assert spec.batch_size == cfg.batch_size
        assert spec.optimizer_name == cfg.optimizer
        assert spec.precision == cfg.precision
        assert spec.name == cfg.id
        assert spec.architecture_key() is not None  # partial of a zoo function: cacheable
        with torch.device("meta"):
            model = spec.model()  # type: ignore[operator]
        assert sum(p.numel() for p in model.parameters()) > 0
    gpu = full_corpus("gpu")
    for fam in ("gpt", "resnet"):
        spec = next(c for c in gpu if c.family == fam).to_spec()
        assert spec.batch_size >= 1


def test_unknown_factory_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown zoo factory"):
        _tiny("x", factory="nope").to_spec()


# ----------------------------------------------------------------------------- collect
def test_collect_writes_gzip_rows_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "d" / "rows.jsonl.gz"
    configs = [_tiny("t-mlp-8"), TINY_GPT, BROKEN]
    s = collect(configs, out, "cpu", warmup=1, steps=10, progress=False)
    assert (s.measured, s.skipped, s.remaining) == (3, 0, 0)
    rows = list(read_rows(out))
    assert [r["id"] for r in rows] == ["t-mlp-8", "t-gpt", "t-broken"]
    by_id = {r["id"]: r for r in rows}
    assert by_id["t-mlp-8"]["status"] == "ok"
    assert by_id["t-mlp-8"]["measurement"]["iteration_time"] > 0
    assert by_id["t-mlp-8"]["device_name"] == "CPU"
    assert by_id["t-mlp-8"]["env"]["torch"] == torch.__version__
    # the host's speed, probed just before each measured configuration
    speed = by_id["t-mlp-8"]["env"]["host_speed"]
    assert set(speed) == {"dispatch_us", "matmul_gflops", "add_gbs"}
    assert all(v > 0 for v in speed.values())
    # the summary gives each figure's range over the configurations it measured
    assert set(s.host_speed) == set(speed)
    lo, hi = s.host_speed["dispatch_us"]
    assert lo <= speed["dispatch_us"] <= hi
    assert f"host speed: op call {lo:g}-{hi:g} us" in str(s)
    assert by_id["t-broken"]["status"] == "error"
    assert (
        "heads" in by_id["t-broken"]["measurement"]["error"]
        or by_id["t-broken"]["measurement"]["error"]
    )
    assert Config.from_dict(by_id["t-gpt"]["config"]) == TINY_GPT
    # a plain gzip reader sees the same lines (one member per row)
    with gzip.open(out, "rt") as f:
        assert len([line for line in f if line.strip()]) == 3
    again = collect(configs, out, "cpu", warmup=1, steps=10, progress=False)
    assert (again.measured, again.skipped) == (0, 3)
    assert done_ids(out) == {"t-mlp-8", "t-gpt", "t-broken"}


def test_max_minutes_stops_after_the_first(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl.gz"
    configs = [_tiny("a"), _tiny("b", 4), _tiny("c", 2)]
    s = collect(configs, out, "cpu", max_minutes=0.0001, warmup=1, steps=10, progress=False)
    assert s.measured == 1
    assert s.stopped_early
    assert s.remaining == 2
    assert [r["id"] for r in read_rows(out)] == ["a"]


def test_a_config_over_its_time_limit_is_a_timeout_row(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl.gz"
    slow = _tiny("slow", 64, kwargs={"in_features": 16, "hidden": [2048] * 6, "classes": 4})
    s = collect(
        [slow, _tiny("fast")], out, "cpu", warmup=1, steps=10, progress=False, timeout_s=0.05
    )
    rows = {r["id"]: r for r in read_rows(out)}
    assert rows["slow"]["status"] == "timeout"
    assert "0.05 s" in rows["slow"]["measurement"]["error"]
    assert s.measured == 2


def test_an_alarm_inside_a_grad_mode_switch_does_not_leak_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import costaware.measure.collect as collect_mod

    real = collect_mod.measure

    def stopped_mid_switch(*args: object, **kwargs: object) -> object:
        torch.set_grad_enabled(False)  # as an optimizer's step does, then the alarm
        raise collect_mod._ConfigTimeout("over 0.05 s")

    monkeypatch.setattr(collect_mod, "measure", stopped_mid_switch)
    out = tmp_path / "rows.jsonl.gz"
    collect([_tiny("cut")], out, "cpu", warmup=1, steps=10, progress=False, timeout_s=30)
    assert torch.is_grad_enabled()
    monkeypatch.setattr(collect_mod, "measure", real)
    collect([_tiny("next")], out, "cpu", warmup=1, steps=10, progress=False)
    assert {r["id"]: r["status"] for r in read_rows(out)} == {"cut": "timeout", "next": "ok"}


def test_a_truncated_tail_and_a_killed_run_are_handled(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl.gz"
    append_row(out, {"id": "x", "status": "ok"})
    with open(out, "ab") as f:
        f.write(gzip.compress(b'{"id": "y"}\n')[:-6])  # killed mid-write
    assert [r["id"] for r in read_rows(out)] == ["x"]
    out2 = tmp_path / "rows2.jsonl.gz"
    cfg = _tiny("dies")
    (tmp_path / "rows2.jsonl.gz.inflight").write_text(json.dumps({"config": cfg.to_dict()}))
    s = collect([cfg, _tiny("next", 4)], out2, "cpu", warmup=1, steps=10, progress=False)
    rows = {r["id"]: r["status"] for r in read_rows(out2)}
    assert rows == {"dies": "crash", "next": "ok"}
    assert s.skipped == 1
    assert not (tmp_path / "rows2.jsonl.gz.inflight").exists()


def test_spawned_workers_one_per_allocator(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl.gz"
    # one child per allocator mode, with PYTORCH_CUDA_ALLOC_CONF set before torch starts
    configs = [_tiny("e", allocator="expandable_segments")]
    s = collect(configs, out, "cpu", warmup=1, steps=10, progress=False, spawn=True)
    rows = {r["id"]: r for r in read_rows(out)}
    assert set(rows) == {"e"}
    assert "expandable_segments:True" in rows["e"]["env"]["alloc_conf"]
    assert (s.measured, s.remaining) == (1, 0)
    # the child's host-speed probe reaches the parent's summary through the rows
    speed = rows["e"]["env"]["host_speed"]
    assert s.host_speed == {k: (v, v) for k, v in speed.items()}


def test_progress_log_lines_when_not_a_tty(tmp_path: Path) -> None:
    import io

    buf = io.StringIO()
    collect([_tiny("p")], tmp_path / "p.jsonl.gz", "cpu", warmup=1, steps=10, stream=buf)
    assert "[collect] 1/1 done" in buf.getvalue()


def test_module_help_and_torch_only_imports() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "costaware.measure.collect", "--help"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0
    assert "--max-minutes" in r.stdout
    code = (
        "import sys, costaware.measure.collect, costaware.measure.corpus\n"
        "costaware.measure.corpus.corpus('gpu', 0, 4)\n"
        "print([m for m in ('catboost', 'gensim', 'sqlalchemy', 'rich') if m in sys.modules])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "[]", r.stderr


def test_cli_collect_lists_a_shard(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["collect", "--corpus", "cpu", "--shards", "4", "--list", "--limit", "2"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    assert len(lines) == 2
    assert Config.from_dict(json.loads(lines[0])) == corpus("cpu", 0, 4)[0]


# ----------------------------------------------------------------------------- fit
def test_cli_fit_builds_a_loadable_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import costaware as ca

    data = tmp_path / "rows.jsonl.gz"
    rows = []
    for i, bs in enumerate((4, 8, 16, 32, 64, 128)):
        for cfg in (
            _tiny(f"m{bs}", bs),
            Config.from_dict({**TINY_GPT.to_dict(), "id": f"g{bs}", "batch_size": bs}),
        ):
            peak = (2 + i) * 2**20 * (3 if cfg.family == "gpt" else 1)
            rows.append(
                {
                    "schema": 1,
                    "id": cfg.id,
                    "family": cfg.family,
                    "status": "ok",
                    "device": "cpu",
                    "device_name": "CPU",
                    "config": cfg.to_dict(),
                    "measurement": {
                        "status": "ok",
                        "max_reserved": peak,
                        "max_allocated": peak,
                        "iteration_time": 0.001 * bs,
                    },
                    "env": {},
                    "finished_at": "2026-01-01T00:00:00+00:00",
                }
            )
    rows.append({**rows[0], "id": "bad", "status": "error"})
    # a per-op timing row (costaware.measure.opbench) in the same file is not a model configuration
    rows.append({"schema": 1, "kind": "op", "id": "op-1", "op": "relu", "status": "ok"})
    for r in rows:
        append_row(data, r)
    out = tmp_path / "model"
    cache = tmp_path / "feats.json.gz"
    args = ["fit", str(data), "--out", str(out), "--iterations", "20", "--quiet"]
    assert main([*args, "--features-cache", str(cache)]) == 0
    assert cache.is_file()
    assert "[fit]" not in capsys.readouterr().err  # --quiet: no progress lines
    # without --quiet and without a terminal (a log, CI): plain progress lines instead
    assert main([*args[:-1], "--out", str(tmp_path / "again")]) == 0
    err = capsys.readouterr().err
    assert "[fit] dry-running configuration 1 of 13" in err and "[fit] fitting" in err
    model = ca.CostModel.load(out)
    assert model.training_["rows"] == 12
    assert model.training_["devices"] == ["CPU"]
    sha = hashlib.sha256(data.read_bytes()).hexdigest()
    assert model.training_["data_files"][str(data)]["sha256"] == sha
    info = json.loads((out / "data.json").read_text())
    assert info["observations"] == 12
    # a per-op row is op-model data, not a skipped configuration (one is too few to fit on)
    assert info["skipped"] == ["bad: status error"]
    assert info["op_rows"] == 1 and info["op_model"] is False
    spec = TINY_GPT.to_spec()
    pred = model.predict(spec, device="cpu")
    assert pred.kind == "learned"
    assert pred.peak_memory > 0


def test_reserved_before_from_the_row_or_nvml() -> None:
    assert reserved_before({"reserved_before": 5 << 20, "max_reserved": 1 << 30}) == 5 << 20
    # older rows: the reserved peak less the process's NVML growth (memory held at the start)
    assert reserved_before({"max_reserved": 900 << 20, "nvml_peak_used": 80 << 20}) == 820 << 20
    # a process's first row: NVML's growth includes the CUDA context, so nothing was held
    assert reserved_before({"max_reserved": 900 << 20, "nvml_peak_used": 1600 << 20}) == 0
    assert reserved_before({"max_reserved": 900 << 20}) is None
    assert reserved_before({}) is None


def test_observations_leave_out_gpu_peaks_measured_over_held_memory(tmp_path: Path) -> None:
    def row(name: str, **measured: int) -> dict[str, object]:
        cfg = _tiny(name)
        return {
            "schema": 1,
            "id": name,
            "family": "mlp",
            "status": "ok",
            "device": "cuda",
            "device_name": "NVIDIA H100 80GB HBM3",
            "config": cfg.to_dict(),
            "measurement": {"status": "ok", "iteration_time": 0.002, **measured},
            "finished_at": "2026-01-01T00:00:00+00:00",
        }

    mib = 1 << 20
    rows = [
        row("fresh", max_reserved=100 * mib, max_allocated=90 * mib, reserved_before=0),
        row("held", max_reserved=900 * mib, max_allocated=90 * mib, reserved_before=820 * mib),
        row("nvml", max_reserved=900 * mib, max_allocated=90 * mib, nvml_peak_used=60 * mib),
        row("first", max_reserved=100 * mib, max_allocated=90 * mib, nvml_peak_used=700 * mib),
        row(
            "reused",
            max_reserved=300 * mib,
            max_allocated=250 * mib,
            reserved_before=MAX_HELD_BEFORE,
        ),
    ]
    obs, skipped = observations(rows)
    assert not skipped
    by_id = {o.meta["id"]: o for o in obs}
    assert by_id["fresh"].peak_memory == 100 * mib and by_id["first"].peak_memory == 100 * mib
    assert by_id["reused"].peak_memory == 300 * mib  # at the limit: kept
    for name, held in (("held", 820), ("nvml", 840)):
        o = by_id[name]
        assert o.peak_memory is None and o.peak_allocated is None
        assert o.iteration_time == 0.002  # still a time row
        assert o.meta["memory_left_out"] == f"{held} MiB reserved before it began"
        assert o.meta["memory_left_out_kind"] == LEFT_OUT_HELD
        assert o.meta["measured_peak"] == 900 * mib


def test_observations_leave_out_a_held_cublas_workspace_only_where_the_step_calls_no_cublas() -> (
    None
):
    """The H100 collector kept cuBLAS's workspace between configurations: a U-Net (no
    matmul) measured after it peaked that much over its need; an MLP reuses it."""
    mib = 1 << 20
    unet = _tiny(
        "t-unet",
        family="unet",
        factory="unet",
        kwargs={"in_channels": 1, "classes": 2, "base": 4, "depth": 2},
        batch_kind="segmentation",
        batch_shape=[1, 16, 16],
        classes=2,
    )

    def row(name: str, cfg: Config, held: int) -> dict[str, object]:
        return {
            "schema": 1,
            "id": name,
            "family": cfg.family,
            "status": "ok",
            "device": "cuda",
            "device_name": "NVIDIA H100 80GB HBM3",
            "config": {**cfg.to_dict(), "id": name},
            "measurement": {
                "status": "ok",
                "iteration_time": 0.002,
                "max_reserved": 140 * mib,
                "max_allocated": 120 * mib,
                "reserved_before": held * mib,
            },
            "finished_at": "2026-01-01T00:00:00+00:00",
        }

    rows = [
        row("unet-held", unet, 64),  # the workspace (65 MiB) as NVML rounds it
        row("unet-fresh", unet, 42),  # what the H200 collector held: no workspace
        row("mlp-held", _tiny("t-mlp"), 64),  # calls cuBLAS: its own workspace anyway
    ]
    obs, skipped = observations(rows)
    assert not skipped
    by_id = {o.meta["id"]: o for o in obs}
    held = by_id["unet-held"]
    assert held.peak_memory is None and held.iteration_time == 0.002
    assert "cuBLAS workspace" in held.meta["memory_left_out"]
    assert held.meta["memory_left_out_kind"] == LEFT_OUT_WORKSPACE
    assert held.meta["measured_peak"] == 140 * mib
    for name in ("unet-fresh", "mlp-held"):
        assert by_id[name].peak_memory == 140 * mib
        assert "memory_left_out" not in by_id[name].meta
        assert "memory_left_out_kind" not in by_id[name].meta


def _cpu_row(name: str, batch_size: int = 8) -> dict[str, object]:
    """A measured CPU row of a tiny MLP configuration."""
    return {
        "schema": 1,
        "id": name,
        "family": "mlp",
        "status": "ok",
        "device": "cpu",
        "device_name": "CPU",
        "config": _tiny(name, batch_size=batch_size).to_dict(),
        "measurement": {"status": "ok", "iteration_time": 0.002, "max_reserved": 8 << 20},
        "finished_at": "2026-01-01T00:00:00+00:00",
    }


def test_observation_features_do_not_depend_on_the_rows_before() -> None:
    # training features come from each row's own dry run, never a rescale of another
    # batch size of the same architecture traced earlier in the process
    alone, _ = observations([_cpu_row("b", 48)])
    after, _ = observations([_cpu_row("a", 4), _cpu_row("b", 48)])
    assert after[1].features == alone[0].features


def test_rows_in_measured_order_whatever_the_order_read() -> None:
    old, new = _cpu_row("a"), {**_cpu_row("a"), "finished_at": "2026-02-01T00:00:00+00:00"}
    undated = {k: v for k, v in _cpu_row("b").items() if k != "finished_at"}
    same_time = {**_cpu_row("c")}
    assert in_measured_order([new, old, same_time, undated]) == [undated, old, same_time, new]


# ------------------------------------------------------------- data/gpu_window.sh
WINDOW = Path(__file__).resolve().parents[2] / "data" / "gpu_window.sh"


def _window(
    root: Path, *args: str, out: str = "out", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {
        "PATH": "/usr/bin:/bin",
        "PYTHON": sys.executable,
        "OUT": str(root / out),
        "COSTAWARE_DEVICE": "cpu",
        **(env or {}),
    }
    return subprocess.run(
        ["bash", str(WINDOW), *args], cwd=root, env=full, capture_output=True, text=True
    )


def test_gpu_window_checks_its_arguments_before_touching_a_device(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "src" / "costaware").mkdir(parents=True)
    r = _window(tmp_path, "--help")
    assert r.returncode == 0 and "ops-held" in r.stdout and "corpus SEED SHARD" in r.stdout
    for args, why in (
        ((), "no step given"),
        (("bogus",), "unknown step 'bogus'"),
        (("corpus", "1"), "corpus needs SEED and SHARD"),
        (("corpus", "x", "0"), "whole numbers, not 'x'"),
        (("corpus", "1", "a-2"), "a whole number or FIRST-LAST, not 'a-2'"),
        (("corpus", "1", "3-1"), "must not run backwards, not '3-1'"),
        (("ops-held", "soon"), "MINUTES must be a number, not 'soon'"),
        (("small",), "small needs SEED"),
        (("small", "x"), "small's SEED must be a whole number, not 'x'"),
        (("repeat", "0"), "repeat needs SEED and SHARD"),
        (("repeat", "0", "0-2"), "whole numbers, not '0' '0-2'"),
        (("repeat", "0", "0", "0"), "N must be a whole number above 0, not '0'"),
    ):
        r = _window(tmp_path, *args)
        assert r.returncode == 2, (args, r.stderr)
        assert why in r.stderr and "SEED SHARD" in r.stderr and not r.stdout
    r = _window(tmp_path / "data", "check")  # not the repository root
    assert r.returncode == 2 and "run it from the repository root" in r.stderr


@pytest.mark.slow
def test_gpu_window_check_runs_the_gpu_tests_with_the_integrations_importable(
    tmp_path: Path,
) -> None:
    """The GPU machine has no pip install of costaware: the check step lays the package out
    as pip would, or the Lightning GPU tests fail to import. Here, without a GPU, they are
    collected and skipped."""
    root = WINDOW.parents[1]
    r = _window(root, "check", out=str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("gpu_window: costaware from")]
    used = Path(line.split(" from ", 1)[1])
    assert used.parts[-3:] == ("costaware", "integrations", "__init__.py")
    assert not used.is_relative_to(root) and not used.exists()  # a copy, removed afterwards
    tests = (tmp_path / "out" / "gpu-tests.txt").read_text()
    assert "error" not in tests.lower() and "skipped" in tests, tests


@pytest.mark.slow
def test_gpu_window_names_by_device_and_resumes_the_committed_file(tmp_path: Path) -> None:
    (tmp_path / "src").symlink_to(Path(__file__).resolve().parents[2] / "src")
    committed = tmp_path / "data" / "gpu"
    committed.mkdir(parents=True)
    name = "cpu-ops-held-seed0.jsonl.gz"
    first = _window(tmp_path, "ops-held", "0.001", out="first")
    assert first.returncode == 0, first.stderr
    rows = list(read_rows(tmp_path / "first" / name))
    assert rows and f"{len(rows)} rows" in first.stdout
    # the file comes back, is committed, and the next window appends to it
    (tmp_path / "first" / name).rename(committed / name)
    second = _window(tmp_path, "ops-held", "0.001", out="second")
    assert second.returncode == 0, second.stderr
    assert f"resuming data/gpu/{name}" in second.stdout
    again = list(read_rows(tmp_path / "second" / name))
    assert len(again) > len(rows)
    assert [r["id"] for r in again[: len(rows)]] == [r["id"] for r in rows]
    assert len({r["id"] for r in again}) == len(again)  # nothing timed twice


@pytest.mark.slow
def test_gpu_window_measures_shards_in_turn_until_its_minutes_are_spent(tmp_path: Path) -> None:
    (tmp_path / "src").symlink_to(Path(__file__).resolve().parents[2] / "src")
    (tmp_path / "data" / "gpu").mkdir(parents=True)
    small = {"COSTAWARE_CORPUS": "cpu", "COSTAWARE_SHARDS": "4", "COSTAWARE_LIMIT": "1"}
    r = _window(tmp_path, "corpus", "1", "0-1", "3", env=small)
    assert r.returncode == 0, r.stderr
    for shard in (0, 1):
        rows = list(read_rows(tmp_path / "out" / f"cpu-seed1-shard{shard}.jsonl.gz"))
        assert len(rows) == 1 and f"cpu-seed1-shard{shard}.jsonl.gz: 1 rows" in r.stdout
    # under half a minute left: no shard is started, and the message says which wait
    r = _window(tmp_path, "corpus", "1", "2-3", "0.2", out="later", env=small)
    assert r.returncode == 0, r.stderr
    assert "shards 2-3 wait for the next command" in r.stdout
    assert not (tmp_path / "later").exists() or not any((tmp_path / "later").iterdir())


@pytest.mark.slow
def test_gpu_window_small_measures_the_cpu_corpus_on_the_device(tmp_path: Path) -> None:
    (tmp_path / "src").symlink_to(Path(__file__).resolve().parents[2] / "src")
    (tmp_path / "data" / "gpu").mkdir(parents=True)
    # seed 10's first configuration is a small MLP: a second's measurement here
    r = _window(tmp_path, "small", "10", "3", env={"COSTAWARE_LIMIT": "1"})
    assert r.returncode == 0, r.stderr
    rows = list(read_rows(tmp_path / "out" / "cpu-small-seed10.jsonl.gz"))
    assert [x["id"] for x in rows] == [corpus("cpu", seed=10)[0].id]
    assert "cpu-small-seed10.jsonl.gz: 1 rows" in r.stdout


@pytest.mark.slow
def test_gpu_window_repeats_a_committed_shard_into_a_dated_file(tmp_path: Path) -> None:
    (tmp_path / "src").symlink_to(Path(__file__).resolve().parents[2] / "src")
    committed = tmp_path / "data" / "gpu"
    committed.mkdir(parents=True)
    small = {"COSTAWARE_CORPUS": "cpu", "COSTAWARE_SHARDS": "4"}
    r = _window(tmp_path, "repeat", "1", "0", "1", "3", env=small)
    assert r.returncode == 2 and "cpu-seed1-shard0.jsonl.gz is not committed" in r.stderr

    first = corpus("cpu", shard=0, shards=4, seed=1)[0]
    append_row(committed / "cpu-seed1-shard0.jsonl.gz", {"id": first.id, "status": "ok"})
    r = _window(tmp_path, "repeat", "1", "0", "1", "3", out="again", env=small)
    assert r.returncode == 0, r.stderr
    (repeat,) = (tmp_path / "again").glob("cpu-repeat-*-seed1-shard0.jsonl.gz")
    (row,) = read_rows(repeat)
    assert row["id"] == first.id and row["status"] == "ok" and "measurement" in row
    assert row["in_context"]["status"] == "ok" and row["in_context"]["ops"]  # profiled too
    assert "1 rows" in r.stdout
    # the committed shard is left as it was
    assert list(read_rows(committed / "cpu-seed1-shard0.jsonl.gz")) == [
        {"id": first.id, "status": "ok"}
    ]


def test_features_cache_keeps_each_versions_features(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run whose features version differs (another op model, or none as in a CPU-only
    # run) must not discard what another version computed: that cost 8 minutes of dry
    # runs here when a CPU-only benchmark overwrote the full corpus's cache
    import costaware.measure.collect as collect_mod

    rows = [_cpu_row("a"), _cpu_row("b")]
    cache = tmp_path / "feats.json.gz"

    def run(version: str) -> tuple[list[str], list[Observation]]:
        monkeypatch.setattr(collect_mod, "features_version", lambda model: version)
        traced: list[str] = []
        obs, _ = observations(rows, cache=cache, on_row=lambda i, r: traced.append(r["id"]))
        return traced, obs

    traced, first = run("v1")
    assert traced == ["a", "b"]
    assert run("v2")[0] == ["a", "b"]  # another version: its own dry runs
    traced, again = run("v1")
    assert traced == [] and [o.features for o in again] == [o.features for o in first]
    for v in ("v3", "v4", "v5"):  # beyond four, the section written longest ago goes:
        run(v)  # v1's (the last v1 run only read its section)
    assert run("v2")[0] == [] and run("v1")[0] == ["a", "b"]


def test_features_cache_outlives_measuring_a_configuration_again(tmp_path: Path) -> None:
    # The features depend on the configuration, the device and a CPU's torch threads, not
    # on when a row was measured: timing a corpus again (new finish times) traces nothing
    cache = tmp_path / "feats.json.gz"
    first = {**_cpu_row("a"), "env": {"torch_threads": 1}}

    def traced(rows: list[dict[str, object]]) -> list[str]:
        seen: list[str] = []
        observations(rows, cache=cache, on_row=lambda i, r: seen.append(str(r["id"])))
        return seen

    assert traced([first]) == ["a"]
    again = {
        **first,
        "finished_at": "2026-03-01T00:00:00+00:00",
        "measurement": {"status": "ok", "iteration_time": 0.003, "max_reserved": 8 << 20},
    }
    assert traced([again]) == []  # measured again: the same features
    assert traced([{**first, "env": {"torch_threads": 2}}]) == ["a"]  # other threads: traced
    other = {**first, "config": _tiny("a", batch_size=16).to_dict()}
    assert traced([other]) == ["a"]  # the same id for another configuration: traced


def test_a_cpu_row_is_traced_with_the_threads_it_was_measured_with() -> None:
    from costaware.measure.collect import _as_measured

    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    row = {"env": {"torch_threads": other}}
    with _as_measured(row, "CPU"):
        # PyTorch picks a CPU convolution's kernel by the thread count
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with _as_measured(row, "H100"):  # a GPU row's trace does not depend on them
        assert torch.get_num_threads() == before
    with _as_measured({"env": {}}, "CPU"):  # an older row without the field
        assert torch.get_num_threads() == before


def test_a_cpu_row_is_traced_as_the_instruction_set_it_was_measured_on() -> None:
    """oneDNN pads a convolution's channels to 8 floats with AVX2 and 16 with AVX-512: a
    row's features are its CPU's, whichever CPU computes them (features of the AVX2 rows
    computed on an AVX-512 CPU put the U-Net's CPU memory 6.8% off instead of 0.0%)."""
    from costaware.core.trace import cpu_capability
    from costaware.measure.collect import (
        LEGACY_CPU_CAPABILITY,
        _as_measured,
        _cache_key,
        measured_cpu_capability,
        measured_cpu_device,
    )

    here = cpu_capability()
    cfg = corpus("cpu", seed=0)[0]
    avx2 = {"id": "x", "device": "cpu", "config": cfg.to_dict(), "env": {"torch_threads": 1}}
    avx512 = {**avx2, "env": {"torch_threads": 1, "cpu_capability": "AVX512"}}
    gpu = {**avx2, "device": "cuda:0"}
    assert measured_cpu_capability(avx2) == LEGACY_CPU_CAPABILITY == "AVX2"
    assert measured_cpu_capability(avx512) == "AVX512" and measured_cpu_capability(gpu) is None
    # the instruction set is part of what a CPU row's cached features depend on
    assert _cache_key(avx2) != _cache_key(avx512) and "isa" not in _cache_key(gpu)
    # and so is the CPU's half-precision speed: an AVX2 row's bf16 runs at an eighth of
    # fp32 whatever CPU computes its features; a row that records native bf16 does not
    slow = measured_cpu_device({**avx2, "env": {"cpu_count": 2}})
    assert slow.flops["bf16"] == slow.flops["fp32"] / 8 and slow.sm_count == 2
    native = {**avx512, "env": {**avx512["env"], "cpu_half_flags": ["avx512_bf16"]}}
    fast = measured_cpu_device(native)
    assert fast.flops["bf16"] == fast.flops["fp32"] and fast.flops["fp16"] < fast.flops["fp32"]
    assert _cache_key(native) != _cache_key(avx512)
    # its physical memory is a feature too, where the row records it
    big = {**avx512, "env": {**avx512["env"], "cpu_memory_bytes": 2**40}}
    assert (
        measured_cpu_device(big).memory_bytes == 2**40 != measured_cpu_device(avx512).memory_bytes
    )
    assert _cache_key(big) != _cache_key(avx512)
    for row, isa in ((avx2, "AVX2"), (avx512, "AVX512")):
        with _as_measured(row, "CPU"):
            assert cpu_capability() == isa
        assert cpu_capability() == here
    with _as_measured(gpu, "H100"):
        assert cpu_capability() == here

    # a conv net of 20 and 40 channels: padded to 24 and 40 under AVX2, 32 and 48 under
    # AVX-512 (4 MiB more at this size)
    spec = ca.TrainingSpec(
        model=functools.partial(tiny_cnn, width=20),
        batch=ca.ImageBatch((3, 64, 64), classes=10),
        batch_size=16,
        optimizer="sgd",
    )
    model = CostModel()
    peaks = {}
    for row, isa in ((avx2, "AVX2"), (avx512, "AVX512")):
        with _as_measured(row, "CPU"):
            peaks[isa] = model.features(spec, "CPU", exact=True)["analytic_reserved_mib"]
    assert peaks["AVX512"] > peaks["AVX2"]


def test_collect_in_context_keeps_each_ops_time_beside_the_measurement(tmp_path: Path) -> None:
    """With ``in_context`` a row that measured ok also carries the profiled ops of its
    step; without it rows stay as they were. benchmarks/in_context.py reads them back and
    costs the same configuration with the op model."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import in_context

    out = tmp_path / "ctx.jsonl.gz"
    collect([_tiny("ctx")], out, "cpu", warmup=1, steps=10, progress=False, in_context=True)
    collect([_tiny("plain")], out, "cpu", warmup=1, steps=10, progress=False)
    rows = {r["id"]: r for r in read_rows(out)}
    ctx = rows["ctx"]["in_context"]
    assert rows["ctx"]["status"] == "ok" and ctx["status"] == "ok", ctx.get("error")
    assert "in_context" not in rows["plain"]
    chains = {(ph, chain) for ph, chain, _, _ in ctx["ops"]}
    assert ("forward", "linear>addmm") in chains
    groups = in_context.measured_groups(ctx)
    assert groups[("forward", "matmul")] > 0 and groups[("optimizer", "optimizer")] > 0

    res = in_context.compare([rows["ctx"]], CostModel.default())
    assert not res["skipped"]
    matmul = res["groups"][("forward", "matmul")]
    assert matmul["rows"] == 1 and matmul["predicted"] > 0 and matmul["ratios"]
    (step,) = res["steps"]
    assert step["op_sum"] > 0 and step["profiled_ops"] > 0
    text = in_context.markdown(res)
    assert "| forward | matmul | 1 |" in text and "| mlp | 1 |" in text
    assert in_context.main([str(out)]) == 0
    assert in_context.main([str(tmp_path / "none.jsonl.gz"), "--out", str(tmp_path / "x.md")]) == 2


def test_a_profile_over_the_time_limit_keeps_its_measurement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit covers the measurement and the profile after it: a profile that runs
    out of time is a timed-out profile, not a timed-out measurement."""
    import costaware.measure.collect as collect_mod

    def endless(*args: object, **kw: object) -> dict[str, object]:
        time.sleep(60)  # the alarm interrupts it
        raise AssertionError("the limit did not stop the profile")

    monkeypatch.setattr(collect_mod, "in_context_op_times", endless)
    out = tmp_path / "rows.jsonl.gz"
    collect(
        [_tiny("m")], out, "cpu", warmup=1, steps=10, progress=False, timeout_s=5, in_context=True
    )
    (row,) = read_rows(out)
    assert row["status"] == "ok" and row["measurement"]["iteration_time"] > 0
    assert row["in_context"]["status"] == "timeout"
    assert "limit of 5 s" in row["in_context"]["error"]
