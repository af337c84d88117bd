"""Sharded training per rank (FSDP, DeepSpeed ZeRO): the spec's sharding and wrap policy,
one rank's shards, gathers and reduce-scatters in the dry run against shard sizes worked
out by hand, the collectives' time as an assumption, and the Lightning strategies."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import costaware as ca
from costaware import zoo
from costaware.core.sharding import collective_time, flat_numel, plan_units
from costaware.core.trace import exact_live_peak


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))


def _spec(**kw: Any) -> ca.TrainingSpec:
    return ca.TrainingSpec(model=_mlp, batch=ca.ImageBatch((256,), classes=10), batch_size=64, **kw)


# the MLP's parameters: 256x1024 + 1024 in the first Linear, 1024x10 + 10 in the second;
# each starts on a 16-byte boundary (4 fp32 elements) in FSDP's flat parameter
FIRST = 256 * 1024 + 1024  # 263,168: a multiple of 4 and of 2
SECOND = 1024 * 10 + 10  # 10,250
WHOLE = 262144 + 1024 + 10240 + 10  # every start already aligned: 273,418, even


def _live_at(trace: Any, mark: str) -> int:
    """Bytes live (unrounded) where the first ``mark`` phase of the trace begins."""
    end = next(i for i, name in trace.marks if name == mark)
    live: dict[int, int] = {}
    for key, size in trace.events[:end]:
        if size > 0:
            live[int(key)] = int(size)
        else:
            live.pop(int(key), None)
    return sum(live.values())


# -- the spec ---------------------------------------------------------------------------
def test_sharding_over_one_process_says_what_to_change() -> None:
    with pytest.raises(ca.SpecError) as info:
        _spec(sharding="full_shard")
    said = str(info.value)
    assert "sharding='full_shard' shards over world_size processes, but world_size=1" in said
    assert "world_size=2 or more" in said and "leave sharding out" in said
    assert "sharding='no_shard'" in said  # what FSDP trains over one process
    assert _spec(sharding="no_shard").world_size == 1


@pytest.mark.parametrize("bad", ["hybrid_shard", "_hybrid_shard_zero2", "zero4", 3, True, "x"])
def test_an_unknown_sharding_lists_the_known_ones(bad: object) -> None:
    with pytest.raises(ca.SpecError) as info:
        _spec(world_size=2, sharding=bad)
    said = str(info.value)
    assert said.startswith("sharding must be one of ('full_shard', 'shard_grad_op', 'no_shard'")
    assert f"but got sharding={bad!r}" in said


def test_sharding_names_fsdps_and_deepspeeds_spellings() -> None:
    from torch.distributed.fsdp import ShardingStrategy

    assert _spec(world_size=2, sharding=ShardingStrategy.SHARD_GRAD_OP).sharding == "shard_grad_op"
    assert _spec(world_size=2, sharding="FULL_SHARD").sharding == "full_shard"
    assert _spec(world_size=2, sharding="fsdp").sharding == "full_shard"
    assert _spec(world_size=4, sharding="ZeRO-3").sharding == "zero3"
    assert _spec(world_size=2).sharding is None  # DDP


@pytest.mark.parametrize("bad", [nn.Linear(2, 2), "Linear", (nn.Linear, int), len, 3])
def test_a_bad_wrap_policy_says_what_a_wrap_policy_is(bad: object) -> None:
    with pytest.raises(ca.SpecError) as info:
        _spec(world_size=2, sharding="full_shard", wrap_policy=bad)
    said = str(info.value)
    assert said.startswith("wrap_policy must be the nn.Module classes FSDP wraps")
    assert f"but got wrap_policy={bad!r}" in said
    why = said.split(f"wrap_policy={bad!r}: ", 1)[1]
    if bad == "Linear":  # a name is not a callable policy: say to pass the class
        assert why.startswith("a class's name is not the class: pass the class itself")
    elif isinstance(bad, nn.Module):
        assert why == "pass the class (wrap_policy=Linear), not a module of it."
    elif bad is len:
        assert why == "a callable (size-based) policy is not modelled."
    else:
        assert why == "each entry must be an nn.Module subclass."


def test_a_wrap_policy_takes_classes_a_set_or_fsdps_module_wrap_policy() -> None:
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    for policy in (nn.Linear, (nn.Linear,), {nn.Linear}, ModuleWrapPolicy({nn.Linear})):
        spec = _spec(world_size=2, sharding="full_shard", wrap_policy=policy)
        assert spec.wrap_policy == (nn.Linear,)
    assert _spec(world_size=2, sharding="full_shard", wrap_policy=None).wrap_policy == ()


def test_a_wrap_policy_without_sharding_is_refused() -> None:
    with pytest.raises(ca.SpecError, match=r"wrap_policy=\('Linear',\) says which modules"):
        _spec(world_size=2, wrap_policy=nn.Linear)


def test_a_wrap_policy_the_model_does_not_have_names_its_classes() -> None:
    spec = _spec(world_size=2, sharding="full_shard", wrap_policy=nn.TransformerEncoderLayer)
    with pytest.raises(ca.SpecError) as info:
        ca.dry_run(spec)
    said = str(info.value)
    assert "wrap_policy=('TransformerEncoderLayer',) matches no module of Sequential" in said
    assert "['Linear', 'ReLU', 'Sequential']" in said
    assert "gather the whole model at once" in said


def test_the_sharding_is_in_the_key_and_the_summary() -> None:
    plain, ddp = _spec(), _spec(world_size=2)
    full = _spec(world_size=2, sharding="full_shard")
    wrapped = _spec(world_size=2, sharding="full_shard", wrap_policy=nn.Linear)
    four = _spec(world_size=4, sharding="full_shard")
    keys = {s.architecture_key() for s in (plain, ddp, full, wrapped, four)}
    assert len(keys) == 5
    assert wrapped.summary()["sharding"] == "full_shard"
    assert wrapped.summary()["wrap_policy"] == ["Linear"]
    assert "bucket_cap_mb" not in wrapped.summary()


# -- shards worked out by hand ----------------------------------------------------------
def test_flat_parameters_pad_as_fsdp_pads_them() -> None:
    # fp32 (4 elements to 16 bytes): 10, pad 2, 3, pad 1, 7 = 23; padded to 4 ranks: 24
    assert flat_numel([10, 3, 7], 4, world_size=4) == 24
    assert flat_numel([10, 3, 7], 4, world_size=3) == 24
    assert flat_numel([10, 3, 7], 4, world_size=5) == 25
    # bf16 (8 elements to 16 bytes): 10, pad 6, 3, pad 5, 7 = 31; to 2 ranks: 32
    assert flat_numel([10, 3, 7], 2, world_size=2) == 32
    assert flat_numel([WHOLE], 4, world_size=2) == WHOLE


def test_the_units_of_a_wrap_policy_and_of_none() -> None:
    (root,) = plan_units(_mlp(), "full_shard", 2)
    assert root.name == "" and root.flats == [(torch.float32, WHOLE)]
    first, second = plan_units(_mlp(), "full_shard", 2, (nn.Linear,))
    assert (first.name, first.flats) == ("0", [(torch.float32, FIRST)])
    assert (second.name, second.flats) == ("2", [(torch.float32, SECOND)])
    assert second.shard_bytes == SECOND // 2 * 4
    # ZeRO without a policy: each module with parameters of its own
    assert [u.name for u in plan_units(_mlp(), "zero3", 2)] == ["0", "2"]
    # a tied weight belongs to the first unit that holds it
    tied = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16, bias=False))
    tied[1].weight = tied[0].weight
    assert sum(len(u.params) for u in plan_units(tied, "full_shard", 2, (nn.Linear,))) == 1


def test_a_rank_holds_its_shards_and_gathers_the_whole_model_without_a_policy() -> None:
    trace = ca.dry_run(_spec(world_size=2, sharding="full_shard"))
    shard = WHOLE // 2 * 4  # 546,836 bytes
    assert _live_at(trace, "step") == shard  # the shard alone before the step
    assert trace.gradient_bytes == 547_328  # the gradient shard (512-byte rounded)
    # AdamW: two moments of the shard, and one fp32 step counter (rounded to 512 B)
    assert trace.optimizer_state_bytes == 2 * 547_328 + 512
    # the peak (the reduce-scatter) holds the shard, the whole gathered model, and its
    # gradients both as the autograd left them and as one flat gradient
    assert trace.peak_breakdown["parameters"] == 547_328 + 1_093_632 + 512  # 512-B rounded
    assert trace.peak_breakdown["gradients"] == 2 * 1_094_144
    whole = WHOLE * 4
    assert trace.collectives == (
        ("forward", "all_gather", whole),
        ("backward", "reduce_scatter", whole),
    )  # the root is kept from its forward to its backward: no second gather


def test_wrapped_units_are_gathered_one_at_a_time_and_prefetched_in_the_backward() -> None:
    full = ca.dry_run(_spec(world_size=2, sharding="full_shard", wrap_policy=nn.Linear))
    a, b = FIRST * 4, SECOND * 4
    assert full.collectives == (
        ("forward", "all_gather", a),
        ("forward", "all_gather", b),
        ("backward", "all_gather", b),  # the last unit again, then the first prefetched
        ("backward", "all_gather", a),
        ("backward", "reduce_scatter", b),
        ("backward", "reduce_scatter", a),
    )
    grad_op = ca.dry_run(_spec(world_size=2, sharding="shard_grad_op", wrap_policy=nn.Linear))
    assert [c for c in grad_op.collectives if c[0] == "backward"] == [
        ("backward", "reduce_scatter", b),
        ("backward", "reduce_scatter", a),
    ]  # kept from the forward to the backward
    assert _live_at(full, "step") == (FIRST + SECOND) // 2 * 4
    whole = exact_live_peak(ca.dry_run(_spec(world_size=2, sharding="full_shard")).events)
    assert exact_live_peak(full.events) < whole


def test_zero_stages_shard_what_they_say() -> None:
    full = 1_093_672  # the MLP's fp32 parameters, bytes
    one = ca.dry_run(_spec(world_size=2, sharding="zero1"))
    two = ca.dry_run(_spec(world_size=2, sharding="zero2"))
    three = ca.dry_run(_spec(world_size=2, sharding="zero3"))
    assert _live_at(one, "step") == _live_at(two, "step") == full  # whole parameters
    assert _live_at(three, "step") == (FIRST + SECOND) // 2 * 4
    for trace in (one, two, three):  # the optimizer steps the rank's shards
        assert trace.optimizer_state_bytes < 0.51 * 2 * full + 1024
    assert exact_live_peak(two.events) < exact_live_peak(one.events)
    assert ("optimizer", "all_gather", FIRST * 4) in one.collectives


def test_no_shard_keeps_fsdps_flat_gradient_whole() -> None:
    """FSDP over one process (NO_SHARD): whole parameters and optimizer state, and each
    unit's gradients copied into one flat gradient that stays: one more copy of the
    gradients at the peak than a plain step holds."""
    one = ca.dry_run(_spec(sharding="no_shard"))
    plain = ca.dry_run(_spec())
    assert _live_at(one, "step") == _live_at(plain, "step") == 1_093_672
    # one flat state tensor per moment against four (each rounded to 512 B)
    assert one.optimizer_state_bytes == pytest.approx(plain.optimizer_state_bytes, abs=2048)
    assert one.collectives == (("backward", "all_reduce", WHOLE * 4),)
    # with SGD (no state) the peak is the backward's: both copies of the gradients
    sgd = ca.dry_run(_spec(sharding="no_shard", optimizer="sgd"))
    assert sgd.peak_breakdown["gradients"] == 2 * 1_094_144
    assert sgd.peak_live > ca.dry_run(_spec(optimizer="sgd")).peak_live


def test_a_second_step_holds_no_more_than_the_first() -> None:
    """Step 2 repeats step 1's gathers and frees: nothing of the first is left over."""
    trace = ca.dry_run(_spec(world_size=2, sharding="full_shard", wrap_policy=nn.Linear))
    assert _live_at(trace, "end") > 0
    ends = [i for i, name in trace.marks if name == "end"]
    assert len(ends) == 2
    held = []
    for end in ends:
        live: dict[int, int] = {}
        for key, size in trace.events[:end]:
            if size > 0:
                live[int(key)] = int(size)
            else:
                live.pop(int(key), None)
        held.append(sum(live.values()))
    assert held[0] == held[1]


