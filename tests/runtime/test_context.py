"""The CUDA context a study measured replaces the catalog's default in its decisions."""

from __future__ import annotations

from pathlib import Path

import torch

import costaware as ca
from costaware.runtime.gate import Gate
from costaware.runtime.store import ObservationStore

MiB = 2**20


def test_the_studys_measured_context_replaces_the_default(tmp_path: Path) -> None:
    store = ObservationStore(f"sqlite:///{tmp_path / 'study.db'}")
    h100 = ca.get_device("H100")
    assert Gate(ca.Budget(), "H100", store=store).resolved_device() == h100  # none measured
    for trial, context in enumerate((900 * MiB, 1_000 * MiB, 1_300 * MiB)):
        store.record_measurement(
            study="s", trial=trial, epoch=0, status="ok", device="H100-SXM",
            actual={"peak_memory": 2**30, "context_bytes": context},
        )  # fmt: skip
    store.record_measurement(  # another GPU's context is not this one's
        study="s", trial=9, epoch=0, status="ok", device="A10",
        actual={"peak_memory": 2**30, "context_bytes": 5 * 2**30},
    )  # fmt: skip
    gate = Gate(ca.Budget(max_memory="8GiB"), "H100", store=store)
    assert gate.resolved_device().context_overhead_bytes == 1_000 * MiB  # the median
    net = torch.nn.Linear(16, 4)
    verdict = gate.judge(ca.TrainingSpec.from_module(net, torch.randn(8, 16)), study="s", trial=3)
    assert verdict.decision is not None
    assert verdict.decision.checked["memory"]["context"] == 1_000 * MiB
