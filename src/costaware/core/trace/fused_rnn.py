"""Recurrent layers traced as the fused cuDNN kernels a CUDA GPU runs (the "fused" mode).

On a CUDA GPU nn.LSTM / nn.GRU / nn.RNN run as cuDNN kernels: a few per layer and
direction, whatever the sequence length. This CPU build runs an LSTM through oneDNN (one
layer op without a FLOP formula) and unrolls a GRU or RNN into tens of small ops per
time step, which puts thousands of cell ops into the trace. The "fused" dry run traces each layer as
one ``costaware::rnn`` op and its backward as one ``costaware::rnn_backward`` op instead.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from costaware.core.flops import RNN_GATES, register_flop_formula, rnn_backward_formula, rnn_formula
from costaware.core.trace.fused import _FusedMode


def _rnn_reserve_shape(
    mode: str, seq: int, batch: int, hidden: int, directions: int, train: bool
) -> tuple[int, ...]:
    """cuDNN's training reserve space of one layer: the gates and states backward reads."""
    if not train:
        return (0,)
    return (directions, seq, batch, (RNN_GATES[mode] + 2) * hidden)


def _in_clean_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a helper thread and return its result (or raise its error).

    The reference kernels below run torch's own RNN on real tensors; inside a custom op the
    dispatcher has autograd switched off for this thread (and a TorchFunctionMode may be
    active), so the backward's recomputation runs where neither applies.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    finished = threading.Event()

    def run() -> None:
        try:
            target()
        finally:
            finished.set()

    context = contextvars.copy_context()
    worker = threading.Thread(target=context.run, args=(run,), name="costaware-rnn-reference")
    worker.start()
    # waited on in steps, so that the dry run's time limit can stop the waiting thread
    while not finished.wait(0.05):
        pass
    if "error" in box:
        raise box["error"]
    return box["result"]


