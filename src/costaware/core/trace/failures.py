"""A failed dry run, told as the user's bug or the dry run's own limit.

The user's bug (their factory, forward or loss raised, or the model does not take the
batch's shape) fails fast as :class:`~costaware.errors.UserCodeError`, naming the layer
and the line that failed and what to change; the dry run's limit (a model that reads a
tensor's value, an operator without a fake implementation, costaware's own bug) is a
:class:`~costaware.errors.TraceError`, so that the integrations fail open on it.
"""

from __future__ import annotations

import math
import os
import re
import traceback
from typing import Any

import torch
from torch import nn

from costaware.core.trace.user_code import (
    _OWN_DIRS,
    _TORCH_DIR,
    _factory_name,
    _installed_package,
    _is_theirs,
    _raised_by_costaware,
    _said,
    _user_frames,
    _where,
)
from costaware.errors import (
    CostawareError,
    TraceError,
    UntraceableModelError,
    UserCodeError,
    first_line,
    user_code_error,
)
from costaware.spec import ImageBatch, TokenBatch, TrainingSpec

#: what torch says when a fake or meta tensor cannot do what a real one would
_FAKE_WORDS = re.compile(
    r"fake ?tensor|fake impl|tensor subclass|meta tensor|meta device|'Meta' backend|"
    r"meta kernel|data pointer|data_ptr|doesn't have storage|without storage|"
    r"data-dependent|data dependent|unbacked|SymInt|SymFloat|SymBool|__torch_dispatch__",
    re.IGNORECASE,
)
#: what torch says about an operator without a fake (meta) implementation
_NO_FAKE_IMPL = re.compile(
    r"no fake impl|no fake implementation|no meta kernel|'Meta' backend|"
    r"attempted to run this operator with Meta tensors",
    re.IGNORECASE,
)
#: what torch says about a device the dry run does not have (it keeps every tensor on a
#: fake CPU)
_DEVICE_WORDS = re.compile(
    r"CUDA|NVIDIA|\bMPS\b|\bXPU\b|ROCm|HIP|same device|different devices|two different "
    r"devices|device type",
)
#: what torch says about a dtype that does not fit (the user's bug, unless only a fake
#: kernel says it: :func:`_real_kernel`)
_DTYPE_WORDS = re.compile(r"dtype|scalar ?type|\bBF16\b|\bFP(?:8|16|32)\b", re.IGNORECASE)
#: what autograd says when a tensor it saved for the backward was modified in place
_INPLACE_WORDS = re.compile(r"modified by an inplace operation", re.IGNORECASE)
#: torch's own implementations of ops on fake and meta tensors (meta kernels, fake
#: tensors, decompositions, references), which can refuse what a real kernel takes
_FAKE_KERNEL_DIRS = tuple(
    _TORCH_DIR + p
    for p in (
        "_meta_registrations.py",
        "_subclasses" + os.sep,
        "_decomp" + os.sep,
        "_refs" + os.sep,
        "_prims" + os.sep,
        "_prims_common" + os.sep,
    )
)
#: torch's layers and functionals, kept after the user's last frame in a traceback
_TORCH_NN_DIR = _TORCH_DIR + "nn" + os.sep
#: what torch says about shapes that do not fit (the user's bug)
_SHAPE_WORDS = re.compile(
    r"shape|size|dimension|\bdims?\b|channels|mat1|mat2|broadcast|reduction dim|"
    r"expected .{0,80}(?:but )?got",
    re.IGNORECASE,
)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, once each."""
    out: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or any(e is o for o in out):
            continue
        out.append(e)
        todo += [e.__cause__, e.__context__]
    return out


def _limit_of_the_dry_run(exc: BaseException) -> str | None:
    """Why ``exc`` is a limit of the dry run rather than the user's bug ("value",
    "dynamic", "unsupported", "device", "fake", "recompute", "internal"), or None where it
    is theirs."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedOperatorException,
    )

    for e in _chain(exc):  # a fake tensor's refusal, however the model re-raised it
        if type(e).__name__ == "CheckpointError" and "Recomputed values" in str(e):
            return "recompute"  # a real step's recomputation runs the forward's kernels
        if isinstance(e, DataDependentOutputException):
            return "value"
        if isinstance(e, DynamicOutputShapeException):
            return "dynamic"
        if isinstance(e, UnsupportedOperatorException) or _NO_FAKE_IMPL.search(str(e)):
            return "unsupported"
        if type(e).__module__.startswith(
            ("torch._subclasses", "torch.fx.experimental", "torch._guards")
        ):
            return "device" if _DEVICE_WORDS.search(str(e)) else "fake"
    text = str(exc)
    if _DEVICE_WORDS.search(text):
        return "device"
    if _FAKE_WORDS.search(text):
        return "fake"
    # a fake (meta) kernel's dtype check, which mirrors a GPU kernel's (grouped_mm's bf16
    # alone) where the real kernel takes more: a real step runs, so the dry run's limit
    if _DTYPE_WORDS.search(text) and _in_fake_kernel(exc) and _real_kernel(exc)[0] is True:
        return "kernel"
    frames = traceback.extract_tb(exc.__traceback__)
    innermost = frames[-1].filename if frames else ""
    # torch's word for an operator without a meta kernel; a module without a forward, or
    # the user's own `raise NotImplementedError`, is the user's
    if (
        isinstance(exc, NotImplementedError)
        and not _is_theirs(innermost)
        and 'missing the required "forward"' not in text
    ):
        return "unsupported"
    if _raised_by_costaware(exc):
        return "internal"
    return None


