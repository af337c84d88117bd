"""benchmarks/oom_boundary.py's scoring, on runs made by hand."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import oom_boundary  # noqa: E402

GiB = 1 << 30


def _run(status: str, cap: float, point: float, reserved: float | None = None) -> dict[str, object]:
    return {
        "family": "f",
        "status": status,
        "cap": cap * GiB,
        "point": point * GiB,
        "measured_reserved": None if reserved is None else reserved * GiB,
        "measured_allocated": point * GiB,
        "simulated_allocated": point * GiB,
    }


def test_the_floor_is_the_margin_that_admits_no_oom_and_the_fits_it_must_reject() -> None:
    rows = [
        _run("oom", 8, 7.9),  # cap / point 1.0127: the margin must pass it
        _run("oom", 8, 8.5),
        _run("fits", 8, 7.95, reserved=8.0),  # 1.0063: rejected by that margin
        _run("fits", 8, 7.0, reserved=7.5),  # 1.143: admitted
        _run("fits", 8, 8.2, reserved=7.96),  # point over the cap, yet it ran: rejected
    ]
    floor = oom_boundary._floor(rows)
    assert floor["margin"] == 1.013  # the next 0.1% step over 8 / 7.9 = 1.0127
    assert floor["rejected"] == 2 and floor["fits"] == 3
    assert floor["within_1pct"] == 2  # 8.0 and 7.96 of 8 GiB


def test_the_coverage_table_ends_with_what_the_point_alone_decides() -> None:
    rows = [
        {**_run("oom", 8, 7.9), "new@0.99": 8.1 * GiB},  # the point admits it, the bound not
        {**_run("fits", 8, 7.8), "new@0.99": 8.05 * GiB},  # the bound rejects a fit
        {**_run("fits", 8, 7.0), "new@0.99": 7.2 * GiB},
    ]
    assert oom_boundary._coverage_table(rows, [0.99]) == [
        "| coverage | admitted OOM | fits rejected |",
        "|---|---|---|",
        "| 99.0% | 0 / 1 | 1 / 2 (50.0%) |",
        '| the point (`Budget(bound="point")`) | 1 / 1 | 0 / 2 (0.0%) |',
    ]


def test_the_batch_size_figure_counts_what_the_search_leaves_out_of_the_range_that_ran() -> None:
    def search(family: str, fit: int, oom: int | None, edge: int, found: int) -> dict[str, object]:
        runs = {fit: "fits", **({oom: "oom"} if oom else {}), edge: "fits"}
        return {
            "family": family, "cap": 8 * GiB, "fit": fit, "oom": oom,
            "found_edge": edge, "edge_outcome": oom_boundary._outcome(edge, runs),
            "found": found, "outcome": oom_boundary._outcome(found, runs),
        }  # fmt: skip

    searches = [
        search("a", 100, 104, 101, 90),  # 10% left out
        search("b", 50, 52, 51, 51),  # above the largest that ran: not a loss
        search("c", 20, None, 20, 20),  # no boundary
    ]
    text = "\n".join(oom_boundary._batch_size_table(searches))
    assert "a mean 5.0% of the range (at most 10.0%)" in text
    assert "| a | 8 GiB | 100 | 104 | 101 (fits) | 90 (below a fit) |" in text
    assert "| c | 8 GiB | 20 | none | 20 (fits) | 20 (fits) |" in text


def test_what_the_measured_runs_say_of_a_size() -> None:
    runs = {10: "fits", 14: "oom", 12: "fits"}
    assert oom_boundary._outcome(12, runs) == "fits" and oom_boundary._outcome(14, runs) == "oom"
    assert oom_boundary._outcome(11, runs) == "below a fit"
    assert oom_boundary._outcome(15, runs) == "above an OOM"
    assert oom_boundary._outcome(13, runs) == "not measured"


def test_a_fit_that_held_less_than_the_simulated_capacity_is_counted_as_the_simulations() -> None:
    """A fitting run's reserved peak below the simulated capacity (in proportion to its
    measured allocated peak) shows the allocator simulation overstated the need."""
    under = {
        **_run("fits", 24, 25.5, reserved=23.2),
        "measured_allocated": 20.7 * GiB,
        "simulated_allocated": 20.2 * GiB,
        "simulated_min_capacity": 25.4 * GiB,  # x1.257 the allocated: 26.0 GiB at 20.7
        "new": 26 * GiB,
    }
    fine = {
        **_run("fits", 24, 23.0, reserved=23.9),
        "simulated_min_capacity": 23.1 * GiB,
        "new": 23.5 * GiB,
    }
    u = oom_boundary._ran_under(under)
    assert u is not None and abs(u - 23.2 / (25.4 / 20.2 * 20.7)) < 1e-12
    assert oom_boundary._ran_under({**fine, "measured_reserved": None}) is None
    table = "\n".join(oom_boundary._point_error_table([under, fine], ["f"]))
    assert f"| 1 of 2 (down to {u:.3f}x) |" in table
    said = oom_boundary._overstated([under, fine])
    assert (
        said.startswith("1 of the 2 fitting runs held over 1% less")
        and "1 of them were rejected" in said
    )
    assert oom_boundary._overstated([fine]).startswith("No fitting run held over 1% less")


def test_the_closest_call_is_the_oom_run_whose_bound_lay_nearest_its_cap() -> None:
    rows = [
        {**_run("oom", 8, 7.9), "cap_gib": 8, "batch_size": 51, "new": 8.04 * GiB},
        {**_run("oom", 12, 11.0), "cap_gib": 12, "batch_size": 9, "new": 13 * GiB},
        {**_run("fits", 8, 7.0), "cap_gib": 8, "batch_size": 40, "new": 7.1 * GiB},
    ]
    for r, shipped in zip(rows, (7.96, 12.5, 7.0)):
        r["shipped_new"] = shipped * GiB
    text = oom_boundary._closest_call(rows)
    # held out: 8.04 over 8 GiB (0.50%); shipped: 7.96 under 8 GiB, so admitted (0.50%)
    assert "held out by family, f at 8 GiB, batch 51: its bound over the cap by 0.50%" in text
    assert "the shipped model, f at 8 GiB, batch 51: its bound under the cap by 0.50%" in text
