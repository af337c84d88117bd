"""The dispatch mode that records a step: every aten op (its FLOPs, bytes moved and place
in the operator graph) and every storage's allocation and release, each storage with its
phase and memory category.

It sits inside ``FakeTensorMode``, so it sees each op's fake outputs; it checks the
batch's labels and token ids against the size of what they index (a fake kernel cannot
see values), and adds the work spaces of :mod:`~costaware.core.trace.transients`.
"""

from __future__ import annotations

import importlib
import weakref
from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from costaware.core.flops import VIEW, count_flops, op_class
from costaware.core.trace.result import _round
from costaware.core.trace.transients import (
    _conv_transient,
    _cpu_conv_transient,
    _cpu_rnn_transient,
    _cudnn_rnn_transient,
    _onednn_lstm_workspace,
)
from costaware.errors import SpecError

#: ops whose one argument indexes a dimension of another: op -> (index argument, indexed
#: argument, what is indexed). A real kernel fails on an index past the end; a fake one
#: cannot see values, so the dry run checks the batch's known range against the size.
_INDEXING_OPS = {
    "embedding": (1, 0, "an embedding of {n} rows"),
    "nll_loss_forward": (1, 0, "a cross-entropy over {n} classes"),
    "nll_loss2d_forward": (1, 0, "a cross-entropy over {n} classes"),
}
# Ops that carry no data dependence worth a graph node (about 65% of a raw trace).
_NOISE = frozenset(
    {
        "detach",
        "alias",
        "lift_fresh",
        "lift_fresh_copy",
        "_local_scalar_dense",
        "is_same_size",
        "_to_copy_noop",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
    }
)
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float64: 3}


_BINCOUNT = torch.ops.aten.bincount.default
#: a tensor's value read into Python (``.item()``, ``float(t)``, ``bool(t)``)
_SCALAR = torch.ops.aten._local_scalar_dense.default


_GROUPED_MM: Any = getattr(getattr(torch.ops.aten, "_grouped_mm", None), "default", None)
#: how the meta kernel shapes grouped_mm's output (and checks the batch sizes); None in a
#: torch without it, whose meta kernel is left as it is
_GROUPED_MM_OUT: Any = getattr(
    importlib.import_module("torch._meta_registrations"), "_create_grouped_mm_output_tensor", None
)


