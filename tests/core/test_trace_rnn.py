"""Recurrent layers in the GPU dry run (attention="fused"): one cuDNN-like kernel per layer.

A CUDA GPU runs nn.LSTM / nn.GRU / nn.RNN as a few fused cuDNN kernels per layer, but this
CPU build runs an LSTM through oneDNN and unrolls everything else into per-timestep cell
ops. The "fused" dry run traces each layer as ``costaware::rnn`` (forward) and
``costaware::rnn_backward``; "native" is left as it was.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import costaware as ca
from costaware import zoo
from costaware.core.features import op_group
from costaware.core.flops import MATMUL, op_class, rnn_flops
from costaware.core.optime import OPTIMIZER_STEP, node_table
from costaware.core.trace import Trace, _FusedRNN

VOCAB, EMBED, HIDDEN, SEQ, BATCH = 50, 8, 16, 24, 4


class _Tagger(nn.Module):
    """Embedding -> 2-layer recurrent net (any direction and layout) -> per-token head."""

    def __init__(self, kind: str, bidirectional: bool, batch_first: bool, **kw: object) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.emb = nn.Embedding(VOCAB, EMBED)
        cls = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[kind]
        self.rnn = cls(
            EMBED, HIDDEN, 2, batch_first=batch_first, bidirectional=bidirectional,
            dropout=0.1, **kw,
        )  # fmt: skip
        out = getattr(self.rnn, "proj_size", 0) or HIDDEN
        self.head = nn.Linear(out * (2 if bidirectional else 1), VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        if not self.batch_first:
            x = x.transpose(0, 1)
        out = self.rnn(x)[0]
        if not self.batch_first:
            out = out.transpose(0, 1)
        y: torch.Tensor = self.head(out)
        return y


def _spec(factory: Callable[[], nn.Module], precision: str = "fp32") -> ca.TrainingSpec:
    return ca.TrainingSpec(
        model=factory,
        batch=ca.TokenBatch(seq_len=SEQ, vocab=VOCAB),
        batch_size=BATCH,
        precision=precision,
    )


@functools.cache
def _traces(kind: str, layers: int, precision: str) -> tuple[Trace, Trace]:
    spec = _spec(
        functools.partial(zoo.rnn, kind, VOCAB, EMBED, HIDDEN, layers, dropout=0.1), precision
    )
    return ca.dry_run(spec), ca.dry_run(spec, attention="fused")


def _rnn_nodes(tr: Trace) -> list[dict[str, Any]]:
    g = tr.graph
    return [g.nodes[i] for i in g.nodes if op_group(str(g.nodes[i]["op"])) == "rnn"]


def _expected_rnn_flops(kind: str, layers: int, directions: int = 1) -> int:
    first = rnn_flops(kind, SEQ, BATCH, EMBED, HIDDEN, directions)
    rest = rnn_flops(kind, SEQ, BATCH, directions * HIDDEN, HIDDEN, directions)
    return int(first + (layers - 1) * rest)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_fused_trace_has_one_kernel_per_layer(kind: str, layers: int, precision: str) -> None:
    native, fused = _traces(kind, layers, precision)
    # one forward and one backward kernel per layer, instead of per-timestep cells
    assert fused.op_counts["rnn"] == layers
    assert fused.op_counts["rnn_backward"] == layers
    assert sum(1 for n in _rnn_nodes(fused) if n["phase"] == "forward") == layers
    for op in ("rnn", "rnn_backward"):
        assert op_group(op) == "rnn" and op_class(op) == MATMUL
    assert not ({"_thnn_fused_gru_cell", "mkldnn_rnn_layer", "unsafe_split"} & set(fused.op_counts))
    assert fused.graph.number_of_nodes() < 150
    if kind == "gru":  # this CPU unrolls a GRU: thousands of nodes, natively
        assert native.graph.number_of_nodes() > 10 * fused.graph.number_of_nodes()
    assert any("fused cuDNN kernels" in n for n in fused.notes)
    # each layer is costed as opbench costs its LSTM, forward f and backward 2f
    rnn = _expected_rnn_flops(kind, layers)
    fwd = sum(float(n["flops"]) for n in _rnn_nodes(fused) if n["phase"] == "forward")
    bwd = sum(float(n["flops"]) for n in _rnn_nodes(fused) if n["phase"] == "backward")
    assert fwd == rnn and bwd == 2 * rnn
    # each layer's kernels run SEQ time steps in sequence, every other kernel one, and
    # the op model's node table carries that apart from the FLOPs
    rnn_ids = [i for i in fused.graph.nodes if op_group(str(fused.graph.nodes[i]["op"])) == "rnn"]
    assert {int(fused.node_serial[i]) for i in rnn_ids} == {SEQ}
    assert int(fused.node_serial.sum()) == len(fused.node_serial) + (SEQ - 1) * len(rnn_ids)
    table = node_table(fused)
    assert {t[6] for t in table if t[0] in ("rnn", "rnn_backward")} == {SEQ}
    # every other kernel runs once; the optimizer's step row counts its parameter tensors
    assert {t[6] for t in table if t[0] not in ("rnn", "rnn_backward", OPTIMIZER_STEP)} == {1}
    assert [t[6] for t in table if t[0] == OPTIMIZER_STEP] == [fused.param_tensors]
    if kind == "gru":  # the unrolled cells' matmuls count the same work, within 10%
        assert fused.flops_forward == pytest.approx(native.flops_forward, rel=0.10)
    else:  # oneDNN's LSTM layer is counted by the same formula (feature version 10)
        assert fused.flops_forward == pytest.approx(native.flops_forward, rel=1e-9)
        assert fused.flops_backward == pytest.approx(native.flops_backward, rel=1e-9)
    # every parameter gets its gradient and its optimizer state, as natively
    assert fused.param_bytes == native.param_bytes
    assert fused.gradient_bytes == fused.param_bytes == native.gradient_bytes
    # a CPU's optimizer steps each tensor with a step counter of its own, the flat
    # multi-tensor step of a GPU's dry run one for all (512 B each, rounded)
    assert fused.optimizer_state_bytes > 0
    extra_counters = (native.param_tensors - 1) * 512
    assert native.optimizer_state_bytes == fused.optimizer_state_bytes + extra_counters
    # the peak stays near the native one (ratios 0.65-1.46 at these sizes)
    assert 0.5 < fused.peak_live / native.peak_live < 2.0
    # under autocast the layer runs in the autocast dtype (as oneDNN's LSTM does natively)
    dcode = 1 if precision == "bf16" else 0
    assert {n["dtype"] for n in _rnn_nodes(fused)} == {dcode}


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_native_mode_keeps_the_cpu_kernels(kind: str) -> None:
    native, _ = _traces(kind, 2, "fp32")
    assert not ({"rnn", "rnn_backward"} & set(native.op_counts))
    assert not any("cuDNN" in n for n in native.notes)
    if kind == "lstm":
        assert native.op_counts["mkldnn_rnn_layer"] == 2
    else:
        assert native.graph.number_of_nodes() > 1000


@pytest.mark.parametrize("batch_first", [False, True])
def test_native_lstm_layers_count_their_flops(batch_first: bool) -> None:
    # a CPU runs nn.LSTM as one oneDNN layer op per layer and direction; without a formula
    # it counted 0 FLOPs, and the roofline left the recurrent matrix products out
    spec = _spec(functools.partial(_Tagger, "lstm", True, batch_first))
    native = ca.dry_run(spec)
    assert native.op_counts["mkldnn_rnn_layer"] == 4  # 2 layers x 2 directions
    expected = rnn_flops("lstm", SEQ, BATCH, EMBED, HIDDEN, 2)
    expected += rnn_flops("lstm", SEQ, BATCH, 2 * HIDDEN, HIDDEN, 2)
    g = native.graph
    nodes = [g.nodes[i] for i in g.nodes]
    fwd = sum(float(n["flops"]) for n in nodes if n["op"] == "mkldnn_rnn_layer")
    bwd = sum(float(n["flops"]) for n in nodes if n["op"] == "mkldnn_rnn_layer_backward")
    assert fwd == expected and bwd == 2 * expected


def test_native_lstm_trace_does_not_depend_on_the_fake_tensor_cache() -> None:
    # torch's meta kernel for mkldnn_rnn_layer_backward returns one bias gradient twice;
    # FakeTensorMode's process-wide cache rebuilds the outputs apart on a hit. The trace
    # must be the same cold or warm, and as the real step runs: two bias gradients, and no
    # copy before autograd accumulates them
    from torch._subclasses.fake_tensor import FakeTensorMode

    spec = _spec(functools.partial(zoo.rnn, "lstm", VOCAB, EMBED, HIDDEN, 2), "fp32")
    FakeTensorMode.cache_clear()
    cold = ca.dry_run(spec)
    warm = ca.dry_run(spec)
    assert cold.op_signature == warm.op_signature
    assert np.array_equal(cold.events, warm.events)
    assert cold.op_counts["mkldnn_rnn_layer_backward"] == 2
    assert "new_empty_strided" not in cold.op_counts and "copy_" not in cold.op_counts

    model = nn.LSTM(EMBED, HIDDEN, num_layers=2)
    out, _ = model(torch.randn(SEQ, BATCH, EMBED))
    out.sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    assert len({g.untyped_storage().data_ptr() for g in grads if g is not None}) == len(grads)


def test_the_layer_flops_are_opbenchs_lstm_formula() -> None:
    from costaware.measure.opbench import _analyze

    flops, _, _ = _analyze("lstm", {"T": 35, "B": 8, "I": 24, "H": 40}, 4, "fwd+bwd")
    assert rnn_flops("lstm", 35, 8, 24, 40) == flops["fwd"]
    assert 2 * rnn_flops("lstm", 35, 8, 24, 40) == flops["bwd"]


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn"])
def test_bidirectional_time_major_layers(kind: str) -> None:
    spec = _spec(functools.partial(_Tagger, kind, True, False))
    native, fused = ca.dry_run(spec), ca.dry_run(spec, attention="fused")
    assert fused.op_counts["rnn"] == 2 and fused.op_counts["rnn_backward"] == 2
    mode = "rnn_tanh" if kind == "rnn" else kind
    expected = rnn_flops(mode, SEQ, BATCH, EMBED, HIDDEN, 2)
    expected += rnn_flops(mode, SEQ, BATCH, 2 * HIDDEN, HIDDEN, 2)
    fwd = sum(float(n["flops"]) for n in _rnn_nodes(fused) if n["phase"] == "forward")
    assert fwd == expected
    assert fused.flops_forward == pytest.approx(native.flops_forward, rel=0.10)
    assert fused.gradient_bytes == fused.param_bytes == native.gradient_bytes
    extra_counters = (native.param_tensors - 1) * 512  # per-tensor step counters (above)
    assert native.optimizer_state_bytes == fused.optimizer_state_bytes + extra_counters
    assert 0.5 < fused.peak_live / native.peak_live < 2.0


def test_reserve_space_lives_from_the_forward_to_the_backward() -> None:
    """Each layer's reserve (D*T*B*(gates+2)*H) is allocated in the forward, freed in the backward."""
    _, fused = _traces("lstm", 2, "fp32")
    reserve = BATCH * SEQ * (4 + 2) * HIDDEN * 4
    bounds: dict[str, int] = {}
    for idx, phase in fused.marks:  # the first step's phases
        bounds.setdefault(phase, idx)
    keys, sizes = fused.events[:, 0], fused.events[:, 1]
    allocs = [i for i in range(bounds["optimizer"]) if sizes[i] == reserve]
    assert len(allocs) == 2  # one per layer
    for i in allocs:
        free = next(j for j in range(i + 1, len(keys)) if keys[j] == keys[i] and sizes[j] < 0)
        assert bounds["forward"] <= i < bounds["backward"] <= free < bounds["optimizer"]


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_fused_layers_compute_what_torch_computes(
    cls: Callable[..., nn.Module], batch_first: bool, bidirectional: bool
) -> None:
    """On real tensors the ops run torch's own kernels: outputs and gradients must match."""
    torch.manual_seed(0)
    rnn = cls(5, 7, 2, batch_first=batch_first, bidirectional=bidirectional).double()
    x = torch.randn((3, 4, 5), dtype=torch.double, requires_grad=True)

    def run(fused: bool) -> tuple[list[torch.Tensor], _FusedRNN | None]:
        for p in [x, *rnn.parameters()]:
            p.grad = None
        mode = _FusedRNN() if fused else None
        with mode or contextlib.nullcontext():
            out, h = rnn(x)
            hs = list(h) if isinstance(h, tuple) else [h]
            (out.square().sum() + sum(t.sin().sum() for t in hs)).backward()
        grads = [t.grad for t in (x, *rnn.parameters())]
        assert all(g is not None for g in grads)
        return [out, *hs, *grads], mode

    ref, _ = run(False)
    got, mode = run(True)
    assert mode is not None and mode.fused == 1 and mode.layers == 2 and not mode.fallbacks
    for a, b in zip(ref, got):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b)


@pytest.mark.filterwarnings("ignore:LSTM with projections")
def test_unsupported_calls_run_natively_and_are_noted() -> None:
    # projections (proj_size): the native kernels, counted in the note
    spec = _spec(functools.partial(_Tagger, "lstm", False, True, proj_size=4))
    fused = ca.dry_run(spec, attention="fused")
    assert fused.op_counts["rnn"] == 0
    assert any("1 ran natively" in n and "proj_size" in n for n in fused.notes)
    # packed sequences, on real tensors
    rnn = nn.GRU(5, 7)
    x = torch.randn(6, 3, 5)
    packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([6, 4, 2]))
    with _FusedRNN() as mode:
        out, _ = rnn(packed)
    assert isinstance(out, nn.utils.rnn.PackedSequence)
    assert mode.fused == 0 and mode.fallbacks == {"packed sequence": 1}
