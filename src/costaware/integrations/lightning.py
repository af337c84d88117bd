r"""
Lightning callback
^^^^^^^^^^^^^^^^^^

Record what a training run really costs, epoch by epoch, and stop one that blows its budget.

:class:`CostAwareCallback` measures, for every training epoch:

- ``epoch_time``: wall time of the epoch's training batches (from the epoch's start to the
  end of its last batch, data loading included, validation excluded);
- ``iteration_time``: the median time of one batch, measured ``on_train_batch_start`` ->
  ``on_train_batch_end`` (on CUDA after a synchronisation on both ends), skipping the first
  ``warmup_steps`` batches of the first epoch;
- ``peak_memory``: on CUDA ``torch.cuda.max_memory_reserved`` (``peak_allocated``:
  ``max_memory_allocated``) since training started; ``nvml_peak`` is the highest
  device-wide used memory the driver reported (``cudaMemGetInfo``, the figure NVML shows,
  CUDA context included). On the CPU it is the peak of the bytes PyTorch's CPU allocator
  held for the training thread over the first two training batches, read from torch's
  thread-local profiler's memory events (:class:`costaware.measure.profile.AllocatorPeak`;
  trials that train at once in threads of one process each measure their own), plus the
  bytes of the model's parameters and buffers and of any optimizer state, which were
  allocated before: the quantity the cost model predicts for a CPU, exactly. The two
  profiled batches run a few microseconds per op slower, and the profiler's own work when
  it stops is left out of the epoch time. Where the profiler cannot run (another torch
  profiler is active in the thread, such as Lightning's ``profiler="pytorch"``) it falls
  back to the growth of the process's peak resident set since training started plus
  those bytes, while glibc serves every allocation above 64 KiB with ``mmap`` so that
  freed tensors leave the resident set at once (which slows a CPU step: each large
  tensor faults its pages in again). The resident set is the process's, so it is the
  figure only while no other run of the process measures (see "Trials at once in one
  process" below); otherwise ``peak_memory`` is None. Otherwise glibc's settings are
  left alone, and training runs as it would without the callback.
  Peaks are running peaks: epoch ``k`` reports the highest figure of epochs ``0..k``.
  ``actual["memory_method"]`` says which method was used.
- ``held_before`` (CUDA): on a GPU, training starts from a clean cache. Unreachable
  objects are collected (``gc.collect``: an earlier trial's model and optimizer often
  live on in reference cycles until then), cuBLAS's cached workspaces are dropped (one
  pins the whole cached segment it sits in) and the cache is emptied, once in
  Lightning's ``setup`` hook (before the model is on the device) and again when training
  starts. What the process still holds reserved at ``setup``, less parameters the module
  already had on the device, is ``held_before``. Above
  :data:`costaware.observation.MAX_HELD_BEFORE` (256 MiB) the callback warns once, and the
  store does not refit memory on that trial's peak, which is partly someone else's.

Trials at once in one process
-----------------------------
Trials that train at the same time in threads of one process (Optuna's ``n_jobs``) share
what belongs to the process or the device: a GPU's peak statistics and cache, the resident
set, glibc's settings. Each run claims its device from ``setup`` to the end of fit
(:class:`costaware.measure.profile.DeviceUse`), and none resets the peaks, empties the cache or
changes glibc's settings while another one's claim is open. A run that shared its GPU with
another at any time since its claim records the device's figures, not its own:
``device_peak_memory`` / ``device_peak_allocated`` are ``torch.cuda.max_memory_reserved`` /
``max_memory_allocated`` of the device while ``shared_by`` runs of the process used it
(since the device's last peak reset: this run's, if it began alone, else an earlier
run's), with ``peak_memory``, ``peak_allocated`` and ``held_before`` None; the store then
learns no memory from the row, and the memory budget is not checked against it (an
out-of-memory error still ends the run and is recorded). Rows recorded before another run
arrived keep their own peaks. On a CPU the allocator's peak is each thread's own and
holds at any concurrency; only its resident-set fallback is the process's.

Each epoch becomes one ``record_measurement(status="ok", epoch=...)`` row in an
:class:`~costaware.runtime.store.ObservationStore` (or ``"stopped"`` when the budget was enforced on
it). A crash is recorded by ``on_exception``: ``"oom"`` for CUDA/CPU out-of-memory errors,
``"stopped"`` for ``optuna.TrialPruned`` or ``KeyboardInterrupt``, ``"error"`` otherwise, with
the memory reached so far and the time of the epoch cut short as ``partial_epoch_time`` (no
epoch's time); raised between epochs (a pruner asked at an epoch's end), the row records the
stop alone, that epoch's row holding its figures. The exception still propagates to the
caller. With a
:class:`~costaware.TrainingSpec` the callback also records the cost model's prediction when
fitting starts, unless costaware's Optuna pruner already recorded one for the same trial.
Everything is also kept in memory in ``callback.records``, so the callback works alone as a
cost recorder. Nothing the callback does may break training: a failing prediction or a store
that cannot be written only warns (once). The user's bug is the exception: a spec whose
training step fails as a real one would (:class:`~costaware.UserCodeError`, a
:class:`~costaware.SpecError`) is raised out of ``trainer.fit`` before the first batch.

With ``enforce=True`` and a :class:`~costaware.Budget`, an epoch whose measured epoch time,
training time so far, or peak memory (plus the device's CUDA context overhead on a GPU)
exceeds the budget is recorded as ``"stopped"`` with a readable reason. If an Optuna trial is
attached, the callback sets the trial's ``costaware_stopped`` user attribute and raises
``optuna.TrialPruned`` (Lightning re-raises it out of ``trainer.fit``, so the objective ends
as PRUNED and the sampler learns from it); otherwise it sets ``trainer.should_stop``.

Two Lightning namespaces
------------------------
``lightning.pytorch`` (the ``lightning`` distribution) and ``pytorch_lightning`` (the
``pytorch-lightning`` distribution) ship the same source as two separate class hierarchies:
``lightning.pytorch.Callback is not pytorch_lightning.Callback``. A callback of the other
namespace is invisible to the Trainer's ``isinstance`` checks, and one passed alone (not in a
list) fails with ``TypeError: '...' object is not iterable``. So this module offers one class
per namespace, with the same arguments and behaviour (all logic lives in one shared base):

- :class:`CostAwareCallback` subclasses ``lightning.pytorch.Callback``: use it with
  ``lightning.pytorch.Trainer`` (``import lightning as L; L.Trainer(...)``).
- :class:`PLCostAwareCallback` subclasses ``pytorch_lightning.Callback``: use it with
  ``pytorch_lightning.Trainer``.

A callback given to a Trainer of the other namespace warns in ``setup``. Importing this module
needs at least one of the two packages (``pip install 'costaware[lightning]'`` installs
``lightning``); the class of a missing namespace raises ``ImportError`` on access.

Example:

.. code-block:: python

    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import costaware as ca
    from costaware.integrations.lightning import CostAwareCallback


    class Regressor(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
            )

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)


    data = DataLoader(TensorDataset(torch.randn(256, 32), torch.randn(256, 1)), batch_size=32)
    callback = CostAwareCallback(  # store="sqlite:///hpo.db" to keep the rows
        budget=ca.Budget(max_epoch_time="10min", max_memory="4GiB"), enforce=True
    )
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=2, callbacks=[callback], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Regressor(), data)
    for row in callback.measurements:
        print(row["epoch"], row["status"], row["actual"]["epoch_time"], row["actual"]["peak_memory"])

Under Optuna, pass ``trial=trial`` (and the spec, to record the prediction):
``CostAwareCallback(store="sqlite:///hpo.db", spec=spec_fn(trial), budget=budget,
enforce=True, trial=trial)``; the study and trial ids of the rows then come from the trial.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import math
import numbers
import os
import statistics
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from costaware.budget import Budget
from costaware.core.model import CostModel, Prediction
from costaware.devices import Device, cpu_device, detect_device, get_device, is_auto
from costaware.errors import (
    CostawareError,
    CostAwareWarning,
    SpecError,
    TrialRejected,
    UntraceableModelError,
    UserCodeError,
    first_line,
    warn_at_users_line,
)
from costaware.from_code import BatchLikeExample
from costaware.integrations._keywords import keyword_options
from costaware.measure.profile import (
    CpuMemoryMeter,
    DeviceUse,
    clear_cuda_cache,
    context_bytes,
    device_key,
    malloc_trim,
)
from costaware.runtime.gate import Gate, check_options, spec_build_error
from costaware.spec import (
    TrainingSpec,
    parse_sharding,
    parse_wrap_policy,
    rank_batches,
    rank_samples,
)

if TYPE_CHECKING:
    from costaware.runtime.store import ObservationStore

_INSTALL_HINT = "pip install 'costaware[lightning]'"
_MAX_REASON = 800
_T = TypeVar("_T")


def _optional_callback(module: str) -> Any:
    try:
        return importlib.import_module(module).Callback
    except ImportError:
        return None


if TYPE_CHECKING:
    from lightning.pytorch import Callback as _LightningCallback
    from pytorch_lightning import Callback as _PLCallback
else:
    _LightningCallback = _optional_callback("lightning.pytorch")
    _PLCallback = _optional_callback("pytorch_lightning")

if _LightningCallback is None and _PLCallback is None:
    raise ImportError(
        "costaware.integrations.lightning needs Lightning (lightning.pytorch or "
        f"pytorch_lightning), and neither is installed. Install it with:\n    {_INSTALL_HINT}"
    )


# --------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------


def _reason_line(exc: BaseException) -> str:
    return first_line(exc, _MAX_REASON)


def _is_oom(exc: BaseException) -> bool:
    """CUDA OOM, CPU allocator failure (``DefaultCPUAllocator: can't allocate memory``),
    a cuBLAS allocation failure, or Python's MemoryError."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    if isinstance(exc, RuntimeError):
        msg = str(exc).lower()
        return (
            "out of memory" in msg
            or "can't allocate memory" in msg
            or "cublas_status_alloc_failed" in msg
        )
    return False


def _is_trial_pruned(exc: BaseException) -> bool:
    # by name: optuna is optional here, and optuna.TrialPruned is optuna.exceptions.TrialPruned
    return any(c.__name__ == "TrialPruned" for c in type(exc).__mro__)


#: the module hooks Lightning calls after the callbacks' ``setup``, in which a module may
#: build its layers (``configure_sharded_model`` is the older name of ``configure_model``)
_BUILD_HOOKS = ("setup", "configure_model", "configure_sharded_model")


def _once_built(trainer: Any, pl_module: Any, act: Callable[[], None]) -> None:
    """Run ``act`` (a decision, a batch size set) now, from a callback's ``setup``; or, for
    a module that builds its layers in its own ``setup`` or ``configure_model``
    (:func:`_builds_later`), which Lightning calls after the callbacks' ``setup``, once
    those have run: just before the strategy's ``setup`` moves the model to the device
    and builds its optimizers. No callback hook runs in between, so the strategy's
    ``setup`` is wrapped for that one call, and the callbacks' acts run in their order."""
    if not _builds_later(pl_module):
        act()
        return
    strategy = trainer.strategy
    queued: list[Callable[[], None]] | None = vars(strategy).get("_costaware_once_built")
    if queued is None:
        queued = strategy._costaware_once_built = []
        original = strategy.setup

        def act_then_setup(*args: Any, **kwargs: Any) -> Any:
            vars(strategy).pop("setup", None)  # one call only: the class's method again
            acts = vars(strategy).pop("_costaware_once_built", [])
            for queued_act in acts:
                queued_act()
            return original(*args, **kwargs)

        strategy.setup = act_then_setup
    queued.append(act)


def _builds_later(pl_module: Any) -> bool:
    """Whether ``pl_module`` overrides a hook that runs after the callbacks' ``setup``
    and may build its layers (:data:`_BUILD_HOOKS`), in either Lightning namespace."""
    for base in type(pl_module).__mro__:
        if base.__name__ == "LightningModule" and base.__module__.endswith("core.module"):
            return any(
                getattr(type(pl_module), hook, None) is not getattr(base, hook, None)
                for hook in _BUILD_HOOKS
                if hasattr(base, hook)
            )
    return False


def _is_optuna_trial(obj: Any) -> bool:
    return obj is not None and all(hasattr(obj, a) for a in ("number", "set_user_attr", "params"))


def _json_default(obj: Any) -> Any:
    item = getattr(obj, "item", None)  # numpy / torch scalars
    if callable(item):
        with contextlib.suppress(Exception):
            return item()
    return str(obj)


def _plain(obj: Any) -> Any:
    """JSON-plain copy (checkpoints load with ``weights_only=True``)."""
    return json.loads(json.dumps(obj, default=_json_default))


def _module_bytes(module: torch.nn.Module, device_type: str) -> int:
    """Bytes of the module's parameters and buffers on ``device_type``; a lazy module's
    parameters before its first batch shapes them hold none."""
    from torch.nn.parameter import UninitializedBuffer, UninitializedParameter

    total = 0
    for t in (*module.parameters(), *module.buffers()):
        if isinstance(t, (UninitializedParameter, UninitializedBuffer)):
            continue
        if t.device.type == device_type:
            total += t.numel() * t.element_size()
    return total


def _optimizer_bytes(optimizers: Any, device_type: str) -> int:
    """Bytes of the optimizer state that exists already (a resumed run's)."""
    seen: set[int] = set()
    total = 0
    for opt in optimizers or ():
        for state in getattr(opt, "state", {}).values():
            for t in state.values() if isinstance(state, dict) else ():
                if isinstance(t, torch.Tensor) and t.device.type == device_type:
                    ptr = t.untyped_storage().data_ptr()
                    if ptr not in seen:
                        seen.add(ptr)
                        total += t.untyped_storage().nbytes()
    return total


#: training batches the CPU allocator's peak is profiled over: the second step is the
#: first with the optimizer state allocated, the steady state's peak
_MEMORY_STEPS = 2

#: Lightning's precision strings (its plugins' ``precision``, and the aliases a Trainer
#: takes), as a spec takes them; None for those costaware does not model
_PRECISIONS: dict[str, str | None] = {
    "32-true": "fp32", "32": "fp32",
    "bf16-mixed": "bf16", "bf16": "bf16",
    "16-mixed": "fp16", "16": "fp16",
    "bf16-true": "bf16-true", "16-true": "fp16-true", "64-true": "fp64-true", "64": "fp64-true",
    "transformer-engine": None, "transformer-engine-float16": None,
}  # fmt: skip


def lightning_precision(trainer: Any) -> str:
    """The spec's precision (see :class:`~costaware.TrainingSpec`) of a Trainer's precision
    string (``trainer.precision``: ``"bf16-true"`` gives pure ``"bf16-true"``,
    ``"16-mixed"`` autocast ``"fp16"``, ...).

    Raises:
        CostawareError: a precision costaware does not model (Transformer Engine's FP8), or
            a string Lightning does not know either (a custom precision plugin's); the
            callback then admits the fit with a warning that says so.
    """
    value = getattr(trainer, "precision", "32-true")
    text = str(value).strip().lower()
    if text not in _PRECISIONS:
        plugin = getattr(trainer, "precision_plugin", None)
        source = f" (from the precision plugin {type(plugin).__name__})" if plugin else ""
        known = ", ".join(repr(k) for k in _PRECISIONS if "-" in k)
        raise CostawareError(
            f"the Trainer's precision {value!r}{source} is not one Lightning knows ({known}), "
            "so costaware cannot tell what it trains in; pass the callback "
            "spec=TrainingSpec(..., precision=...) with the precision it amounts to"
        )
    found = _PRECISIONS[text]
    if found is None:
        raise CostawareError(
            f"the Trainer's precision {value!r} (FP8 through NVIDIA Transformer Engine) is not "
            "one costaware models: it predicts fp32, autocast bf16/fp16 and pure "
            "bf16/fp16/fp64 steps"
        )
    return found


def lightning_parallel(trainer: Any) -> dict[str, Any]:
    """The spec's ``world_size`` and ``bucket_cap_mb`` (DDP) or ``sharding`` and
    ``wrap_policy`` (FSDP, DeepSpeed) of a Trainer's strategy, predicted per rank; none for
    one process but FSDP's.

    - ``DDPStrategy``: its ``bucket_cap_mb``.
    - ``FSDPStrategy``: its ``sharding_strategy`` (``FULL_SHARD``, ``SHARD_GRAD_OP`` or
      ``NO_SHARD``; over one process FSDP trains ``NO_SHARD`` whatever it was given) and
      the module classes of its ``auto_wrap_policy`` (a set of classes or a
      ``ModuleWrapPolicy``); without one, the whole model is one unit.
    - ``DeepSpeedStrategy``: the ZeRO stage (1-3) of its config's ``zero_optimization``.

    Raises:
        CostawareError: a strategy over several processes that costaware does not model
            (another strategy; FSDP's ``HYBRID_SHARD``, CPU offload or a
            callable wrap policy; DeepSpeed's stage 0 or offload); the callback admits the
            fit with a warning that says so.
    """
    world = getattr(trainer, "world_size", 1)
    world = world if isinstance(world, int) and world > 1 else 1
    strategy = getattr(trainer, "strategy", None)
    name = type(strategy).__name__
    if world == 1 and name != "FSDPStrategy":
        return {}
    if name == "FSDPStrategy":
        return {"world_size": world, **_lightning_fsdp(strategy, world)}
    if name == "DeepSpeedStrategy":
        return {"world_size": world, **_lightning_deepspeed(strategy, world)}
    if name != "DDPStrategy":
        raise CostawareError(
            f"the Trainer's strategy {name} over {world} processes is not one costaware "
            "models: it predicts one rank of DDP (strategy='ddp'), FSDP (FSDPStrategy) and "
            "DeepSpeed ZeRO (DeepSpeedStrategy)"
        )
    kwargs = getattr(strategy, "_ddp_kwargs", None) or {}
    cap = kwargs.get("bucket_cap_mb")
    return {"world_size": world, "bucket_cap_mb": float(cap) if cap is not None else 25.0}


def _lightning_fsdp(strategy: Any, world: int) -> dict[str, Any]:
    """``sharding`` and ``wrap_policy`` of Lightning's ``FSDPStrategy``."""
    value = getattr(strategy, "sharding_strategy", "FULL_SHARD")
    said = getattr(value, "name", value)
    try:
        sharding = parse_sharding(value)
    except SpecError:
        sharding = None
    if sharding not in ("full_shard", "shard_grad_op", "no_shard"):
        raise CostawareError(
            f"the Trainer's FSDPStrategy over {world} processes shards with {said}, which "
            "costaware does not model: it predicts one rank of FULL_SHARD, SHARD_GRAD_OP "
            "and NO_SHARD"
        )
    if world == 1:  # FSDP switches to NO_SHARD over one process
        sharding = "no_shard"
    offload = getattr(strategy, "cpu_offload", None)
    if offload is not None and getattr(offload, "offload_params", False):
        raise CostawareError(
            f"the Trainer's FSDPStrategy over {world} processes offloads the parameters to "
            "the CPU (cpu_offload), which costaware does not model"
        )
    policy = (getattr(strategy, "kwargs", None) or {}).get("auto_wrap_policy")
    try:
        wrap = parse_wrap_policy(policy)
    except SpecError:
        raise CostawareError(
            f"the Trainer's FSDPStrategy over {world} processes wraps by the policy "
            f"{policy!r}, which costaware does not model: it takes the module classes FSDP "
            "wraps (auto_wrap_policy={Block} or ModuleWrapPolicy); pass the callback "
            "spec=TrainingSpec(..., sharding=..., wrap_policy=(Block,)) with the classes "
            "it amounts to"
        ) from None
    return {"sharding": sharding, "wrap_policy": wrap}


def _lightning_deepspeed(strategy: Any, world: int) -> dict[str, Any]:
    """``sharding`` of Lightning's ``DeepSpeedStrategy``: the ZeRO stage of its config."""
    config = getattr(strategy, "config", None)
    zero = config.get("zero_optimization") if isinstance(config, Mapping) else None
    stage = zero.get("stage") if isinstance(zero, Mapping) else None
    if isinstance(stage, bool) or stage not in (1, 2, 3):
        raise CostawareError(
            f"the Trainer's DeepSpeedStrategy over {world} processes runs ZeRO stage "
            f"{stage!r} (from its config's zero_optimization), which costaware does not "
            "model: it predicts one rank of stages 1, 2 and 3"
        )
    offload = [k for k in ("offload_optimizer", "offload_param") if zero and zero.get(k)]
    if offload:
        raise CostawareError(
            f"the Trainer's DeepSpeedStrategy over {world} processes offloads "
            f"({', '.join(offload)}), which costaware does not model"
        )
    return {"sharding": f"zero{stage}"}


def lightning_step_loss(model: Any, batch: Any) -> torch.Tensor:
    """A LightningModule's loss for one batch, as automatic optimization takes it: the
    tensor ``training_step`` returns, or its ``"loss"`` entry."""
    out = model.training_step(batch, 0)
    if isinstance(out, Mapping):
        out = out.get("loss")
    if not isinstance(out, torch.Tensor):
        raise UntraceableModelError(
            "training_step returned no loss tensor (a tensor or a dict with 'loss') for the "
            f"dry run's batch (batch_idx 0), but {type(out).__name__}: Lightning skips such a "
            "batch, and costaware, which dry-runs the step automatic optimization takes, has "
            "no step to predict. A limit of the dry run, not a bug in the module: pass "
            "CostAwareCallback(spec=...) to describe the step"
        )
    return out


def _prepare_copy(module: Any) -> None:
    """Ready a meta copy of a LightningModule for the dry run of its ``training_step``: it
    logs nothing (``self.log`` needs a running loop), and ``self.optimizers()`` and
    ``self.lr_schedulers()`` answer with what the copy's own ``configure_optimizers``
    returns, as Lightning's would in training (before the fit starts, the Trainer holds
    none). Those are read (an ``lr`` logged), never stepped: the dry run steps its own
    optimizer."""

    def _no_log(*args: Any, **kwargs: Any) -> None:
        return None

    configured: list[tuple[list[Any], list[Any]]] = []

    def _configured() -> tuple[list[Any], list[Any]]:
        if not configured:
            configured.append(_optimizers_and_schedulers(type(module).configure_optimizers(module)))
        return configured[0]

    def _optimizers(use_pl_optimizer: bool = True) -> Any:
        opts = _configured()[0]
        return opts[0] if len(opts) == 1 else opts

    def _lr_schedulers() -> Any:
        scheds = _configured()[1]
        return None if not scheds else scheds[0] if len(scheds) == 1 else scheds

    module.__dict__["log"] = _no_log
    module.__dict__["log_dict"] = _no_log
    module.__dict__["optimizers"] = _optimizers
    module.__dict__["lr_schedulers"] = _lr_schedulers


def _optimizers_and_schedulers(configured: Any) -> tuple[list[Any], list[Any]]:
    """The optimizers and learning-rate schedulers in what ``configure_optimizers``
    returned, in its order (an optimizer; a list or tuple of them; a dict with
    "optimizer" and "lr_scheduler", itself a scheduler or a dict with "scheduler"; a list
    of such dicts; or ``([optimizers], [schedulers])``)."""
    opts: list[Any] = []
    scheds: list[Any] = []

    def scheduler(s: Any) -> None:
        s = s.get("scheduler") if isinstance(s, Mapping) else s
        if s is not None:
            scheds.append(s)

    def walk(obj: Any) -> None:
        if isinstance(obj, torch.optim.Optimizer):
            opts.append(obj)
        elif isinstance(obj, Mapping):
            walk(obj.get("optimizer"))
            if obj.get("lr_scheduler") is not None:
                scheduler(obj["lr_scheduler"])
        elif isinstance(obj, (list, tuple)):
            if (
                len(obj) == 2
                and isinstance(obj[0], (list, tuple))
                and isinstance(obj[1], (list, tuple))
            ):
                walk(obj[0])
                for s in obj[1]:
                    scheduler(s)
            else:
                for item in obj:
                    walk(item)

    walk(configured)
    return opts, scheds


def _study_budget(trial: Any) -> Budget | None:
    """The budget of the costaware pruner of ``trial``'s Optuna study, or None (no Optuna
    trial, or another pruner)."""
    if not _is_optuna_trial(trial):
        return None
    from costaware.integrations.optuna import study_gate

    gate = study_gate(trial.study)
    return gate.budget if gate is not None else None


def _fit_budget(trainer: Any) -> Budget | None:
    """The budget the fit is judged against: that of a costaware callback of the
    Trainer's (its own ``budget=``, else its Optuna study's pruner's), or None."""
    for callback in getattr(trainer, "callbacks", None) or ():
        if isinstance(callback, _CostAwareCallbackBase):
            found = callback._judged_budget()
            if found is not None:
                return found
    return None


def _first_optimizer(configured: Any) -> Any:
    """The first optimizer of what ``configure_optimizers`` returned (an optimizer, a list
    or tuple of them, a dict with "optimizer", or ``([optimizers], [schedulers])``)."""
    if isinstance(configured, torch.optim.Optimizer):
        return configured
    if isinstance(configured, Mapping):
        return _first_optimizer(configured.get("optimizer"))
    if isinstance(configured, (list, tuple)) and configured:
        return _first_optimizer(configured[0])
    return None


def _example_batch(trainer: Any) -> tuple[Any, Any]:
    """One batch of the training data, and the loader it came from: the datamodule's, the
    one given to ``fit`` or the module's ``train_dataloader``."""
    loader: Any = None
    source = getattr(getattr(trainer, "fit_loop", None), "_data_source", None)
    if source is not None and hasattr(source, "dataloader"):
        loader = source.dataloader()
    if loader is None and getattr(trainer, "datamodule", None) is not None:
        loader = trainer.datamodule.train_dataloader()
    if loader is None and getattr(trainer, "lightning_module", None) is not None:
        loader = trainer.lightning_module.train_dataloader()
    if loader is None:
        raise ValueError("no training dataloader to take an example batch from")
    if type(loader).__name__ == "CombinedLoader" and hasattr(loader, "iterables"):
        if getattr(loader, "_mode", None) == "sequential":  # one loader's batches at a time
            first = loader.iterables
            first = next(iter(first.values())) if isinstance(first, Mapping) else first[0]
            return next(iter(first)), first
        loader = loader.iterables
    # several loaders: Lightning combines one batch of each (its "max_size_cycle"), in
    # the mapping or list they came in, for an epoch as long as the longest
    if isinstance(loader, Mapping) and loader:
        return {k: next(iter(v)) for k, v in loader.items()}, _longest(loader.values())
    if isinstance(loader, (list, tuple)) and loader:
        return [next(iter(v)) for v in loader], _longest(loader)
    return next(iter(loader)), loader


def _longest(loaders: Any) -> Any:
    """The loader with the most batches (one without a length counts as none)."""
    return max(loaders, key=lambda d: _length(d) or 0)


def _as_transferred(pl_module: Any, batch: Any) -> Any:
    """The batch as ``training_step`` receives it: through the module's (or datamodule's)
    ``on_before_batch_transfer``, ``transfer_batch_to_device`` (to this CPU) and
    ``on_after_batch_transfer``, as Lightning calls them for every batch.

    Raises:
        UntraceableModelError: a hook failed on the example batch outside a running fit,
            where costaware calls it (the trial is admitted; a real fit calls it again).
    """
    before = getattr(pl_module, "_on_before_batch_transfer", None)
    handler = getattr(pl_module, "_apply_batch_transfer_handler", None)
    try:
        if callable(before) and callable(handler):
            return handler(before(batch, dataloader_idx=0), torch.device("cpu"), 0)
        batch = pl_module.on_before_batch_transfer(batch, 0)
        return pl_module.on_after_batch_transfer(batch, 0)
    except Exception as e:
        raise UntraceableModelError(
            f"costaware could not pass the example batch through the module's batch "
            f"transfer hooks before the fit ({type(e).__name__}: {first_line(e)}); pass "
            "CostAwareCallback(spec=...) to describe the step"
        ) from e


def _length(obj: Any) -> int | None:
    """``len(obj)``, or None for an object without a length (an iterable dataset)."""
    try:
        return len(obj)
    except (TypeError, NotImplementedError):
        return None


def lightning_trial_length(
    trainer: Any, loader: Any, batch_size: int, world_size: int
) -> dict[str, Any]:
    """The spec's ``dataset_size``, ``epochs`` and ``max_steps`` for the length a Trainer
    trains: the batches of one rank's epoch (``len`` of the loader; under data parallel
    ``DistributedSampler``'s ``ceil(len(dataset) / world_size)`` samples per rank, batched
    as the loader batches), cut by ``limit_train_batches`` (an int: that many batches; a
    float: that fraction) as Lightning cuts it, ``max_epochs`` and ``max_steps``. Where the
    epoch is not the whole dataset in batches of ``batch_size``, ``dataset_size`` is the
    samples the cut epoch holds. An unbounded ``max_epochs`` (-1) with ``max_steps`` set
    gives the epochs that ``max_steps`` reaches; without it, no epoch limit (None). A
    ``Timer`` (``max_time``) gives the spec's ``max_time``: the time left of its duration."""
    dataset_size = _length(getattr(loader, "dataset", None))
    batches = _length(loader)
    if world_size > 1 and dataset_size is not None:
        bs = getattr(loader, "batch_size", None) or batch_size
        batches = rank_batches(dataset_size, world_size, bs, getattr(loader, "drop_last", False))
    limit = getattr(trainer, "limit_train_batches", None)
    natural = batches
    if isinstance(limit, int) and not isinstance(limit, bool):
        batches = limit if batches is None else min(batches, limit)
    elif isinstance(limit, float) and batches is not None:
        batches = int(batches * limit)
    if batches is not None and batches > 0 and (
        batches != natural
        or dataset_size is None
        or rank_batches(dataset_size, world_size, batch_size) != batches
    ):
        dataset_size = batches * batch_size * world_size
    out: dict[str, Any] = {"dataset_size": dataset_size}
    max_steps = getattr(trainer, "max_steps", -1)
    max_steps = max_steps if isinstance(max_steps, int) and max_steps > 0 else None
    epochs = getattr(trainer, "max_epochs", None)
    accumulation = max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1))
    if isinstance(epochs, int) and epochs > 0:
        out["epochs"] = epochs
    elif max_steps is not None and batches:  # epochs without end: max_steps ends it
        out["epochs"] = max(1, math.ceil(max_steps * accumulation / batches))
    else:  # no epoch limit: max_steps, max_time or nothing ends it
        out["epochs"] = None
    if max_steps is not None:
        out["max_steps"] = max_steps
    left = [_time_left(c) for c in getattr(trainer, "callbacks", ())]
    if times := [t for t in left if t is not None]:
        out["max_time"] = min(times)
    return out


