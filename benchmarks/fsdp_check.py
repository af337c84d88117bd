"""FSDP per rank on this machine's CPU: the dry run's peak against a real 2-process run.

Each rank of a real ``FullyShardedDataParallel`` run (FSDP1, as Lightning's
``FSDPStrategy`` wraps: ``use_orig_params=True``, ``device_id=cpu``; gloo,
``torch.multiprocessing`` spawn, one torch thread per rank) builds the model, wraps it
(``ModuleWrapPolicy`` of the spec's ``wrap_policy``, or none), and trains three steps on
its own batch. torch's thread-local profiler records the CPU allocator's events from the
build on; the rank's training peak is the highest running total over the steps (the
shards and optimizer state it holds included), and the wrap's peak (the model built
whole, then sharded) is shown beside it. The median step time of steps 4-13 is timed too.

The thread-local profiler does not see what another thread frees: a tensor the training
thread allocated and gloo's worker thread released last (a unit's flat gradient, the
reduce-scatter's input) would stay in the running total, at random in some runs and ranks
and not others. So while the peak is measured each collective FSDP calls keeps its work in
the training thread until gloo's thread is done with it (:func:`_settled`), and each
configuration runs ``--repeats`` times, each rank's lowest peak its figure and the highest
shown beside it.
With one process FSDP trains unsharded (``NO_SHARD``): its prediction is the spec's
with ``sharding="no_shard"``.

The prediction is ``CostModel().predict(spec, "cpu")`` of the spec with ``world_size``
and ``sharding``: the live-tensor peak of one rank's dry run (its shards, gathers and
reduce-scatters; :mod:`costaware.core.sharding`), and the roofline with the exposed
collectives (an assumed loopback bandwidth for gloo on one machine).

Usage: python benchmarks/fsdp_check.py [--world-sizes 1,2] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

CONFIGS = {
    "mlp 256-1024-1024-10 bs64 adamw, full_shard, no wrap": "ca.TrainingSpec(model=functools.partial(zoo.mlp, 256, (1024, 1024), 10), batch=ca.ImageBatch((256,), classes=10), batch_size=64, world_size=2, sharding='full_shard')",
    "mlp 256-1024-1024-10 bs64 adamw, full_shard, Linear": "ca.TrainingSpec(model=functools.partial(zoo.mlp, 256, (1024, 1024), 10), batch=ca.ImageBatch((256,), classes=10), batch_size=64, world_size=2, sharding='full_shard', wrap_policy=nn.Linear)",
    "mlp 256-1024-1024-10 bs64 adamw, shard_grad_op, Linear": "ca.TrainingSpec(model=functools.partial(zoo.mlp, 256, (1024, 1024), 10), batch=ca.ImageBatch((256,), classes=10), batch_size=64, world_size=2, sharding='shard_grad_op', wrap_policy=nn.Linear)",
    "mlp 784-2048-2048-10 bs32 sgd-momentum, full_shard, Linear": "ca.TrainingSpec(model=functools.partial(zoo.mlp, 784, (2048, 2048), 10), batch=ca.ImageBatch((784,), classes=10), batch_size=32, optimizer='sgd', optimizer_kwargs={'momentum': 0.9}, world_size=2, sharding='full_shard', wrap_policy=nn.Linear)",
    "gpt d128 L2 T128 bs4 adamw, full_shard, block": "ca.TrainingSpec(model=functools.partial(zoo.gpt, vocab=4096, seq_len=128, dim=128, depth=2, heads=4), batch=ca.TokenBatch(128, 4096), batch_size=4, world_size=2, sharding='full_shard', wrap_policy=_PreLNBlock)",
}
_MARK = "fsdp_check:"


def _spec(expr: str, world: int) -> Any:
    import dataclasses
    import functools  # noqa: F401

    from torch import nn  # noqa: F401

    import costaware as ca  # noqa: F401
    from costaware import zoo  # noqa: F401
    from costaware.zoo._layers import _PreLNBlock  # noqa: F401  (the GPT block, a unit)

    spec = eval(expr)  # written with world_size=2
    if world == 1:  # one process: FSDP trains unsharded (NO_SHARD)
        return dataclasses.replace(spec, world_size=1, sharding="no_shard")
    return dataclasses.replace(spec, world_size=world)


def _running_peaks(thread_records: Any) -> dict[str, tuple[int, int]]:
    """The running total of the CPU allocator's events where each span that
    ``record_function(_MARK + name)`` opened begins, and its highest in the span (a span
    lasts until the next one opens)."""
    events = []
    for i, records in enumerate(thread_records):
        for j, rec in enumerate(records):
            kind = rec.kind()
            if kind == "memory_alloc" and rec.cpu_memory_usage() != 0:
                events.append((int(rec.start_us()), 1, i, j, int(rec.cpu_memory_usage()), ""))
            elif kind == "push" and rec.name().startswith(_MARK):
                events.append((int(rec.start_us()), 0, i, j, 0, rec.name()[len(_MARK) :]))
    events.sort()
    total, span, peaks = 0, "", {"": (0, 0)}
    for _, is_alloc, _, _, nbytes, name in events:
        if not is_alloc:
            span = name
            peaks[span] = (total, total)
        else:
            total += nbytes
            peaks[span] = (peaks[span][0], max(peaks[span][1], total))
    return peaks


def _settled(fn: Any) -> Any:
    """``fn`` (a collective of ``torch.distributed``) run as FSDP runs it, whose buffers the
    training thread frees where its profiler sees it: gloo's ``reduce_scatter`` clones its
    input into a buffer that the collective's work object holds, and whichever thread lets
    go of the work last frees it. The work is kept in the training thread until gloo's
    worker thread is done with it (a few milliseconds), then let go."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("async_op"):
            return fn(*args, **kwargs)
        work = fn(*args, **kwargs, async_op=True)
        work.wait()
        time.sleep(0.01)
        del work
        return None

    return call