def _grouped_mm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``grouped_mm``'s output where the meta kernel refuses a dtype the real one takes:
    the meta kernel checks one GPU kernel's list (bf16 alone), while the CPU kernel takes
    fp32 and fp16 too (Hugging Face's mixture-of-experts layers run it in fp32). Shaped as
    the meta kernel shapes it; None where the inputs are not such a case."""
    given = dict(zip(("self", "mat2", "offs", "bias", "out_dtype"), args, strict=False))
    given.update(kwargs)
    a, b, offs = given.get("self"), given.get("mat2"), given.get("offs")
    if not (
        _GROUPED_MM_OUT is not None
        and isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.dtype == b.dtype
        and a.dtype in (torch.float32, torch.float16)
        and given.get("out_dtype") in (None, a.dtype)
        and given.get("bias") is None
        and a.dim() in (2, 3)
        and b.dim() in (2, 3)
        and (a.dim() == b.dim() == 2 or a.size(-1) == b.size(-2))
        and (offs is not None) == (a.dim() == 2 or b.dim() == 2)
    ):
        return None
    return _GROUPED_MM_OUT(a, b, offs, a.dtype)


def _run(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)``, but ``bincount`` with a ``minlength``, whose size depends
    on the values, takes ``minlength`` bins, as it does for values below it: how a count
    of classes (a class-weighted loss, a confusion matrix) is written; and ``grouped_mm``
    in the dtypes its real kernel takes (:func:`_grouped_mm`)."""
    if func is _GROUPED_MM and (out := _grouped_mm(args, kwargs)) is not None:
        return out
    if func is _BINCOUNT:  # looked up once: this runs for every op of the step
        x = args[0]
        weights = args[1] if len(args) > 1 else kwargs.get("weights")
        minlength = args[2] if len(args) > 2 else kwargs.get("minlength", 0)
        if isinstance(minlength, int) and minlength > 0:
            dtype = (
                torch.int64
                if weights is None
                else (torch.float32 if weights.dtype == torch.float32 else torch.float64)
            )
            return torch.zeros(minlength, dtype=dtype, device=x.device)
    return func(*args, **kwargs)


def _fresh_outputs(func: Any, out: Any) -> Any:
    """Give each output of ``func`` its own storage where its schema promises one.

    Some fake (meta) kernels return one tensor twice where the real kernel returns two:
    ``mkldnn_rnn_layer_backward``'s meta returns its bias gradient as both ``grad_b_ih``
    and ``grad_b_hh``. Autograd then sees a gradient it does not own, and copies it
    before accumulating (a ``new_empty_strided`` + ``copy_`` the real step does not run),
    but only when the op missed FakeTensorMode's process-wide cache, which rebuilds each
    output separately on a hit. So the trace depended on what the process had traced
    before. An output whose schema return carries no alias annotation is fresh in the real
    kernel, and gets a fresh storage here too.
    """
    if not isinstance(out, tuple) or len(out) < 2 or func.is_view:
        return out
    returns = func._schema.returns
    seen: set[int] = set()
    fixed: list[Any] = []
    for i, t in enumerate(out):
        if isinstance(t, torch.Tensor) and i < len(returns) and returns[i].alias_info is None:
            sid = id(t.untyped_storage())
            if sid in seen:
                t = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            seen.add(sid)
        fixed.append(t)
    return tuple(fixed)


class _Recorder(TorchDispatchMode):
    """Records ops and storage lifetimes. Sits inside FakeTensorMode (sees ops first)."""

    def __init__(self, cpu: bool = False) -> None:
        super().__init__()
        #: the step is traced as a CPU runs it (the buffers of its convolutions and LSTM
        #: layers, not cuDNN's)
        self.cpu = cpu
        #: the code objects of the step's own code (the loss function, a LightningModule's
        #: training_step) whose reads of a tensor's value are answered (:meth:`_read_by_step`)
        self.step_code: frozenset[Any] = frozenset()
        #: "file:line" of each value the step's own code read, answered 0 (False)
        self.value_reads: list[str] = []
        self.phase = "setup"
        self.step = 0
        self.record_graph = False
        self.closed = False
        self.paused = False
        self._keys: dict[int, int] = {}
        self._next_key = 0
        self.ev_key: list[int] = []
        self.ev_size: list[int] = []
        self.key_phase: dict[int, str] = {}
        self.key_category: dict[int, str] = {}
        self.phase_marks: list[tuple[int, str]] = []
        self._writer: dict[int, int] = {}
        self.nodes: list[tuple[str, str, int, int, int, float, float, int]] = []
        self.edges: list[tuple[int, int]] = []
        self.flops: dict[str, float] = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        self.bytes_moved = 0.0
        self.unsupported: Counter[str] = Counter()
        self.transients: list[tuple[int, int, int]] = []
        #: storage key -> (the exclusive bound of its values, the batch field it is, the
        #: batch argument that would make it fit, with ``{n}`` for the size it indexes)
        self.bounded: dict[int, tuple[int, str, str]] = {}

    # storages ----------------------------------------------------------------------------
    def _free(self, sid: int, key: int) -> None:
        self._keys.pop(sid, None)
        if self.closed:
            return
        self.ev_key.append(key)
        self.ev_size.append(-1)

    def key_of(self, t: torch.Tensor, category: str | None = None) -> int | None:
        st = t.untyped_storage()
        sid = id(st)
        key = self._keys.get(sid)
        if key is None:
            n = int(st.nbytes())
            if n <= 0:
                return None
            key = self._next_key
            self._next_key += 1
            self._keys[sid] = key
            weakref.finalize(st, self._free, sid, key)
            self.ev_key.append(key)
            self.ev_size.append(n)
            self.key_phase[key] = self.phase
        if category is not None:
            self.key_category[key] = category
        return key

    def bound(self, t: torch.Tensor, limit: int, field: str, fix: str) -> None:
        """Note that ``t`` holds values drawn from ``[0, limit)`` (a batch's labels or token
        ids): an op that indexes a smaller dimension with it fails on a real device."""
        key = self.key_of(t)
        if key is not None:
            self.bounded[key] = (limit, field, fix)

    def _check_index_range(self, name: str, args: tuple[Any, ...]) -> None:
        index_at, indexed_at, what = _INDEXING_OPS[name]
        if len(args) <= max(index_at, indexed_at):
            return
        index, indexed = args[index_at], args[indexed_at]
        if not isinstance(index, torch.Tensor) or not isinstance(indexed, torch.Tensor):
            return
        found = self.bounded.get(self._keys.get(id(index.untyped_storage()), -1))
        if found is None or indexed.dim() == 0:
            return
        limit, field, fix = found
        n = int(indexed.shape[0] if name == "embedding" or indexed.dim() == 1 else indexed.shape[1])
        if n < limit:
            raise SpecError(
                f"the batch's {field} are drawn from 0 to {limit - 1}, but the model feeds them "
                f"to {what.format(n=n)}: a real training step would fail with an index out of "
                f"range. Make the batch fit the model: {fix.format(n=n)}."
            )

    def label(self, tensors: Any, category: str) -> int:
        total = 0
        for t in tree_flatten(tensors)[0]:
            if isinstance(t, torch.Tensor):
                k = self.key_of(t, category)
                if k is not None:
                    total += _round(int(t.untyped_storage().nbytes()))
        return total

    def mark(self, phase: str) -> None:
        self.phase = phase
        self.phase_marks.append((len(self.ev_key), phase))

    # dispatch ---------------------------------------------------------------------------
    def _transient(self, name: str, args: tuple[Any, ...], out: Any) -> tuple[int, int]:
        """Bytes op ``name`` allocates and frees again inside itself on this trace's device,
        beyond the tensors it returns, and how many of them do not grow with the batch (see
        :attr:`Trace.transients`)."""
        if name in ("convolution", "convolution_backward"):
            backward = name == "convolution_backward"
            if self.phase != ("backward" if backward else "forward"):
                return 0, 0
            if self.cpu:
                return _cpu_conv_transient(args, backward, args[0] if backward else out), 0
            return (_conv_transient(args) if backward else 0), 0
        if self.cpu and name in ("mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"):
            return _cpu_rnn_transient(args, name.endswith("backward")), 0
        if not self.cpu and name == "rnn_backward" and self.phase == "backward":
            return _cudnn_rnn_transient(args)
        return 0, 0

    def _read_by_step(self) -> str | None:
        """Where the step's own code (:attr:`step_code`) read a tensor's value, as
        "file:line", when the innermost frame that is not torch's or costaware's is that
        code; else None. A logged ``loss.item()`` or an ``if torch.isnan(loss)`` guard in
        the loss or ``training_step`` reads a value the dry run's tensors do not have but
        moves no memory: the read is answered 0 (False) and noted. A read deeper down (the
        model's forward) still fails, as a limit of the dry run: a value there can decide
        what the step allocates."""
        import sys

        from costaware.core.trace.user_code import _OWN_DIRS, _TORCH_DIR

        frame = sys._getframe(1)
        while frame is not None:
            path = frame.f_code.co_filename
            if not path.startswith((_TORCH_DIR, *_OWN_DIRS)):
                if frame.f_code in self.step_code:
                    return f"{path}:{frame.f_lineno}"
                return None
            frame = frame.f_back  # type: ignore[assignment]
        return None

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is _SCALAR and self.step_code and (where := self._read_by_step()) is not None:
            self.value_reads.append(where)
            return False if args[0].dtype is torch.bool else 0
        out = _fresh_outputs(func, _run(func, args, kwargs))
        if self.paused:
            return out
        name = func._overloadpacket.__name__
        if self.bounded and name in _INDEXING_OPS:
            self._check_index_range(name, args)
        if self.cpu and name == "mkldnn_rnn_layer":
            out = _onednn_lstm_workspace(args, out)
        if name in _NOISE or func.namespace == "prim":
            return out
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        out_keys = [self.key_of(t) for t in outs]
        if not self.closed:
            block, fixed = self._transient(name, args, out)
            if block:
                self.transients.append((len(self.ev_key), block, fixed))
        if self.phase in ("forward", "backward", "optimizer"):
            flops: float = 0.0
            try:
                flops = float(count_flops(func, args, kwargs, out))
            except Exception:  # a formula that does not fit these args: count, never fail
                self.unsupported[name] += 1
            self.flops[self.phase] += flops
            ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            is_view = bool(func.is_view)
            nbytes = 0.0
            if not is_view:
                nbytes = float(
                    sum(t.numel() * t.element_size() for t in ins)
                    + sum(t.numel() * t.element_size() for t in outs)
                )
            self.bytes_moved += nbytes
            if self.record_graph:
                idx = len(self.nodes)
                dtype = outs[0].dtype if outs else (ins[0].dtype if ins else torch.float32)
                cls = VIEW if is_view else op_class(name)
                serial = 1
                if func.namespace == "costaware" and name in ("rnn", "rnn_backward"):
                    serial = int(args[0].shape[0])  # the time-major input (T, B, I)
                dcode = _DTYPE_CODES.get(dtype, 4)
                self.nodes.append((name, self.phase, cls, dcode, len(outs), flops, nbytes, serial))
                for t in ins:
                    st = t.untyped_storage()
                    k = self._keys.get(id(st))
                    w = self._writer.get(k) if k is not None else None
                    if w is not None and w != idx:
                        self.edges.append((w, idx))
                for k in out_keys:
                    if k is not None:
                        self._writer[k] = idx
        return out