def _time_left(callback: Any) -> float | None:
    """The training time a Lightning ``Timer`` (``Trainer(max_time=...)``, either
    namespace) has left, at least a second; None for any other callback or a Timer
    without a duration."""
    if type(callback).__name__ != "Timer" or not callable(
        getattr(callback, "time_remaining", None)
    ):
        return None
    left = callback.time_remaining()
    return None if left is None else max(float(left), 1.0)


def spec_from_lightning(trainer: Any, pl_module: Any) -> TrainingSpec:
    """The :class:`~costaware.TrainingSpec` of a Lightning fit, from the fit itself: the
    LightningModule (dry-run from a meta copy, ``training_step`` as the loss), one batch
    of its training data, the first optimizer of ``configure_optimizers``, the Trainer's
    precision, ``accumulate_grad_batches``, the trial's length as the Trainer trains it
    (:func:`lightning_trial_length`: the loader's batches, ``limit_train_batches``,
    ``max_epochs``, ``max_steps``) and, under data parallel, the world size and
    ``bucket_cap_mb``. Nothing is moved to a device and the module is not modified. A module with manual optimization is refused:
    its step is not the one costaware dry-runs."""
    if getattr(pl_module, "automatic_optimization", True) is False:
        raise NotImplementedError(
            "this LightningModule uses manual optimization; costaware dry-runs the step "
            "automatic optimization takes, so it cannot judge it (pass spec= instead)"
        )
    batch, loader = _example_batch(trainer)
    batch = _as_transferred(pl_module, batch)
    try:
        BatchLikeExample(batch)
    except SpecError as e:  # the user never described the batch: costaware's limit
        raise UntraceableModelError(
            f"costaware cannot read the training batch as one batch of samples: {e} Pass "
            "CostAwareCallback(spec=...) to describe the step"
        ) from e
    configured = pl_module.configure_optimizers()
    # no optimizer (Lightning then trains none): SGD without momentum holds no state either
    optimizer = _first_optimizer(configured) if configured is not None else "sgd"
    precision = lightning_precision(trainer)
    parallel = lightning_parallel(trainer)
    spec = TrainingSpec.from_module(
        pl_module,
        batch,
        optimizer=optimizer if optimizer is not None else "adamw",
        loss=lightning_step_loss,
        precision=precision,
        prepare=_prepare_copy,
        grad_accumulation=max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1)),
        name=type(pl_module).__name__,
        **parallel,
    )
    length = lightning_trial_length(trainer, loader, spec.batch_size, spec.world_size)
    return dataclasses.replace(spec, **length)


