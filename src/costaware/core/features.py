"""Features for the cost model: NSM, hyperparameters, analytic figures, device specs.

Everything here is a pure function of a :class:`~costaware.core.trace.Trace`, a
:class:`~costaware.spec.TrainingSpec` and a :class:`~costaware.devices.Device`, returning
``dict[str, float]``. The names are stable and versioned (:data:`FEATURE_VERSION`): a model
trained on one version refuses features of another.

- **NSM** (node-sequence matrix, DNNAbacus): counts of operator pairs along the graph's
  edges, over a fixed vocabulary of operator *groups* (:data:`OP_GROUPS`; unknown ops go
  to ``"other"``), for the forward and backward ops only. Optimizer ops would dominate
  the pair counts, so the optimizer is a hyperparameter instead.
- **Structure-independent** (DNNAbacus): batch size, input size, channels, learning rate,
  epochs, optimizer, layer counts, FLOPs, parameters.
- **Analytic**: the dry-run live peak and its breakdown, the simulated allocator reserved
  peak, the roofline time on the target device.
- **Device**: memory, bandwidth, peak FLOP/s per precision, SMs.
- **Op-level time**: ``optime_*``, the per-kernel times of :mod:`costaware.core.optime`
  summed over the trace (added by ``model.features_for`` when the model has an op model;
  NaN for a device of another kind than the op model's).

What each feature version changed is in ``docs/features.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from costaware.core.analytic import calls_cublas
from costaware.core.flops import PROJECT_FORMULAS
from costaware.core.trace import CATEGORIES, Trace
from costaware.devices import Device
from costaware.spec import OPTIMIZERS, PRECISIONS, TrainingSpec

__all__ = [
    "FEATURE_VERSION",
    "NSM_GROUPS",
    "OP_GROUPS",
    "hyperparameter_features",
    "nsm_features",
    "op_group",
    "trace_features",
]

#: Bump when feature names or meanings change; saved models record it. 22 counts FLOPs by
#: the project's formulas (:data:`costaware.core.flops.PROJECT_FORMULAS` on), 21 by torch's
#: (off, as the shipped model is fitted). ``docs/features.md`` lists what each version changed.
FEATURE_VERSION = "22" if PROJECT_FORMULAS else "21"

#: aten op name -> group. The vocabulary is fixed and versioned with FEATURE_VERSION.
OP_GROUPS: dict[str, str] = {}
_GROUP_MEMBERS: dict[str, Iterable[str]] = {
    "conv": ("convolution", "_convolution", "cudnn_convolution", "mkldnn_convolution",
             "_slow_conv2d_forward", "convolution_overrideable"),
    "conv_bwd": ("convolution_backward", "_slow_conv2d_backward", "convolution_backward_overrideable"),
    "matmul": ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm", "addbmm"),
    "attention": ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                  "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"),
    "attention_bwd": ("_scaled_dot_product_flash_attention_for_cpu_backward",
                      "_scaled_dot_product_flash_attention_backward",
                      "_scaled_dot_product_efficient_attention_backward",
                      "_scaled_dot_product_cudnn_attention_backward"),
    "batch_norm": ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                   "cudnn_batch_norm", "_native_batch_norm_legit_no_training", "batch_norm"),
    "batch_norm_bwd": ("native_batch_norm_backward", "cudnn_batch_norm_backward"),
    "layer_norm": ("native_layer_norm", "native_group_norm", "_fused_rms_norm", "rms_norm"),
    "layer_norm_bwd": ("native_layer_norm_backward", "native_group_norm_backward", "_fused_rms_norm_backward",
                       "rms_norm_backward"),
    "activation": ("relu", "relu_", "gelu", "silu", "sigmoid", "tanh", "hardtanh", "hardswish", "hardsigmoid",
                   "leaky_relu", "elu", "mish", "softplus", "clamp", "clamp_min", "hardtanh_", "silu_",
                   "hardswish_", "leaky_relu_", "elu_"),
    "activation_bwd": ("threshold_backward", "gelu_backward", "silu_backward", "sigmoid_backward",
                       "tanh_backward", "hardtanh_backward", "hardswish_backward", "hardsigmoid_backward",
                       "leaky_relu_backward", "elu_backward", "mish_backward", "softplus_backward"),
    "softmax": ("_softmax", "_log_softmax", "softmax", "log_softmax", "_safe_softmax"),
    "softmax_bwd": ("_softmax_backward_data", "_log_softmax_backward_data"),
    "loss": ("nll_loss_forward", "nll_loss2d_forward", "nll_loss_nd", "mse_loss", "binary_cross_entropy",
             "binary_cross_entropy_with_logits"),
    "loss_bwd": ("nll_loss_backward", "nll_loss2d_backward", "mse_loss_backward", "binary_cross_entropy_backward"),
    "pool": ("max_pool2d_with_indices", "avg_pool2d", "_adaptive_avg_pool2d", "adaptive_max_pool2d",
             "max_pool3d_with_indices", "avg_pool3d", "_adaptive_avg_pool3d", "max_pool1d", "avg_pool1d"),
    "pool_bwd": ("max_pool2d_with_indices_backward", "avg_pool2d_backward", "_adaptive_avg_pool2d_backward",
                 "adaptive_max_pool2d_backward", "max_pool3d_with_indices_backward", "avg_pool3d_backward",
                 "_adaptive_avg_pool3d_backward"),
    "embedding": ("embedding", "index_select", "gather", "index"),
    "embedding_bwd": ("embedding_backward", "embedding_dense_backward", "index_add_", "index_put_",
                      "scatter_add", "scatter_add_", "index_put", "_index_put_impl_"),
    "dropout": ("native_dropout", "bernoulli_", "bernoulli", "native_dropout_backward"),
    "add": ("add", "add_", "sub", "sub_", "rsub", "addcmul", "addcmul_", "addcdiv", "addcdiv_", "lerp_"),
    "mul": ("mul", "mul_", "div", "div_", "neg", "reciprocal", "pow", "sqrt", "rsqrt", "exp", "log", "abs",
            "sign", "where", "masked_fill", "masked_fill_", "maximum", "minimum", "fill_", "zero_", "copy_"),
    "reduce": ("sum", "mean", "amax", "max", "min", "var_mean", "var", "std", "norm", "linalg_vector_norm",
               "cumsum", "argmax", "topk", "sort", "logsumexp"),
    "shape": ("view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "squeeze", "unsqueeze",
              "slice", "select", "split", "split_with_sizes", "chunk", "unbind", "as_strided", "flatten",
              "narrow", "_reshape_alias", "view_as", "unflatten", "diagonal", "unfold", "squeeze_", "unsqueeze_"),
    "copy": ("clone", "contiguous", "_to_copy", "cat", "stack", "constant_pad_nd", "repeat", "new_zeros",
             "new_empty", "new_empty_strided", "empty", "empty_like", "zeros", "zeros_like", "ones_like",
             "full", "full_like", "empty_strided", "ones", "arange", "tril", "triu", "roll", "flip",
             "channel_shuffle", "pixel_shuffle", "upsample_nearest2d", "upsample_bilinear2d"),
    "copy_bwd": ("upsample_nearest2d_backward", "upsample_bilinear2d_backward", "slice_backward",
                 "select_backward", "as_strided_scatter", "slice_scatter", "select_scatter"),
    "rnn": ("_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm", "gru", "mkldnn_rnn_layer",
            "_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_gru_cell_backward", "mkldnn_rnn_layer_backward",
            "rnn", "rnn_backward"),  # the last two: costaware::rnn, a fused (cuDNN) layer
}  # fmt: skip
for _group, _members in _GROUP_MEMBERS.items():
    for _m in _members:
        OP_GROUPS[_m] = _group
#: The NSM vocabulary, in feature order ("other" collects every unknown op).
NSM_GROUPS: tuple[str, ...] = (*_GROUP_MEMBERS, "other")
_GROUP_INDEX = {g: i for i, g in enumerate(NSM_GROUPS)}


def op_group(op: str) -> str:
    """The NSM group of an aten op name (``"other"`` when it is not in the vocabulary)."""
    return OP_GROUPS.get(op, "other")


def nsm_features(trace: Trace) -> dict[str, float]:
    """Operator-pair counts along the forward/backward edges, as ``nsm:src>dst`` features.

    Pairs are normalised by the number of such edges (so the shape of the network, not
    its depth, is encoded); the raw edge count is a separate feature. Only pairs that
    occur are returned: absent names mean zero.
    """
    g = trace.graph
    n = len(NSM_GROUPS)
    counts = np.zeros((n, n), dtype=np.float64)
    index = [_GROUP_INDEX[op_group(g.nodes[i]["op"])] for i in range(g.number_of_nodes())]
    fb = [g.nodes[i]["phase"] in ("forward", "backward") for i in range(g.number_of_nodes())]
    total = 0
    for u, v in g.edges():
        if fb[u] and fb[v]:
            counts[index[u], index[v]] += 1
            total += 1
    feats: dict[str, float] = {"nsm_edges": float(total)}
    if total:
        rows, cols = np.nonzero(counts)
        for r, c in zip(rows.tolist(), cols.tolist()):
            feats[f"nsm:{NSM_GROUPS[r]}>{NSM_GROUPS[c]}"] = counts[r, c] / total
    group_counts = np.bincount([i for i, keep in zip(index, fb) if keep], minlength=n)
    for i, name in enumerate(NSM_GROUPS):
        feats[f"ops:{name}"] = float(group_counts[i])
    return feats


def nsm_feature_names() -> list[str]:
    """Every NSM feature name, in a fixed order."""
    names = ["nsm_edges"]
    names += [f"nsm:{a}>{b}" for a in NSM_GROUPS for b in NSM_GROUPS]
    names += [f"ops:{g}" for g in NSM_GROUPS]
    return names


def hyperparameter_features(spec: TrainingSpec) -> dict[str, float]:
    """The DNNAbacus structure-independent features that come from the spec alone."""
    b = spec.batch_spec.describe()
    feats = {
        "batch_size": float(spec.batch_size),
        "log_batch_size": math.log2(spec.batch_size),
        "learning_rate": spec.learning_rate,
        # no epoch limit (None) counts as the corpus's trials, which are one epoch long
        "epochs": float(spec.epochs or 1),
        "grad_accumulation": float(spec.grad_accumulation),
        "optimizer_states": spec.optimizer_state_per_param,
        "cudnn_benchmark": float(spec.cudnn_benchmark),
        "expandable_segments": float(spec.allocator == "expandable_segments"),
        **{f"batch_{k}": v for k, v in b.items()},
    }
    for name in OPTIMIZERS:
        feats[f"optimizer_is_{name}"] = float(spec.optimizer_name == name)
    # a pure precision (bf16-true, ...) is learned as fp32 is, a step without autocast: its
    # parameters' type shows in the trace's bytes and the analytic figures
    learned_as = spec.precision if spec.precision in PRECISIONS else "fp32"
    for p in PRECISIONS:
        feats[f"precision_is_{p}"] = float(learned_as == p)
    return feats


def trace_features(trace: Trace) -> dict[str, float]:
    """Batch-dependent figures of the dry run (memory by category, FLOPs, bytes, counts)."""
    mib = float(2**20)
    feats = {
        "live_peak_mib": trace.peak_live / mib,
        "params_m": trace.param_count / 1e6,
        "param_tensors": float(trace.param_tensors),
        "param_mib": trace.param_bytes / mib,
        "gradient_mib": trace.gradient_bytes / mib,
        "optimizer_state_mib": trace.optimizer_state_bytes / mib,
        "gflops": trace.flops / 1e9,
        "gflops_forward": trace.flops_forward / 1e9,
        "gbytes_moved": trace.bytes_moved / 1e9,
        "arithmetic_intensity": trace.flops / max(trace.bytes_moved, 1.0),
        "kernels": float(np.count_nonzero(trace.node_class < 3)),
        "graph_nodes": float(trace.graph.number_of_nodes()),
        # whether a GPU step allocates cuBLAS's workspace (see costaware.core.analytic)
        "calls_cublas": float(calls_cublas(trace)),
    }
    for cat in CATEGORIES:
        feats[f"peak_{cat}_mib"] = trace.peak_breakdown.get(cat, 0) / mib
        feats[f"peak_{cat}_frac"] = trace.peak_breakdown.get(cat, 0) / max(trace.peak_live, 1)
    for phase, v in trace.phase_peaks.items():
        feats[f"phase_peak_{phase}_mib"] = v / mib
    for kind, v in trace.layer_counts.items():
        feats[f"layers_{kind}"] = float(v)
    return feats


def device_features(device: Device) -> dict[str, float]:
    return {f"device_{k}": float(v) for k, v in device.features().items()}
