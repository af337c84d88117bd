"""costaware.profile on the CPU: the resident-set peak leaves out file-backed pages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from costaware.profile import RssPeak

MiB = 2**20

# a fresh interpreter, so that nothing else moves its resident set meanwhile
_CHILD = r"""
import json, mmap, sys
import torch
from costaware.profile import RssPeak, mmap_threshold

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
    from costaware.profile import measure

    m = measure(_small_spec(), "cpu", warmup=1, steps=10)  # type: ignore[arg-type]
    assert m.status == "ok", m.error
    assert m.reserved_before is None
    assert m.steady_max_reserved is None and m.steady_max_allocated is None
    assert m.issue_time is None and m.iteration_time is not None  # a CPU step is its issue
    d = m.to_dict()
    assert {"reserved_before", "steady_max_reserved", "steady_max_allocated"} <= set(d)
    assert "issue_time" in d


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_measurement_separates_the_warm_up_and_starts_clean() -> None:
    import torch

    from costaware.profile import measure

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
