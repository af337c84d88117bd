"""costaware.measure.alloctrace and benchmarks/alloc_fidelity.py, without a GPU: the
allocator's history in the layout ``torch.cuda.memory._snapshot`` gives it, made by hand
or from a dry run's own events, whose replay is known exactly."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import costaware as ca
from costaware.core.allocator import RELEASE_CACHED, min_capacity, simulate
from costaware.measure.alloctrace import (
    ACTIONS,
    RNN_LAYOUTS,
    boundary_runs,
    history_events,
    main,
    real_events,
    rnn_layer_runs,
)
from costaware.measure.collect import append_row
from costaware.measure.corpus import full_corpus

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import alloc_fidelity  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
ALLOC, FREE, SEG_ALLOC, SEG_FREE, OOM = range(len(ACTIONS))


def _frame(path: str, line: int, name: str) -> dict[str, object]:
    return {"filename": path, "line": line, "name": name}


def test_history_keeps_the_allocator_actions_and_names_each_allocation_by_its_frames() -> None:
    linear = [
        _frame("/opt/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", 125, "forward"),
        _frame("/home/u/train.py", 9, "step"),
        _frame("/home/u/train.py", 30, "main"),
    ]
    trace = [
        {"action": "segment_alloc", "addr": 4096, "size": 20 * MiB, "frames": linear},
        {"action": "alloc", "addr": 4096, "size": 3 * MiB, "frames": linear},
        {"action": "free_requested", "addr": 4096, "size": 3 * MiB, "frames": []},
        {"action": "free_completed", "addr": 4096, "size": 3 * MiB, "frames": []},
        {"action": "alloc", "addr": 8192, "size": 2 * MiB, "frames": linear},
        {"action": "snapshot", "addr": 0, "size": 0, "frames": []},
        {"action": "oom", "size": 9 * MiB, "device_free": 0, "frames": linear[1:]},
    ]
    events, frames = history_events(trace)
    assert [e[0] for e in events] == [SEG_ALLOC, ALLOC, FREE, ALLOC, OOM]
    assert events[1] == [ALLOC, 4096, 3 * MiB, 0] and events[3][3] == 0  # one frame text, shared
    assert events[0][3] == -1 and events[2][3] == -1  # frames are kept for allocations only
    assert frames == [
        "torch/nn/modules/linear.py:125 forward < /home/u/train.py:9 step",
        "/home/u/train.py:9 step < /home/u/train.py:30 main",
    ]
    assert events[4] == [OOM, 0, 9 * MiB, 1]


def test_real_events_start_from_the_live_blocks_and_end_at_the_request_that_failed() -> None:
    history = {
        "initial": [[900, 5 * MiB], [100, 1 * MiB]],  # the parameters, out of address order
        "events": [
            [ALLOC, 2000, 7 * MiB, 0],
            [FREE, 100, 1 * MiB, -1],  # a parameter's block freed
            [FREE, 555, 4 * MiB, -1],  # a block the snapshot did not list
            [ALLOC, 2000, 8 * MiB, -1],  # allocated again: its free was not recorded
            [SEG_FREE, 0, 20 * MiB, -1],
            [OOM, 0, 30 * MiB, 0],
            [FREE, 2000, 8 * MiB, -1],  # the error's unwinding: left out
        ],
        "frames": ["model.py:3 forward"],
    }
    events, info = real_events(history)
    assert events == [
        (100, 1 * MiB),
        (900, 5 * MiB),
        (2000, 7 * MiB),
        (100, -1),
        (2000, -1),
        (2000, 8 * MiB),
        (-1, 30 * MiB),
    ]
    assert info["unknown_frees"] == 1 and info["oom_request"] == 30 * MiB
    assert info["frame_at"] == {2: 0, 6: 0}
    assert simulate(events).peak_allocated > 0  # the simulation takes them as they are


def test_a_refused_request_the_run_went_on_from_is_no_allocation() -> None:
    """cuDNN catches the error of a workspace that does not fit and takes an algorithm
    that needs less: the run goes on, and only a refusal nothing follows ends it."""
    history = {
        "initial": [],
        "events": [
            [ALLOC, 100, 3 * MiB, -1],
            [OOM, 0, 900 * MiB, 0],  # a workspace refused, caught
            [ALLOC, 200, 2 * MiB, -1],  # the run went on
            [FREE, 200, 2 * MiB, -1],
            [OOM, 0, 40 * MiB, -1],  # the request that failed the run
            [FREE, 100, 3 * MiB, -1],
        ],
        "frames": ["torch/nn/modules/conv.py:548 _conv_forward"],
    }
    events, info = real_events(history)
    # the release the allocator made before it refused the workspace stays
    assert events == [
        (100, 3 * MiB),
        (0, RELEASE_CACHED),
        (200, 2 * MiB),
        (200, -1),
        (-1, 40 * MiB),
    ]
    assert info["caught_ooms"] == 1 and info["oom_request"] == 40 * MiB
    fitted = {**history, "events": history["events"][:4]}  # a run that fitted after the refusal
    events, info = real_events(fitted)
    assert events == [(100, 3 * MiB), (0, RELEASE_CACHED), (200, 2 * MiB), (200, -1)]
    assert info["caught_ooms"] == 1 and info["oom_request"] is None


def test_boundary_runs_are_both_sides_of_each_bisected_boundary_smallest_cap_first() -> None:
    a, b = (c for c in full_corpus("cpu", 0)[:2])
    rows = []
    for cfg, cap, sizes in (
        (a, 24, {8: "fits", 16: "oom", 12: "fits", 14: "oom"}),
        (a, 8, {4: "fits", 6: "oom"}),
        (b, 8, {2: "fits"}),
    ):  # no OOM seen: no boundary
        for size, status in sizes.items():
            rows.append(
                {
                    "kind": "probe",
                    "status": status,
                    "config_id": cfg.id,
                    "config": cfg.to_dict(),
                    "cap_bytes": cap,
                    "batch_size": size,
                }
            )
    rows.append({"kind": "search_end", "config_id": a.id, "cap_bytes": 8})
    runs = boundary_runs(rows)
    assert [(r.cap, r.batch_size, r.capped, r.probed) for r in runs] == [
        (8, 4, True, "fits"),
        (8, 6, True, "oom"),
        (8, 4, False, "fits"),
        (24, 12, True, "fits"),
        (24, 14, True, "oom"),
        (24, 12, False, "fits"),
    ]
    assert all(r.config.id == a.id for r in runs)


def _recorded(events: list[tuple[int, int]], cap: int, status: str) -> dict[str, object]:
    """A recorded run whose allocator events are ``events``, addresses standing in for keys."""
    rows = []
    for key, n in events:
        rows.append([ALLOC, key + 1, n, 0] if n > 0 else [FREE, key + 1, 0, -1])
    return {
        "family": "mlp",
        "config_id": "x",
        "batch_size": 64,
        "cap_bytes": cap,
        "capped": True,
        "status": status,
        "max_allocated": simulate(events).peak_allocated,
        "max_reserved": simulate(events).peak_reserved,
        "history": {"initial": [], "events": rows, "frames": ["torch/nn/functional.py:1 conv2d"]},
    }


def test_the_fidelity_check_replays_real_events_through_the_simulation_as_it_ships() -> None:
    cfg = next(c for c in full_corpus("cpu", 0) if c.family == "mlp")
    spec = dataclasses.replace(cfg, batch_size=64).to_spec()
    model = ca.CostModel()
    trace, _, _ = model.trace(spec, attention="fused")
    traced = [(int(k), int(n)) for k, n in trace.allocator_events().tolist()]
    basis = dict(model.predict(spec, "H100").basis)
    # the "real" run: the dry run's events plus a 300 MiB workspace the dry run lacks
    extra = max(k for k, _ in traced) + 10
    real = [*traced[:3], (extra, 300 * MiB), (extra, -1), *traced[3:]]
    need = min_capacity(real)
    for cap, status, right in (
        (need, "fits", True),
        (need - 2 * MiB, "fits", False),  # the real run fitted where the model says it cannot
        (need - 2 * MiB, "oom", True),
    ):
        out = alloc_fidelity.analyse(_recorded(real, cap, status), traced, basis)
        assert out["real_allocated"] == simulate(real).peak_allocated
        assert out["real_capacity"] == need
        assert out["real_right"] is right
        assert out["dry_capacity"] == basis["simulated_min_capacity"]
        assert out["missing"][0] == {
            "bytes": 300 * MiB,
            "count": 1,
            "frame": "torch/nn/functional.py:1 conv2d",
        }
    lines = alloc_fidelity.report([out])
    assert any(
        "the allocator model on the real events puts 1 on the right side" in x for x in lines
    )


def test_the_fidelity_summary_counts_each_side_and_each_family() -> None:
    def run(family: str, cap: int | None, status: str, real: float, dry: float) -> dict[str, Any]:
        out: dict[str, Any] = {
            "family": family, "cap": None if cap is None else cap * GiB, "status": status,
            "real_capacity": int(real * GiB), "dry_capacity": int(dry * GiB),
            "real_reserved": int(real * GiB), "measured_reserved": int(real * GiB),
            "caught_ooms": 3 if family == "unet" else 0,
            # placed below, the uncapped replay is 1% off, and the dry run 2% higher
            "real_reserved_descending": int(real * 1.01 * GiB),
            "dry_reserved": int(dry * GiB), "dry_reserved_descending": int(dry * 1.02 * GiB),
        }  # fmt: skip
        if cap is not None:
            out["real_right"] = (real <= cap) == (status == "fits")
            out["dry_right"] = (dry <= cap) == (status == "fits")
            out["real_replay_right"] = out["real_right"]
            out["real_replay_right_descending"] = True
        return out

    results = [
        run("bert", 8, "fits", 7.8, 7.5),  # the dry run low by 3.8%: right side still
        run("bert", 8, "oom", 8.2, 7.9),  # the dry run puts an OOM under the cap: wrong
        run("unet", 8, "fits", 8.2, 8.3),  # the real events say it cannot fit: both wrong
        run("unet", 8, "oom", 7.9, 8.1),  # an OOM the real events put under the cap
        run("bert", None, "fits", 9.0, 8.7),
    ]
    text = "\n".join(alloc_fidelity.summary(results, ["data/oom/x.jsonl.gz"]))
    assert text.startswith(alloc_fidelity.START) and text.endswith(alloc_fidelity.END)
    assert "to within 0.3% in 1 of 1 runs" in text
    assert "puts 2 of the 4 runs on the side of the cap they ran on" in text
    assert "misses lie between x0.987 and x1.025 of the cap" in text
    assert "at 1.3% over the capacity replayed (unet, 8 GiB)" in text
    assert "The dry run's capacity puts 2 of the 4 on the right side, 1 of its 2 misses" in text
    assert "Low by family (median): bert x0.962" in text
    assert "In 2 runs (unet) cuDNN asked for a convolution workspace" in text
    # no margin over the real events admits neither OOM yet keeps the unet fit at 8.2 GiB
    assert "admits none of the 2 runs that ran out of memory" in text
    assert "is x1.013, and it rejects 1 of the 2 that fitted" in text
    assert "puts 2 of the 4 runs on the right side replayed under their own cap" in text
    # the real events' need: fits 7.8/8 and 8.2/8, OOMs 8.2/8 and 7.9/8
    assert "needed a median x1.000 of their cap and those that ran out of memory x1.006" in text
    assert "| x1.000 | 1 / 2 | 1 / 2 | 1 / 2 | 1 / 2 |" in text
    assert "to within 0.3% in 0 of the 1 uncapped runs (exactly in 0), against 1 with" in text
    assert "they put 4 of the 4 runs on the right side, against 2" in text
    # the uncapped bert run: dry 8.7 against 9.0 measured, 8.874 placed below
    assert "same uncapped runs moves in 1 (x1.020-x1.020), closer to the measured one in 1" in text


def test_recording_needs_a_gpu_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    probes = tmp_path / "probes.jsonl.gz"
    cfg = full_corpus("cpu", 0)[0]
    append_row(
        probes,
        {
            "kind": "probe",
            "status": "fits",
            "config_id": cfg.id,
            "config": cfg.to_dict(),
            "cap_bytes": 1,
            "batch_size": 2,
        },
    )
    assert (
        main(["--probes", str(probes), "--out", str(tmp_path / "out.jsonl.gz"), "--device", "cpu"])
        == 2
    )
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl.gz").exists()


def test_recording_refuses_probes_of_the_other_allocator_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    probes = tmp_path / "probes.jsonl.gz"
    cfg = dataclasses.replace(full_corpus("cpu", 0)[0], allocator="expandable_segments")
    for size, status in ((2, "fits"), (4, "oom")):
        append_row(
            probes,
            {
                "kind": "probe", "status": status, "config_id": cfg.id,
                "config": cfg.to_dict(), "cap_bytes": GiB, "batch_size": size,
            },
        )  # fmt: skip
    args = ["--probes", str(probes), "--out", str(tmp_path / "out.jsonl.gz"), "--device", "cpu"]
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "this process's CUDA allocator is 'default'" in err
    assert "the runs are for 'expandable_segments'" in err
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in err
    # in a process set up for them, the probes are taken (and the GPU is what is missing)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert main(args) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_gpu_window_step_checks_its_minutes_and_reports_a_missing_gpu(tmp_path: Path) -> None:
    script = ROOT / "data" / "gpu_window.sh"
    env = {
        "PATH": "/usr/bin:/bin",
        "OUT": str(tmp_path),
        "PYTHON": sys.executable,
        "COSTAWARE_DEVICE": "cpu",
    }

    def window(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(script), "alloctrace", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    bad = window("soon")
    assert bad.returncode == 2 and "MINUTES must be a number" in bad.stderr
    r = window("1")
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr
    # with expandable segments the step takes the expandable probes (the default ones
    # would be refused as the other allocator mode)
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    r = window("1")
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr, r.stderr
    del env["PYTORCH_CUDA_ALLOC_CONF"]
    r = subprocess.run(
        ["bash", str(script), "rnn-layers", "1"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr, r.stderr


def test_the_fidelity_benchmark_says_what_to_run_without_recorded_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "none.jsonl.gz"
    append_row(empty, {"kind": "context"})
    assert alloc_fidelity.main([str(empty)]) == 2
    assert "gpu_window.sh alloctrace" in capsys.readouterr().err


def test_the_margin_table_scores_each_point_against_the_cap() -> None:
    def run(status: str, cap: float, real: float, dry: float) -> dict[str, Any]:
        return {
            "family": "x", "cap": int(cap * GiB), "status": status,
            "real_capacity": int(real * GiB), "dry_capacity": int(dry * GiB),
        }  # fmt: skip

    results = [
        run("fits", 10, 9.95, 9.7),  # within 0.5% of its cap by the real events
        run("fits", 10, 9.7, 9.9),
        run("oom", 10, 10.05, 9.85),  # the dry run 1.5% under the cap: admitted up to x1.015
        run("oom", 10, 9.96, 10.1),  # the real events under the cap: admitted up to x1.004
    ]
    table = {(t["point"], t["margin"]): t for t in alloc_fidelity.margin_table(results)}
    assert table[("real", 0.0)] == {
        "point": "real", "margin": 0.0, "fits": 2, "fits_rejected": 0, "ooms": 2,
        "ooms_admitted": 1,
    }  # fmt: skip
    assert table[("real", 0.005)]["ooms_admitted"] == 0
    assert table[("real", 0.01)]["fits_rejected"] == 1  # 9.95 x 1.01 > 10
    assert table[("dry", 0.01)]["ooms_admitted"] == 1
    assert (table[("dry", 0.02)]["ooms_admitted"], table[("dry", 0.02)]["fits_rejected"]) == (0, 1)
    # the smallest margin that admits no OOM, to the next 0.1% above it
    assert alloc_fidelity.safe_margin(results, "real") == (0.005, 0, 2)
    assert alloc_fidelity.safe_margin(results, "dry") == (0.016, 1, 2)
    assert alloc_fidelity.safe_margin(results[:2], "dry") is None


def test_runs_with_expandable_segments_replay_in_their_mode_and_have_a_paragraph() -> None:
    # A (30 MiB) freed, then B (40 MiB): the default allocator keeps A's segment and adds
    # one of 40 MiB; an expandable segment maps its free 40 MiB of pages again for B
    events = [(1, 30 * MiB), (1, -1), (2, 40 * MiB), (2, -1)]
    cfg = dataclasses.replace(
        next(c for c in full_corpus("cpu", 0) if c.family == "mlp"),
        allocator="expandable_segments",
    )
    row = {**_recorded(events, 64 * MiB, "fits"), "config": cfg.to_dict()}
    basis = {"simulated_allocated": 1, "simulated_reserved": 1, "simulated_min_capacity": 1}
    out = alloc_fidelity.analyse(row, [(1, MiB), (1, -1)], basis)
    assert out["allocator"] == "expandable_segments"
    assert out["real_reserved"] == simulate(events, "expandable_segments").peak_reserved
    assert out["real_reserved"] < simulate(events).peak_reserved == 70 * MiB

    def run(cap: int | None, status: str, real: float, dry: float) -> dict[str, Any]:
        r: dict[str, Any] = {
            "family": "vit", "allocator": "expandable_segments", "status": status,
            "cap": None if cap is None else cap * GiB, "real_capacity": int(real * GiB),
            "dry_capacity": int(dry * GiB), "real_reserved": int(real * GiB),
            "measured_reserved": int(real * GiB), "caught_ooms": 0,
        }  # fmt: skip
        if cap is not None:
            r["real_right"] = r["real_replay_right"] = (real <= cap) == (status == "fits")
            r["dry_right"] = (dry <= cap) == (status == "fits")
        return r

    default = {**run(8, "fits", 7.9, 7.8), "allocator": "default"}
    only_default = "\n".join(alloc_fidelity.summary([default], ["x"]))
    text = "\n".join(
        alloc_fidelity.summary(
            [default, run(8, "fits", 7.9, 7.8), run(8, "oom", 8.1, 7.95), run(None, "fits", 8, 8)],
            ["x"],
        )
    )
    # the default runs alone make the section; the expandable ones are set apart
    assert "No recorded boundary runs." in only_default
    assert "**With expandable segments** (3 runs" in text
    assert "to within 0.3% in 1 of 1 runs; under their cap they put 2 of the 2" in text
    assert "x1.007 over the dry run's (0)" in text


def test_the_rnn_layer_runs_cover_each_cell_depth_width_and_precision_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = rnn_layer_runs()
    assert len(runs) == len(RNN_LAYOUTS) == 32
    assert len({r.config.id for r in runs}) == 32 and len({r.key for r in runs}) == 32
    assert all(not r.capped and r.probed == "listed" and r.config.family == "rnn" for r in runs)
    layouts = {
        (r.config.kwargs["kind"], r.config.kwargs["layers"], r.config.kwargs["hidden"],
         r.config.precision)
        for r in runs
    }  # fmt: skip
    assert layouts == set(RNN_LAYOUTS)
    # a spec of the deepest: the zoo model it names has that many recurrent layers
    deep = next(r for r in runs if r.config.kwargs["layers"] == 4)
    spec = deep.config.to_spec()
    assert spec.batch_size == 32 and spec.optimizer == "sgd"
    out = str(tmp_path / "out.jsonl.gz")
    assert main(["--rnn-layers", "--out", out, "--device", "cpu"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one source of runs, not both
        main(["--rnn-layers", "--probes", out, "--out", out])


def test_the_listed_recurrent_runs_have_their_own_paragraph() -> None:
    def run(kind: str, layers: int, dry: float, measured: float, missing: int) -> dict[str, Any]:
        return {
            "family": "rnn", "probed": "listed", "allocator": "default", "cap": None,
            "status": "fits", "config": {"kwargs": {"kind": kind, "layers": layers}},
            "dry_allocated": int(dry * GiB), "measured_allocated": int(measured * GiB),
            "real_capacity": int(measured * GiB), "dry_capacity": int(dry * GiB),
            "real_reserved": int(measured * GiB), "measured_reserved": int(measured * GiB),
            "missing": [{"bytes": missing * MiB, "count": 1, "frame": "torch/nn/modules/rnn.py:1 forward"}],
        }  # fmt: skip

    listed = [run("gru", 3, 0.9, 1.0, 311), run("gru", 3, 0.8, 1.0, 12), run("lstm", 1, 1.0, 1.0, 5)]
    text = "\n".join(alloc_fidelity.summary(listed, ["x"]))
    assert "**Recurrent layers as cuDNN runs them** (3 uncapped runs" in text
    assert "gru x3 0.850, lstm x1 1.000" in text
    assert "311 MiB (torch/nn/modules/rnn.py:1 forward)" in text
    # not boundary runs: the section has no boundary figures
    assert "puts" not in text
