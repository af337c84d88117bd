"""The op-level time model: fitted on op timings, summed over a real dry-run trace."""

from __future__ import annotations

import functools
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

import costaware as ca
from costaware.core.model import Observation
from costaware.core.optime import (
    CPU_HARNESS_FLOOR_S,
    HARNESS_FLOOR_S,
    HELD_TIMER,
    OPTIME_FEATURES,
    OPTIMIZER_STEP,
    OpTimeModel,
    fit_op_models,
    node_table,
    op_rows_digest,
    op_samples,
)
from costaware.devices import get_device
from tests.conftest import tiny_cnn


def _op_rows(n: int = 240, seed: int = 0) -> list[dict[str, Any]]:
    """Synthetic opbench rows: a roofline-like time plus the harness floor."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for i in range(n):
        op = ("linear", "conv2d", "add", "relu", "sgd", "adam")[i % 6]
        size = 10 ** rng.uniform(3, 8)
        flops = size * (200 if op in ("linear", "conv2d") else 1)
        nbytes = size * 4

        def t(f: float, b: float) -> float:
            return max(f / 4e14, b / 2.5e12) + 5e-6

        times: dict[str, float]
        if op in ("sgd", "adam"):
            fl, by = {"step": flops}, {"step": nbytes * 3}
            times = {"total_s": t(flops, nbytes * 3) + 8e-5}
            direction = "step"
        else:
            fl, by = {"fwd": flops, "bwd": 2 * flops}, {"fwd": nbytes, "bwd": 2 * nbytes}
            times = {"fwd_s": t(flops, nbytes) + 2e-5, "bwd_s": t(2 * flops, 2 * nbytes) + 8e-5}
            direction = "fwd+bwd"
        rows.append(
            {
                "kind": "op",
                "id": f"{op}-{i}",
                "op": op,
                "params": {"size": size},
                "dtype": "fp32" if i % 2 else "bf16",
                "direction": direction,
                "flops": fl,
                "bytes": by,
                "times": times,
                "status": "ok",
                "device": "cuda",
                "device_name": "NVIDIA H100 80GB HBM3",
            }
        )
    rows.append({**rows[0], "id": "bad", "status": "error", "times": None})
    return rows


def _cpu_rows(n: int = 240) -> list[dict[str, Any]]:
    """The synthetic rows as a CPU's opbench writes them: whole calls, timed by perf_counter."""
    return [
        {
            **r,
            "id": f"cpu-{r['id']}",
            "device": "cpu",
            "device_name": "CPU",
            "times": r["times"] and {**r["times"], "timer": "perf_counter"},
        }
        for r in _op_rows(n, seed=1)
    ]


@pytest.fixture(scope="module")
def op_model() -> OpTimeModel:
    return OpTimeModel(iterations=150, depth=4).fit(_op_rows())


@pytest.fixture(scope="module")
def cpu_op_model() -> OpTimeModel:
    return OpTimeModel(iterations=150, depth=4).fit(_cpu_rows())


def _spec(width: int = 8, bs: int = 16) -> ca.TrainingSpec:
    return ca.TrainingSpec(
        model=functools.partial(tiny_cnn, width=width),
        batch=ca.ImageBatch((3, 32, 32), classes=10),
        batch_size=bs,
        optimizer="sgd",
    )


def test_op_samples_split_directions_and_skip_errors() -> None:
    rows = _op_rows(12)
    x, y = op_samples(rows)
    # 8 fwd+bwd rows give two samples each, 4 optimizer rows one; the error row none
    assert x.shape == (20, 7) and len(y) == 20
    assert (x[:, 6] == 0.0).all()  # no case runs its kernels in sequence
    assert op_rows_digest(rows) == op_rows_digest(list(reversed(rows)))


