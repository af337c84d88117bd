"""Catalog of accelerator (and host CPU) specifications.

costaware uses a :class:`Device` for three things:

* roofline time estimates (:attr:`Device.bandwidth` and :meth:`Device.peak_flops`),
* capacity checks (:attr:`Device.usable_memory_bytes`),
* numeric inputs for the learned model (:meth:`Device.features`).

Figures
-------
FLOP/s are the vendors' *dense* peak figures (no 2:4 sparsity), taken from the public
datasheets and architecture whitepapers.  For a precision that a GPU has no tensor cores for
(bf16 before Ampere, tf32 before Ampere) the CUDA-core figure for fp32 is used.  GeForce cards
are listed with their tensor-core figures *with fp32 accumulation*, which is what PyTorch's
autocast matmuls use (the headline GeForce numbers assume fp16 accumulation and are twice as
high).  Bandwidths are the datasheet peak DRAM/HBM figures in bytes/s (decimal units).

Memory capacities are what CUDA reports as the device's total memory
(``torch.cuda.get_device_properties(i).total_memory``), which is smaller than the marketing
figure because of ECC and driver reservations.  Each entry says where its figure comes from
(:attr:`Device.memory_source`; :attr:`Device.source` names the datasheet of the rest):

* ``measured``: ``total_memory`` measured on the hardware with torch;
* ``public log``: the byte count printed by CUDA's ``deviceQuery``, by torch or by NVML in
  public logs; it varies by a few tens of MiB between driver versions, the smallest/newest
  one seen is used;
* ``assumed``: another part's figure, where the two carry the same memory;
* ``nominal``: a capacity rounded down from the marketing figure or from logs that do not
  give bytes, used where no reported byte count was available.

Your own device
---------------
A :class:`Device` goes wherever a device name does (``predict(spec, device=Device(...))``).
:func:`costaware.device_files.load_devices` reads devices from a JSON or TOML file (the fields of
:meth:`Device.to_dict`, or friendlier units: see :func:`costaware.device_files.device_from_dict`), and
:func:`detect_device` describes the GPU this process sees.

Lookups
-------
:func:`get_device` accepts the canonical name, any alias (including the exact strings NVML
reports, e.g. ``"NVIDIA H100 80GB HBM3"``) case-insensitively, ignoring spaces, underscores and
hyphens; ``"auto"`` detects the local device with :func:`detect_device`.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from costaware.errors import CostawareError

__all__ = [
    "CATALOG",
    "Device",
    "UnknownDeviceError",
    "catalog_text",
    "cpu_device",
    "cpu_half_flags",
    "detect_device",
    "device_kind",
    "get_device",
    "is_auto",
    "known_devices",
    "no_bf16_note",
    "precision_notes",
]

GiB = 1024**3
MiB = 1024**2
TERA = 1e12
GIGA = 1e9

#: Precision keys every :attr:`Device.flops` mapping carries.
FLOPS_KEYS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16")

#: Spellings accepted by :meth:`Device.peak_flops`, mapped to a :data:`FLOPS_KEYS` key.
#: Lightning-style precision strings ("bf16-mixed", "16-mixed", "32-true") are accepted too.
_PRECISION_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "fp32": "fp32",
        "float32": "fp32",
        "float": "fp32",
        "32": "fp32",
        "32true": "fp32",
        "tf32": "tf32",
        "bf16": "bf16",
        "bfloat16": "bf16",
        "bf16mixed": "bf16",
        "bf16true": "bf16",
        "fp16": "fp16",
        "float16": "fp16",
        "half": "fp16",
        "16": "fp16",
        "16mixed": "fp16",
        "16true": "fp16",
    }
)

#: Context/handle overhead for Hopper parts: NVML's used memory less torch's reserved
#: memory once CUDA, cuBLAS and cuDNN have started (measured on an H200, driver 580.159,
#: torch 2.11 + CUDA 13.0: the ``context`` row of ``data/oom/h200-oom-seed0.jsonl.gz``;
#: 1.29 GB after CUDA's start alone). A study's own measurement replaces it.
_OVERHEAD_HOPPER = 1_379_794_944
#: Context/handle overhead for Blackwell, Ampere and Ada parts (not measured here).
_OVERHEAD_RECENT = 1 * GiB
#: Context/handle overhead for Volta and Turing parts.
_OVERHEAD_OLDER = GiB // 2

_GENERATION_OVERHEAD: Mapping[str, int] = MappingProxyType(
    {
        "Blackwell": _OVERHEAD_RECENT,
        "Hopper": _OVERHEAD_HOPPER,
        "Ampere": _OVERHEAD_RECENT,
        "Ada": _OVERHEAD_RECENT,
        "Turing": _OVERHEAD_OLDER,
        "Volta": _OVERHEAD_OLDER,
        "cpu": 0,
    }
)

#: :attr:`Device.context_overhead_bytes` left out: the figure of the device's generation
_OVERHEAD_OF_GENERATION = -1

#: a compute capability as CUDA writes it: "8.6"
_CC_RE = re.compile(r"\d+\.\d+")

#: what to give for a precision a device's flops lack (:func:`_fill_flops` fills the rest)
_FLOPS_FIX = (
    "Give each precision's dense peak from the datasheet; tf32 defaults to fp32's figure, "
    "and so does bf16 where compute_capability is below 8.0 (no bf16 arithmetic). fp16 has "
    "no default (without tensor cores its rate ranges from 1/64 of fp32's to twice it): "
    "give the datasheet's figure, or fp32's where it lists none."
)


def _fill_flops(flops: Mapping[str, float], compute_capability: str) -> dict[str, float]:
    """``flops`` as floats, with the figures a missing precision honestly takes: ``tf32``
    fp32's (the rate of a GPU without TF32 tensor cores, a floor for one with them), and
    ``bf16`` fp32's on a GPU whose compute capability is below 8.0, which has no bf16
    arithmetic (the catalog's convention, see :attr:`Device.has_bf16`). ``fp16`` has no
    such default: its rate without tensor cores ranges from 1/64 of fp32's to twice it."""
    out = {str(k): float(v) for k, v in flops.items()}
    if "fp32" in out:
        out.setdefault("tf32", out["fp32"])
        if 0 < _cc_major(compute_capability) < 8:
            out.setdefault("bf16", out["fp32"])
    return out


# Conservative defaults for a CUDA GPU that is not in the catalog (see detect_device): roughly
# a T4, i.e. the slowest accelerator still in common use, so time estimates err on the slow
# side.  The larger context overhead errs on the side of "does not fit".
_UNKNOWN_GPU_BANDWIDTH = 300 * GIGA
_UNKNOWN_GPU_FP32 = 8.1 * TERA
_UNKNOWN_GPU_TENSOR = 65.0 * TERA
_UNKNOWN_GPU_SM_COUNT = 40
_UNKNOWN_GPU_OVERHEAD = _OVERHEAD_RECENT

# Rough host-CPU figures (see cpu_device).
_CPU_BANDWIDTH_PER_CORE = 10 * GIGA  # 20 GB/s per 2 cores
_CPU_BANDWIDTH_CAP = 200 * GIGA
_CPU_FP32_PER_CORE = 50 * GIGA
_CPU_FALLBACK_MEMORY = 8 * GiB
# Without native bf16/fp16 arithmetic (AVX512-BF16 / AMX, AVX512-FP16), autocast bf16 steps
# ran about 8x slower per FLOP than fp32 on this EPYC (the first CPU collection,
# data/archive/cpu-first: a least-squares fit of 43 bf16 against 304 fp32 configurations):
# the half-precision peak is the fp32 peak / 8.
_CPU_HALF_SLOWDOWN = 8.0
_CPU_HALF_FLAGS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}


