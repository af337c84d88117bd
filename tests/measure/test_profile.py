"""costaware.measure.profile on the CPU: the resident-set peak leaves out file-backed pages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from costaware.measure.profile import RssPeak

MiB = 2**20

# a fresh interpreter, so that nothing else moves its resident set meanwhile
_CHILD = r"""
import json, mmap, sys
import torch
from costaware.measure.profile import RssPeak, mmap_threshold

path, anon_mib = sys.argv[1], int(sys.argv[2])
with mmap_threshold(64 * 1024):
    rss = RssPeak().start()
    with open(path, "rb") as f:  # page in a file, as the first training steps page in libraries
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        touched = sum(m[i] for i in range(0, len(m), 4096))
    x = torch.ones(anon_mib * 2**20 // 4)
    x.add_(1)
    del x
    print(json.dumps({"growth": rss.growth(), "method": rss.method, "touched": touched}))
"""


def _has_rss_file() -> bool:
    try:
        return "RssFile:" in Path("/proc/self/status").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not _has_rss_file(), reason="needs Linux's /proc/self/status RssFile")
def test_rss_peak_leaves_out_file_backed_pages(tmp_path: Path) -> None:
    big = tmp_path / "library.bin"
    big.write_bytes(b"\1" * (40 * MiB))
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(big), "8"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    # 8 MiB of tensor; the 40 MiB of file pages are not the model's
    assert 7.5 * MiB <= r["growth"] <= 12 * MiB, r
    assert "RssFile" in r["method"]


def test_rss_peak_never_negative() -> None:
    rss = RssPeak().start()
    assert rss.growth() >= 0


def _small_spec(**kw: object) -> object:
    import torch

    import costaware as ca

    return ca.TrainingSpec(
        model=lambda: torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.LazyLinear(4)
        ),
        batch=ca.ImageBatch((3, 16, 16), classes=4),
        batch_size=4,
        **kw,
    )


def test_cpu_measurement_has_no_cuda_only_fields() -> None:
    from costaware.measure.profile import measure

    m = measure(_small_spec(), "cpu", warmup=1, steps=10)  # type: ignore[arg-type]
    assert m.status == "ok", m.error
    assert m.reserved_before is None
    assert m.steady_max_reserved is None and m.steady_max_allocated is None
    assert m.issue_time is None and m.iteration_time is not None  # a CPU step is its issue
    d = m.to_dict()
    assert {"reserved_before", "steady_max_reserved", "steady_max_allocated"} <= set(d)
    assert "issue_time" in d


def test_host_speed_times_what_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    import torch

    from costaware.measure.profile import host_speed

    threads, grad = torch.get_num_threads(), torch.is_grad_enabled()
    speed = host_speed(repeats=2)
    assert set(speed) == {"dispatch_us", "matmul_gflops", "add_gbs"}
    assert all(v > 0 for v in speed.values())
    assert (torch.get_num_threads(), torch.is_grad_enabled()) == (threads, grad)
    with pytest.raises(ValueError, match="repeats"):
        host_speed(repeats=0)
    # an add that takes 2 ms a call: the dispatch figure is that call, and the bandwidth
    # figure falls with it, while the matmul is untouched
    real_add = torch.add

    def slow_add(*args: object, **kwargs: object) -> object:
        time.sleep(0.002)
        return real_add(*args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(torch, "add", slow_add)
    slow = host_speed(repeats=1)
    assert slow["dispatch_us"] >= 2000
    assert slow["add_gbs"] < 12 * 2**20 / 2e-3 / 1e9


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_measurement_separates_the_warm_up_and_starts_clean() -> None:
    import torch

    from costaware.measure.profile import measure

    keep = torch.ones(64 * MiB // 4, device="cuda")  # an earlier configuration's leftovers
    del keep
    m = measure(_small_spec(cudnn_benchmark=True), "cuda", warmup=2, steps=10)  # type: ignore[arg-type]
    assert m.status == "ok", m.error
    assert m.reserved_before is not None and m.reserved_before < 32 * MiB
    assert m.steady_max_reserved is not None and m.max_reserved is not None
    assert 0 < m.steady_max_reserved <= m.max_reserved
    assert m.steady_max_allocated is not None and m.max_allocated is not None
    assert 0 < m.steady_max_allocated <= m.max_allocated
    # the CPU's issuing of a step ends before the synchronisation that ends the step
    assert m.issue_time is not None and m.iteration_time is not None
    assert 0 < m.issue_time <= max(m.step_times)


def test_allocator_peak_is_the_highest_total_of_blocks_allocated_while_it_runs() -> None:
    import torch

    from costaware.measure.profile import AllocatorPeak

    before = torch.empty(4 * MiB, dtype=torch.uint8)  # allocated before: not counted
    with AllocatorPeak() as peak:
        a = torch.empty(1 * MiB, dtype=torch.uint8)
        b = torch.empty(2 * MiB, dtype=torch.uint8)
        del a, b, before  # freeing the block from before does not lower the total
        c = torch.empty(1 * MiB, dtype=torch.uint8)
    assert peak.peak == 3 * MiB, peak.why
    del c


def test_allocator_peak_leaves_a_running_profiler_alone() -> None:
    import torch

    from costaware.measure.profile import AllocatorPeak

    with torch.profiler.profile(profile_memory=True) as user:
        with AllocatorPeak() as peak:
            torch.ones(1000).sum()
        torch.ones(10).sum()
    assert peak.peak is None and "another torch profiler" in str(peak.why)
    # the user's profiler was not stopped by ours: it saw the op after ours ended
    assert sum(e.name == "aten::sum" for e in user.events()) == 2


def test_allocator_peak_counts_only_its_own_thread_and_stops_where_it_started() -> None:
    import threading

    import torch

    from costaware.measure.profile import AllocatorPeak

    peak = AllocatorPeak().start()
    assert peak.running and peak.profiler == "thread-local"
    other = threading.Thread(target=lambda: torch.empty(8 * MiB, dtype=torch.uint8))
    other.start()  # another thread's block is not this thread's
    other.join()
    a = torch.empty(1 * MiB, dtype=torch.uint8)
    stopper = threading.Thread(target=peak.stop)
    stopper.start()  # the thread-local profiler can only be stopped in its own thread
    stopper.join()
    assert peak.running and "another thread" in str(peak.why)
    assert peak.stop() == 1 * MiB and not peak.running
    del a


def test_cpu_meters_at_once_do_not_take_the_shared_resident_set_as_their_own() -> None:
    import torch

    from costaware.measure.profile import CpuMemoryMeter, measurements_on

    with torch.profiler.profile(profile_memory=True):  # the allocator's peak cannot be read
        first = CpuMemoryMeter("over the test", "since start").start()
        assert first.rss_is_the_figure  # alone in the process: its resident set
        second = CpuMemoryMeter("over the test", "since start").start()
        assert not second.rss_is_the_figure  # neither reset nor used while another measures
        assert measurements_on("cpu") == 2
        for meter in (first, second):
            assert meter.peak() is None
            assert "2 measurements of this process shared" in meter.method, meter.method
        first.close()
        second.close()
        assert measurements_on("cpu") == 0
        third = CpuMemoryMeter("over the test", "since start").start()
        assert third.rss_is_the_figure and third.peak() is not None
        assert "RssFile" in third.method or "ru_maxrss" in third.method
        third.close()


def test_device_claims_end_with_close_garbage_collection_and_fork() -> None:
    import gc
    import os

    from costaware.measure.profile import DeviceUse, measurements_on

    a, b = DeviceUse("cuda:0"), DeviceUse("cuda:0")
    c = DeviceUse("cuda:1")  # another GPU is not shared
    assert (a.shared_by, b.shared_by, c.shared_by) == (2, 2, 1)
    assert not a.alone and not b.alone and c.alone
    a.close()
    a.close()
    assert measurements_on("cuda:0") == 1 and b.shared_by == 2  # it stays shared
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child has none of the parent's threads, nor their claims
        os.write(w, b"%d" % (measurements_on("cuda:0") + measurements_on("cuda:1")))
        os._exit(0)
    os.close(w)
    assert os.read(r, 16) == b"0"
    os.close(r)
    assert os.waitpid(pid, 0)[1] == 0
    del b, c  # dropped without close (a trainer that never ran its last hook)
    gc.collect()
    assert measurements_on("cuda:0") == 0 and measurements_on("cuda:1") == 0


def test_measure_refuses_a_gpu_that_another_measurement_of_the_process_uses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It would reset the device's peaks and empty its cache under the other one. torch.cuda
    is stood in for (no GPU here): the refusal comes before any CUDA call."""
    import torch

    import costaware.measure.profile as profile

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(profile, "environment", lambda device: {"alloc_conf": ""})
    with profile.DeviceUse("cuda:0"):  # a trial of this process training on the GPU
        m = profile.measure(_small_spec(), "cuda:0", warmup=1, steps=10)  # type: ignore[arg-type]
    assert m.status == "error" and "another measurement of this process" in str(m.error)
    assert profile.measurements_on("cuda:0") == 0


def test_cpu_measurement_is_the_allocator_peak_the_dry_run_predicts() -> None:
    import torch

    import costaware as ca
    from costaware.measure.profile import ALLOCATOR_METHOD, measure

    spec = ca.TrainingSpec(
        model=lambda: torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(768, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4)
        ),
        batch=ca.ImageBatch((3, 16, 16), classes=4),
        batch_size=32,
        optimizer="sgd",  # no optimizer temporaries: weights, gradients and activations
    )
    m = measure(spec, "cpu", warmup=2, steps=10)
    assert m.status == "ok", m.error
    assert m.memory_method.startswith(ALLOCATOR_METHOD)
    assert m.max_allocated == m.max_reserved
    assert m.rss_growth is not None  # kept beside it
    weights = (768 * 256 + 256 + 256 * 4 + 4) * 4
    # weights and their gradients at least, and the exact live-tensor peak of a dry run
    assert m.max_allocated is not None and m.max_allocated >= 2 * weights
    assert m.max_allocated == pytest.approx(ca.dry_run(spec).peak_live, rel=0.01)