# -- time -------------------------------------------------------------------------------
def test_collective_time_overlaps_all_but_the_first_gather_and_the_last_reduce() -> None:
    b = 10**9
    coll = [("forward", "all_gather", b), ("forward", "all_gather", b)]
    coll += [("backward", "reduce_scatter", b), ("backward", "reduce_scatter", b)]
    one = 0.5 * b / 1e9  # (n - 1) / n of the bytes at 1 GB/s, 2 ranks
    total, exposed = collective_time(coll, 2, 1e9, 0.0, forward=10.0, backward=10.0)
    assert total == pytest.approx(4 * one)
    assert exposed == pytest.approx(2 * one)  # the rest hides behind 10 s of compute
    _, short = collective_time(coll, 2, 1e9, 0.0, forward=0.1, backward=0.1)
    assert short == pytest.approx(2 * one + 2 * (one - 0.1))
    assert collective_time(coll, 1, 1e9, 0.0, 1.0, 1.0) == (0.0, 0.0)


def test_the_collectives_time_is_added_as_a_stated_assumption() -> None:
    model = ca.CostModel()
    alone = model.predict(_spec(), "H100")
    whole = model.predict(_spec(world_size=8, sharding="full_shard"), "H100")
    wrapped = model.predict(
        _spec(world_size=8, sharding="full_shard", wrap_policy=nn.Linear), "H100"
    )
    assert "exposed_allreduce" not in alone.basis
    assert whole.basis["exposed_allreduce"] > 0 and wrapped.basis["exposed_allreduce"] > 0
    assert whole.iteration_time > alone.iteration_time
    (note,) = [n for n in whole.notes if n.startswith("sharded (full_shard) over 8 ranks")]
    assert "450 GB/s" in note and "an assumption, not measured" in note
    assert whole.spec["sharding"] == "full_shard"
    (unit,) = [n for n in whole.notes if "1 unit (the largest, the root" in n]
    assert "no wrap policy: the whole model is one FSDP unit, gathered whole" in unit
    assert not any("no wrap policy" in n for n in wrapped.notes)


