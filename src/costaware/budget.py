"""Budgets, and the admit/reject decision a prediction gets against one.

Example:
    >>> import costaware as ca
    >>> budget = ca.Budget(max_memory="24GiB", max_epoch_time="10min")
    >>> budget.max_memory_bytes()
    25769803776
    >>> ca.parse_bytes("24G") == ca.parse_bytes("24 GB") == budget.max_memory_bytes()
    True
    >>> ca.parse_duration("1h30m"), ca.parse_duration("250ms")
    (5400.0, 0.25)
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

from costaware._format import fmt_apart, fmt_bytes, fmt_money, fmt_seconds
from costaware.devices import Device, get_device
from costaware.errors import CostawareError

__all__ = ["Budget", "BudgetError", "Decision", "Reason", "parse_bytes", "parse_duration"]


class BudgetError(CostawareError, ValueError):
    """A budget value could not be understood (says what was expected)."""


#: Memory units. Every prefix is a power of 1024, whatever its spelling: "24G", "24GB",
#: "24 gb", "24Gb" and "24GiB" are all 24 GiB. nvidia-smi reports MiB, PyTorch's memory
#: summary GiB, and a card sold as "24GB" is compared with those figures, so a user who
#: writes "24GB" means the binary size. A lowercase "b" is read as bytes too: nobody
#: budgets GPU memory in bits. Decimal sizes are written in bytes (``24e9``).
_BYTE_UNITS = {
    "": 1, "b": 1, "byte": 1, "bytes": 1,
    "k": 1024, "kb": 1024, "kib": 1024,
    "m": 1024**2, "mb": 1024**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1024**3, "gib": 1024**3,
    "t": 1024**4, "tb": 1024**4, "tib": 1024**4,
}  # fmt: skip
#: A bare number under this many bytes is most likely a size in another unit ("24").
_SMALL_BARE_BYTES = 1024**2
_TIME_UNITS = {
    "ms": 1e-3, "msec": 1e-3, "msecs": 1e-3, "millisecond": 1e-3, "milliseconds": 1e-3,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}  # fmt: skip
_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_NUMBER_UNIT = re.compile(rf"^\s*{_NUMBER}\s*([a-zA-Z]*)\s*$")
#: one part of a duration: ``1h``, ``30 min``, ``250ms``
_DURATION_PART = re.compile(rf"\s*{_NUMBER}\s*([a-zA-Z]*)\s*")


def parse_bytes(value: int | float | str) -> int:
    """Bytes from ``25769803776``, ``"24GiB"``, ``"24G"``, ``"24 GB"`` or ``"512MiB"``.

    Every unit prefix is a power of 1024, as nvidia-smi and PyTorch count GPU memory:
    ``"24G"``, ``"24GB"``, ``"24Gb"`` and ``"24GiB"`` all mean 24 GiB
    (25,769,803,776 bytes). A lowercase ``b`` means bytes, not bits. A decimal size is
    given in bytes (``24e9``); a number without a unit is bytes.

    Raises:
        BudgetError: not a size, or not a finite size of at least one byte (``"0.4B"``,
            ``"1e400GB"``, NaN), saying what was expected and what arrived.
    """
    if isinstance(value, bool):
        raise BudgetError(f"expected a memory size like 24GiB, but got {value!r}.")
    if isinstance(value, (int, float)):
        n = _finite(value, "memory size", "24GiB")
    else:
        m = _NUMBER_UNIT.match(str(value))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _BYTE_UNITS:
            raise BudgetError(
                f"expected a memory size like 24GiB, 24G or 512MiB (or bytes, or a percentage "
                f"like 90%), but got {value!r}."
            )
        n = _finite(float(m.group(1)) * _BYTE_UNITS[unit], "memory size", "24GiB", repr(value))
    if n < 1:
        bytes_ = f" ({n:g} bytes)" if isinstance(value, str) and n > 0 else ""
        raise BudgetError(
            f"a memory size must be positive and at least 1 byte, but got {value!r}{bytes_}."
        )
    return int(n)


def _bare_small_size(value: object) -> float | None:
    """The number ``value`` is when it is a memory size without a unit under 1 MiB (``24``,
    ``"24"``), which reads as bytes but most likely meant another unit; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str) and (m := _NUMBER_UNIT.match(value)) and not m.group(2):
        number = float(m.group(1))
    else:
        return None
    return number if 0 < number < _SMALL_BARE_BYTES else None