def test_a_recurrent_layer_is_timed_by_its_steps_not_only_its_flops() -> None:
    """The same FLOPs over a longer sequence take longer: T small GEMMs run one by one."""
    rng = random.Random(1)
    rows = _op_rows(60)
    for i in range(120):
        t = rng.choice([4, 16, 64, 256])
        work = 10 ** rng.uniform(7, 9)  # FLOPs per layer, whatever T is
        rows.append(
            {
                **rows[0],
                "id": f"lstm-{i}",
                "op": "lstm",
                "params": {"T": t, "B": 8, "I": 64, "H": 64},
                "flops": {"fwd": work, "bwd": 2 * work},
                "bytes": {"fwd": work / 50, "bwd": work / 25},
                "times": {"fwd_s": 2e-5 + t * 8e-6, "bwd_s": 8e-5 + t * 16e-6},
            }
        )
    x, _ = op_samples(rows[-1:])  # its forward and backward samples
    assert x[:, 6].tolist() == pytest.approx([math.log10(rows[-1]["params"]["T"])] * 2)
    model = OpTimeModel(iterations=150, depth=4).fit(rows)
    # one table row per layer kernel: (op, phase, dtype, class, flops, bytes, steps, count)
    short = [("rnn", 0, 0, 1, 1e8, 2e6, 4, 1)]
    long = [("rnn", 0, 0, 1, 1e8, 2e6, 256, 1)]
    h100 = get_device("H100")
    t_short = model.step_features(short, h100)["optime_kernel_ms"]
    t_long = model.step_features(long, h100)["optime_kernel_ms"]
    assert t_long > 10 * t_short


def test_op_samples_keep_held_timings_whole_and_prefer_them() -> None:
    rows = _op_rows(12)
    _, y = op_samples(rows)
    linear = rows[0]
    assert linear["op"] == "linear" and linear["direction"] == "fwd+bwd"
    # a schema 1 timing loses the harness floor; a held one (the GPU's own time) does not
    assert math.exp(y[0]) == pytest.approx(linear["times"]["fwd_s"] - HARNESS_FLOOR_S[0])
    held = {**linear, "times": {**linear["times"], "timer": HELD_TIMER}}
    _, y_held = op_samples([held])
    assert math.exp(y_held[0]) == pytest.approx(linear["times"]["fwd_s"])
    assert math.exp(y_held[1]) == pytest.approx(linear["times"]["bwd_s"])
    # the same case timed both ways: only the held samples count, wherever they come
    for both in ([*rows, held], [held, *rows]):
        _, y_b = op_samples(both)
        assert len(y_b) == len(y)
        assert sorted(y_b.tolist()) == sorted([*y[2:].tolist(), *y_held.tolist()])


def test_op_model_learns_size_and_sums_over_a_trace(op_model: OpTimeModel) -> None:
    assert op_model.info_["device"] == "H100-SXM" and op_model.info_["rows"] == 241
    h100 = get_device("H100")
    small = ca.dry_run(_spec(bs=4))
    big = ca.dry_run(_spec(width=64, bs=256))
    table = node_table(small)
    assert table and sum(t[-1] for t in table) <= small.graph.number_of_nodes()
    f_small = op_model.step_features(table, h100)
    f_big = op_model.step_features(node_table(big), h100)
    assert set(f_small) == set(OPTIME_FEATURES)
    assert 0 < f_small["optime_ms"] < f_big["optime_ms"]
    assert f_small["optime_ms"] == pytest.approx(
        f_small["optime_fwd_ms"] + f_small["optime_bwd_ms"] + f_small["optime_opt_ms"] + 2.0,
        rel=1e-6,
    )
    assert f_small["log_optime"] == pytest.approx(math.log(f_small["optime_ms"] / 1e3))
    # another GPU is scaled by the roofline ratio; a CPU has no op data
    slower = op_model.step_features(node_table(big), get_device("T4"))
    assert slower["optime_ms"] > f_big["optime_ms"]
    cpu = op_model.step_features(table, get_device("CPU"))
    assert all(math.isnan(v) for v in cpu.values())


def test_features_carry_the_op_sum_for_cuda_and_nan_for_cpu(op_model: OpTimeModel) -> None:
    model = ca.CostModel()
    assert "optime_ms" not in model.features(_spec(), "H100")
    model.add_op_model(op_model)
    gpu = model.features(_spec(), "H100")
    cpu = model.features(_spec(), "CPU")
    assert gpu["optime_ms"] > 0 and math.isnan(cpu["optime_ms"])


