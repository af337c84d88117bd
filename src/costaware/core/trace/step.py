"""One training step recorded on fake tensors, and the :class:`Trace` of two steps made of
it.

The step runs as the spec trains: the model's parameters and buffers (or one rank's
shards), DDP's buckets, one or two micro-batches of input, forward, loss and backward,
the optimizer step and ``zero_grad``; for a CUDA GPU under the fused-kernel modes. The
second step is synthesised from the first one's events.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import inspect
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np
import torch
from torch import nn

from costaware.core.sharding import ShardedStep
from costaware.core.trace.build import _to_fake, has_lazy_parameters
from costaware.core.trace.ddp import _ddp_buckets
from costaware.core.trace.fused import _FusedAttention, _FusedMode
from costaware.core.trace.fused_dropout import _FusedDropout
from costaware.core.trace.fused_rms_norm import _FusedRMSNorm
from costaware.core.trace.fused_rnn import _FusedRNN
from costaware.core.trace.optimizer import _flat_optimizer_ok, _flat_optimizer_step, _optimizer_step
from costaware.core.trace.recompute import recompute_under
from costaware.core.trace.recorder import _Recorder
from costaware.core.trace.result import _CAT_CODE, Trace, _memory_profile, _round
from costaware.errors import SpecError, UntraceableModelError, user_code_error
from costaware.spec import (
    ImageBatch,
    TokenBatch,
    TrainingSpec,
    cast_floating,
    check_positions,
    default_loss,
)

#: ops that create the optimizer's state in its first step (phase 3 of
#: :attr:`Trace.node_phase`)
_STATE_INIT_OPS = frozenset(
    {"zeros_like", "zeros", "empty", "empty_like", "full", "full_like", "clone"}
)


def _bound_batch(rec: _Recorder, batch_spec: Any, batch: Any) -> None:
    """Tell the recorder the value range of a built-in batch's labels and token ids."""
    if isinstance(batch_spec, TokenBatch):
        for field, n, arg in batch_spec.index_ranges():
            rec.bound(batch[field], n, f"{field} ({arg}={n})", f"TokenBatch(..., {arg}={{n}})")
    elif isinstance(batch_spec, ImageBatch):  # and SegmentationBatch
        kind = type(batch_spec).__name__
        field = f"labels (classes={batch_spec.classes})"
        fix = f"{kind}(..., classes={{n}}), or a loss that maps the labels into range"
        rec.bound(batch[1], batch_spec.classes, field, fix)


def _trace(spec: TrainingSpec, model: nn.Module, how: str, attention: str = "native") -> Trace:
    """The :class:`Trace` of two training steps of ``model`` as ``spec`` trains it.

    ``how`` is how the model was built ("meta", or "cpu" where its constructor needed
    real tensors), ``attention`` the device the step is traced for: a CPU ("native") or a
    CUDA GPU ("fused", see :func:`~costaware.core.trace.dry_run`). The model's parameters
    and buffers are fake tensors afterwards.

    One step is run and recorded (:func:`_record_step`); the second, which every later
    step is like, is synthesised from the first one's events (:func:`_with_second_step`),
    which halves the cost of the dry run. The events give the memory timeline and its
    categories (:func:`_event_categories`), the ops the operator graph (:func:`_op_graph`).
    """
    t0 = time.perf_counter()
    step = _record_step(spec, model, attention)
    rec = step.rec
    param_count, param_bytes, buffer_bytes = _model_sizes(model)

    ev_key, ev_size, marks, transients = _with_second_step(rec)
    events = np.asarray([ev_key, ev_size], dtype=np.int64).T.reshape(-1, 2)
    event_category, event_scales = _event_categories(rec, ev_key)
    timeline, peak_live, breakdown, phase_peaks = _memory_profile(events, event_category, marks)
    graph, op_counts = _op_graph(rec)
    return Trace(
        batch_size=spec.batch_size,
        graph=graph,
        events=events,
        timeline=timeline,
        peak_live=peak_live,
        peak_breakdown=breakdown,
        phase_peaks=phase_peaks,
        flops_forward=rec.flops["forward"],
        flops_backward=rec.flops["backward"],
        flops_optimizer=rec.flops["optimizer"],
        bytes_moved=rec.bytes_moved,
        param_count=int(param_count),
        param_bytes=int(param_bytes),
        buffer_bytes=int(buffer_bytes),
        gradient_bytes=int(step.gradient_bytes),
        optimizer_state_bytes=int(step.optimizer_state_bytes),
        input_bytes=int(breakdown["inputs"]),
        op_counts=op_counts,
        node_flops=np.asarray([n[5] for n in rec.nodes], dtype=np.float64),
        node_bytes=np.asarray([n[6] for n in rec.nodes], dtype=np.float64),
        node_class=np.asarray([n[2] for n in rec.nodes], dtype=np.int8),
        node_dtype=np.asarray([n[3] for n in rec.nodes], dtype=np.int8),
        node_phase=np.asarray([_node_phase(n[0], n[1]) for n in rec.nodes], dtype=np.int8),
        node_serial=np.asarray([n[7] for n in rec.nodes], dtype=np.int64),
        event_category=event_category,
        event_scales=event_scales,
        marks=marks,
        build=how,
        duration_s=time.perf_counter() - t0,
        op_signature=hashlib.sha1(" ".join(n[0] for n in rec.nodes).encode()).hexdigest()
        + f":{len(ev_key)}",
        notes=_notes(how, step),
        transients=np.asarray(transients, dtype=np.int64).reshape(-1, 3),
        param_tensors=step.param_tensors,
        stepped_numel=int(step.stepped_numel),
        collectives=tuple(step.sharded.collectives) if step.sharded is not None else (),
    )


