"""One configuration across GPUs: ``CostModel.compare``, ``costaware compare``, the device
catalog's additions and own devices, and the report's "On other GPUs" section."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import costaware as ca
from costaware import zoo
from costaware.cli import main
from costaware.core.batch_size import NothingFitsError, max_batch_size
from costaware.core.compare import (
    DEFAULT_PRICES,
    CompareError,
    Comparison,
    DeviceOption,
    UnusedPriceWarning,
    parse_prices,
)
from costaware.core.model import UNSEEN_DEVICE_WIDENING
from costaware.device_files import device_from_dict, load_devices
from costaware.devices import precision_notes
from costaware.reporting import Report, TrialRow, _apply_prediction

ROOT = Path(__file__).resolve().parents[2]

#: a step whose largest batch is limited by memory on every GPU (its input is large)
_WIDE = functools.partial(zoo.mlp, 6 * 256 * 256, (64,), 10)


def _spec(batch_size: int = 64, precision: str = "fp32") -> ca.TrainingSpec:
    return ca.TrainingSpec(
        model=_WIDE,
        batch=ca.ImageBatch((6 * 256 * 256,), classes=10),
        batch_size=batch_size,
        precision=precision,
        dataset_size=50_000,
        name="wide_mlp",
    )


@pytest.fixture(scope="module")
def model() -> ca.CostModel:
    return ca.CostModel.default()


@pytest.fixture(scope="module")
def result(model: ca.CostModel) -> ca.compare.Comparison:  # type: ignore[name-defined]
    return model.compare(
        _spec(), devices=["A10G", "T4", "H100", "L4"], price_per_hour={"A10G": 1.2}
    )


@pytest.fixture
def tiny_file(tmp_path: Path) -> Path:
    f = tmp_path / "tiny.py"
    f.write_text(
        "from torch import nn\n"
        "def mlp():\n"
        "    return nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))\n"
        "def huge():\n"
        "    return nn.Sequential(nn.Linear(32, 50000), nn.ReLU(), nn.Linear(50000, 60000),\n"
        "                         nn.ReLU(), nn.Linear(60000, 4))\n"
    )
    return f


# -- the comparison ----------------------------------------------------------------------
def test_each_device_has_fit_largest_batch_times_and_cost(result: ca.compare.Comparison) -> None:  # type: ignore[name-defined]
    assert sorted(result.devices) == ["A10G", "H100-SXM", "L4", "T4"]
    for o in result.options:
        assert o.fits and o.decision is not None and o.decision.admit
        assert o.max_batch > 64 and o.max_batch_limited_by == "memory"
        assert 0 < o.iteration_time <= o.iteration_time_upper
        assert o.epoch_time == pytest.approx(o.iteration_time * 782)
        assert o.epoch_time_upper == pytest.approx(o.iteration_time_upper * 782)
        assert o.memory_need <= o.memory_usable
    a10g = result.option("A10G")
    assert a10g.price_per_hour == 1.2 and a10g.price_source == "given"
    assert a10g.cost_per_epoch == pytest.approx(a10g.epoch_time * 1.2 / 3600)
    # no price given for them: the documented default list price, with its source
    h100 = result.option("h100")
    assert h100.price_per_hour == DEFAULT_PRICES["H100-SXM"][0]
    assert "runpod" in (h100.price_source or "").lower()
    assert result.option("T4").price_per_hour is None  # no default for it
    assert result.option("T4").cost_per_epoch is None


def test_the_largest_batch_is_max_batch_sizes_answer(
    model: ca.CostModel,
    result: ca.compare.Comparison,  # type: ignore[name-defined]
) -> None:
    for name in ("T4", "A10G"):
        found = max_batch_size(model, _spec(), name)
        o = result.option(name)
        search = o.batch_search
        assert search is not None and search.decision.admit
        assert search.rejected is not None and not search.rejected.admit
        assert max(search.tried) > o.max_batch and o.max_batch + 1 in search.tried
        # the need is not monotone to the byte near the edge (the allocator rounds), so the
        # two searches may stop a size or two apart; never further than 1%
        assert abs(o.max_batch - found.batch_size) <= 0.01 * found.batch_size
        assert len(search.tried) < len(found.tried)


def _figures(c: ca.compare.Comparison) -> object:  # type: ignore[name-defined]
    """``c.to_dict()`` without the wall-clock times it records."""

    def strip(x: object) -> object:
        if isinstance(x, dict):
            return {
                k: strip(v)
                for k, v in x.items()
                if k not in ("elapsed_s", "latency_s", "trace_seconds")
            }
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return strip(json.loads(json.dumps(c.to_dict())))


def test_each_step_is_replayed_once_for_every_gpu_with_the_same_figures(
    model: ca.CostModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The allocator replay does not depend on the device: a comparison replays each batch
    size it tries once, whatever the number of GPUs, and its figures are the ones each
    GPU's replay of its own gives."""
    import costaware.core.allocator as allocator

    made: list[int] = []
    real = allocator.simulate

    def counted(events, mode="default", capacity=None, **kw):  # type: ignore[no-untyped-def]
        if capacity is None:
            made.append(len(events))
        return real(events, mode, capacity, **kw)

    devices = ["A10G", "T4", "H100", "L4"]
    model.compare(_spec(), devices=devices)  # the dry runs, cached from here on
    monkeypatch.setattr(allocator, "simulate", counted)
    monkeypatch.setattr(allocator, "_replays", type(allocator._replays)())
    again = model.compare(_spec(), devices=devices, price_per_hour={"A10G": 1.2})
    tried = {b for o in again.options if o.batch_search for b in o.batch_search.tried}
    assert len(made) == len(tried) < sum(len(o.batch_search.tried) for o in again.options)
    # with nothing remembered, every device replays its own: the same figures
    monkeypatch.setattr(allocator, "REPLAY_CACHE_SIZE", 0)
    monkeypatch.setattr(allocator, "_replays", type(allocator._replays)())
    made.clear()
    alone = model.compare(_spec(), devices=devices, price_per_hour={"A10G": 1.2})
    assert len(made) == sum(len(o.batch_search.tried) for o in alone.options)
    assert _figures(alone) == _figures(again)


