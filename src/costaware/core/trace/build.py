"""The model the dry run traces: built from the user's factory on the ``meta`` device
(no memory, any size), or, where the constructor needs real tensors, for real on the
CPU within a memory limit (:func:`default_real_build_limit`); then its parameters and
buffers swapped for fake tensors.

A factory that fails is the user's bug, said with the line that failed; a model too
large to build for real is the dry run's limit, said with what to change.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import os
import re
import traceback
import weakref
from typing import Any, ClassVar

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from costaware.core.trace.failures import _DEVICE_WORDS, _chain
from costaware.core.trace.user_code import (
    _factory_name,
    _failing_line,
    _is_theirs,
    _said,
    _where,
)
from costaware.errors import (
    CostawareError,
    SpecError,
    UntraceableModelError,
    first_line,
    user_code_error,
)
from costaware.from_code import uninitialized_like
from costaware.spec import TrainingSpec


def build_model(
    spec: TrainingSpec, *, real_build_limit: int | None = None
) -> tuple[nn.Module, str]:
    """Build the spec's model without allocating it: on ``meta`` when possible.

    Returns the module and how it was built: ``"meta"``, ``"cpu"`` (the constructor
    computes with tensors and failed on meta, so it ran for real on the CPU) or
    ``"module"`` (an instance was given; it is copied to meta, never modified).

    The real build is bounded: it stops, with :class:`~costaware.errors.UntraceableModelError`
    naming the line that failed on meta, once the tensors it holds pass
    ``real_build_limit`` bytes (default :func:`default_real_build_limit`: half of the memory
    this machine has available).
    """
    if isinstance(spec.model, nn.Module):
        src = spec.model
        memo: dict[int, Any] = {}
        for p in src.parameters():
            memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
        for b in src.buffers():
            memo[id(b)] = torch.empty_like(b, device="meta")
        return copy.deepcopy(src, memo), "module"
    _check_zero_arguments(spec.model)
    meta_error: Exception | None = None
    try:
        with torch.device("meta"):
            model = spec.model()
        how = "meta"
    except Exception as e:  # the constructor reads values: built for real, within a limit
        meta_error = e
    if meta_error is not None:
        # out of the `except`: the real build's error is not told as raised "during
        # handling" of the meta one
        if _raised_by_the_factory(meta_error):  # it fails the same way for real: once
            error = _factory_error(meta_error, spec)
            if error is meta_error:
                raise error
            raise error from meta_error
        model = _build_for_real(spec, meta_error, real_build_limit)
        how = "cpu"
    if not isinstance(model, nn.Module):
        raise SpecError(
            f"the model factory {_factory_name(spec.model)} must return an nn.Module, but it "
            f"returned {type(model).__name__}: TrainingSpec(model=...) takes a zero-argument "
            "callable that builds the model, or an nn.Module."
        )
    return model, how


def _check_zero_arguments(factory: Any) -> None:
    """Raise :class:`SpecError` when ``factory`` cannot be called with no arguments (a
    factory that needs them, or a class whose constructor does), naming what it needs."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C callable: let the call say
        return
    try:
        sig.bind()
        return
    except TypeError:
        pass
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    needed = [
        p.name
        for p in sig.parameters.values()
        if p.default is p.empty and (p.kind in kinds or p.kind is inspect.Parameter.KEYWORD_ONLY)
    ]
    name = _factory_name(factory)
    args = ", ".join(f"{n}=..." for n in needed)
    listed = ", ".join(f"`{n}`" for n in needed)
    if isinstance(factory, type):
        raise SpecError(
            f"TrainingSpec(model={name}) passes the class {name}, which costaware calls with "
            f"no arguments to build the model, but {name}() needs {listed}. Pass a "
            f"zero-argument factory, model=lambda: {name}({args}), or an instance, "
            f"model={name}({args})."
        )
    inner = factory.func if isinstance(factory, functools.partial) else factory
    base = _factory_name(inner)
    raise SpecError(
        f"TrainingSpec(model={name}) is called with no arguments to build the model, but "
        f"{base}() needs {listed}. Pass a zero-argument factory: "
        f"model=lambda: {base}({args}) or model=functools.partial({base}, {args})."
    )