@dataclass
class _RecordedStep:
    """One recorded training step: the recorder (its events, ops and FLOPs), the sharded
    step and fused-kernel modes it ran under, and the sizes counted as it ran."""

    rec: _Recorder
    sharded: ShardedStep | None
    fused: list[_FusedMode]
    gradient_bytes: int
    optimizer_state_bytes: int
    #: the parameter tensors the optimizer stepped (those that got a gradient), and their
    #: elements
    param_tensors: int
    stepped_numel: int
    #: the torchmetrics metrics whose updates the step skipped (:func:`_skip_metrics`)
    skipped_metrics: tuple[str, ...] = ()
    #: the half precision the model's own parameters were built in, where the spec's
    #: precision does not convert them (:func:`_built_half`)
    built_half: torch.dtype | None = None


def _fused_modes(attention: str) -> list[_FusedMode]:
    """The modes that trace the fused kernels a CUDA GPU runs, in the order they are
    entered; none for a CPU."""
    if attention != "fused":
        return []
    return [_FusedAttention(), _FusedRNN(), _FusedRMSNorm(), _FusedDropout()]


def _optimizer_kwargs(spec: TrainingSpec, attention: str) -> dict[str, Any]:
    """The optimizer's arguments as the device runs it: where the spec leaves ``foreach``
    and ``fused`` out, each device's default, CUDA's multi-tensor step or a CPU's one
    tensor at a time."""
    opt_kwargs = dict(spec.optimizer_kwargs)
    try:
        if "foreach" in inspect.signature(spec.optimizer_class).parameters and (
            "fused" not in opt_kwargs
        ):
            opt_kwargs.setdefault("foreach", attention == "fused")
    except (TypeError, ValueError):
        pass
    return opt_kwargs


