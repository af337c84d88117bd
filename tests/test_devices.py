"""Tests for costaware.devices: catalog contents, lookups and NVML-based detection."""

from __future__ import annotations

import copy
import json
import os
import pickle
import sys
import types
from dataclasses import FrozenInstanceError
from typing import Any

import pytest

from costaware.devices import (
    CATALOG,
    Device,
    UnknownDeviceError,
    cpu_device,
    detect_device,
    device_kind,
    get_device,
    known_devices,
)

GiB = 1024**3

REQUIRED = {
    "H100-SXM",
    "H100-PCIe",
    "H200",
    "A100-40GB",
    "A100-80GB",
    "A10",
    "L4",
    "T4",
    "V100",
    "RTX-3090",
    "RTX-4090",
    "CPU",
}

# Exact strings NVML reports -> canonical catalog name.
NVML_NAMES = {
    "NVIDIA H100 80GB HBM3": "H100-SXM",
    "NVIDIA H100 PCIe": "H100-PCIe",
    "NVIDIA H200": "H200",
    "NVIDIA A100-SXM4-40GB": "A100-40GB",
    "NVIDIA A100-SXM4-80GB": "A100-80GB",
    "NVIDIA A100 80GB PCIe": "A100-80GB-PCIe",
    "NVIDIA A10": "A10",
    "NVIDIA L4": "L4",
    "Tesla T4": "T4",
    "Tesla V100-SXM2-32GB": "V100",
    "Tesla V100-SXM2-16GB": "V100-16GB",
    "NVIDIA GeForce RTX 3090": "RTX-3090",
    "NVIDIA GeForce RTX 4090": "RTX-4090",
}


# --------------------------------------------------------------------------------------------
# Fake NVML
# --------------------------------------------------------------------------------------------


class _FakeNVMLError(Exception):
    pass


def _fake_pynvml(
    name: str | bytes,
    total: int,
    cc: tuple[int, int] = (8, 6),
    *,
    fail_on: str | None = None,
) -> types.ModuleType:
    """A stand-in for the ``pynvml`` module describing one GPU per index."""
    mod = types.ModuleType("pynvml")
    calls: list[str] = []

    def record(fn_name: str) -> None:
        calls.append(fn_name)
        if fn_name == fail_on:
            raise _FakeNVMLError(fn_name)

    def nvmlInit() -> None:
        record("init")

    def nvmlShutdown() -> None:
        record("shutdown")

    def nvmlDeviceGetHandleByIndex(index: int) -> str:
        record(f"handle:{index}")
        return f"handle-{index}"

    def nvmlDeviceGetName(handle: str) -> str | bytes:
        record("name")
        return name

    def nvmlDeviceGetMemoryInfo(handle: str) -> Any:
        record("memory")
        return types.SimpleNamespace(total=total, free=total, used=0)

    def nvmlDeviceGetCudaComputeCapability(handle: str) -> tuple[int, int]:
        record("cc")
        return cc

    for fn in (
        nvmlInit,
        nvmlShutdown,
        nvmlDeviceGetHandleByIndex,
        nvmlDeviceGetName,
        nvmlDeviceGetMemoryInfo,
        nvmlDeviceGetCudaComputeCapability,
    ):
        setattr(mod, fn.__name__, fn)
    mod.NVMLError = _FakeNVMLError  # type: ignore[attr-defined]
    mod.calls = calls  # type: ignore[attr-defined]
    return mod


@pytest.fixture(autouse=True)
def _no_visible_devices_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _install(monkeypatch: pytest.MonkeyPatch, mod: types.ModuleType | None) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", mod)


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception:
        return False
    return True


# --------------------------------------------------------------------------------------------
# Catalog
# --------------------------------------------------------------------------------------------