def rank_run(rank: int, world: int, expr: str, port: int, out: Any) -> None:
    """One rank: the CPU allocator's peaks of the wrap and of three steps; step times."""
    import torch
    import torch.distributed as dist
    from torch._C._autograd import _disable_profiler_legacy, _enable_profiler_legacy
    from torch._C._profiler import ProfilerConfig, ProfilerState, _ExperimentalConfig
    from torch.autograd.profiler import record_function
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from costaware.spec import default_loss

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    collectives = {n: getattr(dist, n) for n in ("reduce_scatter_single", "all_gather_single")}
    for name, fn in collectives.items():
        setattr(dist, name, _settled(fn))
    spec = _spec(expr, world)
    sharding = _spec(expr, 2).sharding
    loss_fn = spec.loss or default_loss
    config = ProfilerConfig(
        ProfilerState.CPU, False, True, False, False, False, _ExperimentalConfig()
    )
    _enable_profiler_legacy(config)
    with record_function(_MARK + "wrap"):
        model = spec.model()
        policy = ModuleWrapPolicy(set(spec.wrap_policy)) if spec.wrap_policy else None
        strategy = ShardingStrategy[sharding.upper()]
        fsdp = FullyShardedDataParallel(
            model,
            sharding_strategy=strategy,
            auto_wrap_policy=policy,
            device_id=torch.device("cpu"),
            use_orig_params=True,
        )
        opt = spec.optimizer_class(fsdp.parameters(), **spec.optimizer_kwargs)
    for i in range(3):
        with record_function(_MARK + f"step{i}"):
            loss = loss_fn(fsdp, spec.batch_spec.make(spec.batch_size))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss
    with record_function(_MARK + "end"):
        pass
    peaks = _running_peaks(_disable_profiler_legacy())
    for name, fn in collectives.items():  # timed as FSDP runs
        setattr(dist, name, fn)
    # the running total over the steps; a block freed by gloo's worker thread (which the
    # thread-local profiler does not see) stays in it from then on
    steps = max(peaks[f"step{i}"][1] for i in range(3))
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        loss_fn(fsdp, spec.batch_spec.make(spec.batch_size)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    out.put((rank, peaks["wrap"][1], steps, statistics.median(times)))
    dist.destroy_process_group()


def measure(expr: str, world: int, port: int) -> list[tuple[int, int, int, float]]:
    """Each rank's (rank, wrap peak, training peak, median step seconds) of a real run."""
    from ddp_check import run_ranks  # this folder: the script's own

    return run_ranks(rank_run, world, expr, port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", default="2")
    parser.add_argument("--only", default="", help="only the configurations naming this")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each (default 3)")
    args = parser.parse_args()

    import costaware as ca

    print(
        f"| {'configuration':<58} | {'ranks':>5} | {'dry-run peak':>12} "
        f"| {'measured (per rank)':>21} | {'error':>7} | {'highest run':>21} "
        f"| {'wrap peak':>9} | {'time pred.':>10} | {'measured':>9} |"
    )
    print(
        f"|{'-' * 60}|{'-' * 7}|{'-' * 14}|{'-' * 23}|{'-' * 9}|{'-' * 23}|{'-' * 11}"
        f"|{'-' * 12}|{'-' * 11}|"
    )
    port = 29640
    for name, expr in CONFIGS.items():
        if args.only not in name:
            continue
        for world in (int(w) for w in args.world_sizes.split(",")):
            pred = ca.CostModel().predict(_spec(expr, world), device="cpu")
            runs = []
            for _ in range(args.repeats):
                port += 1
                runs.append(measure(expr, world, port))
            # per rank, the lowest of the runs: a free on gloo's thread only ever adds
            peaks = [min(run[r][2] for run in runs) for r in range(world)]
            highest = [max(run[r][2] for run in runs) for r in range(world)]
            err = (pred.peak_memory - max(peaks)) / max(peaks)
            step = statistics.median(t for run in runs for *_, t in run)
            shown = " / ".join(f"{p / 2**20:,.2f}" for p in peaks) + " MiB"
            raw = " / ".join(f"{p / 2**20:,.2f}" for p in highest) + " MiB"
            wrap = max(w for run in runs for _, w, _, _ in run)
            print(
                f"| {name:<58} | {world:>5} | {pred.peak_memory / 2**20:>8,.2f} MiB "
                f"| {shown:>21} | {err:>+6.2%} | {raw:>21} | {wrap / 2**20:>5,.2f} MiB "
                f"| {pred.iteration_time * 1e3:>7.1f} ms | {step * 1e3:>6.1f} ms |"
            )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