def _in_fake_kernel(exc: BaseException) -> bool:
    """Whether ``exc`` arose in torch's implementation of an op on fake or meta tensors
    (its innermost frames, past ``torch._check``, are a meta kernel, the fake tensor's
    dispatch or a decomposition)."""
    frames = traceback.extract_tb(exc.__traceback__)
    while frames and frames[-1].filename == _TORCH_DIR + "__init__.py":  # torch._check
        frames.pop()
    return bool(frames) and frames[-1].filename.startswith(_FAKE_KERNEL_DIRS)


#: elements the tensors of one real kernel's check may hold together
_REAL_CHECK_NUMEL = 1 << 20


def _fake_op_call(exc: BaseException) -> tuple[Any, tuple[Any, ...], dict[str, Any]] | None:
    """The op the fake tensor mode was dispatching (the outermost one: the op the model
    called, not those of its decomposition) when ``exc`` arose, with its arguments."""
    from torch._ops import OpOverload

    for frame, _ in traceback.walk_tb(exc.__traceback__):
        if not frame.f_code.co_filename.startswith(_TORCH_DIR + "_subclasses" + os.sep):
            continue
        func, args = frame.f_locals.get("func"), frame.f_locals.get("args")
        if isinstance(func, OpOverload) and isinstance(args, tuple):
            kwargs = frame.f_locals.get("kwargs")
            return func, args, dict(kwargs) if isinstance(kwargs, dict) else {}
    return None


