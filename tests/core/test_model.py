from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import random
import re
import shutil
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import costaware as ca
from costaware.core.model import Observation, benchmark_search_peak
from tests.conftest import tiny_cnn

MiB = 2**20


def test_unfitted_model_predicts_the_analytic_estimate(cnn_spec: ca.TrainingSpec) -> None:
    model = ca.CostModel()
    pred = model.predict(cnn_spec, device="H100")
    assert pred.kind == "analytic" and pred.coverage is None
    assert pred.device == "H100-SXM"
    assert 0 < pred.peak_memory <= pred.peak_memory_upper
    # reserved = simulated allocator peak + workspace, never below the live peak
    assert pred.peak_memory >= pred.basis["live_peak"]
    assert pred.iteration_time > 0 and pred.iteration_time_upper >= pred.iteration_time
    assert pred.epoch_time == pytest.approx(pred.iteration_time * cnn_spec.steps_per_epoch)
    text = pred.explain()
    assert (
        "analytic estimate only" in text and "FLOPs" in text and "simulated allocator peak" in text
    )
    assert "H100-SXM" in repr(pred)
    assert "min_capacity=" in repr(pred)  # the figure a budget decides on, beside the peak
    json.dumps(pred.to_dict(), default=str)


def test_default_model_and_cpu_device(cnn_spec: ca.TrainingSpec) -> None:
    pred = ca.CostModel().predict(cnn_spec, device="cpu")
    assert pred.device == "CPU"
    # no caching allocator on the CPU: the analytic peak is the exact live peak of the
    # tensors and of the kernels' buffers inside ops (oneDNN's blocked copies), each block
    # at its own size (the trace's live peak rounds each to 512 B, as CUDA's does)
    from costaware.core.trace import exact_live_peak

    assert pred.peak_memory == pred.basis["simulated_reserved"]
    assert pred.peak_memory == exact_live_peak(ca.dry_run(cnn_spec).allocator_events())
    assert pred.peak_memory >= 0.9 * pred.basis["live_peak"]
    shipped = ca.CostModel.default().predict(cnn_spec, device="cpu")
    assert shipped.device == "CPU" and shipped.peak_memory_upper >= shipped.peak_memory > 0
    auto = ca.CostModel().predict(cnn_spec)  # "auto": no GPU here, so the CPU
    assert auto.device in ca.known_devices() or auto.device


def test_a_gpu_step_holds_cublas_workspace_only_where_it_calls_cublas(
    cnn_spec: ca.TrainingSpec,
) -> None:
    """The H100 and H200 peaks of models without a matmul differed by cuBLAS's workspace:
    a step that calls no cuBLAS never allocates it, one with a linear layer does."""
    from costaware.core.analytic import CUBLAS_WORKSPACE_BYTES, WORKSPACE_BYTES

    def conv_only() -> torch.nn.Module:  # the classifier is a 1x1 convolution
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 10, 1),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
        )

    convs = dataclasses.replace(cnn_spec, model=conv_only)
    model = ca.CostModel()
    with_linear = model.predict(cnn_spec, device="H100")
    without = model.predict(convs, device="H100")
    assert with_linear.basis["workspace"] == WORKSPACE_BYTES + CUBLAS_WORKSPACE_BYTES
    assert without.basis["workspace"] == WORKSPACE_BYTES
    assert model.predict(convs, device="cpu").basis["workspace"] == 0
    for spec, calls in ((cnn_spec, 1.0), (convs, 0.0)):
        assert model.features(spec, "H100", exact=True)["calls_cublas"] == calls


def test_unknown_device_lists_the_catalog(cnn_spec: ca.TrainingSpec) -> None:
    with pytest.raises(ca.UnknownDeviceError, match="H100-SXM"):
        ca.CostModel().predict(cnn_spec, device="H1000")


def test_memory_grows_with_batch_and_warm_predictions_reuse_the_trace(
    cnn_spec: ca.TrainingSpec,
) -> None:
    model = ca.CostModel()
    small = model.predict(cnn_spec, device="A100-80GB")
    second = model.predict(cnn_spec.with_batch_size(48), device="A100-80GB")
    big = model.predict(cnn_spec.with_batch_size(256), device="A100-80GB")
    other_lr = model.predict(
        dataclasses.replace(cnn_spec, optimizer_kwargs={"lr": 0.5}), device="A100-80GB"
    )
    assert small.basis["trace_source"] == "traced"
    assert second.basis["trace_source"] == "traced"  # an architecture's second batch size
    assert big.basis["trace_source"] == "rescaled (two traces)"
    assert other_lr.basis["trace_source"] == "cached"
    assert big.peak_memory > second.peak_memory > small.peak_memory
    assert other_lr.peak_memory == small.peak_memory
    exact = model.predict(cnn_spec.with_batch_size(256), device="A100-80GB", exact=True)
    assert exact.basis["trace_source"] == "traced"
    # interpolated between two traces, every storage size is exact
    assert exact.basis["live_peak"] == big.basis["live_peak"]
    assert exact.peak_memory == big.peak_memory


class _Views(torch.nn.Module):
    """A small MLP whose forward repeats the batch ``views`` times (a multi-view
    augmentation), with a settings object of its own as a Hugging Face model holds its
    config; ``freeze`` trains the head alone."""

    class Settings:
        def __init__(self, views: int) -> None:
            self._views = views

    def __init__(self, views: int, freeze: bool) -> None:
        super().__init__()
        self.settings = self.Settings(views)
        self.body = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU())
        self.head = torch.nn.Linear(512, 10)
        self.body.requires_grad_(not freeze)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x.repeat(self.settings._views, 1)))  # type: ignore[no-any-return]


def test_models_alike_but_for_what_trains_or_a_setting_are_traced_apart() -> None:
    """Two models given as modules with the same layers are the same architecture to the
    trace cache only where the same parameters train and their plain settings agree: a
    frozen body, or a setting read in the forward, changes the step."""

    def spec(views: int, freeze: bool) -> ca.TrainingSpec:
        return ca.TrainingSpec(
            model=_Views(views, freeze),
            batch=ca.ImageBatch((64,), classes=10),
            batch_size=32,
            loss=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1].repeat(m.settings._views)),
        )

    model = ca.CostModel()
    base = model.predict(spec(1, False), device="H100")
    again = model.predict(spec(1, False), device="H100")  # another instance, alike
    frozen = model.predict(spec(1, True), device="H100")
    views = model.predict(spec(4, False), device="H100")
    assert again.basis["trace_source"] == "cached" and again.peak_memory == base.peak_memory
    assert frozen.basis["trace_source"] == views.basis["trace_source"] == "traced"
    assert frozen.basis["breakdown"]["gradients"] < base.basis["breakdown"]["gradients"]
    assert views.basis["flops"] > 3 * base.basis["flops"]


class _Config:
    """A settings object the model's construction completes, as a Hugging Face config
    settles its attention implementation when the model is built."""

    def __init__(self, width: int) -> None:
        self.width = width
        self._settled: str | None = None


def _from_config(config: _Config) -> torch.nn.Module:
    config._settled = config._settled or "sdpa"
    return torch.nn.Sequential(torch.nn.Linear(64, config.width), torch.nn.Linear(config.width, 10))


def test_a_factory_over_a_settings_object_is_warm_from_its_second_batch_size() -> None:
    """The object's key changes with the first build; the trace made then is kept under
    both keys, so the architecture's second batch size is its second dry run and the
    third is rescaled, as for any other factory, with no model built to key it."""
    config = _Config(128)
    spec = ca.TrainingSpec(
        model=lambda: _from_config(config), batch=ca.ImageBatch((64,), classes=10), batch_size=8
    )
    model = ca.CostModel()
    sources = [
        model.predict(spec.with_batch_size(b), device="H100").basis["trace_source"]
        for b in (8, 16, 24, 8)
    ]
    assert sources == ["traced", "traced", "rescaled (two traces)", "cached"]


def test_autocast_weight_gradients_do_not_grow_with_the_batch() -> None:
    """Under autocast, the half-precision weight gradients are backward temporaries the
    size of the weights: one trace alone scales them with the batch; two do not."""
    spec = ca.TrainingSpec(
        model=lambda: torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(64, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 1024),
            torch.nn.ReLU(),
            torch.nn.Linear(1024, 10),
        ),
        batch=ca.ImageBatch((64,), classes=10),
        batch_size=8,
        precision="bf16",
    )
    model = ca.CostModel()
    model.predict(spec, device="H100")
    model.predict(spec.with_batch_size(16), device="H100")
    far = model.predict(spec.with_batch_size(2048), device="H100")
    exact = ca.CostModel().predict(spec.with_batch_size(2048), device="H100")
    assert far.basis["trace_source"] == "rescaled (two traces)"
    assert far.basis["live_peak"] == exact.basis["live_peak"]


def test_expandable_segments_reserve_less(cnn_spec: ca.TrainingSpec) -> None:
    spec = cnn_spec.with_batch_size(128)
    model = ca.CostModel()
    default = model.predict(spec, device="H100")
    expandable = model.predict(
        dataclasses.replace(spec, allocator="expandable_segments"), device="H100"
    )
    assert expandable.peak_memory <= default.peak_memory


def test_benchmark_mode_predicts_the_steps_need_and_says_so(cnn_spec: ca.TrainingSpec) -> None:
    # cuDNN's benchmark search takes a workspace sized to the free memory: not a need
    model = ca.CostModel()
    off = model.predict(cnn_spec, device="H100")
    on = model.predict(dataclasses.replace(cnn_spec, cudnn_benchmark=True), device="H100")
    assert on.peak_memory == off.peak_memory
    assert on.peak_memory_upper == off.peak_memory_upper
    assert any("cudnn.benchmark" in n and "free memory" in n for n in on.notes)
    assert not any("cudnn.benchmark" in n for n in off.notes)
    # no convolution, nothing to search: no note
    mlp = ca.TrainingSpec(
        model=lambda: torch.nn.Linear(8, 2),
        batch=ca.ImageBatch((8,), classes=2),
        batch_size=4,
        cudnn_benchmark=True,
    )
    assert not any("cudnn.benchmark" in n for n in model.predict(mlp, device="H100").notes)