def test_catalog_has_required_devices() -> None:
    assert set(CATALOG) >= REQUIRED
    names = known_devices()
    assert names == sorted(CATALOG)
    assert set(names) >= REQUIRED


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_every_entry_is_sane(name: str) -> None:
    dev = CATALOG[name]
    assert dev.name == name
    assert dev.kind in ("cuda", "cpu")
    assert dev.memory_bytes > 0
    assert dev.bandwidth > 0
    assert dev.sm_count > 0
    for key in ("fp32", "tf32", "bf16", "fp16"):
        assert dev.flops[key] > 0
    assert dev.flops["tf32"] >= dev.flops["fp32"]
    if dev.kind == "cuda":  # tensor-core figures are never below the CUDA-core fp32 figure
        assert dev.flops["fp16"] >= dev.flops["fp32"]
        assert dev.flops["bf16"] >= dev.flops["fp32"]
    if dev.kind == "cuda":
        assert dev.compute_capability
        assert dev.usable_memory_bytes < dev.memory_bytes
        # a measured context on Hopper, the older defaults elsewhere: 0.5-1.5 GiB
        assert GiB // 2 <= dev.context_overhead_bytes <= 1.5 * GiB
    else:
        assert dev.compute_capability == ""
        assert dev.usable_memory_bytes == dev.memory_bytes


def test_key_figures() -> None:
    h100 = CATALOG["H100-SXM"]
    assert h100.memory_bytes == 85_520_809_984
    assert h100.sm_count == 132
    assert h100.bandwidth == pytest.approx(3.35e12)
    assert h100.compute_capability == "9.0"
    assert h100.generation == "Hopper"
    assert CATALOG["H200"].memory_bytes == 150_754_820_096
    assert CATALOG["H200"].bandwidth == pytest.approx(4.8e12)
    assert CATALOG["H100-PCIe"].sm_count == 114
    assert CATALOG["A100-40GB"].bandwidth == pytest.approx(1.555e12)
    assert CATALOG["A100-80GB"].bandwidth == pytest.approx(2.039e12)
    assert CATALOG["A10"].sm_count == 72
    assert CATALOG["L4"].sm_count == 58
    assert CATALOG["T4"].sm_count == 40
    assert CATALOG["V100"].sm_count == 80
    assert CATALOG["RTX-3090"].sm_count == 82
    assert CATALOG["RTX-4090"].sm_count == 128
    assert CATALOG["RTX-4090"].bandwidth == pytest.approx(1008e9)
    # Older generations get the smaller context overhead.
    assert CATALOG["T4"].context_overhead_bytes == GiB // 2
    assert CATALOG["V100"].context_overhead_bytes == GiB // 2
    assert CATALOG["A100-80GB"].context_overhead_bytes == GiB


def test_catalog_and_devices_are_immutable() -> None:
    dev = CATALOG["H100-SXM"]
    with pytest.raises(TypeError):
        CATALOG["X"] = dev  # type: ignore[index]
    with pytest.raises(FrozenInstanceError):
        dev.memory_bytes = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        dev.flops["fp32"] = 1.0  # type: ignore[index]
    assert hash(dev) == hash(CATALOG["H100-SXM"])
    assert {dev, CATALOG["A100-80GB"]} == {CATALOG["A100-80GB"], dev}


@pytest.mark.parametrize("name", ["H100-SXM", "CPU"])
def test_devices_pickle_and_copy(name: str) -> None:
    dev = CATALOG[name]
    for clone in (pickle.loads(pickle.dumps(dev)), copy.deepcopy(dev), copy.copy(dev)):
        assert clone == dev
        assert clone.flops == dev.flops
        with pytest.raises(TypeError):
            clone.flops["fp32"] = 1.0  # type: ignore[index]


def test_device_validation() -> None:
    base: dict[str, Any] = CATALOG["T4"].to_dict()
    with pytest.raises(ValueError, match="flops"):
        Device(**{**base, "flops": {"fp32": 1.0}})
    with pytest.raises(ValueError, match="kind"):
        Device(**{**base, "kind": "tpu"})
    with pytest.raises(ValueError, match="memory"):
        Device(**{**base, "memory_bytes": 0})
    with pytest.raises(ValueError, match="context_overhead"):
        Device(**{**base, "context_overhead_bytes": base["memory_bytes"]})


def _ampere(**changes: Any) -> dict[str, Any]:
    """The fields of a made-up Ampere GPU, without tf32 or a context overhead."""
    fields: dict[str, Any] = {
        "name": "lab-gpu",
        "kind": "cuda",
        "memory_bytes": 16 * 2**30,
        "bandwidth": 500e9,
        "flops": {"fp32": 20e12, "fp16": 80e12, "bf16": 80e12},
        "sm_count": 40,
        "compute_capability": "8.6",
        "generation": "Ampere",
    }
    return {**fields, **changes}