def test_sorted_by_cost_with_prices_and_unpriced_last(result: ca.compare.Comparison) -> None:  # type: ignore[name-defined]
    assert result.sort == "cost"
    costs = [o.cost_per_epoch for o in result.options]
    priced = [c for c in costs if c is not None]
    assert priced == sorted(priced) and costs[: len(priced)] == priced
    by_time = result.sorted("time")
    assert [o.iteration_time for o in by_time] == sorted(o.iteration_time for o in by_time)
    with pytest.raises(CompareError, match="sort must be one of cost, time, batch, name"):
        result.sorted("speed")


def test_repr_is_a_table_and_to_dict_is_json(result: ca.compare.Comparison) -> None:  # type: ignore[name-defined]
    text = repr(result)
    assert text.splitlines()[0].startswith("wide_mlp: batch 64")
    for name in ("A10G", "H100-SXM", "L4", "T4"):
        assert name in text
    assert "sorted by cost" in text and "~: a public list price" in text
    data = json.loads(json.dumps(result.to_dict()))
    assert {o["device"] for o in data["options"]} == set(result.devices)
    assert data["options"][0]["max_batch_size"] == result.options[0].max_batch
    assert "H100-SXM" in data["measured_on"]


def test_without_an_epoch_the_table_shows_the_cost_it_is_sorted_by(model: ca.CostModel) -> None:
    """With no dataset_size the devices are ordered by the cost of a step, and the table
    shows that cost (per 1,000 steps) in the order it sorts by."""
    spec = dataclasses.replace(_spec(), dataset_size=None)
    c = model.compare(spec, devices=["A10G", "H100", "L4"], price_per_hour={"A10G": 1.2})
    lines = str(c).splitlines()
    assert "no dataset_size" in lines[0] and lines[1].split()[-2:] == ["$/1k", "steps"]
    shown = [float(row.split("$")[-1]) for row in lines[3:6]]
    assert shown == sorted(shown)
    expected = [1000 * o.cost_per_step for o in c.sorted("cost")]
    assert shown == pytest.approx(expected, rel=0.05)