def test_fit_leaves_benchmark_search_peaks_out_of_memory() -> None:
    model = ca.CostModel(iterations=20)
    obs = _observations(model, [4, 8], "a") + _observations(model, [12, 16], "b")
    searched, unmeasured = [], []
    for o in _observations(model, [20, 24], "c"):  # conv nets under benchmark mode
        feats = {**o.features, "cudnn_benchmark": 1.0}
        searched.append(dataclasses.replace(o, features=feats, peak_memory=o.peak_memory * 9))
        unmeasured.append(dataclasses.replace(o, features=feats, peak_memory=None))
    assert all(benchmark_search_peak(o.features) for o in searched)
    assert not any(benchmark_search_peak(o.features) for o in obs)
    assert not benchmark_search_peak({**searched[0].features, "device_is_cpu": 1.0})
    mixed = ca.CostModel(iterations=20).fit(obs + searched)
    without = ca.CostModel(iterations=20).fit(obs + unmeasured)
    # the 9x peaks count as no peak at all: same memory point and bound; times still count
    for row in (obs[3].features, searched[0].features):
        base = mixed.baseline(row)
        guess = (base[0], base[0], base[1], base[1])
        assert mixed.correct(row, guess) == without.correct(row, guess)
    mem, secs = mixed.baseline(obs[3].features)
    assert mixed.correct(obs[3].features, (mem, mem, secs, secs))[0] < obs[3].peak_memory * 2


def test_predict_rejects_non_specs() -> None:
    with pytest.raises(ca.CostawareError, match="TrainingSpec"):
        ca.CostModel().predict("resnet50", device="H100")  # type: ignore[arg-type]


def _observations(model: ca.CostModel, widths: list[int], family: str) -> list[Observation]:
    """Synthetic 'measurements': the analytic reserved peak times a width-dependent factor."""
    rows = []
    for w in widths:
        for bs in (4, 8, 16, 32, 64):
            spec = ca.TrainingSpec(
                model=functools.partial(tiny_cnn, width=w),
                batch=ca.ImageBatch((3, 32, 32), classes=10),
                batch_size=bs,
            )
            feats = model.features(spec, "H100")
            factor = 1.3 + 0.002 * w  # a smooth, learnable bias of the analytic estimate
            rows.append(
                Observation(
                    features=feats,
                    device="H100-SXM",
                    meta={"spec": spec},
                    peak_memory=feats["analytic_reserved_mib"] * MiB * factor,
                    iteration_time=feats["analytic_time_ms"] / 1e3 * (2.0 + 0.001 * bs),
                    family=family,
                )
            )
    return rows


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[ca.CostModel, Path]:
    # trees for memory too (the default is a line): this fixture tests .cbm persistence
    model = ca.CostModel(iterations=200, depth=4, memory_model="trees")
    obs = _observations(model, [4, 8, 12], "a") + _observations(model, [16, 20, 24], "b")
    obs += _observations(model, [28, 32], "c")
    model.fit(obs)
    path = tmp_path_factory.mktemp("model")
    model.save(path)
    return model, path


def test_fit_learns_the_residual(fitted: tuple[ca.CostModel, Path]) -> None:
    model, _ = fitted
    assert model.is_fitted and model.training_["rows"] == 40
    spec = ca.TrainingSpec(
        model=functools.partial(tiny_cnn, width=10),
        batch=ca.ImageBatch((3, 32, 32), classes=10),
        batch_size=24,
    )
    pred = model.predict(spec, device="H100")
    analytic = ca.CostModel().predict(spec, device="H100")
    truth = analytic.peak_memory * (1.3 + 0.002 * 10)
    assert pred.kind == "learned" and pred.coverage == model.achieved_coverage()
    assert (
        pred.coverage is not None and 0.5 < pred.coverage <= 0.95
    )  # few calibration rows: below nominal
    assert abs(pred.peak_memory - truth) / truth < abs(analytic.peak_memory - truth) / truth
    assert abs(pred.peak_memory - truth) / truth < 0.05
    assert pred.iteration_time == pytest.approx(
        (2.0 + 0.001 * 24) * analytic.iteration_time, rel=0.1
    )
    assert pred.peak_memory_upper >= pred.peak_memory
    assert "learned residual" in pred.explain()


def test_save_load_round_trip_without_pickle(
    fitted: tuple[ca.CostModel, Path], cnn_spec: ca.TrainingSpec
) -> None:
    model, path = fitted
    files = sorted(p.name for p in path.iterdir())
    assert files == ["manifest.json", "memory.cbm", "time.cbm"]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["feature_version"] and manifest["training"]["devices"] == ["H100-SXM"]
    assert manifest["training"]["data_hash"]
    loaded = ca.CostModel.load(path)
    a, b = model.predict(cnn_spec, device="H100"), loaded.predict(cnn_spec, device="H100")
    assert b.peak_memory == pytest.approx(a.peak_memory, rel=1e-4)
    assert b.peak_memory_upper == pytest.approx(a.peak_memory_upper, rel=1e-4)
    assert a.iteration_time == pytest.approx(b.iteration_time, rel=1e-4)


def test_load_refuses_another_feature_version(
    fitted: tuple[ca.CostModel, Path], tmp_path: Path
) -> None:
    _, path = fitted
    for f in path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["feature_version"] = "0"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ca.CostawareError, match="feature version"):
        ca.CostModel.load(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"manifest\.json"):
        ca.CostModel.load(tmp_path / "nowhere")


def test_unfitted_save_and_empty_fit_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ca.NotFittedError):
        ca.CostModel().save(tmp_path)
    with pytest.raises(ValueError, match="at least one"):
        ca.CostModel().fit([])
    with pytest.raises(ValueError, match="analytic_reserved_mib"):
        ca.CostModel().fit([Observation(features={"x": 1.0}, device="H100-SXM", peak_memory=1.0)])


def test_conformal_quantile() -> None:
    from costaware.core.conformal import _conformal_quantile

    r = np.arange(1, 100, dtype=float)  # 99 residuals
    assert _conformal_quantile(r, 0.95) == (95.0, 0.95)  # the ceil(100 * 0.95) = 95th smallest
    small = np.array([0.1, 0.2, 0.3])
    # too few rows for 95%: the guarantee is only 3/4, and the quantile is the Student-t
    # prediction bound mean + t(0.95, 2) * sd * sqrt(1 + 1/3) = 0.2 + 2.92 * 0.1 * 1.155
    q, level = _conformal_quantile(small, 0.95)
    assert level == 0.75 and q == pytest.approx(0.2 + 2.919986 * 0.1 * math.sqrt(4 / 3))
    # ... or the largest residual, where an outlier puts it above the t bound
    assert _conformal_quantile(np.array([0.0] * 10 + [5.0]), 0.95)[0] == 5.0
    assert _conformal_quantile(np.array([0.4]), 0.95) == (0.4, 0.5)  # one row: no spread
    assert math.isnan(_conformal_quantile(np.array([]), 0.95)[0])


def test_constant_targets_fit_save_and_load(tmp_path: Path, cnn_spec: ca.TrainingSpec) -> None:
    model = ca.CostModel(iterations=50, depth=2)
    obs = _observations(model, [4, 8], "a")
    for o in obs:
        o.iteration_time = o.features["analytic_time_ms"] / 1e3 * 3.0  # exactly 3x, always
    model.fit(obs).save(tmp_path)
    loaded = ca.CostModel.load(tmp_path)
    analytic = ca.CostModel().predict(cnn_spec, device="H100")
    assert loaded.predict(cnn_spec, device="H100").iteration_time == pytest.approx(
        3.0 * analytic.iteration_time
    )


def test_refit_on_top_of_a_fitted_base(fitted: tuple[ca.CostModel, Path], tmp_path: Path) -> None:
    base, _ = fitted
    # the "user's hardware" is 1.5x slower and uses 10% more memory than the base predicts
    rows = []
    for w in (6, 14):
        for bs in (8, 32):
            spec = ca.TrainingSpec(
                model=functools.partial(tiny_cnn, width=w),
                batch=ca.ImageBatch((3, 32, 32), classes=10),
                batch_size=bs,
            )
            pred = base.predict(spec, device="H100")
            rows.append(
                Observation(
                    features=base.features(spec, "H100"),
                    device="H100-SXM",
                    peak_memory=pred.peak_memory * 1.1,
                    iteration_time=pred.iteration_time * 1.5,
                )
            )
    online = ca.CostModel().fit(rows, base=base)
    spec = ca.TrainingSpec(
        model=functools.partial(tiny_cnn, width=10),
        batch=ca.ImageBatch((3, 32, 32), classes=10),
        batch_size=16,
    )
    before, after = base.predict(spec, device="H100"), online.predict(spec, device="H100")
    assert after.iteration_time == pytest.approx(1.5 * before.iteration_time, rel=0.02)
    assert after.peak_memory == pytest.approx(1.1 * before.peak_memory, rel=0.02)
    online.save(tmp_path / "online")
    assert (tmp_path / "online" / "base" / "manifest.json").is_file()
    again = ca.CostModel.load(tmp_path / "online").predict(spec, device="H100")
    assert again.iteration_time == pytest.approx(after.iteration_time, rel=1e-4)