def _record_step(spec: TrainingSpec, model: nn.Module, attention: str) -> _RecordedStep:
    """Run one training step of ``model`` as ``spec`` trains it, on fake tensors, with the
    recorder on (and, for a CUDA GPU, the fused-kernel modes).

    The model's parameters and buffers become fake tensors and, with DDP's buckets, the
    storages held before the step (:func:`_hold_model`). The step is the micro-batches'
    forward and backward (two of them where it accumulates gradients over more: the
    second one's accumulation is what every later one does) and the optimizer's phase
    (:func:`_optimizer_phase`); the recorder is closed at its end, so the frees after it
    are not events.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    fm = FakeTensorMode(allow_non_fake_inputs=True)
    rec = _Recorder(cpu=attention == "native")
    fused = _fused_modes(attention)
    batch_spec = spec.batch_spec
    opt_cls = spec.optimizer_class
    opt_kwargs = _optimizer_kwargs(spec, attention)

    built_half = _built_half(model) if spec.param_dtype is None else None
    with fm:
        _to_fake(model, spec.param_dtype)
        model.train()
        metrics = _skip_metrics(model)
        if has_lazy_parameters(model):
            _shape_lazy_modules(spec, batch_spec, model)
        # one rank of sharded training (FSDP, ZeRO): its shards, gathers and reduce-scatters
        sharded = (
            ShardedStep(model, spec.sharding, spec.world_size, spec.wrap_policy, rec)
            if spec.sharding is not None
            else None
        )
        with rec, contextlib.ExitStack() as modes:
            for mode in fused:
                modes.enter_context(mode)
            modes.enter_context(recompute_under(fused))
            buckets, opt_params = _hold_model(rec, spec, model, sharded)
            try:
                opt = opt_cls(opt_params, **opt_kwargs)
            except Exception as e:
                error = _optimizer_rejected(spec, e)
                if error is None:
                    raise
                raise error from e
            _check_no_closure(spec, opt)
            rec.step_code = _step_code(spec, model)
            rec.step = 1
            rec.record_graph = True
            rec.mark("step")
            for _ in range(min(spec.grad_accumulation, 2)):
                _micro_batch(rec, spec, batch_spec, model, sharded)
            sizes = _optimizer_phase(rec, fm, spec, model, sharded, opt, opt_kwargs, opt_params)
            rec.mark("end")
            rec.closed = True
            del buckets, opt_params
    return _RecordedStep(
        rec, sharded, fused, *sizes, skipped_metrics=metrics, built_half=built_half
    )


def _optimizer_rejected(spec: TrainingSpec, error: Exception) -> Exception | None:
    """The error to raise for an optimizer that could not be built from the spec's
    arguments: the user's bug, where their own optimizer class raised (named at its line)
    or the arguments do not fit (the user's ``optimizer_kwargs`` alone, not the
    ``foreach`` costaware adds, with the parameter meant where a name is misspelt); None
    where it is neither (the error is then classified as any other)."""
    from costaware.core.trace.user_code import _said, _user_frames, _where

    name = spec.optimizer_name
    if _user_frames(error):  # the user's own optimizer class raised
        return user_code_error(
            f"the optimizer {name!r} ({spec.optimizer_class.__qualname__}) raised "
            f"{_said(error)} {_where(error)} when built with optimizer_kwargs="
            f"{dict(spec.optimizer_kwargs)}. A real training step builds it the same way and "
            "fails the same way: fix the optimizer class or its arguments.",
            error,
        )
    if not isinstance(error, (TypeError, ValueError)):
        return None
    hint = ""
    unknown = re.search(r"unexpected keyword argument '(\w+)'", str(error))
    if unknown is not None:
        try:
            params = [
                p
                for p in inspect.signature(spec.optimizer_class.__init__).parameters
                if p not in ("self", "params")
            ]
        except (TypeError, ValueError):
            params = []
        close = difflib.get_close_matches(unknown.group(1), params, n=1)
        hint = (
            f"; did you mean {close[0]!r}?"
            if close
            else f"; it takes {', '.join(params)}"
            if params
            else ""
        )
    return SpecError(
        f"optimizer {name!r} rejected its arguments {dict(spec.optimizer_kwargs)}: "
        f"{error}{hint}"
    )


def _check_no_closure(spec: TrainingSpec, opt: torch.optim.Optimizer) -> None:
    """Raise :class:`UntraceableModelError` for an optimizer whose step needs a closure
    (LBFGS): its step runs the forward and backward again, as many times as it needs,
    which the dry run's one recorded step cannot follow."""
    try:
        closure = inspect.signature(opt.step).parameters.get("closure")
    except (TypeError, ValueError):
        return
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise UntraceableModelError(
            f"The optimizer {spec.optimizer_name!r} ({type(opt).__name__}) steps with a "
            "closure (optimizer.step(closure) re-evaluates the loss, as LBFGS does), which "
            "costaware's dry run does not support: it records one forward, backward and "
            "optimizer step. This is a limit of costaware's dry run, not a bug in the model "
            "or the optimizer; a real training step runs it."
        )


def _built_half(model: nn.Module) -> torch.dtype | None:
    """bf16 or fp16 where most of the model's floating-point parameters (by elements)
    were built in it (``model.to(torch.bfloat16)`` in the factory): the step is then a
    pure half-precision one whatever the spec's precision says, and its figures are."""
    from torch.nn.parameter import is_lazy

    by: dict[torch.dtype, int] = {}
    for p in model.parameters():
        if p.is_floating_point() and not is_lazy(p):  # a lazy one has no size yet
            by[p.dtype] = by.get(p.dtype, 0) + p.numel()
    if not by:
        return None
    dtype = max(by, key=lambda d: by[d])
    return dtype if dtype in (torch.bfloat16, torch.float16) else None