def parse_duration(value: int | float | str) -> float:
    """Seconds from ``90``, ``"90s"``, ``"250ms"``, ``"5min"``, ``"1.5h"``, ``"2 days"``, or
    a compound duration: ``"1h30m"``, ``"2h 15min"``, ``"1m 30s"``.

    ``m`` is minutes and ``ms`` milliseconds. In a compound duration every part has a unit.

    Raises:
        BudgetError: not a duration, or not a finite positive one, saying what was
            expected and what arrived.
    """
    if isinstance(value, bool):
        raise BudgetError(f"expected a duration like 10min, but got {value!r}.")
    if isinstance(value, (int, float)):
        seconds = _finite(value, "duration", "10min")
    else:
        text = str(value)
        expected = (
            f"expected a duration like 90s, 250ms, 10min, 1.5h or 1h30m (or seconds), "
            f"but got {value!r}"
        )
        parts: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            m = _DURATION_PART.match(text, pos)
            if m is None or m.end() == pos:
                raise BudgetError(expected + ".")
            parts.append((m.group(1), m.group(2).lower()))
            pos = m.end()
        if not parts:
            raise BudgetError(expected + ".")
        if len(parts) == 1 and parts[0][1] == "":
            parts = [(parts[0][0], "s")]  # "90": seconds
        seconds = 0.0
        for number, unit in parts:
            if unit not in _TIME_UNITS:
                bad = f"{number}{unit}" if unit else number
                why = "has no unit" if not unit else f"has the unknown unit {unit!r}"
                raise BudgetError(f"{expected}, whose part {bad!r} {why}.")
            seconds += float(number) * _TIME_UNITS[unit]
        seconds = _finite(seconds, "duration", "10min", repr(value))
    if seconds <= 0:
        raise BudgetError(f"a duration must be positive, but got {value!r}.")
    return seconds


def _finite(number: int | float, what: str, example: str, shown: str | None = None) -> float:
    """``number`` as a float, or a BudgetError where it is NaN, infinite or too large for
    one. ``shown``: what the user wrote (default ``repr(number)``), for the message."""
    if shown is None:
        shown = repr(number)
        if len(shown) > 40:  # an int of hundreds of digits
            shown = f"{shown[:12]}... ({len(shown)} digits)"
    try:
        x = float(number)
    except OverflowError:  # an int past a float's range
        x = math.inf if number > 0 else -math.inf
    if math.isnan(x):
        raise BudgetError(f"expected a {what} like {example}, but got {shown}, which is NaN.")
    if math.isinf(x):
        raise BudgetError(
            f"expected a finite {what} like {example}, but got {shown}, which is too "
            "large to be one."
        )
    return x


def _trial_time(prediction: Any, *, upper: bool) -> float | None:
    """The trial's predicted time: the iteration time (or its upper bound) times the
    trial's steps; from a prediction recorded without them, its epochs of epoch time."""
    spec = prediction.spec
    if "trial_steps" in spec:
        trial: float | None = prediction.trial_time_upper if upper else prediction.trial_time
        return trial
    epoch = prediction.epoch_time_upper if upper else prediction.epoch_time
    epochs = spec.get("epochs", 1)  # None: no epoch limit, so no length from the epochs
    return None if epoch is None or epochs is None else float(epoch * epochs)