def _rnn_layer_reference(
    mode: str,
    input: torch.Tensor,
    weights: Sequence[torch.Tensor],
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    bidirectional: bool,
    train: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer through torch's own kernels (``torch._VF``), on real tensors."""
    per = len(weights) // (2 if bidirectional else 1)
    flat = list(weights)
    if mode == "lstm":
        assert cx is not None
        out, hy, cy = torch._VF.lstm(  # type: ignore[attr-defined]
            input, (hx, cx), flat, per == 4, 1, 0.0, train, bidirectional, False
        )
        return out, hy, cy
    out, hy = getattr(torch._VF, mode)(
        input, hx, flat, per == 4, 1, 0.0, train, bidirectional, False
    )
    return out, hy, hx.new_empty(0)


def _check_rnn_args(
    input: torch.Tensor,
    weights: Sequence[torch.Tensor],
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    mode: str,
    bidirectional: bool,
) -> tuple[int, int, int, int, int]:
    """Validate one layer's arguments as cuDNN would; returns (T, B, I, H, directions)."""
    if mode not in RNN_GATES:
        raise ValueError(f"costaware::rnn: unknown mode {mode!r}")
    d = 2 if bidirectional else 1
    if input.dim() != 3 or hx.dim() != 3:
        raise ValueError("costaware::rnn: input must be (T, B, I) and hx (D, B, H)")
    t, b, i = (int(s) for s in input.shape)
    h = int(hx.shape[-1])
    gh = RNN_GATES[mode] * h
    per = len(weights) // d
    if per not in (2, 4) or per * d != len(weights) or tuple(hx.shape) != (d, b, h):
        raise ValueError("costaware::rnn: weights or hidden state do not fit the layer")
    for k in range(d):
        w = weights[k * per : (k + 1) * per]
        if tuple(w[0].shape) != (gh, i) or tuple(w[1].shape) != (gh, h):
            raise ValueError(
                f"costaware::rnn: weights {tuple(w[0].shape)}, {tuple(w[1].shape)} do not fit "
                f"input size {i} and hidden size {h}"
            )
    if (cx is None) != (mode != "lstm"):
        raise ValueError("costaware::rnn: cx is required for an LSTM, and only for it")
    return t, b, i, h, d


@torch.library.custom_op("costaware::rnn", mutates_args=())
def _rnn_op(
    input: torch.Tensor,
    weights: list[torch.Tensor],
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    mode: str,
    bidirectional: bool,
    train: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One recurrent layer, both directions when ``bidirectional``, as one cuDNN call.

    ``input`` is time-major ``(T, B, I)``; ``weights`` are ``w_ih, w_hh[, b_ih, b_hh]`` per
    direction; ``hx`` (and ``cx``, an LSTM's cell state) are ``(D, B, H)``; ``mode`` is
    "lstm", "gru", "rnn_tanh" or "rnn_relu". Returns the output ``(T, B, D*H)``, ``hy``,
    ``cy`` (empty but for an LSTM) and the training reserve space
    (``(D, T, B, (gates+2)*H)``, what cuDNN keeps for the backward; empty when not
    training). On real tensors it runs torch's own kernels (a reference for the tests).
    """
    t, b, _, h, d = _check_rnn_args(input, weights, hx, cx, mode, bidirectional)
    out, hy, cy = _in_clean_thread(
        lambda: _rnn_layer_reference(mode, input, weights, hx, cx, bidirectional, train)
    )
    reserve = input.new_zeros(_rnn_reserve_shape(mode, t, b, h, d, train))
    return out, hy, cy, reserve


@_rnn_op.register_fake
def _rnn_fake(
    input: torch.Tensor,
    weights: list[torch.Tensor],
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    mode: str,
    bidirectional: bool,
    train: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    t, b, _, h, d = _check_rnn_args(input, weights, hx, cx, mode, bidirectional)
    out = input.new_empty((t, b, d * h))
    hy = hx.new_empty(hx.shape)
    cy = cx.new_empty(cx.shape) if cx is not None else hx.new_empty(0)
    return out, hy, cy, input.new_empty(_rnn_reserve_shape(mode, t, b, h, d, train))


@torch.library.custom_op("costaware::rnn_backward", mutates_args=())
def _rnn_backward_op(
    input: torch.Tensor,
    weights: list[torch.Tensor],
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    output: torch.Tensor,
    reserve: torch.Tensor,
    grad_output: torch.Tensor | None,
    grad_hy: torch.Tensor | None,
    grad_cy: torch.Tensor | None,
    mode: str,
    bidirectional: bool,
    need_weights: bool,
) -> list[torch.Tensor]:
    """The backward of :func:`_rnn_op` (cuDNN's backward-data and backward-weights calls).

    Returns ``[grad_input, grad_hx, grad_cx (LSTM only), *grad_weights (if need_weights)]``.
    On real tensors it recomputes the layer with autograd (a reference for the tests).
    """
    _check_rnn_args(input, weights, hx, cx, mode, bidirectional)

    def run() -> list[torch.Tensor]:
        leaves = [t.detach().requires_grad_() for t in (input, hx)]
        if cx is not None:
            leaves.append(cx.detach().requires_grad_())
        ws = [w.detach().requires_grad_() for w in weights]
        with torch.enable_grad():
            c = leaves[2] if cx is not None else None
            outs = _rnn_layer_reference(mode, leaves[0], ws, leaves[1], c, bidirectional, True)
        wrt = leaves + (ws if need_weights else [])
        pairs = [(o, g) for o, g in zip(outs, (grad_output, grad_hy, grad_cy)) if g is not None]
        if not pairs:
            return [torch.zeros_like(x) for x in wrt]
        grads = torch.autograd.grad(
            [o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True
        )
        return [g if g is not None else torch.zeros_like(x) for g, x in zip(grads, wrt)]

    result: list[torch.Tensor] = _in_clean_thread(run)
    return result


@_rnn_backward_op.register_fake
def _rnn_backward_fake(
    input: torch.Tensor,
    weights: list[torch.Tensor],
    hx: torch.Tensor,
    cx: torch.Tensor | None,
    output: torch.Tensor,
    reserve: torch.Tensor,
    grad_output: torch.Tensor | None,
    grad_hy: torch.Tensor | None,
    grad_cy: torch.Tensor | None,
    mode: str,
    bidirectional: bool,
    need_weights: bool,
) -> list[torch.Tensor]:
    _check_rnn_args(input, weights, hx, cx, mode, bidirectional)
    grads = [input.new_empty(input.shape), hx.new_empty(hx.shape)]
    if cx is not None:
        grads.append(cx.new_empty(cx.shape))
    if need_weights:
        grads += [w.new_empty(w.shape) for w in weights]
    return grads


def _rnn_setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    input, weights, hx, cx, mode, bidirectional, _train = inputs
    out, _hy, _cy, reserve = output
    ctx.mode, ctx.bidirectional = mode, bidirectional
    ctx.has_cx = cx is not None
    ctx.need_weights = any(w.requires_grad for w in weights)
    ctx.n_weights = len(weights)
    # what cuDNN's backward reads: input, states, output and the reserve space (the
    # weights are parameters, or their autocast copies, kept alive for the backward)
    ctx.save_for_backward(input, hx, cx, out, reserve, *weights)
    ctx.mark_non_differentiable(reserve)
    ctx.set_materialize_grads(False)  # no zero gradients for unused outputs


def _rnn_backward(
    ctx: Any,
    grad_output: torch.Tensor | None,
    grad_hy: torch.Tensor | None,
    grad_cy: torch.Tensor | None,
    _grad_reserve: torch.Tensor | None,
) -> tuple[Any, ...]:
    input, hx, cx, out, reserve, *weights = ctx.saved_tensors
    grads = torch.ops.costaware.rnn_backward(
        input, weights, hx, cx, out, reserve, grad_output, grad_hy,
        grad_cy if ctx.has_cx else None, ctx.mode, ctx.bidirectional, ctx.need_weights,
    )  # fmt: skip
    n = 3 if ctx.has_cx else 2
    grad_cx = grads[2] if ctx.has_cx else None
    grad_w = list(grads[n:]) if ctx.need_weights else None
    return grads[0], grad_w, grads[1], grad_cx, None, None, None


_rnn_op.register_autograd(_rnn_backward, setup_context=_rnn_setup_context)
register_flop_formula(torch.ops.costaware.rnn, rnn_formula)
register_flop_formula(torch.ops.costaware.rnn_backward, rnn_backward_formula)

_RNN_VF = tuple(RNN_GATES)  # the torch._VF functions nn.LSTM / nn.GRU / nn.RNN call


def _rnn_weights_fit(
    mode: str, input_size: int, hidden: int, params: Sequence[Any], directions: int, per: int
) -> bool:
    """Whether every layer's ``w_ih`` and ``w_hh`` have the shapes a cuDNN layer takes."""
    gh = RNN_GATES[mode] * hidden
    for k in range(0, len(params), per):
        i = input_size if k < directions * per else directions * hidden
        w_ih, w_hh = params[k], params[k + 1]
        if not isinstance(w_ih, torch.Tensor) or not isinstance(w_hh, torch.Tensor):
            return False
        if tuple(w_ih.shape) != (gh, i) or tuple(w_hh.shape) != (gh, hidden):
            return False
    return True


class _FusedRNN(_FusedMode):
    """Routes ``torch._VF.lstm`` / ``gru`` / ``rnn_tanh`` / ``rnn_relu`` to fused layers.

    Each call (one ``nn.LSTM``, ``nn.GRU`` or ``nn.RNN`` forward) runs layer by layer as
    :func:`_rnn_op`, both directions of a layer in one op, with the inter-layer dropout as
    a dropout op and ``batch_first`` as a transpose (a view). Under autocast the input,
    states and weights are cast to the autocast dtype first, as CUDA's autocast casts them
    for cuDNN (it takes fp16 whatever the autocast dtype; the sizes are the same), and the
    weights' copies live until the backward. Packed sequences and LSTMs with projections
    (``proj_size``) run natively and are counted in ``fallbacks``; ``fused`` counts the
    calls routed, ``layers`` the layer kernels they became.
    """

    def __init__(self) -> None:
        super().__init__()
        self.layers = 0

    def trace_note(self) -> str | None:
        return self.note(
            f"recurrent layers traced as fused cuDNN kernels, as a CUDA GPU runs them "
            f"({self.fused} RNN calls per step, {self.layers} layer kernels; "
            "no per-timestep cells)",
            "ran natively",
        )

    def __torch_function__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", None)
        if name in _RNN_VF and func == getattr(torch._VF, name):
            out = self._fused(name, args, kwargs)
            if out is not None:
                self.fused += 1
                return out
        return func(*args, **kwargs)

    def _fused(self, mode: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        why = None
        if kwargs or len(args) != 9 or not isinstance(args[3], bool):
            why = "packed sequence"  # (data, batch_sizes, hx, params, ...)
        else:
            x, hx, params, has_biases, layers, dropout, train, bidirectional, batch_first = args
            h0, c0 = (hx[0], hx[1]) if mode == "lstm" else (hx, None)
            d = 2 if bidirectional else 1
            per = 4 if has_biases else 2
            if not isinstance(x, torch.Tensor) or x.dim() != 3 or not x.is_floating_point():
                why = "input not a 3-D floating tensor"
            elif len(params) != layers * d * per or params[1].shape[-1] != h0.shape[-1]:
                why = "projections (proj_size)"
            elif not _rnn_weights_fit(mode, int(x.shape[-1]), int(h0.shape[-1]), params, d, per):
                why = "weight shapes"
        if why is None:
            # the shapes are checked above: an error here comes before any layer ran
            try:
                return self._layers(
                    mode, x, h0, c0, list(params), layers, dropout, train, bidirectional,
                    batch_first,
                )  # fmt: skip
            except (RuntimeError, TypeError, ValueError) as e:
                why = f"{type(e).__name__}: {str(e)[:80]}"
        self.fallbacks[why] += 1
        return None

    def _layers(
        self,
        mode: str,
        x: torch.Tensor,
        h0: torch.Tensor,
        c0: torch.Tensor | None,
        params: list[torch.Tensor],
        layers: int,
        dropout: float,
        train: bool,
        bidirectional: bool,
        batch_first: bool,
    ) -> Any:
        dev = x.device.type
        if torch.is_autocast_enabled(dev):
            dt = torch.get_autocast_dtype(dev)

            def cast(t: torch.Tensor) -> torch.Tensor:
                return t if t.dtype == dt or not t.is_floating_point() else t.to(dt)

            x, h0, params = cast(x), cast(h0), [cast(p) for p in params]
            c0 = cast(c0) if c0 is not None else None
        if batch_first:
            x = x.transpose(0, 1)
        d = 2 if bidirectional else 1
        per = len(params) // (layers * d)
        hs: list[torch.Tensor] = []
        cs: list[torch.Tensor] = []
        for layer in range(layers):
            if layer and dropout > 0 and train:
                x = torch.nn.functional.dropout(x, dropout, True)
            w = params[layer * d * per : (layer + 1) * d * per]
            h = h0[layer * d : (layer + 1) * d]
            c = c0[layer * d : (layer + 1) * d] if c0 is not None else None
            x, hy, cy, _ = torch.ops.costaware.rnn(x, w, h, c, mode, bidirectional, train)
            self.layers += 1
            hs.append(hy)
            cs.append(cy)
        out = x.transpose(0, 1) if batch_first else x
        h_n = torch.cat(hs) if layers > 1 else hs[0]
        if mode != "lstm":
            return out, h_n
        return out, h_n, torch.cat(cs) if layers > 1 else cs[0]