#: what torch says when a tensor on the meta device cannot do what a real one would
_META_WORDS = re.compile(r"\bmeta\b|no data|storage|data pointer|Scalar|item\(\)", re.IGNORECASE)


def _raised_by_the_factory(error: BaseException) -> bool:
    """Whether the factory's own code raised ``error`` on the meta device, not a torch
    op that a real tensor would have let through: the error arose in the user's code
    (its innermost frame is theirs), no error it was raised from or while handling did
    in torch, and it is neither of the types torch's ops raise on meta
    (``RuntimeError``, ``NotImplementedError``) nor says a word of the meta device. Such
    a factory fails the same way for real, so it is not built again (it runs once)."""
    for e in _chain(error):
        frames = traceback.extract_tb(e.__traceback__)
        if not frames or not _is_theirs(frames[-1].filename):
            return False
        if isinstance(e, (RuntimeError, NotImplementedError)) or _META_WORDS.search(str(e)):
            return False
    return True


def _factory_error(error: Exception, spec: TrainingSpec) -> Exception:
    """The error to raise for a model factory that failed when run for real on the CPU
    (after it failed on meta): the user's bug (:class:`UserCodeError`), unless the failure
    is this machine's (no GPU, out of memory) or costaware's, which fail open."""
    if isinstance(error, CostawareError):
        return error
    name = _factory_name(spec.model)
    if isinstance(error, MemoryError):
        return UntraceableModelError(
            f"the model factory {name} ran out of this machine's memory when built for real on "
            "the CPU (it failed on the meta device first): a limit of costaware's dry run, not "
            "a bug in the factory."
        )
    if _DEVICE_WORDS.search(str(error)):
        return UntraceableModelError(
            f"the model factory {name} needs a device this machine lacks "
            f"({_said(error)}) {_where(error)}. The dry run builds the model on "
            "the CPU (the meta device): a limit of costaware's dry run, not a bug in the "
            "factory. To predict it, return the model on the CPU and move it to the GPU in the "
            "training code."
        )
    return user_code_error(
        f"the model factory {name} raised {_said(error)} {_where(error)}. This "
        "is the factory's own code: it fails the same way when built for real on the CPU, so "
        "a real trial would fail too. Fix the factory (TrainingSpec(model=...) calls it with "
        "no arguments and it must return an nn.Module).",
        error,
    )


#: the share of this machine's available memory that the real builds of models may hold
REAL_BUILD_SHARE = 0.5


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory() -> int | None:
    """Bytes of memory this process can still take: ``MemAvailable`` from /proc/meminfo,
    or what its cgroup's memory limit leaves where that is less (cgroup v2 or v1); where
    there is no /proc/meminfo, the machine's physical memory. None if none can be read."""
    avail: int | None = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            return None
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        cap, used = _read_int(limit_file), _read_int(usage_file)
        if cap is not None and used is not None and cap < 2**60:
            avail = min(avail, max(cap - used, 0))
    return avail


def default_real_build_limit(in_use: int = 0) -> int:
    """Bytes of tensors the real (not meta) builds of models may hold together:
    ``REAL_BUILD_SHARE`` of :func:`available_memory` plus the ``in_use`` bytes that builds
    in progress hold (4 GiB where the memory available cannot be read)."""
    avail = available_memory()
    return int(REAL_BUILD_SHARE * (avail + in_use)) if avail is not None else 4 * 2**30


class _RealBuildTooLarge(BaseException):
    """Raised inside a real build whose tensors pass its limit; not an ``Exception``, so a
    factory's own ``except Exception`` does not swallow it."""


#: aten ops that allocate a fresh tensor of their ``size`` argument (or, ``*_like``, of
#: their first argument's size): checked before they run, so that a build is refused
#: before it writes a tensor past the limit (``zeros`` or ``randn`` write every byte in
#: one call)
_FILLING_OPS = frozenset(
    {"empty", "empty_strided", "zeros", "ones", "full", "rand", "randn", "randint", "normal"}
    | {"new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full"}
)


