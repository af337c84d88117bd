"""A fast replay of PyTorch's CUDA caching allocator.

A fake-tensor dry run of one training step records, in time order, every storage allocation
and free it would make on the GPU. :func:`simulate` replays that record through a model of
``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator``) and returns the peaks that
``torch.cuda.max_memory_allocated()`` and ``torch.cuda.max_memory_reserved()`` would report.
``max_memory_reserved`` is the number that decides whether a run goes out of memory.

What is modelled, following the C++ source:

* ``round_size``: requests under 512 B become 512 B, the rest round up to a multiple of 512 B
  (``roundup_power2_divisions`` is not set by default, so it is ignored).
* Two pools: rounded requests of at most 1 MiB (``kSmallSize``) use the small pool, the rest
  the large pool. A pool never hands out memory of the other one.
* ``get_free_block``: best fit, i.e. the smallest free block of the pool whose size is at
  least the request, ties broken by the lower address (the C++ set orders blocks by
  ``(stream, size, address)``). Which of two equally sized free blocks is lower depends on
  where the CUDA driver put their segments, which a replay cannot know: new segments are
  placed above the earlier ones by default, or below them (``segment_order=
  "descending"``, what the driver mostly did where the allocator's own events were
  recorded; see :data:`SEGMENT_ORDERS`).
* ``alloc_block`` (default mode): when no free block fits, one new segment of
  ``get_allocation_size(size)`` bytes is ``cudaMalloc``'d: 2 MiB for the small pool, 20 MiB for
  rounded requests under 10 MiB, otherwise the request rounded up to a multiple of 2 MiB.
* ``should_split``: the block is split when the remainder is at least 512 B (small pool, or
  any pool with expandable segments) or more than 1 MiB (large pool, default mode). An
  unsplit block is allocated whole, and ``allocated_bytes`` counts the whole block, exactly as
  ``stats.allocated_bytes`` does (it adds ``block->size``).
* ``free_block``: a freed block merges with free neighbours of the same segment.
* Expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``): one virtual
  segment per pool, mapped in pages of 2 MiB (small pool) and 20 MiB (large pool), which are
  the page sizes the C++ code uses (``segment_size = is_small ? kSmallBuffer : kLargeBuffer``).
  ``get_free_block`` treats the free block touching the unmapped end of the segment as if it
  were as large as the whole unmapped address space, so it is chosen only when no other free
  block fits. When nothing fits, ``try_allocate_expandable_block`` maps just enough whole pages
  at the end of the segment, merging them with a free block already at the end.
* Under a capacity (``simulate(..., capacity=)``), a segment that would pass it first gives
  back every cached segment that is one free block (``release_cached_blocks``) and is
  tried once more; an event :data:`RELEASE_CACHED` does the same release where a program
  (``torch.cuda.empty_cache()``) or a refused request it went on from caused one.

Not modelled: several streams and cross-stream ``record_stream`` events, ``max_split_size_mb``,
``roundup_power2_divisions``, ``garbage_collection_threshold``, CUDA graph pools, and the
limit of an expandable segment's address space (1.125 x the GPU's memory, far more than a
replay that fits ever maps). Memory the CUDA context, cuBLAS workspaces and NCCL take outside
the caching allocator is not part of these numbers.

Speed: an event costs a handful of dict operations plus one or two ``bisect``/``insort`` calls
on the sorted free list of one pool; nothing scans the blocks. Measured with CPython 3.11 on
the 2-core x86-64 sandbox this was written on, a slow machine (``python -m timeit "x+y"``
takes 38 ns there, roughly four times a current desktop, and another process kept one of its
two cores busy): two recorded ResNet-50 training steps (CPU profiler memory events at batch
size 8: 6,619 events, 45 distinct sizes) tiled to 20,000 events replay in 36-43 ms in default
mode and 41-48 ms with expandable segments (best of 21 runs, varying with the load; numpy
input adds 1-2 ms for the conversion). A synthetic stress sequence of 20,000 events in which
every request size is distinct and about 1,800 blocks are live takes about 51 ms and 60 ms.
"""

from __future__ import annotations

