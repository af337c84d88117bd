from __future__ import annotations

import math
from dataclasses import replace

import pytest
from torch import nn

import costaware as ca
from costaware._format import fmt_seconds
from costaware.core.model import Prediction

GiB = 2**30


def _pred(
    peak: float = 10 * GiB, upper: float = 12 * GiB, epoch: float | None = 100.0, epochs: int = 3
) -> Prediction:
    return Prediction(
        peak_memory=int(peak),
        peak_memory_upper=int(upper),
        iteration_time=0.1,
        iteration_time_upper=0.2,
        epoch_time=epoch,
        epoch_time_upper=None if epoch is None else epoch * 1.5,
        trial_time=None if epoch is None else epoch * epochs,
        device="A10",
        kind="analytic",
        coverage=None,
        spec={"epochs": epochs, "name": "m"},
        basis={},
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24GiB", 24 * GiB),
        ("24 GB", 24 * GiB),
        ("512MiB", 512 * 2**20),
        (1024, 1024),
        ("1.5GiB", int(1.5 * GiB)),
    ],
)
def test_parse_bytes(text: str | int, expected: int) -> None:
    assert ca.parse_bytes(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", 90.0),
        ("5min", 300.0),
        ("1.5h", 5400.0),
        (42, 42.0),
        ("42", 42.0),
        ("2 days", 172800.0),
        # compound durations and milliseconds
        ("1h30m", 5400.0),
        ("2h 15min", 8100.0),
        ("1m 30s", 90.0),
        ("1d 2h 3m 4s", 86400 + 7200 + 180 + 4),
        ("1ms", 0.001),
        ("250ms", 0.25),
        ("1s 500ms", 1.5),
    ],
)
def test_parse_duration(text: str | int, expected: float) -> None:
    assert ca.parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text", ["24G", "24g", "24GB", "24 GB", "24Gb", "24gb", "24GiB", "24 gib", "24.0 G"]
)
def test_memory_units_are_binary_whatever_the_spelling(text: str) -> None:
    """nvidia-smi and PyTorch count GPU memory in GiB: "24G" and "24GB" mean 24 GiB."""
    assert ca.parse_bytes(text) == 24 * GiB
    assert ca.Budget(max_memory=text).max_memory_bytes() == 24 * GiB
    assert ca.parse_bytes("512M") == ca.parse_bytes("512MB") == 512 * 2**20
    assert ca.parse_bytes("1k") == ca.parse_bytes("1KB") == 1024
    assert ca.parse_bytes("2T") == 2 * 2**40


@pytest.mark.parametrize(("value", "shown"), [(24, "24"), ("24", "'24'"), (80.0, "80.0")])
def test_a_bare_number_under_one_mib_warns(value: object, shown: str) -> None:
    number = f"{float(value):g}"  # type: ignore[arg-type]
    with pytest.warns(UserWarning) as caught:
        budget = ca.Budget(max_memory=value)  # type: ignore[arg-type]
    (w,) = caught
    assert str(w.message) == (
        f"max_memory={shown} has no unit, so it is {number} bytes; did you mean "
        f"max_memory='{number}GiB'? Write the unit to silence this (max_memory='{number}B' "
        "for bytes)."
    )
    assert w.filename == __file__  # points at the line that built the budget
    assert budget.max_memory_bytes() == int(float(value))  # type: ignore[arg-type]


def test_sizes_with_a_unit_or_large_bare_numbers_do_not_warn() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for value in ("24B", "1MiB", "24GiB", 2**20, 24 * GiB, "25769803776", "90%", "auto"):
            ca.Budget(max_memory=value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1h30", r"but got '1h30', whose part '30' has no unit\."),
        ("1h 30x", r"but got '1h 30x', whose part '30x' has the unknown unit 'x'\."),
        (
            "soon",
            r"expected a duration like 90s, 250ms, 10min, 1\.5h or 1h30m \(or seconds\), but got 'soon'\.",
        ),
        ("", r"but got ''\."),
        ("1h-30m", r"but got '1h-30m'\."),
        ("0h 0m", r"a duration must be positive, but got '0h 0m'"),
    ],
)
def test_bad_durations_say_what_was_expected(text: str, message: str) -> None:
    with pytest.raises(ca.BudgetError, match=message):
        ca.parse_duration(text)
    with pytest.raises(ca.BudgetError, match=message):
        ca.Budget(max_epoch_time=text)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_memory": "24 parsecs"}, "expected a memory size like 24GiB"),
        ({"max_memory": "150%"}, "percentage must be in"),
        ({"max_memory": -3}, "must be positive"),
        ({"max_epoch_time": "soon"}, "expected a duration like 90s"),
        ({"max_cost": 10.0}, "max_cost needs price_per_hour"),
        ({"price_per_hour": -1.0}, r"price_per_hour must be >= 0, but got price_per_hour=-1\.0"),
        ({"bound": "lower"}, "'upper' or 'point'"),
        ({"safety_margin": -0.1}, "safety_margin"),
    ],
)
def test_bad_budgets_say_what_was_expected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ca.BudgetError, match=message):
        ca.Budget(**kwargs)  # type: ignore[arg-type]