def _real_kernel(exc: BaseException) -> tuple[bool | None, str | None]:
    """Whether the real CPU kernel of the op a fake kernel refused (:func:`_fake_op_call`)
    takes its arguments' dtypes: it is run on small real tensors of the same dtypes and
    ranks (each dimension cut to at most 16, so that equal sizes stay equal). Returns
    True where it runs; False, with what it said, where it raises too; None where it
    cannot be told (no op found, tensors too large)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._pytree import tree_flatten, tree_map

    call = _fake_op_call(exc)
    if call is None:
        return None, None
    func, args, kwargs = call
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    numel = sum(math.prod(min(int(n), 16) for n in t.shape) for t in tensors)
    if not tensors or numel > _REAL_CHECK_NUMEL:
        return None, None

    def small(a: Any) -> Any:
        if not isinstance(a, torch.Tensor):
            return a
        return torch.zeros([min(int(n), 16) for n in a.shape], dtype=a.dtype, device="cpu")

    try:
        with unset_fake_temporarily(), torch.no_grad():
            func(*tree_map(small, args), **tree_map(small, kwargs))
    except Exception as e:
        return False, first_line(e).split(": ", 1)[-1]
    return True, None


def _op_name(func: Any) -> str:
    name = str(func)
    return name[: -len(".default")] if name.endswith(".default") else name


def _in_optimizer(exc: BaseException) -> str | None:
    """The class name of the optimizer whose step was running when ``exc`` arose (torch's
    or the user's), or None where none was."""
    found = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        # an optimizer's own method, or costaware's call of its step (optimizer.py)
        stepping = frame.f_code.co_name in ("_optimizer_step", "_flat_optimizer_step")
        this = frame.f_locals.get("opt" if stepping else "self")
        if isinstance(this, torch.optim.Optimizer):
            found = found or type(this).__name__
        if found is None and frame.f_code.co_filename.startswith(_TORCH_DIR + "optim"):
            found = "the optimizer"
    return found


def _untraceable(exc: BaseException, why: str) -> TraceError:
    """The dry run's own failure, said so: the trial is admitted (fail open)."""
    error = _untraceable_error(exc, why)
    if why != "internal" and any(
        f"{os.sep}torchmetrics{os.sep}" in f.filename
        for f in traceback.extract_tb(exc.__traceback__)
    ):
        error.args = (
            f"{error.args[0]} It is a torchmetrics computation: the dry run skips a metric "
            "module's update (self.acc = MulticlassAccuracy(...), then self.acc(preds, y)), "
            "not a functional metric.",
        )
    return error


def _library_of(exc: BaseException) -> str | None:
    """The installed package (``transformers``) whose code, not the user's own, is the
    innermost of the user's side of ``exc``'s traceback; None where that is the user's."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if _is_theirs(frame.filename):
            return _installed_package(frame.filename)
    return None


def _untraceable_error(exc: BaseException, why: str) -> TraceError:
    """The error :func:`_untraceable` raises, before any hint."""
    where = _where(exc)
    ours = "This is a limit of costaware's dry run, not a bug in the model"
    optimizer = _in_optimizer(exc) if why in ("value", "dynamic") else None
    if optimizer is not None:
        return UntraceableModelError(
            f"The optimizer step cannot run on fake tensors: the step of {optimizer} reads "
            f"a tensor's value {where} (an .item(), float(t) or a Python `if` on a tensor, as "
            "Adafactor's and ASGD's steps do), which the dry run cannot follow: its tensors "
            f"have no values ({_said(exc)}). {ours} or the optimizer; a real training step "
            "runs it. To predict such a trial, dry-run it with an optimizer that keeps as "
            "much state (SGD with momentum: one tensor per parameter; Adam: two)."
        )
    if why == "kernel":
        call = _fake_op_call(exc)
        op = _op_name(call[0]) if call is not None else "an operator"
        return UntraceableModelError(
            f"The model cannot run on fake tensors: torch's fake (meta) kernel of {op} "
            f"{where} refuses its inputs' dtypes ({_said(exc)}), though the real kernel takes "
            f"them: the fake kernel checks what one GPU kernel takes. {ours}: a real "
            "training step runs it. To predict it, run the model in a dtype that kernel "
            "takes (for grouped_mm, bf16: precision='bf16-true')."
        )
    library = _library_of(exc) if why in ("value", "dynamic") else None
    if library is not None:
        read = (
            "reads a tensor's value"
            if why == "value"
            else "makes a tensor whose size depends on the values"
        )
        return UntraceableModelError(
            f"The model cannot run on fake tensors: the code of the installed package "
            f"{library!r} {read} {where} "
            f"({_said(exc)}), and a dry run's tensors have no values. {ours}, and not code "
            "you can change: where it is the model's own loss (Hugging Face computes one "
            "when the batch has labels), give the spec loss=callable(model, batch) that "
            "computes the loss from the logits, so that it is not called; a detection "
            "model's target handling has no such way round."
        )
    if why == "value":
        return UntraceableModelError(
            f"The model cannot run on fake tensors: it reads a tensor's value {where} "
            "(.item(), .tolist(), float(t), or a Python `if` on a tensor), and a dry run's "
            f"tensors have no values. {ours}; to make it predictable, keep the computation in "
            "tensors (torch.where rather than an `if`): only the loss and training_step may "
            "read a value."
        )
    if why == "dynamic":
        op = _op_of(exc)
        if op == "aten._pack_padded_sequence":
            return UntraceableModelError(
                f"The model cannot run on fake tensors: pack_padded_sequence {where} packs as "
                "many steps as the lengths' values say, and a dry run's tensors have no "
                f"values. {ours}; a prediction of the same model on padded sequences (without "
                "the packing, at the full length) bounds the packed step's memory and time."
            )
        fixed = (
            "torch.bincount(x, minlength=n)"
            if op == "aten.bincount"
            else "torch.where(mask, x, 0), masked_fill"
        )
        return UntraceableModelError(
            f"The model cannot run on fake tensors: the operator {op} {where} "
            "returns a tensor whose size depends on the values (nonzero, a boolean mask such as "
            f"x[x > 0], unique), and a dry run's tensors have no values. {ours}; to make it "
            f"predictable, use a fixed-size form ({fixed})."
        )
    if why == "unsupported":
        return UntraceableModelError(
            f"The model cannot run on fake tensors: an operator {where} has no fake (meta) "
            f"implementation ({_said(exc)}). {ours}; an operator of your own can be "
            "given one with torch.library.register_fake."
        )
    if why == "device":
        return UntraceableModelError(
            f"The model cannot run on fake tensors: it places tensors on a device of its own "
            f"{where} ({_said(exc)}), and the dry run keeps every tensor on a fake CPU. "
            f"{ours}; to make it predictable, create tensors on the input's device "
            "(torch.zeros(..., device=x.device)) or register them as buffers."
        )
    if why == "recompute":
        return UntraceableModelError(
            "The dry run could not recompute an activation checkpoint as its forward ran "
            f"({_said(exc)}): the step runs on fake tensors, with the kernels a GPU "
            "runs; a real step recomputes with the same kernels both times. "
            f"{ours}."
        )
    if why == "internal":
        return TraceError(
            f"costaware's dry run failed inside costaware at {_own_line(exc)}: "
            f"{_said(exc)}. This is costaware's bug, not the model's; please report it."
        )
    return UntraceableModelError(
        f"The model cannot run on fake tensors: {_said(exc)} {where}. {ours}: the "
        "step runs on tensors without data, and this model needs them."
    )


def _op_of(exc: BaseException) -> str:
    """The aten operator a fake tensor refused (``aten.nonzero``), from the chain."""
    for e in _chain(exc):
        func = getattr(e, "func", None)
        if func is not None:
            name = str(func)
            return name[: -len(".default")] if name.endswith(".default") else name
    return _said(exc)


def _own_line(exc: BaseException) -> str:
    """The innermost line of costaware's own code that ``exc`` passed through (it may
    have arisen in torch, called from there)."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if f.filename.startswith(_OWN_DIRS) and not _is_theirs(f.filename)]
    if not frames:
        return "an unknown place"
    last = (own or frames)[-1]
    return f"{os.path.basename(last.filename)}:{last.lineno}"