# --------------------------------------------------------------------------------------
# the shared implementation
# --------------------------------------------------------------------------------------
class _CostAwareCallbackBase:
    """All of the callback's logic; the public classes add a Lightning ``Callback`` base."""

    _namespace = ""  # "lightning" or "pytorch_lightning", set by the public classes

    @keyword_options(("store",))
    def __init__(
        self,
        *,
        store: ObservationStore | str | os.PathLike[str] | None = None,
        spec: TrainingSpec | None = None,
        model: CostModel | None = None,
        budget: Budget | None = None,
        enforce: bool = False,
        device: str | Device = "auto",
        study: str | None = None,
        trial: Any = None,
        warmup_steps: int = 1,
        on_reject: str = "raise",
        fail_open: bool = True,
        judge_before: bool = True,
    ) -> None:
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, but got {warmup_steps=}.")
        if on_reject not in ("raise", "stop"):
            raise ValueError(
                f"on_reject must be 'raise' (TrialRejected) or 'stop' (trainer.should_stop), "
                f"but got {on_reject=}."
            )
        if spec is not None and not isinstance(spec, TrainingSpec):
            raise TypeError(
                f"spec must be a costaware.TrainingSpec, but got {type(spec).__name__}."
            )
        if budget is not None and not isinstance(budget, Budget):
            raise TypeError(f"budget must be a costaware.Budget, but got {type(budget).__name__}.")
        if enforce and budget is None and _study_budget(trial) is None:
            raise ValueError(
                "enforce=True needs a budget: give budget=, or trial= of a study whose "
                "pruner is costaware's (its budget is enforced), but got budget=None."
            )
        check_options(  # the store is kept as given: a URL is opened when the fit starts
            model=model,
            device=device,
            store=store,
            fail_open=fail_open,
            store_needs=("record_measurement", "record_prediction"),
        )
        self.store = store
        self.spec = spec
        self.model = model
        self.budget = budget
        self.enforce = enforce
        self.device = device
        self.study = study
        self.trial = trial
        self.warmup_steps = warmup_steps
        self.on_reject = on_reject
        self.fail_open = fail_open
        self.judge_before = judge_before
        #: the decision made before training (with a budget or an Optuna trial), or None
        self.decision: Any = None
        self._judged = False
        #: every row written (or meant to be written), as dicts with a "kind" key:
        #: "prediction" or "measurement", the store's keyword arguments, and the store's "id".
        self.records: list[dict[str, Any]] = []
        #: the cost model's prediction for this run, when a spec was given and it worked.
        self.prediction: Prediction | None = None
        #: why enforcement stopped the run, or None.
        self.stopped_reason: str | None = None
        #: epochs recorded so far (0-based, as ``trainer.current_epoch``).
        self.epochs_recorded: list[int] = []
        self._prediction_done = False
        self._train_time = 0.0  # sum of measured epoch times
        self._warned: set[str] = set()
        self._store_obj: Any = None
        self._store_failed = False
        self._setup_held: int | None = None
        self._context: int | None = None
        #: the claim on the device that setup makes, taken over when training starts
        self._setup_use: DeviceUse | None = None
        self._rank_zero = True
        self._reset_run_state()

    def _reset_run_state(self) -> None:
        self._exit_stack: contextlib.ExitStack | None = None
        self._dev: Device | None = None  # what predictions are for
        self._run_dev: Device | None = None  # what the fit runs on
        self._kind = "cpu"
        self._torch_device: torch.device | None = None
        self._training = False
        self._cpu_memory: CpuMemoryMeter | None = None
        self._device_use: DeviceUse | None = None
        self._alloc_batches = 0
        self._module_nbytes = 0
        self._held_before: int | None = None
        self._nvml_peak: int | None = None
        self._raised: BaseException | None = None
        self._first_epoch: int | None = None
        self._epoch_start: float | None = None
        self._batch_t0: float | None = None
        self._last_batch_end: float | None = None
        self._val_start: float | None = None
        self._val_time = 0.0
        self._val_time_at_last_batch = 0.0
        self._epoch_batches = 0
        self._times: list[float] = []
        self._warmup_times: list[float] = []

    # -- identity -------------------------------------------------------------------------
    @property
    def study_name(self) -> str | None:
        """The study the rows belong to: ``study``, else the Optuna trial's study name."""
        if self.study is not None:
            return self.study
        if _is_optuna_trial(self.trial):
            return getattr(getattr(self.trial, "study", None), "study_name", None)
        return None

    @property
    def trial_id(self) -> Any:
        """The trial the rows belong to: the Optuna trial's number, else ``trial`` as given."""
        if _is_optuna_trial(self.trial):
            return self.trial.number
        return self.trial

    @property
    def measurements(self) -> list[dict[str, Any]]:
        """The measurement records (one per epoch, plus one for a crash)."""
        return [r for r in self.records if r["kind"] == "measurement"]

    # -- Lightning hooks (thin) -----------------------------------------------------------
    @property
    def state_key(self) -> str:
        key = {"study": self.study_name, "trial": self.trial_id}
        return f"{type(self).__qualname__}{key!r}"

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._check_namespace(trainer)
            self._safely("checking trial=", self._check_trial_argument)
            self._safely("claiming the device", self._claim_device, trainer)
            self._safely(
                "measuring the GPU memory held before", self._held_at_setup, trainer, pl_module
            )
            # before the strategy moves the model to the device: a rejected trial never
            # allocates anything there
            _once_built(trainer, pl_module, lambda: self._judge_before_training(trainer, pl_module))

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._safely("starting", self._start_fit, trainer, pl_module)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        self._safely("starting to measure", self._start_training, trainer, pl_module)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        self._safely("starting an epoch", self._start_epoch, trainer)

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.sanity_checking:
            return
        self._safely("timing a batch", self._start_batch)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.sanity_checking:
            return
        self._safely("timing a batch", self._end_batch, trainer)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking or self._epoch_start is None:
            return
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking or self._val_start is None:
            return
        self._val_time += time.perf_counter() - self._val_start
        self._val_start = None

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        reason = self._safely("recording an epoch", self._end_epoch, trainer, pl_module)
        if reason:
            self._stop(trainer, reason)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        try:
            self._safely("recording a crash", self._record_exception, trainer, pl_module, exception)
        finally:
            self._finish()

    def state_dict(self) -> dict[str, Any]:
        return {
            "records": _plain(self.records),
            "epochs_recorded": list(self.epochs_recorded),
            "prediction_done": self._prediction_done,
            "stopped_reason": self.stopped_reason,
            "train_time": self._train_time,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.records = list(state_dict.get("records", []))
        self.epochs_recorded = list(state_dict.get("epochs_recorded", []))
        self._prediction_done = bool(state_dict.get("prediction_done", False))
        self.stopped_reason = state_dict.get("stopped_reason")
        self._train_time = float(state_dict.get("train_time", 0.0))

    def __getstate__(self) -> dict[str, Any]:
        # picklable for Ray & co.: drop the open store (reopened from its URL), the run
        # state, and the module's log methods Lightning binds onto every callback in fit
        state = dict(self.__dict__)
        state["_exit_stack"] = None
        state.pop("log", None)
        state.pop("log_dict", None)
        if self.store is None or isinstance(self.store, (str, os.PathLike)):
            state["_store_obj"] = None  # opened from its URL, or the study pruner's
        return state

    # -- before training: the decision ---------------------------------------------------
    def _judge_before_training(self, trainer: Any, pl_module: Any) -> None:
        """Predict this fit's cost and decide, before anything is on the device: with an
        Optuna trial attached (against the study's costaware pruner's budget, else this
        callback's budget, else the device's memory), or with a budget. A rejected trial
        raises ``optuna.TrialPruned`` with the reasons; without a trial, ``enforce=True``
        raises :class:`~costaware.TrialRejected` (``on_reject="raise"``) or stops the fit
        before its first batch (``"stop"``), and otherwise the reasons are warned about.
        A trial the pruner judged already (its ``spec_fn``) is not judged again."""
        trial = self.trial if _is_optuna_trial(self.trial) else None
        if not self.judge_before or self._judged or (trial is None and self.budget is None):
            return
        self._judged = True
        found = self._safely("preparing the decision", self._gate_for, trainer, trial)
        if found is None:
            return
        gate, already = found
        if already or gate is None:
            self._prediction_done = True  # the pruner judged it and recorded it
            return
        spec, error = self.spec, None
        if spec is None:
            try:
                spec = spec_from_lightning(trainer, pl_module)
            except Exception as e:  # judged below: the user's bug fails, ours admits
                error = spec_build_error(
                    e,
                    what="reading the fit's spec off the LightningModule",
                    contract="costaware calls the module's hooks, such as configure_optimizers "
                    "and the training dataloader, before the first batch, as Lightning does",
                )
        spent = 0.0
        if trial is not None:  # the study's time so far, for max_total_time and max_cost
            from costaware.integrations.optuna import study_spent

            spent = study_spent(trial.study)
        verdict = gate.judge(
            spec,
            study=self.study_name,
            trial=self.trial_id,
            error=error,
            spent_time=spent,
            params=trial.params if trial is not None else None,
        )
        self.decision = verdict
        self.prediction = verdict.prediction
        self._prediction_done = True
        if gate.store is None:
            self._safely("recording the decision", self._record_verdict, gate, verdict, spec)
        if trial is not None:
            from costaware.integrations.optuna import stop_when_spent

            self._safely("setting the trial's attributes", self._tell_trial, trial, verdict)
            kinds = verdict.info.get("reason_kinds", ())
            self._safely("stopping a spent study", stop_when_spent, trial.study, gate.budget, spent, kinds)
        if verdict.admit:
            return
        reasons = [str(r) for r in verdict.info.get("reasons", [])] or ["rejected by costaware"]
        self.stopped_reason = "; ".join(reasons)
        if trial is not None:
            import optuna

            optuna.logging.get_logger("optuna.costaware").info(
                f"Trial {trial.number} rejected by costaware before it ran: {self.stopped_reason}"
            )
            exc: BaseException = optuna.TrialPruned(self.stopped_reason)
        elif not self.enforce:
            self._warn_once(
                "rejected",
                f"costaware predicts this fit breaks its budget ({self.stopped_reason}); "
                "training anyway (enforce=False).",
            )
            return
        elif self.on_reject == "stop":
            self._warn_once("rejected", f"stopping before the first batch: {self.stopped_reason}")
            trainer.should_stop = True
            return
        else:
            exc = TrialRejected(reasons)
        self._raised = exc  # on_exception must not record it as a crash
        raise exc

    def _gate_for(self, trainer: Any, trial: Any) -> tuple[Gate | None, bool]:
        """The gate that judges this fit, and whether the trial was judged already: the
        study's costaware pruner's gate (its budget, device and store) where there is one
        and this callback sets no budget or model of its own, else one of this callback's
        budget (default ``Budget()``) for the device the fit runs on. A callback without a
        store of its own records into the study pruner's store, so that the online refit
        and the report find what each trial cost."""
        self._torch_device = trainer.strategy.root_device
        self._kind = self._torch_device.type
        self._rank_zero = bool(getattr(trainer, "is_global_zero", True))
        study_gate: Gate | None = None
        if trial is not None:
            from costaware.integrations.optuna import ATTR
            from costaware.integrations.optuna import study_gate as _study_gate

            study_gate = _study_gate(trial.study)
            if self.store is None and study_gate is not None and study_gate.store is not None:
                self._store_obj = study_gate.store  # what it cost goes where it was predicted
            if ATTR + "admit" in trial.storage.get_trial_user_attrs(trial._trial_id):
                return None, True
        if study_gate is not None and self.budget is None and self.model is None:
            return study_gate, False
        dev = self._resolve_device()
        budget = self.budget if self.budget is not None else Budget()
        return Gate(budget, dev or "auto", model=self.model, fail_open=self.fail_open), False

    def _tell_trial(self, trial: Any, verdict: Any) -> None:
        from costaware.integrations.optuna import ATTR

        for key, value in verdict.info.items():
            trial.set_user_attr(ATTR + key, value)
        if hasattr(trial, "set_constraint"):
            for key, value in verdict.constraints.items():
                trial.set_constraint(key, value)

    def _record_verdict(self, gate: Gate, verdict: Any, spec: TrainingSpec | None) -> None:
        """Record the gate's decision as this trial's prediction, with the features the
        online refit learns from (a prediction without them is never learned from)."""
        pred = verdict.prediction
        summary: dict[str, Any] = {}
        features: dict[str, Any] | None = None
        with contextlib.suppress(Exception):
            summary = spec.summary() if spec is not None else {}
        if pred is not None and spec is not None:
            try:  # traced already for the prediction: the features come from its cache
                features = _plain(gate.model().features(spec, gate.resolved_device()))
            except Exception as e:  # the decision is still recorded, without them
                self._warn_once(
                    "features",
                    f"costaware could not compute this run's features ({_reason_line(e)}); "
                    "its cost is recorded, but the online refit cannot learn from it.",
                )
        self._write(
            "prediction",
            study=self.study_name,
            trial=self.trial_id,
            device=pred.device if pred is not None else None,
            spec=summary,
            features=features,
            prediction=_plain(pred.to_dict()) if pred is not None else None,
            decision=_plain(verdict.decision.to_dict()) if verdict.decision is not None else None,
            status=("admitted" if verdict.admit else "rejected") if pred is not None else "error",
            reason=None if verdict.admit else "; ".join(verdict.info.get("reasons", [])),
            meta=self._meta(None),
        )

    # -- fit start: device, store, prediction ---------------------------------------------
    def _check_namespace(self, trainer: Any) -> None:
        root = type(trainer).__module__.split(".", 1)[0]
        if root in ("lightning", "pytorch_lightning") and root != self._namespace:
            other = "PLCostAwareCallback" if root == "pytorch_lightning" else "CostAwareCallback"
            self._warn_once(
                "namespace",
                f"{type(self).__name__} is a {self._namespace} callback, but this Trainer comes "
                f"from {root}; use {other} from costaware.integrations.lightning instead. It "
                "still runs when passed in a list, but Lightning's isinstance checks miss it.",
            )

    def _claim_device(self, trainer: Any) -> None:
        """Claim the device for this run before its model is on it (:class:`~costaware.
        profile.DeviceUse`), so that another trial of the process that measures meanwhile
        knows this one's tensors are there."""
        if self._setup_use is not None:
            self._setup_use.close()
        self._setup_use = None
        dev = trainer.strategy.root_device
        if dev.type in ("cuda", "cpu"):
            self._setup_use = DeviceUse(device_key(dev))

    def _held_at_setup(self, trainer: Any, pl_module: Any) -> None:
        """What a GPU process holds reserved before this run's model is on the device:
        Lightning's ``setup`` hook runs before the strategy moves the model there, wraps
        it (DDP allocates its gradient buckets then) and builds the optimizers. Anything
        reserved now, less parameters the module already had on the device, is an earlier
        run's (after :func:`~costaware.measure.profile.clear_cuda_cache`)."""
        self._setup_held = None
        dev = trainer.strategy.root_device
        if dev.type != "cuda" or self._setup_use is None or not self._setup_use.alone:
            return  # never empty the cache under another trial's measurement
        self._setup_held = max(0, clear_cuda_cache(dev) - _module_bytes(pl_module, "cuda"))
        # the CUDA context as this process measures it: the study's decisions use it in
        # place of the catalog's default (Gate, from the store)
        self._context = context_bytes(dev)

    def _start_fit(self, trainer: Any, pl_module: Any) -> None:
        self._finish(keep_claim=True)
        self._reset_run_state()
        self._torch_device = trainer.strategy.root_device
        self._kind = self._torch_device.type
        # under DDP every process measures its own device, global rank zero alone writes
        self._rank_zero = bool(getattr(trainer, "is_global_zero", True))
        self._dev = self._resolve_device()
        self._run_dev = self._running_device()
        self._check_devices()
        if self._rank_zero:
            self._open_store()
            self._predict()

    def _resolve_device(self) -> Device | None:
        """The device predictions are for: ``device`` when given, else the one the fit
        runs on (:meth:`_running_device`)."""
        try:
            if isinstance(self.device, Device):
                return self.device
            if not is_auto(self.device):
                return get_device(self.device)
        except Exception as e:  # never break training over a device name
            self._warn_once("device", f"costaware could not describe the device: {_reason_line(e)}")
            return None
        return self._running_device()

    def _running_device(self) -> Device | None:
        """The device the fit runs on, which its measurements are recorded as."""
        try:
            if self._kind == "cuda" and self._torch_device is not None:
                try:
                    return get_device(torch.cuda.get_device_name(self._torch_device))
                except Exception:
                    return detect_device()
            if self._kind == "cpu":
                return cpu_device()
            return None
        except Exception as e:  # never break training over a device name
            self._warn_once("device", f"costaware could not describe the device: {_reason_line(e)}")
            return None

    @property
    def _device_name(self) -> str | None:
        """What the measurements are recorded as: the device the fit runs on."""
        run = self._run_dev if self._run_dev is not None else self._dev
        return run.name if run is not None else None

    def _check_devices(self) -> None:
        """Warn (once) when the fit runs on another device than the one predicted for:
        its measurements are recorded as the device it ran on, and the refit learns
        them as such."""
        if self._dev is None or self._run_dev is None or self._dev.name == self._run_dev.name:
            return
        self._warn_once(
            "device-differs",
            f"costaware predicts for {self._dev.name} (device={self.device!r}), but this fit "
            f"runs on {self._run_dev.name}: its measurements are recorded as "
            f"{self._run_dev.name}'s, and the predictions do not describe this run.",
        )

    def _open_store(self) -> Any:
        if self._store_obj is not None or self._store_failed or self.store is None:
            return self._store_obj
        if not isinstance(self.store, (str, os.PathLike)):
            self._store_obj = self.store
            return self._store_obj
        try:
            from costaware.runtime.store import ObservationStore

            self._store_obj = ObservationStore(self.store, retry=True)  # server down: retried
        except Exception as e:
            self._store_failed = True
            self._warn_once(
                "store",
                f"costaware could not open the observation store {str(self.store)!r} "
                f"({_reason_line(e)}); records are kept in callback.records only.",
            )
        return self._store_obj

    def _already_predicted(self, study: str | None, trial: Any) -> bool:
        if trial is None:
            return False
        if any(
            r["kind"] == "prediction" and r["study"] == study and str(r["trial"]) == str(trial)
            for r in self.records
        ):
            return True
        store = self._store_obj
        if store is None or not hasattr(store, "predictions"):
            return False
        try:
            rows = store.predictions(study=study)
        except Exception as e:
            self._warn_once(
                "store-read", f"costaware could not read the observation store: {_reason_line(e)}"
            )
            return False
        return any(r.get("study") == study and str(r.get("trial")) == str(trial) for r in rows)

    def _predict(self) -> None:
        if self.spec is None or self._prediction_done:
            return
        self._prediction_done = True
        study, trial = self.study_name, self.trial_id
        if self._already_predicted(study, trial):
            return  # costaware's Optuna pruner predicted this trial before it launched
        predicted_for = self._dev.name if self._dev is not None else None
        fields: dict[str, Any] = {"study": study, "trial": trial, "device": predicted_for}
        summary: dict[str, Any] = {}
        try:
            if self._dev is None:
                raise RuntimeError("no device to predict for")
            model = self.model if self.model is not None else CostModel.default()
            pred = model.predict(self.spec, self._dev)
            feats = model.features(self.spec, self._dev)
            summary = self.spec.summary()
        except UserCodeError:
            raise  # the user's bug (the spec's factory, forward, shapes): fail fast
        except Exception as e:
            reason = _reason_line(e)
            self._warn_once(
                "predict",
                f"costaware could not predict this run's cost ({reason}); training goes on and "
                "its actual cost is still recorded.",
            )
            with contextlib.suppress(Exception):
                summary = self.spec.summary()
            self._write(
                "prediction",
                **fields,
                spec=summary,
                features=None,
                prediction=None,
                decision=None,
                status="error",
                reason=reason,
                meta=self._meta(None),
            )
            return
        self.prediction = pred
        self._write(
            "prediction",
            **fields,
            spec=summary,
            features=_plain(feats),
            prediction=_plain(pred.to_dict()),
            decision=None,
            status="admitted",
            reason=None,
            meta=self._meta(None),
        )

    # -- measuring ------------------------------------------------------------------------
    def _sync(self) -> None:
        if self._kind == "cuda" and self._torch_device is not None:
            torch.cuda.synchronize(self._torch_device)

    def _start_training(self, trainer: Any, pl_module: Any) -> None:
        if self._torch_device is None:  # on_fit_start did not run (fit hooks bypassed)
            self._start_fit(trainer, pl_module)
        self._training = True
        self._first_epoch = trainer.current_epoch
        dev = self._torch_device
        assert dev is not None
        if self._kind in ("cuda", "cpu"):
            self._device_use = self._setup_use or DeviceUse(device_key(dev))
            self._setup_use = None
        if self._kind == "cuda":
            assert self._device_use is not None
            if not self._device_use.alone:  # another trial of this process measures on it
                self._warn_once(
                    "shared-gpu",
                    "costaware: trials of this process train on the same GPU at once; their "
                    "peaks cannot be told apart, so each is recorded as the device's "
                    "(actual['device_peak_memory'], 'shared_by') and is not learned, and the "
                    "memory budget is not checked against it.",
                )
                self._sample_device_memory()
                return
            reserved = clear_cuda_cache(dev)  # the sanity check's and earlier trials' blocks
            torch.cuda.reset_peak_memory_stats(dev)
            if self._setup_held is not None:  # measured before the model was on the device
                self._held_before, self._setup_held = self._setup_held, None
            else:  # setup did not run: all but the model and optimizer (a DDP's gradient
                # buckets would count as held: they are allocated beside the model)
                own = _module_bytes(pl_module, "cuda") + _optimizer_bytes(
                    getattr(trainer, "optimizers", None), "cuda"
                )
                self._held_before = max(0, reserved - own)
            from costaware.observation import MAX_HELD_BEFORE

            if self._held_before > MAX_HELD_BEFORE:
                self._warn_once(
                    "held",
                    f"costaware: {self._held_before / 2**20:,.0f} MiB of GPU memory was already "
                    "reserved when training started, beyond this trial's model and optimizer "
                    "(an earlier trial's tensors still referenced?). The measured peak includes "
                    "it, so this trial's peak will not be used to refit the memory model.",
                )
            self._sample_device_memory()
        elif self._kind == "cpu":
            malloc_trim()
            self._cpu_memory = CpuMemoryMeter(
                f"over the first {_MEMORY_STEPS} training batches", "since on_train_start"
            ).start(self._device_use)
            if self._cpu_memory.rss_is_the_figure:
                # the resident set is the memory figure: from here to the end of fit, frees
                # of large blocks leave it at once (training runs slower meanwhile)
                self._exit_stack = contextlib.ExitStack()
                self._exit_stack.enter_context(self._cpu_memory.rss.freeing_large_blocks())
            # the parameters, buffers and any optimizer state were allocated before this
            # point; the prediction counts them, so they are added to what is measured
            self._module_nbytes = _module_bytes(pl_module, "cpu") + _optimizer_bytes(
                getattr(trainer, "optimizers", None), "cpu"
            )
            self._alloc_batches = 0

    def _start_epoch(self, trainer: Any) -> None:
        if not self._training:
            return
        self._epoch_start = time.perf_counter()
        self._batch_t0 = None
        self._last_batch_end = None
        self._val_start = None
        self._val_time = self._val_time_at_last_batch = 0.0
        self._epoch_batches = 0
        self._times = []
        self._warmup_times = []

    def _start_batch(self) -> None:
        if not self._training:
            return
        self._sync()
        self._batch_t0 = time.perf_counter()

    def _end_batch(self, trainer: Any) -> None:
        if not self._training or self._batch_t0 is None:
            return
        self._sync()
        now = time.perf_counter()
        dt = now - self._batch_t0
        self._batch_t0 = None
        self._last_batch_end = now
        self._val_time_at_last_batch = self._val_time
        if trainer.current_epoch == self._first_epoch and self._epoch_batches < self.warmup_steps:
            self._warmup_times.append(dt)
        else:
            self._times.append(dt)
        self._epoch_batches += 1
        if self._kind == "cuda":
            self._sample_device_memory()
        self._alloc_batches += 1
        if self._alloc_batches == _MEMORY_STEPS:
            self._stop_allocator_peak()

    def _stop_allocator_peak(self) -> None:
        """End the CPU allocator's profiling; its own work is not the epoch's."""
        if self._cpu_memory is None or not self._cpu_memory.profiling:
            return
        t0 = time.perf_counter()
        self._cpu_memory.end_profiling()
        self._val_time += time.perf_counter() - t0  # taken off the epoch time, as validation

    def _sample_device_memory(self) -> None:
        with contextlib.suppress(Exception):
            free, total = torch.cuda.mem_get_info(self._torch_device)
            used = int(total - free)
            self._nvml_peak = used if self._nvml_peak is None else max(self._nvml_peak, used)

    def _memory(self) -> dict[str, Any]:
        out: dict[str, Any] = {"peak_memory": None, "peak_allocated": None, "nvml_peak": None}
        use = self._device_use
        if self._kind == "cuda" and use is not None and use.shared_by > 1:
            dev = self._torch_device
            out["device_peak_memory"] = int(torch.cuda.max_memory_reserved(dev))
            out["device_peak_allocated"] = int(torch.cuda.max_memory_allocated(dev))
            out["shared_by"] = use.shared_by
            out["held_before"] = None
            self._sample_device_memory()
            out["nvml_peak"] = self._nvml_peak
            out["memory_method"] = (
                f"not this trial's own: {use.shared_by} trials of this process measured on "
                f"{use.key} at once, and the device's peaks count all of their tensors. "
                "device_peak_memory/device_peak_allocated: torch.cuda.max_memory_reserved/"
                "allocated of the device since its last peak reset (this trial's, if it "
                "started alone; else an earlier trial's or the process's start), which no "
                "trial resets or empties while another measures on the device; nvml_peak: "
                "highest device-wide used memory (cudaMemGetInfo) at batch ends"
            )
        elif self._kind == "cuda" and self._torch_device is not None:
            dev = self._torch_device
            out["peak_memory"] = int(torch.cuda.max_memory_reserved(dev))
            out["peak_allocated"] = int(torch.cuda.max_memory_allocated(dev))
            out["held_before"] = self._held_before if self._training else None
            self._sample_device_memory()
            out["nvml_peak"] = self._nvml_peak
            out["memory_method"] = (
                "torch.cuda.max_memory_reserved/allocated since on_train_start (cache emptied, "
                "peak stats reset there); nvml_peak: highest device-wide used memory "
                "(cudaMemGetInfo) at batch ends"
                if self._training
                else "torch.cuda.max_memory_reserved/allocated before training started "
                "(peak stats not reset: since the process started or the last reset)"
            )
        elif self._kind == "cpu" and self._cpu_memory is not None:
            self._stop_allocator_peak()  # if the run ended before batch 2
            meter = self._cpu_memory
            peak = meter.peak()
            if peak is None:
                out["memory_method"] = meter.method
            else:
                out["peak_memory"] = out["peak_allocated"] = peak + self._module_nbytes
                out["memory_method"] = f"{meter.method}, + parameter/buffer/optimizer-state bytes"
        else:
            out["memory_method"] = (
                "not measured before training started"
                if self._kind in ("cpu", "cuda")
                else f"not measured on {self._kind}"
            )
        return out

    def _actual(self) -> dict[str, Any]:
        times = self._times or self._warmup_times
        epoch_time = None
        if self._epoch_start is not None and self._last_batch_end is not None:
            epoch_time = max(
                0.0, self._last_batch_end - self._epoch_start - self._val_time_at_last_batch
            )
        mem = self._memory()
        return {
            "peak_memory": mem["peak_memory"],
            "peak_allocated": mem["peak_allocated"],
            "iteration_time": statistics.median(times) if times else None,
            "epoch_time": epoch_time,
            "nvml_peak": mem["nvml_peak"],
            "memory_method": mem["memory_method"],
            "device_kind": self._kind,
            "steps": self._epoch_batches,
        } | {
            k: mem[k]
            for k in ("held_before", "device_peak_memory", "device_peak_allocated", "shared_by")
            if k in mem
        } | ({"context_bytes": self._context} if self._context is not None else {})

    def _meta(self, trainer: Any) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "source": "lightning",
            "framework": self._namespace,
            "warmup_steps": self.warmup_steps,
        }
        if trainer is not None:
            meta["global_step"] = int(trainer.global_step)
            meta["max_epochs"] = trainer.max_epochs
        if self.spec is not None:
            with contextlib.suppress(Exception):
                meta["spec"] = self.spec.summary()
        return meta

    def _end_epoch(self, trainer: Any, pl_module: Any) -> str | None:
        """Record the epoch; the reason to stop it, if it was over budget."""
        if not self._training:
            return None
        epoch = int(trainer.current_epoch)
        actual = self._actual()
        if actual["epoch_time"] is not None:
            self._train_time += actual["epoch_time"]
        reason = self._over_budget(actual) if self.enforce else None
        if self.enforce:
            stop = bool(trainer.strategy.reduce_boolean_decision(reason is not None, all=False))
            if stop and reason is None:
                reason = "another process of this run exceeded the budget"
        self._write(
            "measurement",
            study=self.study_name,
            trial=self.trial_id,
            status="stopped" if reason else "ok",
            actual=actual,
            device=self._device_name,
            epoch=epoch,
            reason=reason,
            meta=self._meta(trainer),
        )
        self.epochs_recorded.append(epoch)
        self._epoch_start = None
        return reason

    # -- enforcement ----------------------------------------------------------------------
    def _over_budget(self, actual: Mapping[str, Any]) -> str | None:
        budget = self._judged_budget()
        if budget is None:
            return None
        try:
            reasons = budget.check_measured(
                device=self._dev,
                peak_memory=actual.get("peak_memory"),
                epoch_time=actual.get("epoch_time"),
                trial_time=self._train_time,
            )
        except Exception as e:  # a relative budget ("90%") without a known device
            self._warn_once("budget", f"costaware could not check the budget: {_reason_line(e)}")
            return None
        return "; ".join(r.message for r in reasons) or None

    def _judged_budget(self) -> Budget | None:
        """The budget this fit is judged against: the callback's own, else its Optuna
        study's pruner's (None: neither)."""
        return self.budget if self.budget is not None else _study_budget(self.trial)

    def _stop(self, trainer: Any, reason: str) -> None:
        self.stopped_reason = reason
        if _is_optuna_trial(self.trial):
            try:
                self.trial.set_user_attr("costaware_stopped", reason)
            except Exception as e:
                self._warn_once(
                    "user-attr", f"costaware could not set the trial's user attr: {_reason_line(e)}"
                )
            import optuna

            exc = optuna.TrialPruned(reason)
            self._raised = exc  # on_exception must not record it a second time
            raise exc
        trainer.should_stop = True

    # -- crashes --------------------------------------------------------------------------
    def _record_exception(self, trainer: Any, pl_module: Any, exc: BaseException) -> None:
        if exc is self._raised:
            return  # our own TrialPruned: the epoch was recorded as "stopped" already
        fn = getattr(getattr(trainer, "state", None), "fn", None)
        if fn is not None and fn != "fit":
            return  # validate/test/predict: not a training run
        if _is_trial_pruned(exc):
            status, reason = "stopped", "pruned by Optuna: " + _reason_line(exc)
        elif isinstance(exc, KeyboardInterrupt):
            status, reason = "stopped", "interrupted (KeyboardInterrupt)"
        elif _is_oom(exc):
            status, reason = "oom", _reason_line(exc)
        else:
            status, reason = "error", _reason_line(exc)
        if self._epoch_start is None:
            # between epochs (a pruner's TrialPruned at the epoch's end): that epoch is
            # recorded already, and this row records the stop alone
            actual: dict[str, Any] = {"device_kind": self._kind, "steps": 0}
        else:
            try:
                actual = self._actual()
            except Exception:  # a broken CUDA context may refuse even the memory stats
                actual = {"device_kind": self._kind, "steps": self._epoch_batches}
            # an epoch cut short is no epoch's time: kept apart, as time the trial spent
            actual["partial_epoch_time"] = actual.pop("epoch_time", None)
        self._write(
            "measurement",
            study=self.study_name,
            trial=self.trial_id,
            status=status,
            actual=actual,
            device=self._device_name,
            epoch=int(trainer.current_epoch),
            reason=reason,
            meta=self._meta(trainer),
        )
        if status == "oom" and _is_optuna_trial(self.trial):
            with contextlib.suppress(Exception):
                self.trial.set_user_attr("costaware_oom", reason)

    def _finish(self, *, keep_claim: bool = False) -> None:
        """End the run's measuring; with ``keep_claim``, the claim setup made on the device
        stays (fit is starting: it is this run's)."""
        self._training = False
        if not keep_claim and self._setup_use is not None:
            self._setup_use.close()
            self._setup_use = None
        if self._cpu_memory is not None:
            self._cpu_memory.close()  # never leave a profiler running past fit
        if self._device_use is not None:
            self._device_use.close()
        if self._exit_stack is not None:
            stack, self._exit_stack = self._exit_stack, None
            stack.close()  # restores glibc's mmap threshold

    # -- writing --------------------------------------------------------------------------
    def _write(self, kind: str, **fields: Any) -> dict[str, Any]:
        record: dict[str, Any] = {"kind": kind, **fields, "id": None}
        self.records.append(record)
        store = self._open_store() if self._rank_zero else None
        stored = False
        if store is not None:
            try:
                if kind == "prediction":
                    record["id"] = store.record_prediction(**fields)
                else:
                    record["id"] = store.record_measurement(**fields)
                stored = True
            except Exception as e:  # fail open: training matters more than the record
                self._warn_once(
                    "store-write",
                    f"costaware could not write to the observation store ({_reason_line(e)}); "
                    "records are kept in callback.records"
                    + (" and the trial's user attributes." if _is_optuna_trial(self.trial) else "."),
                )
        if not stored and kind == "measurement" and self._rank_zero and _is_optuna_trial(self.trial):
            self._tell_measured()  # no store, or one that failed: the report finds them there
        return record

    def _tell_measured(self) -> None:
        """Without a store (or when writing to it failed), keep the run's measurements in
        the Optuna trial's user attributes (:data:`MEASURED_ATTR`), so that a report of the
        study says how far off the predictions were: the store's rows in brief, the latest
        :data:`_MEASURED_KEPT` of them (one write per epoch)."""
        from costaware.integrations.optuna import ATTR

        rows = [
            {
                "status": r.get("status"),
                "epoch": r.get("epoch"),
                "device": r.get("device"),
                "reason": r.get("reason"),
                "actual": {
                    k: v
                    for k, v in (r.get("actual") or {}).items()
                    if k in _MEASURED_KEYS and v is not None
                },
            }
            for r in self.measurements[-_MEASURED_KEPT:]
        ]
        try:
            self.trial.set_user_attr(ATTR + MEASURED_ATTR, _plain(rows))
        except Exception as e:  # never break training over a record
            self._warn_once(
                "user-attr", f"costaware could not set the trial's user attr: {_reason_line(e)}"
            )

    def _safely(self, what: str, fn: Callable[..., _T], *args: Any) -> _T | None:
        """Run ``fn``; a failure of costaware's own bookkeeping warns once and never
        reaches the training loop."""
        try:
            return fn(*args)
        except UserCodeError:
            raise  # the user's bug is not bookkeeping: shown at once, as theirs
        except Exception as e:
            self._warn_once(
                f"failed:{what}",
                f"costaware's Lightning callback failed while {what} ({_reason_line(e)}); "
                "training goes on.",
            )
            return None

    def _check_trial_argument(self) -> None:
        """Warn once where ``trial=`` looks like an Optuna trial's number, or its study,
        given in place of the trial: without a budget nothing is then judged. A trial id
        that labels rows (with ``study=`` or a store, Ray's string ids) is left alone, and
        so is any ``trial`` with a budget."""
        trial = self.trial
        if trial is None or _is_optuna_trial(trial) or self.budget is not None:
            return
        number = isinstance(trial, numbers.Integral) and not isinstance(trial, bool)
        study = hasattr(trial, "study_name") and hasattr(trial, "optimize")  # optuna.Study
        if not (study or (number and self.study is None and self.store is None)):
            return
        given = f"trial={trial!r}" if number else f"trial=<{type(trial).__name__}>"
        self._warn_once(
            "trial",
            f"costaware: CostAwareCallback({given}) is not an Optuna trial, and the callback "
            "has no budget: nothing is judged before training (an id only labels the "
            "records). Pass trial=trial (the optuna.Trial the objective receives; its "
            "study's CostAwarePruner then judges it) or budget=ca.Budget(...).",
        )

    def _warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        warn_at_users_line(message)


