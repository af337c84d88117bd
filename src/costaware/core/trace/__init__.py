"""Dry run of one real training step on fake tensors: graph, memory timeline, FLOPs.

The model is built on the ``meta`` device (no memory, any size), its parameters and
buffers are swapped for fake ``cpu`` tensors, and one full training step (forward, loss,
backward, optimizer step, ``zero_grad``) runs under :class:`FakeTensorMode`. A second step,
which holds the optimizer state the first one created as every later step does, is
synthesised from the first step's events rather than run again. A dispatch
mode records every aten op with its shapes, FLOPs and bytes, and every storage's
allocation and release, which gives:

- the operator graph (:class:`networkx.DiGraph`, edges follow storages from producer to
  consumer);
- the live-bytes timeline (each storage rounded to 512 B as the CUDA allocator does) and
  the peak broken down into parameters, buffers, inputs, gradients, optimizer state,
  activations and temporaries;
- the allocation/free event sequence that :mod:`costaware.core.allocator` replays.

Why fake ``cpu`` rather than fake ``cuda``: on a CPU-only build the first autograd op on a
fake CUDA tensor aborts the process with an uncatchable C++ terminate, and on an H200 the
fake-cpu and fake-cuda peaks agreed to 0.2 MiB (see DESIGN.md). CUDA's own kernel choices
are left to the fused attention and RNN modes (which also take the optimizer's multi-tensor
step, where a CPU steps one parameter at a time), the allocator simulation and the learned
residual; the cuDNN work spaces the trace models are the blocks a convolution's backward
and a fused recurrent layer's backward take and free again (:attr:`Trace.transients`). A
trace for a CPU holds the CPU's counterparts there instead: the columns of PyTorch's own
convolution, where it runs one, and oneDNN's LSTM buffers.

The parts, each a module of this package, in the order a dry run meets them:

- :mod:`~costaware.core.trace.run`: :func:`dry_run`, which builds the model, traces its
  step under a time limit and classifies a failure;
- :mod:`~costaware.core.trace.build`: the model built on ``meta`` (or for real on the CPU,
  within a memory limit) and swapped for fake tensors;
- :mod:`~costaware.core.trace.time_limit`: the dry run in a worker thread that is stopped
  at its deadline;
- :mod:`~costaware.core.trace.step`: one training step recorded, and the two-step
  :class:`Trace` made of it; :mod:`~costaware.core.trace.optimizer` its optimizer step,
  :mod:`~costaware.core.trace.ddp` DDP's gradient buckets;
- :mod:`~costaware.core.trace.recorder`: the dispatch mode that records ops and storages,
  and :mod:`~costaware.core.trace.transients` the kernels' work spaces it cannot see;
- :mod:`~costaware.core.trace.fused`, :mod:`~costaware.core.trace.fused_rms_norm`,
  :mod:`~costaware.core.trace.fused_dropout`, :mod:`~costaware.core.trace.fused_rnn`: the
  fused kernels a CUDA GPU runs, traced as such;
- :mod:`~costaware.core.trace.result`: the :class:`Trace` and its live-bytes timeline;
  :mod:`~costaware.core.trace.rescaling` a trace at another batch size;
- :mod:`~costaware.core.trace.failures`: a failed dry run told as the user's bug or the
  dry run's own limit, :mod:`~costaware.core.trace.user_code` which code is the user's,
  :mod:`~costaware.core.trace.torch_logs` torch's log of the failing op silenced.

This package re-exports the names other modules use.
"""

from __future__ import annotations

from costaware.core.trace.build import REAL_BUILD_SHARE as REAL_BUILD_SHARE
from costaware.core.trace.build import available_memory as available_memory
from costaware.core.trace.build import build_model as build_model
from costaware.core.trace.build import default_real_build_limit as default_real_build_limit
from costaware.core.trace.ddp import ddp_bucket_sizes as ddp_bucket_sizes
from costaware.core.trace.fused_rnn import _FusedRNN as _FusedRNN
from costaware.core.trace.rescaling import rescale as rescale
from costaware.core.trace.result import CATEGORIES as CATEGORIES
from costaware.core.trace.result import COMPILED_NOTE as COMPILED_NOTE
from costaware.core.trace.result import Trace as Trace
from costaware.core.trace.result import exact_live_peak as exact_live_peak
from costaware.core.trace.run import ATTENTION_MODES as ATTENTION_MODES
from costaware.core.trace.run import dry_run as dry_run
from costaware.core.trace.time_limit import _call_with_timeout as _call_with_timeout
from costaware.core.trace.torch_logs import _quiet_torch_logs as _quiet_torch_logs
from costaware.core.trace.transients import _CUDNN_RNN_TERMS as _CUDNN_RNN_TERMS
from costaware.core.trace.transients import _cpu_conv_transient as _cpu_conv_transient
from costaware.core.trace.transients import _cudnn_rnn_terms as _cudnn_rnn_terms
from costaware.core.trace.transients import _cudnn_rnn_transient as _cudnn_rnn_transient
from costaware.core.trace.transients import _onednn_conv_transient as _onednn_conv_transient
from costaware.core.trace.transients import cpu_capability as cpu_capability
from costaware.core.trace.transients import cpu_conditions as cpu_conditions
from costaware.core.trace.transients import simulated_cpu_capability as simulated_cpu_capability
from costaware.core.trace.user_code import _failing_line as _failing_line
from costaware.core.trace.user_code import _raised_by_costaware as _raised_by_costaware

__all__ = ["ATTENTION_MODES", "CATEGORIES", "COMPILED_NOTE", "Trace", "build_model", "dry_run"]