def test_save_load_round_trip_keeps_the_op_model(op_model: OpTimeModel, tmp_path: Path) -> None:
    model = ca.CostModel(iterations=30, depth=3)
    model.add_op_model(op_model)
    obs = []
    for fam, widths in (("a", (4, 8)), ("b", (12, 16)), ("c", (20, 24))):
        for w in widths:
            for bs in (4, 16, 64):
                f = model.features(_spec(w, bs), "H100")
                obs.append(
                    Observation(
                        features=f,
                        device="H100-SXM",
                        peak_memory=f["analytic_reserved_mib"] * 2**20 * 1.2,
                        iteration_time=f["optime_ms"] / 1e3 * (1.1 + 0.01 * w),
                        family=fam,
                    )
                )
    model.fit(obs)
    model.save(tmp_path)
    assert {"manifest.json", "optime.cbm"} <= {p.name for p in tmp_path.iterdir()}
    assert not [p for p in tmp_path.rglob("*") if p.suffix in (".pkl", ".pickle", ".joblib")]
    entry = json.loads((tmp_path / "manifest.json").read_text())["models"]["op_time"]
    assert entry["file"] == "optime.cbm" and entry["rows"] == 241
    assert len(entry["data_sha256"]) == 64
    loaded = ca.CostModel.load(tmp_path)
    assert loaded.op_model() is not None
    a, b = model.predict(_spec(10, 8), "H100"), loaded.predict(_spec(10, 8), "H100")
    assert b.iteration_time == pytest.approx(a.iteration_time, rel=1e-6)
    assert b.basis["op_sum_time"] == pytest.approx(a.basis["op_sum_time"], rel=1e-6)
    assert "op-level time" in b.explain()


def test_backward_matmuls_are_costed_as_the_forward_kernels_they_are(
    op_model: OpTimeModel,
) -> None:
    """Opbench's backward of a linear is one ``backward()`` of two ``mm`` kernels plus the
    autograd engine; a traced backward ``mm`` is one kernel, costed by the forward model.
    A backward-only group (a conv's ``convolution_backward``) keeps the backward model."""
    h100 = get_device("H100")
    # (op, phase, dtype, class, flops, bytes, steps, count): a matmul node, fwd then bwd
    mm = ("mm", 0, 0, 0, 2e9, 6e6, 1, 1)
    fwd = op_model.step_features([mm], h100)
    bwd = op_model.step_features([(*mm[:1], 1, *mm[2:])], h100)
    assert bwd["optime_bwd_ms"] == pytest.approx(fwd["optime_fwd_ms"], rel=1e-9)
    assert fwd["kernels_fwd"] == 1 and bwd["kernels_bwd"] == 1 and bwd["kernels_fwd"] == 0
    conv = ("convolution_backward", 1, 0, 0, 2e9, 6e6, 1, 1)
    as_bwd = op_model.step_features([conv], h100)["optime_bwd_ms"]
    as_fwd = op_model.step_features([("convolution", 0, 0, 0, 2e9, 6e6, 1, 1)], h100)
    assert as_bwd != pytest.approx(as_fwd["optime_fwd_ms"], rel=1e-3)
    # the kernel time is the op sum less the launches and the step overhead
    f = op_model.step_features([mm, (*mm[:1], 1, *mm[2:])], h100)
    assert f["optime_kernel_ms"] == pytest.approx(f["optime_ms"] - 2.0 - 2 * 5e-3, rel=1e-6)


def test_a_kernel_past_the_timed_sizes_is_scaled_up_from_the_largest(
    op_model: OpTimeModel, tmp_path: Path
) -> None:
    """Trees do not extrapolate: a matmul 10x larger than any timed one would cost what the
    largest costs. Past the range it is the largest-in-range prediction times its size."""
    h100 = get_device("H100")
    top_flops, top_bytes = op_model.info_["range"]["matmul"]
    assert top_flops > 1e9 and top_bytes > 1e7  # the synthetic linear rows' largest

    def kernel_ms(model: OpTimeModel, times: float) -> float:
        node = ("mm", 0, 0, 0, top_flops * times, top_bytes * times, 1, 1)
        return float(model.step_features([node], h100)["optime_kernel_ms"])

    at_top, past = kernel_ms(op_model, 1.0), kernel_ms(op_model, 10.0)
    assert past == pytest.approx(10 * at_top, rel=1e-6)
    # a model saved before the range was recorded predicts as fitted: in range the same,
    # past it saturated (what the scaling corrects)
    unranged = OpTimeModel()
    unranged.model_ = op_model.model_
    unranged.info_ = {k: v for k, v in op_model.info_.items() if k != "range"}
    assert kernel_ms(unranged, 0.1) == pytest.approx(kernel_ms(op_model, 0.1), rel=1e-9)
    assert kernel_ms(unranged, 10.0) < 2 * at_top
    # the range travels with the saved model
    entry = op_model.save(tmp_path / "optime.cbm")
    loaded = OpTimeModel.load(tmp_path, json.loads(json.dumps(entry)))
    assert kernel_ms(loaded, 10.0) == pytest.approx(past, rel=1e-9)