#: the Optuna trial's user attribute (after ``"costaware:"``) that holds a storeless run's
#: measurements, and what of each is kept: the figures a report compares and sums
MEASURED_ATTR = "measured"
_MEASURED_KEYS = frozenset(
    {
        "peak_memory", "epoch_time", "partial_epoch_time", "iteration_time", "held_before",
        "device_kind", "memory_method", "steps",
    }
)  # fmt: skip
#: the measurements kept there: the latest ones (a trial of many epochs stays small)
_MEASURED_KEPT = 200


_DOC = """Record a run's real cost per epoch and, with ``enforce=True``, stop it over budget.

    Use with ``{trainer}``; see :mod:`costaware.integrations.lightning` for what is
    measured and how, and for the class to use with the other Lightning namespace.

    Every argument is a keyword. The earlier positional store,
    ``{name}("sqlite:///hpo.db", ...)``, still works with a ``FutureWarning`` that
    names the keyword.

    Args:
        store: an :class:`~costaware.runtime.store.ObservationStore`, a URL or path to open one
            (``"sqlite:///hpo.db"``; opened when fitting starts), or None: with a ``trial``
            of a study whose pruner is costaware's and has a store, that store; else the
            records are kept in memory only (``callback.records``, always kept). A store
            that cannot be opened or written only warns.
        spec: what is trained; without it, it is read off the fit
            (:func:`spec_from_lightning`) when the fit is judged. Its prediction is
            recorded (unless costaware's Optuna pruner already recorded this trial's).
        model: the :class:`~costaware.CostModel` that predicts; default
            ``CostModel.default()``.
        budget: the limits. Before training, the prediction is judged against them
            (with an Optuna trial and no budget, against the study's ``CostAwarePruner``'s,
            else the device's memory); during training, the measured figures are checked
            against ``max_epoch_time``, ``max_trial_time`` (training time so far) and
            ``max_memory`` (with the device's CUDA context added on a GPU) when
            ``enforce=True``.
        enforce: act on a budget: reject a fit predicted over it before its first batch
            (``on_reject``), and stop the run after an epoch measured over it. Without a
            ``budget``, the budget of the ``trial``'s study's ``CostAwarePruner``.
        device: the device predicted for: a catalog name, a :class:`~costaware.Device`, or
            ``"auto"`` (the Trainer's GPU, or the CPU). Measurements are recorded as the
            device the fit runs on; a difference is warned about.
        study: the study id of the rows; default: the Optuna trial's study name.
        trial: an ``optuna.trial.Trial`` (ids from ``trial.study.study_name`` and
            ``trial.number``; enforcement then raises ``optuna.TrialPruned``), or any trial
            id (a string or number) to label the rows with.
        warmup_steps: batches of the first epoch left out of the median iteration time.
        on_reject: without an Optuna trial, what a fit predicted over its budget does with
            ``enforce=True``: ``"raise"`` :class:`~costaware.TrialRejected` (default) or
            ``"stop"`` before its first batch. (With a trial it is pruned.)
        fail_open: a fit costaware cannot judge (its own failure) is trained with a
            warning (default) or rejected.
        judge_before: judge the fit before training (default); False leaves only the
            measured checks of ``enforce``.

    Attributes:
        records: every row as a dict: ``kind`` ("prediction"/"measurement"), the store's
            keyword arguments, and ``id`` (the store's row id, or None).
        measurements: the measurement records.
        prediction: the :class:`~costaware.Prediction`, when the fit was predicted.
        decision: the verdict of the judgement before training, or None.
        stopped_reason: why the run was rejected or stopped, or None.
"""