def test_device_defaults_tf32_and_the_context_overhead_as_the_file_format_does() -> None:
    dev = Device(**_ampere())
    assert dev.flops["tf32"] == dev.flops["fp32"]
    assert dev.context_overhead_bytes == CATALOG["A10"].context_overhead_bytes
    assert Device(**_ampere(generation="Turing")).context_overhead_bytes == (
        CATALOG["T4"].context_overhead_bytes
    )
    assert Device(**_ampere(context_overhead_bytes=0)).context_overhead_bytes == 0
    # a GPU without bf16 arithmetic runs bf16 at its fp32 rate, as the catalog says
    old = Device(**_ampere(compute_capability="7.5", flops={"fp32": 8e12, "fp16": 65e12}))
    assert old.flops["bf16"] == 8e12 and not old.has_bf16


def test_a_device_without_half_precision_figures_is_told_what_to_give() -> None:
    with pytest.raises(ValueError, match=r"flops lacks fp16, bf16\. Give each precision's") as info:
        Device(**_ampere(flops={"fp32": 20e12}))
    assert "fp32's where it lists none" in str(info.value)
    with pytest.raises(ValueError, match=r"flops lacks fp16\. "):  # bf16 defaults below 8.0
        Device(**_ampere(compute_capability="3.7", flops={"fp32": 4e12}))


@pytest.mark.parametrize("cc", ["abc", "8", "8.x", " 8.0", 8.0])
def test_a_malformed_compute_capability_is_refused(cc: Any) -> None:
    with pytest.raises(ValueError, match=r"compute_capability must be 'major.minor' such as"):
        Device(**_ampere(compute_capability=cc))


@pytest.mark.parametrize("name", ["", "  ", None])
def test_a_device_needs_a_name(name: Any) -> None:
    with pytest.raises(ValueError, match=r"a Device needs a name \(a non-empty string"):
        Device(**_ampere(name=name))


# --------------------------------------------------------------------------------------------
# Lookups
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_lookup_by_canonical_name(name: str) -> None:
    assert get_device(name) is CATALOG[name]
    assert get_device(name.lower()) is CATALOG[name]
    assert get_device(name.upper()) is CATALOG[name]


@pytest.mark.parametrize(("nvml_name", "canonical"), sorted(NVML_NAMES.items()))
def test_lookup_by_nvml_name(nvml_name: str, canonical: str) -> None:
    assert get_device(nvml_name) is CATALOG[canonical]
    assert nvml_name in CATALOG[canonical].aliases


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("H100", "H100-SXM"),
        ("H100-80GB", "H100-SXM"),
        ("A100", "A100-80GB"),
        ("V100", "V100"),
        ("V100-16GB", "V100-16GB"),
        ("3090", "RTX-3090"),
        ("4090", "RTX-4090"),
        ("cpu", "CPU"),
    ],
)
def test_lookup_by_short_alias(alias: str, canonical: str) -> None:
    assert get_device(alias) is CATALOG[canonical]


@pytest.mark.parametrize(
    ("variant", "canonical"),
    [
        ("h100_sxm", "H100-SXM"),
        ("H100 SXM", "H100-SXM"),
        ("  h100sxm  ", "H100-SXM"),
        ("nvidia h100 80gb hbm3", "H100-SXM"),
        ("H100 80GB HBM3", "H100-SXM"),  # vendor prefix is optional
        ("a100_80gb", "A100-80GB"),
        ("A100 40 GB", "A100-40GB"),
        ("rtx 4090", "RTX-4090"),
        ("RTX_3090", "RTX-3090"),
        ("GeForce RTX 3090", "RTX-3090"),
        ("tesla-t4", "T4"),
        ("T4", "T4"),
        ("nvidia-l4", "L4"),
        ("h-200", "H200"),
    ],
)
def test_lookup_is_case_and_separator_insensitive(variant: str, canonical: str) -> None:
    assert get_device(variant) is CATALOG[canonical]


def test_lookup_passes_devices_through() -> None:
    dev = CATALOG["L4"]
    assert get_device(dev) is dev


def test_unknown_name_lists_known_devices() -> None:
    with pytest.raises(UnknownDeviceError) as info:
        get_device("FooGPU 9000")
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert "FooGPU 9000" in message
    for name in known_devices():
        assert name in message