def test_a_device_without_measurements_says_so_with_a_wider_bound(
    result: ca.compare.Comparison,  # type: ignore[name-defined]
) -> None:
    assert UNSEEN_DEVICE_WIDENING > 1
    h100, l4 = result.option("H100"), result.option("L4")
    assert h100.measured and not l4.measured
    assert l4.prediction is not None and h100.prediction is not None
    assert l4.prediction.basis["time_bound_widened"] == UNSEEN_DEVICE_WIDENING
    assert "time_bound_widened" not in h100.prediction.basis
    assert any("is not among the devices the model was trained on" in n for n in l4.notes)
    assert "*: no measurements of this device" in repr(result)


def test_bf16_on_a_gpu_without_bf16_is_flagged(model: ca.CostModel) -> None:
    assert not ca.get_device("T4").has_bf16 and not ca.get_device("V100").has_bf16
    assert ca.get_device("A10G").has_bf16 and ca.get_device("B200").has_bf16
    assert precision_notes(ca.get_device("T4"), "bf16")
    assert not precision_notes(ca.get_device("T4"), "fp16")
    assert not precision_notes(ca.get_device("L4"), "bf16")
    pred = model.predict(_spec(precision="bf16"), "V100")
    assert any("bf16 on the V100: it has no bf16 arithmetic" in n for n in pred.notes)


def test_bad_prices_are_refused_with_what_arrived(model: ca.CostModel) -> None:
    with pytest.raises(CompareError, match=r"price_per_hour must be 0 or more, but got -1"):
        model.compare(_spec(), devices=["L4"], price_per_hour=-1)
    with pytest.raises(CompareError, match=r"must be a number .*but got 'cheap'"):
        model.compare(_spec(), devices=["L4"], price_per_hour="cheap")
    with pytest.raises(CompareError, match=r"the price of 'L4' must be a finite number"):
        model.compare(_spec(), devices=["L4"], price_per_hour={"L4": math.nan})
    with pytest.raises(CompareError, match=r"expected a price as a number or NAME=PRICE"):
        parse_prices(["A10G=lots"])
    assert parse_prices(["A10G=1.2,L4=0.8"]) == {"A10G": 1.2, "L4": 0.8}
    assert parse_prices(["2.5"]) == 2.5


def test_an_unknown_device_suggests_close_names(model: ca.CostModel) -> None:
    with pytest.raises(ca.UnknownDeviceError, match=r"Did you mean 'A10', 'A10G'"):
        model.compare(_spec(), devices=["A10X"])


def test_a_spec_that_fits_nowhere_says_what_it_needs(model: ca.CostModel) -> None:
    spec = ca.TrainingSpec(
        model=functools.partial(zoo.mlp, 32, (50_000, 60_000), 4),
        batch=ca.ImageBatch((32,), classes=4),
        batch_size=8,
    )
    with pytest.raises(NothingFitsError) as info:
        model.compare(spec, devices=["T4", "L4"])
    msg = str(info.value)
    assert "fits on none of the devices compared (T4, L4), not even at batch size 1" in msg
    assert "the largest, the L4, allows" in msg and "devices with more memory" in msg
    # where the budget, not the GPU, is the smaller limit, a larger GPU is no answer
    with pytest.raises(NothingFitsError) as info:
        model.compare(spec, devices=["H100"], budget=ca.Budget(max_memory="1GiB"))
    msg = str(info.value)
    assert "Raise the budget's max_memory" in msg and "devices with more memory" not in msg


# -- the catalog and one's own devices ----------------------------------------------------
@pytest.mark.parametrize("name", ["A10G", "RTX-A6000", "L40", "L40S", "RTX-5090", "B200", "GH200"])
def test_the_catalog_has_what_people_rent_with_sources(name: str) -> None:
    d = ca.get_device(name)
    assert d.source and d.memory_source
    assert d.memory_source.split(":")[0].split(" (")[0] in (
        "measured",
        "public log",
        "assumed",
        "nominal",
    )


