"""DDP per rank on this machine's CPU: the dry run's peak against a real 2-process run.

Each rank of a real ``DistributedDataParallel`` run (gloo, ``torch.multiprocessing``
spawn, one torch thread per rank) builds the model, wraps it, and trains three steps on
its own batch while :class:`costaware.measure.profile.AllocatorPeak` reads the CPU allocator's
peak; the median step time of steps 2-11 is timed too. The prediction is
``CostModel().predict(spec, "cpu")`` of the spec with ``world_size``: the live-tensor peak
with DDP's gradient buckets, and the roofline with the exposed all-reduce (an assumed
loopback bandwidth for gloo on one machine; see :mod:`costaware.core.analytic`).

Usage: python benchmarks/ddp_check.py [--world-sizes 1,2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

CONFIGS = {
    "mlp 256-1024-10 bs64 adamw": "ca.TrainingSpec(model=functools.partial(zoo.mlp, 256, (1024,), 10), batch=ca.ImageBatch((256,), classes=10), batch_size=64)",
    "mlp 784-2048-2048-10 bs32 sgd-momentum": "ca.TrainingSpec(model=functools.partial(zoo.mlp, 784, (2048, 2048), 10), batch=ca.ImageBatch((784,), classes=10), batch_size=32, optimizer='sgd', optimizer_kwargs={'momentum': 0.9})",
    "gpt d128 L2 T128 bs4 adamw": "ca.TrainingSpec(model=functools.partial(zoo.gpt, vocab=4096, seq_len=128, dim=128, depth=2, heads=4), batch=ca.TokenBatch(128, 4096), batch_size=4)",
}


def rank_run(rank: int, world: int, expr: str, port: int, out: Any) -> None:
    """One rank: the CPU allocator's peak over build, wrap and three steps; step times."""
    import functools  # noqa: F401

    import torch
    import torch.distributed as dist

    import costaware as ca  # noqa: F401  (the expressions name it)
    from costaware import zoo  # noqa: F401
    from costaware.measure.profile import AllocatorPeak
    from costaware.spec import default_loss

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    spec = eval(expr)
    loss_fn = spec.loss or default_loss
    times = []
    with AllocatorPeak() as peak:
        model = spec.model()
        # no broadcast from rank 0 at construction (every rank builds the same model): its
        # flat copy of the parameters can be freed by the gloo worker, which the profiler
        # does not see, and the peak would come out higher by that copy
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, bucket_cap_mb=spec.bucket_cap_mb, init_sync=False
        )
        opt = spec.optimizer_class(ddp.parameters(), **spec.optimizer_kwargs)
        for i in range(12):
            if i == 3:
                peak.stop()
            t0 = time.perf_counter()
            loss = loss_fn(ddp, spec.batch_spec.make(spec.batch_size))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i >= 2:
                times.append(time.perf_counter() - t0)
    out.put((rank, peak.peak, statistics.median(times)))
    dist.destroy_process_group()


def run_ranks(target: Any, world: int, expr: str, port: int) -> list[Any]:
    """What each of ``world`` spawned processes put on the queue, sorted (by rank first):
    ``target(rank, world, expr, port, queue)`` in each."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, expr, port, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(60)
    return results


def measure(expr: str, world: int, port: int) -> list[tuple[int, int, float]]:
    """Each rank's (rank, peak bytes, median step seconds) of a real gloo DDP run."""
    return run_ranks(rank_run, world, expr, port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", default="2")
    args = parser.parse_args()

    import dataclasses
    import functools  # noqa: F401

    import costaware as ca
    from costaware import zoo  # noqa: F401

    print(
        f"| {'configuration':<40} | {'ranks':>5} | {'dry-run peak':>12} | {'measured (per rank)':>21} "
        f"| {'error':>7} | {'time pred.':>10} | {'measured':>9} |"
    )
    print(f"|{'-' * 42}|{'-' * 7}|{'-' * 14}|{'-' * 23}|{'-' * 9}|{'-' * 12}|{'-' * 11}|")
    port = 29600
    for name, expr in CONFIGS.items():
        for world in (int(w) for w in args.world_sizes.split(",")):
            spec = dataclasses.replace(eval(expr), world_size=world)
            pred = ca.CostModel().predict(spec, device="cpu")
            port += 1
            ranks = measure(expr, world, port)
            peaks = [p for _, p, _ in ranks]
            err = (pred.peak_memory - max(peaks)) / max(peaks)
            step = statistics.median(t for _, _, t in ranks)
            shown = " / ".join(f"{p / 2**20:,.2f}" for p in peaks) + " MiB"
            print(
                f"| {name:<40} | {world:>5} | {pred.peak_memory / 2**20:>8,.2f} MiB | {shown:>21} "
                f"| {err:>+6.2%} | {pred.iteration_time * 1e3:>7.1f} ms | {step * 1e3:>6.1f} ms |"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
