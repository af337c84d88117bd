"""The dry run's messages for the user's bug and for its own limits: each names what
failed and what to change, and fails fast (:class:`~costaware.UserCodeError`) only where
a real training step fails too."""

from __future__ import annotations

import functools
import os
import re
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import costaware as ca
from costaware.core.trace.failures import _classify
from costaware.errors import first_line


def _spec(model: Any, shape: tuple[int, ...] = (16,), batch_size: int = 4, **kw: Any) -> Any:
    return ca.TrainingSpec(
        model=model, batch=ca.ImageBatch(shape, classes=10), batch_size=batch_size, **kw
    )


def _fails(spec: ca.TrainingSpec, kind: type[Exception]) -> str:
    with pytest.raises(kind) as info:
        ca.dry_run(spec, timeout=None)
    return str(info.value)


# --------------------------------------------------------------------------------------
# a failing factory runs once
# --------------------------------------------------------------------------------------
def test_a_factory_that_raises_runs_once_and_its_error_chains_nothing_else() -> None:
    calls: list[int] = []

    def factory() -> nn.Module:
        calls.append(1)
        raise ValueError("bad config: depth=0")

    with pytest.raises(ca.UserCodeError) as info:
        ca.dry_run(_spec(factory), timeout=None)
    assert calls == [1]  # not built again for real: it fails the same way
    assert isinstance(info.value, ValueError)
    cause = info.value.__cause__
    assert isinstance(cause, ValueError) and cause.__context__ is None
    assert "bad config: depth=0" in str(info.value)
    assert re.search(r"test_trace_messages\.py:\d+ \(`raise ValueError", str(info.value))


def test_a_factory_that_reads_a_value_on_meta_is_still_built_for_real() -> None:
    calls: list[int] = []

    def factory() -> nn.Module:
        calls.append(1)
        layer = nn.Linear(16, 10)
        if float(layer.weight.detach().abs().sum()) < 0:  # a value: fails on meta, not for real
            raise ValueError("negative weights")
        return layer

    trace = ca.dry_run(_spec(factory), timeout=None)
    assert calls == [1, 1] and trace.build == "cpu"


# --------------------------------------------------------------------------------------
# a dtype is not a shape
# --------------------------------------------------------------------------------------
def _float_targets(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y.float())


def test_a_wrong_target_dtype_is_a_dtype_mismatch_not_a_shape_one() -> None:
    message = _fails(_spec(lambda: nn.Linear(16, 10), loss=_float_targets), ca.UserCodeError)
    assert "fails on a dtype mismatch" in message and "shape mismatch" not in message
    assert "The loss" in message and "y.long()" in message
    assert re.search(r"test_trace_messages\.py:\d+ \(`return F\.cross_entropy", message)
    # what the real kernel says, beside the fake one's gather() complaint
    assert "the real kernel says: expected target dtype to be Long" in message


class FloatIds(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.fc = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(x).mean(1))  # float ids: a real embedding refuses them too


def test_a_dtype_a_real_kernel_refuses_too_stays_the_users_bug() -> None:
    message = _fails(_spec(FloatIds), ca.UserCodeError)
    assert "The model's forward fails on a dtype mismatch" in message
    assert "in `emb` (Embedding(10, 4)" in message and "int64" in message
    assert "the real kernel says" not in message  # it says what the fake kernel does