# -- Lightning ---------------------------------------------------------------------------
def _namespace(name: str) -> Any:
    return importlib.import_module("lightning.pytorch" if name == "lightning" else name)


def _trainer(ns: Any, devices: int, strategy: Any) -> Any:
    """A real Trainer with Lightning's FSDP strategy, which takes a GPU accelerator: this
    one stands in for CUDA (the machine has no GPU), and the Trainer is never fit."""

    class StandInCUDA(ns.accelerators.CUDAAccelerator):  # type: ignore[misc,name-defined]
        @staticmethod
        def is_available() -> bool:
            return True

        @staticmethod
        def parse_devices(devices: Any) -> list[int]:
            return list(range(devices))

        @staticmethod
        def get_parallel_devices(devices: Any) -> list[torch.device]:
            return [torch.device("cuda", i) for i in devices]

        def setup_device(self, device: torch.device) -> None:
            pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ns.Trainer(
            accelerator=StandInCUDA(), devices=devices, strategy=strategy, logger=False,
            enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip


@pytest.mark.parametrize("ns_name", ["lightning", "pytorch_lightning"])
def test_the_trainers_fsdp_strategy_becomes_the_specs_sharding(ns_name: str) -> None:
    from costaware.integrations.lightning import lightning_parallel

    ns = _namespace(ns_name)
    FSDP = ns.strategies.FSDPStrategy
    by_name = _trainer(ns, 4, "fsdp")
    assert lightning_parallel(by_name) == {
        "world_size": 4,
        "sharding": "full_shard",
        "wrap_policy": (),
    }
    grad_op = _trainer(ns, 2, FSDP(auto_wrap_policy={nn.Linear}, sharding_strategy="SHARD_GRAD_OP"))
    found = lightning_parallel(grad_op)
    assert found == {"world_size": 2, "sharding": "shard_grad_op", "wrap_policy": (nn.Linear,)}
    _spec(**found)  # a valid spec
    one = {"world_size": 1, "sharding": "no_shard", "wrap_policy": ()}
    assert lightning_parallel(_trainer(ns, 1, FSDP())) == one  # FSDP switches to NO_SHARD

    with pytest.raises(ca.CostawareError, match=r"shards with HYBRID_SHARD, which costaware"):
        hybrid = FSDP(sharding_strategy="HYBRID_SHARD", auto_wrap_policy={nn.Linear})
        lightning_parallel(_trainer(ns, 2, hybrid))
    with pytest.raises(ca.CostawareError, match=r"offloads the parameters to the CPU"):
        lightning_parallel(_trainer(ns, 2, FSDP(cpu_offload=True)))
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    sized = FSDP(auto_wrap_policy=size_based_auto_wrap_policy)
    with pytest.raises(ca.CostawareError, match=r"wraps by the policy .* wrap_policy=\(Block,\)"):
        lightning_parallel(_trainer(ns, 2, sized))


def test_a_deepspeed_strategy_becomes_its_zero_stage() -> None:
    """DeepSpeed is not installed here (Lightning's strategy cannot be built without it):
    what counts is the strategy's name and its config, as Lightning keeps it."""
    from costaware.integrations.lightning import lightning_parallel

    def trainer(config: Any) -> Any:
        class DeepSpeedStrategy:
            pass

        strategy = DeepSpeedStrategy()
        strategy.config = config  # type: ignore[attr-defined]
        return type("Trainer", (), {"world_size": 2, "strategy": strategy})()

    for stage in (1, 2, 3):
        found = lightning_parallel(trainer({"zero_optimization": {"stage": stage}}))
        assert found == {"world_size": 2, "sharding": f"zero{stage}"}
    with pytest.raises(ca.CostawareError, match=r"runs ZeRO stage 0 .* stages 1, 2 and 3"):
        lightning_parallel(trainer({"zero_optimization": {"stage": 0}}))
    with pytest.raises(ca.CostawareError, match=r"runs ZeRO stage None"):
        lightning_parallel(trainer(None))
    offload = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}
    with pytest.raises(ca.CostawareError, match=r"offloads \(offload_param\)"):
        lightning_parallel(trainer(offload))


