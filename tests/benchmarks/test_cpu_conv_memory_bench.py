"""benchmarks/cpu_conv_memory.py: oneDNN's convolution buffers measured on this CPU."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import cpu_conv_memory  # noqa: E402


@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN convolution"
)
def test_the_onednn_block_brings_single_convolutions_to_their_measured_peaks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = torch.get_num_threads()
    try:
        assert cpu_conv_memory.main(["--n", "40", "--seed", "0"]) == 0
    finally:
        torch.set_num_threads(before)
    text = capsys.readouterr().out
    figures = {
        (phase, how): (float(m.group(1)), float(m.group(2)))
        for phase in ("forward", "backward")
        for how in ("tensors only", "with the oneDNN block")
        if (m := re.search(rf"{phase}\s+{how}.*?mean\s+([\d.]+)%\s+median\s+([\d.]+)%", text))
    }
    assert len(figures) == 4, text
    for phase in ("forward", "backward"):
        # the returned tensors alone miss the blocked copies; the block comes close
        assert figures[(phase, "tensors only")][1] > 40
        assert figures[(phase, "with the oneDNN block")][1] < 5


def test_a_convolution_outside_onednn_is_not_measured() -> None:
    # at batch 1 a small 1x1 convolution on one thread runs PyTorch's own kernel
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        case = cpu_conv_memory.Case(1, 16, 16, 8, 1, 1, 0, False, True)
        assert cpu_conv_memory.measure(case) is None
    finally:
        torch.set_num_threads(before)