def _step_code(spec: TrainingSpec, model: nn.Module) -> frozenset[Any]:
    """The code of the step's own function, whose reads of a tensor's value the recorder
    answers: the spec's loss and, for a LightningModule, its ``training_step``."""
    codes = {getattr(spec.loss, "__code__", None)}
    step = getattr(type(model), "training_step", None)
    codes.add(getattr(step, "__code__", None))
    codes.discard(None)
    return frozenset(codes)


def _is_torchmetrics(module: nn.Module, name: str) -> bool:
    return any(
        c.__name__ == name and c.__module__.startswith("torchmetrics")
        for c in type(module).__mro__
    )


def _skip_metrics(model: nn.Module) -> tuple[str, ...]:
    """Make the torchmetrics metrics of ``model`` (a copy: the user's module is never
    the one traced) do nothing when called or updated in the step, and return their class
    names. A metric's update computes on values (``bincount``, ``unique``), which a dry
    run's tensors lack, and it keeps a few counters apart from the training's memory; a
    metric returns None in the dry run, which the step can only log (the Lightning
    module's ``log`` does nothing there)."""

    def skip(*args: Any, **kwargs: Any) -> None:
        return None

    skipped = []
    for m in model.modules():
        if _is_torchmetrics(m, "Metric") or _is_torchmetrics(m, "MetricCollection"):
            m.__dict__["forward"] = m.__dict__["update"] = skip
            skipped.append(type(m).__name__)
    return tuple(dict.fromkeys(skipped))