def test_a_cpu_op_model_keeps_whole_forward_calls_and_sums_without_launches(
    cpu_op_model: OpTimeModel,
) -> None:
    """A CPU step is its ops' calls one after another: a forward's timed call is kept whole;
    a backward sample loses the autograd engine's set-up, which a step pays once."""
    rows = _cpu_rows(12)
    _, y = op_samples(rows)
    linear = rows[0]
    assert math.exp(y[0]) == pytest.approx(linear["times"]["fwd_s"] - CPU_HARNESS_FLOOR_S[0])
    assert math.exp(y[1]) == pytest.approx(linear["times"]["bwd_s"] - CPU_HARNESS_FLOOR_S[1])
    assert CPU_HARNESS_FLOOR_S[0] == 0.0 < CPU_HARNESS_FLOOR_S[1]
    assert cpu_op_model.kind == "cpu" and cpu_op_model.info_["device"] == "CPU"
    table = node_table(ca.dry_run(_spec(bs=4)))
    cpu = cpu_op_model.step_features(table, get_device("CPU"))
    # no launch overhead and no step overhead: the op sum is the kernels' sum
    assert cpu["optime_ms"] == pytest.approx(
        cpu["optime_fwd_ms"] + cpu["optime_bwd_ms"] + cpu["optime_opt_ms"], rel=1e-9
    )
    assert cpu["optime_ms"] == pytest.approx(cpu["optime_kernel_ms"], rel=1e-9)
    assert cpu["optime_ms"] > 0 and cpu["kernels_fwd"] > 0
    # a GPU is another kind: the CPU's timings say nothing about it
    assert all(
        math.isnan(v) for v in cpu_op_model.step_features(table, get_device("H100")).values()
    )


def test_op_models_are_fitted_per_device_kind_and_saved_side_by_side(
    op_model: OpTimeModel, cpu_op_model: OpTimeModel, tmp_path: Path
) -> None:
    models, skipped = fit_op_models([*_op_rows(), *_cpu_rows()], iterations=20, depth=3)
    assert sorted(m.kind for m in models) == ["cpu", "cuda"] and skipped == []
    assert {m.kind: m.info_["rows"] for m in models} == {"cuda": 241, "cpu": 241}
    # too few CPU timings for a model: the GPU's is fitted, and the reason is given
    models, skipped = fit_op_models([*_op_rows(), *_cpu_rows(3)], iterations=20, depth=3)
    assert [m.kind for m in models] == ["cuda"] and "no cpu op model" in skipped[0]
    # one model per kind: of two GPUs' rows, the one with more timings is learned, and the
    # other's rows are left out and said so, whichever order the rows come in
    a100 = [
        {**r, "id": f"a-{r['id']}", "device_name": "NVIDIA A100-SXM4-80GB"} for r in _op_rows(20)
    ]
    for rows in ([*_op_rows(), *a100], [*a100, *_op_rows()]):
        models, skipped = fit_op_models(rows, iterations=20, depth=3)
        assert [(m.kind, m.info_["device"], m.info_["rows"]) for m in models] == [
            ("cuda", "H100-SXM", 241)
        ]
        assert len(skipped) == 1 and skipped[0].startswith("21 cuda op rows of A100-80GB left out")
    # the larger device's rows are too few: no model for the kind, and both reasons are given
    models, skipped = fit_op_models([*_op_rows(3), *a100[:2]], iterations=20, depth=3)
    assert models == [] and len(skipped) == 2 and "no cuda op model" in skipped[1]

    model = ca.CostModel(iterations=30, depth=3)
    model.add_op_model(op_model)
    model.add_op_model(cpu_op_model)
    assert model.op_model("cpu") is cpu_op_model and model.op_model("cuda") is op_model
    obs = []
    for fam, widths in (("a", (4, 8)), ("b", (12, 16)), ("c", (20, 24))):
        for w in widths:
            for bs in (4, 16, 64):
                f = model.features(_spec(w, bs), "CPU")
                assert f["optime_ms"] > 0  # the CPU's own op sum
                obs.append(
                    Observation(
                        features=f,
                        device="CPU",
                        peak_memory=f["analytic_reserved_mib"] * 2**20,
                        iteration_time=f["optime_ms"] / 1e3 * (2.0 + 0.01 * w),
                        family=fam,
                    )
                )
    model.fit(obs)
    model.save(tmp_path)
    assert {"optime.cbm", "optime-cpu.cbm"} <= {p.name for p in tmp_path.iterdir()}
    entries = json.loads((tmp_path / "manifest.json").read_text())["models"]
    assert entries["op_time"]["device"] == "H100-SXM" and entries["op_time_cpu"]["device"] == "CPU"
    loaded = ca.CostModel.load(tmp_path)
    assert loaded.op_model("cpu") is not None and loaded.op_model("cuda") is not None
    a, b = model.predict(_spec(10, 8), "CPU"), loaded.predict(_spec(10, 8), "CPU")
    assert b.iteration_time == pytest.approx(a.iteration_time, rel=1e-6)
    assert b.basis["op_sum_time"] == pytest.approx(a.basis["op_sum_time"], rel=1e-6)