def test_own_devices_from_a_toml_or_json_file(tmp_path: Path, model: ca.CostModel) -> None:
    toml = tmp_path / "mine.toml"
    toml.write_text(
        "[[devices]]\n"
        'name = "my-a40"\n'
        'memory = "44GiB"\n'
        "bandwidth_gbs = 696\n"
        "tflops = { fp32 = 37.4, fp16 = 149.7, bf16 = 149.7 }\n"
        "sm_count = 84\n"
        'compute_capability = "8.6"\n'
        'generation = "Ampere"\n'
    )
    if sys.version_info >= (3, 11):
        (mine,) = load_devices(toml)
        assert mine.name == "my-a40" and mine.memory_bytes == 44 * 2**30
        assert mine.peak_flops("fp32") == pytest.approx(37.4e12)
        assert mine.context_overhead_bytes == ca.get_device("A10").context_overhead_bytes
    js = tmp_path / "mine.json"
    l4_fields = ca.get_device("L4").to_dict() | {"name": "my-l4", "aliases": []}
    js.write_text(json.dumps({"devices": [l4_fields]}))
    (l4,) = load_devices(js)
    assert l4.memory_bytes == ca.get_device("L4").memory_bytes
    r = model.compare(_spec(), devices=["my-l4", "L4"], extra_devices=[l4])
    assert r.option("my-l4").max_batch == r.option("L4").max_batch
    assert not r.option("my-l4").measured


def test_a_malformed_device_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"device 'x': unknown field\(s\) memroy"):
        device_from_dict({"name": "x", "memroy": "8GiB"})
    with pytest.raises(ValueError) as info:
        device_from_dict({"name": "x", "memory": "8GiB"})
    assert str(info.value) == (
        "device 'x' lacks bandwidth_gbs (or bandwidth in bytes/s), tflops (or flops in "
        "FLOP/s), sm_count."
    )
    with pytest.raises(ValueError) as info:  # only what is missing is named
        device_from_dict({"name": "x", "memory": "8GiB", "bandwidth_gbs": 300, "tflops": _TF})
    assert str(info.value) == "device 'x' lacks sm_count."
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        load_devices(bad)


_TF = {"fp32": 10, "fp16": 40, "bf16": 40}


def test_a_device_file_with_only_fp32_is_told_what_to_give(tmp_path: Path) -> None:
    k80 = {"name": "old-k80", "memory": "11.2GiB", "bandwidth_gbs": 240, "sm_count": 13}
    k80 |= {"tflops": {"fp32": 4.1}, "compute_capability": "3.7", "generation": "Kepler"}
    f = tmp_path / "lab.json"
    f.write_text(json.dumps({"devices": [k80]}))
    with pytest.raises(ValueError, match=r"device 'old-k80': tflops lacks fp16\. Give") as info:
        load_devices(f)
    assert "dense peak TFLOP/s" in str(info.value) and "fp32's where it lists none" in str(
        info.value
    )
    # with fp16 given, bf16 takes fp32's figure below compute capability 8.0, as tf32 does
    dev = device_from_dict(k80 | {"tflops": {"fp32": 4.1, "fp16": 4.1}})
    assert dev.flops["bf16"] == dev.flops["tf32"] == pytest.approx(4.1e12)
    with pytest.raises(ValueError, match=r"tflops lacks bf16"):  # Ampere on: no default
        device_from_dict(k80 | {"tflops": {"fp32": 4.1, "fp16": 8}, "compute_capability": "8.6"})
    with pytest.raises(ValueError, match=r"device 'old-k80': compute_capability must be"):
        device_from_dict(k80 | {"tflops": _TF, "compute_capability": "abc"})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "H100"}, r"the name 'H100' is the catalog's H100-SXM; .*such as 'lab-h100'"),
        ({"name": "h100_sxm"}, r"the name 'h100_sxm' is the catalog's H100-SXM"),
        ({"name": "mine", "aliases": ["NVIDIA L4"]}, r"the alias 'NVIDIA L4' is the catalog's L4"),
        ({"name": "auto"}, r"the name 'auto' is the catalog's 'auto'"),
    ],
)
def test_a_device_of_ones_own_cannot_take_a_catalog_name(
    fields: dict[str, object], message: str
) -> None:
    base = {"memory": "8GiB", "bandwidth_gbs": 300, "tflops": _TF, "sm_count": 10}
    with pytest.raises(ValueError, match=message):
        device_from_dict(base | fields)


