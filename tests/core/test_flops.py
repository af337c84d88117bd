"""The project's FLOP formulas (costaware.core.flops), each against a count worked out by hand.

Each test runs the real op (on fake tensors, as a dry run does, or on meta tensors for the
CUDA-only kernels), counts it with :func:`costaware.core.flops.count_flops`, and compares with
the arithmetic written out in the test.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import costaware as ca
import costaware.core.flops
from costaware.core.features import FEATURE_VERSION
from costaware.core.flops import PROJECT_FORMULAS, attention_pairs, count_flops

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _project_formulas(monkeypatch: pytest.MonkeyPatch) -> None:
    """The project's formulas on (see costaware.core.flops.PROJECT_FORMULAS)."""
    monkeypatch.setattr(costaware.core.flops, "PROJECT_FORMULAS", True)


class _Count(TorchDispatchMode):
    """FLOPs of every dispatched op, summed by op name."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: dict[str, int] = {}

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._overloadpacket.__name__
        self.flops[name] = self.flops.get(name, 0) + count_flops(func, args, kwargs, out)
        return out


def _count(fn: Any) -> dict[str, int]:
    """Run ``fn`` (forward and backward) on fake tensors and count its ops' FLOPs."""
    with FakeTensorMode():
        counter = _Count()
        with counter:
            fn()
    return counter.flops


def _leaf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, requires_grad=True)


# convolution --------------------------------------------------------------------------
def test_depthwise_conv_backward_counts_each_channel_once() -> None:
    # issue 42's case: 256 channels, 3x3, 16x16 (padding 1 keeps 16x16), batch 32.
    # MACs = N * H_out * W_out * weight.numel() = 32 * 16 * 16 * (256 * 1 * 3 * 3)
    #      = 8192 * 2304 = 18,874,368; forward = 2 * MACs = 37,748,736.
    # backward: input gradient 2 * MACs + weight gradient 2 * MACs = 75,497,472
    # (torch's formula counted the weight gradient 256x: 9.66 GFLOP)
    counts = _count(
        lambda: (
            F.conv2d(_leaf(32, 256, 16, 16), _leaf(256, 1, 3, 3), padding=1, groups=256)
            .sum()
            .backward()
        )
    )
    assert counts["convolution"] == 37_748_736
    assert counts["convolution_backward"] == 75_497_472


def test_grouped_strided_conv_with_bias() -> None:
    # 8 -> 12 channels in 4 groups (2 input channels each), 3x3, stride 2, padding 1, on
    # 9x9, batch 2: output (9 + 2 - 3) // 2 + 1 = 5, so 5x5.
    # weight 12 x 2 x 3 x 3 = 216 values; MACs = 2 * 25 * 216 = 10,800.
    # forward = 2 * 10,800 + bias adds (2 * 12 * 25 = 600) = 22,200.
    # backward = input grad 21,600 + weight grad 21,600 + bias grad 600 = 43,800.
    counts = _count(
        lambda: (
            F.conv2d(
                _leaf(2, 8, 9, 9), _leaf(12, 2, 3, 3), _leaf(12), stride=2, padding=1, groups=4
            )
            .sum()
            .backward()
        )
    )
    assert counts["convolution"] == 22_200
    assert counts["convolution_backward"] == 43_800


def test_dilated_conv() -> None:
    # 3 -> 4 channels, 3x3 dilated by 2 (it spans 5x5), no padding, on 10x10, batch 1:
    # output 10 - 5 + 1 = 6, so 6x6. weight 4 x 3 x 3 x 3 = 108; MACs = 36 * 108 = 3,888.
    # forward = 7,776; the input's gradient only (the weight is frozen) = 7,776.
    counts = _count(
        lambda: F.conv2d(_leaf(1, 3, 10, 10), torch.randn(4, 3, 3, 3), dilation=2).sum().backward()
    )
    assert counts["convolution"] == 7_776
    assert counts["convolution_backward"] == 7_776