def _optimizer_rows(n: int = 300, seed: int = 2) -> list[dict[str, Any]]:
    """CPU opbench optimizer cases as opbench describes them: an analytic count per
    parameter (SGD with momentum 3 FLOPs and 5 elements, Adam 12 and 7) and a time of
    bandwidth plus a cost per parameter tensor."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        op = ("sgd", "adam")[i % 2]
        numel = round(10 ** rng.uniform(2, 6.5))
        tensors = min(numel, round(10 ** rng.uniform(0, 2)))
        flops, nbytes = (3 * numel, 20 * numel) if op == "sgd" else (12 * numel, 28 * numel)
        rows.append(
            {
                "kind": "op",
                "id": f"{op}-opt-{i}",
                "op": op,
                "params": {"numel": numel, "tensors": tensors, "split_seed": i},
                "dtype": "fp32",
                "direction": "step",
                "flops": {"step": flops},
                "bytes": {"step": nbytes},
                "times": {"total_s": 2e-5 * tensors + nbytes / 2e10, "timer": "perf_counter"},
                "status": "ok",
                "device": "cpu",
                "device_name": "CPU",
            }
        )
    return rows


@pytest.mark.parametrize(
    ("optimizer", "kwargs", "per_param"),
    [("adam", {}, (12, 28)), ("sgd", {"momentum": 0.9}, (3, 20))],
)
def test_the_optimizer_step_is_priced_as_opbench_describes_it(
    optimizer: str, kwargs: dict[str, Any], per_param: tuple[int, int]
) -> None:
    """A trace's optimizer nodes are elementwise ops without FLOPs that count every pass
    over the parameters; the op model learned opbench's analytic count of a whole step.
    The node table's step row gives it that count, so a step costs what its cases did."""
    model = OpTimeModel(iterations=300, depth=4).fit(_optimizer_rows())
    spec = ca.TrainingSpec(
        model=functools.partial(tiny_cnn, width=32),
        batch=ca.ImageBatch((3, 32, 32), classes=10),
        batch_size=4,
        optimizer=optimizer,
        optimizer_kwargs=kwargs,
    )
    trace = ca.dry_run(spec)
    table = node_table(trace)
    steps = [t for t in table if t[0] == OPTIMIZER_STEP]
    n = trace.stepped_numel
    assert n == trace.param_count > 0
    assert len(steps) == 1
    _, phase, _, _, flops, nbytes, serial, count = steps[0]
    assert (phase, flops, nbytes) == (2, per_param[0] * n, per_param[1] * n)
    assert (serial, count) == (trace.param_tensors, 0)
    feats = model.step_features(table, get_device("CPU"))
    expected_ms = (2e-5 * trace.param_tensors + per_param[1] * n / 2e10) * 1e3
    assert feats["optime_opt_ms"] == pytest.approx(expected_ms, rel=0.3)
    # the step row is no kernel: the optimizer's kernels are its nodes
    assert feats["kernels_opt"] == sum(t[7] for t in table if t[1] == 2 and t[0] != OPTIMIZER_STEP)


def test_an_optimizer_sample_runs_its_tensors_in_sequence() -> None:
    rows = _optimizer_rows(4)
    x, _ = op_samples(rows)
    assert x[:, 6].tolist() == pytest.approx([math.log10(r["params"]["tensors"]) for r in rows])
