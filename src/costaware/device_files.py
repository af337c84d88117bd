"""Devices of the user's own, read from a JSON or TOML file or a mapping
(:func:`load_devices`, :func:`device_from_dict`), beside the catalog of
:mod:`costaware.devices`."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from costaware.budget import BudgetError, parse_bytes
from costaware.devices import (
    _FLOPS_FIX,
    FLOPS_KEYS,
    GIGA,
    TERA,
    Device,
    UnknownDeviceError,
    _fill_flops,
    _normalise,
    get_device,
)

__all__ = ["device_from_dict", "load_devices", "same_name"]


#: the fields :func:`device_from_dict` reads, besides :class:`Device`'s own
_FRIENDLY_KEYS = ("memory", "bandwidth_gbs", "tflops")


def device_from_dict(data: Mapping[str, Any]) -> Device:
    """A :class:`Device` from a mapping: :meth:`Device.to_dict`'s fields, or friendlier ones.

    Besides the fields of :class:`Device` (bytes, bytes/s, FLOP/s), it reads
    ``memory`` (a size such as ``"24GiB"`` or bytes) for ``memory_bytes``,
    ``bandwidth_gbs`` (GB/s, decimal) for ``bandwidth`` and ``tflops`` (TFLOP/s per
    precision: ``fp32``, ``tf32``, ``fp16``, ``bf16``) for ``flops``. A missing ``tf32``
    takes ``fp32``'s figure, and so does a missing ``bf16`` where ``compute_capability``
    is below 8.0 (no bf16 arithmetic); ``fp16`` is required (its rate without tensor
    cores varies from part to part). ``sm_count`` is required (a feature of the learned
    model). ``kind`` defaults to ``"cuda"``; ``context_overhead_bytes`` to the
    catalog's figure for its ``generation`` (1 GiB for one it does not know).

    The name and aliases must not be a catalog device's (``"H100"``): the learned model's
    rows, the default prices and every lookup go by the name, so a device of one's own
    under a catalog name would take the catalog device's measurements and list price.

    Raises:
        ValueError: a field is missing, unknown or of the wrong kind, or a name is the
            catalog's; the message names it.
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
    aliases = d.get("aliases", ())
    if isinstance(aliases, str) or not all(isinstance(a, str) for a in aliases):
        raise ValueError(f"device {name!r}: aliases must be a list of names, but got {aliases!r}.")
    _not_the_catalogs(name, aliases)
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
        given = {str(k): _number(name, f"tflops.{k}", v) for k, v in tf.items()}
        cc = d.get("compute_capability", "")
        lacking = [k for k in FLOPS_KEYS if k not in _fill_flops(given, str(cc))]
        if lacking:
            raise ValueError(
                f"device {name!r}: tflops lacks {', '.join(lacking)}. "
                + _FLOPS_FIX.replace("dense peak", "dense peak TFLOP/s")
            )
        d["flops"] = {k: v * TERA for k, v in given.items()}
    d.setdefault("kind", "cuda")
    d.setdefault("compute_capability", "")
    d.setdefault("generation", "unknown")
    missing = [
        _SAY_MISSING.get(f, f)
        for f in ("memory_bytes", "bandwidth", "flops", "sm_count")
        if f not in d
    ]
    if missing:
        raise ValueError(f"device {name!r} lacks {', '.join(missing)}.")
    d["aliases"] = tuple(aliases)
    d.setdefault("source", "given")
    d.setdefault("memory_source", "given")
    try:
        return Device(**d)
    except TypeError as e:
        raise ValueError(f"device {name!r}: {e}") from None
    except ValueError as e:  # Device's own message names it as "Device 'x'"
        msg = str(e).removeprefix(f"Device {name!r}: ")
        raise ValueError(f"device {name!r}: {msg}") from None


#: how a missing field is named: the friendly key, with the field it stands for
_SAY_MISSING = {
    "memory_bytes": "memory (or memory_bytes)",
    "bandwidth": "bandwidth_gbs (or bandwidth in bytes/s)",
    "flops": "tflops (or flops in FLOP/s)",
}


def _not_the_catalogs(name: str, aliases: Iterable[str]) -> None:
    """Refuse a device of one's own whose name or alias is a catalog device's, as
    :func:`~costaware.devices.get_device` matches names."""
    for n in (name, *aliases):
        try:
            taken = get_device(n) if _normalise(n) != "auto" else None
        except UnknownDeviceError:
            continue
        what = f"name {n!r}" if n == name else f"alias {n!r}"
        raise ValueError(
            f"device {name!r}: the {what} is the catalog's "
            + (f"{taken.name}" if taken is not None else "'auto' (the local device)")
            + "; a device of your own needs a name of its own (such as 'lab-"
            + _normalise(n)
            + "'): the catalog's measurements and list price go by the name, and would be "
            "taken as this device's."
        )


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
        devices = [device_from_dict(item) for item in items]
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from None
    same_name(devices, str(p))
    return devices


def same_name(devices: Iterable[Device], where: str) -> None:
    """Refuse two of ``devices`` that one name (or alias) would match: ``-d NAME`` could
    mean either. ``where`` names the files they come from, for the message."""
    owner: dict[str, tuple[int, str]] = {}
    for i, d in enumerate(devices):
        for n in dict.fromkeys(_normalise(x) for x in (d.name, *d.aliases)):
            first, name = owner.setdefault(n, (i, d.name))
            if first != i:
                raise ValueError(
                    f"{where}: two devices answer to the name {n!r} ({name!r} and "
                    f"{d.name!r}); give each device names of its own."
                )