def test_two_devices_of_one_name_in_a_file_are_refused(tmp_path: Path) -> None:
    one = {"name": "lab-a", "memory": "8GiB", "bandwidth_gbs": 300, "tflops": _TF, "sm_count": 10}
    f = tmp_path / "lab.json"
    f.write_text(json.dumps([one, one | {"name": "lab-b", "aliases": ["LAB_A"]}]))
    with pytest.raises(ValueError, match=r"two devices answer to the name 'laba' \('lab-a' and"):
        load_devices(f)


def test_a_price_for_a_device_not_compared_is_warned_of(model: ca.CostModel) -> None:
    with pytest.warns(UnusedPriceWarning) as warned:
        r = model.compare(_spec(), devices=["H100"], price_per_hour={"L4": 0.5, "H100": 3})
    assert str(warned[0].message) == (
        "price_per_hour prices L4, which is not among the devices compared (H100-SXM); its "
        "price is not used."
    )
    assert warned[0].filename == __file__  # the caller's line, not costaware's
    assert r.option("H100").price_per_hour == 3


def test_two_prices_for_one_device_are_refused(model: ca.CostModel) -> None:
    with pytest.raises(CompareError, match=r"prices the H100-SXM twice, as 'H100' and 'H100-SXM'"):
        model.compare(_spec(), devices=["H100"], price_per_hour={"H100": 1, "H100-SXM": 2})
    with pytest.raises(CompareError, match=r"'H100' has two prices \(H100=1 and h100=2\)"):
        parse_prices(["H100=1", "h100=2"])


# -- the table ----------------------------------------------------------------------------
def _option(device: str, **changes: object) -> DeviceOption:
    fields: dict[str, object] = {
        "device": device, "fits": True, "reasons": (), "max_batch": 128,
        "max_batch_limited_by": "memory", "iteration_time": 0.01, "iteration_time_upper": 0.02,
        "epoch_time": None, "epoch_time_upper": None, "memory_need": 2**30,
        "memory_usable": 16 * 2**30, "price_per_hour": 1.0, "measured": True,
        "price_source": "given",
    }  # fmt: skip
    return DeviceOption(**{**fields, **changes})  # type: ignore[arg-type]


def _table(*options: DeviceOption, notes: tuple[str, ...] = ()) -> str:
    spec = {"name": "net", "batch_size": 64, "optimizer": "adamw", "precision": "bf16"}
    return Comparison(
        spec=spec, options=options, sort="cost", currency="$", measured_on=("H100-SXM",),
        notes=notes, elapsed_s=1.0,
    ).table()  # fmt: skip


def test_the_table_counts_one_device_as_one() -> None:
    assert "; 1 device in 1.0 s;" in _table(_option("H100-SXM"))
    assert "; 2 devices in 1.0 s;" in _table(_option("H100-SXM"), _option("L4"))


def test_one_unmeasured_device_is_said_once_by_the_star() -> None:
    unseen = "L4 is not among the devices the model was trained on (H100-SXM): its time ..."
    text = _table(_option("L4", measured=False), notes=(unseen,))
    assert "*: no measurements of this device" in text and "note:" not in text


def test_bf16_without_bf16_arithmetic_is_one_footnote_naming_the_gpus() -> None:
    t4, v100 = (precision_notes(ca.get_device(n), "bf16") for n in ("T4", "V100"))
    text = _table(_option("T4", notes=tuple(t4)), _option("V100", notes=tuple(v100)))
    assert "T4 [1]" in text and "V100 [1]" in text and "[2]" not in text
    (line,) = [ln for ln in text.splitlines() if "no bf16 arithmetic" in ln]
    assert line.startswith("[1] bf16 on the T4 and V100: no bf16 arithmetic")


