"""Tests of the CUDA caching allocator replay (``costaware.core.allocator``).

Expected values are worked out by hand from the rules of ``CUDACachingAllocator.cpp``; the
random-sequence tests also compare the fast replay with a slow, literal model of the C++ code
(``_RefAllocator`` below: doubly linked blocks, best fit by scanning the pool).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

import costaware.core.allocator as allocator
from costaware.core.allocator import (
    ALLOC_MODES,
    RELEASE_CACHED,
    AllocatorResult,
    allocation_size,
    min_capacity,
    replay,
    round_size,
    simulate,
)

KiB = 1 << 10
MiB = 1 << 20

Events = list[tuple[int, int]]


# ---------------------------------------------------------------------------------------------
# round_size / allocation_size


@pytest.mark.parametrize(
    ("nbytes", "expected"),
    [
        (0, 512),
        (1, 512),
        (511, 512),
        (512, 512),
        (513, 1024),
        (MiB, MiB),
        (MiB + 1, MiB + 512),
        (10 * MiB - 1, 10 * MiB),
        (10 * MiB, 10 * MiB),
        (10 * MiB + 1, 10 * MiB + 512),
    ],
)
def test_round_size(nbytes: int, expected: int) -> None:
    assert round_size(nbytes) == expected


@pytest.mark.parametrize(
    ("nbytes", "expected"),
    [
        (0, 2 * MiB),
        (1, 2 * MiB),
        (511, 2 * MiB),
        (512, 2 * MiB),
        (513, 2 * MiB),
        (MiB, 2 * MiB),  # the largest small-pool request
        (MiB + 1, 20 * MiB),  # rounds to 1 MiB + 512: large pool, 1-10 MiB -> kLargeBuffer
        (10 * MiB - 512, 20 * MiB),
        # get_allocation_size sees the rounded size, and 10 MiB - 1 rounds up to 10 MiB,
        # which is not below kMinLargeAlloc: rounded up to a multiple of 2 MiB instead.
        (10 * MiB - 1, 10 * MiB),
        (10 * MiB, 10 * MiB),
        (10 * MiB + 1, 12 * MiB),
        (50 * MiB, 50 * MiB),
        (51 * MiB + 1, 52 * MiB),
    ],
)
def test_allocation_size(nbytes: int, expected: int) -> None:
    assert allocation_size(nbytes) == expected


# ---------------------------------------------------------------------------------------------
# default mode, hand-computed


def test_single_small_alloc_reserves_one_small_segment() -> None:
    r = simulate([(1, 100)])
    assert r == AllocatorResult(
        peak_allocated=512,
        peak_reserved=2 * MiB,
        peak_requested=100,
        num_segments=1,
        num_allocs=1,
    )


def test_largest_small_request_stays_in_small_pool() -> None:
    assert simulate([(1, MiB)]).peak_reserved == 2 * MiB
    assert simulate([(1, MiB + 1)]).peak_reserved == 20 * MiB


def test_5mib_alloc_reserves_20mib_and_splits() -> None:
    r = simulate([(1, 5 * MiB)])
    assert r.peak_reserved == 20 * MiB
    # remainder 15 MiB > 1 MiB: split, so only the 5 MiB block counts as allocated
    assert r.peak_allocated == 5 * MiB
    assert r.num_segments == 1


def test_50mib_alloc_reserves_50mib() -> None:
    r = simulate([(1, 50 * MiB)])
    assert r.peak_reserved == 50 * MiB
    assert r.peak_allocated == 50 * MiB


def test_51mib_plus_1_reserves_52mib_and_allocates_the_whole_block() -> None:
    r = simulate([(1, 51 * MiB + 1)])
    assert r.peak_reserved == 52 * MiB
    # rounded request 51 MiB + 512; remainder 1 MiB - 512 is not > 1 MiB, so the block is
    # not split and allocated_bytes counts all of it
    assert r.peak_allocated == 52 * MiB
    assert r.peak_requested == 51 * MiB + 1


def test_two_5mib_allocs_share_one_20mib_segment() -> None:
    r = simulate([(1, 5 * MiB), (2, 5 * MiB)])
    assert r.peak_reserved == 20 * MiB
    assert r.peak_allocated == 10 * MiB
    assert r.num_segments == 1


def test_unsplit_free_block_counts_whole_in_allocated() -> None:
    # 5 MiB splits a 20 MiB segment into [5 used][15 free]; 14.5 MiB takes the 15 MiB block,
    # remainder 0.5 MiB is not > 1 MiB: not split, so 15 MiB counts as allocated.
    r = simulate([(1, 5 * MiB), (2, 14 * MiB + 512 * KiB)])
    assert r.peak_reserved == 20 * MiB
    assert r.peak_allocated == 20 * MiB
    assert r.peak_requested == 19 * MiB + 512 * KiB


def test_free_and_realloc_same_size_reuses_the_block() -> None:
    r = simulate([(1, 5 * MiB), (1, -1), (2, 5 * MiB)])
    assert r.peak_reserved == 20 * MiB
    assert r.peak_allocated == 5 * MiB
    assert r.num_segments == 1
    r = simulate([(1, 50 * MiB), (1, -1), (2, 50 * MiB)])
    assert r.peak_reserved == 50 * MiB
    assert r.num_segments == 1


def test_smaller_request_reuses_larger_free_block() -> None:
    r = simulate([(1, 50 * MiB), (1, -1), (2, 30 * MiB)])
    assert r.peak_reserved == 50 * MiB
    assert r.peak_allocated == 50 * MiB
    assert r.num_segments == 1


def test_best_fit_picks_smallest_sufficient_block() -> None:
    # Free blocks of 50 MiB (lower address) and 30 MiB. Best fit puts 25 MiB into the 30 MiB
    # one, so 48 MiB still fits in the 50 MiB one. (First fit would need a new segment.)
    events = [
        (1, 50 * MiB),
        (2, 30 * MiB),
        (1, -1),
        (2, -1),
        (3, 25 * MiB),
        (4, 48 * MiB),
    ]
    r = simulate(events)
    assert r.peak_reserved == 80 * MiB
    assert r.num_segments == 2


def _four_5mib_blocks() -> Events:
    # One 20 MiB segment: A=[0,5) B=[5,10) C=[10,15) D=[15,20) MiB. D takes the last 5 MiB
    # whole (remainder 0).
    return [(1, 5 * MiB), (2, 5 * MiB), (3, 5 * MiB), (4, 5 * MiB)]


def test_fragmented_free_blocks_force_a_new_segment() -> None:
    events = [*_four_5mib_blocks(), (1, -1), (3, -1), (5, 10 * MiB)]
    r = simulate(events)
    # A and C are free but not contiguous: no 10 MiB block, so a 10 MiB segment is added
    assert r.peak_reserved == 30 * MiB
    assert r.num_segments == 2
    assert r.peak_allocated == 20 * MiB


def test_adjacent_free_blocks_coalesce() -> None:
    events = [*_four_5mib_blocks(), (1, -1), (2, -1), (5, 10 * MiB)]
    r = simulate(events)
    # A and B merge into one free 10 MiB block that takes the request
    assert r.peak_reserved == 20 * MiB
    assert r.num_segments == 1


def test_free_block_merges_with_both_neighbours() -> None:
    base = [*_four_5mib_blocks(), (1, -1), (3, -1)]
    # without B freed, a 15 MiB request needs its own segment (15 MiB -> 16 MiB)
    assert simulate([*base, (5, 15 * MiB)]).peak_reserved == 36 * MiB
    # freeing B merges A, B and C into one 15 MiB block
    r = simulate([*base, (2, -1), (5, 15 * MiB)])
    assert r.peak_reserved == 20 * MiB
    assert r.num_segments == 1


def test_small_and_large_pools_are_separate() -> None:
    # a fully free 2 MiB small-pool segment is not used for a 2 MiB (large-pool) request
    r = simulate([(1, MiB), (1, -1), (2, 2 * MiB)])
    assert r.peak_reserved == 22 * MiB
    assert r.num_segments == 2
    # and a free large-pool block is not used for a small request
    r = simulate([(1, 5 * MiB), (1, -1), (2, 100)])
    assert r.peak_reserved == 22 * MiB
    assert r.num_segments == 2


def test_many_small_allocs_fill_small_segments() -> None:
    # 4096 blocks of 512 B fill one 2 MiB segment exactly; one more needs a second segment
    events = [(k, 512) for k in range(4096)]
    assert simulate(events).peak_reserved == 2 * MiB
    assert simulate([*events, (4096, 1)]).peak_reserved == 4 * MiB


# ---------------------------------------------------------------------------------------------
# expandable segments, hand-computed

EXP = "expandable_segments"


def test_expandable_single_allocs() -> None:
    r = simulate([(1, 100)], EXP)
    assert (r.peak_reserved, r.peak_allocated) == (2 * MiB, 512)
    r = simulate([(1, 5 * MiB)], EXP)
    assert (r.peak_reserved, r.peak_allocated) == (20 * MiB, 5 * MiB)  # one 20 MiB page
    r = simulate([(1, 51 * MiB + 1)], EXP)
    # three 20 MiB pages; with expandable segments any remainder >= 512 B is split off
    assert (r.peak_reserved, r.peak_allocated) == (60 * MiB, 51 * MiB + 512)
    assert r.num_segments == 3  # mapped pages


def test_expandable_reserves_far_less_than_default_for_growing_sizes() -> None:
    # Allocate and free 30, 32, ..., 50 MiB in turn. Default mode can never reuse the freed
    # (smaller) block: 11 segments, 30 + 32 + ... + 50 = 440 MiB. The expandable segment maps
    # 2 pages (40 MiB) for 30 MiB, serves 32..40 MiB from them, maps a third page for 42 MiB
    # and serves the rest: 60 MiB.
    events: Events = []
    for k, mib in enumerate(range(30, 51, 2)):
        events += [(k, mib * MiB), (k, -1)]
    default = simulate(events)
    expandable = simulate(events, EXP)
    assert default.peak_reserved == 440 * MiB
    assert default.num_segments == 11
    assert expandable.peak_reserved == 60 * MiB
    assert expandable.num_segments == 3
    assert default.peak_allocated == expandable.peak_allocated == 50 * MiB


def test_expandable_prefers_blocks_away_from_the_segment_end() -> None:
    # X=18 MiB maps page 1: X=[0,18), free [18,20). Y=2 MiB takes [18,20) whole. Z=5 MiB maps
    # page 2: Z=[20,25), free tail [25,40). Freeing X leaves [0,18) free. For W=12 MiB the
    # smallest fit is the 15 MiB tail, but get_free_block prefers the 18 MiB block because the
    # tail can grow: W=[0,12). Then V=16 MiB fits nowhere (6 MiB and 15 MiB free), so the tail
    # is extended by one page: 60 MiB mapped. (Plain best fit would stay at 40 MiB.)
    events = [
        (1, 18 * MiB),
        (2, 2 * MiB),
        (3, 5 * MiB),
        (1, -1),
        (4, 12 * MiB),
        (5, 16 * MiB),
    ]
    r = simulate(events, EXP)
    assert r.peak_reserved == 60 * MiB
    assert r.peak_allocated == 35 * MiB  # Y + Z + W + V = 2 + 5 + 12 + 16


def test_expandable_small_and_large_pools_are_separate() -> None:
    r = simulate([(1, MiB), (1, -1), (2, 2 * MiB)], EXP)
    assert r.peak_reserved == 22 * MiB  # one 2 MiB small page, one 20 MiB large page


def test_expandable_freed_blocks_are_reused_without_mapping() -> None:
    events = [*_four_5mib_blocks(), (1, -1), (2, -1), (5, 10 * MiB)]
    r = simulate(events, EXP)
    assert r.peak_reserved == 20 * MiB
    assert r.peak_allocated == 20 * MiB


# ---------------------------------------------------------------------------------------------
# event handling


@pytest.mark.parametrize("mode", ALLOC_MODES)
def test_zero_byte_allocs_are_ignored(mode: str) -> None:
    r = simulate([(1, 0), (1, -1)], mode)
    assert r == AllocatorResult(0, 0, 0, 0, 0)
    r = simulate([(1, 0), (2, 100), (1, -1), (2, -1), (1, 0), (1, -1)], mode)
    assert r.peak_reserved == 2 * MiB
    assert r.peak_allocated == 512
    assert r.num_allocs == 1


@pytest.mark.parametrize("mode", ALLOC_MODES)
def test_free_of_unknown_key_raises(mode: str) -> None:
    with pytest.raises(ValueError, match="not allocated"):
        simulate([(1, 100), (2, -1)], mode)
    with pytest.raises(ValueError, match="not allocated"):
        simulate([(1, 100), (1, -1), (1, -1)], mode)  # double free


@pytest.mark.parametrize("mode", ALLOC_MODES)
def test_alloc_of_live_key_raises(mode: str) -> None:
    with pytest.raises(ValueError, match="still allocated"):
        simulate([(1, 100), (1, 200)], mode)
    with pytest.raises(ValueError, match="still allocated"):
        simulate([(1, 0), (1, 0)], mode)


@pytest.mark.parametrize("mode", ALLOC_MODES)
def test_key_reuse_after_free(mode: str) -> None:
    r = simulate([(7, 5 * MiB), (7, -1), (7, 5 * MiB), (7, -1), (7, 100)], mode)
    assert r.num_allocs == 3
    assert r.peak_allocated == 5 * MiB
    assert r.peak_reserved == 22 * MiB


def test_bad_mode_lists_valid_modes() -> None:
    with pytest.raises(ValueError, match="unknown allocator mode") as info:
        simulate([(1, 100)], mode="garbage_collection")
    for mode in ALLOC_MODES:
        assert mode in str(info.value)
    assert ALLOC_MODES == ("default", "expandable_segments")


@pytest.mark.parametrize("mode", ALLOC_MODES)
def test_numpy_input_matches_list_input(mode: str) -> None:
    events = _random_events(np.random.default_rng(5), 600)
    array = np.array(events, dtype=np.int64)
    assert simulate(array, mode) == simulate(events, mode)
    assert simulate(array.astype(np.int32), mode) == simulate(events, mode)
    # numpy scalars inside a plain list work too
    mixed = [(np.int64(k), np.int64(n)) for k, n in events]
    assert simulate(mixed, mode) == simulate(events, mode)  # type: ignore[arg-type]


def test_numpy_input_is_validated() -> None:
    with pytest.raises(ValueError, match="shape"):
        simulate(np.zeros((4, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="integer"):
        simulate(np.ones((4, 2), dtype=np.float64))
    assert simulate(np.zeros((0, 2), dtype=np.int64)) == AllocatorResult(0, 0, 0, 0, 0)


def test_empty_events() -> None:
    assert simulate([]) == AllocatorResult(0, 0, 0, 0, 0)
    assert simulate([], EXP) == AllocatorResult(0, 0, 0, 0, 0)


# ---------------------------------------------------------------------------------------------
# random sequences: invariants, and agreement with a literal model of the C++ allocator

_SIZE_PALETTE = [
    1,
    512,
    4 * KiB,
    100 * KiB,
    MiB - 1,
    MiB,
    MiB + 1,
    2 * MiB,
    5 * MiB,
    10 * MiB - 1,
    10 * MiB,
    19 * MiB,
    20 * MiB,
    33 * MiB,
]


def _random_events(rng: np.random.Generator, n_allocs: int) -> Events:
    """A random alloc/free sequence mixing exact repeats, small and large sizes, zero-byte
    allocations, key reuse and both LIFO and random free orders; everything is freed at the
    end."""
    events: Events = []
    live: list[int] = []
    free_keys: list[int] = []
    next_key = 0
    made = 0
    while made < n_allocs or live:
        if made < n_allocs and (not live or rng.random() < 0.55):
            u = rng.random()
            if u < 0.35:
                nbytes = int(_SIZE_PALETTE[rng.integers(len(_SIZE_PALETTE))])
            elif u < 0.65:
                nbytes = int(np.exp(rng.uniform(0.0, np.log(MiB))))
            elif u < 0.97:
                nbytes = int(np.exp(rng.uniform(np.log(MiB), np.log(80 * MiB))))
            else:
                nbytes = 0
            if free_keys and rng.random() < 0.3:
                key = free_keys.pop(int(rng.integers(len(free_keys))))
            else:
                key = next_key
                next_key += 1
            events.append((key, nbytes))
            live.append(key)
            made += 1
        else:
            idx = len(live) - 1 if rng.random() < 0.6 else int(rng.integers(len(live)))
            key = live.pop(idx)
            events.append((key, -1))
            free_keys.append(key)
    return events


class _Block:
    __slots__ = ("addr", "allocated", "mapped", "next", "prev", "size")

    def __init__(self, addr: int, size: int, mapped: bool = True) -> None:
        self.addr = addr
        self.size = size
        self.allocated = False
        self.mapped = mapped
        self.prev: _Block | None = None
        self.next: _Block | None = None


_UNMAPPED_SPACE = 1 << 50  # stands in for the (huge) unmapped rest of an expandable segment


class _RefAllocator:
    """Slow, literal model of DeviceCachingAllocator for one stream (see the C++ names)."""

    def __init__(self, expandable: bool, descending: bool = False) -> None:
        self.expandable = expandable
        self.descending = descending  # default mode: each new segment below the earlier ones
        self.pools: dict[bool, list[_Block]] = {True: [], False: []}  # free mapped blocks
        self.unmapped: dict[bool, _Block] = {}
        self.next_addr = 1 << 62 if descending else 1 << 30
        self.allocated = self.reserved = self.requested = 0
        self.peak_allocated = self.peak_reserved = self.peak_requested = 0
        self.live: dict[int, tuple[_Block, int, bool] | None] = {}
        self.num_allocs = 0
        self.num_segments = 0

    def malloc(self, key: int, nbytes: int) -> None:
        assert key not in self.live
        if nbytes == 0:
            self.live[key] = None
            return
        size = round_size(nbytes)
        small = size <= MiB
        block = self.get_free_block(small, size)
        if block is None:
            block = self.alloc_block(small, size)
        remaining = block.size - size
        # should_split
        split = remaining >= 512 if small or self.expandable else remaining > MiB
        if split:  # alloc_found_block
            new = _Block(block.addr, size)
            new.prev = block.prev
            if new.prev is not None:
                new.prev.next = new
            new.next = block
            block.prev = new
            block.addr += size
            block.size -= size
            self.pools[small].append(block)
            block = new
        block.allocated = True
        self.live[key] = (block, nbytes, small)
        self.num_allocs += 1
        self.allocated += block.size
        self.requested += nbytes
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_requested = max(self.peak_requested, self.requested)

    def get_free_block(self, small: bool, size: int) -> _Block | None:
        candidates = sorted(
            (b for b in self.pools[small] if b.size >= size), key=lambda b: (b.size, b.addr)
        )
        if not candidates:
            return None
        it = 0
        if self.expandable:

            def expandable_size(b: _Block) -> int:
                nxt = b.next
                return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

            while it + 1 < len(candidates) and expandable_size(
                candidates[it + 1]
            ) < expandable_size(candidates[it]):
                it += 1
        block = candidates[it]
        self.pools[small].remove(block)
        return block

    def alloc_block(self, small: bool, size: int) -> _Block:
        if not self.expandable:
            seg = allocation_size(size)
            if self.descending:
                self.next_addr -= seg + (1 << 30)
                block = _Block(self.next_addr, seg)
            else:
                block = _Block(self.next_addr, seg)
                self.next_addr += seg + (1 << 30)
            self.reserved += seg
            self.num_segments += 1
            self.peak_reserved = max(self.peak_reserved, self.reserved)
            return block
        # try_allocate_expandable_block
        if small not in self.unmapped:
            self.unmapped[small] = _Block(self.next_addr, _UNMAPPED_SPACE, mapped=False)
            self.next_addr += _UNMAPPED_SPACE + (1 << 30)
        unmapped = self.unmapped[small]
        page = 2 * MiB if small else 20 * MiB
        prev = unmapped.prev
        have = prev.size if prev is not None and not prev.allocated else 0
        grow = -(-(size - have) // page) * page
        mapped = _Block(unmapped.addr, grow)
        mapped.prev = unmapped.prev
        if mapped.prev is not None:
            mapped.prev.next = mapped
        mapped.next = unmapped
        unmapped.prev = mapped
        unmapped.addr += grow
        unmapped.size -= grow
        self.reserved += grow
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        if have:  # merge the new pages with the free block before them
            assert prev is not None
            self.pools[small].remove(prev)
            self.merge(mapped, prev)
        return mapped

    def merge(self, dst: _Block, src: _Block) -> None:
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    def free(self, key: int) -> None:
        rec = self.live.pop(key)
        if rec is None:
            return
        block, nbytes, small = rec
        block.allocated = False
        self.allocated -= block.size
        self.requested -= nbytes
        for cand in (block.prev, block.next):
            if cand is not None and not cand.allocated and cand.mapped:
                self.pools[small].remove(cand)
                self.merge(block, cand)
        self.pools[small].append(block)

    def run(self, events: Sequence[tuple[int, int]]) -> AllocatorResult:
        for key, nbytes in events:
            if nbytes >= 0:
                self.malloc(key, nbytes)
            else:
                self.free(key)
        if self.expandable:
            pages = 0
            for small, unmapped in self.unmapped.items():
                mapped = _UNMAPPED_SPACE - unmapped.size
                pages += mapped // (2 * MiB if small else 20 * MiB)
            self.num_segments = pages
        return AllocatorResult(
            peak_allocated=self.peak_allocated,
            peak_reserved=self.peak_reserved,
            peak_requested=self.peak_requested,
            num_segments=self.num_segments,
            num_allocs=self.num_allocs,
        )


@pytest.mark.parametrize("mode", ALLOC_MODES)
def test_random_sequence_invariants(mode: str) -> None:
    events = _random_events(np.random.default_rng(0), 2500)
    assert len(events) >= 5000
    r = simulate(events, mode)
    assert r.num_allocs > 2000
    assert r.peak_requested > 0
    assert r.peak_allocated >= r.peak_requested
    assert r.peak_reserved >= r.peak_allocated
    assert r.peak_reserved % (2 * MiB) == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("mode", ALLOC_MODES)
def test_random_sequence_matches_literal_model(mode: str, seed: int) -> None:
    events = _random_events(np.random.default_rng(seed), 1200)
    expected = _RefAllocator(expandable=mode == EXP).run(events)
    assert simulate(events, mode) == expected


@pytest.mark.parametrize("seed", [1, 2])
def test_segments_placed_below_the_earlier_ones_match_the_literal_model(seed: int) -> None:
    events = _random_events(np.random.default_rng(seed), 1200)
    expected = _RefAllocator(expandable=False, descending=True).run(events)
    assert simulate(events, segment_order="descending") == expected
    with pytest.raises(ValueError, match=r"valid orders are \['ascending', 'descending'\]"):
        simulate(events, segment_order="random")


def test_where_a_new_segment_goes_decides_which_tied_block_is_taken() -> None:
    # a (40 MiB) is freed into its segment S1 and c takes S1's lower half; b's 20 MiB
    # segment S2 is then free too, so d (20 MiB) ties between S1's upper half and S2 and
    # takes the lower address. Above the earlier ones, S2 is higher: d splits S1 and e
    # (40 MiB) needs a segment of its own. Below, d takes S2, c's free merges S1 whole and
    # e reuses it.
    events: Events = [
        (1, 40 * MiB), (2, 20 * MiB), (1, -1), (3, 20 * MiB), (2, -1), (4, 20 * MiB),
        (3, -1), (5, 40 * MiB),
    ]  # fmt: skip
    assert simulate(events).peak_reserved == 100 * MiB
    assert simulate(events, segment_order="descending").peak_reserved == 60 * MiB
    # under a cap, above: releasing S2 (whole, free) leaves S1 (d live) and e's new 40 MiB
    assert min_capacity(events, tolerance=1e-6) == 80 * MiB
    assert min_capacity(events, tolerance=1e-6, segment_order="descending") == 60 * MiB


@pytest.mark.parametrize("mode", ALLOC_MODES)
def test_repeated_training_steps_match_literal_model(mode: str) -> None:
    # A step-like pattern: activations kept for backward and freed in reverse, temporaries
    # freed at once, a few long-lived buffers; repeated so cached blocks get reused.
    rng = np.random.default_rng(11)
    layer_sizes = [int(s) for s in rng.integers(1, 40 * MiB, size=30)]
    events: Events = []
    key = 0
    for _step in range(3):
        saved: list[int] = []
        for s in layer_sizes:
            events += [(key, s), (key + 1, s // 3 + 1), (key + 1, -1)]
            saved.append(key)
            key += 2
        for k in reversed(saved):
            events += [(key, 4 * KiB), (k, -1), (key, -1)]
            key += 1
    expected = _RefAllocator(expandable=mode == EXP).run(events)
    assert simulate(events, mode) == expected


# ---------------------------------------------------------------------------------------------
# under a capacity: release the cache and retry, as the allocator does before it raises


def test_a_step_that_fits_only_after_the_cache_is_released() -> None:
    # A's 30 MiB segment stays cached once A is freed; B needs a 40 MiB segment of its own.
    events: Events = [(1, 30 * MiB), (1, -1), (2, 40 * MiB)]
    free = simulate(events)
    assert free.peak_reserved == 70 * MiB and free.peak_allocated == 40 * MiB
    capped = simulate(events, capacity=50 * MiB)
    # 30 + 40 > 50: A's segment (one free block) goes back, then 0 + 40 fits
    assert capped.fits and capped.num_alloc_retries == 1
    assert capped.peak_reserved == 40 * MiB
    assert min_capacity(events) == 40 * MiB


def test_a_step_that_cannot_fit_even_after_the_release() -> None:
    # A and B are both live at the end: 70 MiB is the least they can be held in
    events: Events = [(1, 30 * MiB), (2, 40 * MiB)]
    capped = simulate(events, capacity=60 * MiB)
    assert not capped.fits and capped.num_alloc_retries == 1
    assert simulate(events, capacity=70 * MiB).fits
    assert min_capacity(events) == 70 * MiB


@pytest.mark.parametrize("mode", ["default", "expandable_segments"])
def test_a_release_gives_back_the_cached_memory_and_not_the_live(mode: str) -> None:
    # A (30 MiB) is freed and stays cached; B (40 MiB) is live. After the release, C
    # (30 MiB) needs new memory again, so the reserved peak stays 70 MiB, not 100.
    events: Events = [(1, 30 * MiB), (1, -1), (2, 40 * MiB), (0, RELEASE_CACHED), (3, 30 * MiB)]
    released = simulate(events, mode)
    assert released.peak_allocated == 70 * MiB
    kept = simulate([e for e in events if e[1] != RELEASE_CACHED], mode)
    assert released.peak_reserved == kept.peak_reserved  # C reuses A's cached memory
    # without C: the release lowers what is held, not the peak, and frees nothing live
    assert simulate(events[:4], mode).peak_reserved == simulate(events[:3], mode).peak_reserved
    # a release costs nothing where nothing is cached
    assert simulate([(0, RELEASE_CACHED), *events], mode) == simulate(events, mode)
    if mode == "default":  # A's segment went back, B's stays
        assert simulate(events[:4]).num_segments == 1 and simulate(events[:3]).num_segments == 2


def test_a_release_before_a_larger_request_lets_it_fit_under_a_capacity() -> None:
    # A 30 MiB cached segment and a 40 MiB request under a 45 MiB capacity: with the
    # release first, no retry is needed; the peak is the same 40 MiB either way
    events: Events = [(1, 30 * MiB), (1, -1), (0, RELEASE_CACHED), (2, 40 * MiB)]
    capped = simulate(events, capacity=45 * MiB)
    assert capped.fits and capped.num_alloc_retries == 0 and capped.peak_reserved == 40 * MiB


def test_a_split_segment_is_not_released_but_expandable_segments_fit() -> None:
    # X takes a 40 MiB segment and frees it; Y (15 MiB) splits it and stays live, so the
    # segment cannot go back. Z (30 MiB) needs a new 30 MiB segment: 70 MiB.
    events: Events = [(1, 40 * MiB), (1, -1), (2, 15 * MiB), (3, 30 * MiB)]
    assert simulate(events).peak_reserved == 70 * MiB
    default = simulate(events, capacity=60 * MiB)
    assert not default.fits
    # Expandable segments: X maps two 20 MiB pages, Y takes 15 MiB of them. Z is refused
    # first (40 mapped + its 30 MiB allocation size > 60), the free tail's whole page
    # [20, 40) MiB is unmapped, and then Z maps two pages after the 5 MiB left free:
    # 20 + 40 = 60 MiB.
    expandable = simulate(events, "expandable_segments", capacity=60 * MiB)
    assert expandable.fits and expandable.num_alloc_retries == 1
    assert expandable.peak_reserved == 60 * MiB
    assert min_capacity(events) == 70 * MiB
    assert min_capacity(events, "expandable_segments") <= 60 * MiB


def test_no_capacity_and_a_large_one_replay_alike() -> None:
    rng = np.random.default_rng(3)
    events = _random_events(rng, 400)
    for mode in ALLOC_MODES:
        free = simulate(events, mode)
        big = simulate(events, mode, capacity=free.peak_reserved)
        assert big == free  # the limit is never reached: nothing is released


def test_min_capacity_is_at_least_the_allocated_peak_and_fits() -> None:
    rng = np.random.default_rng(4)
    for _ in range(5):
        events = _random_events(rng, 300)
        for mode in ALLOC_MODES:
            free = simulate(events, mode)
            need = min_capacity(events, mode, uncapped=free)
            assert free.peak_allocated <= need
            assert simulate(events, mode, capacity=need).fits
            if mode == "default":  # nothing is ever released at the unlimited peak
                assert need <= free.peak_reserved


def test_a_negative_capacity_or_tolerance_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity must be at least 0"):
        simulate([(1, MiB)], capacity=-1)
    with pytest.raises(ValueError, match="tolerance must be between 0 and 1"):
        min_capacity([(1, MiB)], tolerance=0)


# ---------------------------------------------------------------------------------------------
# replay: the unlimited replay and the least capacity, once per events and mode


def _counting_replays(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The modes of the unlimited replays made from here on (capped ones are not counted)."""
    made: list[str] = []
    real = allocator.simulate

    def counted(
        events: object,
        mode: str = "default",
        capacity: int | None = None,
        *,
        segment_order: str = "ascending",
    ) -> AllocatorResult:
        if capacity is None:
            made.append(mode)
        return real(events, mode, capacity, segment_order=segment_order)  # type: ignore[arg-type]

    monkeypatch.setattr(allocator, "simulate", counted)
    monkeypatch.setattr(allocator, "_replays", type(allocator._replays)())
    return made


def test_replay_is_simulate_and_min_capacity_once_per_events_and_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = _counting_replays(monkeypatch)
    events = _random_events(np.random.default_rng(6), 200)
    for mode in ALLOC_MODES:
        full = simulate(events, mode)
        assert replay(events, mode) == (full, min_capacity(events, mode, uncapped=full))
    made.clear()
    for mode in ALLOC_MODES:  # the same events again, as a list or as an array
        again = replay(np.asarray(events, dtype=np.int64), mode)
        assert again == replay(events, mode)
    assert made == []
    other = [*events, (10**6, MiB)]  # one more allocation: another step
    replay(other)
    assert made == ["default"]
    with pytest.raises(ValueError, match="unknown allocator mode"):
        replay(events, "native")


def test_replay_remembers_only_the_most_recent(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _counting_replays(monkeypatch)
    monkeypatch.setattr(allocator, "REPLAY_CACHE_SIZE", 2)
    steps = [[(1, n * MiB)] for n in (1, 2, 3)]
    for e in steps:
        replay(e)
    assert len(allocator._replays) == 2
    made.clear()
    replay(steps[2])
    replay(steps[1])
    assert made == []
    replay(steps[0])  # the least recently used, forgotten
    assert made == ["default"]