def test_a_model_learned_on_gpus_is_not_applied_to_the_cpu(
    fitted: tuple[ca.CostModel, Path], cnn_spec: ca.TrainingSpec
) -> None:
    model, _ = fitted  # trained on H100 rows only
    assert model.covers("A10") and not model.covers("cpu")
    cpu = model.predict(cnn_spec, device="cpu")
    assert cpu.kind == "analytic" and any("saw no CPU measurements" in n for n in cpu.notes)
    assert model.predict(cnn_spec, device="A10").kind == "learned"


def test_each_device_kind_gets_its_own_bound(tmp_path: Path, cnn_spec: ca.TrainingSpec) -> None:
    """Noisy CPU rows must not widen the GPU bound of a model fitted on both kinds."""
    model = ca.CostModel(iterations=100, depth=4, calibration_fraction=0.4)
    rng = np.random.default_rng(0)
    obs = []
    for fam, widths in zip(
        "abcde", ([4, 8, 12], [16, 20, 24], [28, 32, 36], [6, 10, 14], [18, 22, 26])
    ):
        gpu = _observations(model, widths, fam)
        obs += gpu
        for o in gpu:  # the same configurations "measured" on the CPU, with +-60% noise
            feats = model.features(o.meta["spec"], "cpu")
            noise = float(np.exp(rng.uniform(-0.6, 0.6)))
            obs.append(
                Observation(
                    features=feats,
                    device="cpu" if fam in "ab" else "CPU",  # any spelling of the CPU's name
                    peak_memory=feats["analytic_reserved_mib"] * MiB * 1.1 * noise,
                    iteration_time=feats["analytic_time_ms"] / 1e3 * 3.0 * noise,
                    family=fam,
                )
            )
    model.fit(obs)
    assert sorted(model.kinds_) == ["cpu", "cuda"]
    q_gpu, q_cpu = (max(0.0, model.kinds_[k].memory_.q) for k in ("cuda", "cpu"))
    assert q_cpu > q_gpu + 0.2  # the CPU bound is wide, the GPU one is not dragged along
    gpu = model.predict(cnn_spec, device="H100")
    assert gpu.peak_memory_upper / gpu.peak_memory == pytest.approx(math.exp(q_gpu), rel=1e-6)
    # from a feature row, each kind's model gives the baseline and the corrections
    guess = (1e8, 1.2e8, 0.01, 0.02)
    for kind in ("cuda", "cpu"):
        row, sub = obs[0].features, model.kinds_[kind]
        assert model.baseline(row, kind) == sub.baseline(row)
        assert model.correct(row, guess, kind) == sub.correct(row, guess)
    assert model.correct(obs[0].features, guess, "cpu") != model.correct(
        obs[0].features, guess, "cuda"
    )
    # the GPU part is exactly what the GPU rows alone give: the CPU rows do not leak in
    alone = ca.CostModel(iterations=100, depth=4, calibration_fraction=0.4)
    alone.fit([o for o in obs if o.device.upper() != "CPU"])
    solo = alone.predict(cnn_spec, device="H100")
    assert gpu.peak_memory == pytest.approx(solo.peak_memory, rel=1e-4)
    assert gpu.iteration_time == pytest.approx(solo.iteration_time, rel=1e-4)
    cpu = model.predict(cnn_spec, device="cpu")
    assert cpu.kind == "learned" and model.covers("cpu") and model.covers("H100")
    assert model.achieved_coverage("cuda") is not None
    loaded = ca.CostModel.load(model.save(tmp_path / "m"))
    assert json.loads((tmp_path / "m" / "manifest.json").read_text())["kinds"] == ["cpu", "cuda"]
    for which in ("memory", "time"):
        for kind in ("cuda", "cpu"):
            got, want = (getattr(m.kinds_[kind], f"{which}_").q for m in (loaded, model))
            assert got == pytest.approx(want)
    again = loaded.predict(cnn_spec, device="cpu")
    assert again.peak_memory_upper == pytest.approx(cpu.peak_memory_upper, rel=1e-3)
    assert again.iteration_time == pytest.approx(cpu.iteration_time, rel=1e-3)


def test_small_sample_refit_learns_one_factor_per_precision(
    tmp_path: Path, cnn_spec: ca.TrainingSpec
) -> None:
    """A handful of trials: fp32 runs 2x its estimate, bf16 (no bf16 arithmetic) 10x.

    One pooled factor would put fp32 at the median of both and widen the bound by the
    outlier; per precision, fp32 gets its own factor and a tight bound, bf16 (measured
    twice) its own, and fp16 (never measured) keeps the analytic estimate and bound.
    """
    base = ca.CostModel()

    def spec(width: int, precision: str, bs: int = 8) -> ca.TrainingSpec:
        return dataclasses.replace(
            cnn_spec,
            model=functools.partial(tiny_cnn, width=width),
            precision=precision,
            batch_size=bs,
        )

    rows = []
    for width, precision, factor in [
        (4, "fp32", 2.0),
        (6, "fp32", 2.1),
        (8, "fp32", 1.9),
        (10, "fp32", 2.0),
        (4, "bf16", 10.0),
        (8, "bf16", 11.0),
    ]:
        s = spec(width, precision)
        feats = base.features(s, "CPU")
        rows.append(
            Observation(
                features=feats,
                device="CPU",
                iteration_time=feats["analytic_time_ms"] / 1e3 * factor,
            )
        )
    model = ca.CostModel().fit(rows)
    assert model.training_["rows"] == 6
    for m in (model, (model.save(tmp_path), ca.CostModel.load(tmp_path))[1]):
        fp32, analytic32 = m.predict(spec(12, "fp32"), "CPU"), base.predict(spec(12, "fp32"), "CPU")
        assert fp32.iteration_time == pytest.approx(2.0 * analytic32.iteration_time, rel=0.03)
        # the bound follows the residuals' spread within each precision (±5%, widened for
        # having only 6 of them), not the 5x between fp32 and bf16
        assert fp32.iteration_time < fp32.iteration_time_upper <= 1.25 * fp32.iteration_time
        bf16 = m.predict(spec(12, "bf16"), "CPU")
        analytic16 = base.predict(spec(12, "bf16"), "CPU")
        assert bf16.iteration_time == pytest.approx(10.5 * analytic16.iteration_time, rel=0.03)
        fp16, analytic_fp16 = (
            m.predict(spec(12, "fp16"), "CPU"),
            base.predict(spec(12, "fp16"), "CPU"),
        )
        assert fp16.iteration_time == pytest.approx(analytic_fp16.iteration_time, rel=1e-6)
        assert fp16.iteration_time_upper == pytest.approx(
            analytic_fp16.iteration_time_upper, rel=1e-6
        )


def test_a_refit_adds_the_time_between_steps_rather_than_multiplying_it(
    tmp_path: Path, cnn_spec: ca.TrainingSpec
) -> None:
    """Two small trials whose steps ran 1.5x their prediction and whose epochs took 10 ms a
    step more (data loading, the loop's hooks): a larger model is predicted at 1.5x its
    step plus 10 ms, not at the 1.5x-plus-overhead factor of the small ones."""
    base = ca.CostModel()

    def spec(width: int) -> ca.TrainingSpec:
        return dataclasses.replace(cnn_spec, model=functools.partial(tiny_cnn, width=width))

    rows = []
    for width in (4, 5):
        feats = base.features(spec(width), "CPU")
        step = 1.5 * feats["analytic_time_ms"] / 1e3
        rows.append(
            Observation(
                features=feats,
                device="CPU",
                iteration_time=step,
                meta={"step_time": step, "step_gap": 0.01},
            )
        )
    small = base.predict(spec(4), "CPU").iteration_time
    assert 1.5 * small + 0.01 > 3 * small  # the gap is most of a small trial's step
    model = ca.CostModel(**base.get_params()).fit(rows, base=base)
    for m in (model, (model.save(tmp_path), ca.CostModel.load(tmp_path))[1]):
        assert m.step_gap_ == pytest.approx(0.01)
        big, shipped = m.predict(spec(24), "CPU"), base.predict(spec(24), "CPU")
        assert big.iteration_time == pytest.approx(1.5 * shipped.iteration_time + 0.01, rel=0.02)
        assert big.basis["step_gap"] == pytest.approx(0.01)
        assert any(n.startswith("plus 10.0 ms a step between steps") for n in big.notes)
        assert big.epoch_time == pytest.approx(big.iteration_time * big.spec["steps_per_epoch"])


def test_a_fixed_excess_is_held_as_seconds_beyond_the_rows_and_a_factor_stays_one() -> None:
    """Small rows whose steps carry a fixed cost (1 ms predicted, 5 ms measured): beyond
    them the excess is added, 4 ms, not multiplied (a 1 s step is not 5 s). Rows whose
    excess grows with their size (every time 1.6x) keep the factor beyond them, and a
    shortfall (a faster machine) stays a factor too."""
    from costaware.core.residuals import _PrecisionLine, _small_sample_line, _spans

    def line(base: list[float], measured: list[float]) -> _PrecisionLine:
        lb = np.log(base)
        y = np.log(measured) - lb
        g = np.full(len(base), "fp32", dtype=object)
        by, slope, _ = _small_sample_line(y, lb, g)
        return _PrecisionLine(by, {"fp32": 0}, slope, _spans(y, lb, g))

    x = np.ones((1, 1))
    fixed = line([1e-3, 1.1e-3], [5e-3, 5.1e-3])
    # about 4 ms (the median factor's excess at the largest row) on top of 1 s
    assert fixed.span and math.log(1.0038) < fixed.correction(x, 1.0) < math.log(1.0045)
    assert fixed.correction(x, 1e-3) == pytest.approx(math.log(4.82), rel=0.02)  # in the span
    slower = line([1e-3, 1e-2, 1e-1], [1.6e-3, 1.6e-2, 1.6e-1])
    assert not slower.span and slower.correction(x, 1.0) == pytest.approx(math.log(1.6))
    faster = line([1e-3, 1.1e-3], [0.6e-3, 0.66e-3])
    assert faster.correction(x, 1.0) == pytest.approx(math.log(0.6), rel=1e-6)