def test_memory_limit_counts_the_cuda_context() -> None:
    a10 = ca.get_device("A10")
    budget = ca.Budget(max_memory="16GiB")
    ok = budget.decide(_pred(upper=12 * GiB))
    assert ok.admit and "memory ok" in str(ok)
    near = budget.decide(_pred(upper=16 * GiB - a10.context_overhead_bytes // 2))
    assert not near.admit  # fits the limit alone, not with the context
    (reason,) = near.reasons
    assert reason.kind == "memory" and reason.limit == 16 * GiB
    assert (
        reason.predicted == 16 * GiB - a10.context_overhead_bytes // 2 + a10.context_overhead_bytes
    )
    assert "CUDA context" in reason.message and "exceeds the 16.00 GiB budget" in reason.message


def _capacity_pred(need: float, reserved: float) -> Prediction:
    """A prediction whose step needs ``need`` bytes (upper bound) but reserves ``reserved``
    with room to spare."""
    return replace(
        _pred(peak=reserved * 0.9, upper=reserved),
        min_capacity=int(need * 0.9),
        min_capacity_upper=int(need),
    )


def test_the_decision_is_on_the_memory_the_step_needs_not_its_reserved_peak() -> None:
    # reserved 26 GiB with room to spare, but it runs in 18 GiB: a 24 GiB budget admits it
    pred = _capacity_pred(need=18 * GiB, reserved=26 * GiB)
    decision = ca.Budget(max_memory="24GiB").decide(pred, device="H100")
    assert decision.admit
    assert decision.checked["memory"]["figure"] == "min_capacity_upper"
    assert (
        decision.checked["memory"]["predicted"]
        == 18 * GiB + ca.get_device("H100").context_overhead_bytes
    )
    rejected = ca.Budget(max_memory="16GiB").decide(pred, device="H100")
    (reason,) = rejected.reasons
    assert "predicted memory need 18.00 GiB (upper bound)" in reason.message


def test_a_step_over_the_card_is_rejected_by_every_budget() -> None:
    # the GPT-2 on an RTX 4090: 25.2 GiB predicted, 28.8 GiB at its upper bound
    pred = _capacity_pred(need=28.8 * GiB, reserved=28.8 * GiB)
    for budget in (
        ca.Budget(),
        ca.Budget(max_epoch_time="1h"),
        ca.Budget(max_memory="auto"),
    ):
        decision = budget.decide(pred, device="RTX-4090")
        assert not decision.admit, budget
        (reason,) = decision.reasons
        assert reason.kind == "memory"
        assert reason.limit == ca.get_device("RTX-4090").memory_bytes
        assert "all of the RTX-4090's memory" in reason.message


def test_a_limit_above_the_card_warns_once_and_the_card_decides() -> None:
    pred = _capacity_pred(need=28.8 * GiB, reserved=28.8 * GiB)
    budget = ca.Budget(max_memory="48GiB")
    with pytest.warns(UserWarning, match=r"max_memory='48GiB' is more than the RTX-4090's"):
        decision = budget.decide(pred, device="RTX-4090")
    assert not decision.admit
    assert decision.checked["memory"]["limit_from"] == "device"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second decision does not warn again
        budget.decide(pred, device="RTX-4090")


def test_an_older_prediction_without_capacity_decides_on_its_reserved_peak() -> None:
    pred = _pred(peak=10 * GiB, upper=30 * GiB)
    assert pred.min_capacity == pred.peak_memory
    assert pred.min_capacity_upper == pred.peak_memory_upper


def test_point_bound_and_safety_margin() -> None:
    pred = _pred(peak=10 * GiB, upper=30 * GiB)
    assert not ca.Budget(max_memory="20GiB").decide(pred).admit
    assert ca.Budget(max_memory="20GiB", bound="point").decide(pred).admit
    assert not ca.Budget(max_memory="20GiB", bound="point", safety_margin=1.5).decide(pred).admit


def test_relative_memory_needs_the_device() -> None:
    budget = ca.Budget(max_memory="50%")
    assert budget.max_memory_bytes("A10") == ca.get_device("A10").memory_bytes // 2
    with pytest.raises(ca.BudgetError, match="relative to a device"):
        budget.max_memory_bytes()
    assert (
        ca.Budget(max_memory="auto").max_memory_bytes("H100") == ca.get_device("H100").memory_bytes
    )


def test_reasons_read_apart_from_their_limit() -> None:
    """A figure just over its limit is written with the decimals that tell the two apart."""
    d = ca.Budget(max_epoch_time="3s").decide(_pred(epoch=3.04))
    assert "predicted epoch time 3.04 s (prediction) exceeds 3.00 s" in str(d)
    small = _pred(peak=100 * 2**20, upper=160.4 * 2**20)
    d = ca.Budget(max_memory="160MiB").decide(small, device="cpu")
    assert "160.4 MiB (upper bound) exceeds the 160.0 MiB budget" in str(d)
    # with a CUDA context, the sum is what the limit is compared with
    d = ca.Budget(max_memory="1.156GiB").decide(small, device="A10")
    assert "(upper bound) + 1.00 GiB CUDA context = 1.157 GiB exceeds the 1.156 GiB" in str(d)
    # apart already: the usual format
    d = ca.Budget(max_epoch_time="3s").decide(_pred(epoch=5.0))
    assert "predicted epoch time 5.0 s (prediction) exceeds 3.0 s" in str(d)
    (r,) = ca.Budget(max_memory="1GiB").check_measured(peak_memory=1.0004 * GiB)
    assert "measured peak memory 1.0004 GiB exceeds the 1.0000 GiB budget" in r.message


def test_time_budgets() -> None:
    pred = _pred(epoch=100.0, epochs=3)  # upper bound 150 s per epoch, 450 s per trial
    assert ca.Budget(max_epoch_time="200s", time_bound="upper").decide(pred).admit
    d = ca.Budget(max_epoch_time="2min", time_bound="upper").decide(pred)
    assert [r.kind for r in d.reasons] == ["epoch_time"] and "exceeds 2.0 min" in str(d)
    assert "(upper bound)" in str(d)
    assert not ca.Budget(max_trial_time="7min", time_bound="upper").decide(pred).admit
    # times are checked at the point prediction by default, memory at its upper bound
    assert ca.Budget(max_epoch_time="2min").decide(pred).admit
    assert ca.Budget(max_trial_time="7min").decide(pred).admit
    d = ca.Budget(max_epoch_time="90s").decide(pred)
    assert not d.admit and "(prediction)" in str(d)
    assert ca.Budget().time_bound == "point" and ca.Budget().bound == "upper"
    total = ca.Budget(max_total_time="1h").decide(pred, spent_time=3400)
    assert [r.kind for r in total.reasons] == ["total_time"]
    no_epoch = ca.Budget(max_epoch_time="1s").decide(_pred(epoch=None))
    assert no_epoch.admit and "no dataset_size" in no_epoch.checked["epoch_time"]["note"]


def test_the_trial_time_and_cost_are_those_of_the_trials_steps_on_every_gpu() -> None:
    """The trial is the iteration time times the spec's trial steps (epochs cut at
    max_steps), and a data-parallel trial pays for each of its GPUs."""
    spec = ca.TrainingSpec(
        model=lambda: nn.Linear(8, 2),
        batch=ca.ImageBatch((8,), classes=2),
        batch_size=10,
        dataset_size=4000,
        epochs=10,
        max_steps=50,
        world_size=4,
    )
    pred = ca.CostModel().predict(spec, device="H100")
    assert spec.steps_per_epoch == 100 and spec.trial_steps == 50
    assert pred.trial_time == pytest.approx(pred.iteration_time * 50)
    assert pred.trial_time < pred.epoch_time  # max_steps ends it within the first epoch
    trial = pred.trial_time
    at = ca.Budget(max_trial_time=trial * 1.01).decide(pred)
    assert at.admit and at.checked["trial_time"]["predicted"] == pytest.approx(trial)
    assert not ca.Budget(max_trial_time=trial * 0.99).decide(pred).admit
    upper = ca.Budget(max_trial_time=trial * 1.01, time_bound="upper").decide(pred)
    assert upper.checked["trial_time"]["predicted"] == pytest.approx(
        pred.iteration_time_upper * 50
    )
    gpu_hours = trial / 3600 * 4
    cheap = ca.Budget(price_per_hour=2.0, max_cost=gpu_hours * 2.0 * 1.01).decide(pred)
    assert cheap.admit and cheap.checked["cost"]["predicted"] == pytest.approx(gpu_hours * 2.0)
    over = ca.Budget(price_per_hour=2.0, max_cost=gpu_hours * 2.0 * 0.99).decide(pred)
    assert [r.kind for r in over.reasons] == ["cost"] and "(4 GPUs)" in over.reasons[0].message
    assert "trial time" in pred.explain() and "max_steps=50" in pred.explain()


def test_max_time_caps_the_trial_time_and_stands_for_a_trial_without_an_end() -> None:
    """Training stops at max_time (Lightning's Timer): the trial time, its upper bound and
    the time a budget checks are at most that, and exactly that where the epochs have no
    limit."""
    kw = dict(
        model=lambda: nn.Linear(8, 2),
        batch=ca.ImageBatch((8,), classes=2),
        batch_size=10,
        dataset_size=4000,
        epochs=10,
    )
    model = ca.CostModel()
    free = model.predict(ca.TrainingSpec(**kw), device="H100")
    long = free.trial_time * 2
    assert model.predict(ca.TrainingSpec(**kw, max_time=long), device="H100").trial_time == (
        pytest.approx(free.trial_time)
    )
    short = free.trial_time / 4
    cut = model.predict(ca.TrainingSpec(**kw, max_time=short), device="H100")
    assert cut.trial_time == pytest.approx(short) and cut.trial_time_upper == pytest.approx(short)
    assert f"max_time={fmt_seconds(short)}" in cut.explain()
    # a safety margin does not grow the trial past the time it stops at
    margin = ca.Budget(max_trial_time=short * 1.01, safety_margin=0.5).decide(cut)
    assert margin.admit and margin.checked["trial_time"]["predicted"] == pytest.approx(short)
    # no epoch limit: max_time is the trial, and a budget checks it
    endless = model.predict(
        ca.TrainingSpec(**{**kw, "epochs": None}, max_time="2h"), device="H100"
    )
    assert endless.trial_time == 7200.0 and endless.trial_time_upper == 7200.0
    over = ca.Budget(max_trial_time="1h").decide(endless)
    assert [r.kind for r in over.reasons] == ["trial_time"]
    unknown = model.predict(ca.TrainingSpec(**{**kw, "epochs": None}), device="H100")
    assert unknown.trial_time is None
    assert "trial_time" in ca.Budget(max_trial_time="1h").decide(unknown).not_checked


def test_a_check_that_did_not_run_is_shown_as_not_checked() -> None:
    """Without dataset_size there is no epoch time: the time limits are not checked, and
    the decision says so (never "epoch_time ok")."""
    why = (
        "no dataset_size in the spec, so no epoch time was predicted; give "
        "TrainingSpec(dataset_size=...) to check it"
    )
    d = ca.Budget(max_epoch_time="1s").decide(_pred(epoch=None))
    assert d.admit
    assert str(d) == f"admit: memory ok; not checked: epoch_time ({why})"
    assert d.checked["limits"] == ["memory"] and d.not_checked == {"epoch_time": why}
    assert d.to_dict()["checked"]["not_checked"] == {"epoch_time": why}
    every = ca.Budget(
        max_memory="20GiB",
        max_epoch_time="1s",
        max_trial_time="1min",
        max_total_time="1h",
        price_per_hour=2.0,
        max_cost=10.0,
    ).decide(_pred(epoch=None))
    assert "ok" not in str(every).replace("memory ok", "")
    assert list(every.not_checked) == ["epoch_time", "trial_time", "total_time", "cost"]
    no_length = (
        "the spec does not say how long the trial is, so its time is unknown; give "
        "TrainingSpec(dataset_size=...) with epochs, max_steps=... or max_time=... to check it"
    )
    assert str(every) == (
        f"admit: memory ok; not checked: epoch_time ({why}); "
        f"not checked: trial_time, total_time, cost ({no_length})"
    )
    # a rejection says what it could not check too
    rejected = ca.Budget(max_memory="1GiB", max_epoch_time="1s").decide(_pred(epoch=None))
    assert str(rejected).startswith("reject: predicted memory need")
    assert str(rejected).endswith(f"; not checked: epoch_time ({why})")
    # with an epoch time, everything is checked and nothing is said about it
    checked = ca.Budget(max_epoch_time="1h", max_total_time="1d").decide(_pred(epoch=10.0))
    assert str(checked) == "admit: memory ok, epoch_time ok, total_time ok"
    assert checked.not_checked == {} and "not_checked" not in checked.checked
    assert str(ca.Budget().decide(_pred())) == "admit: memory ok"


def test_cost_budget_and_several_reasons() -> None:
    budget = ca.Budget(max_memory="8GiB", max_epoch_time="1min", price_per_hour=3.6, max_cost=1.0)
    d = budget.decide(_pred(epoch=100.0), spent_cost=0.8)
    assert {r.kind for r in d.reasons} == {"memory", "epoch_time", "cost"}
    assert not d and d.to_dict()["admit"] is False
    cost = next(r for r in d.reasons if r.kind == "cost")
    assert cost.predicted == pytest.approx(0.8 + 300 / 3600 * 3.6)  # 3 epochs at the point
    upper = replace(budget, time_bound="upper").decide(_pred(epoch=100.0), spent_cost=0.8)
    cost = next(r for r in upper.reasons if r.kind == "cost")
    assert cost.predicted == pytest.approx(0.8 + 450 / 3600 * 3.6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # past a float's range: an OverflowError from int(inf) before
        (
            {"max_memory": "1e400GB"},
            r"expected a finite memory size like 24GiB, but got '1e400GB', which is too large",
        ),
        ({"max_memory": 10**400}, r"but got 100000000000\.\.\. \(401 digits\), which is too large"),
        ({"max_memory": math.inf}, "expected a finite memory size like 24GiB, but got inf"),
        ({"max_memory": math.nan}, "expected a memory size like 24GiB, but got nan, which is NaN"),
        # under one byte: a 0-byte limit before
        (
            {"max_memory": "0.4B"},
            r"at least 1 byte, but got '0\.4B' \(0\.4 bytes\)",
        ),
        ({"max_memory": 0.4}, r"at least 1 byte, but got 0\.4\."),
        ({"max_memory": "0GiB"}, "at least 1 byte, but got '0GiB'"),
        ({"max_epoch_time": "1e400s"}, "expected a finite duration like 10min, but got '1e400s'"),
        ({"max_trial_time": math.nan}, "expected a duration like 10min, but got nan, which is NaN"),
        ({"max_total_time": 10**400}, "expected a finite duration like 10min"),
        ({"max_epoch_time": "0min"}, "a duration must be positive, but got '0min'"),
        # NaN compares False with everything: the cost cap was silently off
        (
            {"price_per_hour": math.nan, "max_cost": 10.0},
            "expected a price_per_hour like 2.5, but got price_per_hour=nan, which is NaN",
        ),
        (
            {"price_per_hour": 2.0, "max_cost": math.nan},
            "expected a max_cost like 2.5, but got max_cost=nan, which is NaN",
        ),
        ({"price_per_hour": math.inf}, "expected a finite price_per_hour like 2.5"),
        ({"price_per_hour": 2.0, "max_cost": 0}, "max_cost must be positive, but got max_cost=0"),
        (
            {"price_per_hour": 0, "max_cost": 10.0},
            "max_cost=10.0 needs a positive price_per_hour, but got price_per_hour=0",
        ),
        ({"price_per_hour": "3"}, "price_per_hour must be a number, but got price_per_hour='3'"),
        ({"safety_margin": math.nan}, "adds 10%., but got nan"),
        ({"safety_margin": True}, "safety_margin must be a fraction of the prediction added"),
        ({"safety_margin": 10}, "up to .not including. 10 .0.1 adds 10%., but got 10"),
    ],
)
def test_budgets_refuse_overflow_zero_and_nan(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ca.BudgetError, match=message):
        ca.Budget(**kwargs)  # type: ignore[arg-type]


def test_a_relative_limit_under_one_byte_is_refused() -> None:
    budget = ca.Budget(max_memory="1e-12%")
    with pytest.raises(
        ca.BudgetError, match=r"max_memory='1e-12%' of the T4's .* less than 1 byte"
    ):
        budget.max_memory_bytes("T4")
    assert ca.Budget(max_memory="1B").max_memory_bytes() == 1
    assert ca.Budget(price_per_hour=0).price_per_hour == 0  # a free device: costs show as 0


def test_budget_is_frozen_and_hashable() -> None:
    b = ca.Budget(max_memory="24GiB")
    assert hash(b) == hash(replace(b))


def test_check_measured_counts_the_context_on_gpus_only() -> None:
    budget = ca.Budget(max_memory="2GiB", max_epoch_time="10s", max_trial_time="1min")
    t4 = ca.get_device("T4")  # 0.5 GiB of CUDA context
    (reason,) = budget.check_measured(device=t4, peak_memory=1.75 * GiB)
    assert reason.kind == "memory" and "CUDA context" in reason.message
    assert budget.check_measured(device=ca.get_device("cpu"), peak_memory=1.75 * GiB) == ()
    kinds = [r.kind for r in budget.check_measured(epoch_time=12.0, trial_time=61.0)]
    assert kinds == ["epoch_time", "trial_time"]
    with pytest.raises(ca.BudgetError, match="relative to a device"):
        ca.Budget(max_memory="90%").check_measured(peak_memory=1.0)


def test_the_study_cost_so_far_is_its_time_at_the_price_and_a_spent_budget_is_said() -> None:
    """Without a spent_cost, what the study spent is its time at price_per_hour: a study
    that has spent 30 min at $4/h has spent $2 of a $3 cap; ``exhausted`` says when what
    is spent alone reaches a cap, whatever the next trial costs."""
    pred = _pred(epoch=60.0, epochs=1)  # one epoch of a minute: $0.067 at $4/h
    budget = ca.Budget(price_per_hour=4.0, max_cost=3.0)
    assert budget.decide(pred, spent_time=1800).checked["cost"]["predicted"] == pytest.approx(
        2.0 + 60 / 3600 * 4.0
    )
    over = budget.decide(pred, spent_time=2690)  # $2.989 spent + $0.067
    assert [r.kind for r in over.reasons] == ["cost"]
    assert budget.decide(pred, spent_time=2690, spent_cost=0.0).admit  # a cost given wins
    assert budget.exhausted(2690) is None
    assert "spent 3.00 of its 3.00 max_cost" in str(budget.exhausted(2700))
    assert ca.Budget(max_total_time="1h").exhausted(3599) is None
    assert "max_total_time" in str(ca.Budget(max_total_time="1h").exhausted(3600))
    assert ca.Budget().exhausted(10**9) is None  # no study-wide cap


def test_a_memory_budget_under_the_devices_cuda_context_is_refused_up_front() -> None:
    """Every trial's need includes the CUDA context: a max_memory at or below it would
    reject every trial, which the pruner, searcher and scheduler say when they are made."""
    from costaware.integrations.optuna import CostAwarePruner

    a10 = ca.get_device("A10")
    tight = ca.Budget(max_memory=a10.context_overhead_bytes)
    with pytest.raises(ca.BudgetError, match="leaves no room for a trial on the A10") as info:
        tight.check_room("A10")
    assert "Give max_memory more than 1.00 GiB" in str(info.value)
    with pytest.raises(ca.BudgetError, match="leaves no room"):
        CostAwarePruner(budget=tight, device="A10")
    ca.Budget(max_memory=a10.context_overhead_bytes + 2**20).check_room("A10")
    tight.check_room("cpu")  # no CUDA context on a CPU
    ca.Budget(max_epoch_time="1min").check_room("A10")  # no memory limit: nothing to refuse
    CostAwarePruner(budget=tight)  # "auto": resolved when a trial is judged