def _cpu_flags() -> frozenset[str]:
    """The instruction-set flags of the first CPU in /proc/cpuinfo (empty where unknown)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    return frozenset()


_NORMALISE_RE = re.compile(r"[\s_\-]+")
# Vendor/brand prefixes that NVML puts in front of the model name ("NVIDIA GeForce RTX 4090",
# "Tesla T4"); a lookup that fails is retried without them.
_VENDOR_PREFIXES: tuple[str, ...] = ("nvidia", "geforce", "tesla", "quadro")


class UnknownDeviceError(CostawareError, ValueError):
    """Raised by :func:`get_device` for a name that matches no catalog entry."""


def _normalise(name: str) -> str:
    """Lower-case ``name`` and drop spaces, underscores and hyphens."""
    return _NORMALISE_RE.sub("", name.strip().lower())


def _strip_vendor(key: str) -> str:
    """Remove leading vendor/brand prefixes from a normalised name."""
    changed = True
    while changed:
        changed = False
        for prefix in _VENDOR_PREFIXES:
            if key.startswith(prefix) and len(key) > len(prefix):
                key = key[len(prefix) :]
                changed = True
    return key


@dataclass(frozen=True)
class Device:
    """Specifications of one accelerator (or the host CPU).

    Attributes:
        name: Canonical catalog name, e.g. ``"H100-SXM"``.
        kind: ``"cuda"`` or ``"cpu"``.
        memory_bytes: Total device memory in bytes, as CUDA reports it.
        bandwidth: Peak DRAM/HBM bandwidth in bytes/s.
        flops: Peak dense FLOP/s per precision: ``"fp32"``, ``"tf32"``, ``"fp16"``,
            ``"bf16"``.  Stored as a read-only mapping. A missing ``"tf32"`` takes the
            ``"fp32"`` figure (what a GPU without TF32 tensor cores runs fp32 matmuls at,
            and so a conservative figure for one with them), and so does a missing
            ``"bf16"`` where :attr:`compute_capability` is below 8.0 (no bf16 arithmetic).
        sm_count: Number of streaming multiprocessors (logical cores for a CPU).
        compute_capability: CUDA compute capability such as ``"9.0"``; ``""`` for a CPU or
            a GPU whose compute capability is unknown.
        generation: ``"Hopper"``, ``"Ampere"``, ``"Ada"``, ``"Turing"``, ``"Volta"``, ``"cpu"``
            (``"Blackwell"``, ``"Pascal"`` or ``"unknown"`` for detected GPUs outside the
            catalog).
        context_overhead_bytes: Memory the CUDA context and cuBLAS/cuDNN handles take outside
            PyTorch's caching allocator. Left out (or -1), the catalog's figure for the
            device's :attr:`generation` (1 GiB for a generation it does not know; 0 for a CPU).
        aliases: Other names :func:`get_device` accepts for this device.
        source: Where the speed figures come from (a datasheet, a whitepaper).
        memory_source: Where :attr:`memory_bytes` comes from: ``"measured"``, ``"public
            log"``, ``"nominal"`` or ``"assumed"`` (see the module's notes), with details.
    """

    name: str
    kind: str
    memory_bytes: int
    bandwidth: float
    flops: Mapping[str, float] = field(hash=False)
    sm_count: int
    compute_capability: str
    generation: str
    context_overhead_bytes: int = _OVERHEAD_OF_GENERATION
    aliases: tuple[str, ...] = ()
    source: str = ""
    memory_source: str = ""

    def __post_init__(self) -> None:
        """Validate the fields, fill the defaults (``tf32``, the context overhead) and
        freeze :attr:`flops` and :attr:`aliases`."""
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(
                f"a Device needs a name (a non-empty string, such as 'lab-a40'), but got "
                f"{self.name!r}."
            )
        if self.kind not in ("cuda", "cpu"):
            raise ValueError(
                f"Device {self.name!r}: kind must be 'cuda' or 'cpu', got {self.kind!r}"
            )
        if not isinstance(self.compute_capability, str) or not (
            self.compute_capability == "" or _CC_RE.fullmatch(self.compute_capability)
        ):
            raise ValueError(
                f"Device {self.name!r}: compute_capability must be 'major.minor' such as "
                f"'8.6' (or '' where it is unknown), but got {self.compute_capability!r}."
            )
        if self.memory_bytes <= 0:
            raise ValueError(f"Device {self.name!r}: memory_bytes must be positive")
        if not self.bandwidth > 0:
            raise ValueError(f"Device {self.name!r}: bandwidth must be positive")
        if self.sm_count <= 0:
            raise ValueError(f"Device {self.name!r}: sm_count must be positive")
        if self.context_overhead_bytes == _OVERHEAD_OF_GENERATION:
            overhead = (
                0
                if self.kind == "cpu"
                else _GENERATION_OVERHEAD.get(str(self.generation), _OVERHEAD_RECENT)
            )
            object.__setattr__(self, "context_overhead_bytes", overhead)
        if not 0 <= self.context_overhead_bytes < self.memory_bytes:
            raise ValueError(
                f"Device {self.name!r}: context_overhead_bytes must be >= 0 and < memory_bytes"
            )
        flops = _fill_flops(self.flops, self.compute_capability)
        missing = [k for k in FLOPS_KEYS if k not in flops]
        if missing:
            raise ValueError(
                f"Device {self.name!r}: flops lacks {', '.join(missing)}. {_FLOPS_FIX}"
            )
        bad = [k for k, v in flops.items() if not v > 0]
        if bad:
            raise ValueError(f"Device {self.name!r}: flops must be positive, bad keys {bad}")
        object.__setattr__(self, "flops", MappingProxyType(flops))
        object.__setattr__(self, "aliases", tuple(self.aliases))

    def __reduce__(self) -> tuple[type[Device], tuple[object, ...]]:
        """Pickle support (the read-only ``flops`` mapping is not picklable as such)."""
        return (
            type(self),
            (
                self.name,
                self.kind,
                self.memory_bytes,
                self.bandwidth,
                dict(self.flops),
                self.sm_count,
                self.compute_capability,
                self.generation,
                self.context_overhead_bytes,
                self.aliases,
                self.source,
                self.memory_source,
            ),
        )

    def peak_flops(self, precision: str, allow_tf32: bool = False) -> float:
        """Peak dense FLOP/s for training in ``precision``.

        Args:
            precision: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (case-insensitive; the spellings
                ``"float32"``, ``"bfloat16"``, ``"float16"``, ``"half"`` and Lightning's
                ``"32-true"``, ``"bf16-mixed"``, ``"16-mixed"`` are accepted, as is
                ``"tf32"`` to ask for the TF32 figure directly).
            allow_tf32: Whether fp32 matmuls may run on TF32 tensor cores
                (``torch.backends.cuda.matmul.allow_tf32``).  When true, ``"fp32"`` returns
                the TF32 figure, which equals the fp32 figure on GPUs without TF32 support.

        Returns:
            Peak FLOP/s.

        Raises:
            ValueError: If ``precision`` is not recognised.
        """
        key = _PRECISION_ALIASES.get(_normalise(str(precision)))
        if key is None:
            raise ValueError(
                f"unknown precision {precision!r}; expected one of 'fp32', 'bf16', 'fp16'"
            )
        if key == "fp32" and allow_tf32:
            key = "tf32"
        return self.flops[key]

    @property
    def usable_memory_bytes(self) -> int:
        """Memory left for PyTorch's caching allocator: total minus the context overhead."""
        return self.memory_bytes - self.context_overhead_bytes

    @property
    def has_bf16(self) -> bool:
        """Whether the device does bf16 arithmetic at a rate of its own.

        A CUDA GPU needs compute capability 8.0 or newer (Ampere on): a T4 (7.5) or a V100
        (7.0) has no bf16 tensor cores, and its :attr:`flops` give bf16 the fp32 figure. A
        GPU whose compute capability is unknown has it when its bf16 peak is above its
        fp32 one; a CPU when its bf16 peak is not below its fp32 one
        (:func:`cpu_device`: AVX512-BF16 or AMX).
        """
        if self.kind == "cpu":
            return self.flops["bf16"] >= self.flops["fp32"]
        major = _cc_major(self.compute_capability)
        return major >= 8 if major else self.flops["bf16"] > self.flops["fp32"]

    def to_dict(self) -> dict[str, object]:
        """Return the fields as a JSON-serialisable dict (``Device(**d)`` rebuilds it)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "memory_bytes": int(self.memory_bytes),
            "bandwidth": float(self.bandwidth),
            "flops": {k: float(v) for k, v in self.flops.items()},
            "sm_count": int(self.sm_count),
            "compute_capability": self.compute_capability,
            "generation": self.generation,
            "context_overhead_bytes": int(self.context_overhead_bytes),
            "aliases": list(self.aliases),
            "source": self.source,
            "memory_source": self.memory_source,
        }

    def features(self) -> dict[str, float]:
        """Numeric features describing the device, for a learned model.

        Keys: ``memory_gib``, ``bandwidth_gbs`` (GB/s, decimal), ``fp32_tflops``,
        ``bf16_tflops``, ``fp16_tflops``, ``sm_count``, ``cc_major`` (0 for a CPU or an
        unknown compute capability) and ``is_cpu`` (1.0 or 0.0).
        """
        return {
            "memory_gib": self.memory_bytes / GiB,
            "bandwidth_gbs": self.bandwidth / GIGA,
            "fp32_tflops": self.flops["fp32"] / TERA,
            "bf16_tflops": self.flops["bf16"] / TERA,
            "fp16_tflops": self.flops["fp16"] / TERA,
            "sm_count": float(self.sm_count),
            "cc_major": float(_cc_major(self.compute_capability)),
            "is_cpu": 1.0 if self.kind == "cpu" else 0.0,
        }


def _cc_major(compute_capability: str) -> int:
    """Major version of a ``"major.minor"`` compute capability; 0 if empty or malformed."""
    head = compute_capability.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def _flops(fp32: float, tf32: float, fp16: float, bf16: float) -> dict[str, float]:
    """Build a flops mapping from figures given in TFLOP/s."""
    return {"fp32": fp32 * TERA, "tf32": tf32 * TERA, "fp16": fp16 * TERA, "bf16": bf16 * TERA}


def _gpu(
    name: str,
    *,
    memory_bytes: int,
    bandwidth: float,
    flops: dict[str, float],
    sm_count: int,
    compute_capability: str,
    generation: str,
    aliases: tuple[str, ...],
    source: str,
    memory_source: str,
) -> Device:
    """Build a catalog GPU entry with the generation's context overhead."""
    return Device(
        name=name,
        kind="cuda",
        memory_bytes=memory_bytes,
        bandwidth=bandwidth,
        flops=flops,
        sm_count=sm_count,
        compute_capability=compute_capability,
        generation=generation,
        context_overhead_bytes=_GENERATION_OVERHEAD[generation],
        aliases=aliases,
        source=source,
        memory_source=memory_source,
    )