def test_unknown_name_suggests_close_match() -> None:
    with pytest.raises(UnknownDeviceError, match="Did you mean 'H100-SXM'"):
        get_device("H100-SXMM")


@pytest.mark.parametrize("typo", ["H10O", "H10", "h-10o"])
def test_unknown_name_suggests_aliases_naming_their_device(typo: str) -> None:
    with pytest.raises(UnknownDeviceError, match=r"Did you mean 'H100' \(the H100-SXM\), "):
        get_device(typo)


@pytest.mark.parametrize("generic", ["cuda", "gpu", "cuda:0", "CUDA:1", "GPU0", " cuda "])
def test_a_name_that_says_only_gpu_suggests_auto_and_a_catalog_name(generic: str) -> None:
    """torch's ``"cuda"`` names no GPU model: not "Did you mean 'CPU'?", but ``'auto'``
    (the GPU the process sees) or a catalog name."""
    with pytest.raises(UnknownDeviceError) as info:
        get_device(generic)
    message = str(info.value)
    assert "Did you mean" not in message and "'CPU'" not in message.split("Known")[0]
    assert "pass 'auto' (the GPU this process sees" in message and "'H100'" in message


@pytest.mark.parametrize("name", ["MI300X", "MI250", "Gaudi2"])
def test_a_name_close_only_in_its_digits_is_not_suggested(name: str) -> None:
    """``MI300X`` shares only digits with ``3090``: no suggestion beats a wrong one."""
    with pytest.raises(UnknownDeviceError) as info:
        get_device(name)
    assert "Did you mean" not in str(info.value), str(info.value)
    with pytest.raises(UnknownDeviceError, match="Did you mean 'T4'"):
        get_device("T44")


def test_own_devices_are_matched_and_suggested_besides_the_catalog() -> None:
    mine = Device(**_ampere(name="lab-a40", aliases=("a40",)))
    assert get_device("LAB_A40", own=[mine]) is mine
    assert get_device("A40", own=[mine]) is mine
    assert get_device("L4", own=[mine]) is CATALOG["L4"]
    with pytest.raises(UnknownDeviceError, match=r"Did you mean 'lab-a40'.*; yours: lab-a40\."):
        get_device("lab-a4O", own=[mine])


def test_device_kind_matches_names_as_get_device_does() -> None:
    for name in ("CPU", "cpu", " Cpu "):
        assert device_kind(name) == "cpu"
    for name in ("H100", "h100_sxm", "NVIDIA H100 80GB HBM3", get_device("A10")):
        assert device_kind(name) == "cuda"
    # a GPU the catalog does not know yet is still a GPU (get_device would raise)
    with pytest.raises(UnknownDeviceError):
        get_device("NVIDIA Hypothetical X9000")
    assert device_kind("NVIDIA Hypothetical X9000") == "cuda"
    assert device_kind(cpu_device()) == "cpu"


def test_non_string_name_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        get_device(123)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Device methods
# --------------------------------------------------------------------------------------------


def test_peak_flops_precisions() -> None:
    h100 = CATALOG["H100-SXM"]
    assert h100.peak_flops("fp32") == pytest.approx(67e12)
    assert h100.peak_flops("fp32", allow_tf32=True) == pytest.approx(494.5e12)
    assert h100.peak_flops("bf16") == pytest.approx(989.4e12)
    assert h100.peak_flops("fp16") == pytest.approx(989.4e12)
    assert h100.peak_flops("bf16", allow_tf32=True) == h100.peak_flops("bf16")
    a100 = CATALOG["A100-80GB"]
    assert a100.peak_flops("fp32") == pytest.approx(19.5e12)
    assert a100.peak_flops("fp32", allow_tf32=True) == pytest.approx(156e12)
    assert a100.peak_flops("bf16") == pytest.approx(312e12)


def test_peak_flops_without_tensor_core_support() -> None:
    v100 = CATALOG["V100"]
    assert v100.peak_flops("fp16") == pytest.approx(125e12)
    assert v100.peak_flops("bf16") == v100.peak_flops("fp32") == pytest.approx(15.7e12)
    assert v100.peak_flops("fp32", allow_tf32=True) == v100.peak_flops("fp32")
    t4 = CATALOG["T4"]
    assert t4.peak_flops("fp16") == pytest.approx(65e12)
    assert t4.peak_flops("bf16") == t4.peak_flops("fp32") == pytest.approx(8.1e12)