def test_a_device_where_nothing_fits_has_no_max_batch_and_no_cost() -> None:
    text = _table(
        _option("H100-SXM"),
        _option("T4", fits=False, max_batch=0, max_batch_limited_by="nothing fits"),
    )
    (t4,) = [ln for ln in text.splitlines() if ln.startswith("T4")]
    assert t4.split()[1:3] == ["no", "none"] and t4.rstrip().endswith("-")
    (h100,) = [ln for ln in text.splitlines() if ln.startswith("H100")]
    assert h100.split()[2] == "128" and "$0.0028" in h100  # 1,000 steps of 10 ms at $1/h
    assert "none: not even a batch of 1 fits" in text


# -- the command line ---------------------------------------------------------------------
def test_cli_prints_a_table_and_json(tiny_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["compare", f"{tiny_file}:mlp", "-b", "16", "--input", "32", "--classes", "4"]
    args += ["--dataset-size", "1000", "-d", "A10G,L4", "--price", "A10G=1.0", "--sort", "time"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("mlp: batch 16")
    assert "A10G" in out and "L4" in out and "sorted by time" in out
    assert main([*args, "--json", "--no-default-prices"]) == 0
    data = json.loads(capsys.readouterr().out)
    prices = {o["device"]: o["price_per_hour"] for o in data["options"]}
    assert prices == {"A10G": 1.0, "L4": None}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-d", "A10X"], "unknown device 'A10X'. Did you mean 'A10', 'A10G'"),
        (["-d", "L4", "--price", "-1"], "the price must be 0 or more, but got -1"),
        (["-d", "L4", "--price", "abc"], "expected a price as a number or NAME=PRICE"),
        (["-d", "L4", "--price", "L4=-2"], "the price of 'L4' must be 0 or more"),
        (["-d", ","], "--devices names no device"),
        (["-d", "H10O"], "unknown device 'H10O'. Did you mean 'H100' (the H100-SXM)"),
        (
            ["-d", "H100", "--price", "L4=0.5"],
            "--price prices L4, which is not among the devices compared (H100-SXM): add it "
            "to --devices, or drop its price.",
        ),
        (["-d", "H100", "--price", "H100=1,H100=2"], "'H100' has two prices (H100=1 and H100=2)"),
        (["-d", "H100", "--price", "H100=1,H100-SXM=2"], "--price prices the H100-SXM twice"),
    ],
)
def test_cli_bad_input_is_one_clear_line(
    tiny_file: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    args = ["compare", f"{tiny_file}:mlp", "-b", "16", "--input", "32", "--classes", "4"]
    assert main([*args, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("costaware: error: ") and message in err
    assert len(err.splitlines()) == 1


def test_cli_a_spec_that_fits_nowhere(tiny_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["compare", f"{tiny_file}:huge", "-b", "4", "--input", "32", "--classes", "4"]
    assert main([*args, "-d", "T4,L4"]) == 2
    err = capsys.readouterr().err
    assert "costaware: error: the step fits on none of the devices compared (T4, L4)" in err


def test_cli_own_device_file(
    tiny_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "mine.json"
    f.write_text(json.dumps([{**ca.get_device("L4").to_dict(), "name": "lab-l4", "aliases": []}]))
    args = ["compare", f"{tiny_file}:mlp", "-b", "16", "--input", "32", "--classes", "4"]
    assert main([*args, "--device-file", str(f), "-d", "lab-l4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [o["device"] for o in data["options"]] == ["lab-l4"]
    f.write_text("[{}]")
    assert main([*args, "--device-file", str(f)]) == 2
    assert "needs a 'name'" in capsys.readouterr().err


def test_compare_help_explains_it() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "costaware.cli", "compare", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    for word in ("--devices", "--price", "--device-file", "--sort", "--json", "largest batch"):
        assert word in out


def test_devices_piped_keeps_every_name_whole_and_flags_bf16() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "costaware.cli", "devices"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    names = {line.split()[0] for line in out.splitlines()[2:] if line and line[0] != "*"}
    assert set(ca.known_devices()) <= names
    t4 = next(line for line in out.splitlines() if line.startswith("T4 "))
    assert t4.rstrip().split("TF *")[0] and " *" in t4
    assert "*: no bf16 arithmetic" in out
    assert "…" not in out


# -- the report ---------------------------------------------------------------------------
def test_the_report_says_what_the_study_would_cost_on_each_gpu(model: ca.CostModel) -> None:
    rows = []
    for i, bs in enumerate((64, 128)):
        pred = model.predict(_spec(batch_size=bs), "H100")
        row = TrialRow(trial=str(i), number=i, outcome="completed", wall_time=600.0)
        _apply_prediction(
            row, {"device": "H100-SXM", "prediction": pred.to_dict(), "spec": pred.spec}
        )
        rows.append(row)
    assert rows[0].pred_step["flops"] > 0 and rows[0].device == "H100-SXM"
    rows.append(TrialRow(trial="2", number=2, outcome="completed", wall_time=10.0))  # no record
    rep = Report(rows, title="t", source="test", price_per_hour=3.0)
    other = rep.to_dict()["other_gpus"]
    assert other["trials"] == 2 and other["left_out"] == 1 and other["ran_on"] == ["H100-SXM"]
    by = {d["device"]: d for d in other["devices"]}
    assert by["H100-SXM"]["seconds"] == pytest.approx(1200.0)
    assert by["H100-SXM"]["cost"] == pytest.approx(1.0)  # the report's own price
    assert by["T4"]["seconds"] > by["H100-SXM"]["seconds"]  # a slower GPU takes longer
    assert by["L4"]["price_source"] == DEFAULT_PRICES["L4"][1]
    text = rep.to_markdown()
    assert "## On other GPUs" in text and "H100-SXM (ran here)" in text
    assert "1 admitted trials have no recorded step" in text
    assert '<section id="gpus"><h2>On other GPUs</h2>' in rep.to_html()


def test_a_real_study_report_has_the_other_gpus_section(tmp_path: Path) -> None:
    optuna = pytest.importorskip("optuna")
    from costaware.integrations.optuna import CostAwarePruner

    def spec_fn(params: dict[str, int]) -> ca.TrainingSpec:
        return ca.TrainingSpec(
            model=functools.partial(zoo.mlp, 784, (params["width"],) * 2, 10),
            batch=ca.ImageBatch((784,), classes=10),
            batch_size=16,
            dataset_size=1000,
        )

    store = f"sqlite:///{tmp_path / 'costaware.db'}"
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'hpo.db'}",
        pruner=CostAwarePruner(
            spec_fn=spec_fn,
            budget=ca.Budget(max_memory="1.25GiB"),
            device="T4",
            refit_every=None,
            store=store,
        ),
        sampler=optuna.samplers.GridSampler({"width": [64, 8192]}),
    )

    def objective(trial: optuna.Trial) -> float:
        trial.suggest_categorical("width", [64, 8192])
        if trial.should_prune():
            raise optuna.TrialPruned()
        return 1.0

    study.optimize(objective, n_trials=2)
    rep = ca.report(study, store=store)
    other = rep.to_dict()["other_gpus"]
    assert other["trials"] == 1 and other["ran_on"] == ["T4"]  # the rejected one never ran
    by = {d["device"]: d for d in other["devices"]}
    assert by["H100-SXM"]["seconds"] < by["T4"]["seconds"]
    text = rep.to_markdown()
    assert "## On other GPUs" in text and "| T4 (ran here) | 1 of 1 |" in text


def test_small_costs_keep_two_significant_digits() -> None:
    from costaware._format import fmt_money

    assert [fmt_money(x, "$") for x in (0.0395, 0.0236, 0.00041, 1.5, 0.0, None)] == [
        "$0.040",
        "$0.024",
        "$0.00041",
        "$1.50",
        "$0",
        "-",
    ]