import hashlib
import threading
from bisect import bisect_left, insort
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "ALLOC_MODES",
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "RELEASE_CACHED",
    "SEGMENT_ORDERS",
    "AllocatorResult",
    "allocation_size",
    "min_capacity",
    "replay",
    "round_size",
    "simulate",
]

ALLOC_MODES: tuple[str, ...] = ("default", "expandable_segments")
"""The allocator configurations :func:`simulate` can replay."""
SEGMENT_ORDERS: tuple[str, ...] = ("ascending", "descending")
"""Where a replay in default mode places each new segment's addresses: above every earlier
segment, or below. Only ties matter: the allocator takes the lowest-addressed of equally
sized free blocks, and which one that is depends on the addresses the CUDA driver gave
their segments. Where the allocator's own events were recorded (an H200), the driver
mostly placed a new segment below the earlier ones, and those events replay closer to the
measured reserved peak with ``"descending"`` (``benchmarks/alloc_fidelity.py``;
``docs/accuracy.md``, "Where the capacity decision misses"). A dry run's events are not
the GPU's, so predictions keep ``"ascending"``, the order their memory line was fitted
with."""

K_MIN_BLOCK_SIZE = 512
"""``kMinBlockSize``: every request is rounded to a multiple of this."""
K_SMALL_SIZE = 1_048_576
"""``kSmallSize``: the largest rounded request served by the small pool (1 MiB)."""
K_SMALL_BUFFER = 2_097_152
"""``kSmallBuffer``: small-pool segment size, and small-pool page of expandable segments."""
K_LARGE_BUFFER = 20_971_520
"""``kLargeBuffer``: segment for 1-10 MiB requests, and large-pool page of expandable segments."""
K_MIN_LARGE_ALLOC = 10_485_760
"""``kMinLargeAlloc``: rounded requests from this size get a segment of their own size."""
K_ROUND_LARGE = 2_097_152
"""``kRoundLarge``: large segments are rounded up to a multiple of this."""
RELEASE_CACHED = -2
"""An event ``(key, RELEASE_CACHED)`` (its key is ignored) gives the cached, unused memory
back to the driver, as ``torch.cuda.empty_cache()`` does and as the allocator does before
it refuses a request that passes its limit (``release_cached_blocks``): a refused request
that the program went on from, such as a cuDNN workspace, leaves that release behind."""

# A free block is kept in its pool's sorted list as the single int ``size << _SHIFT | addr``,
# so that the list sorts by (size, address) like the C++ ``BlockComparatorSize`` and one
# ``bisect_left(list, size << _SHIFT)`` finds the best fit. Simulated addresses stay far
# below 2**64.
_SHIFT = 64
_MASK = (1 << _SHIFT) - 1
# Gap left between simulated cudaMalloc segments, so that blocks of two different segments are
# never contiguous and therefore never merge.
_SEGMENT_GAP = K_SMALL_BUFFER
# Base address of the large pool's expandable segment; the small pool's starts at 0.
_LARGE_EXPANDABLE_BASE = 1 << 56
# Address below which default mode places segments in descending order.
_DESCENDING_BASE = 1 << 60


@dataclass(frozen=True)
class AllocatorResult:
    """Peaks of one replay, in bytes, as the CUDA caching allocator's statistics count them."""

    peak_allocated: int
    """Max over time of the summed sizes of allocated blocks (``max_memory_allocated``).

    A block is at least the rounded request; it is larger when the block was not split."""
    peak_reserved: int
    """Max over time of the memory held from the driver (``max_memory_reserved``): the
    ``cudaMalloc``'d segments in default mode, the mapped pages with expandable segments."""
    peak_requested: int
    """Max over time of the summed raw requested sizes (``requested_bytes`` peak)."""
    num_segments: int
    """Default mode: number of ``cudaMalloc``'d segments at the end. Expandable segments:
    number of mapped pages at the end (2 MiB small-pool pages plus 20 MiB large-pool pages)."""
    num_allocs: int
    """Number of non-empty allocations replayed (zero-byte allocations are not counted)."""
    fits: bool = True
    """Whether every allocation was served within the replay's ``capacity`` (always True
    without one). False: the replay stopped at the allocation that raised out of memory."""
    num_alloc_retries: int = 0
    """Allocations that fitted only after the cached, unused memory was released
    (``num_alloc_retries`` of ``torch.cuda.memory_stats``), or that failed even then."""