def test_grouped_transposed_conv() -> None:
    # transposed, 8 -> 6 channels in 2 groups, 3x3, stride 2, on 5x5, batch 2; weight
    # 8 x 3 x 3 x 3 = 216. Each of the 2 * 8 * 25 = 400 input values is scattered through
    # the 3 output channels of its group and the 9 taps: 27 MACs each, 10,800 in all.
    # forward = 21,600; backward = input grad 21,600 + weight grad 21,600 = 43,200
    # (torch's counted the weight gradient 2x, for 64,800).
    counts = _count(
        lambda: (
            F.conv_transpose2d(_leaf(2, 8, 5, 5), _leaf(8, 3, 3, 3), stride=2, groups=2)
            .sum()
            .backward()
        )
    )
    assert counts["convolution"] == 21_600
    assert counts["convolution_backward"] == 43_200


def test_conv1d_and_unbatched_input() -> None:
    # conv1d 4 -> 6, kernel 3, on length 10, batch 3: output length 8; weight 6*4*3 = 72;
    # MACs = 3 * 8 * 72 = 1,728, forward 3,456. Unbatched (4, 10): MACs 8 * 72 = 576.
    w = (6, 4, 3)
    assert _count(lambda: F.conv1d(torch.randn(3, 4, 10), torch.randn(*w)))["convolution"] == 3_456
    assert _count(lambda: F.conv1d(torch.randn(4, 10), torch.randn(*w)))["convolution"] == 1_152