def test_small_sample_time_refit_tries_a_slope_only_from_ten_rows() -> None:
    """Measured/predicted drifting with size (log slope 0.3): 8 rows get one factor per
    precision (on so few, a slope chosen by leave-one-out made held-out families' times
    worse, ``benchmarks/refit_replay.py``); from ``_MIN_SLOPE_ROWS`` rows it is learned."""
    from costaware.core.residuals import _MIN_SLOPE_ROWS, _small_sample_line

    log_base = np.log(np.geomspace(1e-3, 1.0, 12))
    y = 0.1 + 0.3 * log_base
    groups = np.full(12, "fp32", dtype=object)
    by, slope, _ = _small_sample_line(y[:8], log_base[:8], groups[:8])
    assert slope == 0.0 and by["fp32"] == pytest.approx(float(np.median(y[:8])))
    assert _MIN_SLOPE_ROWS <= 12
    by, slope, _ = _small_sample_line(y, log_base, groups)
    assert slope == pytest.approx(0.3) and by["fp32"] == pytest.approx(0.1)
    assert _small_sample_line(y[:8], log_base[:8], groups[:8], min_slope_rows=0)[
        1
    ] == pytest.approx(0.3)


def test_small_sample_memory_refit_learns_a_fixed_offset(cnn_spec: ca.TrainingSpec) -> None:
    """Five trials that each carry 3 MiB of framework state besides their tensors: a line
    learns the offset, so a larger model is not charged 3 MiB times its size."""
    base = ca.CostModel()

    def spec(width: int) -> ca.TrainingSpec:
        return dataclasses.replace(cnn_spec, model=functools.partial(tiny_cnn, width=width))

    rows = []
    for width in (2, 4, 6, 8, 10):
        feats = base.features(spec(width), "CPU")
        rows.append(
            Observation(
                features=feats,
                device="CPU",
                peak_memory=feats["analytic_reserved_mib"] * MiB + 3 * MiB,
            )
        )
    model = ca.CostModel().fit(rows)
    big = spec(32)
    analytic = base.predict(big, "CPU").peak_memory
    learned = model.predict(big, "CPU")
    assert learned.peak_memory == pytest.approx(analytic + 3 * MiB, rel=0.02)
    assert learned.peak_memory_upper <= 1.1 * learned.peak_memory


def test_refit_on_cpu_trials_ignores_a_base_learned_on_gpus(
    fitted: tuple[ca.CostModel, Path], cnn_spec: ca.TrainingSpec
) -> None:
    """The shipped model is learned on GPUs; the online refit of a CPU study starts from
    the analytic estimate, not from GPU corrections applied to CPU features."""
    gpu_model, _ = fitted
    analytic = ca.CostModel()
    rows = []
    for width in (4, 6, 8, 10, 12):
        s = dataclasses.replace(cnn_spec, model=functools.partial(tiny_cnn, width=width))
        feats = analytic.features(s, "CPU")
        rows.append(
            Observation(
                features=feats,
                device="CPU",
                iteration_time=feats["analytic_time_ms"] / 1e3 * 1.5,
            )
        )
    online = ca.CostModel().fit(rows, base=gpu_model)
    assert online.base_ is None
    spec = dataclasses.replace(cnn_spec, model=functools.partial(tiny_cnn, width=20))
    assert online.predict(spec, "CPU").iteration_time == pytest.approx(
        1.5 * analytic.predict(spec, "CPU").iteration_time, rel=0.02
    )


def test_upper_bounds_never_fall_below_the_point(cnn_spec: ca.TrainingSpec) -> None:
    """Calibration rows that were all over-predicted give a negative conformal quantile;
    the bound is then the point prediction, not below it."""
    base = ca.CostModel()
    rows = []
    for width, factor in [(4, 2.0), (6, 1.0), (8, 1.0), (10, 1.0)]:
        s = dataclasses.replace(cnn_spec, model=functools.partial(tiny_cnn, width=width))
        feats = base.features(s, "CPU")
        it = feats["analytic_time_ms"] / 1e3 * factor
        rows.append(Observation(features=feats, device="CPU", iteration_time=it))
    model = ca.CostModel().fit(rows)
    pred = model.predict(dataclasses.replace(cnn_spec, dataset_size=640), "CPU")
    assert pred.iteration_time_upper >= pred.iteration_time
    assert pred.epoch_time is not None and pred.epoch_time_upper is not None
    assert pred.epoch_time_upper >= pred.epoch_time


def test_memory_line_learns_offset_and_factor_and_saves_without_trees(
    tmp_path: Path,
) -> None:
    """The default memory model: measured = offset + factor x simulated peak, on many rows."""
    model = ca.CostModel(iterations=50, depth=2)
    obs = _observations(model, [4, 8, 12], "a") + _observations(model, [16, 20], "b")
    obs += _observations(model, [28, 32], "c")
    for o in obs:
        o.peak_memory = 64 * MiB + 1.1 * o.features["analytic_reserved_mib"] * MiB
    model.fit(obs)
    (tmp_path / "memory.cbm").write_bytes(b"a tree model of an earlier fit")
    model.save(tmp_path)  # over an earlier model: its memory.cbm must go
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "time.cbm"]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    line = manifest["models"]["memory"]["affine"]
    assert line["intercept"] == pytest.approx(64 * MiB, rel=0.01)
    assert line["slope"] == pytest.approx(1.1, rel=0.01)
    loaded = ca.CostModel.load(tmp_path)
    feats = obs[0].features
    est = 64 * MiB + 1.1 * feats["analytic_reserved_mib"] * MiB
    mem, secs = loaded.baseline(feats, "cuda")
    assert loaded.correct(feats, (mem, mem, secs, secs), "cuda")[0] == pytest.approx(est, rel=0.01)
    with pytest.raises(ValueError, match="memory_model"):
        ca.CostModel(memory_model="forest")


def test_bounds_follow_an_additive_error_without_widening_large_predictions() -> None:
    """Measured = predicted + up to 200 MiB (allocator slack, workspaces): as one factor,
    a 10 MiB model's spread would put every 10 GiB model's bound at 20x. The shifted
    quantile keeps the large bounds tight and still covers new rows."""
    from costaware.core.conformal import _shifted_quantile

    rng = np.random.default_rng(0)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        predicted = np.exp(rng.uniform(math.log(10 * MiB), math.log(10 * 1024 * MiB), n))
        return predicted, predicted + rng.uniform(0, 200 * MiB, n)

    predicted, measured = draw(200)
    shift, q, level = _shifted_quantile((predicted, measured), draw(200), 0.95)
    assert shift > 0 and level == 0.95

    def upper(p: np.ndarray) -> np.ndarray:
        return (p + shift) * math.exp(q) - shift

    big = 10 * 1024 * MiB
    assert upper(np.asarray([big]))[0] < 1.1 * big
    p_new, m_new = draw(4000)
    assert np.mean(m_new <= upper(p_new)) >= 0.93  # conformal: about 95% of new rows
    # with no shift (one factor) the same coverage costs a far wider large-model bound
    r = np.log(measured / predicted)
    q0 = float(np.sort(r)[math.ceil(201 * 0.95) - 1])
    assert math.exp(q0) > 5.0