def round_size(nbytes: int) -> int:
    """Round a request like the allocator's ``round_size``.

    Under 512 B gives 512 B; anything else is rounded up to a multiple of 512 B.
    """
    if nbytes < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return (nbytes + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE * K_MIN_BLOCK_SIZE


def allocation_size(nbytes: int) -> int:
    """Size of the segment ``cudaMalloc``'d for a request no cached block can serve.

    Mirrors ``get_allocation_size``, applied (as in C++) to the rounded request: at most
    1 MiB gives a 2 MiB small-pool segment, under 10 MiB a 20 MiB segment, and anything larger
    is rounded up to a multiple of 2 MiB.
    """
    size = round_size(nbytes)
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return (size + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE


EventsLike = Sequence[tuple[int, int]] | npt.NDArray[np.integer]


def _rows(events: EventsLike) -> Iterable[Sequence[int]]:
    """Return the events as an iterable of ``(key, nbytes)`` rows.

    A numpy array is checked and converted to Python ints; a sequence is used as it is (numpy
    integer scalars in it work too, as the replay converts each distinct size once).
    """
    if isinstance(events, np.ndarray):
        if events.ndim != 2 or events.shape[1] != 2:
            raise ValueError(f"events array must have shape (n, 2), got {events.shape}")
        if events.size and not np.issubdtype(events.dtype, np.integer):
            raise ValueError(f"events array must have an integer dtype, got {events.dtype}")
        cols = events.astype(np.int64, copy=False)
        # Two column lists zipped iterate about twice as fast as ``events.tolist()``.
        keys: list[int] = cols[:, 0].tolist()
        sizes: list[int] = cols[:, 1].tolist()
        return zip(keys, sizes, strict=True)
    return events


def _unknown_free(key: int) -> ValueError:
    """The error for a free of a key that is not allocated."""
    return ValueError(
        f"free of storage key {key!r}, which is not allocated (never allocated, or already freed)"
    )


def _double_alloc(key: int) -> ValueError:
    """The error for an allocation of a key that is still allocated."""
    return ValueError(f"allocation of storage key {key!r}, which is still allocated")


def simulate(
    events: EventsLike,
    mode: str = "default",
    capacity: int | None = None,
    *,
    segment_order: str = "ascending",
) -> AllocatorResult:
    """Replay allocation events through the CUDA caching allocator model.

    Args:
        events: ``(key, nbytes)`` pairs in time order, as a sequence or an integer numpy
            array of shape ``(n, 2)``. ``nbytes > 0`` allocates ``nbytes`` for storage
            ``key``; a negative ``nbytes`` (by convention ``-1``) frees storage ``key``.
            ``nbytes == 0`` is a zero-byte allocation: like PyTorch, it takes no memory, and
            its later free is ignored. ``nbytes ==`` :data:`RELEASE_CACHED` gives back the
            cached, unused memory (its key is ignored). A key must be unique while allocated
            and may be reused once freed.
        mode: ``"default"`` or ``"expandable_segments"`` (see :data:`ALLOC_MODES`).
        capacity: the bytes the allocator may reserve (a card's free memory, or the limit
            ``torch.cuda.set_per_process_memory_fraction`` sets), or None for no limit.
            Where reserving more memory would pass it, the replay does what the allocator
            does before it raises out of memory (see :func:`min_capacity`); if that does
            not make room, the replay stops there with ``fits=False``.
        segment_order: where a new segment goes in default mode, above the earlier ones
            or below (:data:`SEGMENT_ORDERS`): it decides which of two equally sized free
            blocks the best fit takes.

    Returns:
        The peaks of allocated, reserved and requested bytes, and segment/allocation counts.

    Raises:
        ValueError: on an unknown mode, a free of a key that is not allocated, an allocation
            of a key that is still allocated, or a badly shaped events array.
    """
    if mode not in ALLOC_MODES:
        raise ValueError(f"unknown allocator mode {mode!r}; valid modes are {list(ALLOC_MODES)}")
    if capacity is not None and capacity < 0:
        raise ValueError(f"capacity must be at least 0 bytes, but got {capacity=}.")
    if segment_order not in SEGMENT_ORDERS:
        raise ValueError(
            f"unknown segment order {segment_order!r}; valid orders are {list(SEGMENT_ORDERS)}"
        )
    rows = _rows(events)
    if mode == "default":
        return _simulate_default(rows, capacity, segment_order == "descending")
    return _simulate_expandable(rows, capacity)


def _compact(free_list: list[int], free_start: dict[int, int]) -> int:
    """Drop stale and duplicate entries from a sorted free list, in place.

    Returns the list length at which to compact next: twice the new length, so compaction
    costs O(1) amortised per insertion.
    """
    out: list[int] = []
    prev = -1
    for k in free_list:
        if k != prev and free_start.get(k & _MASK) == k >> _SHIFT:
            out.append(k)
        prev = k
    free_list[:] = out
    return max(_MIN_COMPACT_LEN, 2 * len(out))


# Bookkeeping shared by both modes. The free blocks are described exactly by two dicts:
# ``free_start[addr] = size`` and ``free_end[addr + size] = addr``. Each pool also has a sorted
# list of ``size << _SHIFT | addr`` ints, an index for best-fit search that is updated lazily:
# when a free block is allocated its entry is removed, but when it is absorbed by a merge its
# entry is left behind, stale, and dropped when a search meets it or at the next compaction
# (stale entries come only from merges, so only merges check the list length). An entry is
# live exactly when ``free_start[addr] == size``. Merges overwrite dict entries instead of
# deleting them where the key survives (a merged block keeps the start of its first part and
# the end of its last part). All of this keeps C-level calls (bisect, insort) to about two per
# event, which is what a pure-Python replay spends most of its time on.
_MIN_COMPACT_LEN = 256
# Marker stored in the live-allocation dict for a zero-byte allocation.
_ZERO_BYTES: tuple[int, int, int] = (0, 0, 0)


def _simulate_default(
    rows: Iterable[Sequence[int]], capacity: int | None, descending: bool = False
) -> AllocatorResult:
    """Default mode: a new ``cudaMalloc``'d segment per pool miss, released only when a
    new one would pass ``capacity`` (``release_cached_blocks``: every segment that is one
    free block goes back to the driver, then the allocation is tried once more). Each
    new segment lies above the earlier ones, or below them when ``descending``."""
    shift = _SHIFT
    mask = _MASK
    small_size = K_SMALL_SIZE
    min_block = K_MIN_BLOCK_SIZE
    # Sorted free lists of the large and small pools, indexed by the ``small`` flag.
    free_lists: tuple[list[int], list[int]] = ([], [])
    compact_at = [_MIN_COMPACT_LEN, _MIN_COMPACT_LEN]
    # Segments never touch (see _SEGMENT_GAP), so a neighbour found in these dicts is in the
    # same segment, hence the same pool.
    free_start: dict[int, int] = {}
    free_end: dict[int, int] = {}
    # key -> (addr, block size, requested bytes). An allocated small-pool block is never more
    # than 1 MiB and a large-pool one always is, so the pool follows from the block size.
    live: dict[int, tuple[int, int, int]] = {}
    zero = _ZERO_BYTES
    # request size -> (requested bytes, rounded size, free list, search key, split minimum)
    cache: dict[int, tuple[int, int, list[int], int, int]] = {}

    # descending: segments go down from a base far above any replay's total
    next_addr = _DESCENDING_BASE if descending else _SEGMENT_GAP
    allocated = reserved = requested = 0
    peak_allocated = peak_reserved = peak_requested = 0
    num_segments = 0
    num_allocs = 0
    retries = 0
    fits = True
    segments: dict[int, int] = {}  # address -> size of every segment held

    for key, nbytes in rows:
        if nbytes > 0:
            if key in live:
                raise _double_alloc(key)
            if nbytes in cache:
                req, size, fl, skey, split_min = cache[nbytes]
            else:
                req = int(nbytes)
                size = min_block if req < min_block else (req + 511) & -512
                small = size <= small_size
                fl = free_lists[small]
                skey = size << shift
                split_min = min_block if small else small_size + 1  # should_split
                cache[nbytes] = (req, size, fl, skey, split_min)
            i = bisect_left(fl, skey)
            while True:
                try:
                    k = fl.pop(i)
                except IndexError:
                    # No cached block fits: cudaMalloc a new segment (get_allocation_size).
                    if size <= small_size:
                        bsize = K_SMALL_BUFFER
                    elif size < K_MIN_LARGE_ALLOC:
                        bsize = K_LARGE_BUFFER
                    else:
                        bsize = (size + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE
                    if capacity is not None and reserved + bsize > capacity:
                        retries += 1
                        reserved -= _release_free_segments(segments, free_start, free_end)
                        num_segments = len(segments)
                        if reserved + bsize > capacity:
                            fits = False
                            break
                    if descending:
                        next_addr -= bsize + _SEGMENT_GAP
                        addr = next_addr
                    else:
                        addr = next_addr
                        next_addr += bsize + _SEGMENT_GAP
                    segments[addr] = bsize
                    reserved += bsize
                    num_segments += 1
                    if reserved > peak_reserved:
                        peak_reserved = reserved
                    rem = bsize - size
                    if rem >= split_min:
                        raddr = addr + size
                        free_start[raddr] = rem
                        free_end[raddr + rem] = raddr
                        insort(fl, rem << shift | raddr)
                        bsize = size
                    break
                bsize = k >> shift
                addr = k & mask
                if addr in free_start and free_start[addr] == bsize:
                    # get_free_block: the best fit (a stale entry is dropped and skipped).
                    rem = bsize - size
                    del free_start[addr]
                    if rem >= split_min:
                        # should_split: the remainder [addr + size, end) stays free.
                        raddr = addr + size
                        free_start[raddr] = rem
                        free_end[raddr + rem] = raddr
                        insort(fl, rem << shift | raddr)
                        bsize = size
                    else:
                        del free_end[addr + bsize]
                    break
            if not fits:
                break
            live[key] = (addr, bsize, req)
            num_allocs += 1
            allocated += bsize
            requested += req
            if allocated > peak_allocated:
                peak_allocated = allocated
            if requested > peak_requested:
                peak_requested = requested
        elif nbytes < 0:
            if nbytes == RELEASE_CACHED:
                reserved -= _release_free_segments(segments, free_start, free_end)
                num_segments = len(segments)
                continue
            try:
                rec = live[key]
            except KeyError:
                raise _unknown_free(key) from None
            del live[key]
            if rec is zero:
                continue
            addr, bsize, req = rec
            allocated -= bsize
            requested -= req
            small = bsize <= small_size
            fl = free_lists[small]
            end = addr + bsize
            if end in free_start:  # merge with the free block after it
                bsize += free_start[end]
                del free_start[end]
                if len(fl) > compact_at[small]:
                    compact_at[small] = _compact(fl, free_start)
            if addr in free_end:  # merge with the free block before it
                paddr = free_end[addr]
                del free_end[addr]
                bsize += addr - paddr
                addr = paddr
                if len(fl) > compact_at[small]:
                    compact_at[small] = _compact(fl, free_start)
            free_start[addr] = bsize
            free_end[addr + bsize] = addr
            insort(fl, bsize << shift | addr)
        else:
            if key in live:
                raise _double_alloc(key)
            live[key] = zero

    return AllocatorResult(
        peak_allocated=peak_allocated,
        peak_reserved=peak_reserved,
        peak_requested=peak_requested,
        num_segments=num_segments,
        num_allocs=num_allocs,
        fits=fits,
        num_alloc_retries=retries,
    )


def _release_free_segments(
    segments: dict[int, int], free_start: dict[int, int], free_end: dict[int, int]
) -> int:
    """Give back every segment that is one free block (``release_blocks``: a block with
    no neighbours); returns the bytes released. The blocks' entries in the sorted free
    lists go stale (their address is no longer in ``free_start``) and are dropped when a
    search meets them: addresses are never reused."""
    released = 0
    for addr, size in list(segments.items()):
        if free_start.get(addr) == size:
            del free_start[addr]
            del free_end[addr + size]
            del segments[addr]
            released += size
    return released


def _simulate_expandable(rows: Iterable[Sequence[int]], capacity: int | None) -> AllocatorResult:
    """Expandable segments: one growing segment per pool, mapped page by page.

    With a ``capacity``, a request is refused first as ``alloc_block`` refuses it under a
    memory fraction: when the reserved bytes plus the request's allocation size
    (:func:`allocation_size`) would pass the capacity, even where fewer new pages would
    do (on a full card without a fraction, only the pages mapped count: this is the
    stricter of the two). Then the free pages at the end of each pool's segment are
    unmapped and it is tried once more. PyTorch also unmaps the
    whole pages inside free blocks in the middle of a segment; that is not modelled, so
    under a capacity the replay needs at least as much memory as PyTorch does."""
    shift = _SHIFT
    mask = _MASK
    small_size = K_SMALL_SIZE
    # Per pool, indexed by the ``small`` flag (0 large, 1 small): sorted free list, page size,
    # base address and end of the mapped part of the pool's single expandable segment.
    free_lists: tuple[list[int], list[int]] = ([], [])
    compact_at = [_MIN_COMPACT_LEN, _MIN_COMPACT_LEN]
    page = (K_LARGE_BUFFER, K_SMALL_BUFFER)
    base = (_LARGE_EXPANDABLE_BASE, 0)
    mapped_end = [base[0], base[1]]
    free_start: dict[int, int] = {}
    free_end: dict[int, int] = {}
    live: dict[int, tuple[int, int, int]] = {}
    zero = _ZERO_BYTES
    # request size -> (requested bytes, rounded size, is small pool, free list, search key)
    cache: dict[int, tuple[int, int, bool, list[int], int]] = {}
    min_block = K_MIN_BLOCK_SIZE
    split_min = K_MIN_BLOCK_SIZE  # should_split with expandable segments, either pool

    allocated = reserved = requested = 0
    peak_allocated = peak_reserved = peak_requested = 0
    num_allocs = 0
    retries = 0
    fits = True

    for key, nbytes in rows:
        if nbytes > 0:
            if key in live:
                raise _double_alloc(key)
            if nbytes in cache:
                req, size, small, fl, skey = cache[nbytes]
            else:
                req = int(nbytes)
                size = min_block if req < min_block else (req + 511) & -512
                small = size <= small_size
                fl = free_lists[small]
                skey = size << shift
                cache[nbytes] = (req, size, small, fl, skey)
            i = bisect_left(fl, skey)
            while True:
                try:
                    k = fl[i]
                except IndexError:
                    # Nothing fits: map whole pages at the end of the segment, merged with the
                    # free block already there, if any (try_allocate_expandable_block).
                    if capacity is not None and reserved + allocation_size(size) > capacity:
                        retries += 1
                        for pool in (0, 1):
                            reserved -= _unmap_free_tail(
                                pool, mapped_end, base, page, free_lists, free_start, free_end
                            )
                        if reserved + allocation_size(size) > capacity:
                            fits = False
                            break
                    end = mapped_end[small]
                    if end in free_end:
                        addr = free_end[end]
                        del free_end[end]
                        del free_start[addr]  # its list entry goes stale
                        tsize = end - addr
                        if len(fl) > compact_at[small]:
                            compact_at[small] = _compact(fl, free_start)
                    else:
                        addr = end
                        tsize = 0
                    pg = page[small]
                    grow = (size - tsize + pg - 1) // pg * pg
                    reserved += grow
                    if reserved > peak_reserved:
                        peak_reserved = reserved
                    bsize = tsize + grow
                    end = addr + bsize
                    mapped_end[small] = end
                    free_end[end] = addr
                    break
                bsize = k >> shift
                addr = k & mask
                if addr not in free_start or free_start[addr] != bsize:
                    del fl[i]  # a stale entry: dropped, look at the next one
                    continue
                if addr + bsize == mapped_end[small]:
                    # The best fit touches the unmapped rest of the segment. get_free_block
                    # counts it as being as big as that address space, so any other fitting
                    # free block (the next live entry) is preferred.
                    j = i + 1
                    while True:
                        try:
                            k2 = fl[j]
                        except IndexError:
                            break
                        if k2 != k:
                            b2 = k2 >> shift
                            a2 = k2 & mask
                            if a2 in free_start and free_start[a2] == b2:
                                i = j
                                bsize = b2
                                addr = a2
                                break
                        del fl[j]  # a stale entry, or a duplicate of the tail's
                del fl[i]
                del free_start[addr]
                end = addr + bsize
                break
            if not fits:
                break
            # free_end[end] == addr here; free_start has no entry for the block.
            rem = bsize - size
            if rem >= split_min:
                # should_split: the remainder [addr + size, end) stays free.
                raddr = addr + size
                free_start[raddr] = rem
                free_end[end] = raddr
                insort(fl, rem << shift | raddr)
                bsize = size
            else:
                del free_end[end]
            live[key] = (addr, bsize, req)
            num_allocs += 1
            allocated += bsize
            requested += req
            if allocated > peak_allocated:
                peak_allocated = allocated
            if requested > peak_requested:
                peak_requested = requested
        elif nbytes < 0:  # the same free-and-merge path as _simulate_default, inlined: both
            # loops are the hot path of a warm prediction
            if nbytes == RELEASE_CACHED:
                for pool in (0, 1):
                    reserved -= _unmap_free_tail(
                        pool, mapped_end, base, page, free_lists, free_start, free_end
                    )
                continue
            try:
                rec = live[key]
            except KeyError:
                raise _unknown_free(key) from None
            del live[key]
            if rec is zero:
                continue
            addr, bsize, req = rec
            allocated -= bsize
            requested -= req
            small = bsize <= small_size
            fl = free_lists[small]
            end = addr + bsize
            if end in free_start:  # merge with the free block after it
                bsize += free_start[end]
                del free_start[end]
                if len(fl) > compact_at[small]:
                    compact_at[small] = _compact(fl, free_start)
            if addr in free_end:  # merge with the free block before it
                paddr = free_end[addr]
                del free_end[addr]
                bsize += addr - paddr
                addr = paddr
                if len(fl) > compact_at[small]:
                    compact_at[small] = _compact(fl, free_start)
            free_start[addr] = bsize
            free_end[addr + bsize] = addr
            insort(fl, bsize << shift | addr)
        else:
            if key in live:
                raise _double_alloc(key)
            live[key] = zero

    num_pages = sum((mapped_end[p] - base[p]) // page[p] for p in (0, 1))
    return AllocatorResult(
        peak_allocated=peak_allocated,
        peak_reserved=peak_reserved,
        peak_requested=peak_requested,
        num_segments=num_pages,
        num_allocs=num_allocs,
        fits=fits,
        num_alloc_retries=retries,
    )


def _unmap_free_tail(
    pool: int,
    mapped_end: list[int],
    base: tuple[int, int],
    page: tuple[int, int],
    free_lists: tuple[list[int], list[int]],
    free_start: dict[int, int],
    free_end: dict[int, int],
) -> int:
    """Unmap the whole pages of the free block at the end of ``pool``'s mapped segment;
    returns the bytes unmapped. What is left of the block (under one page) stays free."""
    end = mapped_end[pool]
    if end not in free_end:
        return 0
    addr = free_end[end]
    pg = page[pool]
    keep_to = base[pool] + (addr - base[pool] + pg - 1) // pg * pg  # first page boundary
    if keep_to >= end:
        return 0
    del free_end[end]
    del free_start[addr]  # its list entry goes stale
    if keep_to > addr:
        free_start[addr] = keep_to - addr
        free_end[keep_to] = addr
        insort(free_lists[pool], (keep_to - addr) << _SHIFT | addr)
    mapped_end[pool] = keep_to
    return end - keep_to


def min_capacity(
    events: EventsLike,
    mode: str = "default",
    *,
    uncapped: AllocatorResult | None = None,
    tolerance: float = 0.005,
    segment_order: str = "ascending",
) -> int:
    """The smallest capacity (bytes the allocator may reserve) at which the replay of
    ``events`` runs without running out of memory.

    Under a limit, PyTorch's caching allocator does not fail when a new segment would
    pass it: it first gives back its cached, unused memory and tries again (``malloc``:
    ``alloc_block``, then ``release_cached_blocks`` and ``alloc_block`` once more; with
    expandable segments, the free pages are unmapped). So a step whose reserved peak,
    unlimited, is above a card's memory can still run on it, with its reserved memory held
    at the limit. The capacity that decides whether a step fits therefore lies between
    the allocated peak (no capacity below it can hold the live blocks) and the unlimited
    reserved peak (at which nothing is ever released); with expandable segments it can
    lie a little above the latter (see :func:`simulate`). It is found by bisection over
    capped replays in whole 2 MiB units (the allocator reserves nothing smaller), to
    within ``tolerance`` of itself. ``uncapped``: the replay's result without a limit,
    where the caller has it (with the same ``segment_order``, :func:`simulate`'s).

    Whether a step fits is close to monotone in the capacity but not exactly (a release
    changes where later blocks go); the bisection returns a capacity at which the replay
    was seen to fit.
    """
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be between 0 and 1, but got {tolerance=}.")
    full = uncapped if uncapped is not None else simulate(events, mode, segment_order=segment_order)
    # reserved memory comes in whole 2 MiB units (segments and pages are multiples of it),
    # so the search runs over those: hi fits, lo does not
    unit = K_SMALL_BUFFER
    hi = -(-full.peak_reserved // unit)
    lo = -(-full.peak_allocated // unit) - 1  # the live blocks alone need more than this
    # with expandable segments a request is refused while the reserved bytes plus its
    # whole allocation size pass the limit, so the unlimited peak may not be enough
    step = max(1, hi // 16)
    # in default mode the replay capped at its unlimited peak never meets the limit, so it
    # runs as the unlimited one did and fits: only expandable segments need the check
    while (
        mode != "default"
        and not simulate(events, mode, capacity=hi * unit, segment_order=segment_order).fits
    ):
        lo, hi, step = hi, hi + step, step * 2
    while hi - lo > 1 and (hi - lo) * unit > tolerance * hi * unit:
        mid = (lo + hi) // 2
        if simulate(events, mode, capacity=mid * unit, segment_order=segment_order).fits:
            hi = mid
        else:
            lo = mid
    return max(hi, 0) * unit


#: how many replays :func:`replay` keeps: a comparison over every catalog GPU replays a
#: few dozen batch sizes of one spec
REPLAY_CACHE_SIZE = 256
_replays: OrderedDict[tuple[str, bytes], tuple[AllocatorResult, int]] = OrderedDict()
_replays_lock = threading.Lock()


def replay(events: EventsLike, mode: str = "default") -> tuple[AllocatorResult, int]:
    """The unlimited replay of ``events`` (:func:`simulate`) and the smallest capacity it
    runs in (:func:`min_capacity`), remembered for the same events and mode.

    Neither depends on the device: a step predicted for several GPUs (``CostModel.compare``,
    a loop of ``predict`` calls) replays its allocations once. The events are keyed by a
    digest of their bytes, not kept; the :data:`REPLAY_CACHE_SIZE` most recently used
    replays are remembered, for any thread.
    """
    if mode not in ALLOC_MODES:
        raise ValueError(f"unknown allocator mode {mode!r}; valid modes are {list(ALLOC_MODES)}")
    arr = np.ascontiguousarray(np.asarray(events, dtype=np.int64))
    digest = hashlib.blake2b(arr.tobytes(), digest_size=20)
    digest.update(str(arr.shape).encode())
    key = (mode, digest.digest())
    with _replays_lock:
        hit = _replays.get(key)
        if hit is not None:
            _replays.move_to_end(key)
            return hit
    full = simulate(arr, mode)
    found = (full, min_capacity(arr, mode, uncapped=full))
    with _replays_lock:
        _replays[key] = found
        while len(_replays) > REPLAY_CACHE_SIZE:
            _replays.popitem(last=False)
    return found
