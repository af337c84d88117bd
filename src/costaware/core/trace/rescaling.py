"""A trace at another batch size, without running the model again: the storages and
FLOPs that grow with the batch scaled, or interpolated between two traces of one
architecture.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from costaware.core.trace.result import Trace, _memory_profile


def _scaled_transients(transients: np.ndarray, ratio: float) -> np.ndarray:
    """Transient block sizes at ``ratio`` times the batch: the part that grows with the
    batch (a convolution's input and output gradient, a recurrent layer's input and
    gates) scaled, the fixed part (a work space's floor, weight-sized buffers) kept."""
    nbytes, fixed = transients[:, 1].astype(np.float64), transients[:, 2].astype(np.float64)
    out: np.ndarray = fixed + (nbytes - fixed) * ratio
    return out


def rescale(trace: Trace, batch_size: int, other: Trace | None = None) -> Trace:
    """This trace's figures at another batch size, without running the model again.

    With ``other`` (a trace of the same architecture at a different batch size, with the
    same op sequence) every storage size, FLOP and byte count is interpolated linearly
    between the two, which is exact for sizes affine in the batch size. Without it,
    storages that grow with the batch (:attr:`Trace.event_scales`) and forward/backward
    FLOPs and bytes scale in proportion; parameters, gradients and optimizer state stay.
    """
    b0 = trace.batch_size
    if batch_size == b0:
        return trace
    sizes = trace.events[:, 1].astype(np.float64)
    alloc = sizes > 0
    fb = trace.node_phase <= 1
    if other is not None and other.op_signature == trace.op_signature and other.batch_size != b0:
        w = (batch_size - b0) / (other.batch_size - b0)
        new_sizes = sizes + w * (other.events[:, 1] - sizes)
        node_flops = trace.node_flops + w * (other.node_flops - trace.node_flops)
        node_bytes = trace.node_bytes + w * (other.node_bytes - trace.node_bytes)
        lin = {
            name: getattr(trace, name) + w * (getattr(other, name) - getattr(trace, name))
            for name in ("flops_forward", "flops_backward", "flops_optimizer", "bytes_moved")
        }
        transient = trace.transients[:, 1].astype(np.float64)
        if other.transients.shape == trace.transients.shape:
            transient = transient + w * (other.transients[:, 1] - transient)
        else:
            transient = _scaled_transients(trace.transients, batch_size / b0)
    else:
        r = batch_size / b0
        new_sizes = np.where(trace.event_scales, sizes * r, sizes)
        node_flops = np.where(fb, trace.node_flops * r, trace.node_flops)
        node_bytes = np.where(fb, trace.node_bytes * r, trace.node_bytes)
        fb_bytes = float(trace.node_bytes[fb].sum())
        lin = {
            "flops_forward": trace.flops_forward * r,
            "flops_backward": trace.flops_backward * r,
            "flops_optimizer": trace.flops_optimizer,
            "bytes_moved": trace.bytes_moved + fb_bytes * (r - 1.0),
        }
        transient = _scaled_transients(trace.transients, r)
    new_sizes = np.where(alloc, np.maximum(np.rint(new_sizes), 1), -1).astype(np.int64)
    events = np.stack([trace.events[:, 0], new_sizes], axis=1)
    blocks = np.maximum(np.rint(transient), 1).astype(np.int64)
    transients = np.stack(
        [trace.transients[:, 0], blocks, np.minimum(trace.transients[:, 2], blocks)], axis=1
    )
    timeline, peak_live, breakdown, phase_peaks = _memory_profile(
        events, trace.event_category, trace.marks
    )
    return dataclasses.replace(
        trace,
        batch_size=batch_size,
        events=events,
        timeline=timeline,
        peak_live=peak_live,
        peak_breakdown=breakdown,
        phase_peaks=phase_peaks,
        node_flops=node_flops,
        node_bytes=node_bytes,
        input_bytes=breakdown["inputs"],
        transients=transients,
        duration_s=0.0,
        notes=[
            *trace.notes,
            f"rescaled from batch size {b0}" + (f" and {other.batch_size}" if other else ""),
        ],
        **lin,
    )