# --------------------------------------------------------------------------------------
# a fake kernel that refuses what the real one takes is the dry run's limit
# --------------------------------------------------------------------------------------
class Experts(nn.Module):
    """A mixture of experts as Hugging Face's models run it (F.grouped_mm), in fp32."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 16, 16))
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offs = torch.tensor([2, 4, 6, 8], dtype=torch.int32, device=x.device)
        return self.fc(F.grouped_mm(x, self.w, offs=offs))


def test_a_dtype_only_the_fake_kernel_refuses_is_the_dry_runs_limit() -> None:
    model = Experts()
    model(torch.randn(8, 16)).sum().backward()  # a real step runs
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.randn(8, 16)
        w = torch.randn(4, 16, 16)
        offs = torch.tensor([2, 4, 6, 8], dtype=torch.int32)
        with pytest.raises(RuntimeError, match="Expected inputs of BF16 type") as info:
            F.grouped_mm(x, w, offs=offs)
    error = _classify(info.value, _spec(Experts, batch_size=8), model)
    assert isinstance(error, ca.UntraceableModelError), error
    assert "fake (meta) kernel of aten._grouped_mm" in str(error)
    assert "limit of costaware's dry run" in str(error)


def test_a_genuine_shape_mismatch_in_a_meta_kernel_stays_the_users_bug() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        x, w = torch.randn(8, 16), torch.randn(4, 15, 16)
        offs = torch.tensor([2, 4, 6, 8], dtype=torch.int32)
        with pytest.raises(RuntimeError) as info:
            F.grouped_mm(x.bfloat16(), w.bfloat16(), offs=offs)
    error = _classify(info.value, _spec(Experts, batch_size=8), Experts())
    assert isinstance(error, ca.UserCodeError), error


# --------------------------------------------------------------------------------------
# the optimizer's failures
# --------------------------------------------------------------------------------------
def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10))


@pytest.mark.parametrize("optimizer", [torch.optim.Adafactor, torch.optim.ASGD])
def test_an_optimizer_that_reads_a_value_is_the_dry_runs_limit(optimizer: Any) -> None:
    message = _fails(_spec(_mlp, optimizer=optimizer), ca.UntraceableModelError)
    assert f"the step of {optimizer.__name__} reads a tensor's value" in message
    assert "not a bug in the model or the optimizer" in message
    assert "only the loss and training_step may read" not in message


def test_a_closure_optimizer_is_the_dry_runs_limit() -> None:
    message = _fails(_spec(_mlp, optimizer=torch.optim.LBFGS), ca.UntraceableModelError)
    assert "closure" in message and "LBFGS" in message
    assert "limit of costaware's dry run" in message
    assert "fails the same way" not in message


def test_a_misspelt_optimizer_argument_shows_the_users_arguments_and_the_meant_one() -> None:
    spec = _spec(_mlp, optimizer="sgd", optimizer_kwargs={"lr": 0.1, "momentun": 0.9})
    message = _fails(spec, ca.SpecError)
    assert "rejected its arguments {'lr': 0.1, 'momentun': 0.9}" in message
    assert "foreach" not in message
    assert "did you mean 'momentum'?" in message


class MyOpt(torch.optim.SGD):
    def __init__(self, params: Any, lr: float = 0.1) -> None:
        super().__init__(params, lr=lr)
        raise ValueError("MyOpt: lr schedule not configured")


def test_a_users_optimizer_class_that_raises_is_named_at_its_line() -> None:
    with pytest.raises(ca.UserCodeError) as info:
        ca.dry_run(_spec(_mlp, optimizer=MyOpt), timeout=None)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "MyOpt: lr schedule not configured" in message
    assert re.search(r"test_trace_messages\.py:\d+ \(`raise ValueError", message)
    assert "rejected its arguments {}" not in message


# --------------------------------------------------------------------------------------
# a tensor autograd saved, modified in place
# --------------------------------------------------------------------------------------
class InPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.c(x))
        y.mul_(0.5)  # relu's saved output, modified in place
        return self.fc(y.mean((2, 3)))


def test_an_in_place_change_of_a_saved_tensor_is_said_so_with_the_line() -> None:
    message = _fails(_spec(InPlace, shape=(3, 8, 8)), ca.UserCodeError)
    assert "custom backward" not in message
    assert "modified in place" in message and "Relu" in message
    assert re.search(r"test_trace_messages\.py:\d+ \(`y\.mul_\(0\.5\)`\)", message)


# --------------------------------------------------------------------------------------
# an input of the wrong rank
# --------------------------------------------------------------------------------------
def test_an_image_given_to_a_linear_layer_is_told_to_flatten() -> None:
    message = _fails(_spec(lambda: nn.Linear(784, 10), shape=(3, 32, 32)), ca.UserCodeError)
    assert "flatten it" in message and "x.flatten(1) gives 3072 features" in message
    assert "in_features=32" not in message


class OneChannel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv1(x).mean((2, 3)))


def test_a_flat_batch_given_to_a_conv_is_told_its_shape_not_a_channel_count() -> None:
    message = _fails(_spec(OneChannel, shape=(784,)), ca.UserCodeError)
    assert "in_channels=4" not in message and "gets 4 channels" not in message
    assert "ImageBatch(shape=(1, 28, 28), ...)" in message


# --------------------------------------------------------------------------------------
# reasons cut at a boundary; the user's traceback ends in their code
# --------------------------------------------------------------------------------------
def test_a_long_reason_is_cut_at_a_sentence_and_says_so() -> None:
    advice = "Change the batch to the shape the model was built for. " * 20
    line = first_line(RuntimeError(advice))
    assert len(line) <= 800 and line.endswith("for. …")
    word = first_line(RuntimeError("word " * 300), 100)
    assert word.endswith("word…") and len(word) <= 100
    short = RuntimeError("x " * 300)  # 600 characters: kept whole
    assert first_line(short) == f"RuntimeError: {str(short).strip()}"


class Flat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(100, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))  # 48 features, not 100


def test_the_users_traceback_ends_at_their_line_and_the_layer_it_called() -> None:
    with pytest.raises(ca.UserCodeError) as info:
        ca.dry_run(_spec(Flat, shape=(3, 4, 4)), timeout=None)
    frames = traceback.extract_tb(info.value.__cause__.__traceback__)
    files = [f.filename for f in frames]
    assert __file__ in files
    after = files[files.index(__file__) + 1 :]
    torch_nn = os.path.join(os.path.dirname(torch.__file__), "nn") + os.sep
    assert after and all(f.startswith(torch_nn) for f in after), after
    assert "in_features=48" in str(info.value)  # the message was made first


def test_grouped_mm_in_fp32_dry_runs_as_the_real_step_runs() -> None:
    trace = ca.dry_run(_spec(Experts, batch_size=8), timeout=None)
    assert trace.op_counts["_grouped_mm"] >= 2  # forward, and the backward's gradients
    assert trace.peak_live > 0


class _Packed(nn.Module):
    """An LSTM over variable-length sequences (packed), or over the padded batch."""

    def __init__(self, packed: bool = True, batch_first: bool = True) -> None:
        super().__init__()
        self.packed, self.batch_first = packed, batch_first
        self.emb = nn.Embedding(50, 8)
        self.lstm = nn.LSTM(8, 8, batch_first=batch_first)
        self.fc = nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids) if self.batch_first else self.emb(ids).transpose(0, 1)
        if not self.packed:
            out, _ = self.lstm(x)
            return self.fc(out.mean(1 if self.batch_first else 0))  # type: ignore[no-any-return]
        lengths = (ids > 0).sum(1)
        packed = nn.utils.rnn.pack_padded_sequence(
            x, lengths, batch_first=self.batch_first, enforce_sorted=False
        )
        out, _ = self.lstm(packed)
        padded, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=self.batch_first)
        return self.fc(padded.mean(1 if self.batch_first else 0))  # type: ignore[no-any-return]


@pytest.mark.parametrize("batch_first", [True, False])
def test_packed_sequences_dry_run_at_their_full_length(batch_first: bool) -> None:
    """pack_padded_sequence's size depends on the lengths' values: the dry run takes
    every sequence at its full length, the padded step, which bounds the packed one."""

    def spec(packed: bool) -> ca.TrainingSpec:
        return ca.TrainingSpec(
            model=functools.partial(_Packed, packed, batch_first),
            batch=ca.TokenBatch(16, 50, num_labels=3),
            batch_size=4,
        )

    for attention in ("native", "fused"):
        packed = ca.dry_run(spec(True), attention=attention)
        padded = ca.dry_run(spec(False), attention=attention)
        assert packed.flops == padded.flops  # the same kernels over the same steps
        # and the memory of the padded step, with the packing's copies
        assert padded.peak_live <= packed.peak_live <= 1.05 * padded.peak_live
    # real tensors pack by their lengths, as torch does
    x = torch.randn(3, 5, 2)
    real = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([5, 3, 2]), batch_first=True)
    assert real.batch_sizes.tolist() == [3, 3, 2, 1, 1]


def test_a_value_read_in_an_installed_package_says_whose_code_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library's own code reading a value (Hugging Face DeBERTa's loss: nonzero on the
    labels) is not code the user can change: the message says whose it is and the way
    round (a loss of their own), not "keep the computation in tensors"."""
    import sys

    lib = tmp_path / "site-packages" / "costaware_fake_lib"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text(
        "def loss(logits, labels):\n"
        "    keep = (labels >= 0).nonzero()\n"
        "    return logits[keep[:, 0]].sum()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    monkeypatch.delitem(sys.modules, "costaware_fake_lib", raising=False)
    import costaware_fake_lib  # type: ignore[import-not-found]

    spec = ca.TrainingSpec(
        model=lambda: nn.Linear(8, 3),
        batch=ca.ImageBatch((8,), classes=3),
        batch_size=4,
        loss=lambda model, batch: costaware_fake_lib.loss(model(batch[0]), batch[1]),
    )
    with pytest.raises(
        ca.UntraceableModelError, match=r"the installed package 'costaware_fake_lib'.*loss="
    ):
        ca.dry_run(spec)