class _AllocationLimit(TorchDispatchMode):
    """Counts the bytes of the CPU storages a real model build creates and still holds,
    and stops the build (:class:`_RealBuildTooLarge`) before they pass ``limit``.

    Every op's new storages are added after it runs; an op that allocates a tensor of a
    known size (``_FILLING_OPS``) is checked before it runs. Storages freed again are
    dropped from the count once it nears the limit. What torch does not allocate (a NumPy
    array, a file read into Python objects) is not seen.
    """

    #: the real builds in progress in this process (threads), which share the limit
    active: ClassVar[weakref.WeakSet[_AllocationLimit]] = weakref.WeakSet()

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.live: dict[int, tuple[Any, int]] = {}  # storage -> (weak reference, bytes)
        self.held = 0
        self.refused = False

    def others(self) -> int:
        """Bytes the other real builds in progress hold."""
        return sum(m.held for m in list(self.active) if m is not self)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        from torch.multiprocessing.reductions import StorageWeakRef

        kwargs = kwargs or {}
        upcoming = _upcoming_bytes(func, args, kwargs)
        if upcoming:
            self._check(upcoming)
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                nbytes = storage.nbytes()
                ref = StorageWeakRef(storage)
                if nbytes and ref.cdata not in self.live:
                    self.live[ref.cdata] = (ref, nbytes)
                    self.held += nbytes
        self._check(0)
        return out

    def _check(self, extra: int) -> None:
        if self.held + extra <= self.limit and (
            len(self.active) < 2 or self.held + extra + self.others() <= self.limit
        ):
            return
        for key, (ref, nbytes) in list(self.live.items()):
            if ref.expired():
                del self.live[key]
                self.held -= nbytes
        if self.held + extra + self.others() > self.limit:
            self.refused = True
            raise _RealBuildTooLarge(self.held + extra)