def test_dispatch_baseline_recovers_a_cpu_bound_and_a_gpu_bound_regime() -> None:
    """Steps of many tiny kernels take the CPU's issue time, steps of large kernels their
    kernel time: the fitted baseline recovers both regimes, the CPU's cost per op of each
    phase and per view, and how much the two pipelines fail to overlap, from whole-model
    timings."""
    from costaware.core.step_models import _Dispatch

    rng = np.random.default_rng(1)
    n = 200
    fwd = rng.integers(20, 1500, n).astype(float)
    bwd = fwd * rng.uniform(1.2, 2.5, n)
    opt = rng.integers(3, 12, n).astype(float)
    tensors = rng.integers(4, 700, n).astype(float)  # parameter tensors, apart from ops
    views = fwd * rng.uniform(0.0, 1.5, n)  # kernel-free ops, a few or many per kernel
    kernel_ms = np.exp(rng.uniform(np.log(0.05), np.log(200.0), n))
    amp = (rng.random(n) < 0.5).astype(float)  # half the steps under autocast
    rows = np.column_stack([kernel_ms, fwd, bwd, opt, tensors, views, amp])
    truth = _Dispatch(
        gpu=0.9,
        fwd_ms=0.05,
        bwd_ms=0.012,
        opt_ms=0.06,
        step_ms=0.3,
        tensor_ms=0.01,
        amp_kernel=1.25,
        amp_issue=1.1,
        view_ms=0.008,
        softness=0.3,
    )
    measured_s = truth._ms(rows) / 1e3 * np.exp(rng.normal(0, 0.03, n))
    fitted = _Dispatch.fit(rows, measured_s)
    assert fitted.gpu == pytest.approx(0.9, rel=0.1)
    assert fitted.fwd_ms == pytest.approx(0.05, rel=0.2)
    assert fitted.bwd_ms == pytest.approx(0.012, rel=0.3)
    assert fitted.tensor_ms == pytest.approx(0.01, rel=0.3)
    assert fitted.amp_kernel == pytest.approx(1.25, rel=0.05)
    assert fitted.amp_issue == pytest.approx(1.1, rel=0.05)
    assert fitted.view_ms == pytest.approx(0.008, rel=0.3)
    assert fitted.softness == pytest.approx(0.3, rel=0.3)
    # where kernel and issue time are equal, the soft maximum charges 2^0.3 of either
    even = _Dispatch(1.0, 0.0, 0.0, 0.0, 10.0, 0.0, softness=0.3)._ms(
        np.asarray([[10.0, *[0.0] * 6]])
    )
    assert even[0] == pytest.approx(10.0 * 2**0.3)
    # the same steps, none under autocast: no factor to learn, none applied
    fp32 = rows.copy()
    fp32[:, 6] = 0.0
    plain = _Dispatch.fit(fp32, truth._ms(fp32) / 1e3)
    assert (plain.amp_kernel, plain.amp_issue) == (1.0, 1.0)
    # a manifest from before the autocast factors loads with neither; one from before the
    # views and the softness, with the plain maximum it was fitted as
    old = {k: v for k, v in dataclasses.asdict(fitted).items() if not k.startswith("amp_")}
    assert _Dispatch(**old).amp_kernel == 1.0
    older = {k: v for k, v in dataclasses.asdict(truth).items() if k not in ("view_ms", "softness")}
    plain_max = np.maximum(
        0.9 * rows[:, 0] * np.where(rows[:, 6] > 0, 1.25, 1.0),
        (rows[:, 1:5] @ [0.05, 0.012, 0.06, 0.01] + 0.3) * np.where(rows[:, 6] > 0, 1.1, 1.0),
    )
    np.testing.assert_allclose(_Dispatch(**older)._ms(rows), plain_max)
    # 800 forward and 1,600 backward ops of next to nothing: the step is their issue time
    tiny = {
        "optime_kernel_ms": 0.5,
        "kernels_fwd": 800.0,
        "kernels_bwd": 1600.0,
        "kernels_opt": 5.0,
        "param_tensors": 300.0,
        "ops:shape": 400.0,
    }
    expected = (0.05 * 800 + 0.012 * 1600 + 0.06 * 5 + 0.01 * 300 + 0.008 * 400 + 0.3) / 1e3
    assert fitted.seconds(tiny) == pytest.approx(expected, rel=0.1)
    # the per-tensor share is per optimizer step: four micro-batches pay it a quarter each;
    # the views are per micro-batch, of which a trace holds two
    accumulated = {**tiny, "grad_accumulation": 4.0}
    saved = fitted.seconds(tiny) - fitted.seconds(accumulated)  # type: ignore[operator]
    per_step = fitted.tensor_ms * 300 * 0.75 + fitted.view_ms * 400 * 0.5
    assert saved == pytest.approx(per_step / 1e3, rel=1e-4)
    # large kernels: the step is the GPU's, longer under autocast by its factor
    big = {**tiny, "optime_kernel_ms": 500.0}
    assert fitted.seconds(big) == pytest.approx(0.9 * 0.5, rel=0.1)
    bf16 = fitted.seconds({**big, "precision_is_bf16": 1.0})
    # (the issue time, an eighth of the kernel time, adds next to nothing to the soft maximum)
    assert bf16 == pytest.approx(fitted.seconds(big) * fitted.amp_kernel, rel=1e-3)  # type: ignore[operator]
    # features from before the split (no kernels_* counts) or without the views: no
    # answer, the op sum is used
    assert fitted.seconds({"optime_kernel_ms": 5.0}) is None
    assert fitted.seconds({k: v for k, v in tiny.items() if k != "ops:shape"}) is None


def test_models_with_convolutions_get_their_own_bound() -> None:
    """cuDNN's workspace makes convolutional models' peaks scatter; models without
    convolutions are predicted tightly. Calibrated together, the MLPs would inherit the
    CNNs' spread; apart, each group's bound follows its own residuals. (Trees: the GPU
    memory line is calibrated across families with one bound, see below.)"""
    from costaware import zoo

    model = ca.CostModel(iterations=50, depth=2, calibration_fraction=0.5, memory_model="trees")
    rng = np.random.default_rng(3)
    obs = []
    for fam in range(10):
        for bs in range(8, 168, 8):
            cnn = ca.TrainingSpec(
                model=functools.partial(tiny_cnn, width=4 + 2 * fam),
                batch=ca.ImageBatch((3, 32, 32), classes=10),
                batch_size=bs,
            )
            mlp = ca.TrainingSpec(
                model=functools.partial(zoo.mlp, 64, (32 + 16 * fam,), 10),
                batch=ca.ImageBatch((64,), classes=10),
                batch_size=bs,
            )
            for spec, name, spread in ((cnn, f"cnn{fam}", 1.5), (mlp, f"mlp{fam}", 0.02)):
                feats = model.features(spec, "H100")
                factor = 1.0 + rng.uniform(0.0, spread)
                peak = feats["analytic_reserved_mib"] * MiB * factor
                obs.append(
                    Observation(features=feats, device="H100-SXM", peak_memory=peak, family=name)
                )
    model.fit(obs)
    # each group, and within it the fp32 steps (the only precision here)
    assert set(model.memory_.bounds) == {"conv", "other", "conv+fp32", "other+fp32"}
    for spec_model, batch in (
        (functools.partial(tiny_cnn, width=9), ca.ImageBatch((3, 32, 32), classes=10)),
        (functools.partial(zoo.mlp, 64, (100,), 10), ca.ImageBatch((64,), classes=10)),
    ):
        p = model.predict(ca.TrainingSpec(model=spec_model, batch=batch, batch_size=50), "H100")
        ratio = p.peak_memory_upper / p.peak_memory
        if "mlp" in str(spec_model):
            assert ratio < 1.15  # the MLPs' own 2% spread, not the CNNs' 150%
        else:
            assert ratio > 1.3  # peaks 1-2.5x the simulation, the point near the middle


def test_steps_under_autocast_get_their_own_bound() -> None:
    """Mixed precision's error differs in kind (on a CPU without bf16 arithmetic autocast
    emulates it): pooled with fp32 steps, its bound covered 76% of held-out CPU bf16
    steps against 98% of fp32 ones. Within each group, steps under autocast are
    calibrated apart; a model saved before the split (coarse groups only) still finds its
    group's bound."""
    from costaware import zoo

    model = ca.CostModel(iterations=50, depth=2, calibration_fraction=0.5)
    rng = np.random.default_rng(5)
    obs = []
    for fam in range(10):
        for bs in range(8, 168, 8):
            for precision, spread in (("fp32", 0.02), ("bf16", 1.5)):
                spec = ca.TrainingSpec(
                    model=functools.partial(zoo.mlp, 64, (32 + 16 * fam,), 10),
                    batch=ca.ImageBatch((64,), classes=10),
                    batch_size=bs,
                    precision=precision,
                )
                feats = model.features(spec, "cpu")
                secs = feats["analytic_time_ms"] / 1e3 * (1.0 + rng.uniform(0.0, spread))
                obs.append(
                    Observation(
                        features=feats, device="CPU", iteration_time=secs, family=f"mlp{fam}"
                    )
                )
    model.fit(obs)
    assert {"other+fp32", "other+amp", "other"} <= set(model.time_.bounds)

    def ratio(precision: str) -> float:
        spec = ca.TrainingSpec(
            model=functools.partial(zoo.mlp, 64, (100,), 10),
            batch=ca.ImageBatch((64,), classes=10),
            batch_size=50,
            precision=precision,
        )
        p = model.predict(spec, "cpu")
        return p.iteration_time_upper / p.iteration_time

    assert ratio("fp32") < 1.15  # fp32's own 2% spread, not bf16's 150%
    assert ratio("bf16") > 1.3
    # a manifest written before the split: the coarse group's bound serves both
    coarse = {"other": (0.0, 0.5, 0.95), "conv": (0.0, 0.1, 0.95)}
    model.time_ = dataclasses.replace(model.time_, bounds=coarse)
    assert ratio("fp32") == pytest.approx(math.exp(0.5), rel=1e-9)
    assert ratio("bf16") == pytest.approx(math.exp(0.5), rel=1e-9)


def test_refit_on_few_trials_moves_the_base_bound(
    tmp_path: Path, cnn_spec: ca.TrainingSpec
) -> None:
    """A refit with fewer than 8 leave-one-out residuals cannot calibrate a bound: it keeps
    the base model's bound, moved by the same correction as the point. With more, the
    bound is its own, from those residuals."""
    base = ca.CostModel.default()

    def spec(width: int, bs: int) -> ca.TrainingSpec:
        return dataclasses.replace(
            cnn_spec, model=functools.partial(tiny_cnn, width=width), batch_size=bs
        )

    specs = [spec(w, bs) for w in (4, 6, 8, 10, 12) for bs in (8, 16)]
    rows = []
    for i, s in enumerate(specs):
        p = base.predict(s, "CPU")
        wobble = 1.0 + 0.04 * ((i % 3) - 1)  # measured = 2x the point, within 4%
        rows.append(
            Observation(
                features=base.features(s, "CPU"),
                device="CPU",
                iteration_time=p.iteration_time * 2.0 * wobble,
                peak_memory=int(p.peak_memory * 1.5 * wobble),
            )
        )
    target = spec(16, 8)
    before = base.predict(target, "CPU")
    few = ca.CostModel(**base.get_params()).fit(rows[:4], base=base)
    for m in (few, ca.CostModel.load(few.save(tmp_path / "few"))):
        after = m.predict(target, "CPU")
        assert after.iteration_time == pytest.approx(2.0 * before.iteration_time, rel=0.05)
        assert after.iteration_time_upper / after.iteration_time == pytest.approx(
            before.iteration_time_upper / before.iteration_time, rel=1e-6
        )
        assert after.peak_memory_upper / after.peak_memory == pytest.approx(
            before.peak_memory_upper / before.peak_memory, rel=1e-6
        )
        assert after.coverage == before.coverage
    many = ca.CostModel(**base.get_params()).fit(rows, base=base)
    own = many.predict(target, "CPU")
    # ten residuals within a few percent: a bound of its own, far narrower than the base's
    assert own.iteration_time < own.iteration_time_upper < 1.3 * own.iteration_time
    assert (own.iteration_time_upper / own.iteration_time) < (
        before.iteration_time_upper / before.iteration_time
    )
    assert own.coverage is not None and own.coverage < 0.95  # 10 rows guarantee 10/11