def _shape(t: Any) -> str | None:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else None


def _failing_layer(
    exc: BaseException, model: nn.Module | None
) -> tuple[str, nn.Module, Any] | None:
    """The innermost module that was running when ``exc`` arose: its name in ``model``
    (``"fc"``; ``""`` for the model itself), the module, and the input it was called with
    (None where that is not a tensor)."""
    layer: nn.Module | None = None
    inputs: dict[int, Any] = {}
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        this = frame.f_locals.get("self")
        if not isinstance(this, nn.Module):
            continue
        layer = this
        if frame.f_code.co_name in ("_call_impl", "_wrapped_call_impl"):
            args = frame.f_locals.get("args")  # as the module was called, never rebound
            if isinstance(args, tuple) and args:
                inputs[id(this)] = args[0]
    if layer is None:
        return None
    names = {id(m): n for n, m in model.named_modules()} if model is not None else {}
    return names.get(id(layer), "?"), layer, inputs.get(id(layer))


def _batch_words(spec: TrainingSpec) -> str:
    """The spec's batch as the user wrote it, and the inputs it makes."""
    b = spec.batch
    bs = spec.batch_size
    if isinstance(b, ImageBatch):
        return f"{b!r} at batch_size={bs}: inputs of shape {(bs, *b.shape)}"
    if isinstance(b, TokenBatch):
        return f"{b!r} at batch_size={bs}: input_ids of shape {(bs, b.seq_len)}"
    shapes = getattr(b, "shapes", None)  # a batch like an example (TrainingSpec.from_module)
    if callable(shapes):
        return f"one like the example, at batch_size={bs}: {shapes(bs)}"
    return f"batch={_factory_name(b)}({bs})"


