"""Address-space caps for ``benchmarks/hpo.py``: real out-of-memory on a CPU (torch only).

``resource.setrlimit(RLIMIT_AS, ...)`` caps a process's whole virtual address space. Once
the cap is reached, ``mmap`` and ``brk`` fail, and torch's CPU allocator raises
``RuntimeError: DefaultCPUAllocator: can't allocate memory``: the CPU counterpart of a
CUDA out-of-memory error. Importing torch alone maps several hundred MiB of address space
(libraries, thread stacks, arenas), so a cap is always *a measured baseline plus the
memory budget*, never the budget alone.

Run ``python benchmarks/_rlimit.py HEADROOM_MIB`` to check this machine: it allocates
half the headroom (must succeed) and then twice the headroom (must fail) under a cap of
the current address space plus ``HEADROOM_MIB``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import resource
import sys
from typing import Any

import torch

_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 64 * 1024


def vm_status() -> dict[str, int]:
    """VmPeak / VmSize / VmHWM / VmRSS / RssAnon / RssFile of this process, in bytes (Linux)."""
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("VmPeak", "VmSize", "VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(line.split()[1]) * 1024
    return out


def cap_address_space(limit: int) -> None:
    """Limit this process's address space to ``limit`` bytes (soft and hard limit)."""
    resource.setrlimit(resource.RLIMIT_AS, (int(limit), int(limit)))


def mmap_large_allocations() -> None:
    """glibc: serve every allocation above 64 KiB with ``mmap``, so that a freed tensor
    gives its address space back at once and the cap follows the live tensors. The price:
    each large tensor faults its pages in again at every step, so these trials' steps run
    slower than a user's. costaware's own measurements leave glibc alone
    (:mod:`costaware.measure.profile`)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure (torch's CPU allocator, or Python's)."""
    if isinstance(exc, MemoryError):
        return True
    msg = str(exc).lower()
    return "can't allocate memory" in msg or "out of memory" in msg or "cannot allocate" in msg


def try_allocate(nbytes: int) -> dict[str, Any]:
    """Allocate and touch one ``nbytes`` tensor; report whether it worked and the error."""
    try:
        t = torch.empty(int(nbytes), dtype=torch.uint8)
        t.fill_(1)
        del t
        return {"ok": True, "error": None, "oom": False}
    except BaseException as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"[:300], "oom": is_oom(e)}


def probe(headroom: int) -> dict[str, Any]:
    """Cap this process at its current address space plus ``headroom`` bytes, then try
    ``headroom / 2`` bytes (should work) and ``2 * headroom`` bytes (should fail)."""
    mmap_large_allocations()
    base = vm_status()["VmSize"]
    cap_address_space(base + headroom)
    under = try_allocate(headroom // 2)
    over = try_allocate(2 * headroom)
    return {"base": base, "limit": base + headroom, "under": under, "over": over}


if __name__ == "__main__":
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    print(json.dumps(probe(mib * 2**20), indent=2))
