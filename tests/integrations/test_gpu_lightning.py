"""CostAwareCallback on a real GPU, with nothing but torch and Lightning: it runs on the
lent GPU machines (``bash data/gpu_window.sh check``), which have neither Optuna nor a
store's SQLAlchemy. Skipped without a CUDA GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning.pytorch")  # a GPU machine without it skips, not errors

from costaware.integrations.lightning import CostAwareCallback, CostAwareWarning  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


class _Tiny(L.LightningModule):  # type: ignore[misc,name-defined]
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(64, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _train(cb: CostAwareCallback) -> None:
    data = TensorDataset(torch.randn(32, 64), torch.randn(32, 1))
    trainer = L.Trainer(
        accelerator="gpu", devices=1, max_epochs=1, callbacks=[cb], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(_Tiny(), DataLoader(data, batch_size=8))


def test_memory_an_earlier_trial_left_is_recorded() -> None:
    """Trials of one study share a process: what an earlier one left on the device is in
    the next one's reserved peak. The callback collects garbage in reference cycles first,
    then records what is still held (and warns): the store keeps such a peak out of the
    refit (``tests/runtime/test_store.py``)."""
    leak = torch.empty(768 * 2**20, dtype=torch.uint8, device="cuda")  # still referenced

    class Cycle:  # unreachable but for a cycle: gc.collect frees it
        def __init__(self) -> None:
            self.me = self
            self.t = torch.empty(1024 * 2**20, dtype=torch.uint8, device="cuda")

    Cycle()
    cb = CostAwareCallback()
    with pytest.warns(CostAwareWarning, match="already reserved when training started"):
        _train(cb)
    (row,) = cb.measurements
    held = row["actual"]["held_before"]
    assert 768 * 2**20 <= held < (768 + 256) * 2**20  # the leak, not the collected cycle
    assert row["actual"]["peak_memory"] >= held
    del leak
    torch.cuda.empty_cache()
    clean = CostAwareCallback()
    _train(clean)
    assert clean.measurements[0]["actual"]["held_before"] < 256 * 2**20
