"""DDP per rank: the spec's world size, the gradient buckets in a rank's dry run against a
real 2-process gloo run on the CPU, and the all-reduce's time as an assumption."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
import torch
from torch import nn

import costaware as ca
from costaware.core.analytic import INTERCONNECT_BANDWIDTH
from costaware.core.trace import ddp_bucket_sizes, exact_live_peak


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))


def _spec(**kw: Any) -> ca.TrainingSpec:
    base: dict[str, Any] = {"model": _mlp, "batch": ca.ImageBatch((256,), classes=10)}
    return ca.TrainingSpec(**(base | {"batch_size": 64} | kw))


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_a_world_size_below_one_names_what_is_expected(bad: object) -> None:
    with pytest.raises(ca.SpecError) as info:
        _spec(world_size=bad)
    said = str(info.value)
    assert said.startswith("world_size must be a positive integer")
    assert f"but got world_size={bad!r}." in said


@pytest.mark.parametrize("bad", [0, -1.0, "25", None])
def test_a_bucket_cap_that_is_not_positive_is_refused(bad: object) -> None:
    with pytest.raises(ca.SpecError, match=r"bucket_cap_mb must be a positive number of MiB"):
        _spec(world_size=2, bucket_cap_mb=bad)


def test_buckets_are_assigned_as_ddps_reducer_assigns_them() -> None:
    import torch.distributed as dist

    params = [torch.empty(n) for n in (300_000, 10, 200_000, 50, 400_000)]
    limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, 2 * 2**20]
    theirs, _ = dist._compute_bucket_assignment_by_size(list(reversed(params)), limits)
    ours = ddp_bucket_sizes(params, cap_mb=2.0)
    rev = list(reversed(params))
    assert sorted(n for n, _ in ours) == sorted(sum(rev[i].numel() for i in b) for b in theirs)


#: measurements per rank, each of a fresh model; the lowest counts (see :func:`_rank`)
_WINDOWS = 3


def _rank(rank: int, world: int, port: int, out: Any) -> None:
    """Train three steps of DDP, :data:`_WINDOWS` times over (a fresh model each time), and
    report each window's allocator peak.

    The profiler counts the frees made by the threads that carry its state. A tensor whose
    last reference sits with a gloo worker (its collective's finished work, which a worker
    that is slow to be scheduled holds a moment longer) is freed in that worker, and the
    window's peak comes out higher by its size. The one such tensor before the step's peak
    is the flat copy of the parameters that DDP's construction broadcasts from rank 0
    (``init_sync``): every rank starts from the same parameters here, so it is left out.
    A missed free only ever raises a peak, so the lowest window counts."""
    from costaware.measure.profile import AllocatorPeak

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    spec = _spec(world_size=world)
    peaks = []
    for _ in range(_WINDOWS):
        with AllocatorPeak() as peak:
            model = spec.model()  # type: ignore[operator]
            ddp = nn.parallel.DistributedDataParallel(model, init_sync=False)
            opt = torch.optim.AdamW(ddp.parameters())
            for _ in range(3):
                x, y = spec.batch_spec.make(spec.batch_size)
                nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        del model, ddp, opt, x, y
        peaks.append(peak.peak)
    out.put((rank, peaks))
    torch.distributed.destroy_process_group()


def test_a_ranks_peak_in_a_real_two_process_gloo_run_is_the_dry_runs() -> None:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = 29700 + os.getpid() % 200
    procs = [ctx.Process(target=_rank, args=(r, 2, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    peaks = dict(out.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    predicted = exact_live_peak(ca.dry_run(_spec(world_size=2)).allocator_events())
    alone = exact_live_peak(ca.dry_run(_spec()).allocator_events())
    grads = (256 * 1024 + 1024 + 1024 * 10 + 10) * 4
    assert predicted == pytest.approx(alone + grads, rel=0.01)  # the buckets: one more copy
    for windows in peaks.values():
        assert None not in windows and len(windows) == _WINDOWS
        assert predicted == pytest.approx(min(windows), rel=0.02)


def test_the_allreduce_time_is_added_as_a_stated_assumption() -> None:
    model = ca.CostModel()
    alone = model.predict(_spec(), "H100")
    two, eight = (model.predict(_spec(world_size=n), "H100") for n in (2, 8))
    assert "exposed_allreduce" not in alone.basis
    assert 0 < two.basis["exposed_allreduce"] < eight.basis["exposed_allreduce"]
    assert two.iteration_time > alone.iteration_time
    (note,) = [n for n in two.notes if n.startswith("DDP over 2 ranks")]
    assert "450 GB/s" in note and "an assumption, not measured" in note
    assert INTERCONNECT_BANDWIDTH["H100-SXM"] > INTERCONNECT_BANDWIDTH["H100-PCIe"]
    assert two.spec["world_size"] == 2


def test_every_catalog_device_has_a_link_figure() -> None:
    """A catalog device without one was told it "is not listed" (the RTX A6000, the B200):
    each has its datasheet's link, and only a device of the user's own falls back."""
    assert set(ca.devices.CATALOG) <= set(INTERCONNECT_BANDWIDTH)
    own = dataclasses.replace(ca.get_device("RTX-A6000"), name="lab-a6000", aliases=())
    note = next(
        n for n in ca.CostModel().predict(_spec(world_size=2), own).notes if n.startswith("DDP")
    )
    assert "32 GB/s (PCIe 4: no link figure for this device)" in note


@pytest.mark.parametrize("ns_name", ["lightning", "pytorch_lightning"])
def test_the_trainers_ddp_world_size_and_bucket_cap_become_the_specs(ns_name: str) -> None:
    import importlib
    import warnings

    from costaware.integrations.lightning import lightning_parallel

    ns = importlib.import_module("lightning.pytorch" if ns_name == "lightning" else ns_name)
    opts: dict[str, Any] = dict(accelerator="cpu", logger=False, enable_progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one = ns.Trainer(devices=1, **opts)
        ddp = ns.Trainer(devices=2, strategy="ddp", **opts)
        capped = ns.Trainer(devices=4, strategy=ns.strategies.DDPStrategy(bucket_cap_mb=50), **opts)
    assert lightning_parallel(one) == {}
    assert lightning_parallel(ddp) == {"world_size": 2, "bucket_cap_mb": 25.0}
    assert lightning_parallel(capped) == {"world_size": 4, "bucket_cap_mb": 50.0}

    class ModelParallelStrategy:  # tensor parallel: its name is what counts
        pass

    class Parallel:
        world_size = 2
        strategy = ModelParallelStrategy()

    with pytest.raises(
        ca.CostawareError, match=r"strategy ModelParallelStrategy over 2 processes is not"
    ):
        lightning_parallel(Parallel())


@pytest.mark.parametrize(
    ("samples", "batch", "drop_last"), [(40, 8, False), (41, 8, False), (41, 8, True), (1000, 64, False)]
)
def test_a_ranks_epoch_is_its_distributed_samplers(
    samples: int, batch: int, drop_last: bool
) -> None:
    """Under DDP each rank steps through what ``DistributedSampler`` gives it: the spec's
    epoch and the Lightning reading of a DDP Trainer's agree with the sampler itself."""
    import warnings

    import lightning.pytorch as L
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from costaware.integrations.lightning import lightning_trial_length

    data = TensorDataset(torch.randn(samples, 4))
    loader = DataLoader(data, batch_size=batch, drop_last=drop_last)
    per_rank = [
        len(DataLoader(data, batch_size=batch, drop_last=drop_last,
                       sampler=DistributedSampler(data, num_replicas=4, rank=r, shuffle=False)))
        for r in range(4)
    ]  # fmt: skip
    assert len(set(per_rank)) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(devices=4, strategy="ddp", accelerator="cpu", logger=False)
    length = lightning_trial_length(trainer, loader, batch, 4)
    spec = _spec(world_size=4, batch_size=batch, **length)
    assert spec.steps_per_epoch == per_rank[0]
    if not drop_last:  # the dataset as the user gave it
        given = _spec(world_size=4, batch_size=batch, dataset_size=samples)
        assert given.steps_per_epoch == per_rank[0]