def _image_size_hint(spec: TrainingSpec, modules: list[nn.Module]) -> str | None:
    """Where the model records the image size it was built for and the batch's differs."""
    b = spec.batch
    if not isinstance(b, ImageBatch) or len(b.shape) != 3:
        return None
    for m in modules:
        config = getattr(m, "config", None)
        for owner in (m, config):
            for attr in ("image_size", "img_size"):
                size = getattr(owner, attr, None) if owner is not None else None
                if isinstance(size, (tuple, list)) and len(size) == 2:
                    hw = tuple(int(v) for v in size)
                elif isinstance(size, int):
                    hw = (size, size)
                else:
                    continue
                if hw != tuple(b.shape[1:]):
                    c = b.shape[0]
                    return (
                        f"the model was built for {attr}={size} but the batch's images are "
                        f"{b.shape[1]}x{b.shape[2]}: make the batch "
                        f"{type(b).__name__}(shape={(c, *hw)}, ...) or build the model with "
                        f"{attr}={b.shape[1] if b.shape[1] == b.shape[2] else tuple(b.shape[1:])}"
                    )
    return None


def _layer_hint(spec: TrainingSpec, label: str, layer: nn.Module, arg: Any) -> str | None:
    """The size a linear or convolutional layer takes against the one it was given."""
    if not isinstance(arg, torch.Tensor):
        return None
    if isinstance(layer, nn.Linear) and arg.dim() >= 1 and arg.shape[-1] != layer.in_features:
        got = int(arg.shape[-1])
        if arg.dim() > 2:  # an image or a sequence where the layer takes flat features
            flat = math.prod(int(n) for n in arg.shape[1:])
            fits = (
                "as the layer takes"
                if flat == layer.in_features
                else f"and the layer takes {layer.in_features}: make the batch give it that many"
            )
            each = (
                f"; or, if it acts on each position of a sequence, build the layer with "
                f"in_features={got}"
                if arg.dim() == 3
                else ""
            )
            return (
                f"{label} takes inputs of shape (N, in_features={layer.in_features}) but gets "
                f"a {arg.dim()}-D input of shape {tuple(arg.shape)}: flatten it to (N, "
                f"features) before the layer (x.flatten(1) gives {flat} features per sample, "
                f"{fits}){each}"
            )
        return (
            f"{label} takes in_features={layer.in_features} per sample but gets {got}: make the "
            f"batch give it {layer.in_features}, or build the layer with in_features={got}"
        )
    if isinstance(layer, nn.modules.conv._ConvNd) and arg.dim() not in (
        layer.weight.dim(),
        layer.weight.dim() - 1,
    ):  # a flat batch where the layer takes images: its sizes are no channels
        c = layer.in_channels
        dims = layer.weight.dim() - 2
        sizes = {1: "L", 2: "H, W", 3: "D, H, W"}.get(dims, "...")
        sample = f"(C, {sizes})"
        fit = ""
        b = spec.batch
        if isinstance(b, ImageBatch) and len(b.shape) == 1 and dims == 2 and b.shape[0] % c == 0:
            side = math.isqrt(b.shape[0] // c)
            if side * side * c == b.shape[0]:
                fit = f" ({type(b).__name__}(shape={(c, side, side)}, ...))"
        return (
            f"{label} takes a {dims + 2}-D batch (N, C, ...) of {dims + 1}-D samples {sample} "
            f"with C=in_channels={c}, but gets a {arg.dim()}-D input of shape "
            f"{tuple(arg.shape)}: give the batch the shape {sample} per sample"
            + (fit or f", ImageBatch(shape=({c}, {sizes}), ...)")
        )
    if isinstance(layer, nn.modules.conv._ConvNd) and arg.dim() >= 2:
        got = int(arg.shape[1] if arg.dim() > layer.weight.dim() - 2 else arg.shape[0])
        if got != layer.in_channels:
            fit = ""
            b = spec.batch
            if isinstance(b, ImageBatch) and len(b.shape) == 3 and b.shape[0] == got:
                fit = f" ({type(b).__name__}(shape={(layer.in_channels, *b.shape[1:])}, ...))"
            return (
                f"{label} takes in_channels={layer.in_channels} but gets {got} channels: make the "
                f"batch give it {layer.in_channels}{fit}, or build the layer with "
                f"in_channels={got}"
            )
    return None


def _stage(exc: BaseException, spec: TrainingSpec) -> tuple[str, str] | None:
    """Which part of the step raised ``exc``, and what to fix there: the batch function,
    the optimizer step, the backward, the model's forward, the loss or costaware's default
    loss; None when none of them was running."""
    frames = [f for f, _ in traceback.walk_tb(exc.__traceback__)]
    files = [f.f_code.co_filename for f in frames]
    names = [f.f_code.co_name for f in frames]
    loss_code = getattr(spec.loss, "__code__", None)
    batch_fn = getattr(spec.batch_spec, "fn", None)  # a batch callable's (_CallableBatch)
    batch_code = getattr(batch_fn, "__code__", None)
    if batch_code is not None and any(f.f_code is batch_code for f in frames):
        what, fix = (
            "The batch function",
            "fix it (TrainingSpec(batch=...) calls it with the batch size, and it must return "
            "one batch as the training loop gets it)",
        )
    elif any(p.startswith(_TORCH_DIR + "optim") for p in files) or "_optimizer_step" in names:
        what, fix = "The optimizer step", "fix the optimizer or its arguments"
    elif any(
        p.startswith(_TORCH_DIR) and n in ("backward", "_engine_run_backward")
        for p, n in zip(files, names, strict=True)
    ):
        what, fix = (
            "The backward pass",
            "fix the model's custom backward (a torch.autograd.Function) or the op whose "
            "gradient failed",
        )
    elif any(isinstance(f.f_locals.get("self"), nn.Module) for f in frames):
        theirs = [f for f in frames if _is_theirs(f.f_code.co_filename)]
        if theirs and theirs[-1].f_code.co_name == "training_step":  # raised right there
            what, fix = "The LightningModule's training_step", "fix the training_step"
        else:
            what, fix = "The model's forward", "fix the model"
    elif loss_code is not None and any(f.f_code is loss_code for f in frames):
        what, fix = "The loss", "fix the loss"
    elif spec.loss is None and any(
        os.path.basename(p) == "spec.py" and p.startswith(_OWN_DIRS) for p in files
    ):
        what = "costaware's default loss"
        fix = (
            "pass TrainingSpec(loss=callable(model, batch)) that computes the loss as the "
            "training does"
        )
    else:
        return None
    return what, fix


def _user_bug(
    exc: Exception, spec: TrainingSpec, model: nn.Module | None, stage: tuple[str, str] | None
) -> UserCodeError:
    """The user's bug in the training step (forward, loss, backward), said so: where it
    arose (``stage``, from :func:`_stage`), in which layer, with what input, and what to
    change."""
    where = _where(exc)
    what, fix = stage or ("The training step", "fix the model or the loss")
    found = _failing_layer(exc, model)
    in_layer, hint = "", None
    if found is not None:
        name, layer, arg = found
        label = f"`{name}`" if name not in ("", "?") else "the model"
        in_layer = f", in {label} ({_short_repr(layer)}"
        if _shape(arg) is not None:
            in_layer += f", given an input of shape {_shape(arg)}"
        in_layer += ")"
        hint = _layer_hint(spec, label, layer, arg)
    modules = [m for m in (model, found[1] if found else None) if m is not None]
    batch = _batch_words(spec)
    if isinstance(exc, RuntimeError) and _INPLACE_WORDS.search(str(exc)):
        return _inplace_error(exc, spec, model, batch)
    # torch says that a dtype or a shape does not fit with a RuntimeError (a loss's batch
    # sizes with a ValueError, a model's own check with an AssertionError); an IndexError
    # or a TypeError is the code's own mistake, whatever words it uses
    told = isinstance(exc, (RuntimeError, ValueError, AssertionError))
    if told and _DTYPE_WORDS.search(str(exc)):
        real = _real_kernel(exc)[1] if _in_fake_kernel(exc) else None
        said = _said(exc) + (
            f" (the real kernel says: {real.rstrip('. ')})"
            if real and real[:40] not in str(exc)  # the fake kernel's words differ
            else ""
        )
        return user_code_error(
            f"{what} fails on a dtype mismatch {where}{in_layer}: {said}. The batch is "
            f"{batch}. A real training step fails the same way. Give each tensor the dtype "
            "the operation takes: class-index targets of cross_entropy and nll_loss, and the "
            "indices of gather, index_select or an embedding, are int64 (y.long(), not "
            "y.float()); a layer's input is in its weights' dtype (x.to(weight.dtype), or a "
            f"mixed precision that autocasts both). Then {fix}.",
            exc,
        )
    if told and _SHAPE_WORDS.search(str(exc)):
        if what != "The model's forward":  # the loss does not fit the model's output
            change = f"Make it fit the model's output and the batch: {fix}."
        else:
            hint = hint or _image_size_hint(spec, modules)
            change = (
                "Change the batch to the shape the model was built for, or build the model for "
                "this batch"
                + (f": {hint}." if hint else " (its input size, channels or image size).")
            )
        return user_code_error(
            f"{what} fails on a shape mismatch {where}{in_layer}: {_said(exc)}. The batch is "
            f"{batch}. A real training step fails the same way. {change}",
            exc,
        )
    same = "A real training step runs the same code and fails the same way"
    if spec.loss is None and isinstance(exc, TypeError) and _custom_batch(spec):
        # costaware's default loss chose how to call the model with a batch it did not
        # make: the training step may call it otherwise
        same = (
            "costaware's default loss called the model (model(**batch) for a dict, "
            "model(batch) for a tensor); if the training step calls it otherwise, pass "
            "TrainingSpec(loss=callable(model, batch)) that calls it as the training does. "
            "Otherwise"
        )
    return user_code_error(
        f"{what} raised {_said(exc)} {where}{in_layer}. {same}: {fix} (the batch is "
        f"{batch}).",
        exc,
    )


def _inplace_error(
    exc: Exception, spec: TrainingSpec, model: nn.Module | None, batch: str
) -> UserCodeError:
    """A tensor autograd saved for the backward was modified in place in the forward: said
    so, with the op that made it and the lines of the model's forward that may have
    modified it (the dry run has no anomaly mode's record of the forward)."""
    made = re.search(r"\[torch\.(\w+) \[([\d, ]*)\]\], which is output (\d+) of (\w+)", str(exc))
    what = (
        f" (here the {made.group(1)} of shape ({made.group(2)}) that {made.group(4)} made)"
        if made
        else ""
    )
    lines = _inplace_lines(model)
    look = (
        "The model's forward modifies in place at "
        + "; ".join(lines)
        + (": check those first" if len(lines) > 1 else ": check it first")
        if lines
        else "The dry run cannot name the line (a real run under "
        "torch.autograd.set_detect_anomaly(True) names the forward line of the op whose "
        "saved tensor changed)"
    )
    return user_code_error(
        f"The backward pass fails: a tensor that autograd saved in the forward to compute "
        f"the gradients was modified in place afterwards{what} ({_said(exc)}). A real training "
        "step fails the same way. Look in the model's forward, after the op that made that "
        "tensor, for an in-place operation on it: a method ending in an underscore "
        "(y.mul_(0.5), y.add_(b)), an augmented assignment (y += b, y *= 0.5), an indexed "
        "assignment (y[:, 0] = 0) or a layer built with inplace=True (nn.ReLU(inplace=True)) "
        f"after it; make it out of place (y = y * 0.5). {look} (the batch is {batch}).",
        exc,
    )


#: a line of a forward that modifies a tensor in place: a Tensor method ending in an
#: underscore, an augmented assignment, an activation built with inplace=True
_INPLACE_LINE = re.compile(
    r"\.(?P<method>[a-z]\w*_)\(|^\s*[\w.]+\s*(?:[-+*/]|//)=(?!=)|\binplace\s*=\s*True"
)


def _inplace_lines(model: nn.Module | None, limit: int = 3) -> list[str]:
    """``path:line (`code`)`` of the lines of the model's own modules (the user's files,
    not a library's) that modify a tensor in place, at most ``limit``."""
    import inspect

    if model is None:
        return []
    found: list[str] = []
    for cls in dict.fromkeys(type(m) for m in model.modules()):
        for fn in (cls.__dict__.get("forward"), cls.__dict__.get("__init__")):
            if fn is None:
                continue
            try:
                path = inspect.getsourcefile(fn)
                if not path or not _is_theirs(path) or _installed_package(path):
                    continue
                source, first = inspect.getsourcelines(fn)
            except (OSError, TypeError):
                continue
            for i, line in enumerate(source):
                code = line.split("#", 1)[0]
                hit = _INPLACE_LINE.search(code)
                if hit is None or (fn is cls.__dict__.get("__init__") and "inplace" not in code):
                    continue
                method = hit.group("method")
                if method is not None and not callable(getattr(torch.Tensor, method, None)):
                    continue
                found.append(f"{path}:{first + i} (`{code.strip()}`)")
                if len(found) == limit:
                    return found
    return found


def _custom_batch(spec: TrainingSpec) -> bool:
    """Whether the spec's batch is the user's own (a callable's), not one costaware made."""
    from costaware.spec import ImageBatch, TokenBatch

    return not isinstance(spec.batch, (ImageBatch, TokenBatch))


def _short_repr(module: nn.Module) -> str:
    """``Linear(in_features=784, out_features=64, bias=True)``; a container's class name."""
    extra = module.extra_repr()
    return (
        f"{type(module).__name__}({extra})"
        if extra and "\n" not in extra
        else type(module).__name__
    )


def _classify(exc: Exception, spec: TrainingSpec, model: nn.Module | None) -> Exception:
    """The error a failed dry run raises: the user's bug (:class:`UserCodeError`), or the
    dry run's own failure (:class:`UntraceableModelError`, :class:`TraceError`)."""
    if isinstance(exc, CostawareError):
        return exc
    why = _limit_of_the_dry_run(exc)
    if why is not None:
        return _untraceable(exc, why)
    if isinstance(exc, MemoryError):
        return TraceError(f"the dry run ran out of this machine's memory: {first_line(exc)}")
    stage = _stage(exc, spec)
    if stage is None and not _user_frames(exc):
        # neither the model, the loss, the optimizer nor any code of the user's ran: the
        # dry run's own preparation failed, in torch or in costaware
        return _untraceable(exc, "internal")
    error = _user_bug(exc, spec, model, stage)
    _trim_traceback(exc)
    return error


def _trim_traceback(exc: BaseException) -> None:
    """End ``exc``'s traceback (the user's error, told as the cause of their
    :class:`UserCodeError`) at its last frame in the user's code and the ``torch.nn``
    frames it called (the layer, the functional): the dozens of frames of torch's dispatch
    and costaware's modes after them, where a fake tensor's kernel raised what a real one
    would, say nothing the message does not. The frames before are kept. The message is
    made first, from the whole traceback."""
    import types

    tbs = []
    tb = exc.__traceback__
    while tb is not None:
        tbs.append(tb)
        tb = tb.tb_next
    theirs = [i for i, t in enumerate(tbs) if _is_theirs(t.tb_frame.f_code.co_filename)]
    if not theirs:
        return
    end = theirs[-1] + 1
    while end < len(tbs) and tbs[end].tb_frame.f_code.co_filename.startswith(_TORCH_NN_DIR):
        end += 1
    if end == len(tbs):
        return
    kept: types.TracebackType | None = None
    for t in reversed(tbs[:end]):
        kept = types.TracebackType(kept, t.tb_frame, t.tb_lasti, t.tb_lineno)
    exc.__traceback__ = kept
