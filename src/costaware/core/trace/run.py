""":func:`dry_run`: build the model, trace one training step of it on fake tensors under
a time limit, and classify a failure.
"""

from __future__ import annotations

import torch
from torch import nn

from costaware.core.trace import shims
from costaware.core.trace.build import (
    _build_for_real,
    _layer_counts,
    _too_large,
    build_model,
    default_real_build_limit,
)
from costaware.core.trace.failures import _classify
from costaware.core.trace.result import COMPILED_NOTE, Trace
from costaware.core.trace.step import _trace
from costaware.core.trace.time_limit import _call_with_timeout
from costaware.core.trace.torch_logs import _quiet_torch_logs
from costaware.errors import CostawareError, SpecError, TraceError, UntraceableModelError
from costaware.spec import TrainingSpec, compiled_parts, uncompiled

#: How the dry run traces ``F.scaled_dot_product_attention`` and recurrent layers: "native"
#: as this CPU build runs them (SDPA's math path, B*H*L*L scores, whenever dropout_p > 0;
#: nn.LSTM/GRU/RNN through oneDNN or unrolled into per-timestep cell ops), "fused" as a
#: CUDA GPU runs them (one flash-attention kernel, no score matrix, no dropout mask; one
#: cuDNN kernel per recurrent layer and pass, with its reserve space).
ATTENTION_MODES = ("native", "fused")


def dry_run(
    spec: TrainingSpec,
    *,
    timeout: float | None = 60.0,
    attention: str = "native",
    real_build_limit: int | None = None,
) -> Trace:
    """Run two training steps of ``spec`` on fake tensors and return what they did.

    ``attention`` is "native" (as this CPU runs the step: SDPA's math path when dropout is
    on, recurrent layers through oneDNN or unrolled into per-timestep cells, and the
    optimizer one parameter at a time, PyTorch's default on a CPU) or "fused" (as a CUDA
    GPU runs it: SDPA as one flash kernel, each nn.LSTM / nn.GRU / nn.RNN layer as one
    fused cuDNN kernel forward and one backward, see
    :class:`~costaware.core.trace.fused_rnn._FusedRNN`, and the optimizer's multi-tensor
    ``foreach`` step); predictions for a CUDA device trace with "fused", for a CPU with
    "native". An optimizer given ``foreach`` or ``fused`` keeps it.

    Building the model and tracing it run under one time limit of ``timeout`` seconds
    (None: none), in a worker thread that is stopped at the deadline: its Python code, the
    model's included, stops within milliseconds, even where it catches every
    ``Exception``. One long native call (a single C++ operator, a blocking sleep) runs to
    its end first; the timeout is raised without waiting for it. No signal or timer of the
    process is used, so the caller's own stay as they were. A model whose constructor
    fails on the meta device is built for real on the CPU, holding at most
    ``real_build_limit`` bytes of tensors (default
    :func:`~costaware.core.trace.build.default_real_build_limit`: half of the memory this
    machine has available); past that the build is refused with an error that names the
    line that failed on meta.

    A failure is classified, so that the integrations can fail fast on the user's bug and
    fail open on the dry run's own (see :mod:`costaware.errors`); each message says what
    happened, where, and what to change. torch's log of the failing op is silenced in the
    dry run's thread while it runs.

    Raises:
        SpecError: the spec's pieces do not fit together (a factory that needs arguments,
            the loss, optimizer arguments, labels or token ids out of the model's range).
        UserCodeError: the user's code fails as a real training step would: the factory,
            forward or loss raised, or the model does not take the batch's shape (the
            user's exception is the ``__cause__``).
        UntraceableModelError: the model cannot run on fake tensors (it reads a tensor's
            value, an output's size depends on the values, an operator without a fake
            implementation), or building it for real would pass ``real_build_limit``.
        TraceTimeout: the dry run took longer than ``timeout`` seconds.
        TraceError: costaware's own dry run failed (an internal error).
    """
    if attention not in ATTENTION_MODES:
        raise ValueError(f"attention must be one of {ATTENTION_MODES}, but got {attention!r}.")

    #: the model being traced, to name the layer an error arose in
    built: dict[str, nn.Module] = {}

    def run() -> Trace:
        model, how = build_model(spec, real_build_limit=real_build_limit)
        compiled = bool(compiled_parts(model))
        if compiled:  # traced as eager mode runs it (the model is the dry run's own copy)
            model = uncompiled(model)
        built["model"] = model
        layers = _layer_counts(model)
        with torch.enable_grad():
            on_meta: RuntimeError | None = None
            try:
                trace = _trace(spec, model, how, attention)
            except (SpecError, TraceError):
                raise
            except RuntimeError as e:
                # meta-built modules can keep plain tensor attributes on meta; retry real
                if how != "meta" or "meta" not in str(e):
                    raise
                on_meta = e
            if on_meta is not None:  # out of the `except`: the retry's errors are its own
                size = _param_bytes(model) + sum(b.nbytes for b in model.buffers())
                cap = (
                    real_build_limit if real_build_limit is not None else default_real_build_limit()
                )
                if size > cap:  # its parameters alone would not fit: not even tried
                    raise UntraceableModelError(
                        _too_large(on_meta, cap, real_build_limit is None, attribute=True)
                    ) from on_meta
                del model
                model = _build_for_real(spec, on_meta, real_build_limit, attribute=True)
                built["model"] = model
                trace = _trace(spec, model, "cpu", attention)
        trace.layer_counts = layers
        if compiled and COMPILED_NOTE not in trace.notes:
            trace.notes.append(COMPILED_NOTE)
        return trace

    def checked() -> Trace:
        # in the dry run's thread: what the caller's thread raises while it waits (its own
        # signal handler's error, Ctrl-C) reaches it as it is
        with _quiet_torch_logs(), shims.active():
            try:
                return run()
            except CostawareError:
                raise
            except Exception as e:  # the user's bug, or the dry run's limit: said which
                raise _classify(e, spec, built.get("model")) from e

    return _call_with_timeout(checked, timeout)


def _param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