class _BatchSizeFinderBase:
    """Sets the batch size before training to the largest one predicted to fit.

    Lightning's ``BatchSizeFinder`` finds a batch size by running steps until one runs
    out of memory, and its answer can still run out later. This callback runs nothing:
    in ``setup``, before the model is on the device, it builds the fit's spec
    (:func:`spec_from_lightning`), searches the largest batch size ``budget`` admits on
    the device (:func:`costaware.core.batch_size.max_batch_size`: the calibrated upper bound
    of the memory the step needs, plus the CUDA context) and sets it where Lightning's
    finder does (``lightning_setattr``: the module's or the datamodule's ``attr_name``,
    or its ``hparams``). The training dataloader must read that attribute, as it must for
    Lightning's finder.

    Args:
        budget: the limits (default: the budget the fit is judged against, that of a
            ``CostAwareCallback`` of the Trainer's or its Optuna study's
            ``CostAwarePruner``; without either, ``Budget()``: the device's memory). Its
            ``safety_margin`` leaves room for what the step does not allocate itself.
        device: a catalog name, a ``Device`` or ``"auto"`` (the device the fit runs on).
        model: the cost model (default: the shipped one).
        attr_name: the attribute that holds the batch size (default ``"batch_size"``);
            ``batch_arg_name``, as Lightning's ``BatchSizeFinder`` calls it, is the same.
        limit: the largest batch size searched (and never more than the samples of one
            rank's epoch, where the training data says how many).
        headroom: the share by which the predicted memory need of the size set (its CUDA
            context apart) is grown before it is set against the limit (default
            :data:`~costaware.core.batch_size.DEFAULT_HEADROOM`, 2%).

    After ``setup``, ``result`` holds the :class:`~costaware.core.batch_size.BatchSizeResult`
    and ``optimal_batch_size`` the size set, as on Lightning's finder.
    Not even a batch of one fitting raises :class:`~costaware.NothingFitsError`, with the
    memory that batch needs.
    """

    _namespace = ""

    def __init__(
        self,
        *,
        budget: Budget | None = None,
        device: str | Device = "auto",
        model: CostModel | None = None,
        attr_name: str = "batch_size",
        limit: int = 65_536,
        batch_arg_name: str | None = None,
        headroom: float | None = None,
    ) -> None:
        if batch_arg_name is not None:  # Lightning's BatchSizeFinder spells it so
            if attr_name not in ("batch_size", batch_arg_name):
                raise ValueError(
                    f"attr_name={attr_name!r} and batch_arg_name={batch_arg_name!r} name two "
                    "attributes; give one of them."
                )
            attr_name = batch_arg_name
        if budget is not None and not isinstance(budget, Budget):
            raise TypeError(f"budget must be a costaware.Budget, but got {type(budget).__name__}.")
        from costaware.core.batch_size import check_headroom, check_limit

        check_limit(limit)
        if headroom is not None:
            check_headroom(headroom)
        if not isinstance(attr_name, str) or not attr_name:
            raise ValueError(f"attr_name must name an attribute, but got {attr_name=}.")
        self.budget = budget
        self.device = device
        self.model = model
        self.attr_name = attr_name
        self.limit = limit
        self.headroom = headroom
        self.result: Any = None

    @property
    def optimal_batch_size(self) -> int | None:
        """The batch size set (Lightning's ``BatchSizeFinder`` name), None before ``setup``."""
        return self.result.batch_size if self.result is not None and self.result.fits else None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self.result is not None:
            return
        _once_built(trainer, pl_module, lambda: self._set_batch_size(trainer, pl_module))

    def _set_batch_size(self, trainer: Any, pl_module: Any) -> None:
        parsing = importlib.import_module(f"{self._namespace}.utilities.parsing")
        if not parsing.lightning_hasattr(pl_module, self.attr_name):
            raise AttributeError(
                f"costaware cannot set the batch size: neither the module nor its datamodule "
                f"has an attribute {self.attr_name!r} (nor one in hparams). Keep the batch size "
                f"there and read it in train_dataloader(), or pass attr_name=."
            )
        from costaware.core.batch_size import NothingFitsError, max_batch_size

        spec = spec_from_lightning(trainer, pl_module)
        device = self.device
        if is_auto(device):
            root = trainer.strategy.root_device
            device = (
                get_device(torch.cuda.get_device_name(root))
                if root.type == "cuda"
                else cpu_device()
            )
        model = self.model if self.model is not None else CostModel.default()
        budget = self.budget if self.budget is not None else _fit_budget(trainer)
        limit, why = self.limit, ""
        if spec.dataset_size is not None:  # a batch is never larger than a rank's epoch
            samples = rank_samples(spec.dataset_size, spec.world_size)
            if samples < limit:
                limit, why = samples, f" (no larger than the {samples:,} samples an epoch has)"
        found = max_batch_size(model, spec, device, budget, limit=limit, headroom=self.headroom)
        self.result = found
        if not found.fits:
            raise NothingFitsError(str(found))
        parsing.lightning_setattr(pl_module, self.attr_name, found.batch_size)
        importlib.import_module(f"{self._namespace}.utilities.rank_zero").rank_zero_info(
            f"costaware set {self.attr_name}={found.batch_size}{why}: {found}"
        )