@pytest.mark.parametrize(
    ("spelling", "key"),
    [
        ("FP32", "fp32"),
        ("float32", "fp32"),
        ("32-true", "fp32"),
        ("bfloat16", "bf16"),
        ("BF16", "bf16"),
        ("bf16-mixed", "bf16"),
        ("float16", "fp16"),
        ("half", "fp16"),
        ("16-mixed", "fp16"),
    ],
)
def test_peak_flops_spellings(spelling: str, key: str) -> None:
    dev = CATALOG["A10"]
    assert dev.peak_flops(spelling) == dev.flops[key]


@pytest.mark.parametrize("bad", ["fp8", "int8", "", "fp64", "double"])
def test_peak_flops_rejects_unknown_precision(bad: str) -> None:
    with pytest.raises(ValueError, match="precision"):
        CATALOG["H100-SXM"].peak_flops(bad)


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_to_dict_is_json_and_round_trips(name: str) -> None:
    dev = CATALOG[name]
    data = dev.to_dict()
    text = json.dumps(data)
    rebuilt = Device(**json.loads(text))
    assert rebuilt == dev
    assert rebuilt.aliases == dev.aliases


def test_features() -> None:
    feats = CATALOG["H100-SXM"].features()
    assert set(feats) == {
        "memory_gib",
        "bandwidth_gbs",
        "fp32_tflops",
        "bf16_tflops",
        "fp16_tflops",
        "sm_count",
        "cc_major",
        "is_cpu",
    }
    assert all(isinstance(v, float) for v in feats.values())
    assert feats["memory_gib"] == pytest.approx(79.65, abs=0.01)
    assert feats["bandwidth_gbs"] == pytest.approx(3350)
    assert feats["fp32_tflops"] == pytest.approx(67)
    assert feats["bf16_tflops"] == pytest.approx(989.4)
    assert feats["cc_major"] == 9.0
    assert feats["is_cpu"] == 0.0
    cpu_feats = CATALOG["CPU"].features()
    assert cpu_feats["is_cpu"] == 1.0
    assert cpu_feats["cc_major"] == 0.0


# --------------------------------------------------------------------------------------------
# CPU device
# --------------------------------------------------------------------------------------------


def test_cpu_device() -> None:
    cpu = cpu_device()
    assert cpu.name == "CPU"
    assert cpu.kind == "cpu"
    assert cpu.generation == "cpu"
    assert cpu.context_overhead_bytes == 0
    assert cpu.memory_bytes > 0
    assert cpu == CATALOG["CPU"]


def test_cpu_device_rough_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    cpu = cpu_device()
    assert cpu.sm_count == 8
    assert cpu.bandwidth == pytest.approx(80e9)
    assert cpu.peak_flops("fp32") == pytest.approx(400e9)
    monkeypatch.setattr(os, "cpu_count", lambda: 256)
    assert cpu_device().bandwidth == pytest.approx(200e9)  # capped


def test_cpu_device_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_sysconf(name: str) -> int:
        raise ValueError(name)

    monkeypatch.setattr(os, "cpu_count", lambda: None)
    monkeypatch.setattr(os, "sysconf", no_sysconf)
    cpu = cpu_device()
    assert cpu.sm_count == 1
    assert cpu.memory_bytes == 8 * GiB


# --------------------------------------------------------------------------------------------
# Detection
# --------------------------------------------------------------------------------------------


def test_auto_on_this_machine_does_not_crash() -> None:
    dev = get_device("auto")
    assert isinstance(dev, Device)
    if not _nvml_works():
        assert dev.kind == "cpu"
        assert dev.name == "CPU"
    assert get_device("AUTO") == dev


def test_detect_without_pynvml_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    _install(monkeypatch, None)  # makes ``import pynvml`` raise ImportError
    assert detect_device().kind == "cpu"


