"""Devices of the user's own, read from a JSON or TOML file or a mapping
(:func:`load_devices`, :func:`device_from_dict`), beside the catalog of
:mod:`costaware.devices`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from costaware.budget import BudgetError, parse_bytes
from costaware.devices import _GENERATION_OVERHEAD, _OVERHEAD_RECENT, GIGA, TERA, Device

__all__ = ["device_from_dict", "load_devices"]


#: the fields :func:`device_from_dict` reads, besides :class:`Device`'s own
_FRIENDLY_KEYS = ("memory", "bandwidth_gbs", "tflops")


def device_from_dict(data: Mapping[str, Any]) -> Device:
    """A :class:`Device` from a mapping: :meth:`Device.to_dict`'s fields, or friendlier ones.

    Besides the fields of :class:`Device` (bytes, bytes/s, FLOP/s), it reads
    ``memory`` (a size such as ``"24GiB"`` or bytes) for ``memory_bytes``,
    ``bandwidth_gbs`` (GB/s, decimal) for ``bandwidth`` and ``tflops`` (TFLOP/s per
    precision: ``fp32``, ``tf32``, ``fp16``, ``bf16``; a missing ``tf32`` takes ``fp32``'s
    figure) for ``flops``. ``sm_count`` is required (a feature of the learned model).
    ``kind`` defaults to ``"cuda"``; ``context_overhead_bytes`` to the
    catalog's figure for its ``generation`` (1 GiB for one it does not know).

    Raises:
        ValueError: a field is missing, unknown or of the wrong kind; the message names it.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"a device must be a table of fields, but got {type(data).__name__}.")
    d = dict(data)
    name = d.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a device needs a 'name' (a string), but got {name!r}.")
    known = {f for f in Device.__dataclass_fields__} | set(_FRIENDLY_KEYS)
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(
            f"device {name!r}: unknown field(s) {', '.join(unknown)}; expected some of "
            f"{', '.join(sorted(known))}."
        )
    if "memory" in d:
        try:
            d["memory_bytes"] = parse_bytes(d.pop("memory"))
        except BudgetError as e:
            raise ValueError(f"device {name!r}: memory: {e}") from None
    if "bandwidth_gbs" in d:
        d["bandwidth"] = _number(name, "bandwidth_gbs", d.pop("bandwidth_gbs")) * GIGA
    if "tflops" in d:
        tf = d.pop("tflops")
        if not isinstance(tf, Mapping):
            raise ValueError(
                f"device {name!r}: tflops must be a table of precision = TFLOP/s, got {tf!r}."
            )
        flops = {str(k): _number(name, f"tflops.{k}", v) * TERA for k, v in tf.items()}
        if "fp32" in flops:
            flops.setdefault("tf32", flops["fp32"])
        d["flops"] = flops
    d.setdefault("kind", "cuda")
    d.setdefault("compute_capability", "")
    d.setdefault("generation", "unknown")
    if "context_overhead_bytes" not in d:
        d["context_overhead_bytes"] = (
            0
            if d["kind"] == "cpu"
            else _GENERATION_OVERHEAD.get(str(d["generation"]), _OVERHEAD_RECENT)
        )
    missing = [f for f in ("memory_bytes", "bandwidth", "flops", "sm_count") if f not in d]
    if missing:
        raise ValueError(
            f"device {name!r} lacks {', '.join(missing)} (or memory, bandwidth_gbs, tflops)."
        )
    d["aliases"] = tuple(d.get("aliases", ()))
    d.setdefault("source", "given")
    d.setdefault("memory_source", "given")
    try:
        return Device(**d)
    except TypeError as e:
        raise ValueError(f"device {name!r}: {e}") from None


def _number(name: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"device {name!r}: {key} must be a number, but got {value!r}.")
    return float(value)


def load_devices(path: str | os.PathLike[str]) -> list[Device]:
    """The devices a JSON or TOML file describes (:func:`device_from_dict` reads each).

    JSON: one device (an object), a list of them, or ``{"devices": [...]}``. TOML: an
    array of tables ``[[devices]]``, or the fields of one device at the top level::

        [[devices]]
        name = "my-a40"
        memory = "44.3GiB"
        bandwidth_gbs = 696
        tflops = { fp32 = 37.4, tf32 = 74.8, fp16 = 149.7, bf16 = 149.7 }
        sm_count = 84
        compute_capability = "8.6"
        generation = "Ampere"

    Raises:
        ValueError: the file cannot be read or parsed, or a device is malformed (the
            message names the file and the device).
    """
    import json
    from pathlib import Path

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read the device file {p}: {e.strerror or e}.") from None
    toml = p.suffix.lower() == ".toml"
    if toml:
        try:
            import tomllib
        except ImportError:  # Python 3.10
            raise ValueError(
                f"reading {p} needs Python 3.11 (tomllib); write the devices as JSON instead."
            ) from None
    try:
        data: Any = tomllib.loads(text) if toml else json.loads(text)
    except ValueError as e:  # tomllib.TOMLDecodeError is a ValueError
        what = "TOML" if p.suffix.lower() == ".toml" else "JSON"
        raise ValueError(f"the device file {p} is not valid {what}: {e}") from None
    if isinstance(data, Mapping) and "devices" in data:
        data = data["devices"]
    items = data if isinstance(data, list) else [data]
    if not items:
        raise ValueError(f"the device file {p} describes no device.")
    try:
        return [device_from_dict(item) for item in items]
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from None