_H100_SXM_FLOPS = _flops(fp32=67.0, tf32=494.5, fp16=989.4, bf16=989.4)
_H100_PCIE_FLOPS = _flops(fp32=51.0, tf32=378.0, fp16=756.0, bf16=756.0)
_A100_FLOPS = _flops(fp32=19.5, tf32=156.0, fp16=312.0, bf16=312.0)

_GPUS: tuple[Device, ...] = (
    # --- Blackwell ------------------------------------------------------------------------
    _gpu(
        "B200",
        memory_bytes=191_502_483_456,
        bandwidth=7_700 * GIGA,
        # per GPU of the HGX B200 (1,000 W); NVIDIA lists sparse tensor figures: halved
        flops=_flops(fp32=75.0, tf32=1_100.0, fp16=2_250.0, bf16=2_250.0),
        sm_count=148,
        compute_capability="10.0",
        generation="Blackwell",
        aliases=("B200-SXM", "B200-180GB", "NVIDIA B200"),
        source="NVIDIA HGX B200 specifications (per GPU, dense: half the sparse figures)",
        memory_source="public log (torch total_memory): 182631 MiB",
    ),
    _gpu(
        "RTX-5090",
        memory_bytes=34_190_917_632,
        bandwidth=1_792 * GIGA,
        # tensor figures with fp32 accumulation (half the fp16-accumulation headline)
        flops=_flops(fp32=104.8, tf32=104.8, fp16=209.5, bf16=209.5),
        sm_count=170,
        compute_capability="12.0",
        generation="Blackwell",
        aliases=("5090", "RTX5090", "GeForce RTX 5090", "NVIDIA GeForce RTX 5090"),
        source="NVIDIA RTX Blackwell GPU architecture whitepaper (GeForce RTX 5090)",
        memory_source="public log (NVML total): 32607 MiB",
    ),
    # --- Hopper ---------------------------------------------------------------------------
    _gpu(
        "H100-SXM",
        memory_bytes=85_520_809_984,
        bandwidth=3_350 * GIGA,
        flops=_H100_SXM_FLOPS,
        sm_count=132,
        compute_capability="9.0",
        generation="Hopper",
        aliases=("H100", "H100-80GB", "H100-SXM5", "H100-SXM-80GB", "NVIDIA H100 80GB HBM3"),
        source="NVIDIA H100 datasheet (SXM5)",
        memory_source="measured: 81559 MiB",
    ),
    _gpu(
        "H100-PCIe",
        memory_bytes=85_520_809_984,
        bandwidth=2_000 * GIGA,
        flops=_H100_PCIE_FLOPS,
        sm_count=114,
        compute_capability="9.0",
        generation="Hopper",
        aliases=("H100-PCIe-80GB", "NVIDIA H100 PCIe"),
        source="NVIDIA H100 datasheet (PCIe)",
        memory_source="assumed: the SXM part's 81559 MiB, not measured",
    ),
    _gpu(
        "H200",
        memory_bytes=150_754_820_096,
        bandwidth=4_800 * GIGA,
        flops=_H100_SXM_FLOPS,  # same dense peaks as the H100 SXM
        sm_count=132,
        compute_capability="9.0",
        generation="Hopper",
        aliases=("H200-SXM", "H200-141GB", "NVIDIA H200"),
        source="NVIDIA H200 datasheet (SXM)",
        memory_source="measured: about 140.4 GiB",
    ),
    _gpu(
        "GH200",
        # public logs show about 96 GiB (102 GB); 95 GiB is below every one of them
        memory_bytes=95 * GiB,
        bandwidth=4_000 * GIGA,
        flops=_H100_SXM_FLOPS,  # the GH200 datasheet's GPU figures are the H100 SXM's
        sm_count=132,
        compute_capability="9.0",
        generation="Hopper",
        aliases=("GH200-96GB", "GH200-480GB", "NVIDIA GH200 480GB"),
        source="NVIDIA GH200 Grace Hopper Superchip datasheet (96 GB HBM3 version)",
        memory_source="nominal: 95 GiB, rounded down from public logs' about 96 GiB",
    ),
    # --- Ampere ---------------------------------------------------------------------------
    _gpu(
        "A100-40GB",
        memory_bytes=42_298_834_944,
        bandwidth=1_555 * GIGA,
        flops=_A100_FLOPS,
        sm_count=108,
        compute_capability="8.0",
        generation="Ampere",
        aliases=("A100-SXM4-40GB", "A100-SXM-40GB", "NVIDIA A100-SXM4-40GB"),
        source="NVIDIA A100 datasheet (SXM4 40GB)",
        memory_source="public log (deviceQuery): 40339 MiB",
    ),
    _gpu(
        "A100-80GB",
        memory_bytes=84_987_740_160,
        bandwidth=2_039 * GIGA,
        flops=_A100_FLOPS,
        sm_count=108,
        compute_capability="8.0",
        generation="Ampere",
        aliases=("A100", "A100-SXM4-80GB", "A100-SXM-80GB", "NVIDIA A100-SXM4-80GB"),
        source="NVIDIA A100 datasheet (SXM4 80GB)",
        memory_source="public log (deviceQuery): 81051 MiB",
    ),
    _gpu(
        "A100-40GB-PCIe",
        memory_bytes=42_298_834_944,
        bandwidth=1_555 * GIGA,
        flops=_A100_FLOPS,
        sm_count=108,
        compute_capability="8.0",
        generation="Ampere",
        aliases=("A100-PCIe-40GB", "NVIDIA A100-PCIE-40GB"),
        source="NVIDIA A100 datasheet (PCIe 40GB)",
        memory_source="assumed: equal to the SXM4 40GB part",
    ),
    _gpu(
        "A100-80GB-PCIe",
        memory_bytes=84_987_740_160,
        bandwidth=1_935 * GIGA,
        flops=_A100_FLOPS,
        sm_count=108,
        compute_capability="8.0",
        generation="Ampere",
        aliases=("A100-PCIe-80GB", "A100-PCIe", "NVIDIA A100 80GB PCIe"),
        source="NVIDIA A100 datasheet (PCIe 80GB)",
        memory_source="assumed: equal to the SXM4 80GB part",
    ),
    _gpu(
        "A10",
        memory_bytes=23_609_475_072,
        bandwidth=600 * GIGA,
        flops=_flops(fp32=31.2, tf32=62.5, fp16=125.0, bf16=125.0),
        sm_count=72,
        compute_capability="8.6",
        generation="Ampere",
        aliases=("A10-24GB", "NVIDIA A10"),
        source="NVIDIA A10 datasheet",
        memory_source="public log (deviceQuery): 22516 MiB",
    ),
    _gpu(
        "A10G",
        memory_bytes=23_684_186_112,
        bandwidth=600 * GIGA,
        # AWS's variant of the A10 (EC2 G5): tensor figures at half the A10's
        flops=_flops(fp32=31.52, tf32=35.0, fp16=70.0, bf16=70.0),
        sm_count=80,
        compute_capability="8.6",
        generation="Ampere",
        aliases=("A10G-24GB", "NVIDIA A10G"),
        source="Baseten, 'NVIDIA A10 vs A10G for ML model inference' (NVIDIA publishes no "
        "A10G datasheet; third-party figures)",
        memory_source="public log (torch total_memory): 22587 MiB",
    ),
    _gpu(
        "RTX-A6000",
        memory_bytes=51_040_485_376,
        bandwidth=768 * GIGA,
        # the professional GA102 runs fp32 accumulation at full rate (dense: half sparse)
        flops=_flops(fp32=38.7, tf32=77.4, fp16=154.8, bf16=154.8),
        sm_count=84,
        compute_capability="8.6",
        generation="Ampere",
        aliases=("A6000", "RTXA6000", "RTX A6000", "NVIDIA RTX A6000"),
        source="NVIDIA RTX A6000 datasheet and the GA102 whitepaper",
        memory_source="public log (torch total_memory): 48676 MiB",
    ),
    _gpu(
        "RTX-3090",
        memory_bytes=25_437_405_184,
        bandwidth=936 * GIGA,
        # GA102 whitepaper, tensor figures with fp32 accumulation.
        flops=_flops(fp32=35.6, tf32=35.6, fp16=71.0, bf16=71.0),
        sm_count=82,
        compute_capability="8.6",
        generation="Ampere",
        aliases=("3090", "RTX3090", "GeForce RTX 3090", "NVIDIA GeForce RTX 3090"),
        source="NVIDIA GA102 whitepaper (tensor figures with fp32 accumulation)",
        memory_source="public log (torch): 24259 MiB",
    ),
    # --- Ada ------------------------------------------------------------------------------
    _gpu(
        "L4",
        memory_bytes=23_612_293_120,
        bandwidth=300 * GIGA,
        flops=_flops(fp32=30.3, tf32=60.0, fp16=121.0, bf16=121.0),
        sm_count=58,
        compute_capability="8.9",
        generation="Ada",
        aliases=("L4-24GB", "NVIDIA L4"),
        source="NVIDIA L4 datasheet",
        memory_source="public log (deviceQuery): 22518 MiB",
    ),
    _gpu(
        "L40",
        memory_bytes=47_576_711_168,
        bandwidth=864 * GIGA,
        flops=_flops(fp32=90.5, tf32=90.5, fp16=181.05, bf16=181.05),
        sm_count=142,
        compute_capability="8.9",
        generation="Ada",
        aliases=("L40-48GB", "NVIDIA L40"),
        source="NVIDIA L40 datasheet",
        memory_source="assumed: equal to the L40S (same board and memory), 45373 MiB",
    ),
    _gpu(
        "L40S",
        memory_bytes=47_576_711_168,
        bandwidth=864 * GIGA,
        flops=_flops(fp32=91.6, tf32=183.0, fp16=362.05, bf16=362.05),
        sm_count=142,
        compute_capability="8.9",
        generation="Ada",
        aliases=("L40S-48GB", "NVIDIA L40S"),
        source="NVIDIA L40S datasheet",
        memory_source="public log (deviceQuery): 45373 MiB",
    ),
    _gpu(
        "RTX-4090",
        memory_bytes=25_756_696_576,
        bandwidth=1008 * GIGA,
        # Ada whitepaper, tensor figures with fp32 accumulation.
        flops=_flops(fp32=82.6, tf32=82.6, fp16=165.2, bf16=165.2),
        sm_count=128,
        compute_capability="8.9",
        generation="Ada",
        aliases=("4090", "RTX4090", "GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
        source="NVIDIA Ada Lovelace whitepaper (tensor figures with fp32 accumulation)",
        memory_source="public log (torch): 24563 MiB",
    ),
    # --- Turing ---------------------------------------------------------------------------
    _gpu(
        "T4",
        memory_bytes=15_642_329_088,
        bandwidth=320 * GIGA,
        # No bf16/tf32 tensor cores: those use the fp32 CUDA-core figure.
        flops=_flops(fp32=8.1, tf32=8.1, fp16=65.0, bf16=8.1),
        sm_count=40,
        compute_capability="7.5",
        generation="Turing",
        aliases=("T4-16GB", "Tesla T4", "NVIDIA T4"),
        source="NVIDIA T4 datasheet (no bf16 or tf32 tensor cores: the fp32 figure)",
        memory_source="public log (deviceQuery, CUDA 12.5): 14918 MiB",
    ),
    # --- Volta ----------------------------------------------------------------------------
    _gpu(
        "V100",
        memory_bytes=34_072_559_616,
        bandwidth=900 * GIGA,
        # No bf16/tf32 tensor cores: those use the fp32 CUDA-core figure.
        flops=_flops(fp32=15.7, tf32=15.7, fp16=125.0, bf16=15.7),
        sm_count=80,
        compute_capability="7.0",
        generation="Volta",
        aliases=("V100-32GB", "V100-SXM2-32GB", "V100-SXM2", "Tesla V100-SXM2-32GB"),
        source="NVIDIA V100 datasheet (SXM2; no bf16 or tf32 tensor cores: the fp32 figure)",
        memory_source="public log (deviceQuery, CUDA 12.9): 32494 MiB",
    ),
    _gpu(
        "V100-16GB",
        memory_bytes=16_928_342_016,
        bandwidth=900 * GIGA,
        flops=_flops(fp32=15.7, tf32=15.7, fp16=125.0, bf16=15.7),
        sm_count=80,
        compute_capability="7.0",
        generation="Volta",
        aliases=("V100-SXM2-16GB", "Tesla V100-SXM2-16GB"),
        source="NVIDIA V100 datasheet (SXM2; no bf16 or tf32 tensor cores: the fp32 figure)",
        memory_source="public log (deviceQuery, CUDA 12.4): 16144 MiB",
    ),
)


def _physical_memory_bytes() -> int:
    """Physical memory of the host from ``os.sysconf``; a fixed 8 GiB if unavailable."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        pages = os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return _CPU_FALLBACK_MEMORY
    total = int(page) * int(pages)
    return total if total > 0 else _CPU_FALLBACK_MEMORY


def cpu_half_flags() -> list[str]:
    """This CPU's flags for native half-precision arithmetic (of ``avx512_bf16``,
    ``amx_bf16``, ``avx512_fp16``, ``amx_fp16``), sorted: what :func:`cpu_device` reads."""
    return sorted(_cpu_flags() & {f for fs in _CPU_HALF_FLAGS.values() for f in fs})


def cpu_device(
    *, cores: int | None = None, flags: Iterable[str] | None = None, memory_bytes: int | None = None
) -> Device:
    """Describe the local CPU as a :class:`Device` named ``"CPU"``.

    Cores come from :func:`os.cpu_count` and memory from ``os.sysconf`` (page size times
    physical pages; 8 GiB when the platform lacks it).  The throughput figures are **rough
    guesses**, not measurements: bandwidth is 20 GB/s per 2 logical cores capped at 200 GB/s,
    and fp32 peak is 50 GFLOP/s per logical core; tf32 uses the fp32 figure, and so do bf16
    and fp16 where the CPU has native arithmetic for them (``/proc/cpuinfo`` flags
    ``avx512_bf16``/``amx_bf16``, ``avx512_fp16``/``amx_fp16``); without it they get an
    eighth of it (measured here: PyTorch converts to fp32 and back).  The context
    overhead is 0.

    ``cores``, ``flags`` and ``memory_bytes`` describe another CPU instead of this one (a
    measurement's, see :func:`costaware.measure.collect.measured_cpu_device`): its logical cores,
    instruction-set flags and physical memory.
    """
    cores = max(1, cores if cores is not None else os.cpu_count() or 1)
    fp32 = cores * _CPU_FP32_PER_CORE
    flags = frozenset(flags) if flags is not None else _cpu_flags()
    flops = dict.fromkeys(FLOPS_KEYS, fp32)
    for half, native in _CPU_HALF_FLAGS.items():
        if not flags & set(native):
            flops[half] = fp32 / _CPU_HALF_SLOWDOWN
    return Device(
        name="CPU",
        kind="cpu",
        memory_bytes=memory_bytes if memory_bytes is not None else _physical_memory_bytes(),
        bandwidth=min(cores * _CPU_BANDWIDTH_PER_CORE, _CPU_BANDWIDTH_CAP),
        flops=flops,
        sm_count=cores,
        compute_capability="",
        generation="cpu",
        context_overhead_bytes=0,
        aliases=("local-cpu", "host"),
    )


def _build_catalog(devices: tuple[Device, ...]) -> Mapping[str, Device]:
    """Map canonical names to devices, rejecting duplicate canonical names."""
    catalog: dict[str, Device] = {}
    for device in devices:
        if device.name in catalog:
            raise RuntimeError(f"duplicate catalog entry {device.name!r}")
        catalog[device.name] = device
    return MappingProxyType(catalog)


def _build_index(catalog: Mapping[str, Device]) -> Mapping[str, str]:
    """Map every normalised name/alias (with and without vendor prefix) to a canonical name."""
    index: dict[str, str] = {}
    for canonical, device in catalog.items():
        for raw in (canonical, *device.aliases):
            full = _normalise(raw)
            for key in dict.fromkeys((full, _strip_vendor(full))):
                owner = index.setdefault(key, canonical)
                if owner != canonical:
                    raise RuntimeError(
                        f"name {raw!r} of {canonical!r} collides with catalog entry {owner!r}"
                    )
    return MappingProxyType(index)


#: Canonical name -> :class:`Device`.  ``"CPU"`` describes the machine importing this module.
CATALOG: Mapping[str, Device] = _build_catalog((*_GPUS, cpu_device()))
_INDEX: Mapping[str, str] = _build_index(CATALOG)


def known_devices() -> list[str]:
    """Canonical names of the catalog entries, sorted."""
    return sorted(CATALOG)


def _lookup(name: str) -> Device | None:
    """Catalog entry for ``name`` (canonical or alias, loosely matched), or ``None``."""
    key = _normalise(name)
    canonical = _INDEX.get(key)
    if canonical is None:
        canonical = _INDEX.get(_strip_vendor(key))
    return None if canonical is None else CATALOG[canonical]


def get_device(name: str | Device, *, own: Iterable[Device] = ()) -> Device:
    """Resolve a device name to its :class:`Device`.

    Args:
        name: A canonical catalog name or an alias, matched case-insensitively and ignoring
            spaces, underscores and hyphens (``"h100_sxm"``, ``"NVIDIA H100 80GB HBM3"``);
            a leading vendor word (``NVIDIA``, ``GeForce``, ``Tesla``, ``Quadro``) is optional.
            ``"auto"`` returns :func:`detect_device`.  A :class:`Device` is returned unchanged.
        own: devices of the user's own (:func:`costaware.device_files.load_devices`), matched
            by name or alias (loosely, as above) before the catalog.

    Raises:
        UnknownDeviceError: If ``name`` matches no entry; the message suggests the closest
            names and aliases (with the device each names) and lists the known names.
        TypeError: If ``name`` is neither a string nor a :class:`Device`.
    """
    if isinstance(name, Device):
        return name
    if not isinstance(name, str):
        raise TypeError(f"device name must be a str or Device, got {type(name).__name__}")
    own = list(own)
    key = _normalise(name)
    for d in own:
        if key in {_normalise(n) for n in (d.name, *d.aliases)}:
            return d
    if key == "auto":
        return detect_device()
    device = _lookup(name)
    if device is not None:
        return device
    known = known_devices()
    if _GENERIC_GPU_RE.match(name.strip().lower()):  # "cuda", "gpu", "cuda:0": no model
        hint = (
            " It names no particular GPU: pass 'auto' (the GPU this process sees, else the "
            "CPU) or a catalog name such as 'H100' or 'A10G'."
        )
    else:
        close = _close_names(name, own)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
    yours = f"; yours: {', '.join(d.name for d in own)}" if own else ""
    raise UnknownDeviceError(
        f"unknown device {name!r}.{hint} Known devices: {', '.join(known)} (or 'auto'){yours}."
    )


#: a device name that says "a GPU" without saying which (torch's device strings)
_GENERIC_GPU_RE = re.compile(r"^(cuda|gpu|nvidia)(\s*[:\s]?\s*\d+)?$")


def _shares_letters(key: str, other: str) -> bool:
    """Whether ``other`` is like ``key`` in more than digits: a name with letters
    (``MI300X``) is not close to one that shares only its digits (``3090``)."""
    if not any(c.isalpha() for c in key):
        return True  # "4090": its digits are all there is to match
    blocks = difflib.SequenceMatcher(None, key, other).get_matching_blocks()
    return any(c.isalpha() for b in blocks for c in key[b.a : b.a + b.size])


def _close_names(name: str, own: Iterable[Device] = (), n: int = 3) -> list[str]:
    """Up to ``n`` suggestions for a device name that matched nothing, closest first, one
    per device: the canonical name or alias (of the catalog's devices and ``own``) closest
    to ``name`` as :func:`get_device` compares names, written ``'H100' (the H100-SXM)``
    where it is an alias."""
    written: dict[str, tuple[str, str]] = {}  # normalised -> (as written, canonical)
    for device in (*own, *CATALOG.values()):
        for raw in (device.name, *device.aliases):
            full = _normalise(raw)
            for k in dict.fromkeys((full, _strip_vendor(full))):
                written.setdefault(k, (raw, device.name))
    key = _strip_vendor(_normalise(name))
    out: dict[str, str] = {}
    for k in difflib.get_close_matches(key, list(written), n=len(written), cutoff=0.5):
        if not _shares_letters(key, k):
            continue
        raw, canonical = written[k]
        if canonical not in out:
            out[canonical] = repr(raw) if raw == canonical else f"{raw!r} (the {canonical})"
        if len(out) == n:
            break
    return list(out.values())


def is_auto(device: object) -> bool:
    """Whether ``device`` is ``"auto"`` (any case, spaces around): the device this process
    sees, resolved where it runs."""
    return isinstance(device, str) and device.strip().lower() == "auto"


def device_kind(name: str | Device) -> str:
    """``"cuda"`` or ``"cpu"``: the kind of a device, or of a device name as
    :func:`get_device` matches it (any case, an alias, ``"cpu"`` as well as ``"CPU"``).

    A name missing from the catalog is a GPU's (``"cuda"``): measurements and op timings
    record the name the driver reports, and a GPU newer than the catalog still has one.
    Unlike :func:`get_device`, this never raises for such a name.
    """
    if isinstance(name, Device):
        return name.kind
    device = _lookup(name) if isinstance(name, str) else None
    return "cuda" if device is None else device.kind


def _decode(value: Any) -> str:
    """NVML returns ``bytes`` in old versions of the bindings and ``str`` in new ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _generation_for(major: int, minor: int) -> str:
    """Architecture name for a compute capability."""
    if major == 7:
        return "Turing" if minor >= 5 else "Volta"
    if major == 8:
        return "Ada" if minor >= 9 else "Ampere"
    if major == 9:
        return "Hopper"
    if major in (10, 11, 12):
        return "Blackwell"
    if major == 6:
        return "Pascal"
    return "unknown"


def _nvml_handle(pynvml: Any) -> Any | None:
    """Handle of the GPU CUDA would use as device 0, or ``None`` if none is visible.

    Honours ``CUDA_VISIBLE_DEVICES``: an empty value or a negative index means no GPU; an index
    or a ``GPU-`` UUID selects that GPU; otherwise NVML's GPU 0 is used.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return pynvml.nvmlDeviceGetHandleByIndex(0)
    first = visible.split(",", 1)[0].strip()
    if not first:
        return None
    if first.lstrip("-").isdigit():
        index = int(first)
        return None if index < 0 else pynvml.nvmlDeviceGetHandleByIndex(index)
    if first.startswith("GPU-"):
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(first)
        except Exception:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(0)


def _unknown_gpu(pynvml: Any, handle: Any, name: str, memory_bytes: int) -> Device:
    """Device for a GPU missing from the catalog: real name and memory, conservative speeds."""
    major, minor = 0, 0
    with contextlib.suppress(Exception):
        major, minor = (int(v) for v in pynvml.nvmlDeviceGetCudaComputeCapability(handle))
    has_tensor_cores = major >= 7
    has_bf16 = major >= 8
    tensor = _UNKNOWN_GPU_TENSOR if has_tensor_cores else _UNKNOWN_GPU_FP32
    overhead = _UNKNOWN_GPU_OVERHEAD
    if overhead >= memory_bytes:
        overhead = memory_bytes // 4
    return Device(
        name=name,
        kind="cuda",
        memory_bytes=memory_bytes,
        bandwidth=_UNKNOWN_GPU_BANDWIDTH,
        flops={
            "fp32": _UNKNOWN_GPU_FP32,
            "tf32": _UNKNOWN_GPU_FP32,
            "fp16": tensor,
            "bf16": tensor if has_bf16 else _UNKNOWN_GPU_FP32,
        },
        sm_count=_UNKNOWN_GPU_SM_COUNT,
        compute_capability=f"{major}.{minor}" if major else "",
        generation=_generation_for(major, minor) if major else "unknown",
        context_overhead_bytes=overhead,
    )


def detect_device() -> Device:
    """Describe the GPU this process would train on, via NVML.

    Reads the name and total memory of GPU 0 (the first entry of ``CUDA_VISIBLE_DEVICES``
    when that is set) with ``pynvml``, imported lazily.  A name found in the catalog returns
    that catalog entry.

    A GPU that is **not in the catalog** gets a new :class:`Device` with its real NVML name,
    real total memory and compute capability, but **conservative defaults** for everything
    else: 300 GB/s bandwidth, 8.1 TFLOP/s fp32/tf32, 65 TFLOP/s fp16/bf16 where tensor cores
    exist (bf16 needs compute capability 8.0+), 40 SMs and a 1 GiB context overhead, i.e.
    roughly a T4, so time estimates err on the slow side.

    If ``pynvml`` is not installed, NVML fails to initialise or answer, or no GPU is visible,
    returns :func:`cpu_device`.
    """
    try:
        import pynvml
    except ImportError:
        return cpu_device()
    try:
        pynvml.nvmlInit()
    except Exception:
        return cpu_device()
    try:
        handle = _nvml_handle(pynvml)
        if handle is None:
            return cpu_device()
        name = _decode(pynvml.nvmlDeviceGetName(handle)).strip()
        memory_bytes = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        device = _lookup(name)
        if device is not None and device.kind == "cuda":
            return device
        if memory_bytes <= 0:
            return cpu_device()
        return _unknown_gpu(pynvml, handle, name, memory_bytes)
    except Exception:
        return cpu_device()
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def precision_notes(device: Device, precision: str) -> list[str]:
    """Notes on training in ``precision`` on ``device``: bf16 on a GPU without bf16
    arithmetic (:attr:`Device.has_bf16`), which runs at its fp32 rate or slower."""
    if device.kind != "cuda" or _PRECISION_ALIASES.get(_normalise(str(precision))) not in ("bf16", "bf16-true"):
        return []
    if device.has_bf16:
        return []
    cc = f"compute capability {device.compute_capability}" if device.compute_capability else ""
    return [
        f"bf16 on the {device.name}: it has no bf16 arithmetic ({cc + '; ' if cc else ''}"
        "bf16 tensor cores need 8.0 or newer), so bf16 matmuls and convolutions run at its "
        "fp32 rate or slower and the time is predicted at that rate; fp16 (with a "
        "GradScaler) is the half precision for this GPU"
    ]


def no_bf16_note(names: Iterable[str]) -> str:
    """:func:`precision_notes`' note on bf16 said once for several GPUs without bf16
    arithmetic (``names``), as a comparison's table prints it."""
    names = list(names)
    listed = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else "".join(names)
    return (
        f"bf16 on the {listed}: no bf16 arithmetic (bf16 tensor cores need compute "
        "capability 8.0 or newer), so bf16 matmuls and convolutions run at the fp32 rate or "
        "slower and the time is predicted at that rate; fp16 (with a GradScaler) is the "
        f"half precision for {'these GPUs' if len(names) > 1 else 'this GPU'}"
    )


def catalog_text(devices: Sequence[Device] | None = None, *, sources: bool = False) -> str:
    """The device catalog as a plain-text table: every name whole, whatever the width
    (``costaware devices`` when its output is not a terminal, or with ``--sources``)."""
    from costaware._format import fmt_bytes

    devs = list(devices) if devices is not None else [CATALOG[n] for n in known_devices()]
    head = ["name", "memory", "bandwidth", "fp32", "bf16", "SMs", "generation"]
    head += ["figures from", "memory from"] if sources else []
    rows = []
    for d in devs:
        no_bf16 = d.kind == "cuda" and not d.has_bf16
        row = [
            d.name,
            fmt_bytes(d.memory_bytes),
            f"{d.bandwidth / 1e9:,.0f} GB/s",
            f"{d.peak_flops('fp32') / 1e12:,.1f} TF",
            f"{d.peak_flops('bf16') / 1e12:,.1f} TF" + (" *" if no_bf16 else ""),
            str(d.sm_count),
            d.generation,
        ]
        if sources:
            row += [d.source or "-", d.memory_source or "-"]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    left = {0, 6, 7, 8}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [line(head), line(["-" * w for w in widths]), *(line(r) for r in rows)]
    if any(d.kind == "cuda" and not d.has_bf16 for d in devs):
        out.append(
            "*: no bf16 arithmetic (compute capability below 8.0): bf16 runs at the fp32 "
            "rate or slower; use fp16 with a GradScaler"
        )
    return "\n".join(out)
