"""Sharded data-parallel training, one rank of it: FSDP (``FULL_SHARD``, ``SHARD_GRAD_OP``)
and DeepSpeed ZeRO stages 1-3, as one rank's dry run sees them.

A sharded spec (``TrainingSpec(world_size=n, sharding=...)``) is dry-run as one rank of
``n`` trains it. :class:`ShardedStep` plays in the dry run's recorder what the wrapper does
to memory, with fake tensors, so that the memory timeline (and the allocator replay of it)
holds one rank's bytes:

- **Units.** The modules of the ``wrap_policy`` classes are units of their own (FSDP's
  ``ModuleWrapPolicy``: each instance, innermost first), and the root holds the
  parameters no unit holds. Without a wrap policy FSDP wraps the root alone: the whole
  model is one unit, gathered whole, and its peak holds every parameter unsharded. ZeRO
  has no wrap policy: each module that holds parameters of its own is a unit (DeepSpeed
  fetches a module's parameters in its forward hook), unless ``wrap_policy`` says
  otherwise.
- **Shards.** Each unit's parameters are one flat parameter per dtype, as FSDP's
  ``FlatParamHandle`` flattens them with ``use_orig_params=True`` (Lightning's default):
  each parameter starts on a 16-byte boundary, and the total is padded to a multiple of
  the world size; a rank holds ``1/n`` of it (:func:`flat_numel`). Parameters
  (``full_shard``, ``shard_grad_op``, ``zero3``), gradients (those and ``zero2``) and the
  optimizer's state (every stage) are held as the rank's shards; the optimizer steps the
  shards, so its state and its step are ``1/n`` of the model's.
- **Gathers.** A unit's sharded parameters are all-gathered into its unsharded flat
  parameter in its forward pre-hook, and freed after its forward (``full_shard``,
  ``zero3``; not the root, which FSDP keeps for the backward) or after its backward
  (``shard_grad_op``). The backward gathers a unit again where it was freed, and gathers
  the next unit of the backward order before computing the current one's gradients (FSDP's
  default ``BackwardPrefetch.BACKWARD_PRE``): at the backward's peak two units are
  gathered. The forward prefetches nothing (FSDP's default ``forward_prefetch=False``).
- **Gradient reduce-scatter.** Once a unit's gradients are all computed, they are copied
  into one flat gradient of the unit's unsharded size, freed, and reduce-scattered into
  the rank's gradient shard (accumulated into it with gradient accumulation), as FSDP's
  post-backward hook does. ``no_shard`` (FSDP's ``NO_SHARD``, and what FSDP trains over
  one process) keeps the parameters, the flat gradient (all-reduced) and the optimizer's
  state whole.

Each all-gather and reduce-scatter is recorded with its bytes and phase
(:attr:`ShardedStep.collectives`) for :func:`collective_time`, which prices them on the
assumed link of :data:`~costaware.core.analytic.INTERCONNECT_BANDWIDTH`: a ring
all-gather or reduce-scatter of ``b`` unsharded bytes moves ``(n - 1) / n * b`` through
each rank's link. The forward's gathers are taken to overlap the forward's compute but
the first unit's, the backward's gathers and reduce-scatters the backward's but the last
reduce-scatter's, as far as the compute lasts; ZeRO-1/2's all-gather of the updated
parameters after the optimizer step is exposed whole. These are assumptions: no
multi-device time has been measured.

Not modelled: FSDP's ``HYBRID_SHARD``, CPU offload, a callable
(size-based) wrap policy, FSDP's mixed-precision policy (``MixedPrecision``: the spec's
precision is the parameters' own), DeepSpeed's own buffers (its reduce and all-gather
buckets, the contiguous gradient buffer, the fp32 master partition of a half-precision
run, ``stage3_param_persistence_threshold``), and NCCL's buffers.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from costaware.errors import SpecError
from costaware.spec import SHARDINGS, parse_sharding, parse_wrap_policy

__all__ = [
    "SHARDINGS",
    "ShardedStep",
    "Unit",
    "collective_time",
    "flat_numel",
    "parse_sharding",
    "parse_wrap_policy",
    "plan_units",
]

#: which of a unit's tensors a sharding keeps as the rank's shard, and whether it frees a
#: unit's gathered parameters after its forward: (parameters, gradients, reshard after
#: forward); every sharding shards the optimizer's state
_SHARDS = {
    "full_shard": (True, True, True),
    "shard_grad_op": (True, True, False),
    "zero3": (True, True, True),
    "zero2": (False, True, False),
    "zero1": (False, False, False),
    "no_shard": (False, True, False),
}
#: FSDP's alignment of each parameter in a flat parameter (``use_orig_params=True``)
_ALIGNMENT_BYTES = 16


def flat_offsets(numels: Iterable[int], element_size: int) -> list[int]:
    """Where each of tensors of ``numels`` elements starts in FSDP's flat parameter
    (``use_orig_params=True``): each after the first on a 16-byte boundary."""
    align = max(1, _ALIGNMENT_BYTES // element_size)
    total, starts = 0, []
    for n in numels:
        total += -total % align
        starts.append(total)
        total += n
    return starts


def flat_numel(numels: Iterable[int], element_size: int, world_size: int) -> int:
    """Elements of FSDP's unsharded flat parameter of tensors of ``numels`` elements
    (``use_orig_params=True``): each tensor after the first starts on a 16-byte boundary
    (:func:`flat_offsets`), and the total is padded to a multiple of ``world_size`` (each
    rank's shard is ``1/world_size`` of it)."""
    numels = list(numels)
    starts = flat_offsets(numels, element_size)
    total = starts[-1] + numels[-1] if numels else 0
    return total + -total % world_size


@dataclass
class Unit:
    """One sharded unit: a module and the parameters it holds, one flat group per dtype."""

    #: the module's path in the model ("" for the root)
    name: str
    module: nn.Module
    params: list[nn.Parameter]
    #: ``(dtype, unsharded flat elements)`` per flat group (see :func:`flat_numel`)
    flats: list[tuple[torch.dtype, int]]
    world_size: int
    #: per flat group: its parameters, in the order they are flattened
    groups: list[list[nn.Parameter]]

    @property
    def unsharded_bytes(self) -> int:
        return sum(n * d.itemsize for d, n in self.flats)

    @property
    def shard_bytes(self) -> int:
        return self.unsharded_bytes // self.world_size

    @property
    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.params if p.requires_grad]