def test_a_cpu_estimate_counts_small_tensors_at_their_size_as_the_cpu_allocator_does() -> None:
    import torch

    import costaware as ca
    from costaware.core.analytic import estimate
    from costaware.devices import cpu_device
    from costaware.measure.profile import measure

    # 40 tiny layers: each weight, bias, gradient and momentum buffer is far under 512 B,
    # the block a CUDA caching allocator rounds to and a CPU's allocator does not
    spec = ca.TrainingSpec(
        model=lambda: torch.nn.Sequential(*[torch.nn.Linear(6, 6) for _ in range(40)]),
        batch=ca.ImageBatch((6,), classes=6),
        batch_size=4,
        optimizer="sgd",
        optimizer_kwargs={"lr": 0.01, "momentum": 0.9},
    )
    m = measure(spec, "cpu", warmup=2, steps=10)
    trace = ca.dry_run(spec)
    est = estimate(trace, spec, cpu_device())
    assert m.status == "ok" and m.max_allocated is not None, m.error
    assert est.reserved == pytest.approx(m.max_allocated, rel=0.02)
    assert trace.peak_live > 1.5 * m.max_allocated  # rounded to 512 B, as on a GPU


@pytest.mark.parametrize("foreach", [None, True])
def test_a_cpu_dry_run_steps_the_optimizer_as_a_cpu_does(foreach: bool | None) -> None:
    import torch

    import costaware as ca
    from costaware.core.analytic import estimate
    from costaware.devices import cpu_device
    from costaware.measure.profile import measure

    # eight equal layers under AdamW at a small batch: the optimizer step is the peak. A
    # CPU steps the tensors one at a time by default, so its temporaries are two of one
    # layer's; a multi-tensor step (a GPU's default, or foreach=True) holds them for all
    kwargs: dict[str, object] = {"lr": 1e-3}
    if foreach is not None:
        kwargs["foreach"] = foreach
    spec = ca.TrainingSpec(
        model=lambda: torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)]),
        batch=ca.ImageBatch((256,), classes=256),
        batch_size=4,
        optimizer="adamw",
        optimizer_kwargs=kwargs,
    )
    m = measure(spec, "cpu", warmup=2, steps=10)
    assert m.status == "ok" and m.max_allocated is not None, m.error
    cpu = ca.dry_run(spec)
    assert estimate(cpu, spec, cpu_device()).reserved == pytest.approx(m.max_allocated, rel=0.01)
    one_at_a_time = ca.dry_run(spec).peak_breakdown["temporaries"]
    multi_tensor = ca.dry_run(spec, attention="fused").peak_breakdown["temporaries"]
    layer = (256 * 256 + 256) * 4
    if foreach is None:
        assert one_at_a_time < 3 * layer < 8 * layer <= multi_tensor
    else:
        assert one_at_a_time == multi_tensor >= 8 * layer


