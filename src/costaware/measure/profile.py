"""Measure what a training configuration really costs: time and peak memory.

This module imports only torch and, optionally, pynvml (``nvidia-ml-py``), so it runs on
a bare GPU machine without catboost, optuna or gensim. It runs the same training step
that :func:`costaware.dry_run` traces (forward, loss, backward, optimizer step,
``zero_grad``), for real:

- ``warmup`` steps, then ``steps`` timed steps (at least 10), each ended by a CUDA
  synchronisation; the median and spread of the timed steps are reported.
- CUDA memory: ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` over the
  whole run, warm-up included (cuDNN's benchmark search and the optimizer state appear
  in the first steps, and an OOM does not wait for the timed ones), after a peak reset
  made once CUDA is initialised and before the model is built; and the same two peaks
  over the timed steps alone (``steady_max_*``: no benchmark search, no first-step
  allocations). Before the reset, cuBLAS's workspaces are freed and the cache emptied, so
  that an earlier configuration measured in the same process leaves nothing reserved;
  what is still reserved then is recorded (``reserved_before``).
- NVML: a sampling thread (every 2 ms) records the device's peak used memory; the
  context overhead is that peak minus the caching allocator's reserved peak minus what
  was used before the run.
- An out-of-memory error is a result: ``status="oom"`` with the memory reached.
- On the CPU, time is measured the same way. Memory is the peak of the bytes PyTorch's
  CPU allocator holds for the measuring thread over the model's build and the warm-up
  steps, read from torch's thread-local profiler's memory events (see
  :class:`AllocatorPeak`): the CPU's
  ``max_memory_allocated``, the live-tensor peak the dry run predicts for a CPU, kernels'
  internal buffers included. The growth
  of the process's peak resident set over the timed steps is kept beside it
  (``rss_growth``; see :class:`RssPeak`), but not learned: a process that has freed
  memory before reuses its heap, so the resident set can grow by a small part of what
  the tensors need (1 MiB for a model whose weights and optimizer state take 8 MiB).
- The CPU steps run under the process's own ``malloc`` settings, as a user's training
  does. Only where the allocator's peak cannot be read (a torch profiler already runs in
  the thread), so that the resident set is the memory figure, is glibc asked to ``mmap``
  every block above 64 KiB (:func:`mmap_threshold`). That makes every large tensor fault
  its pages in again at each step, which here costs several microseconds a page: a
  537k-parameter CNN's Adam step took 4.5 ms under it and 1.4 ms without, and its
  training step 22 ms against 11-14 ms. ``env["malloc"]`` says which applied.
- Several measurements in one process at once (trials in threads, Optuna's ``n_jobs``):
  the CPU allocator's peak is each thread's own. What belongs to the process or the
  device (CUDA's peak statistics and cache, the resident set, glibc's settings) is
  claimed per device (:class:`DeviceUse`): only a measurement alone on the device resets
  or changes it, and one that shared it says so instead of reporting the shared figure as
  its own. Nothing here redirects the process's file descriptors.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import gc
import os
import platform
import resource
import statistics
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from costaware.spec import TrainingSpec, cast_floating, default_loss

__all__ = [
    "MALLOC_DEFAULT",
    "AllocatorPeak",
    "CpuMemoryMeter",
    "DeviceUse",
    "Measurement",
    "RssPeak",
    "allocator_peak",
    "clear_cuda_cache",
    "device_key",
    "environment",
    "host_speed",
    "in_context_op_times",
    "malloc_trim",
    "measure",
    "measurements_on",
    "mmap_threshold",
    "reset_rss_peak",
    "rss_peak_bytes",
]


@dataclass
class Measurement:
    """One measured configuration. Bytes and seconds; None where not measured."""

    status: str  # "ok" | "oom" | "error"
    device: str
    iteration_time: float | None = None
    iteration_time_p10: float | None = None
    iteration_time_p90: float | None = None
    step_times: list[float] = field(default_factory=list)
    #: CUDA: median CPU seconds to issue one (micro-batch) step, up to the synchronisation
    #: at its end; near ``iteration_time`` when the CPU bounds the step (or waits on it)
    issue_time: float | None = None
    max_allocated: int | None = None
    max_reserved: int | None = None
    #: CPU: the peak of the process's resident set over the timed steps, above what it was
    #: before the model was built (:class:`RssPeak`); kept beside the allocator's peak
    #: (``max_allocated``), which is what is learned
    rss_growth: int | None = None
    steady_max_allocated: int | None = None
    steady_max_reserved: int | None = None
    reserved_before: int | None = None
    nvml_peak_used: int | None = None
    context_overhead: int | None = None
    memory_method: str = ""
    warmup: int = 0
    steps: int = 0
    error: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def environment(device: str = "cpu") -> dict[str, Any]:
    """GPU name, driver, torch, CUDA and cuDNN versions, Python and the allocator setting."""
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        idx = torch.device(device).index or 0
        env["gpu"] = torch.cuda.get_device_name(idx)
        env["gpu_memory"] = torch.cuda.get_device_properties(idx).total_memory
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
        env["driver"] = nvml_driver()
    return env


def host_speed(repeats: int = 5) -> dict[str, float]:
    """How fast this host's CPU runs PyTorch right now, in about 20 ms.

    Medians over ``repeats`` rounds, at the current torch thread count:

    - ``dispatch_us``: one call of a tiny op (``torch.add`` of two one-element tensors,
      into a preallocated output): the per-op cost that bounds a small step, on a CPU and
      on a GPU alike (a host issues a GPU's kernels at this pace);
    - ``matmul_gflops``: a 256x256x256 fp32 matmul (compute-bound);
    - ``add_gbs``: adding two 4 MiB fp32 tensors into a third, four times (12 MiB move
      each time: memory-bound, though partly in the last-level cache).

    A shared, throttled or moved host changes speed from one hour to the next (the CPU
    corpus' container ran the same configurations 2x faster on one day than on another),
    and a time measured then is that host's. :mod:`costaware.measure.collect` and
    :mod:`costaware.measure.opbench` stamp this on their rows (``env["host_speed"]``) so that the
    drift is measured beside the times, not guessed at afterwards.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, but got {repeats=}.")
    calls, n, numel = 100, 256, 1 << 20
    with torch.no_grad():
        one_a, one_b, one_out = torch.ones(1), torch.ones(1), torch.empty(1)
        a, b = torch.rand(n, n), torch.rand(n, n)
        mm_out = torch.empty(n, n)
        x, y, out = torch.rand(numel), torch.rand(numel), torch.empty(numel)
        dispatch, matmul, add = [], [], []
        for _ in range(repeats + 1):  # the first round warms the caches and is dropped
            t0 = time.perf_counter()
            for _ in range(calls):
                torch.add(one_a, one_b, out=one_out)
            t1 = time.perf_counter()
            torch.mm(a, b, out=mm_out)
            t2 = time.perf_counter()
            for _ in range(4):
                torch.add(x, y, out=out)
            t3 = time.perf_counter()
            dispatch.append((t1 - t0) / calls)
            matmul.append(t2 - t1)
            add.append((t3 - t2) / 4)
    return {
        "dispatch_us": round(statistics.median(dispatch[1:]) * 1e6, 3),
        "matmul_gflops": round(2 * n**3 / max(statistics.median(matmul[1:]), 1e-9) / 1e9, 2),
        "add_gbs": round(3 * 4 * numel / max(statistics.median(add[1:]), 1e-9) / 1e9, 2),
    }


def nvml_driver() -> str | None:
    """The NVIDIA driver version as NVML reports it, or None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        return driver.decode() if isinstance(driver, bytes) else str(driver)
    except Exception:  # NVML is optional
        return None


def context_bytes(device: torch.device) -> int | None:
    """What this process holds on ``device`` outside PyTorch's caching allocator: NVML's
    used memory less torch's reserved memory (the CUDA context, cuBLAS's and cuDNN's
    handles, and what the driver keeps). None without NVML or a CUDA device. Another
    process on the same GPU counts too: the figure is then an upper bound."""
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # NVML is optional
        return None
    return max(0, used - int(torch.cuda.memory_reserved(device)))


class _NvmlSampler:
    """Samples the device's used memory in a thread; ``peak`` is the highest seen."""

    def __init__(self, index: int, interval: float = 0.002) -> None:
        self.peak: int | None = None
        self.baseline: int | None = None
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml: Any = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.baseline = int(pynvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        except Exception:
            self._nvml = None

    def __enter__(self) -> _NvmlSampler:
        if self._nvml is not None:
            self.peak = self.baseline
            self._thread = threading.Thread(target=self._run, daemon=True, name="costaware-nvml")
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            used = int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
            if self.peak is None or used > self.peak:
                self.peak = used
            time.sleep(self._interval)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)


#: what a CPU measurement's ``env["malloc"]`` says when glibc's settings were left alone
MALLOC_DEFAULT = "default"
#: the mmap threshold set while the resident set is the memory figure
RSS_MMAP_THRESHOLD = 64 * 1024


def malloc_trim() -> None:
    """Hand the heap's freed memory back to the OS (glibc; nothing elsewhere), so that a
    measurement starts from a clean heap whatever ran before it in the process."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def rss_peak_bytes() -> int:
    """The process's peak resident set in bytes (VmHWM, else ru_maxrss)."""
    hwm = _status_bytes("VmHWM")
    if hwm is not None:
        return hwm
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _status_bytes(field: str) -> int | None:
    """One ``kB`` field of ``/proc/self/status`` in bytes (None where Linux does not give it)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class RssPeak:
    """Peak growth of the process's *anonymous* resident set since :meth:`start`.

    ``VmHWM`` counts every resident page, file-backed ones included: the library code that
    the first training steps page in (about 17-30 MiB of ``RssFile`` in a fresh process
    here) would otherwise be charged to the model. File-backed pages are hardly ever
    dropped while a process runs, so the growth of ``RssFile`` between :meth:`start` and
    :meth:`growth` is taken off the peak growth. Where ``RssFile`` is not reported (not
    Linux), the plain resident-set growth is returned: an upper bound.
    """

    def __init__(self) -> None:
        self.exact = False
        #: glibc's settings while it measured: :data:`MALLOC_DEFAULT`, or the mmap
        #: threshold :meth:`freeing_large_blocks` set
        self.malloc = MALLOC_DEFAULT
        self._hwm = 0
        self._file: int | None = None

    @contextlib.contextmanager
    def freeing_large_blocks(self) -> Iterator[None]:
        """While open, glibc mmaps every block above 64 KiB, so that a freed tensor leaves
        the resident set at once and a later one shows as growth (:func:`mmap_threshold`).
        For where the resident set is the memory figure: it slows the steps it measures."""
        with mmap_threshold(RSS_MMAP_THRESHOLD):
            self.malloc = f"mmap threshold {RSS_MMAP_THRESHOLD // 1024} KiB"
            yield

    def start(self) -> RssPeak:
        self.exact = reset_rss_peak()
        self._hwm = rss_peak_bytes()
        self._file = _status_bytes("RssFile")
        return self

    def reset_peak(self) -> None:
        """Forget the peak reached so far (the baseline stays): later peaks only."""
        reset_rss_peak()

    def growth(self) -> int:
        grown = rss_peak_bytes() - self._hwm
        file_now = _status_bytes("RssFile")
        if self._file is not None and file_now is not None:
            grown -= max(0, file_now - self._file)
        return max(0, grown)

    @property
    def method(self) -> str:
        hwm = (
            "VmHWM reset via /proc/self/clear_refs"
            if self.exact
            else "ru_maxrss, not resettable: an upper bound"
        )
        file = ", less the growth of file-backed pages (RssFile)" if self._file is not None else ""
        heap = (
            "malloc's default settings" if self.malloc == MALLOC_DEFAULT else f"glibc {self.malloc}"
        )
        return f"peak resident-set growth ({hwm}){file}, {heap}"


class AllocatorPeak:
    """The peak of the bytes that PyTorch's CPU allocator holds for the calling thread
    between :meth:`start` and :meth:`stop`, above what it held at :meth:`start`: CPU's
    ``max_memory_allocated``, per thread.

    PyTorch keeps no such counter for the CPU; its profiler does, when asked to profile
    memory: every allocation and free made through the CPU allocator by the profiled
    thread (and by the intra-op and autograd threads that carry its state) is an event
    with its size (blocks allocated before are not counted, nor their frees). The peak is
    the highest running total of those sizes. A free made in a thread that does not carry
    that state goes unseen: a tensor whose last reference a gloo worker drops (DDP's
    construction-time broadcast of the parameters, on a loaded machine) leaves the peak
    higher by its size. Otherwise it is exact, it is the quantity a dry run
    predicts for a CPU (the live-tensor peak; kernels' internal buffers count too), and
    unlike the resident set it does not depend on what the process's heap held before (a
    process that has freed memory reuses it, and grows by far less than its tensors need)
    nor on what other threads allocate meanwhile.

    The profiler is torch's thread-local one (``torch._C._autograd._enable_profiler_legacy``):
    its state lives in the thread that started it, it never touches kineto, and it logs
    nothing, so trials in several threads (Optuna's ``n_jobs``) each measure their own
    peak at the same time. Where torch does not offer it, kineto's profiler
    (``torch.profiler``) measures instead; kineto is one per process and crashes when two
    threads run it at once, so one process-wide lock lets one :class:`AllocatorPeak` use
    it at a time, and the others record no peak. :meth:`start` and :meth:`stop` must be
    called from the same thread.

    Profiling costs a few microseconds per op, so it is meant for a few steps (the
    warm-up), not a whole run. ``peak`` stays None where the profiler cannot run (a torch
    profiler already runs in this thread, or kineto is in use by another thread) or the
    events have no allocations, and ``why`` says why. A profiler that the user runs in
    another thread with ``torch.profiler`` is not seen by the kineto path: only the
    thread-local profiler is safe beside it.
    """

    def __init__(self) -> None:
        self.peak: int | None = None
        self.why: str | None = None
        #: which profiler measures: "thread-local" or "kineto" (None before :meth:`start`)
        self.profiler: str | None = None
        self._running: str | None = None  # "thread" | "kineto" while profiling
        self._prof: Any = None
        self._disable: Callable[[], Any] | None = None
        self._thread: int | None = None

    @property
    def source(self) -> str:
        """Where the peak comes from, in words."""
        if self.profiler is None:
            return "not profiled"
        return f"the calling thread's, from torch's {self.profiler} profiler's memory events"

    def start(self) -> AllocatorPeak:
        from torch._C._autograd import _profiler_enabled

        if self._running is not None:
            return self
        if _profiler_enabled():  # starting ours would end the user's when ours stops
            self.why = "another torch profiler is running in this thread"
            return self
        self._thread = threading.get_ident()
        legacy = _thread_profiler()
        if legacy is not None:
            enable, self._disable, config = legacy
            try:
                enable(config())
            except Exception as e:  # a private profiler API changed: no peak, never a crash
                self.why = f"the profiler could not start: {type(e).__name__}: {e}"
                return self
            self._running, self.profiler = "thread", "thread-local"
            return self
        self._start_kineto()
        return self

    def _start_kineto(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        if not _KINETO.acquire(blocking=False):
            self.why = (
                "another thread of this process is using torch's kineto profiler, which "
                "runs one at a time (this torch has no thread-local profiler)"
            )
            return
        try:
            prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            prof.start()  # type: ignore[no-untyped-call]
        except Exception as e:  # e.g. a profiler the user already runs
            _KINETO.release()
            self.why = f"the profiler could not start: {type(e).__name__}: {e}"
            return
        self._prof, self._running, self.profiler = prof, "kineto", "kineto"

    @property
    def running(self) -> bool:
        """Whether it is profiling (started, and not stopped yet)."""
        return self._running is not None

    def stop(self) -> int | None:
        """Stop profiling; the peak in bytes (None if it could not be measured)."""
        running, self._running = self._running, None
        if running is None:
            return self.peak
        if running == "thread" and threading.get_ident() != self._thread:
            self._running = running  # it can only be stopped where it runs
            self.why = "stop() was called from another thread than start()"
            return None
        try:
            if running == "thread" and self._disable is not None:
                self.peak = _thread_allocator_peak(self._disable())
            else:
                prof, self._prof = self._prof, None
                try:
                    prof.stop()
                finally:
                    _KINETO.release()
                self.peak = _allocator_peak(prof.profiler.kineto_results)
            self.why = None if self.peak is not None else "the profiler recorded no CPU allocations"
        except Exception as e:  # a private profiler API changed: no peak, never a crash
            self.why = f"the profiler's memory events could not be read: {type(e).__name__}: {e}"
        return self.peak

    def __enter__(self) -> AllocatorPeak:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: kineto (``torch.profiler``) is one per process; costaware's own uses of it take this
_KINETO = threading.Lock()
#: how long :func:`in_context_op_times` waits for another thread's use of kineto to end
KINETO_WAIT_S = 60.0


@contextlib.contextmanager
def _kineto_held() -> Iterator[None]:
    """Hold :data:`_KINETO` (waiting up to :data:`KINETO_WAIT_S`), or raise RuntimeError."""
    if not _KINETO.acquire(timeout=KINETO_WAIT_S):
        raise RuntimeError(
            f"another thread of this process held torch's kineto profiler for "
            f"{KINETO_WAIT_S:.0f} s; it runs one at a time"
        )
    try:
        yield
    finally:
        _KINETO.release()


def _thread_profiler() -> tuple[Callable[[Any], None], Callable[[], Any], Callable[[], Any]] | None:
    """torch's thread-local profiler, which needs no kineto: ``(enable, disable, config)``,
    or None where this torch does not have it."""
    try:
        from torch._C._autograd import _disable_profiler_legacy, _enable_profiler_legacy
        from torch._C._profiler import ProfilerConfig, ProfilerState, _ExperimentalConfig
    except ImportError:
        return None

    def config() -> Any:  # CPU events, memory profiled; no shapes, stacks, flops or modules
        return ProfilerConfig(
            ProfilerState.CPU, False, True, False, False, False, _ExperimentalConfig()
        )

    return _enable_profiler_legacy, _disable_profiler_legacy, config


def _thread_allocator_peak(thread_records: Any) -> int | None:
    """The highest running total of the CPU allocations and frees among the thread-local
    profiler's records (one list per thread that carried its state), in time order."""
    events: list[tuple[int, int, int, int]] = []
    for i, records in enumerate(thread_records):
        for j, rec in enumerate(records):
            if rec.kind() == "memory_alloc" and rec.cpu_memory_usage() != 0:
                events.append((int(rec.start_us()), i, j, int(rec.cpu_memory_usage())))
    if not events:
        return None
    events.sort()
    total = peak = 0
    for *_, nbytes in events:
        total += nbytes
        peak = max(peak, total)
    return peak


def _allocator_peak(results: Any) -> int | None:
    """The highest running total of the CPU allocation events in ``results`` (the
    profiler's kineto results), above the total before the first one."""
    from torch._C._profiler import _EventType

    events: list[tuple[int, int, int]] = []
    stack = list(results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag != _EventType.Allocation:
            continue
        alloc = node.extra_fields
        if alloc.device.type == "cpu":
            events.append((node.start_time_ns, int(alloc.alloc_size), int(alloc.total_allocated)))
    if not events:
        return None
    events.sort()
    base = events[0][2] - events[0][1]
    return max(0, max(total for _, _, total in events) - base)


def reset_rss_peak() -> bool:
    """Reset the process's peak resident set to its current size (Linux); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def clear_cuda_cache(device: torch.device | None = None) -> int:
    """Return what earlier work left in the CUDA caching allocator before a measurement,
    and the bytes still reserved on ``device`` (default: the current one) afterwards,
    which no cache could give back: someone else's.

    The device is synchronised, unreachable objects are collected (a finished run's model
    and optimizer often live on in reference cycles), cuBLAS's cached workspaces are
    dropped (one left in a large cached segment pins all of it, and ``empty_cache`` cannot
    return that segment), and every cached block that is free goes back to the driver.
    """
    torch.cuda.synchronize(device)
    gc.collect()
    clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear_workspaces is not None:
        with contextlib.suppress(Exception):
            clear_workspaces()
    torch.cuda.empty_cache()
    return int(torch.cuda.memory_reserved(device))


@contextlib.contextmanager
def mmap_threshold(nbytes: int) -> Iterator[None]:
    """Ask glibc to mmap allocations above ``nbytes`` so frees return memory at once.

    For resident-set measurements only, since it slows what it measures: every large
    allocation then faults its pages in again (see the module docstring). glibc offers no
    way back to its default, a threshold that rises to the largest block freed: on exit
    the threshold is set to that default's starting value, 128 KiB, and stays fixed.
    """
    libc = None
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL("libc.so.6")
    m_mmap_threshold = -3
    if libc is not None:
        libc.mallopt(m_mmap_threshold, nbytes)
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(m_mmap_threshold, 128 * 1024)


def _warm_up_process() -> None:
    """One tiny training step, so the autograd engine's threads and the CPU kernels'
    one-time state exist before the baseline is taken and are not charged to the model."""
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(4))
    x = torch.randn(2, 3, 8, 8)
    net(x)
    opt = torch.optim.AdamW(net.parameters())
    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    loss = net(x).sum() + torch.nn.functional.scaled_dot_product_attention(q, q, q).sum()
    loss.backward()
    opt.step()


#: how a CPU row's ``memory_method`` begins when its peak is the CPU allocator's
ALLOCATOR_METHOD = "peak of the bytes held by PyTorch's CPU allocator"


class DeviceUse:
    """One measurement's claim on a device of this process, from its creation to
    :meth:`close`: whether other measurements in the process use the device meanwhile.

    The counters a peak is read from belong to the process, not to a thread: CUDA's peak
    statistics and cache are per device (``torch.cuda.reset_peak_memory_stats`` and
    ``empty_cache`` act on every tensor on it), the resident set and glibc's settings are
    the process's. Trials that run at once in one process (Optuna's ``n_jobs``, threads)
    therefore share them, and one that resets them corrupts the others' peaks. So each
    measurement registers here (``key``: ``"cpu"`` or ``"cuda:<index>"``, see
    :func:`device_key`):

    - ``shared_by``: the most measurements that used the device at once while this one
      was open, itself included; above 1, the device's peak is not this one's own;
    - ``alone``: ``shared_by`` is 1, no other measurement has used the device since this
      one began; only then may it reset the device's peaks, empty its cache or change the
      process's ``malloc``.

    A claim that is dropped without :meth:`close` (a trainer that never ran its last hook)
    ends when it is garbage-collected. After a ``fork`` the child starts with no claims:
    the threads that held them are not in it.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        with _USES_LOCK:
            users = _USES.setdefault(key, weakref.WeakSet())
            users.add(self)
            self.shared_by = 1
            for use in users:
                use.shared_by = max(use.shared_by, len(users))
        self._open = True

    @property
    def alone(self) -> bool:
        """Whether no other measurement of the process has used the device since this one
        began."""
        return self.shared_by == 1

    def close(self) -> None:
        """End the claim (again: nothing). ``shared_by`` keeps its value."""
        with _USES_LOCK:
            if self._open:
                self._open = False
                users = _USES.get(self.key)
                if users is not None:
                    users.discard(self)

    def __enter__(self) -> DeviceUse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_USES: dict[str, weakref.WeakSet[DeviceUse]] = {}
_USES_LOCK = threading.Lock()


def _forget_uses_after_fork() -> None:
    global _USES_LOCK, _KINETO
    _USES.clear()
    _USES_LOCK, _KINETO = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_forget_uses_after_fork)


def device_key(device: torch.device | str) -> str:
    """The name a device is claimed by in :class:`DeviceUse`: ``"cpu"``, ``"cuda:<index>"``
    (the current device where ``device`` has no index), else the device's own name."""
    dev = torch.device(device)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return f"cuda:{index}"
    return str(dev)


def measurements_on(device: torch.device | str) -> int:
    """How many measurements of this process use ``device`` now (:class:`DeviceUse`)."""
    with _USES_LOCK:
        return len(_USES.get(device_key(device), ()))


class CpuMemoryMeter:
    """A CPU's peak memory as the cost model predicts it, for the integrations' meters: the
    calling thread's CPU allocator peak (:class:`AllocatorPeak`), profiled from
    :meth:`start` until :meth:`end_profiling` (``window`` says over what), which holds
    however many trials of the process measure at once.

    Where the profiler cannot run (a torch profiler already runs in this thread), it is the
    growth of the process's resident set since :meth:`start` (:class:`RssPeak`; ``since``
    says from when), which is the process's: it is reset, and is this trial's figure, only
    while no other measurement of the process is open (:class:`DeviceUse` on ``"cpu"``).
    When others are, :meth:`peak` is None and :attr:`method` says why. :meth:`close` ends
    the meter's claim.
    """

    def __init__(self, window: str, since: str) -> None:
        self.window, self.since = window, since
        self.allocator = AllocatorPeak()
        self.rss = RssPeak()
        self.use: DeviceUse | None = None
        self._rss_started = False

    def start(self, use: DeviceUse | None = None) -> CpuMemoryMeter:
        """Start measuring, under ``use`` (a claim on ``"cpu"`` made earlier, which the meter
        takes over) or a claim of its own."""
        self.use = use if use is not None else DeviceUse("cpu")
        if self.use.alone:  # the resident set is the process's: reset it only when alone
            self.rss.start()
            self._rss_started = True
        self.allocator.start()
        return self

    def close(self) -> None:
        """End profiling, and the claim on the process's memory (:class:`DeviceUse`)."""
        self.allocator.stop()
        if self.use is not None:
            self.use.close()

    @property
    def profiling(self) -> bool:
        """Whether the allocator is still being profiled."""
        return self.allocator.running

    @property
    def rss_is_the_figure(self) -> bool:
        """Whether the resident set is the memory figure: the allocator is not profiled, and
        the resident set was reset for this meter alone. While it is, glibc should free
        large blocks at once (:meth:`RssPeak.freeing_large_blocks`)."""
        return self._rss_started and not self.allocator.running and self.allocator.peak is None

    def end_profiling(self) -> None:
        """End the profiled window (nothing if it has ended)."""
        self.allocator.stop()

    def _shared_rss(self) -> bool:
        return not self._rss_started or (self.use is not None and not self.use.alone)

    def peak(self) -> int | None:
        """The peak in bytes; ends the profiled window if it is still open. None where the
        allocator's peak could not be measured and the resident set was not this meter's
        alone."""
        self.allocator.stop()
        if self.allocator.peak is not None:
            return self.allocator.peak
        if self._shared_rss():
            return None
        return self.rss.growth()

    @property
    def method(self) -> str:
        """How :meth:`peak` is measured."""
        if self.allocator.why is None:
            return f"{ALLOCATOR_METHOD} {self.window} ({self.allocator.source})"
        if self._shared_rss():
            n = self.use.shared_by if self.use is not None else 1
            return (
                f"not measured: the allocator's peak could not be measured "
                f"({self.allocator.why}), and the resident set is the process's, which "
                f"{n} measurements of this process shared"
            )
        return (
            f"{self.rss.method} {self.since} "
            f"(the allocator's peak could not be measured: {self.allocator.why})"
        )


def _cpu_memory_method(allocator: AllocatorPeak, rss: RssPeak, use: DeviceUse) -> str:
    shared = f"not measured: {use.shared_by} measurements of this process shared the resident set"
    own_rss = use.alone
    if allocator.peak is not None:
        return (
            f"{ALLOCATOR_METHOD} over the model's build and the warm-up steps "
            f"({allocator.source}); rss_growth: {rss.method if own_rss else shared}"
        )
    why = f"the allocator's peak could not be measured: {allocator.why}"
    return f"{rss.method} ({why})" if own_rss else f"{shared} ({why})"


def _build(
    spec: TrainingSpec, device: torch.device
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = spec.model if isinstance(spec.model, torch.nn.Module) else spec.model()
    model = model.to(device).train()
    if spec.param_dtype is not None:  # a pure precision: converted, as Lightning converts it
        model = model.to(spec.param_dtype)
    kwargs = dict(spec.optimizer_kwargs)
    return model, spec.optimizer_class(model.parameters(), **kwargs)


def _failure(e: Exception) -> tuple[str, str]:
    """A failed run's ``(status, error)``: "oom" and the message's first line for a CUDA
    out-of-memory error, else "error" and the exception's type and first line."""
    first = str(e).splitlines()[0][:500] if str(e) else ""
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return "oom", first
    return "error", f"{type(e).__name__}: {first}"


def _no_mark(name: str) -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext()


def _train_step(
    spec: TrainingSpec,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    dev: torch.device,
    mark: Callable[[str], contextlib.AbstractContextManager[Any]] = _no_mark,
) -> None:
    """One optimizer step of ``spec``, as the dry run traces it (not synchronised).
    ``mark(phase)`` wraps each of :data:`STEP_PHASES` (a profiler range; none by default)."""
    loss_fn = spec.loss or default_loss
    amp = spec.autocast_dtype
    for _ in range(spec.grad_accumulation):
        with mark("input"), torch.device(dev):
            batch = spec.batch_spec.make(spec.batch_size)
            if spec.param_dtype is not None:
                batch = cast_floating(batch, spec.param_dtype)
        with mark("forward"):
            if amp is not None:
                with torch.autocast(dev.type, dtype=amp):
                    loss = loss_fn(model, batch)
            else:
                loss = loss_fn(model, batch)
        with mark("backward"):
            loss.backward()  # type: ignore[no-untyped-call]
        del loss, batch
    with mark("optimizer"):
        opt.step()
    with mark("zero_grad"):
        opt.zero_grad(set_to_none=True)


def allocator_peak(spec: TrainingSpec, steps: int = 3) -> AllocatorPeak:
    """The CPU allocator's peak over building ``spec``'s model and ``steps`` training
    steps on the CPU (what :func:`measure` records as a CPU's memory, without timing the
    steps). ``.peak`` is None, and ``.why`` says why, where it could not be measured; an
    exception in the step propagates."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, but got {steps=}.")
    dev = torch.device("cpu")
    with AllocatorPeak() as peak:
        model, opt = _build(spec, dev)
        for _ in range(steps):
            _train_step(spec, model, opt, dev)
        del model, opt
    return peak


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    spec: TrainingSpec,
    device: str = "cuda",
    *,
    warmup: int = 3,
    steps: int = 10,
) -> Measurement:
    """Run ``spec`` for real on ``device`` and measure its step time and peak memory.

    Returns a :class:`Measurement`; an out-of-memory error gives ``status="oom"`` and any
    other exception ``status="error"`` with its message, never a crash.

    It claims the device for the process (:class:`DeviceUse`). On a GPU it resets the
    device's peak statistics and empties its cache, which would corrupt another
    measurement of this process on the same GPU: there it refuses (``status="error"``)
    while another one is open. On a CPU the allocator's peak is the calling thread's and
    holds beside other threads' measurements; the resident set (``rss_growth``, the
    fallback figure) is the process's, so it is reset and recorded only while this
    measurement is the process's only one.
    """
    if steps < 10:
        raise ValueError(f"steps must be at least 10 for a stable median, but got {steps=}.")
    if warmup < 1:
        raise ValueError(f"warmup must be at least 1, but got {warmup=}.")
    dev = torch.device(device)
    is_cuda = dev.type == "cuda"
    if is_cuda and not torch.cuda.is_available():
        raise RuntimeError(
            "measure(device='cuda') needs a visible CUDA GPU; use device='cpu' here."
        )
    t_start = time.perf_counter()
    result = Measurement(
        status="ok", device=str(dev), warmup=warmup, steps=steps, spec=spec.summary()
    )
    result.env = environment(str(dev))
    want_expandable = spec.allocator == "expandable_segments"
    has_expandable = "expandable_segments:true" in result.env["alloc_conf"].replace(" ", "").lower()
    if is_cuda and want_expandable != has_expandable:
        result.status = "error"
        result.error = (
            f"the spec asks for allocator={spec.allocator!r} but PYTORCH_CUDA_ALLOC_CONF="
            f"{result.env['alloc_conf']!r}; set it before CUDA starts (run each allocator in its own process)."
        )
        return result
    use = DeviceUse(device_key(dev))
    try:
        if is_cuda and not use.alone:
            result.status = "error"
            result.error = (
                f"another measurement of this process is using {use.key}; measure() resets "
                "its peak memory statistics and empties its cache, so it needs the GPU alone."
            )
            return result
        return _measure(spec, dev, result, use, warmup=warmup, steps=steps, t_start=t_start)
    finally:
        use.close()


def _measure(
    spec: TrainingSpec,
    dev: torch.device,
    result: Measurement,
    use: DeviceUse,
    *,
    warmup: int,
    steps: int,
    t_start: float,
) -> Measurement:
    is_cuda = dev.type == "cuda"
    model: torch.nn.Module | None = None
    opt: torch.optim.Optimizer | None = None
    times: list[float] = []
    issues: list[float] = []
    first_peaks: tuple[int, int] | None = None
    if is_cuda:
        torch.backends.cudnn.benchmark = spec.cudnn_benchmark
        torch.cuda.init()  # type: ignore[no-untyped-call]
        result.reserved_before = clear_cuda_cache(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        sampler: Any = _NvmlSampler(dev.index or 0)
        result.memory_method = (
            "torch.cuda.max_memory_reserved over all steps, after a peak reset "
            "(steady_max_*: over the timed steps alone)"
        )
    else:
        sampler = contextlib.nullcontext()
    rss = RssPeak()
    allocator = AllocatorPeak()
    try:
        with sampler, contextlib.ExitStack() as heap:
            if not is_cuda:
                malloc_trim()
                _warm_up_process()
                if use.alone:  # the resident set is the process's: reset it only when alone
                    rss.start()
                allocator.start()  # the model's build and the warm-up steps
                if not allocator.running and use.alone:  # the resident set is the figure
                    heap.enter_context(rss.freeing_large_blocks())
                result.env["malloc"] = rss.malloc
            model, opt = _build(spec, dev)
            for i in range(warmup + steps):
                t0 = time.perf_counter()
                _train_step(spec, model, opt, dev)
                issued = time.perf_counter()
                _sync(dev)
                if i == warmup - 1 and not is_cuda:
                    allocator.stop()
                    if use.alone:
                        rss.reset_peak()  # later peaks: steady state, not one-time set-up
                if i == warmup - 1 and is_cuda:  # the warm-up's peaks, then the timed steps'
                    first_peaks = (
                        int(torch.cuda.max_memory_allocated(dev)),
                        int(torch.cuda.max_memory_reserved(dev)),
                    )
                    torch.cuda.reset_peak_memory_stats(dev)
                if i >= warmup:
                    times.append((time.perf_counter() - t0) / spec.grad_accumulation)
                    issues.append((issued - t0) / spec.grad_accumulation)
            if not is_cuda:
                own_rss = use.alone
                result.rss_growth = rss.growth() if own_rss else None
                peak = allocator.peak if allocator.peak is not None else result.rss_growth
                result.max_allocated = result.max_reserved = peak
                result.memory_method = _cpu_memory_method(allocator, rss, use)
    except Exception as e:  # a measurement never crashes the collector
        result.status, result.error = _failure(e)
    finally:
        allocator.stop()  # if a warm-up step failed
        del model, opt
    if is_cuda:
        allocated = int(torch.cuda.max_memory_allocated(dev))
        reserved = int(torch.cuda.max_memory_reserved(dev))
        if first_peaks is not None and times:
            result.steady_max_allocated, result.steady_max_reserved = allocated, reserved
        result.max_allocated = max(allocated, first_peaks[0] if first_peaks else 0)
        result.max_reserved = max(reserved, first_peaks[1] if first_peaks else 0)
        if sampler.peak is not None and sampler.baseline is not None:
            result.nvml_peak_used = sampler.peak - sampler.baseline
            result.context_overhead = max(0, result.nvml_peak_used - result.max_reserved)
        if use.shared_by > 1 and result.status == "ok":  # the peaks are not this run's alone
            result.status = "error"
            result.error = (
                f"{use.shared_by - 1} other measurement(s) of this process used {use.key} "
                "meanwhile, so its peak memory statistics are not this run's own."
            )
        else:
            torch.cuda.empty_cache()
    if times:
        times_sorted = sorted(times)
        result.step_times = times
        result.iteration_time = statistics.median(times)
        result.iteration_time_p10 = times_sorted[max(0, int(0.1 * len(times)) - 1)]
        result.iteration_time_p90 = times_sorted[min(len(times) - 1, int(0.9 * len(times)))]
        if is_cuda:
            result.issue_time = statistics.median(issues)
    result.wall_s = time.perf_counter() - t_start
    return result


#: the parts of a training step that :func:`in_context_op_times` tells apart, in order
STEP_PHASES = ("input", "forward", "backward", "optimizer", "zero_grad")
_MARK = "costaware::"


def in_context_op_times(
    spec: TrainingSpec,
    device: str = "cuda",
    *,
    warmup: int = 2,
    steps: int = 3,
) -> dict[str, Any]:
    """What each operator of ``spec``'s training step costs inside the step: the per-op
    times that :mod:`costaware.measure.opbench` measures one op at a time, here in context.

    Runs ``warmup`` steps, then ``steps`` steps under ``torch.profiler``, each part of a
    step (:data:`STEP_PHASES`) in a range of its own. On CUDA an op's time is the GPU time
    of the kernels it launched itself (``self_device_time_total``), on a CPU the CPU time
    it spent itself (``self_cpu_time_total``), so that each kernel or microsecond counts
    once. Ops are named by their chain of aten calls, outermost first
    (``"conv2d>convolution>_convolution>cudnn_convolution"``), which lets an analysis find
    the op a dry run records (:mod:`costaware.core.features` groups them) whatever level the
    kernels come from. Backward ops run on autograd's thread and are placed by time: an op
    belongs to the phase whose range holds its start.

    Returns a dict: ``status`` ("ok", "oom", "error"), ``error``, ``device``, ``steps``,
    ``timer`` (what the seconds are), ``ops`` (rows ``[phase, chain, calls, seconds]``,
    per step), ``unattributed_s`` (per phase: time of events outside any aten op: the
    autograd engine, Python between ops on a CPU, kernels launched outside an op on a
    GPU) and ``step_s`` (the median wall time of a profiled step; the profiler slows the
    CPU side, so it is not a step time to learn). It never raises for a failed run.

    It profiles with kineto (``torch.profiler``), one use at a time in a process (it waits
    up to :data:`KINETO_WAIT_S` for another thread's), and kineto logs a line to stderr
    when it starts and stops (``KINETO_LOG_LEVEL=6`` in the environment before the first
    profile silences it).
    """
    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    if steps < 1 or warmup < 0:
        raise ValueError(
            f"steps must be at least 1 and warmup at least 0, got {steps=}, {warmup=}."
        )
    dev = torch.device(device)
    is_cuda = dev.type == "cuda"
    if is_cuda and not torch.cuda.is_available():
        raise RuntimeError("in_context_op_times(device='cuda') needs a visible CUDA GPU.")
    out: dict[str, Any] = {
        "status": "ok",
        "error": None,
        "device": str(dev),
        "steps": steps,
        "timer": "GPU time of each op's own kernels (torch.profiler self_device_time_total)"
        if is_cuda
        else "CPU time of each op itself (torch.profiler self_cpu_time_total)",
        "ops": [],
        "unattributed_s": {},
        "step_s": None,
    }

    def mark(name: str) -> contextlib.AbstractContextManager[Any]:
        return record_function(_MARK + name)

    model: torch.nn.Module | None = None
    opt: torch.optim.Optimizer | None = None
    try:
        if is_cuda:
            torch.backends.cudnn.benchmark = spec.cudnn_benchmark
        model, opt = _build(spec, dev)
        for _ in range(warmup):
            _train_step(spec, model, opt, dev)
            _sync(dev)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if is_cuda else [])
        walls: list[float] = []
        with _kineto_held(), profile(activities=acts) as prof:
            for _ in range(steps):
                t0 = time.perf_counter()
                _train_step(spec, model, opt, dev, mark)
                _sync(dev)
                walls.append(time.perf_counter() - t0)
        events = [e for e in prof.events() if e.device_type == DeviceType.CPU]
    except Exception as e:  # a profile never crashes the collector
        out["status"], out["error"] = _failure(e)
        return out
    finally:
        del model, opt
    out["step_s"] = statistics.median(walls)
    ranges = sorted(
        (ev.time_range.start, ev.time_range.end, ev.name[len(_MARK) :])
        for ev in events
        if ev.name.startswith(_MARK) and ev.name[len(_MARK) :] in STEP_PHASES
    )
    starts = [r[0] for r in ranges]

    def phase_of(t: float) -> str | None:
        i = bisect.bisect_right(starts, t) - 1
        return ranges[i][2] if i >= 0 and t <= ranges[i][1] else None

    totals: dict[tuple[str, str], list[float]] = {}
    other: dict[str, float] = {}
    for ev in events:
        own = float(ev.self_device_time_total if is_cuda else ev.self_cpu_time_total) / 1e6
        if ev.name.startswith(_MARK) and not is_cuda:
            # a phase's own CPU time is the Python between its ops
            ph = ev.name[len(_MARK) :]
            other[ph] = other.get(ph, 0.0) + own
            continue
        ph = phase_of(ev.time_range.start)
        if ph is None or own <= 0:
            continue
        if not ev.name.startswith("aten::"):
            other[ph] = other.get(ph, 0.0) + own
            continue
        chain = [ev.name[6:]]
        parent = ev.cpu_parent
        while parent is not None and parent.name.startswith("aten::"):
            chain.append(parent.name[6:])
            parent = parent.cpu_parent
        acc = totals.setdefault((ph, ">".join(reversed(chain))), [0.0, 0.0])
        acc[0] += 1
        acc[1] += own
    out["ops"] = [
        [ph, chain, n / steps, secs / steps] for (ph, chain), (n, secs) in sorted(totals.items())
    ]
    out["unattributed_s"] = {ph: secs / steps for ph, secs in sorted(other.items())}
    return out