def _upcoming_bytes(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Bytes the op ``func`` is about to allocate, where its arguments say (else 0)."""
    name = func.overloadpacket.__name__
    like = name.endswith("_like") and args and isinstance(args[0], torch.Tensor)
    if not like and name not in _FILLING_OPS:
        return 0
    dtype = kwargs.get("dtype")
    if like:
        numel, dtype = args[0].numel(), dtype or args[0].dtype
    else:
        size = kwargs.get("size")
        if size is None:
            size = next((a for a in args if isinstance(a, (list, tuple, torch.Size))), None)
        if size is None or not all(isinstance(n, int) for n in size):
            return 0
        numel = math.prod(size)
        if dtype is None and name.startswith("new_") and isinstance(args[0], torch.Tensor):
            dtype = args[0].dtype
    dtype = dtype if isinstance(dtype, torch.dtype) else torch.get_default_dtype()
    return int(numel * dtype.itemsize)


def _build_for_real(
    spec: TrainingSpec, meta_error: BaseException, limit: int | None, *, attribute: bool = False
) -> nn.Module:
    """Run the spec's factory for real on the CPU, stopped (UntraceableModelError, naming
    where ``meta_error`` arose) once the tensors it holds pass ``limit`` bytes."""
    mode = _AllocationLimit(0)
    # the limit is shared with the real builds of other threads, whose memory in use is not
    # available to this one but will be again
    mode.limit = default_real_build_limit(mode.others()) if limit is None else limit
    _AllocationLimit.active.add(mode)
    try:
        with mode:
            model: nn.Module = spec.model()  # type: ignore[operator]
    except Exception as e:
        if not mode.refused:  # the factory's own error: the user's bug, said so
            raise _factory_error(e, spec) from e
    except BaseException:
        if not mode.refused:  # the time limit, the caller's interrupt
            raise
    finally:
        _AllocationLimit.active.discard(mode)
    if mode.refused:  # even where the factory caught the refusal and went on
        raise UntraceableModelError(
            _too_large(meta_error, mode.limit, limit is None, attribute)
        ) from meta_error
    return model


def _too_large(meta_error: BaseException, limit: int, default: bool, attribute: bool) -> str:
    """Why a real build was refused, where it failed on meta, and what to change.
    ``attribute``: the meta-built model failed in its dry run (a tensor left on meta),
    rather than its constructor on meta."""
    from costaware._format import fmt_bytes

    if default:
        avail = available_memory()
        bound = f"{fmt_bytes(limit)}, {REAL_BUILD_SHARE:.0%} of the " + (
            f"{fmt_bytes(avail)} this machine has available" if avail else "memory available"
        )
    else:
        bound = f"its limit of {fmt_bytes(limit)}"
    what = (
        "the model built on the meta device failed in its dry run"
        if attribute
        else "the model's constructor failed on the meta device"
    )
    fix = (
        "keep the tensors forward uses as registered buffers or parameters "
        "(self.register_buffer(...)) rather than plain attributes, which stay on meta."
        if attribute
        else "make its constructor work on the meta device: do not read tensor values in "
        "it (float(t), t.item(), t.tolist(), a statistic such as w.std() printed or "
        "checked), compute them from the configuration or in forward; or pass an "
        "nn.Module built on the meta device (`with torch.device('meta'): model = ...`) as "
        "TrainingSpec(model=model)."
    )
    return (
        f"{what} at {_failing_line(meta_error)}: {first_line(meta_error).rstrip('.!')}. "
        f"Building it for real on the CPU instead would hold more than {bound}, so the "
        "build was refused. To "
        f"dry-run it without allocating it, {fix}"
    )


def _to_fake(model: nn.Module, dtype: torch.dtype | None = None, only_real: bool = False) -> None:
    """Swap parameters and buffers for fake CPU tensors; call inside FakeTensorMode.
    With ``dtype``, floating-point ones take that type (``model.to(dtype)``). A lazy
    module's uninitialized ones stay uninitialized, on the meta device, for its first
    forward to shape. ``only_real`` leaves the fake ones as they are (a lazy module shaped
    after the rest became fake)."""

    def type_of(t: torch.Tensor) -> torch.dtype:
        return dtype if dtype is not None and t.is_floating_point() else t.dtype

    done: dict[int, Any] = {}
    for mod in model.modules():
        for k, p in list(mod._parameters.items()):
            if p is None or (only_real and isinstance(p, FakeTensor)):
                continue
            if id(p) not in done:
                if isinstance(p, UninitializedParameter):
                    done[id(p)] = uninitialized_like(p, dtype)
                else:
                    t = torch.empty_strided(p.shape, p.stride(), dtype=type_of(p), device="cpu")
                    done[id(p)] = nn.Parameter(t, requires_grad=p.requires_grad)
            mod._parameters[k] = done[id(p)]
        for k, b in list(mod._buffers.items()):
            if b is None or (only_real and isinstance(b, FakeTensor)):
                continue
            if id(b) not in done:
                if isinstance(b, UninitializedBuffer):
                    done[id(b)] = uninitialized_like(b, dtype)
                else:
                    done[id(b)] = torch.empty_strided(
                        b.shape, b.stride(), dtype=type_of(b), device="cpu"
                    )
            mod._buffers[k] = done[id(b)]


def has_lazy_parameters(model: nn.Module) -> bool:
    """Whether a lazy module (``nn.LazyLinear``, ``nn.LazyConv2d``, ...) of ``model`` has
    parameters or buffers its first forward has yet to shape."""
    return any(
        isinstance(t, (UninitializedParameter, UninitializedBuffer))
        for t in (*model.parameters(), *model.buffers())
    )


def _layer_counts(model: nn.Module) -> dict[str, int]:
    counts = {
        "conv": 0,
        "linear": 0,
        "norm": 0,
        "attention": 0,
        "recurrent": 0,
        "embedding": 0,
        "pool": 0,
    }
    for m in model.modules():
        if isinstance(m, nn.modules.conv._ConvNd):
            counts["conv"] += 1
        elif isinstance(m, nn.Linear):
            counts["linear"] += 1
        elif isinstance(m, (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)):
            counts["norm"] += 1
        elif isinstance(m, nn.MultiheadAttention):
            counts["attention"] += 1
        elif isinstance(m, nn.RNNBase):
            counts["recurrent"] += 1
        elif isinstance(m, nn.Embedding):
            counts["embedding"] += 1
        elif isinstance(m, (nn.modules.pooling._MaxPoolNd, nn.modules.pooling._AvgPoolNd,
                            nn.modules.pooling._AdaptiveAvgPoolNd, nn.modules.pooling._AdaptiveMaxPoolNd)):  # fmt: skip
            counts["pool"] += 1
    return counts
