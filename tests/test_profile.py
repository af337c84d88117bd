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