def _shape_lazy_modules(spec: TrainingSpec, batch_spec: Any, model: nn.Module) -> None:
    """Give lazy modules (``nn.LazyLinear``, ...) their shapes as a training script must
    before it builds the optimizer: one forward of a batch, without gradients, before the
    recorder starts. Each lazy module shapes its parameters from its first input on the
    meta device, outside the fake mode (which cannot give a tensor subclass new data), and
    they become fake CPU tensors before it runs.

    The module's own initializing hook is left out of hook tables of its own: it removes
    itself from the tables it was registered in, which a copy of a live module
    (:func:`~costaware.from_code.meta_copy`) shares with the user's module, whose first
    forward must still shape it."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.nn.modules.lazy import LazyModuleMixin

    def shape(module: Any, args: Any, kwargs: Any) -> None:
        with unset_fake_temporarily():
            module.initialize_parameters(*args, **kwargs)
        _to_fake(module, spec.param_dtype, only_real=True)
        if getattr(module, "cls_to_become", None) is not None:
            module.__class__ = module.cls_to_become  # as torch's own hook leaves it

    handles = []
    for m in model.modules():
        if not (isinstance(m, LazyModuleMixin) and m.has_uninitialized_params()):
            continue
        own = getattr(m, "_initialize_hook", None)
        for table in ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs"):
            hooks = getattr(m, table)
            m.__dict__[table] = type(hooks)(
                (k, h) for k, h in hooks.items() if own is None or k != own.id
            )
        handles.append(m.register_forward_pre_hook(shape, prepend=True, with_kwargs=True))
    batch = batch_spec.make(spec.batch_size)
    if spec.param_dtype is not None:
        batch = cast_floating(batch, spec.param_dtype)
    loss_fn = spec.loss or default_loss
    try:
        with torch.no_grad(), contextlib.ExitStack() as stack:
            if spec.autocast_dtype is not None:
                stack.enter_context(torch.autocast("cpu", dtype=spec.autocast_dtype))
            loss_fn(model, batch)
    finally:
        for handle in handles:
            handle.remove()


def _hold_model(
    rec: _Recorder, spec: TrainingSpec, model: nn.Module, sharded: ShardedStep | None
) -> tuple[list[torch.Tensor], list[nn.Parameter]]:
    """Record the storages the model holds before the step: its parameters (or one rank's
    shards of them), its buffers, and DDP's gradient buckets, allocated with the model
    and held throughout. Returns the buckets and the parameters the optimizer steps."""
    if sharded is None:
        rec.label(list(model.parameters()), "parameters")
    else:
        sharded.setup()
    rec.label(list(model.buffers()), "buffers")
    ddp = spec.world_size > 1 and sharded is None
    buckets = _ddp_buckets(model, spec.bucket_cap_mb) if ddp else []
    rec.label(buckets, "gradients")
    opt_params = list(model.parameters()) if sharded is None else sharded.optimizer_params
    return buckets, opt_params


def _micro_batch(
    rec: _Recorder,
    spec: TrainingSpec,
    batch_spec: Any,
    model: nn.Module,
    sharded: ShardedStep | None,
) -> None:
    """Record one micro-batch: its input, the forward and the loss (under autocast for
    mixed precision), and the backward."""
    param_dtype = spec.param_dtype  # a pure precision: the model and inputs in one type
    rec.mark("input")
    if param_dtype is None:
        batch = batch_spec.make(spec.batch_size)
    else:
        # converted before it reaches the device, as Lightning's pure precision
        # converts a batch: the device holds the converted tensors alone
        rec.paused = True
        try:
            batch = cast_floating(batch_spec.make(spec.batch_size), param_dtype)
        finally:
            rec.paused = False
    rec.label(batch, "inputs")
    _bound_batch(rec, batch_spec, batch)
    check_positions(model, batch)
    rec.mark("forward")
    loss_fn = spec.loss or default_loss
    if spec.autocast_dtype is not None:
        with torch.autocast("cpu", dtype=spec.autocast_dtype):
            loss = loss_fn(model, batch)
    else:
        loss = loss_fn(model, batch)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise SpecError(
            "the loss must return a scalar tensor, but it returned "
            f"{type(loss).__name__}{tuple(getattr(loss, 'shape', ()))}."
        )
    rec.mark("backward")
    loss.backward()
    if sharded is not None:
        sharded.after_backward()
    del loss, batch


def _optimizer_phase(
    rec: _Recorder,
    fm: Any,
    spec: TrainingSpec,
    model: nn.Module,
    sharded: ShardedStep | None,
    opt: torch.optim.Optimizer,
    opt_kwargs: dict[str, Any],
    opt_params: list[nn.Parameter],
) -> tuple[int, int, int, int]:
    """Record the gradients, the optimizer step and ``zero_grad``. Returns the bytes of
    the gradients and of the optimizer state, and the parameter tensors stepped and their
    elements."""
    grads = [p.grad for p in opt_params if p.grad is not None]
    grad_bytes = rec.label(grads, "gradients")
    del grads
    rec.mark("optimizer")
    params = list({id(p): p for p in opt_params if p.grad is not None}.values())
    param_tensors = len(params)
    stepped_numel = sum(p.numel() for p in params)
    if _flat_optimizer_ok(spec, opt_kwargs, params):
        state_bytes = _flat_optimizer_step(rec, spec.optimizer_class, opt_kwargs, params)
    else:
        state_bytes = _optimizer_step(rec, fm, opt)
    rec.mark("zero_grad")
    opt.zero_grad(set_to_none=True)
    if sharded is not None:  # ZeRO-1's whole gradients
        model.zero_grad(set_to_none=True)
        sharded.close()
    return grad_bytes, state_bytes, param_tensors, stepped_numel


def _model_sizes(model: nn.Module) -> tuple[int, int, int]:
    """The model's parameter count, and the bytes of its parameters (each shared one
    once) and of its buffers, 512-B rounded."""
    param_count = sum(p.numel() for p in model.parameters())
    param_bytes = sum(
        _round(p.untyped_storage().nbytes())
        for p in {id(p): p for p in model.parameters()}.values()
    )
    buffer_bytes = sum(_round(b.untyped_storage().nbytes()) for b in model.buffers())
    return param_count, param_bytes, buffer_bytes


def _event_categories(rec: _Recorder, ev_key: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per event of the two steps: its storage's memory category (a code of
    :data:`CATEGORIES`), and whether the storage grows with the batch.

    A storage not labelled otherwise is an activation when the forward allocated it, a
    temporary else; inputs, activations and the backward's temporaries grow with the
    batch. Step 2's keys are step 1's plus the recorder's next key."""
    offset = rec._next_key

    def origin(k: int) -> int:
        return k - offset if k >= offset else k

    def category(k: int) -> str:
        cat = rec.key_category.get(origin(k))
        if cat is None:
            cat = "activations" if rec.key_phase.get(origin(k)) == "forward" else "temporaries"
        return cat

    def scales(k: int) -> bool:
        cat = category(k)
        return cat in ("inputs", "activations") or (
            cat == "temporaries" and rec.key_phase.get(origin(k)) == "backward"
        )

    event_category = np.asarray([_CAT_CODE[category(k)] for k in ev_key], dtype=np.int8)
    return event_category, np.asarray([scales(k) for k in ev_key], dtype=bool)


