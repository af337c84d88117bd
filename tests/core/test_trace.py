from __future__ import annotations

import dataclasses
import functools
import resource
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import costaware as ca
from costaware import zoo
from costaware.core.trace import CATEGORIES, rescale
from tests.conftest import tiny_cnn

MiB = 2**20


def test_trace_records_graph_timeline_and_breakdown(cnn_spec: ca.TrainingSpec) -> None:
    tr = ca.dry_run(cnn_spec)
    g = tr.graph
    assert isinstance(g, nx.DiGraph) and g.number_of_nodes() > 10
    assert nx.is_directed_acyclic_graph(g)
    ops = {d["op"] for _, d in g.nodes(data=True)}
    assert {"convolution", "convolution_backward", "native_batch_norm", "addmm"} <= ops
    for _, d in g.nodes(data=True):
        assert {"op", "phase", "flops", "bytes", "dtype"} <= d.keys()
    # the timeline is the running sum of 512-byte-rounded storages and peaks at peak_live
    assert tr.peak_live == int(tr.timeline.max())
    assert tr.timeline[-1] >= 0
    assert sum(tr.peak_breakdown.values()) == tr.peak_live
    assert set(tr.peak_breakdown) == set(CATEGORIES)
    # parameters: every parameter's storage rounded to 512 B, exactly
    model = tiny_cnn(width=8)
    expected = sum(-(-p.numel() * 4 // 512) * 512 for p in model.parameters())
    assert tr.param_bytes == expected
    assert tr.param_count == sum(p.numel() for p in model.parameters())
    # AdamW keeps two moments per parameter (plus a step counter each)
    assert tr.optimizer_state_bytes >= 2 * tr.param_bytes
    assert tr.peak_breakdown["activations"] > 0
    assert tr.flops_forward > 0 and tr.flops_backward > tr.flops_forward
    assert tr.build == "meta"


class _PartlyTrained(nn.Module):
    """Two linears the loss reaches, one frozen, one the forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 10)
        self.frozen = nn.Linear(16, 16)
        self.frozen.requires_grad_(False)
        self.unused = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(self.frozen(x))))  # type: ignore[no-any-return]


def test_param_tensors_counts_what_the_optimizer_steps(cnn_spec: ca.TrainingSpec) -> None:
    """``param_tensors`` is the parameter tensors that got a gradient (the CPU's share of
    a step per tensor): not the frozen ones, not the unused ones."""
    tr = ca.dry_run(cnn_spec)
    assert tr.param_tensors == len(list(tiny_cnn(width=8).parameters()))
    spec = ca.TrainingSpec(
        model=_PartlyTrained, batch=ca.ImageBatch((16,), classes=10), batch_size=8
    )
    part = ca.dry_run(spec)
    assert part.param_tensors == 4  # a and b: weight and bias each
    assert part.summary()["param_tensors"] == 4
    assert ca.CostModel().features(spec, "cpu")["param_tensors"] == 4.0


def test_optimizer_state_depends_on_optimizer(cnn_spec: ca.TrainingSpec) -> None:
    import dataclasses

    sgd = ca.dry_run(dataclasses.replace(cnn_spec, optimizer="sgd"))
    mom = ca.dry_run(
        dataclasses.replace(cnn_spec, optimizer="sgd", optimizer_kwargs={"momentum": 0.9})
    )
    adam = ca.dry_run(cnn_spec)
    assert sgd.optimizer_state_bytes == 0
    assert mom.optimizer_state_bytes == pytest.approx(sgd.param_bytes, rel=0.01)
    assert adam.peak_live > mom.peak_live > sgd.peak_live


def test_flat_optimizer_step_matches_the_real_step(cnn_spec: ca.TrainingSpec) -> None:
    import dataclasses

    # a GPU's dry run takes the multi-tensor step: "adamw" by name on one flat tensor, the
    # class itself for real (a CPU's steps one tensor at a time, and never flat)
    fast = ca.dry_run(cnn_spec, attention="fused")
    exact = ca.dry_run(
        dataclasses.replace(cnn_spec, optimizer=torch.optim.AdamW), attention="fused"
    )
    # the real step keeps one scalar step counter per parameter (512 B each on the allocator)
    n_params = len(list(tiny_cnn(width=8).parameters()))
    assert abs(exact.peak_live - fast.peak_live) <= n_params * 512
    assert fast.phase_peaks["optimizer"] == pytest.approx(
        exact.phase_peaks["optimizer"], abs=n_params * 512
    )


def test_second_step_holds_optimizer_state(cnn_spec: ca.TrainingSpec) -> None:
    tr = ca.dry_run(cnn_spec)
    steps = [i for i, name in tr.marks if name == "step"]
    assert len(steps) == 2  # step 2 is synthesised from step 1
    first = tr.timeline[steps[0] : steps[1]].max()
    second = tr.timeline[steps[1] :].max()
    assert second >= first
    assert tr.peak_breakdown["optimizer_state"] == tr.optimizer_state_bytes


def test_mixed_precision_runs_matmuls_in_half(cnn_spec: ca.TrainingSpec) -> None:
    import dataclasses

    fp32 = ca.dry_run(cnn_spec)
    bf16 = ca.dry_run(dataclasses.replace(cnn_spec, precision="bf16"))
    assert 1 in set(bf16.node_dtype.tolist())  # bf16 code
    assert 1 not in set(fp32.node_dtype.tolist())
    assert bf16.flops == pytest.approx(fp32.flops)


def test_attention_flops_are_counted_on_cpu() -> None:
    from costaware import zoo

    spec = ca.TrainingSpec(
        model=functools.partial(zoo.gpt, vocab=128, seq_len=32, dim=64, depth=2, heads=4),
        batch=ca.TokenBatch(32, 128),
        batch_size=2,
    )
    tr = ca.dry_run(spec)
    attn = [d["flops"] for _, d in tr.graph.nodes(data=True) if "scaled_dot_product" in d["op"]]
    assert attn and all(f > 0 for f in attn)


def test_rescaling_matches_a_fresh_trace(cnn_spec: ca.TrainingSpec) -> None:
    t16 = ca.dry_run(cnn_spec)
    t48 = ca.dry_run(cnn_spec.with_batch_size(48))
    exact = ca.dry_run(cnn_spec.with_batch_size(32))
    one = rescale(t16, 32)
    two = rescale(t16, 32, t48)
    assert one.peak_live == pytest.approx(exact.peak_live, rel=0.01)
    assert two.peak_live == pytest.approx(exact.peak_live, abs=512 * 4)
    assert two.flops == pytest.approx(exact.flops, rel=1e-6)
    assert rescale(t16, 16) is t16


def test_huge_model_traces_without_allocating_it() -> None:
    # ~6.4 billion parameters: 25.6 GB in fp32, more than this machine's memory
    def huge() -> nn.Module:
        return nn.Sequential(*[nn.Linear(40_000, 40_000, bias=False) for _ in range(4)])

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    spec = ca.TrainingSpec(
        model=huge, batch=ca.ImageBatch((40_000,), classes=40_000), batch_size=1, optimizer="sgd"
    )
    tr = ca.dry_run(spec)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert tr.param_count == 4 * 40_000**2
    assert tr.peak_live > 2 * tr.param_count * 4  # params + grads, at least
    assert grown_kib < 1024 * 1024  # the process grew by less than 1 GiB


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if y.sum() > 0:  # a Python branch on a tensor value
            return y
        return -y


class Nonzero(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y[y > 0].sum().reshape(1, 1).expand(x.shape[0], 8)


@pytest.mark.parametrize("cls", [DataDependent, Nonzero])
def test_untraceable_models_raise_a_clear_error(cls: type[nn.Module]) -> None:
    spec = ca.TrainingSpec(model=cls, batch=ca.ImageBatch((8,), classes=8), batch_size=2)
    with pytest.raises(ca.UntraceableModelError, match="cannot run on fake tensors"):
        ca.dry_run(spec)


class Slow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pass
        return self.fc(x)


def test_a_hang_hits_the_time_limit() -> None:
    spec = ca.TrainingSpec(model=Slow, batch=ca.ImageBatch((8,), classes=8), batch_size=2)
    t0 = time.monotonic()
    with pytest.raises(ca.TraceTimeout, match="time limit"):
        ca.dry_run(spec, timeout=0.5)
    assert time.monotonic() - t0 < 10


def test_constructor_that_computes_falls_back_to_a_real_cpu_build() -> None:
    class Computed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            widths = (torch.arange(1, 3) * 8).tolist()  # fails on meta: no data there
            self.a = nn.Linear(8, widths[0])
            self.b = nn.Linear(widths[0], widths[1])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(x)))

    spec = ca.TrainingSpec(model=Computed, batch=ca.ImageBatch((8,), classes=16), batch_size=2)
    tr = ca.dry_run(spec)
    assert tr.build == "cpu"
    assert any("built for real on the CPU" in n for n in tr.notes)


def test_module_instance_is_left_untouched() -> None:
    model = tiny_cnn()
    before = [p.detach().clone() for p in model.parameters()]
    spec = ca.TrainingSpec(model=model, batch=ca.ImageBatch((3, 16, 16), classes=10), batch_size=4)
    tr = ca.dry_run(spec)
    assert tr.build == "module"
    for p, q in zip(model.parameters(), before):
        assert p.device.type == "cpu" and torch.equal(p.detach(), q)
        assert p.grad is None


def test_custom_batch_and_loss() -> None:
    def batch(n: int) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(n, 8), "target": torch.randn(n, 4)}

    def loss(model: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        return nn.functional.mse_loss(model(b["x"]), b["target"])

    spec = ca.TrainingSpec(
        model=lambda: nn.Linear(8, 4), batch=batch, batch_size=5, loss=loss, optimizer="sgd"
    )
    tr = ca.dry_run(spec)
    assert tr.peak_live > 0
    bad = ca.TrainingSpec(
        model=lambda: nn.Linear(8, 4), batch=batch, batch_size=5, loss=lambda m, b: m(b["x"])
    )
    with pytest.raises(ca.SpecError, match="scalar"):
        ca.dry_run(bad)


def test_events_are_consistent(cnn_spec: ca.TrainingSpec) -> None:
    tr = ca.dry_run(cnn_spec)
    keys, sizes = tr.events[:, 0], tr.events[:, 1]
    live: set[int] = set()
    for k, s in zip(keys.tolist(), sizes.tolist()):
        if s > 0:
            assert k not in live
            live.add(k)
        else:
            assert k in live
            live.remove(k)
    assert np.all(sizes != 0)


def _conv_stack() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),  # 3x3: a transient in its backward
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1, groups=32),  # depthwise: none
        nn.Conv2d(32, 64, 1),  # 1x1: none
        nn.Conv2d(64, 64, 3, padding=1, groups=2),  # grouped, not depthwise: one
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def test_conv_backward_transients_are_input_plus_output_gradient() -> None:
    from costaware.core.allocator import simulate

    spec = ca.TrainingSpec(
        model=_conv_stack, batch=ca.ImageBatch((3, 32, 32), classes=10), batch_size=8
    )
    tr = ca.dry_run(spec, attention="fused")  # as a GPU runs it
    first = 8 * 3 * 32 * 32 * 4 + 8 * 32 * 32 * 32 * 4  # input + output gradient, fp32
    grouped = 2 * 8 * 64 * 32 * 32 * 4
    # backward runs last layer first; step 2 repeats step 1's transients
    assert tr.transients[:, 1].tolist() == [grouped, first, grouped, first]
    steps = [i for i, name in tr.marks if name == "step"]
    assert tr.transients[1, 0] < steps[1] <= tr.transients[2, 0]
    # the live timeline and the events do not hold them
    events = tr.allocator_events()
    assert len(events) == len(tr.events) + 2 * len(tr.transients)
    assert np.array_equal(events[events[:, 0] <= tr.events[:, 0].max()], tr.events)
    assert tr.peak_live == int(tr.timeline.max())
    with_blocks, without = simulate(events), simulate(tr.events)
    assert with_blocks.peak_allocated > without.peak_allocated
    assert with_blocks.peak_reserved >= without.peak_reserved
    # each is allocated and freed again right before the event it was recorded at
    pos = int(tr.transients[0, 0])  # no transient precedes the first one
    assert events[pos, 1] == grouped and events[pos + 1, 1] == -1
    assert events[pos, 0] == events[pos + 1, 0]
    # rescaled with the batch, like the activations they are made of
    assert rescale(tr, 16).transients[:, 1].tolist() == [2 * b for b in tr.transients[:, 1]]
    assert np.array_equal(rescale(tr, 16).transients[:, 0], tr.transients[:, 0])


def test_gpu_estimate_replays_cudnn_blocks_and_a_cpu_trace_has_none_of_them() -> None:
    from costaware.core import analytic
    from costaware.core.trace import exact_live_peak
    from costaware.devices import get_device

    spec = ca.TrainingSpec(
        model=_conv_stack, batch=ca.ImageBatch((3, 64, 64), classes=10), batch_size=32
    )
    tr = ca.dry_run(spec, attention="fused")
    bare = dataclasses.replace(tr, transients=tr.transients[:0])
    gpu, cpu = get_device("H100"), get_device("cpu")
    assert analytic.estimate(tr, spec, gpu).reserved > analytic.estimate(bare, spec, gpu).reserved
    # a CPU runs these convolutions through oneDNN: its blocked copies, not cuDNN's block
    on_cpu = ca.dry_run(spec)
    assert not np.array_equal(on_cpu.transients[:, 1], tr.transients[:, 1])
    assert analytic.estimate(on_cpu, spec, cpu).reserved == exact_live_peak(
        on_cpu.allocator_events()
    )


def _two_convs(c_in: int = 16, c: int = 16, side: int = 32) -> nn.Module:
    """Two 3x3 convolutions on a ``c_in x side x side`` input and a linear head."""
    return nn.Sequential(
        nn.Conv2d(c_in, c, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(c, c, 3, padding=1),
        nn.Flatten(),
        nn.Linear(c * side * side, 4),
    )


def test_a_cpu_trace_holds_the_columns_of_pytorchs_own_convolution() -> None:
    from costaware.core.analytic import estimate
    from costaware.core.trace import exact_live_peak
    from costaware.devices import cpu_device
    from costaware.measure.profile import allocator_peak

    # at batch 1 a small fp32 convolution runs through PyTorch's own kernel (not oneDNN),
    # which copies its input into im2col columns forward and back
    spec = ca.TrainingSpec(
        model=_two_convs,
        batch=ca.ImageBatch((16, 32, 32), classes=4),
        batch_size=1,
        optimizer="sgd",
    )
    tr = ca.dry_run(spec)
    columns = 16 * 3 * 3 * 32 * 32 * 4
    # two convolutions forward, two backward (the first has no input gradient, but its
    # weight gradient takes the columns too), in each of the two steps
    assert tr.transients[:, 1].tolist() == [columns] * 8
    measured = allocator_peak(spec).peak
    assert measured is not None
    est = estimate(tr, spec, cpu_device()).reserved
    assert est == pytest.approx(measured, rel=0.02)
    assert exact_live_peak(tr.events) < 0.9 * measured  # without the columns: under
    # at batch 2 oneDNN takes them: no columns, its blocked copies of the tensors instead
    at_two = ca.dry_run(dataclasses.replace(spec, batch_size=2))
    assert columns * 2 not in at_two.transients[:, 1].tolist()
    assert at_two.transients[:, 1].max() < columns


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def torch_threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """Run with 1 torch thread (as the CPU corpus was measured) and with 2: some of
    oneDNN's weight-gradient buffers are per thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield int(request.param)
    torch.set_num_threads(before)


class _PatchEmbedding(nn.Module):
    """A ViT's patch embedding: a 64x64 image cut into 16x16 patches of 192 features."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 192, 16, stride=16)
        self.head = nn.Linear(192 * 16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.patch(x).flatten(1))
        return out


@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN convolution"
)
@pytest.mark.parametrize(
    ("model", "sample", "batch_size", "weight"),
    [
        # 3x3 convolutions on a 2x2 input, as ResNet's last stages see a 32x32 image: the
        # weight gradient of a kernel larger than its input takes four weight-sized
        # buffers per thread, beside the blocked copies of the tensors
        (functools.partial(_two_convs, 64, 128, 2), (64, 2, 2), 4, 128 * 128 * 9 * 4),
        # a ViT's 16x16 patch embedding: the same four buffers
        (_PatchEmbedding, (3, 64, 64), 8, 192 * 3 * 16 * 16 * 4),
    ],
    ids=["3x3-at-2x2", "patch-16"],
)
def test_a_cpu_trace_holds_onednns_buffers_inside_a_convolution(
    model: Callable[[], nn.Module],
    sample: tuple[int, int, int],
    batch_size: int,
    weight: int,
    torch_threads: int,
) -> None:
    from costaware.core.analytic import estimate
    from costaware.core.trace import exact_live_peak
    from costaware.devices import cpu_device
    from costaware.measure.profile import allocator_peak

    spec = ca.TrainingSpec(
        model=model,
        batch=ca.ImageBatch(sample, classes=4),
        batch_size=batch_size,
        optimizer="sgd",
    )
    from costaware.core.trace import cpu_capability

    tr = ca.dry_run(spec)
    # with AVX-512 a small kernel larger than its input holds one weight-sized buffer,
    # not four per thread (the 16x16 patch embedding holds them on both)
    small = model is not _PatchEmbedding and "AVX512" in cpu_capability()
    assert tr.transients[:, 1].max() >= (1 if small else 4 * torch_threads) * weight
    measured = allocator_peak(spec).peak
    assert measured is not None
    assert estimate(tr, spec, cpu_device()).reserved == pytest.approx(measured, rel=0.03)
    # the tensors alone: far under (15% under with AVX-512's one buffer)
    assert exact_live_peak(tr.events) < (0.9 if small else 0.8) * measured


@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN for the LSTM"
)
def test_a_cpu_trace_holds_the_lstm_workspace_onednn_keeps_for_the_backward() -> None:
    from costaware import zoo
    from costaware.core.analytic import estimate
    from costaware.core.trace import exact_live_peak
    from costaware.devices import cpu_device
    from costaware.measure.profile import allocator_peak

    spec = ca.TrainingSpec(
        model=lambda: zoo.rnn("lstm", vocab=500, embed=64, hidden=256, layers=1),
        batch=ca.TokenBatch(seq_len=64, vocab=500),
        batch_size=2,  # far from the 64 steps: the layer gets them time-major, batch_first
        optimizer="sgd",
    )
    tr = ca.dry_run(spec)
    assert "mkldnn_rnn_layer" in tr.op_counts  # the layer this CPU runs, not unrolled
    measured = allocator_peak(spec).peak
    assert measured is not None
    assert estimate(tr, spec, cpu_device()).reserved == pytest.approx(measured, rel=0.03)
    # with the fake kernel's empty workspace and no buffers the dry run was far under
    assert exact_live_peak(tr.events) < 0.85 * measured


class _OneLSTM(nn.Module):
    """One nn.LSTM layer on a learned (T, B, I) input, as costaware.measure.opbench times it."""

    def __init__(self, t: int, b: int, i: int, h: int) -> None:
        super().__init__()
        self.x = nn.Parameter(torch.randn(t, b, i))
        self.lstm = nn.LSTM(i, h)

    def forward(self, _batch: object) -> torch.Tensor:
        out: torch.Tensor = self.lstm(self.x)[0]
        return out


def _lstm_spec(t: int, b: int, i: int, h: int) -> ca.TrainingSpec:
    return ca.TrainingSpec(
        model=lambda: _OneLSTM(t, b, i, h),
        batch=lambda n: torch.zeros(n),
        batch_size=1,
        optimizer="sgd",
        loss=lambda m, batch: m(batch).sum(),
    )


@pytest.mark.parametrize(
    ("shape", "measured"),
    [
        # H100 rows of data/gpu/h100-ops-seed0.jsonl.gz (fp32, forward and backward):
        # lstm-f5d148e0e399 and lstm-84a3e9deb9ae, their peak_alloc in bytes
        ((124, 103, 30, 975), 664_245_248),
        ((8, 21, 144, 1880), 209_135_616),
    ],
)
def test_a_gpu_trace_holds_cudnns_recurrent_backward_work_space(
    shape: tuple[int, int, int, int], measured: int
) -> None:
    from costaware.core.allocator import simulate

    tr = ca.dry_run(_lstm_spec(*shape), attention="fused")
    assert tr.op_counts["rnn_backward"] == 1  # one layer: one block in each of two steps
    assert len(tr.transients) == 2
    assert simulate(tr.allocator_events()).peak_allocated == pytest.approx(measured, rel=0.06)
    # without the block the replay was 0.6x the measured peak
    bare = dataclasses.replace(tr, transients=tr.transients[:0])
    assert simulate(bare.allocator_events()).peak_allocated < 0.7 * measured
    # a CPU runs the layer through oneDNN: no cuDNN block there
    assert "rnn_backward" not in ca.dry_run(_lstm_spec(8, 4, 16, 32)).op_counts


def test_a_rescaled_trace_keeps_the_fixed_part_of_cudnns_recurrent_block() -> None:
    """The block's floor and its weight-sized part do not grow with the batch: a trace
    rescaled from one batch size holds the block a dry run at the other one holds."""
    small = ca.dry_run(_lstm_spec(16, 2, 64, 256), attention="fused")
    large = ca.dry_run(_lstm_spec(16, 32, 64, 256), attention="fused")
    assert (small.transients[:, 2] > 0).all()  # an 8 MiB floor, the weights' part
    assert small.transients[0, 2] == large.transients[0, 2]
    # the spec's batch size is 1 (the LSTM's batch, 2 and 32, is in the model): a rescale
    # by 16 stands for the larger one
    grown = rescale(small, 16)
    assert grown.transients[:, 1] == pytest.approx(
        small.transients[:, 2] + 16 * (small.transients[:, 1] - small.transients[:, 2]), abs=1
    )
    assert grown.transients[:, 1] == pytest.approx(large.transients[:, 1], abs=16 * 512)
    assert (grown.transients[:, 1] < 16 * small.transients[:, 1]).all()
    assert (grown.transients[:, 2] == small.transients[:, 2]).all()


def _attention_spec(**kw: object) -> ca.TrainingSpec:
    from costaware import zoo

    return ca.TrainingSpec(
        model=lambda: zoo.gpt(vocab=64, seq_len=256, dim=64, depth=2, heads=4, **kw),  # type: ignore[arg-type]
        batch=ca.TokenBatch(seq_len=256, vocab=64),
        batch_size=8,
    )


def test_fused_attention_drops_the_score_matrix() -> None:
    """With dropout on, this CPU traces SDPA as math (B*H*L*L scores); a GPU does not."""
    spec = _attention_spec(dropout=0.1)
    native = ca.dry_run(spec)
    fused = ca.dry_run(spec, attention="fused")
    assert native.op_counts["_safe_softmax"] > 0
    assert fused.op_counts["_safe_softmax"] == 0
    assert fused.op_counts["_scaled_dot_product_flash_attention_for_cpu"] == 2
    scores = 8 * 4 * 256 * 256 * 4  # one layer's fp32 scores
    assert fused.peak_live < native.peak_live - 2 * scores
    assert any("fused flash kernel" in n for n in fused.notes)
    assert not any("fused flash kernel" in n for n in native.notes)
    with pytest.raises(ValueError, match="attention"):
        ca.dry_run(spec, attention="flash")


def test_fused_attention_covers_multihead_attention() -> None:
    from costaware import zoo

    spec = ca.TrainingSpec(
        model=lambda: zoo.bert(vocab=64, seq_len=128, dim=64, depth=1, heads=4, dropout=0.1),
        batch=ca.TokenBatch(seq_len=128, vocab=64),
        batch_size=4,
    )
    native = ca.dry_run(spec)
    fused = ca.dry_run(spec, attention="fused")
    assert native.op_counts["_safe_softmax"] > 0
    assert fused.op_counts["_safe_softmax"] == 0
    assert fused.peak_live < native.peak_live


def test_predictions_trace_attention_by_device_kind() -> None:
    model = ca.CostModel()
    spec = _attention_spec(dropout=0.1)
    gpu = model.predict(spec, device="H100")
    cpu = model.predict(spec, device="CPU")
    assert "fused flash kernel" in gpu.explain()
    assert "fused flash kernel" not in cpu.explain()
    assert gpu.basis["live_peak"] < cpu.basis["live_peak"]
    # each kind keeps its own cached trace
    assert model.predict(spec, device="H100").basis["trace_source"] == "cached"
    assert model.predict(spec, device="CPU").basis["live_peak"] == cpu.basis["live_peak"]


class _TinyLM(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.emb, self.out = nn.Embedding(vocab, 8), nn.Linear(8, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(ids))


def _classifier(classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(48, classes))


@pytest.mark.parametrize("attention", ["native", "fused"])
def test_a_batch_whose_labels_or_ids_overrun_the_model_is_a_spec_error(attention: str) -> None:
    def run(model: Callable[[], nn.Module], batch: object, **kw: object) -> ca.Trace:
        spec = ca.TrainingSpec(model=model, batch=batch, batch_size=4, **kw)  # type: ignore[arg-type]
        return ca.dry_run(spec, attention=attention)

    # ImageBatch's default 1000 classes against a 10-way head: a real step fails (target
    # out of bounds), so the dry run says so instead of predicting a step that cannot run
    with pytest.raises(ca.SpecError, match=r"labels \(classes=1000\).*over 10 classes.*classes=10"):
        run(functools.partial(_classifier, 10), ca.ImageBatch((3, 4, 4)))
    with pytest.raises(ca.SpecError, match=r"input_ids \(vocab=500\).*embedding of 100 rows"):
        run(functools.partial(_TinyLM, 100), ca.TokenBatch(16, 500))
    with pytest.raises(ca.SpecError, match=r"SegmentationBatch\(\.\.\., classes=3\)"):
        run(lambda: nn.Conv2d(3, 3, 1), ca.SegmentationBatch((3, 4, 4), classes=21))
    # what fits runs: labels below the head's size, a vocabulary the model covers, and a
    # loss that maps the labels into range first
    assert run(functools.partial(_classifier, 10), ca.ImageBatch((3, 4, 4), classes=10)).peak_live
    assert run(functools.partial(_TinyLM, 100), ca.TokenBatch(16, 60)).peak_live
    mapped = run(
        functools.partial(_classifier, 10),
        ca.ImageBatch((3, 4, 4)),
        loss=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1] % 10),
    )
    assert mapped.peak_live


def test_a_simulated_cpu_without_avx512_runs_a_half_convolution_as_pytorchs_own() -> None:
    """PyTorch asks the CPU it runs on whether oneDNN has native half precision: a row
    measured on an AVX2 CPU ran its bf16 convolutions as PyTorch's own (im2col columns
    inside the op), and its dry run must too on an AVX-512 CPU, where oneDNN would take
    them (the committed AVX2 rows' bf16 U-Nets came out 37% under)."""
    from costaware.core.trace import (
        _cpu_conv_transient,
        _onednn_conv_transient,
        simulated_cpu_capability,
    )

    inp = torch.zeros(2, 8, 16, 16, dtype=torch.bfloat16)
    weight = torch.zeros(8, 8, 3, 3, dtype=torch.bfloat16)
    out = torch.zeros(2, 8, 16, 16, dtype=torch.bfloat16)
    args = (inp, weight, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    columns = 2 * 8 * 3 * 3 * 16 * 16 * 2  # batch x in x kernel area x positions x 2 bytes
    with simulated_cpu_capability("AVX2"):
        assert _cpu_conv_transient(args, False, out) == columns
    # fp32 is oneDNN's on either instruction set: blocked copies, not columns
    f32 = (inp.float(), weight.float(), None, *args[3:])
    with simulated_cpu_capability("AVX2"):
        blocked = _onednn_conv_transient(inp.float(), weight.float(), out.float(), 1, False, None)
        assert _cpu_conv_transient(f32, False, out.float()) == blocked != 2 * columns


def test_a_channels_last_depthwise_conv_holds_its_weight_gradients_partial_sums() -> None:
    """A ConvNeXt block's 7x7 depthwise convolution takes its input channels-last (after
    the permuted LayerNorm), and oneDNN's channels-last kernel then holds 256 partial sums
    per weight element for the weight gradient (measured: 6.1 MiB at 128 channels, the
    most of a small ConvNeXt's CPU step, whose memory came out 45% under without it).
    Laid out NCHW, or at 3x3, it holds no such buffer; a 1x1 map permuted from NHWC
    counts as channels-last, as PyTorch's convolution reads it."""
    from costaware.core.trace.transients import _channels_last, _onednn_conv_transient

    c, n = 128, 4
    weight = torch.zeros(c, 1, 7, 7)
    nchw = torch.zeros(n, c, 8, 8)
    nhwc = torch.zeros(n, 8, 8, c).permute(0, 3, 1, 2)
    grad_in = n * c * 8 * 8 * 4  # the blocked input gradient (128 channels: no padding)
    assert _onednn_conv_transient(nhwc, weight, nhwc, c, False, True) == grad_in + c * 49 * 1024
    assert _onednn_conv_transient(nhwc, weight, nhwc, c, False, False) == c * 49 * 1024
    assert _onednn_conv_transient(nchw, weight, nchw, c, False, True) < 2**20
    three = torch.zeros(c, 1, 3, 3)
    assert _onednn_conv_transient(nhwc, three, nhwc, c, False, True) < 2**20
    assert _channels_last(torch.zeros(n, 1, 1, c).permute(0, 3, 1, 2))
    assert not _channels_last(torch.zeros(n, c, 1, 1)) and not _channels_last(nchw)

    def convnext() -> nn.Module:
        return zoo.convnext((1, 1, 2, 1), (16, 32, 64, 128), 10)

    spec = ca.TrainingSpec(model=convnext, batch=ca.ImageBatch((3, 32, 32), classes=10),
                           batch_size=2, optimizer="sgd")  # fmt: skip
    assert ca.CostModel().predict(spec, "cpu").peak_memory > 6 * 2**20  # the largest block's


def test_a_simulated_cpu_is_each_threads_own_and_reaches_the_dry_runs_helper_thread() -> None:
    """Two threads featurizing rows of different CPUs at once each dry-run as their own
    row's CPU, and a dry run under a time limit outside the main thread (its worker
    thread) still sees the CPU its caller simulates."""
    import threading

    from costaware.core.trace import _call_with_timeout, cpu_capability, simulated_cpu_capability

    both_inside = threading.Barrier(2, timeout=30)
    seen: dict[str, list[str]] = {}

    def run(isa: str) -> None:
        with simulated_cpu_capability(isa):
            both_inside.wait()  # the other thread has set its own by now
            seen[isa] = [cpu_capability(), _call_with_timeout(cpu_capability, 30.0)]  # type: ignore[arg-type]

    threads = [threading.Thread(target=run, args=(isa,)) for isa in ("AVX2", "DEFAULT")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seen == {"AVX2": ["AVX2", "AVX2"], "DEFAULT": ["DEFAULT", "DEFAULT"]}
    assert cpu_capability() == str(torch.backends.cpu.get_cpu_capability())


class _RMSNet(torch.nn.Module):
    """Two pre-norm blocks with RMSNorm, as Llama-style models have them."""

    def __init__(
        self, dim: int = 64, classes: int = 10, weight_dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.norms = torch.nn.ModuleList(torch.nn.RMSNorm(dim) for _ in range(2))
        self.mlps = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(2))
        self.head = torch.nn.Linear(dim, classes)
        if weight_dtype is not None:
            for n in self.norms:
                n.to(weight_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, mlp in zip(self.norms, self.mlps, strict=True):
            x = x + mlp(norm(x))
        return self.head(x.mean(1))


def _rms_spec(**kw: object) -> ca.TrainingSpec:
    return ca.TrainingSpec(
        model=functools.partial(_RMSNet, **kw),
        batch=ca.ImageBatch((128, 64), classes=10),
        batch_size=32,
    )


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
def test_fused_rmsnorm_is_one_kernel_that_keeps_the_input_and_the_inverse_rms() -> None:
    """A CUDA GPU runs RMSNorm as one kernel whose backward reads the input and the inverse
    RMS; this CPU's composite keeps the squares and the normalized input besides (the GPU
    corpus's RMSNorm transformers were over-predicted by 12-18% before)."""
    native = ca.dry_run(_rms_spec())
    fused = ca.dry_run(_rms_spec(), attention="fused")
    assert native.op_counts["rsqrt"] > 0 and native.op_counts["rms_norm"] == 0
    assert fused.op_counts["rsqrt"] == 0 and fused.op_counts["pow"] == 0
    assert fused.op_counts["rms_norm"] == 2 and fused.op_counts["rms_norm_backward"] == 2
    row = 32 * 128 * 64 * 4  # one (batch, tokens, dim) fp32 activation
    assert fused.peak_live <= native.peak_live - row
    assert any("RMSNorm traced as one fused kernel" in n for n in fused.notes)
    # input and weight of different dtypes: CUDA runs the composite, and so does the trace
    mixed = ca.dry_run(_rms_spec(weight_dtype=torch.float64), attention="fused")
    assert mixed.op_counts["rms_norm"] == 0 and mixed.op_counts["rsqrt"] > 0
    assert any("ran as the composite" in n for n in mixed.notes)


@pytest.mark.parametrize("weighted", [True, False])
def test_fused_rmsnorm_computes_what_torch_computes(weighted: bool) -> None:
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64, requires_grad=True) if weighted else None
    ours = torch.ops.costaware.rms_norm(x, [16], w, 1e-6)[0]
    ref = torch.nn.functional.rms_norm(x, [16], w, 1e-6)
    torch.testing.assert_close(ours, ref)
    g = torch.randn_like(ref)
    wrt = [x, w] if w is not None else [x]
    torch.testing.assert_close(torch.autograd.grad(ours, wrt, g), torch.autograd.grad(ref, wrt, g))


class _DropNet(nn.Module):
    """Linear -> Dropout -> ReLU, twice (dropout before the ReLU, which keeps its output,
    so that an in-place dropout is a valid model too)."""

    def __init__(self, p: float = 0.1, inplace: bool = False, functional: bool = False) -> None:
        super().__init__()
        self.p, self.functional = p, functional
        self.fc = nn.ModuleList(nn.Linear(256, 256) for _ in range(2))
        self.drop = nn.Dropout(p, inplace=inplace)
        self.head = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for fc in self.fc:
            x = fc(x)
            x = torch.dropout(x, p=self.p, train=self.training) if self.functional else self.drop(x)
            x = torch.relu(x)
        return self.head(x)


def _drop_spec(**kw: object) -> ca.TrainingSpec:
    return ca.TrainingSpec(
        model=functools.partial(_DropNet, **kw),
        batch=ca.ImageBatch((256,), classes=10),
        batch_size=512,
        optimizer="sgd",
    )


def test_fused_dropout_keeps_a_bool_mask_where_the_cpu_composite_keeps_a_noise_tensor() -> None:
    """A CUDA GPU runs dropout in training as one kernel whose backward reads a bool mask;
    this CPU's composite keeps a noise tensor of the input's dtype, four times the bytes
    in fp32 (the OOM probes' MLPs were over-predicted by 13% before)."""
    act = 512 * 256  # one (batch, width) activation's elements
    native = ca.dry_run(_drop_spec())
    fused = ca.dry_run(_drop_spec(), attention="fused")
    assert native.op_counts["bernoulli_"] == 2 and native.op_counts["native_dropout"] == 0
    assert fused.op_counts["native_dropout"] == 2 and fused.op_counts["bernoulli_"] == 0
    assert fused.op_counts["native_dropout_backward"] == 2
    # two masks kept to the backward: 1 byte an element fused, 4 in the composite
    assert native.peak_live - fused.peak_live >= 2 * act * (4 - 1)
    none = ca.dry_run(_drop_spec(p=0.0), attention="fused")
    assert fused.peak_live - none.peak_live <= 2 * act * (4 + 1) + 2**20  # outputs + masks
    assert any("dropout traced as one fused kernel" in n for n in fused.notes)
    functional = ca.dry_run(_drop_spec(functional=True), attention="fused")
    assert functional.op_counts["native_dropout"] == 2
    # in place, CUDA runs the composite too, and so does the trace
    inplace = ca.dry_run(_drop_spec(inplace=True), attention="fused")
    assert inplace.op_counts["native_dropout"] == 0 and inplace.op_counts["bernoulli_"] == 2
    assert any("ran as the composite" in n and "in place" in n for n in inplace.notes)


class _CheckpointedBlocks(nn.Module):
    """Attention, dropout and an MLP per block, each block under activation checkpointing
    (``"reentrant"``: torch's default; ``"non-reentrant"``: what
    ``gradient_checkpointing_enable()`` passes) or none (``""``)."""

    def __init__(self, checkpointed: str) -> None:
        super().__init__()
        self.checkpointed = checkpointed
        # the blocks' input requires grad, or a reentrant checkpoint has no backward
        self.embed = nn.Linear(64, 64)
        self.qkv = nn.ModuleList(nn.Linear(64, 192) for _ in range(2))
        self.mlp = nn.ModuleList(nn.Linear(64, 64) for _ in range(2))
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(64, 10)

    def block(self, i: int, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv[i](x).view(x.shape[0], x.shape[1], 3, 4, 16).permute(2, 0, 3, 1, 4)
        att = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
        x = x + att.transpose(1, 2).reshape(x.shape)
        return x + self.drop(torch.relu(self.mlp[i](x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        x = self.embed(x)
        for i in range(2):
            if self.checkpointed:
                reentrant = self.checkpointed == "reentrant"
                x = checkpoint(functools.partial(self.block, i), x, use_reentrant=reentrant)
            else:
                x = self.block(i, x)
        return self.head(x.mean(1))  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", ["non-reentrant", "reentrant"])
def test_a_checkpointed_block_recomputes_its_fused_kernels_as_its_forward_ran(kind: str) -> None:
    """Checkpointing recomputes the block in the backward, where torch enters none of the
    forward's modes: the recomputation must route dropout and attention to the same fused
    kernels, as a GPU step does. Otherwise torch refuses the non-reentrant backward
    (recomputed values of other metadata), and the reentrant one costs the recomputation
    as a CPU's composites (the score matrix, a float mask)."""

    def spec(checkpointed: str) -> ca.TrainingSpec:
        return ca.TrainingSpec(
            model=functools.partial(_CheckpointedBlocks, checkpointed),
            batch=ca.ImageBatch((128, 64), classes=10),
            batch_size=64,
        )

    plain = ca.dry_run(spec(""), attention="fused")
    kept = ca.dry_run(spec(kind), attention="fused")
    # each block's dropout and attention twice: the forward and its recomputation
    assert kept.op_counts["native_dropout"] == 2 * plain.op_counts["native_dropout"] == 4
    fused_attention = [
        op for op in plain.op_counts if "attention" in op and not op.endswith("backward")
    ]
    assert fused_attention and all(
        kept.op_counts[op] == 2 * plain.op_counts[op] for op in fused_attention
    )
    assert kept.op_counts["bernoulli_"] == plain.op_counts["bernoulli_"] == 0
    assert kept.peak_live < plain.peak_live  # what checkpointing is for
    # outside the dry run, a checkpoint recomputes as torch does
    model = _CheckpointedBlocks(kind)
    model(torch.randn(2, 8, 64)).sum().backward()


def test_a_recomputation_the_dry_run_cannot_match_is_its_own_limit() -> None:
    """Should a checkpoint's recomputation still differ from its forward in the dry run,
    the trial is admitted (costaware's limit), not failed as the user's bug."""
    from torch.utils.checkpoint import CheckpointError

    from costaware.core.trace.failures import _classify

    def raise_it() -> None:
        raise CheckpointError(
            "torch.utils.checkpoint: Recomputed values for the following tensors have "
            "different metadata than during the forward pass."
        )

    try:
        raise_it()
    except CheckpointError as e:
        error = _classify(e, _drop_spec(), None)
    assert isinstance(error, ca.UntraceableModelError)
    assert not isinstance(error, ca.UserCodeError)
    assert "could not recompute an activation checkpoint" in str(error)


def test_fused_dropout_computes_what_its_mask_says() -> None:
    x = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
    out, mask = torch.ops.costaware.native_dropout(x, 0.25)
    assert mask.dtype == torch.bool and 0 < mask.sum() < mask.numel()
    torch.testing.assert_close(out, x * mask / 0.75)
    g = torch.randn_like(out)
    (grad,) = torch.autograd.grad(out, [x], g)
    torch.testing.assert_close(grad, g * mask / 0.75)


class _Lazy(nn.Module):
    """A token model whose middle layers are lazy (or not): the same step either way."""

    def __init__(self, lazy: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.mid = nn.LazyLinear(64) if lazy else nn.Linear(32, 64)
        self.norm = nn.LazyBatchNorm1d() if lazy else nn.BatchNorm1d(64)
        self.head = nn.Linear(64, 100)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.emb(ids))
        return self.head(self.norm(h.transpose(1, 2)).transpose(1, 2))  # type: ignore[no-any-return]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16-true"])
def test_lazy_modules_are_shaped_by_a_first_forward_as_a_script_shapes_them(
    precision: str,
) -> None:
    """A model with lazy modules traces as its eager twin: the first forward shapes them
    before the step, which trains them (parameters, gradients, optimizer state)."""

    def spec(lazy: bool) -> ca.TrainingSpec:
        return ca.TrainingSpec(
            model=functools.partial(_Lazy, lazy), batch=ca.TokenBatch(16, 100), batch_size=4,
            precision=precision,
        )  # fmt: skip

    lazy, eager = ca.dry_run(spec(True)), ca.dry_run(spec(False))
    assert lazy.param_count == eager.param_count == sum(
        p.numel() for p in _Lazy(False).parameters()
    )
    assert lazy.peak_live == eager.peak_live and lazy.peak_breakdown == eager.peak_breakdown
    assert lazy.flops_forward == eager.flops_forward


def test_a_live_module_with_lazy_layers_is_predicted_and_still_shapes_itself() -> None:
    """A live module whose lazy layers never ran (a Lightning fit judged in setup): its
    meta copy is shaped by the dry run, and the module's own first forward still shapes
    it (the copy must not take the module's initializing hook with it)."""
    live = _Lazy(True)
    ids = torch.randint(0, 100, (4, 16))
    spec = ca.TrainingSpec.from_module(live, ids, loss=lambda m, b: m(b).float().mean())
    eager = sum(p.numel() for p in _Lazy(False).parameters())
    assert ca.dry_run(spec).param_count == eager
    assert live.mid.has_uninitialized_params() and isinstance(live.mid, nn.LazyLinear)
    assert live(ids).shape == (4, 16, 100)
    assert type(live.mid) is nn.Linear and sum(p.numel() for p in live.parameters()) == eager


def test_a_timeout_never_cuts_an_import_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dry run stopped while it imports a module finishes the import first: an import
    cut short would leave the module broken for every later dry run of the process (as
    sympy was, when the first dry run's timeout landed in torch's lazy import of it)."""
    import sys

    from costaware.core.trace import _call_with_timeout

    (tmp_path / "costaware_slow_import.py").write_text(
        "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 0.5:\n    pass\n"
        "DONE = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "costaware_slow_import", raising=False)

    def slow() -> None:
        import costaware_slow_import  # noqa: F401

        while True:
            pass

    with pytest.raises(ca.TraceTimeout, match="it was stopped"):
        _call_with_timeout(slow, 0.1)
    assert sys.modules["costaware_slow_import"].DONE


class _Attention(nn.Module):
    """Two attention layers with dropout: plain, with fp32 rotary tables (q and k in fp32
    beside a half v under autocast), or grouped-query (4 query heads over 2)."""

    def __init__(self, kind: str, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.kind, self.heads = kind, heads
        self.emb = nn.Embedding(100, width)
        self.qkv = nn.ModuleList(nn.Linear(width, 3 * width) for _ in range(2))
        self.out = nn.Linear(width, 100)
        self.register_buffer("cos", torch.ones(1024, width // heads))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        n, t, d = x.shape
        for qkv in self.qkv:
            q, k, v = qkv(x).view(n, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            gqa = self.kind == "gqa"
            if self.kind == "rotary":
                q, k = q * self.cos[:t], k * self.cos[:t]
            if gqa:
                k, v = k[:, :2], v[:, :2]
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=0.1, is_causal=True, enable_gqa=gqa
            )
            x = x + y.transpose(1, 2).reshape(n, t, d)
        return self.out(x)


@pytest.mark.parametrize("kind", ["rotary", "gqa"])
def test_fused_attention_takes_rotary_halves_and_grouped_heads(kind: str) -> None:
    """As a CUDA GPU runs them: autocast casts q, k and v to the half type before SDPA, and
    flash attention takes grouped-query heads, so neither keeps the L x L scores (nor the
    dropout mask) the CPU's math path would."""
    def spec(k: str) -> ca.TrainingSpec:
        return ca.TrainingSpec(
            model=functools.partial(_Attention, k),
            batch=ca.TokenBatch(1024, 100),
            batch_size=2,
            precision="bf16",
        )

    plain = ca.dry_run(spec("plain"), attention="fused")
    other = ca.dry_run(spec(kind), attention="fused")
    note = next(n for n in other.notes if "fused flash kernel" in n)
    assert "(2 SDPA calls per step" in note and "ran natively" not in note, note
    scores = 2 * 4 * 1024 * 1024 * 2  # one layer's bf16 scores: batch x heads x L x L
    assert other.peak_live < plain.peak_live + scores / 2, (other.peak_live, plain.peak_live)


class _TutorialLM(nn.Module):
    """PyTorch's transformer tutorial: an encoder given a causal mask without is_causal."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(32, 100)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
        return self.out(self.enc(self.emb(ids), mask=mask))  # type: ignore[no-any-return]


def test_an_encoder_given_a_causal_mask_traces() -> None:
    """torch asks whether the mask is causal by reading its values; on fake tensors it is
    applied as given, and real tensors get torch's own answer."""
    from torch.nn.modules.transformer import _detect_is_causal_mask

    spec = ca.TrainingSpec(model=_TutorialLM, batch=ca.TokenBatch(64, 100), batch_size=4)
    for attention in ("native", "fused"):
        assert ca.dry_run(spec, attention=attention).peak_live > 0
    causal = nn.Transformer.generate_square_subsequent_mask(8)
    assert _detect_is_causal_mask(causal) is True
    assert _detect_is_causal_mask(torch.zeros(8, 8)) is False


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_the_dry_runs_shims_leave_torchscript_as_it_was() -> None:
    """The shims (a causal mask's check, packed sequences) are in place only while a dry
    run runs: a trial may script its model after (or beside) one."""
    spec = ca.TrainingSpec(model=_TutorialLM, batch=ca.TokenBatch(16, 100), batch_size=2)
    ca.dry_run(spec)
    torch.jit.script(nn.LSTM(4, 4))
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    torch.jit.script(nn.TransformerEncoder(layer, 1, enable_nested_tensor=False))