def _memory_message(what: str, label: str, peak: float, context: float, limit: float) -> str:
    """``<what> <peak><label> [+ <context> CUDA context = <need>] exceeds the <limit>
    budget``, the figure compared with the limit written so that the two read apart."""
    need = peak + context
    if context:
        n, lim = fmt_apart(need, limit, seconds=False)
        return (
            f"{what} {fmt_bytes(peak)}{label} + {fmt_bytes(context)} CUDA context = {n} "
            f"exceeds the {lim} budget"
        )
    n, lim = fmt_apart(peak, limit, seconds=False)
    return f"{what} {n}{label} exceeds the {lim} budget"


#: (max_memory, device) pairs already warned about being above the device's memory
_WARNED_OVER: set[tuple[Any, str]] = set()


def _capacity(prediction: Any, *, upper: bool) -> float:
    """The memory ``prediction`` says the step needs: its smallest capacity (upper bound
    or point); a prediction without one (an older record), its reserved peak."""
    name = "min_capacity_upper" if upper else "min_capacity"
    value = getattr(prediction, name, None)
    if not value:
        value = prediction.peak_memory_upper if upper else prediction.peak_memory
    return float(value)


@dataclass(frozen=True)
class Reason:
    """Why a trial was rejected: which limit, the predicted figure, and the limit."""

    kind: str  # "memory" | "epoch_time" | "trial_time" | "total_time" | "cost"
    predicted: float
    limit: float
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "predicted": self.predicted,
            "limit": self.limit,
            "message": self.message,
        }


@dataclass(frozen=True)
class Decision:
    """Admit or reject, with the reasons and the figures that were compared.

    ``checked`` holds, for each limit, the figure compared and the limit (``"memory"``,
    ``"epoch_time"``, ...); ``checked["limits"]`` names the checks that ran and
    ``checked["not_checked"]`` maps each limit that was set but could not be checked to
    why (an epoch-time budget for a spec without ``dataset_size``).
    """

    admit: bool
    reasons: tuple[Reason, ...] = ()
    checked: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.admit

    @property
    def not_checked(self) -> dict[str, str]:
        """The limits that were set but not checked, each with why."""
        found = self.checked.get("not_checked")
        return dict(found) if isinstance(found, dict) else {}

    def __str__(self) -> str:
        by_why: dict[str, list[str]] = {}
        for kind, why in self.not_checked.items():
            by_why.setdefault(why, []).append(kind)
        skipped = "; ".join(
            f"not checked: {', '.join(kinds)} ({why})" for why, kinds in by_why.items()
        )
        if self.admit:
            ok = ", ".join(f"{k} ok" for k in self.checked.get("limits", []))
            text = "; ".join(part for part in (ok, skipped) if part)
            return "admit: " + (text or "no limits set")
        text = "reject: " + "; ".join(r.message for r in self.reasons)
        return text + (f"; {skipped}" if skipped else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "admit": self.admit,
            "reasons": [r.to_dict() for r in self.reasons],
            "checked": dict(self.checked),
        }