if _LightningCallback is not None:

    class CostAwareCallback(_CostAwareCallbackBase, _LightningCallback):
        _namespace = "lightning"

    CostAwareCallback.__doc__ = _DOC.format(
        trainer="lightning.pytorch.Trainer", name="CostAwareCallback"
    )

    class CostAwareBatchSizeFinder(_BatchSizeFinderBase, _LightningCallback):
        __doc__ = _BatchSizeFinderBase.__doc__
        _namespace = "lightning.pytorch"


if _PLCallback is not None:

    class PLCostAwareCallback(_CostAwareCallbackBase, _PLCallback):
        _namespace = "pytorch_lightning"

    PLCostAwareCallback.__doc__ = _DOC.format(
        trainer="pytorch_lightning.Trainer", name="PLCostAwareCallback"
    )

    class PLCostAwareBatchSizeFinder(_BatchSizeFinderBase, _PLCallback):
        __doc__ = _BatchSizeFinderBase.__doc__
        _namespace = "pytorch_lightning"


__all__ = [
    "CostAwareWarning",
    "lightning_parallel",
    "lightning_precision",
    "lightning_step_loss",
    "lightning_trial_length",
    "spec_from_lightning",
]
if _LightningCallback is not None:
    __all__ += ["CostAwareBatchSizeFinder", "CostAwareCallback"]
if _PLCallback is not None:
    __all__ += ["PLCostAwareBatchSizeFinder", "PLCostAwareCallback"]


def __getattr__(name: str) -> Any:
    if name == "CostAwareCallback":
        raise ImportError(
            "CostAwareCallback needs lightning.pytorch, which is not installed. Install it "
            f"with:\n    {_INSTALL_HINT}\n(or use PLCostAwareCallback with pytorch_lightning)."
        )
    if name in ("CostAwareBatchSizeFinder", "PLCostAwareBatchSizeFinder"):
        missing = "lightning.pytorch" if name.startswith("Cost") else "pytorch_lightning"
        raise ImportError(f"{name} needs {missing}, which is not installed: {_INSTALL_HINT}")
    if name == "PLCostAwareCallback":
        raise ImportError(
            "PLCostAwareCallback needs pytorch_lightning, which is not installed. Install it "
            "with:\n    pip install pytorch-lightning\n(or use CostAwareCallback with "
            "lightning.pytorch)."
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