def test_the_depthwise_dry_run_counts_its_backward_as_the_forward() -> None:
    """Through a dry run: the issue's depthwise layer as a network's first layer (so the
    backward computes only the weight's gradient: 2 * MACs = the forward's count)."""

    class Depthwise(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(256, 256, 3, padding=1, groups=256, bias=False)
            self.head = nn.Linear(256, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.conv(x).mean((2, 3)))  # type: ignore[no-any-return]

    tr = ca.dry_run(
        ca.TrainingSpec(
            model=Depthwise, batch=ca.ImageBatch((256, 16, 16), classes=10), batch_size=32
        )
    )
    conv = {
        d["phase"]: d["flops"]
        for _, d in tr.graph.nodes(data=True)
        if d["op"].startswith("convolution")
    }
    assert conv == {"forward": 37_748_736, "backward": 37_748_736}


# attention ----------------------------------------------------------------------------
def _sdpa(
    q_heads: int = 4, kv_heads: int = 4, mask: torch.dtype | None = None, **kw: Any
) -> dict[str, int]:
    def run() -> None:
        if mask is not None:
            kw["attn_mask"] = torch.zeros(16, 16, dtype=mask)
        q = _leaf(2, q_heads, 16, 8)
        k, v = _leaf(2, kv_heads, 16, 8), _leaf(2, kv_heads, 16, 8)
        F.scaled_dot_product_attention(q, k, v, **kw).sum().backward()

    return _count(run)


def test_attention() -> None:
    # batch 2 x 4 heads = 8 (batch, head) pairs; 16 queries x 16 keys = 256 scores; E = 8.
    # forward: Q K^T 2 * 256 * 8 + P V 2 * 256 * 8 = 8,192 per pair, 65,536 in all.
    # backward: five products (scores again, dV, dP, dQ, dK), 2 * 256 * 8 each:
    # 5 * 4,096 * 8 = 163,840 (2.5x the forward).
    counts = _sdpa()
    assert counts["_scaled_dot_product_flash_attention_for_cpu"] == 65_536
    assert counts["_scaled_dot_product_flash_attention_for_cpu_backward"] == 163_840


def test_causal_attention_counts_the_scores_it_keeps() -> None:
    # causal: query i scores keys 0..i, 1 + 2 + ... + 16 = 136 scores of 256.
    # forward 8 * (2 * 136 * 8 * 2) = 34,816; backward 8 * 5 * (2 * 136 * 8) = 87,040.
    counts = _sdpa(is_causal=True)
    assert counts["_scaled_dot_product_flash_attention_for_cpu"] == 34_816
    assert counts["_scaled_dot_product_flash_attention_for_cpu_backward"] == 87_040


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_masked_attention_adds_the_mask(dtype: torch.dtype) -> None:
    # an additive mask (a boolean one becomes one) adds one FLOP per score, in the
    # forward and again where the backward recomputes the scores: 8 * 256 = 2,048 more.
    counts = _sdpa(mask=dtype)
    assert counts["_scaled_dot_product_flash_attention_for_cpu"] == 65_536 + 2_048
    assert counts["_scaled_dot_product_flash_attention_for_cpu_backward"] == 163_840 + 2_048


def test_grouped_query_attention_counts_the_query_heads() -> None:
    # 4 query heads over 2 key/value heads: each query head still scores 16 x 16 keys.
    counts = _sdpa(q_heads=4, kv_heads=2, enable_gqa=True)
    assert sum(v for k, v in counts.items() if "attention" in k or k == "bmm") == 65_536 + 163_840


def test_causal_pairs_of_unequal_lengths() -> None:
    # top-left aligned: 4 queries over 6 keys score 1 + 2 + 3 + 4 = 10;
    # 6 queries over 4 keys score 1 + 2 + 3 + 4 + 4 + 4 = 18
    assert attention_pairs(4, 6, causal=True) == 10
    assert attention_pairs(6, 4, causal=True) == 18
    assert attention_pairs(6, 4, causal=False) == 24


def test_gpu_attention_kernels() -> None:
    """The flash, memory-efficient and cuDNN kernels a GPU runs, counted from their
    arguments as the CPU kernel is (meta tensors: the kernels do not run here)."""
    q, k, v = (torch.empty(2, 4, 16, 8, device="meta") for _ in range(3))
    o, lse = torch.empty(2, 4, 16, 8, device="meta"), torch.empty(2, 4, 16, device="meta")
    bias = torch.empty(2, 4, 16, 16, device="meta")
    seed = torch.empty((), dtype=torch.int64, device="meta")
    # causal: 34,816 forward, 87,040 backward (test_causal_attention_counts_the_scores_it_keeps)
    flash = count_flops(
        aten._scaled_dot_product_flash_attention.default, (q, k, v, 0.0, True), {}, None
    )
    flash_bwd = count_flops(
        aten._scaled_dot_product_flash_attention_backward.default,
        (o, q, k, v, o, lse, seed, seed, 16, 16, 0.0, True, seed, seed),
        {},
        None,
    )
    assert (flash, flash_bwd) == (34_816, 87_040)
    # a bias (mask), not causal: 65,536 + 2,048 forward, 163,840 + 2,048 backward
    eff = count_flops(
        aten._scaled_dot_product_efficient_attention.default, (q, k, v, bias, True), {}, None
    )
    eff_bwd = count_flops(
        aten._scaled_dot_product_efficient_attention_backward.default,
        (o, q, k, v, bias, o, lse, seed, seed, 0.0, [True, True, True, False]),
        {"is_causal": False},
        None,
    )
    assert (eff, eff_bwd) == (67_584, 165_888)
    cudnn = count_flops(
        aten._scaled_dot_product_cudnn_attention.default,
        (q, k, v, None, True, 0.0, False),
        {},
        None,
    )
    assert cudnn == 65_536


# embedding ----------------------------------------------------------------------------
def test_embedding_backward() -> None:
    # 3 x 5 token ids into a 10 x 4 table: the forward gathers (0 FLOPs); the backward adds
    # each of the 15 x 4 = 60 gradient values into its row: 60; scaled by frequency: 120.
    def ids() -> torch.Tensor:
        return torch.randint(0, 10, (3, 5))

    plain = _count(lambda: F.embedding(ids(), _leaf(10, 4)).sum().backward())
    assert plain["embedding"] == 0 and plain["embedding_dense_backward"] == 60
    scaled = _count(
        lambda: F.embedding(ids(), _leaf(10, 4), scale_grad_by_freq=True).sum().backward()
    )
    assert scaled["embedding_dense_backward"] == 120


# norms --------------------------------------------------------------------------------
def test_layer_norm() -> None:
    # 3 x 5 x 8 = 120 elements: forward 7 per element (mean, centre, square, sum, scale,
    # weight, bias) = 840; backward 10 per element = 1,200
    counts = _count(lambda: F.layer_norm(_leaf(3, 5, 8), (8,), _leaf(8), _leaf(8)).sum().backward())
    assert (counts["native_layer_norm"], counts["native_layer_norm_backward"]) == (840, 1_200)


def test_group_norm() -> None:
    # 3 x 8 x 4 x 4 = 384 elements: 8 per element forward = 3,072, 12 backward = 4,608
    counts = _count(lambda: F.group_norm(_leaf(3, 8, 4, 4), 2, _leaf(8), _leaf(8)).sum().backward())
    assert (counts["native_group_norm"], counts["native_group_norm_backward"]) == (3_072, 4_608)


@pytest.mark.parametrize("training, fwd, bwd", [(True, 3_072, 4_608), (False, 1_536, 2_688)])
def test_batch_norm(training: bool, fwd: int, bwd: int) -> None:
    # 384 elements; training: 8 and 12 per element. Eval (running statistics): 4 forward
    # (subtract, scale, weight, bias) = 1,536, 7 backward = 2,688.
    def run() -> None:
        x = _leaf(3, 8, 4, 4)
        F.batch_norm(
            x, torch.zeros(8), torch.ones(8), _leaf(8), _leaf(8), training=training
        ).sum().backward()

    counts = _count(run)
    assert (counts["native_batch_norm"], counts["native_batch_norm_backward"]) == (fwd, bwd)


def test_rms_norm() -> None:
    # the fused kernels, as a GPU dry run traces them and as CUDA runs them: 3 x 5 x 8 =
    # 120 elements, 4 per element forward (square, sum, scale, weight) = 480, 9 backward
    # = 1,080
    import costaware.core.trace  # noqa: F401  (defines costaware::rms_norm)

    x, w = torch.empty(3, 5, 8, device="meta"), torch.empty(8, device="meta")
    rstd = torch.empty(3, 5, 1, device="meta")
    ops = torch.ops.costaware
    assert count_flops(ops.rms_norm.default, (x, [8], w, 1e-6), {}, None) == 480
    assert count_flops(ops.rms_norm_backward.default, (x, x, [8], rstd, w, True), {}, None) == 1_080
    assert count_flops(aten._fused_rms_norm.default, (x, [8], w, 1e-6), {}, None) == 480
    assert (
        count_flops(
            aten._fused_rms_norm_backward.default, (x, x, [8], rstd, w, [True, True]), {}, None
        )
        == 1_080
    )


def test_without_the_project_formulas_the_counts_are_torchs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Off, the counts are those the shipped model is fitted on (feature version 21):
    torch's depthwise backward (its weight gradient 256x: 2 * 9 * 256 * 256 * 256 * 32 =
    9,663,676,416), and CPU attention as torch counts the CUDA kernels."""
    monkeypatch.setattr(costaware.core.flops, "PROJECT_FORMULAS", False)
    counts = _count(
        lambda: (
            F.conv2d(_leaf(32, 256, 16, 16), _leaf(256, 1, 3, 3), padding=1, groups=256)
            .sum()
            .backward()
        )
    )
    assert counts["convolution_backward"] == 37_748_736 + 9_663_676_416
    assert _sdpa(is_causal=True)["_scaled_dot_product_flash_attention_for_cpu"] == 65_536
    assert ("22" if PROJECT_FORMULAS else "21") == FEATURE_VERSION