def test_gpu_memory_line_is_calibrated_across_families() -> None:
    # each family's simulator error is shared by its rows: a bound calibrated on a couple
    # of held-out families could miss a whole family; cross-conformal residuals see them all
    model = ca.CostModel(iterations=20)
    obs: list[Observation] = []
    factors = {"a": 1.0, "b": 1.04, "c": 0.97, "d": 1.08, "e": 0.94, "f": 1.25}
    for i, (fam, factor) in enumerate(factors.items()):
        for o in _observations(model, [4 + 4 * i, 6 + 4 * i], fam):
            base = o.features["analytic_reserved_mib"] * MiB
            obs.append(dataclasses.replace(o, peak_memory=base * factor))
    fitted = ca.CostModel(iterations=20).fit(obs)
    assert fitted.memory_.cal_rows == len(obs)  # every row calibrates, none is held back
    assert not fitted.memory_.bounds  # one bound for all rows
    for o in obs:
        base = fitted.baseline(o.features)
        _, upper, _, _ = fitted.correct(o.features, (base[0], base[0], base[1], base[1]))
        assert o.peak_memory is not None and o.peak_memory <= upper * (1 + 1e-9), o.family
    # peaks from 20 MiB to 40 GiB, each 0-60 MiB over its simulation: an offset-shaped error
    # that a shifted bound would fit far tighter. But every row calibrates, and a shape
    # chosen on the rows that then set the quantile voids the guarantee: a factor it is
    sizes = np.geomspace(20, 40_000, len(obs))
    spread = [
        dataclasses.replace(
            o,
            features=dict(o.features, analytic_reserved_mib=float(mib)),
            peak_memory=(mib + (k * 37 % 11) * 6) * MiB,
        )
        for k, (o, mib) in enumerate(zip(obs, sizes, strict=True))
    ]
    line = ca.CostModel(iterations=20).fit(spread)
    assert line.memory_.shift == 0.0 and line.memory_.cal_rows == len(spread)


def test_trees_are_calibrated_across_families() -> None:
    # one family's step is 1.6x what the others' is: only residuals from trees that never
    # saw it show that error. Cross-conformal, every family's rows are held out once, and
    # the bound is as wide as that family needs. A split calibrates on one family here
    # (with random_state 0, f: a typical one), and its bound would miss a family like "a"
    model = ca.CostModel(iterations=30, depth=3)
    factors = {"a": 1.6, "b": 1.03, "c": 0.98, "d": 1.02, "e": 0.97, "f": 1.0}
    obs: list[Observation] = []
    for i, (fam, factor) in enumerate(factors.items()):
        for o in _observations(model, [4 + 4 * i, 6 + 4 * i], fam):
            assert o.iteration_time is not None
            obs.append(dataclasses.replace(o, iteration_time=o.iteration_time * factor))
    cross = ca.CostModel(iterations=30, depth=3).fit(obs)
    split = ca.CostModel(iterations=30, depth=3, calibration="split").fit(obs)
    assert cross.time_.cal_rows == len(obs)  # every row calibrates
    assert split.time_.cal_rows < len(obs) // 2
    spec = obs[0].meta["spec"]
    p_cross, p_split = cross.predict(spec, "H100"), split.predict(spec, "H100")
    assert p_split.iteration_time_upper < 1.2 * p_split.iteration_time
    assert p_cross.iteration_time_upper > 1.4 * p_cross.iteration_time
    with pytest.raises(ValueError, match="calibration must be"):
        ca.CostModel(calibration="loo")


def test_cpu_step_model_recovers_its_constants_and_saves_with_the_model(
    tmp_path: Path,
) -> None:
    """A CPU runs its ops one after another: the CPU step model is a sum of the roofline's
    parts, a cost per kernel and a cost per parameter tensor. Fitted on whole-step timings
    it recovers each, and a GRU-like step of thousands of tiny kernels on a few tensors is
    charged their own small cost."""
    from costaware.core.step_models import _CpuSteps

    rng = np.random.default_rng(3)
    n = 300
    comp = np.exp(rng.uniform(np.log(0.1), np.log(500.0), n))
    mem = np.exp(rng.uniform(np.log(0.1), np.log(200.0), n))
    kernels = rng.integers(20, 8000, n).astype(float)
    tensors = rng.integers(4, 300, n).astype(float)
    # without a CPU op model the op-sum column is 0, and so is its factor
    rows = np.column_stack([comp, mem, kernels, tensors, np.zeros(n)])
    truth = _CpuSteps(compute=1.1, memory=0.9, op_ms=0.004, tensor_ms=0.25, step_ms=0.6)
    measured_s = truth._ms(rows) / 1e3 * np.exp(rng.normal(0, 0.02, n))
    fitted = _CpuSteps.fit(rows, measured_s)
    for name in ("compute", "memory", "op_ms", "tensor_ms"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.15), name
    assert fitted.op_sum == 0.0
    # with one (every row has an op sum), the sum gets a factor of its own
    op_sum = comp * np.exp(rng.uniform(np.log(0.3), np.log(3.0), n))
    with_sum = _CpuSteps(
        compute=0.3, memory=0.9, op_ms=0.004, tensor_ms=0.25, step_ms=0.6, op_sum=1.5
    )
    rows_sum = np.column_stack([comp, mem, kernels, tensors, op_sum])
    measured_sum = with_sum._ms(rows_sum) / 1e3 * np.exp(rng.normal(0, 0.02, n))
    fitted_sum = _CpuSteps.fit(rows_sum, measured_sum)
    assert fitted_sum.op_sum == pytest.approx(1.5, rel=0.15)
    assert fitted_sum.compute == pytest.approx(0.3, rel=0.3)
    gru = {
        "analytic_compute_ms": 5.0,
        "analytic_memory_ms": 2.0,
        "kernels": 6000.0,
        "param_tensors": 8.0,
    }
    expected = 1.1 * 5 + 0.9 * 2 + 0.004 * 6000 + 0.25 * 8 + 0.6
    assert fitted.seconds(gru) == pytest.approx(expected / 1e3, rel=0.1)
    # accumulation: a trace holds two micro-batches' kernels, the tensors once per step
    accumulated = {**gru, "grad_accumulation": 4.0}
    saved = fitted.seconds(gru) - fitted.seconds(accumulated)  # type: ignore[operator]
    per_micro = fitted.op_ms * 6000 / 2 + fitted.tensor_ms * 8 * 0.75
    assert saved == pytest.approx(per_micro / 1e3, rel=1e-9)
    assert fitted.seconds({"analytic_compute_ms": 1.0}) is None  # a feature missing

    # fitted on CPU timings, a model learns its time residual over the step model, and
    # keeps it through save and load; "roofline" keeps the roofline
    model = ca.CostModel(iterations=50, depth=3)
    obs = []
    for w in (4, 8, 12, 16, 20, 24):
        for bs in (4, 8, 16, 32):
            spec = ca.TrainingSpec(
                model=functools.partial(tiny_cnn, width=w),
                batch=ca.ImageBatch((3, 32, 32), classes=10),
                batch_size=bs,
            )
            feats = model.features(spec, "cpu")
            secs = truth.seconds(feats)
            assert secs is not None
            obs.append(
                Observation(
                    feats,
                    "CPU",
                    iteration_time=secs,
                    peak_memory=1e7,
                    family=f"w{w}",
                    meta={"spec": spec},
                )
            )
    model.fit(obs)
    steps = model.cpu_steps_
    # one architecture at several widths: the constants are not each identifiable, the
    # steps are
    for o in obs:
        assert steps.seconds(o.features) == pytest.approx(o.iteration_time, rel=0.05)
    feats = obs[0].features
    assert model.baseline(feats, "cpu")[1] == pytest.approx(steps.seconds(feats), rel=1e-12)
    assert model.baseline(feats, "cpu")[1] != pytest.approx(feats["analytic_time_ms"] / 1e3)
    pred = model.predict(obs[0].meta["spec"], device="cpu")
    assert pred.basis["cpu_step_time"] == pytest.approx(steps.seconds(feats), rel=1e-6)
    assert "CPU step model" in pred.explain()
    model.save(tmp_path / "m")
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert manifest["cpu_steps"] == dataclasses.asdict(steps)
    loaded = ca.CostModel.load(tmp_path / "m")
    assert loaded.cpu_steps_ == steps
    again = loaded.predict(obs[0].meta["spec"], device="cpu")
    assert again.iteration_time == pytest.approx(pred.iteration_time, rel=1e-9)
    assert again.basis["cpu_step_time"] == pytest.approx(pred.basis["cpu_step_time"], rel=1e-9)
    roofline = ca.CostModel(iterations=50, depth=3, time_baseline="roofline").fit(obs)
    assert roofline.cpu_steps_ is None
    assert roofline.baseline(feats, "cpu")[1] == pytest.approx(feats["analytic_time_ms"] / 1e3)


# --------------------------------------------------------------------------------------
# persistence: checksums, damaged and malformed files, the shipped model loaded once
# --------------------------------------------------------------------------------------
SHIPPED_CBM = ("optime.cbm", "optime-cpu.cbm", "cpu/time.cbm", "cuda/time.cbm")