def test_a_ranks_learned_time_is_one_gpus_step_less_the_sharded_work_plus_collectives() -> None:
    """The shipped model learned single-GPU steps only: a rank's step is predicted as the
    same step on one GPU (learned) scaled by the roofline work the rank still does, then
    the collectives. Fitted to a rank's own features (flat parameters, a share of the
    memory) the correction put an SGD step, which shards no optimizer state, below one
    GPU's step, its communication included."""

    def gpt(**kw: Any) -> ca.TrainingSpec:
        return ca.TrainingSpec(
            model=lambda: zoo.gpt(dim=256, depth=4, seq_len=256, heads=4),
            batch=ca.TokenBatch(256, 8192),
            batch_size=8,
            precision="bf16",
            optimizer="sgd",
            **kw,
        )

    model = ca.CostModel.default()
    alone = model.predict(gpt(), "H100")
    ranks = [
        model.predict(gpt(**kw), "H100")
        for kw in (
            {"world_size": 8},
            {"world_size": 8, "sharding": "full_shard"},
            {"world_size": 4, "sharding": "zero2"},
        )
    ]
    for rank in ranks:
        work = rank.basis["analytic_time"] / alone.basis["analytic_time"]
        assert rank.iteration_time >= alone.iteration_time * work, rank.spec
    for rank in ranks:
        scale = rank.basis["rank_compute_scale"]
        assert 0.9 < scale <= 1.0  # SGD: the shards remove next to no work
        compute = rank.iteration_time - rank.basis.get("exposed_allreduce", 0.0)
        assert compute == pytest.approx(alone.iteration_time * scale, rel=1e-6)
        assert any(n.startswith("time per rank: the learned time of this step") for n in rank.notes)
        hi = rank.iteration_time_upper - rank.basis.get("exposed_allreduce", 0.0)
        assert hi == pytest.approx(alone.iteration_time_upper * scale, rel=1e-6)