# under a user's profiler the resident set is the memory figure, and glibc's settings
# change for the rest of the process: a child process keeps them from this one
_UNDER_PROFILER = r"""
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from test_profile import _small_spec
from costaware.measure.profile import measure

with torch.profiler.profile(profile_memory=True):
    m = measure(_small_spec(), "cpu", warmup=1, steps=10)
print(json.dumps({"status": m.status, "malloc": m.env.get("malloc"), "method": m.memory_method}))
"""


def test_cpu_steps_run_under_the_process_malloc_unless_the_resident_set_is_the_figure() -> None:
    from costaware.measure.profile import MALLOC_DEFAULT, measure

    m = measure(_small_spec(), "cpu", warmup=1, steps=10)  # type: ignore[arg-type]
    assert m.status == "ok", m.error
    assert m.env["malloc"] == MALLOC_DEFAULT
    assert "rss_growth" in m.memory_method and "malloc's default settings" in m.memory_method

    out = subprocess.run(
        [sys.executable, "-c", _UNDER_PROFILER, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["status"] == "ok"
    assert r["malloc"] == "mmap threshold 64 KiB"
    assert "another torch profiler is running" in r["method"] and "64 KiB" in r["method"]


def test_in_context_op_times_puts_each_op_in_its_phase_once(cnn_spec: object) -> None:
    """A profiled CPU step: the convolution's chain in the forward, its backward op in the
    backward, the optimizer's ops in the optimizer; each op counted once, so the ops and
    the time outside them add up to no more than the profiled step."""
    from costaware.measure.profile import STEP_PHASES, in_context_op_times

    r = in_context_op_times(cnn_spec, "cpu", warmup=1, steps=2)  # type: ignore[arg-type]
    assert r["status"] == "ok", r["error"]
    assert r["steps"] == 2 and "self_cpu_time_total" in r["timer"]
    ops = {(ph, chain): (calls, secs) for ph, chain, calls, secs in r["ops"]}
    assert {ph for ph, _ in ops} <= set(STEP_PHASES)
    assert {"forward", "backward", "optimizer"} <= {ph for ph, _ in ops}
    fwd_conv = [c for ph, c in ops if ph == "forward" and c.startswith("conv2d>convolution")]
    assert fwd_conv, sorted(ops)
    assert ops[("forward", "conv2d>convolution")][0] == 2  # two convolutions a step
    assert any(ph == "backward" and c.startswith("convolution_backward") for ph, c in ops)
    assert all(secs >= 0 for _, secs in ops.values())
    total = sum(secs for _, secs in ops.values()) + sum(r["unattributed_s"].values())
    assert 0 < total <= 1.05 * r["step_s"]


def test_in_context_op_times_reports_a_failing_step_instead_of_raising() -> None:
    import torch

    import costaware as ca
    from costaware.measure.profile import in_context_op_times

    def broken() -> torch.nn.Module:
        raise RuntimeError("no such layer")

    spec = ca.TrainingSpec(model=broken, batch=ca.ImageBatch((3, 8, 8), classes=2), batch_size=2)
    r = in_context_op_times(spec, "cpu")
    assert r["status"] == "error" and "no such layer" in r["error"] and r["ops"] == []
    with pytest.raises(ValueError, match="steps must be at least 1"):
        in_context_op_times(spec, "cpu", steps=0)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_in_context_op_times_on_cuda_are_each_ops_own_kernels(cnn_spec: object) -> None:
    """On a GPU an op's time is its kernels': the convolution's in the forward, its
    backward's in the backward, never counted twice (the kernels of a step add up to
    no more than the step)."""
    from costaware.measure.profile import in_context_op_times

    r = in_context_op_times(cnn_spec, "cuda", warmup=2, steps=3)  # type: ignore[arg-type]
    assert r["status"] == "ok", r["error"]
    assert "self_device_time_total" in r["timer"]
    fwd = {c: s for ph, c, _, s in r["ops"] if ph == "forward"}
    bwd = {c: s for ph, c, _, s in r["ops"] if ph == "backward"}
    assert sum(s for c, s in fwd.items() if c.startswith("conv2d>convolution")) > 0, sorted(fwd)
    assert sum(s for c, s in bwd.items() if c.startswith("convolution_backward")) > 0, sorted(bwd)
    kernels = sum(s for _, _, _, s in r["ops"]) + sum(r["unattributed_s"].values())
    assert 0 < kernels <= r["step_s"]