@pytest.mark.parametrize("kind", ["nvml", "generic"])
def test_detect_falls_back_when_nvml_init_fails(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    import pynvml

    def failing_init() -> None:
        if kind == "nvml":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(pynvml, "nvmlInit", failing_init)
    dev = detect_device()
    assert dev.kind == "cpu"
    assert dev.name == "CPU"
    assert get_device("auto").kind == "cpu"


def test_detect_falls_back_when_a_query_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_pynvml("NVIDIA H100 80GB HBM3", 80 * GiB, fail_on="name")
    _install(monkeypatch, fake)
    assert detect_device().kind == "cpu"
    assert fake.calls[-1] == "shutdown"


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3", b"NVIDIA H100 80GB HBM3"])
def test_detect_known_gpu(monkeypatch: pytest.MonkeyPatch, name: str | bytes) -> None:
    fake = _fake_pynvml(name, 85_520_809_984, cc=(9, 0))
    _install(monkeypatch, fake)
    assert detect_device() is CATALOG["H100-SXM"]
    assert get_device("auto") is CATALOG["H100-SXM"]
    calls = fake.calls
    assert calls[0] == "init"
    assert "handle:0" in calls
    assert calls[-1] == "shutdown"


@pytest.mark.parametrize(("nvml_name", "canonical"), sorted(NVML_NAMES.items()))
def test_detect_every_nvml_name(
    monkeypatch: pytest.MonkeyPatch, nvml_name: str, canonical: str
) -> None:
    _install(monkeypatch, _fake_pynvml(nvml_name, 16 * GiB))
    assert detect_device() is CATALOG[canonical]


def test_detect_unknown_gpu_uses_real_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    _install(monkeypatch, _fake_pynvml("NVIDIA FooGPU", 12 * GiB, cc=(8, 6)))
    dev = detect_device()
    assert dev.kind == "cuda"
    assert dev.name == "NVIDIA FooGPU"
    assert dev.memory_bytes == 12 * GiB
    assert 0 < dev.usable_memory_bytes < dev.memory_bytes
    assert dev.compute_capability == "8.6"
    assert dev.generation == "Ampere"
    assert dev.bandwidth > 0
    assert dev.sm_count > 0
    for key in ("fp32", "bf16", "fp16"):
        assert dev.peak_flops(key) > 0
    # Conservative: no faster than the slowest catalogued datacentre GPUs.
    assert dev.bandwidth <= CATALOG["L4"].bandwidth
    assert dev.peak_flops("fp32") <= CATALOG["T4"].peak_flops("fp32")
    json.dumps(dev.to_dict())


def test_detect_unknown_old_gpu_without_compute_capability(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _fake_pynvml(b"Quadro Mystery", 4 * GiB, fail_on="cc")
    _install(monkeypatch, fake)
    dev = detect_device()
    assert dev.name == "Quadro Mystery"
    assert dev.memory_bytes == 4 * GiB
    assert dev.compute_capability == ""
    assert dev.generation == "unknown"
    assert dev.peak_flops("bf16") == dev.peak_flops("fp32")


@pytest.mark.parametrize("visible", ["", "-1"])
def test_detect_respects_hidden_gpus(monkeypatch: pytest.MonkeyPatch, visible: str) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    _install(monkeypatch, _fake_pynvml("NVIDIA H100 80GB HBM3", 80 * GiB))
    assert detect_device().kind == "cpu"


def test_detect_uses_first_visible_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    fake = _fake_pynvml("NVIDIA L4", 22 * GiB)
    _install(monkeypatch, fake)
    assert detect_device() is CATALOG["L4"]
    assert "handle:3" in fake.calls


@pytest.mark.parametrize(
    ("flags", "bf16_native", "fp16_native"),
    [
        ("fpu sse avx2", False, False),  # e.g. an EPYC without AVX-512: PyTorch converts
        ("avx2 avx512f avx512_bf16", True, False),
        ("avx2 amx_bf16 amx_fp16 amx_tile", True, True),
    ],
)
def test_cpu_half_precision_peak_follows_the_cpu_flags(
    monkeypatch: pytest.MonkeyPatch, flags: str, bf16_native: bool, fp16_native: bool
) -> None:
    from costaware import devices

    monkeypatch.setattr(devices, "_cpu_flags", lambda: frozenset(flags.split()))
    dev = devices.cpu_device()
    fp32 = dev.flops["fp32"]
    assert dev.flops["bf16"] == (fp32 if bf16_native else fp32 / devices._CPU_HALF_SLOWDOWN)
    assert dev.flops["fp16"] == (fp32 if fp16_native else fp32 / devices._CPU_HALF_SLOWDOWN)