def _shipped_copy(tmp_path: Path) -> Path:
    """A writable copy of the shipped model's folder."""
    from importlib import resources

    out = tmp_path / "shipped"
    with resources.as_file(resources.files("costaware") / "data" / "default_model") as src:
        shutil.copytree(src, out)
    return out


def _flip(path: Path, rng: random.Random) -> int:
    """Flip one random bit of the file at ``path``; returns the byte's offset."""
    data = bytearray(path.read_bytes())
    pos = rng.randrange(len(data))
    data[pos] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return pos


def _manifest(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((path / "manifest.json").read_text())
    return loaded


@pytest.fixture
def catboost_reads(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], set[str]]:
    """The sha256 of every file or blob handed to CatBoost's ``load_model``, and a set of
    digests that are stopped there (with an AssertionError) instead of being parsed: a
    damaged .cbm that got this far could crash the test process inside CatBoost."""
    from catboost import CatBoost

    real = CatBoost.load_model
    seen: list[str] = []
    stopped: set[str] = set()

    def guarded(
        self: Any, fname: Any = None, format: str = "cbm", stream: Any = None, blob: Any = None
    ) -> Any:
        data = blob if blob is not None else Path(fname).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        seen.append(digest)
        if digest in stopped:
            raise AssertionError("a damaged model file reached CatBoost's load_model")
        return real(self, fname=fname, format=format, stream=stream, blob=blob)

    monkeypatch.setattr(CatBoost, "load_model", guarded)
    return seen, stopped


def test_save_records_the_sha256_of_each_file(fitted: tuple[ca.CostModel, Path]) -> None:
    _, path = fitted
    sums = _manifest(path)["sha256"]
    assert sums == {
        name: hashlib.sha256((path / name).read_bytes()).hexdigest()
        for name in ("memory.cbm", "time.cbm")
    }


def test_the_shipped_model_verifies_and_predicts_as_before(
    tmp_path: Path, cnn_spec: ca.TrainingSpec
) -> None:
    from importlib import resources

    with resources.as_file(resources.files("costaware") / "data" / "default_model") as root:
        for folder in (root, root / "cpu", root / "cuda"):  # every file it reads is listed
            sums = _manifest(folder)["sha256"]
            listed = [e["file"] for e in _manifest(folder)["models"].values() if "file" in e]
            listed += [f"{k}/manifest.json" for k in _manifest(folder)["kinds"]]
            assert sorted(sums) == sorted(listed)
            for name, digest in sums.items():
                assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
        with warnings.catch_warnings():
            warnings.simplefilter("error", ca.CostAwareWarning)  # verified: no warning
            verified = ca.CostModel.load(root)
    # the same files read unverified, as a model saved without checksums is: the
    # checksums change nothing the model predicts
    legacy = _shipped_copy(tmp_path)
    for folder in (legacy, legacy / "cpu", legacy / "cuda"):
        manifest = _manifest(folder)
        del manifest["sha256"]
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    with pytest.warns(ca.CostAwareWarning, match="saved without checksums"):
        unverified = ca.CostModel.load(legacy)
    for device in ("H100", "cpu"):
        a, b = (
            verified.predict(cnn_spec, device=device),
            unverified.predict(cnn_spec, device=device),
        )
        assert a.kind == b.kind == "learned"
        assert (a.peak_memory, a.peak_memory_upper) == (b.peak_memory, b.peak_memory_upper)
        assert (a.iteration_time, a.iteration_time_upper) == (
            b.iteration_time,
            b.iteration_time_upper,
        )


def test_byte_flips_in_the_shipped_model_are_refused_before_catboost_reads_them(
    tmp_path: Path, catboost_reads: tuple[list[str], set[str]]
) -> None:
    seen, stopped = catboost_reads
    root = _shipped_copy(tmp_path)
    rng = random.Random(46)
    for name in SHIPPED_CBM:
        intact = (root / name).read_bytes()
        for _ in range(2):
            pos = _flip(root / name, rng)
            stopped.add(hashlib.sha256((root / name).read_bytes()).hexdigest())
            with pytest.raises(ca.CostawareError) as err:
                ca.CostModel.load(root)
            message = str(err.value)
            assert f"{root / name} is damaged" in message, (pos, message)
            assert "sha256" in message and "manifest.json" in message
            (root / name).write_bytes(intact)
    assert seen and not stopped & set(seen)  # the intact files were read, no damaged one
    # a per-kind manifest is itself checked by the manifest above it
    _flip(root / "cpu" / "manifest.json", rng)
    with pytest.raises(
        ca.CostawareError, match=re.escape(f"{root / 'cpu' / 'manifest.json'} is damaged")
    ):
        ca.CostModel.load(root)


def test_a_model_saved_without_checksums_loads_with_a_warning_until_saved_again(
    fitted: tuple[ca.CostModel, Path], tmp_path: Path, cnn_spec: ca.TrainingSpec
) -> None:
    model, path = fitted
    shutil.copytree(path, tmp_path / "m")
    manifest = _manifest(tmp_path / "m")
    del manifest["sha256"]
    (tmp_path / "m" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(ca.CostAwareWarning, match=r"without checksums.*\.save\(path\) adds them"):
        loaded = ca.CostModel.load(tmp_path / "m")
    expected = model.predict(cnn_spec, device="H100")
    peak = loaded.predict(cnn_spec, device="H100").peak_memory
    assert peak == pytest.approx(expected.peak_memory, rel=1e-4)  # as the round trip above
    loaded.save(tmp_path / "m")
    assert set(_manifest(tmp_path / "m")["sha256"]) == {"memory.cbm", "time.cbm"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ca.CostAwareWarning)
        again = ca.CostModel.load(tmp_path / "m")
    assert again.predict(cnn_spec, device="H100").peak_memory == peak


def test_a_manifest_that_lists_its_own_folder_is_refused_at_once(
    fitted: tuple[ca.CostModel, Path], tmp_path: Path
) -> None:
    _, path = fitted
    model = tmp_path / "m"
    shutil.copytree(path, model)
    manifest = _manifest(model)
    for kinds in (["."], [".."], ["cpu/.."], ["/tmp"]):
        (model / "manifest.json").write_text(json.dumps({**manifest, "kinds": kinds}))
        with pytest.raises(ca.CostawareError, match="'kinds' must list device kinds"):
            ca.CostModel.load(model)
    # a kind's folder that is the model's own folder (a link), in a manifest without
    # checksums (with them, the link's manifest fails its own checksum first)
    (model / "cpu").symlink_to(".")
    del manifest["sha256"]
    (model / "manifest.json").write_text(json.dumps({**manifest, "kinds": ["cpu"]}))
    with pytest.raises(
        ca.CostawareError, match=r"lists a part at .*cpu, which is .*the model itself"
    ):
        ca.CostModel.load(model)
    (model / "manifest.json").write_text(json.dumps({**manifest, "base": True}))
    (model / "base").symlink_to(".")
    with pytest.raises(ca.CostawareError, match="the model itself or a folder it is in"):
        ca.CostModel.load(model)
    # folders nested deeper than any saved model's: refused, not followed
    deep = tmp_path / "deep"
    part = deep
    for _ in range(20):
        part.mkdir()
        (part / "manifest.json").write_text(
            json.dumps({**manifest, "models": {}, "kinds": ["cpu"]})
        )
        part = part / "cpu"
    with pytest.raises(ca.CostawareError, match="nested 16 parts deep"):
        ca.CostModel.load(deep)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: "{not json", "is not valid JSON"),
        (lambda m: [1, 2], "holds a JSON list"),
        (lambda m: {**m, "models": 5}, "not a CostModel manifest this costaware can read"),
        (
            lambda m: {**m, "params": {"bogus": 1}},
            "not a CostModel manifest this costaware can read",
        ),
        (
            lambda m: {**m, "feature_names": None},
            "not a CostModel manifest this costaware can read",
        ),
        (
            lambda m: {
                **m,
                "models": {**m["models"], "time": {**m["models"]["time"], "file": "../time.cbm"}},
            },
            "plain names inside its folder",
        ),
        (lambda m: {**m, "sha256": "abc"}, "'sha256' must map file names"),
        (
            lambda m: {**m, "sha256": {"memory.cbm": m["sha256"]["memory.cbm"]}},
            "records no sha256 for time.cbm",
        ),
    ],
    ids=[
        "not-json",
        "a-list",
        "models-not-a-dict",
        "unknown-param",
        "no-feature-names",
        "file-outside-the-folder",
        "sha256-not-a-dict",
        "a-file-without-sha256",
    ],
)
def test_a_malformed_manifest_is_a_clear_error(
    fitted: tuple[ca.CostModel, Path],
    tmp_path: Path,
    change: Callable[[dict[str, Any]], Any],
    message: str,
) -> None:
    _, path = fitted
    shutil.copytree(path, tmp_path / "m")
    new = change(_manifest(tmp_path / "m"))
    (tmp_path / "m" / "manifest.json").write_text(new if isinstance(new, str) else json.dumps(new))
    with pytest.raises(ca.CostawareError, match=message) as err:
        ca.CostModel.load(tmp_path / "m")
    assert str(tmp_path / "m") in str(err.value)  # it names the model


