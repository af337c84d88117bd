"""torch.compile'd models: detected, dry-run in eager mode (no compiled code runs), and
said so in the prediction."""

from __future__ import annotations

import warnings
from typing import Any

import lightning.pytorch as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import costaware as ca
from costaware.core.trace import COMPILED_NOTE
from costaware.integrations.lightning import spec_from_lightning
from costaware.spec import compiled_parts

# torch.compile is lazy: wrapping a module compiles nothing until it is called
dynamo = pytest.importorskip("torch._dynamo")


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 16), torch.randint(0, 4, (8,))


def _compiled_frames() -> int:
    return int(sum(dynamo.utils.counters["frames"].values()))


def _eager_figures() -> ca.Prediction:
    return ca.CostModel().predict(ca.TrainingSpec.from_module(_net(), _batch()), "H100")


@pytest.mark.parametrize("how", ["torch.compile(net)", "net.compile()", "a compiled child"])
def test_a_compiled_module_is_predicted_as_eager_mode_and_says_so(how: str) -> None:
    net = _net()
    if how == "torch.compile(net)":
        given: nn.Module = torch.compile(net)
    elif how == "net.compile()":
        net.compile()
        given = net
    else:
        net[0] = torch.compile(net[0])  # type: ignore[assignment]
        given = net
    assert compiled_parts(given)
    before = _compiled_frames()
    spec = ca.TrainingSpec.from_module(given, _batch())
    assert spec.compiled and spec.summary()["compiled"] is True
    assert spec.display_name == "Sequential"
    pred = ca.CostModel().predict(spec, "H100")
    assert COMPILED_NOTE in pred.notes
    assert "figures are those of eager mode" in pred.explain()
    eager = _eager_figures()
    assert pred.peak_memory == eager.peak_memory and pred.basis["flops"] == eager.basis["flops"]
    assert COMPILED_NOTE not in eager.notes
    assert _compiled_frames() == before  # the dry run ran no compiled code
    # the user's module keeps its compilation and its real parameters
    assert compiled_parts(given) and all(p.device.type == "cpu" for p in given.parameters())


def test_a_factory_that_compiles_its_model_is_traced_eager_and_said_so() -> None:
    spec = ca.TrainingSpec(
        model=lambda: torch.compile(_net()),
        batch=ca.ImageBatch((16,), classes=4),
        batch_size=8,
    )
    before = _compiled_frames()
    pred = ca.CostModel().predict(spec, "H100")
    assert COMPILED_NOTE in pred.notes
    assert _compiled_frames() == before


def test_compiled_must_be_a_bool() -> None:
    with pytest.raises(ca.SpecError, match=r"compiled must be True or False.*got compiled=.yes."):
        ca.TrainingSpec(
            model=_net, batch=ca.ImageBatch((16,), classes=4), batch_size=2, compiled="yes"
        )  # type: ignore[arg-type]


def test_a_lightning_module_given_to_fit_compiled_is_judged_as_eager_mode() -> None:
    class Net(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = _net()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    from lightning.pytorch.utilities.compile import from_compiled

    module = from_compiled(torch.compile(Net()))  # what Trainer.fit does with a compiled one
    assert compiled_parts(module) == [""]
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    data = DataLoader(TensorDataset(*_batch()), batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit_loop._data_source.instance = data  # as fit sets it, without fitting
    before = _compiled_frames()
    spec = spec_from_lightning(trainer, module)
    assert spec.compiled
    pred = ca.CostModel().predict(spec, "H100")
    assert COMPILED_NOTE in pred.notes
    assert _compiled_frames() == before
    assert module._compiler_ctx is not None  # the user's module is left as it was