def plan_units(
    model: nn.Module, sharding: str, world_size: int, wrap: Sequence[type[nn.Module]] = ()
) -> list[Unit]:
    """The units one rank of ``model`` shards under ``sharding`` over ``world_size``
    processes, root last, each holding its parameters (a parameter shared by several
    modules belongs to the first unit that holds it, innermost first).

    Raises:
        SpecError: ``wrap`` names classes of which ``model`` has no module.
    """
    wrap = tuple(wrap)
    named = list(model.named_modules())
    if wrap:
        chosen = [(n, m) for n, m in named if n and isinstance(m, wrap)]
        if not chosen and not isinstance(model, wrap):
            have = sorted({type(m).__name__ for _, m in named})
            raise SpecError(
                f"wrap_policy={tuple(c.__name__ for c in wrap)} matches no module of "
                f"{type(model).__name__}, whose modules are of the classes {have}: FSDP "
                "would wrap none of them, and gather the whole model at once. Give "
                "classes the model has (its repeated blocks), or leave wrap_policy out "
                "for that default."
            )
    elif sharding.startswith("zero"):  # DeepSpeed fetches each module's own parameters
        chosen = [(n, m) for n, m in named if n and any(True for _ in m.parameters(False))]
    else:
        chosen = []
    # innermost first (FSDP wraps bottom-up), so a module's parameters go to the deepest
    # unit that holds them; the root takes the rest
    chosen.sort(key=lambda nm: -nm[0].count("."))
    seen: set[int] = set()
    units: list[Unit] = []
    for name, module in [*chosen, ("", model)]:
        params = []
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        if not params:
            continue
        flats: list[tuple[torch.dtype, int]] = []
        groups = []
        for dtype in dict.fromkeys(p.dtype for p in params):
            group = [p for p in params if p.dtype == dtype]
            groups.append(group)
            numel = flat_numel([p.numel() for p in group], dtype.itemsize, world_size)
            flats.append((dtype, numel))
        units.append(Unit(name, module, params, flats, world_size, groups))
    return units