def _op_graph(rec: _Recorder) -> tuple[nx.DiGraph, Counter[str]]:
    """The operator graph of one step (a node per recorded op, an edge from the op that
    wrote a storage to each op that read it) and the count of each op."""
    g = nx.DiGraph()
    op_counts: Counter[str] = Counter()
    for i, (name, phase, cls, dcode, nout, fl, nb, _) in enumerate(rec.nodes):
        g.add_node(
            i, op=name, phase=phase, op_class=cls, dtype=dcode, outputs=nout, flops=fl, bytes=nb
        )
        op_counts[name] += 1
    g.add_edges_from(rec.edges)
    return g, op_counts


def _notes(how: str, step: _RecordedStep) -> list[str]:
    """What the trace holds that a reader of its figures should know: a model built for
    real, one rank's sharding, ops whose FLOPs were not counted, and what each fused-kernel
    mode did."""
    notes: list[str] = []
    if how == "cpu":
        notes.append(
            "the model constructor failed on the meta device, so it was built for real on the CPU"
        )
    if step.sharded is not None:
        notes.append(step.sharded.note())
    if step.rec.unsupported:
        notes.append(
            f"FLOPs not counted for ops whose formula failed: {dict(step.rec.unsupported)}"
        )
    notes += [note for mode in step.fused if (note := mode.trace_note())]
    if step.rec.value_reads:
        reads = sorted(set(step.rec.value_reads))
        notes.append(
            f"the step's own code read a tensor's value ({', '.join(reads)}: a logged "
            "loss.item() or an `if` on the loss), which a dry run's tensors do not have: "
            "read as 0 (False); the figures hold unless the step branches on it"
        )
    if step.built_half is not None:
        name = "bf16" if step.built_half == torch.bfloat16 else "fp16"
        notes.append(
            f"the model's parameters were built in {name} (the factory converts them), so "
            f"the step is a pure {name} one and its figures are: gradients and optimizer "
            f"state in {name} too. Write precision='{name}-true' to say so (the spec's "
            "precision does not convert a model built so)"
        )
    if step.skipped_metrics:
        notes.append(
            f"torchmetrics metrics not updated in the dry run "
            f"({', '.join(step.skipped_metrics)}): their kernels and counters are not in "
            "the figures"
        )
    return notes


def _with_second_step(
    rec: _Recorder,
) -> tuple[list[int], list[int], list[tuple[int, str]], list[tuple[int, int, int]]]:
    """Append step 2 to the recorded step 1, without running it again.

    Step 2 repeats step 1's allocations and frees under fresh keys, except that the
    optimizer state step 1 created stays allocated instead of being created again. This
    is what every later step does, and it halves the cost of the dry run. Returns the
    events' keys and sizes, the phase marks, and the transients of both steps.
    """
    marks = list(rec.phase_marks)
    start = next(i for i, name in marks if name == "step")
    n = len(rec.ev_key)
    allocated_in_step: set[int] = set()
    ev_key, ev_size = list(rec.ev_key), list(rec.ev_size)
    step_marks = [(i, name) for i, name in marks if i >= start]
    m = 0
    offset = rec._next_key
    transients = list(rec.transients)
    repeat = [(i, nbytes, fixed) for i, nbytes, fixed in rec.transients if i >= start]
    t = 0
    for i in range(start, n):
        while m < len(step_marks) and step_marks[m][0] <= i:
            marks.append((len(ev_key), step_marks[m][1]))
            m += 1
        while t < len(repeat) and repeat[t][0] <= i:
            transients.append((len(ev_key), *repeat[t][1:]))
            t += 1
        k, sz = rec.ev_key[i], rec.ev_size[i]
        if sz > 0:
            allocated_in_step.add(k)
        if rec.key_category.get(k) == "optimizer_state" or k not in allocated_in_step:
            continue  # state persists; storages from before step 1 are not re-freed
        ev_key.append(k + offset)
        ev_size.append(sz)
    marks.extend((len(ev_key), name) for _, name in step_marks[m:])
    transients.extend((len(ev_key), nbytes, fixed) for _, nbytes, fixed in repeat[t:])
    return ev_key, ev_size, marks, transients


def _node_phase(name: str, phase: str) -> int:
    if phase == "forward":
        return 0
    if phase == "backward":
        return 1
    return 3 if name in _STATE_INIT_OPS else 2