def test_the_shipped_model_is_loaded_once_per_process_and_shared_read_only(
    monkeypatch: pytest.MonkeyPatch, cnn_spec: ca.TrainingSpec
) -> None:
    import costaware.core.model as cm

    loads: list[int] = []
    real = cm._load_shipped

    def counted() -> ca.CostModel | None:
        loads.append(1)
        return real()

    monkeypatch.setattr(cm, "_load_shipped", counted)
    monkeypatch.setattr(cm, "_shipped", None)  # as in a fresh process
    start = threading.Barrier(6)
    got: list[ca.CostModel] = []

    def worker() -> None:
        start.wait(timeout=60)
        got.append(ca.CostModel.default())

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(got) == 6 and len(loads) == 1
    assert len({id(m) for m in got}) == 6  # each caller its own model object ...
    assert all(m.kinds_["cpu"] is got[0].kinds_["cpu"] for m in got)  # ... one load
    before = got[1].predict(cnn_spec, device="cpu")
    # refitting the one a caller got leaves everybody else's as it was
    rows = _observations(ca.CostModel(), [4], "a")
    got[0].fit(rows)
    assert got[0].training_["rows"] == len(rows)
    for m in (got[1], ca.CostModel.default()):
        assert m.training_["rows"] > len(rows) and set(m.kinds_) == {"cpu", "cuda"}
        assert m.predict(cnn_spec, device="cpu").peak_memory == before.peak_memory
    assert len(loads) == 1


def test_a_damaged_shipped_model_is_refused_once_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, catboost_reads: tuple[list[str], set[str]]
) -> None:
    import costaware.core.model as cm

    root = _shipped_copy(tmp_path)
    _flip(root / "cuda" / "time.cbm", random.Random(0))
    catboost_reads[1].add(hashlib.sha256((root / "cuda" / "time.cbm").read_bytes()).hexdigest())
    loads: list[int] = []

    def damaged() -> ca.CostModel:
        loads.append(1)
        return ca.CostModel.load(root)

    monkeypatch.setattr(cm, "_load_shipped", damaged)
    monkeypatch.setattr(cm, "_shipped", None)
    for _ in range(3):
        with pytest.raises(ca.CostawareError) as err:
            ca.CostModel.default()
        message = str(err.value)
        assert message.startswith("the cost model shipped with costaware cannot be used")
        assert f"{root / 'cuda' / 'time.cbm'} is damaged" in message
        assert "pip install --force-reinstall costaware" in message
    assert len(loads) == 1  # remembered: the files are not read again


# -- the estimator's contract: parameters, learned state, validation -------------------------
def _rows(
    n: int, *, memory: bool = True, time: bool = True, allocated: bool = False
) -> list[Observation]:
    """Measured rows over hand-made features (no dry run): a memory and a time factor,
    and with ``allocated`` an allocated peak for the capacity's bound."""
    rows = []
    for i in range(n):
        mib, ms = 100.0 + 37.0 * i, 5.0 + 1.5 * i
        feats = {"analytic_reserved_mib": mib, "analytic_time_ms": ms, "width": float(i)}
        if allocated:
            feats["analytic_allocated_mib"] = 0.9 * mib
        rows.append(
            Observation(
                features=feats,
                device="H100-SXM",
                peak_memory=mib * MiB * (1.2 + 0.001 * i) if memory else None,
                iteration_time=ms / 1e3 * (1.5 + 0.002 * i) if time else None,
                peak_allocated=mib * MiB * (1.05 + 0.002 * i) if allocated else None,
                family=f"f{i % 6}",
            )
        )
    return rows


def _learned(model: ca.CostModel) -> set[str]:
    return {n for n in vars(model) if n.endswith("_")}


def test_parameters_are_what_init_declares() -> None:
    import inspect

    declared = [p for p in inspect.signature(ca.CostModel.__init__).parameters if p != "self"]
    model = ca.CostModel(iterations=50, coverage=0.9, memory_model="trees")
    params = model.get_params()
    assert list(params) == declared
    assert params["iterations"] == 50 and params["coverage"] == 0.9
    assert ca.CostModel(**params).get_params() == params
    assert ca.CostModel.default().get_params() == ca.CostModel().get_params()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"time_baseline": "optim"}, "time_baseline must be 'optime' or 'roofline', but got"),
        ({"memory_model": "tree"}, "memory_model must be 'line' or 'trees', but got"),
        ({"calibration": "loo"}, "calibration must be 'cross' or 'split', but got"),
        ({"coverage": 95}, "coverage must be a number between 0 and 1, but got 95"),
        ({"calibration_fraction": 0.0}, "calibration_fraction must be a number between 0 and 1"),
        ({"iterations": 0}, "iterations must be a whole number of at least 1, but got 0"),
        ({"depth": 2.5}, "depth must be a whole number of at least 1, but got 2.5"),
        ({"learning_rate": -0.1}, "learning_rate must be a number above 0, but got -0.1"),
        ({"thread_count": 0}, "thread_count must be -1 (every core) or at least 1, but got 0"),
        ({"trace_timeout": 0}, "trace_timeout must be a number above 0, but got 0"),
        ({"cache_size": -1}, "cache_size must be a whole number of at least 0, but got -1"),
        ({"random_state": "0"}, "random_state must be a whole number of at least 0, but got '0'"),
    ],
)
def test_bad_parameters_are_refused_with_what_was_expected(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ca.CostModel(**kwargs)


def test_learned_state_is_declared_and_ends_in_an_underscore() -> None:
    model = ca.CostModel(time_baseline="roofline").fit(_rows(12))
    declared = set(ca.CostModel.__annotations__)
    state = set(vars(model)) - set(model.get_params()) - {"_trace_cache"}
    assert state and state <= declared
    assert all(n.endswith("_") for n in state)


def test_every_fit_starts_from_nothing_learned() -> None:
    # a fit without memory targets keeps nothing of an earlier fit's memory model
    settings = {"time_baseline": "roofline", "iterations": 20, "depth": 2}
    model = ca.CostModel(**settings).fit(_rows(36))
    assert model.memory_ is not None and model.time_ is not None
    time_only = _rows(36, memory=False)
    model.fit(time_only)
    fresh = ca.CostModel(**settings).fit(time_only)
    assert model.memory_ is None
    assert _learned(model) == _learned(fresh)
    assert model.achieved_coverage() == fresh.achieved_coverage()


def test_every_fit_forgets_the_capacity_bound_and_the_measured_times_of_the_last() -> None:
    settings = {"time_baseline": "roofline", "iterations": 20, "depth": 2}
    rows = _rows(12, allocated=True)
    model = ca.CostModel(**settings).fit(rows, base=ca.CostModel())
    assert model.capacity_ is not None and model.capacity_.rows == len(rows)
    assert model.measured_time(rows[3].features, "H100-SXM") is not None  # a refit's
    model.fit(_rows(12))  # no allocated peaks, no base
    assert model.capacity_ is None and model.time_measured_ is None
    assert model.measured_time(rows[3].features, "H100-SXM") is None
    assert _learned(model) == _learned(ca.CostModel(**settings).fit(_rows(12)))


def test_an_unfitted_model_holds_nothing_learned() -> None:
    model = ca.CostModel()
    assert not {n for n in vars(model) if n.endswith("_")}  # __init__ stores parameters only
    assert model.memory_ is None and model.time_ is None and model.capacity_ is None
    assert model.base_ is None and not model.kinds_ and not model.op_models_
    assert model.dispatch_ is None and model.cpu_steps_ is None
    assert model.time_measured_ is None and model.graph2vec_ is None
    assert not model.is_fitted and model.achieved_coverage() is None


def test_a_copy_predicts_as_the_model_and_fits_apart_from_it(cnn_spec: ca.TrainingSpec) -> None:
    import copy

    model = ca.CostModel(time_baseline="roofline", iterations=20, depth=2).fit(_rows(36))
    first = model.predict(cnn_spec, "H100")  # fills the trace cache, which holds a lock
    twin = copy.deepcopy(model)
    again = twin.predict(cnn_spec, "H100")
    figures = ("peak_memory", "peak_memory_upper", "iteration_time", "iteration_time_upper")
    assert [getattr(again, f) for f in figures] == [getattr(first, f) for f in figures]
    twin.fit(_rows(36, memory=False))
    assert twin.memory_ is None and model.memory_ is not None  # the model keeps its own
    with pytest.raises(dataclasses.FrozenInstanceError):  # shared parts are read-only
        model.memory_.q = 0.0  # type: ignore[misc]


def test_a_model_is_not_its_own_base() -> None:
    model = ca.CostModel(time_baseline="roofline").fit(_rows(12))
    with pytest.raises(ValueError, match="base must be another model"):
        model.fit(_rows(12), base=model)


def test_the_shipped_model_takes_a_longer_time_limit() -> None:
    """A model whose first dry run takes longer than a minute (HF Mamba's Python loop)."""
    assert ca.CostModel.default(trace_timeout=180.0).trace_timeout == 180.0
    assert ca.CostModel.default().trace_timeout == 60.0  # the others' stays as it was
    with pytest.raises(ValueError, match="trace_timeout"):
        ca.CostModel.default(trace_timeout=-1)


def test_bf16_on_a_cpu_with_bf16_arithmetic_says_its_time_is_too_long() -> None:
    """The shipped CPU op model timed bf16 on a host without bf16 arithmetic: a CPU that
    has it is told its bf16 time is likely too long; one without it, and fp32, are not."""
    from costaware.devices import cpu_device

    model = ca.CostModel.default()
    if model.op_model("cpu") is None:
        pytest.skip("no shipped CPU op model")

    def said(precision: str, flags: list[str]) -> bool:
        spec = ca.TrainingSpec(
            model=lambda: torch.nn.Linear(16, 4),
            batch=ca.ImageBatch((16,), classes=4),
            batch_size=4,
            precision=precision,
        )
        pred = model.predict(spec, device=cpu_device(flags=flags))
        return any("timed on a host without it" in n for n in pred.notes)

    assert said("bf16", ["amx_bf16"]) and said("bf16-true", ["avx512_bf16"])
    assert not said("bf16", []) and not said("fp32", ["amx_bf16"])