def _fresh(rec: Any, numel: int, dtype: torch.dtype, category: str) -> torch.Tensor:
    """A fake tensor of ``numel`` elements that the recorder holds as ``category`` from
    now until it is freed, made without a graph node (it is the wrapper's, not the
    step's)."""
    rec.paused = True
    try:
        t = torch.empty(numel, dtype=dtype)
    finally:
        rec.paused = False
    rec.label(t, category)
    return t


class ShardedStep:
    """One rank's sharded memory, played in a dry run's recorder (see the module's
    docstring). Built inside the dry run's fake mode on the model about to be traced:
    :meth:`setup` in place of labelling the parameters, :attr:`optimizer_params` for the
    optimizer, :meth:`after_backward` after each micro-batch's backward, and
    :meth:`close` at the end."""

    def __init__(
        self,
        model: nn.Module,
        sharding: str,
        world_size: int,
        wrap: Sequence[type[nn.Module]],
        rec: Any,
    ) -> None:
        self.model = model
        self.sharding = sharding
        self.world_size = world_size
        self.rec = rec
        self.shard_params, self.shard_grads, self.reshard = _SHARDS[sharding]
        #: what a rank holds of each flat group: 1/n of it, or all of it unsharded
        self.parts = 1 if sharding == "no_shard" else world_size
        self.units = plan_units(model, sharding, world_size, wrap)
        #: per unit: its gathered flat parameters while they are held
        self._gathered: dict[int, list[torch.Tensor]] = {}
        #: the units in the order their forward ran (the backward prefetches in reverse)
        self._order: list[int] = []
        self._arrived: dict[int, set[int]] = {}
        self._reduced: set[int] = set()
        self._handles: list[Any] = []
        #: what the optimizer steps: FSDP's, each trainable parameter's part of the rank's
        #: shard (``use_orig_params=True``: a view of the flat shard, its gradient a view of
        #: the flat gradient shard); ZeRO's, the rank's flat partition
        self.optimizer_params: list[nn.Parameter] = []
        #: per unit, per flat group: the optimizer's parameters in it and where they start
        self._views_of: list[list[list[tuple[nn.Parameter, int]]]] = []
        #: ``(phase, kind, unsharded bytes)`` of each collective of one micro-batch, in order,
        #: and of the optimizer step
        self.collectives: list[tuple[str, str, int]] = []
        self._micro = 0

    # setup ------------------------------------------------------------------------------
    def setup(self) -> None:
        """Hold the rank's parameter shards (or the whole parameters for ZeRO-1/2), make
        the optimizer's shard parameters, and hook the units."""
        rec = self.rec
        params = list(self.model.parameters())
        if self.shard_params:
            # the model's own (unsharded) parameters are what the gathers stand for: the
            # recorder knows their storages (a view of one is no new allocation) but holds
            # no bytes for them
            for p in {id(p): p for p in params}.values():
                _silent(rec, p)
        else:
            rec.label(params, "parameters")
        for unit in self.units:
            views_of = []
            for (dtype, numel), group in zip(unit.flats, unit.groups, strict=True):
                n = numel // self.parts
                rec.paused = True
                try:
                    shard = torch.empty(n, dtype=dtype)
                    views = self._views(shard, group)
                finally:
                    rec.paused = False
                if self.shard_params:
                    rec.label(shard, "parameters")
                else:  # ZeRO-1/2's partition, NO_SHARD's flat parameter: no bytes of its own
                    _silent(rec, shard)
                views_of.append(views)
                self.optimizer_params.extend(v for v, _ in views)
            self._views_of.append(views_of)
        for u, unit in enumerate(self.units):
            self._handles.append(unit.module.register_forward_pre_hook(self._pre_forward(u)))
            self._handles.append(unit.module.register_forward_hook(self._post_forward(u)))
            for p in unit.trainable:
                hook = self._accumulated(u)
                self._handles.append(p.register_post_accumulate_grad_hook(hook))  # type: ignore[no-untyped-call]

    def _views(
        self, shard: torch.Tensor, group: list[nn.Parameter]
    ) -> list[tuple[nn.Parameter, int]]:
        """The optimizer's parameters in the flat ``shard`` of ``group`` (the first rank's),
        each with where it starts in the shard."""
        if not any(p.requires_grad for p in group):
            return []
        if self.sharding.startswith("zero"):  # DeepSpeed steps its flat partition
            return [(nn.Parameter(shard[:]), 0)]
        end = shard.numel()
        starts = flat_offsets([p.numel() for p in group], shard.element_size())
        views = []
        for p, start in zip(group, starts, strict=True):
            a, b = start, min(start + p.numel(), end)
            if p.requires_grad and a < b:
                views.append((nn.Parameter(shard[a:b]), a))
        return views

    def _grad_shards(self, u: int) -> None:
        """Give unit ``u``'s optimizer parameters their gradients: one new flat gradient
        shard per group, each parameter's gradient a view of it (an earlier micro-batch's
        gradients take the new shard added into them, and it is freed)."""
        rec = self.rec
        for (dtype, numel), views in zip(self.units[u].flats, self._views_of[u], strict=True):
            flat = _fresh(rec, numel // self.parts, dtype, "gradients")
            if views and views[0][0].grad is None:
                rec.paused = True
                try:
                    for view, start in views:
                        view.grad = flat[start : start + view.numel()]
                finally:
                    rec.paused = False
            del flat  # held by the views' gradients, or added to theirs and freed

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._gathered.clear()

    # gathers ----------------------------------------------------------------------------
    def _gather(self, u: int, phase: str) -> None:
        if u in self._gathered or not self.shard_params:
            return
        unit = self.units[u]
        self._gathered[u] = [
            _fresh(self.rec, numel, dtype, "parameters") for dtype, numel in unit.flats
        ]
        self._collective(phase, "all_gather", unit.unsharded_bytes)

    def _release(self, u: int) -> None:
        self._gathered.pop(u, None)  # the fake storages die here: the recorder frees them

    def _collective(self, phase: str, kind: str, nbytes: int) -> None:
        if self._micro == 0:
            self.collectives.append((phase, kind, nbytes))

    def _pre_forward(self, u: int) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            if u not in self._order:
                self._order.append(u)
            self._gather(u, "forward")

        return hook

    def _post_forward(self, u: int) -> Any:
        root = self.units[u].name == ""

        def hook(module: nn.Module, args: Any, out: Any) -> None:
            if self.reshard and not root:
                self._release(u)
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(self._pre_backward(u))  # type: ignore[no-untyped-call]

        return hook

    def _pre_backward(self, u: int) -> Any:
        def hook(grad: torch.Tensor) -> None:
            if u in self._reduced:
                return
            self._gather(u, "backward")
            # prefetch: the unit whose forward ran before this one's
            if u in self._order:
                i = self._order.index(u)
                if i > 0 and self._order[i - 1] not in self._reduced:
                    self._gather(self._order[i - 1], "backward")

        return hook

    # gradients --------------------------------------------------------------------------
    def _accumulated(self, u: int) -> Any:
        def hook(p: torch.Tensor) -> None:
            arrived = self._arrived.setdefault(u, set())
            arrived.add(id(p))
            if self.shard_grads and len(arrived) == len(self.units[u].trainable):
                self._reduce(u)

        return hook

    def _reduce(self, u: int) -> None:
        """Reduce-scatter unit ``u``'s gradients into its gradient shards: the gradients
        copied into one flat gradient and freed, the rank's shard of it kept (added to the
        one an earlier micro-batch left), the flat gradient freed; then the unit's gathered
        parameters are freed."""
        unit = self.units[u]
        rec = self.rec
        grads = [p for p in unit.trainable if p.grad is not None]
        if grads:
            rec.label([p.grad for p in grads], "gradients")
            flat = [_fresh(rec, numel, dtype, "gradients") for dtype, numel in unit.flats]
            for p in grads:
                p.grad = None
            self._grad_shards(u)
            del flat
            kind = "all_reduce" if self.parts == 1 else "reduce_scatter"
            self._collective("backward", kind, unit.unsharded_bytes)
        self._reduced.add(u)
        self._release(u)

    def after_backward(self) -> None:
        """End a micro-batch's backward as FSDP's final callback does: reduce-scatter the
        units whose gradients did not all arrive, free every gathered unit; ZeRO-1 takes
        its gradient shards from the whole gradients here."""
        for u in range(len(self.units)):
            if u not in self._reduced and self.shard_grads:
                self._reduce(u)
        if not self.shard_grads:  # ZeRO-1: whole gradients, and the rank's partition
            for u, unit in enumerate(self.units):
                grads = [p.grad for p in unit.trainable if p.grad is not None]
                if not grads:
                    continue
                self.rec.label(grads, "gradients")
                self._grad_shards(u)
                self._collective("backward", "reduce_scatter", unit.unsharded_bytes)
        if self.sharding in ("zero1", "zero2"):  # the updated partitions all-gathered
            for unit in self.units:
                if unit.trainable:
                    self._collective("optimizer", "all_gather", unit.unsharded_bytes)
        for u in list(self._gathered):
            self._release(u)
        self._arrived.clear()
        self._reduced.clear()
        self._micro += 1

    def note(self) -> str:
        """What the dry run took the wrapper to do, in words: the units, the largest, and
        what no wrap policy means."""
        n = len(self.units)
        if not n:
            return f"{self.sharding} over {self.world_size} ranks: the model has no parameters"
        biggest = max(self.units, key=lambda u: u.unsharded_bytes)
        where = repr(biggest.name) if biggest.name else "the root"
        said = (
            f"{self.sharding} over {self.world_size} rank{'s' if self.world_size != 1 else ''}"
            f", per rank: {n} unit{'s' if n != 1 else ''} (the largest, {where}, "
            f"{biggest.unsharded_bytes / 2**20:.4g} MiB gathered); parameters, gradients "
            "and optimizer state as the rank's shards where the sharding shards them"
        )
        if n == 1 and not biggest.name and not self.sharding.startswith("zero"):
            said += (
                "; no wrap policy: the whole model is one FSDP unit, gathered whole at the "
                "peak (wrap_policy=(Block,) makes each Block a unit of its own)"
            )
        return said


def _silent(rec: Any, t: torch.Tensor) -> None:
    """Make the recorder know ``t``'s storage (so that a view of it is no new allocation)
    without holding any bytes for it."""
    st = t.untyped_storage()
    sid = id(st)
    if sid in rec._keys:
        return
    key = rec._next_key
    rec._next_key += 1
    rec._keys[sid] = key
    rec.key_category[key] = "parameters"
    weakref.finalize(st, rec._keys.pop, sid, None)


def collective_time(
    collectives: Sequence[tuple[str, str, int]],
    world_size: int,
    link: float,
    latency: float,
    forward: float,
    backward: float,
    grad_accumulation: int = 1,
) -> tuple[float, float]:
    """``(total, exposed)`` seconds per micro-batch step of a sharded step's all-gathers and
    reduce-scatters (``(phase, kind, unsharded bytes)`` in the order one micro-batch issues
    them, ``phase`` "forward", "backward" or "optimizer") on a link of ``link`` bytes/s,
    ``latency`` seconds each, beside ``forward`` and ``backward`` seconds of compute.

    A ring all-gather or reduce-scatter of ``b`` unsharded bytes moves ``(n - 1) / n * b``
    through each rank's link, an all-reduce twice that. The forward's first gather and the backward's last
    reduce-scatter are exposed; the others overlap the compute of their phase as far as
    it lasts; the optimizer step's (ZeRO-1/2's all-gather of the updated parameters) are
    exposed and run once per optimizer step.
    """
    n = world_size
    if n <= 1 or not collectives:
        return 0.0, 0.0

    def seconds(kind: str, nbytes: int) -> float:
        ring = 2 if kind == "all_reduce" else 1
        return ring * (n - 1) / n * nbytes / link + latency

    total = exposed = 0.0
    for phase, compute in (("forward", forward), ("backward", backward)):
        times = [seconds(k, b) for p, k, b in collectives if p == phase]
        if not times:
            continue
        alone = times[0] if phase == "forward" else times[-1]
        rest = sum(times) - alone
        total += sum(times)
        exposed += alone + max(0.0, rest - compute)
    step = sum(seconds(k, b) for p, k, b in collectives if p == "optimizer")
    step /= grad_accumulation
    return total + step, exposed + step