@dataclass(frozen=True)
class Budget:
    """Limits a trial must fit, checked before it runs.

    Args:
        max_memory: the most GPU memory the training process may use, CUDA context
            included: bytes, a size (``"24GiB"``; every prefix is binary, as nvidia-smi
            and PyTorch count, so ``"24G"`` and ``"24GB"`` are 24 GiB too: see
            :func:`parse_bytes`), ``"90%"`` of the device, or ``"auto"`` (all of the
            device). A number without a unit is bytes, and one under 1 MiB is warned
            about (``24`` most likely meant ``"24GiB"``). The device's own memory is always a limit, whatever this says
            (a limit above it is warned about once). The check is ``the memory the step
            needs (its smallest capacity, :attr:`~costaware.Prediction.min_capacity_upper`)
            + the device's CUDA context``.
        max_epoch_time, max_trial_time, max_total_time: seconds, or a duration such as
            ``"90s"``, ``"250ms"``, ``"10min"``, ``"1.5h"`` or ``"1h30m"``
            (:func:`parse_duration`); the trial time is the iteration time times the
            spec's :attr:`~costaware.TrainingSpec.trial_steps` (its epochs, cut at its
            ``max_steps``, the time at its ``max_time``), and the total time adds what
            the study has already spent.
        price_per_hour, max_cost: a price per GPU-hour and a cap on the study's cost: what
            it has spent (its time at this price) and the next trial (a trial on
            ``world_size`` GPUs pays for each of them). A study whose ``max_total_time``
            or ``max_cost`` is spent is stopped by the integrations
            (:meth:`exhausted`).
        safety_margin: a fraction added to every predicted figure before comparing.
        bound: which memory figure is checked: ``"upper"`` (the calibrated upper bound of
            the memory the step needs, default) or ``"point"`` (the prediction).
        time_bound: which time figure is checked (epoch, trial and total time, cost):
            ``"point"`` (default) or ``"upper"``. The defaults differ on purpose. An OOM
            crashes the trial the moment it happens and cannot be caught early, so memory
            is checked at its upper bound. An epoch that runs long is measured while it
            runs (the Lightning callback with ``enforce=True`` stops it after that epoch),
            and a 95% time bound rejects many trials that would have fitted: a trial
            predicted at 60% of the budget is rejected whenever the bound is 1.7x.
            ``time_bound="upper"`` never admits a trial whose time is a coin flip.
    """

    max_memory: int | float | str | None = None
    max_epoch_time: int | float | str | None = None
    max_trial_time: int | float | str | None = None
    max_total_time: int | float | str | None = None
    price_per_hour: float | None = None
    max_cost: float | None = None
    safety_margin: float = 0.0
    bound: str = "upper"
    time_bound: str = "point"

    def __post_init__(self) -> None:
        # _memory_fraction validates percentages and "auto"; anything else must be a size
        if self.max_memory is not None and self._memory_fraction() is None:
            parse_bytes(self.max_memory)
            if (small := _bare_small_size(self.max_memory)) is not None:
                warnings.warn(
                    f"max_memory={self.max_memory!r} has no unit, so it is {small:g} bytes; "
                    f"did you mean max_memory='{small:g}GiB'? Write the unit to silence this "
                    f"(max_memory='{small:g}B' for bytes).",
                    UserWarning,
                    stacklevel=3,
                )
        for name in ("max_epoch_time", "max_trial_time", "max_total_time"):
            v = getattr(self, name)
            if v is not None:
                parse_duration(v)
        for name in ("price_per_hour", "max_cost"):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise BudgetError(f"{name} must be a number, but got {name}={v!r}.")
            # NaN passes every comparison as False, so a NaN price or cap would turn the
            # cost check off without a word
            f = _finite(v, name, "2.5", f"{name}={v!r}")
            if f < 0 or (f == 0 and name == "max_cost"):
                raise BudgetError(
                    f"{name} must be {'positive' if name == 'max_cost' else '>= 0'}, "
                    f"but got {name}={v!r}."
                )
        if self.max_cost is not None and self.price_per_hour is None:
            raise BudgetError("max_cost needs price_per_hour, to turn GPU time into cost.")
        if self.max_cost is not None and self.price_per_hour == 0:
            raise BudgetError(
                f"max_cost={self.max_cost!r} needs a positive price_per_hour, but got "
                "price_per_hour=0, at which no trial costs anything and the cap never applies."
            )
        margin = self.safety_margin
        if isinstance(margin, bool) or not (isinstance(margin, (int, float)) and 0 <= margin < 10):
            raise BudgetError(
                "safety_margin must be a fraction of the prediction added as headroom, from 0 "
                f"up to (not including) 10 (0.1 adds 10%), but got {self.safety_margin!r}."
            )
        for name in ("bound", "time_bound"):
            v = getattr(self, name)
            if v not in ("upper", "point"):
                raise BudgetError(f"{name} must be 'upper' or 'point', but got {name}={v!r}.")

    def _memory_fraction(self) -> float | None:
        v = self.max_memory
        if isinstance(v, str) and v.strip().endswith("%"):
            try:
                pct = float(v.strip()[:-1])
            except ValueError:
                raise BudgetError(
                    f"expected a percentage like 90%, but got max_memory={v!r}."
                ) from None
            if not 0 < pct <= 100:
                raise BudgetError(
                    f"a memory percentage must be in (0, 100], but got max_memory={v!r}."
                )
            return pct / 100
        if isinstance(v, str) and v.strip().lower() == "auto":
            return 1.0
        return None

    def max_memory_bytes(self, device: str | Device | None = None) -> int | None:
        """The memory limit in bytes; a percentage or ``"auto"`` needs the device."""
        if self.max_memory is None:
            return None
        frac = self._memory_fraction()
        if frac is None:
            return parse_bytes(self.max_memory)
        if device is None:
            raise BudgetError(
                f"max_memory={self.max_memory!r} is relative to a device; pass device=."
            )
        dev = get_device(device)
        limit = int(dev.memory_bytes * frac)
        if limit < 1:
            raise BudgetError(
                f"max_memory={self.max_memory!r} of the {dev.name}'s {fmt_bytes(dev.memory_bytes)} "
                "is less than 1 byte; expected a percentage like 90%."
            )
        return limit

    def check_room(self, device: str | Device) -> None:
        """Raise :class:`BudgetError` where ``max_memory`` leaves a trial on ``device`` no
        room at all: at or below the device's CUDA context, which every trial's need
        includes, so that every trial would be rejected. Said when the pruner, searcher
        or scheduler is made, not after a search's worth of dry runs."""
        dev = get_device(device)
        limit = self.max_memory_bytes(dev)
        context = dev.context_overhead_bytes if dev.kind == "cuda" else 0
        if limit is not None and context and limit <= context:
            raise BudgetError(
                f"max_memory={self.max_memory!r} leaves no room for a trial on the {dev.name}: "
                f"its CUDA context alone takes {fmt_bytes(context)}, and every trial's memory "
                f"need adds to it, so every trial would be rejected. Give max_memory more than "
                f"{fmt_bytes(context)} (it is the process's whole use of the GPU)."
            )

    def _memory_limit(self, dev: Device) -> tuple[int, str]:
        """The memory a trial may use on ``dev`` and where the figure comes from
        (``"budget"`` or ``"device"``): the budget's limit, never more than the device's
        memory. A budget above the device's memory is warned about once per budget and
        device."""
        own = self.max_memory_bytes(dev)
        if own is None or own < dev.memory_bytes:
            return (own, "budget") if own is not None else (dev.memory_bytes, "device")
        if own > dev.memory_bytes and (key := (self.max_memory, dev.name)) not in _WARNED_OVER:
            _WARNED_OVER.add(key)
            warnings.warn(
                f"max_memory={self.max_memory!r} is more than the {dev.name}'s "
                f"{fmt_bytes(dev.memory_bytes)}: the device's memory is the limit.",
                UserWarning,
                stacklevel=3,
            )
        return dev.memory_bytes, "device"

    def decide(
        self,
        prediction: Any,
        *,
        device: str | Device | None = None,
        spent_time: float = 0.0,
        spent_cost: float | None = None,
    ) -> Decision:
        """Admit or reject ``prediction`` (a :class:`~costaware.Prediction`).

        ``spent_time`` (seconds) and ``spent_cost`` are what the study has used so far,
        for ``max_total_time`` and ``max_cost``. Without ``spent_cost``, the study's cost
        is its ``spent_time`` at ``price_per_hour`` (one GPU per trial; a study of
        data-parallel trials gives its own).
        """
        spent_cost = self._spent_cost(spent_time, spent_cost)
        dev = get_device(device if device is not None else prediction.device)
        grow = 1.0 + self.safety_margin
        upper_mem = self.bound == "upper"
        upper_time = self.time_bound == "upper"
        label_mem = "upper bound" if upper_mem else "prediction"
        label_time = "upper bound" if upper_time else "prediction"
        reasons: list[Reason] = []
        checked: dict[str, Any] = {
            "limits": [],
            "device": dev.name,
            "safety_margin": self.safety_margin,
        }
        if self.price_per_hour is not None:  # a report prices the study's time with it
            checked["price_per_hour"] = float(self.price_per_hour)

        limit, limit_name = self._memory_limit(dev)
        peak = (
            _capacity(prediction, upper=True) if upper_mem else _capacity(prediction, upper=False)
        ) * grow
        need = peak + dev.context_overhead_bytes
        checked["limits"].append("memory")
        checked["memory"] = {
            "predicted": need,
            "limit": limit,
            "limit_from": limit_name,
            "figure": "min_capacity_upper" if upper_mem else "min_capacity",
            "context": dev.context_overhead_bytes,
        }
        if need > limit:
            msg = _memory_message(
                "predicted memory need",
                f" ({label_mem})",
                peak,
                dev.context_overhead_bytes,
                limit,
            )
            if limit_name == "device":
                msg += f" (all of the {dev.name}'s memory)"
            reasons.append(Reason("memory", need, limit, msg))
        epoch = prediction.epoch_time_upper if upper_time else prediction.epoch_time
        if epoch is not None:
            epoch *= grow
        trial = _trial_time(prediction, upper=upper_time)
        if trial is not None:
            trial *= grow
            if prediction.spec.get("max_time") is not None:  # the trial stops there
                trial = min(trial, float(prediction.spec["max_time"]))
        times = (
            ("epoch_time", self.max_epoch_time, epoch, "epoch time"),
            ("trial_time", self.max_trial_time, trial, "trial time"),
        )
        no_time = (
            "no dataset_size in the spec, so no epoch time was predicted; give "
            "TrainingSpec(dataset_size=...) to check it"
        )
        no_trial = (
            "the spec does not say how long the trial is, so its time is unknown; give "
            "TrainingSpec(dataset_size=...) with epochs, max_steps=... or max_time=... to "
            "check it"
        )
        not_checked: dict[str, str] = {}
        for kind, raw, value, words in times:
            if raw is None:
                continue
            cap = parse_duration(raw)
            if value is None:
                note = no_time if kind == "epoch_time" else no_trial
                checked[kind] = {"predicted": None, "limit": cap, "note": note}
                not_checked[kind] = note
                continue
            checked["limits"].append(kind)
            checked[kind] = {"predicted": value, "limit": cap}
            if value > cap:
                v, c = fmt_apart(value, cap, seconds=True)
                msg = f"predicted {words} {v} ({label_time}) exceeds {c}"
                reasons.append(Reason(kind, value, cap, msg))
        if self.max_total_time is not None and trial is None:
            cap = parse_duration(self.max_total_time)
            checked["total_time"] = {"predicted": None, "limit": cap, "note": no_trial}
            not_checked["total_time"] = no_trial
        if self.max_total_time is not None and trial is not None:
            cap = parse_duration(self.max_total_time)
            checked["limits"].append("total_time")
            checked["total_time"] = {"predicted": spent_time + trial, "limit": cap}
            if spent_time + trial > cap:
                reasons.append(
                    Reason(
                        "total_time",
                        spent_time + trial,
                        cap,
                        f"{fmt_seconds(spent_time)} spent + {fmt_seconds(trial)} for this trial exceeds the study's {fmt_seconds(cap)}",
                    )
                )
        if self.max_cost is not None and trial is None:
            checked["cost"] = {"predicted": None, "limit": self.max_cost, "note": no_trial}
            not_checked["cost"] = no_trial
        if self.max_cost is not None and self.price_per_hour is not None and trial is not None:
            gpus = int(prediction.spec.get("world_size", 1) or 1)
            cost = trial / 3600 * self.price_per_hour * gpus
            checked["limits"].append("cost")
            checked["cost"] = {"predicted": spent_cost + cost, "limit": self.max_cost}
            if spent_cost + cost > self.max_cost:
                reasons.append(
                    Reason(
                        "cost",
                        spent_cost + cost,
                        self.max_cost,
                        f"{fmt_money(spent_cost, '')} spent + {fmt_money(cost, '')} for this trial"
                        + (f" ({gpus} GPUs)" if gpus > 1 else "")
                        + f" exceeds the {fmt_money(self.max_cost, '')} cost cap",
                    )
                )
        if not_checked:
            checked["not_checked"] = not_checked
        return Decision(admit=not reasons, reasons=tuple(reasons), checked=checked)

    def _spent_cost(self, spent_time: float, spent_cost: float | None) -> float:
        if spent_cost is not None:
            return spent_cost
        return spent_time / 3600 * self.price_per_hour if self.price_per_hour else 0.0

    def exhausted(self, spent_time: float, spent_cost: float | None = None) -> str | None:
        """Why no further trial fits the study's budget, whatever it is: what the study
        has spent (``spent_time`` seconds; ``spent_cost``, else ``spent_time`` at
        ``price_per_hour``) already reaches ``max_total_time`` or ``max_cost``. None while
        it does not: a search then stops rather than propose trials it must reject."""
        if self.max_total_time is not None:
            cap = parse_duration(self.max_total_time)
            if spent_time >= cap:
                t, c = fmt_apart(spent_time, cap, seconds=True)
                return f"the study has spent {t} of its {c} max_total_time"
        if self.max_cost is not None:
            cost = self._spent_cost(spent_time, spent_cost)
            if cost >= self.max_cost:
                return (
                    f"the study has spent {fmt_money(cost, '')} of its "
                    f"{fmt_money(self.max_cost, '')} max_cost"
                )
        return None

    def check_measured(
        self,
        *,
        device: Device | None = None,
        peak_memory: float | None = None,
        epoch_time: float | None = None,
        trial_time: float | None = None,
    ) -> tuple[Reason, ...]:
        """What a *running* trial's measured cost breaks, for callbacks and schedulers.

        ``peak_memory`` is the allocator's reserved peak on a GPU (the device's CUDA
        context is added) or the measured peak on a CPU; ``trial_time`` is the training
        time so far. A relative memory budget (``"90%"``) needs ``device``.
        """
        reasons: list[Reason] = []
        if epoch_time is not None and self.max_epoch_time is not None:
            cap = parse_duration(self.max_epoch_time)
            if epoch_time > cap:
                v, c = fmt_apart(epoch_time, cap, seconds=True)
                msg = f"measured epoch time {v} exceeds the {c} budget"
                reasons.append(Reason("epoch_time", epoch_time, cap, msg))
        if trial_time is not None and self.max_trial_time is not None:
            cap = parse_duration(self.max_trial_time)
            if trial_time > cap:
                v, c = fmt_apart(trial_time, cap, seconds=True)
                msg = f"measured training time so far {v} exceeds the {c} trial budget"
                reasons.append(Reason("trial_time", trial_time, cap, msg))
        if peak_memory is not None and self.max_memory is not None:
            limit = self.max_memory_bytes(device)
            assert limit is not None  # max_memory is set
            context = (
                device.context_overhead_bytes if device is not None and device.kind == "cuda" else 0
            )
            need = peak_memory + context
            if need > limit:
                msg = _memory_message("measured peak memory", "", peak_memory, context, limit)
                reasons.append(Reason("memory", need, limit, msg))
        return tuple(reasons)
