"""Pure half precision (bf16-true, fp16-true, fp64-true): the spec, the dry run against a
real CPU step, the prediction's note, and the Lightning Trainer's precision strings."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as L
import pytest
import pytorch_lightning as PL
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import costaware as ca
from costaware.core.features import hyperparameter_features
from costaware.core.trace import exact_live_peak
from costaware.integrations.lightning import (
    CostAwareCallback,
    PLCostAwareCallback,
    lightning_precision,
    spec_from_lightning,
)
from costaware.measure.profile import allocator_peak
from tests.conftest import tiny_cnn

NAMESPACES = {"lightning": (L, CostAwareCallback), "pytorch_lightning": (PL, PLCostAwareCallback)}


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))


def _spec(precision: str, **kw: Any) -> ca.TrainingSpec:
    base: dict[str, Any] = dict(
        model=_mlp, batch=ca.ImageBatch((64,), classes=10), batch_size=32, optimizer="adamw"
    )
    base.update(kw)
    return ca.TrainingSpec(precision=precision, **base)


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("bf16-true", "bf16-true"),
        ("16-true", "fp16-true"),
        ("fp16-true", "fp16-true"),
        ("64-true", "fp64-true"),
        ("BF16-True", "bf16-true"),
        ("bf16-mixed", "bf16"),
        ("32-true", "fp32"),
    ],
)
def test_pure_precisions_are_told_apart_from_autocast(given: str, canonical: str) -> None:
    spec = _spec(given)
    assert spec.precision == canonical
    assert spec.pure == canonical.endswith("-true")
    assert spec.summary()["precision"] == canonical


def test_an_unknown_precision_names_what_is_expected_and_what_arrived() -> None:
    with pytest.raises(ca.SpecError) as info:
        _spec("bf17-true")
    said = str(info.value)
    assert "but got precision='bf17-true'" in said
    for expected in ("'fp32'", "'bf16-true'", "'fp16-true'", "'16-mixed'", "'64-true'"):
        assert expected in said


def test_pure_bf16_traces_weights_gradients_state_and_inputs_in_bf16() -> None:
    fp32 = ca.dry_run(_spec("fp32"))
    amp = ca.dry_run(_spec("bf16"))
    pure = ca.dry_run(_spec("bf16-true"))
    params = (64 * 256 + 256 + 256 * 10 + 10) * 4
    assert fp32.param_bytes == amp.param_bytes >= params  # autocast keeps fp32 weights
    for what in ("param_bytes", "gradient_bytes"):
        assert getattr(pure, what) == pytest.approx(getattr(fp32, what) / 2, rel=0.01), what
    # AdamW's moments in bf16; its step counters stay fp32 scalars
    assert pure.optimizer_state_bytes == pytest.approx(fp32.optimizer_state_bytes / 2, rel=0.03)
    assert pure.peak_breakdown["inputs"] == pytest.approx(
        fp32.peak_breakdown["inputs"] / 2, rel=0.05
    )
    # every matrix product runs in bf16; the FLOPs are the same count
    bf16, fp32_code = 1, 0
    mm = [i for i in range(len(pure.node_class)) if pure.graph.nodes[i]["op"] in ("addmm", "mm")]
    assert mm and all(pure.node_dtype[i] == bf16 for i in mm)
    assert all(fp32.node_dtype[i] == fp32_code for i in mm)
    assert pure.flops == fp32.flops
    assert pure.peak_live < 0.6 * fp32.peak_live
    assert ca.dry_run(_spec("fp16-true")).param_bytes == pure.param_bytes
    assert ca.dry_run(_spec("fp64-true")).param_bytes == pytest.approx(
        2 * fp32.param_bytes, rel=0.01
    )


def _wide_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))


def _big_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 10))


def _tiny_gpt() -> nn.Module:
    from costaware import zoo

    return zoo.gpt(vocab=512, seq_len=32, dim=64, depth=1, heads=2)


@pytest.mark.parametrize(
    "spec",
    [
        _spec("bf16-true", model=_wide_mlp, batch=ca.ImageBatch((256,), classes=10), batch_size=64),
        _spec("bf16-true", model=_tiny_gpt, batch=ca.TokenBatch(32, 512), batch_size=4),
    ],
    ids=["mlp-adamw", "gpt-adamw"],
)
def test_a_real_pure_bf16_cpu_step_peaks_where_the_dry_run_says(spec: ca.TrainingSpec) -> None:
    measured = allocator_peak(spec).peak
    assert measured is not None
    predicted = exact_live_peak(ca.dry_run(spec).allocator_events())
    assert predicted == pytest.approx(measured, rel=0.01)
    fp32 = allocator_peak(dataclasses.replace(spec, precision="fp32")).peak
    assert fp32 is not None and measured < 0.9 * fp32  # and the fp32 step needs more


def test_a_real_pure_bf16_conv_step_needs_about_half_the_fp32_one() -> None:
    spec = ca.TrainingSpec(
        model=functools.partial(tiny_cnn, width=16),
        batch=ca.ImageBatch((3, 32, 32), classes=10),
        batch_size=16,
        precision="bf16-true",
    )
    bf16, fp32 = (
        allocator_peak(dataclasses.replace(spec, precision=p)).peak for p in ("bf16-true", "fp32")
    )
    assert bf16 is not None and fp32 is not None and bf16 < 0.6 * fp32


def test_a_model_already_in_bf16_is_pure_bf16() -> None:
    net = _mlp().to(torch.bfloat16)
    batch = (torch.randn(16, 64, dtype=torch.bfloat16), torch.randint(0, 10, (16,)))
    assert ca.TrainingSpec.from_module(net, batch).precision == "bf16-true"
    assert ca.TrainingSpec.from_module(net.half(), batch).precision == "fp16-true"
    assert ca.TrainingSpec(model=net, batch=ca.ImageBatch((64,), classes=10), batch_size=4).pure
    # an fp32 model stays fp32, and an explicit choice is kept
    assert ca.TrainingSpec.from_module(_mlp(), batch).precision == "fp32"
    assert (
        ca.TrainingSpec.from_module(_mlp(), batch, precision="bf16-true").precision == "bf16-true"
    )
    assert ca.TrainingSpec.from_module(net, batch, precision="bf16").precision == "bf16"
    # a model half in one type and half in another is none of them
    mixed = _mlp()
    mixed[0].to(torch.bfloat16)
    assert ca.TrainingSpec.from_module(mixed, batch).precision == "fp32"
    # the dry run of the bf16 model is that of bf16-true
    spec = ca.TrainingSpec.from_module(_mlp().to(torch.bfloat16), batch)
    assert ca.dry_run(spec).param_bytes == ca.dry_run(_spec("bf16-true")).param_bytes


def test_a_factory_that_builds_in_bf16_is_said_to_be_pure_bf16() -> None:
    """A factory returning ``model.to(torch.bfloat16)``: the spec cannot see it before the
    build, so its precision reads fp32, but the dry run traces the bf16 step; the
    prediction says so and what to write. A spec that says bf16-true needs no note."""

    def spec(precision: str) -> ca.TrainingSpec:
        return ca.TrainingSpec(
            model=lambda: _mlp().to(torch.bfloat16), batch=ca.ImageBatch((64,), classes=10),
            batch_size=16, precision=precision,
        )  # fmt: skip

    built = ca.CostModel().predict(spec("fp32"), "H100")
    (note,) = [n for n in built.notes if "built in bf16" in n]
    assert "Write precision='bf16-true' to say so" in note
    said = ca.CostModel().predict(spec("bf16-true"), "H100")
    assert not any("built in" in n for n in said.notes)
    assert not any("built in" in n for n in ca.CostModel().predict(_spec("fp32"), "H100").notes)


def test_the_learned_model_sees_pure_precision_as_a_step_without_autocast() -> None:
    feats = hyperparameter_features(_spec("bf16-true"))
    assert feats["precision_is_fp32"] == 1.0
    assert feats["precision_is_bf16"] == feats["precision_is_fp16"] == 0.0
    assert hyperparameter_features(_spec("bf16"))["precision_is_bf16"] == 1.0


def test_the_prediction_says_pure_precision_is_not_calibrated() -> None:
    model = ca.CostModel.default()
    big = dict(model=_big_mlp, batch=ca.ImageBatch((2048,), classes=10), batch_size=64)
    pred = model.predict(_spec("bf16-true", **big), device="H100")
    (note,) = [n for n in pred.notes if n.startswith("pure bf16")]
    assert "bf16-true" in note and "trained on no pure-precision step" in note
    assert "not calibrated for pure bf16" in note
    assert "note: pure bf16" in pred.explain()
    fp32 = model.predict(_spec("fp32", **big), device="H100")
    assert not any("pure" in n for n in fp32.notes)
    assert pred.peak_memory < fp32.peak_memory
    # without a learned model the note says what was traced, no more
    (plain,) = [n for n in ca.CostModel().predict(_spec("fp16-true"), "H100").notes if "pure" in n]
    assert plain.startswith("pure fp16 (fp16-true)") and "learned" not in plain


# --------------------------------------------------------------------------------------
# Lightning's precision strings
# --------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _quiet_lightning() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*(LeafSpec|num_workers|does not have many).*")
        yield


def _module(ns: Any) -> Any:
    class Net(ns.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self.net(x).float(), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return Net()


def _data() -> DataLoader[Any]:
    return DataLoader(TensorDataset(torch.randn(32, 64), torch.randint(0, 10, (32,))), batch_size=8)


def _trainer(ns: Any, callbacks: list[Any], **kwargs: Any) -> Any:
    return ns.Trainer(
        accelerator="cpu", max_epochs=1, limit_train_batches=2, callbacks=callbacks,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("ns_name", sorted(NAMESPACES))
@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("bf16-true", "bf16-true"),
        ("16-true", "fp16-true"),
        ("bf16-mixed", "bf16"),
        ("16-mixed", "bf16"),  # Lightning runs fp16 autocast as bf16 on a CPU
        ("32-true", "fp32"),
        ("64-true", "fp64-true"),
        ("bf16", "bf16"),  # Lightning's alias for bf16-mixed
    ],
)
def test_the_trainers_precision_string_becomes_the_specs(
    ns_name: str, given: str, canonical: str
) -> None:
    ns, _ = NAMESPACES[ns_name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's notes on CPU autocast and aliases
        trainer = _trainer(ns, [], precision=given)
    assert lightning_precision(trainer) == canonical


@pytest.mark.parametrize("ns_name", sorted(NAMESPACES))
def test_a_bf16_true_fit_is_judged_as_pure_bf16(ns_name: str) -> None:
    ns, Callback = NAMESPACES[ns_name]
    seen: dict[str, Any] = {}

    class Peek(ns.Callback):  # type: ignore[misc,name-defined]
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            seen["spec"] = spec_from_lightning(trainer, pl_module)

    callback = Callback(budget=ca.Budget(max_memory="1GiB"))
    module = _module(ns)
    _trainer(ns, [Peek(), callback], precision="bf16-true").fit(module, _data())
    spec = seen["spec"]
    assert spec.precision == "bf16-true" and spec.pure
    assert callback.prediction is not None
    assert callback.prediction.spec["precision"] == "bf16-true"
    assert any(n.startswith("pure bf16") for n in callback.prediction.notes)
    bf16_params = (64 * 256 + 256 + 256 * 10 + 10) * 2
    assert ca.dry_run(spec).param_bytes == pytest.approx(bf16_params, rel=0.05)
    assert next(module.parameters()).dtype == torch.bfloat16  # Lightning trained it in bf16


@pytest.mark.parametrize("ns_name", sorted(NAMESPACES))
def test_a_precision_lightning_does_not_know_is_said_and_the_fit_goes_on(ns_name: str) -> None:
    ns, Callback = NAMESPACES[ns_name]
    plugins = {"lightning": L.plugins.Precision, "pytorch_lightning": PL.plugins.Precision}

    class Fp8Plugin(plugins[ns_name]):  # type: ignore[misc,valid-type]
        precision = "fp8-custom"

    trainer = _trainer(ns, [], plugins=[Fp8Plugin()])
    with pytest.raises(ca.CostawareError) as info:
        lightning_precision(trainer)
    said = str(info.value)
    assert "the Trainer's precision 'fp8-custom' (from the precision plugin Fp8Plugin)" in said
    assert "is not one Lightning knows ('32-true'" in said and "'bf16-true'" in said
    assert "spec=TrainingSpec(..., precision=...)" in said
    callback = Callback(budget=ca.Budget(max_memory="1GiB"))
    with pytest.warns(ca.CostAwareWarning, match="not one Lightning knows"):
        _trainer(ns, [callback], plugins=[Fp8Plugin()]).fit(_module(ns), _data())
    assert callback.records  # it trained, measured, and was not judged


def test_a_gpus_precision_strings_become_the_specs() -> None:
    class OnAGpu:  # a Trainer's precision where CUDA runs it as given
        def __init__(self, precision: str) -> None:
            self.precision = precision

    assert lightning_precision(OnAGpu("16-mixed")) == "fp16"
    assert lightning_precision(OnAGpu("16-true")) == "fp16-true"


def test_transformer_engine_is_named_as_a_precision_costaware_does_not_model() -> None:
    class Engine:
        precision = "transformer-engine"

    with pytest.raises(ca.CostawareError, match="FP8 through NVIDIA Transformer Engine"):
        lightning_precision(Engine())


def test_a_pure_fp64_step_is_never_predicted_faster_than_its_roofline() -> None:
    """The shipped model learned no fp64 step: where the fp32 correction it carries over
    puts an fp64 step below the roofline at fp64's peak (faster than the same step in
    fp32, on a GPU whose fp64 is a fraction of its TF32), the time is held there."""
    from costaware import zoo

    def spec(precision: str) -> ca.TrainingSpec:
        return ca.TrainingSpec(
            model=functools.partial(zoo.gpt, vocab=1000, seq_len=256, dim=384, depth=4, heads=6),
            batch=ca.TokenBatch(256, 1000),
            batch_size=16,
            precision=precision,
        )

    model = ca.CostModel.default()
    fp32 = model.predict(spec("fp32"), device="H100")
    fp64 = model.predict(spec("fp64-true"), device="H100")
    assert fp64.iteration_time >= fp64.basis["analytic_time"]
    assert fp64.iteration_time > fp32.iteration_time
    assert fp64.iteration_time_upper >= fp64.iteration_time
