"""Which GPU, and what it costs: one training configuration predicted on many GPUs.

:func:`compare` predicts a :class:`~costaware.TrainingSpec` on every GPU of the catalog
(or the devices given) and says, per device:

- whether the step fits: the :class:`~costaware.Budget` decision (the device's memory,
  its CUDA context included, and any other limit of the budget) at the spec's batch size;
- the largest batch size that fits (:func:`~costaware.core.batch_size.max_batch_size`);
- the iteration and epoch time, each with its upper bound;
- the cost of an epoch, from a price per GPU-hour the caller gives (one for every
  device, or one per device), else from :data:`DEFAULT_PRICES`: one public list price
  per GPU, with its source and the date it was read. On-demand prices of one GPU differ
  two- to four-fold between providers and change by the month, so the defaults order the
  devices roughly; pass your own to see your costs (docs/compare.md).

The dry runs are shared: a GPU's dry run does not depend on which GPU it is for, so the
whole comparison costs the architecture's two dry runs and a few dozen predictions per
device from them.

A device the model has no rows of (:attr:`Comparison.measured_on`) is predicted from
the devices it has, with a wider time bound (:data:`costaware.core.model.UNSEEN_DEVICE_WIDENING`)
and a note; so is bf16 on a GPU without bf16 arithmetic (a T4, a V100).

Example:
    >>> import costaware as ca
    >>> from costaware import zoo
    >>> spec = ca.TrainingSpec(model=lambda: zoo.mlp(784, (256,), 10),
    ...                        batch=ca.ImageBatch((784,), classes=10), batch_size=64,
    ...                        dataset_size=60_000)
    >>> result = ca.CostModel.default().compare(
    ...     spec, devices=["A10G", "L4", "H100"], price_per_hour={"A10G": 1.0, "L4": 0.8, "H100": 3.0})
    >>> [o.device for o in result.options] == sorted(o.device for o in result.options)
    False
    >>> result.best().fits
    True
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from costaware._format import fmt_bytes, fmt_money, fmt_seconds
from costaware.budget import Budget, Decision
from costaware.core.batch_size import (
    DEFAULT_HEADROOM,
    DEFAULT_LIMIT,
    BatchSizeResult,
    NothingFitsError,
    with_headroom,
)
from costaware.devices import (
    CATALOG,
    Device,
    _normalise,
    catalog_text,
    device_kind,
    get_device,
    no_bf16_note,
)
from costaware.errors import CostawareError

if TYPE_CHECKING:
    from costaware.core.model import CostModel, Prediction
    from costaware.spec import TrainingSpec

__all__ = [
    "DEFAULT_PRICES",
    "PRICES_READ",
    "SORT_KEYS",
    "CompareError",
    "Comparison",
    "DeviceOption",
    "UnusedPriceWarning",
    "catalog_text",
    "compare",
    "parse_prices",
]

#: what :meth:`Comparison.sorted` orders by
SORT_KEYS = ("cost", "time", "batch", "name")

#: the day the default prices were read
PRICES_READ = "2026-11-27"
_RUNPOD = (
    "RunPod Serverless flex rate, {rate}/s (docs.runpod.io/serverless/pricing, read "
    f"{PRICES_READ}; a serverless worker's rate, above RunPod's pod rates)"
)
#: The price of one GPU-hour, in US dollars, that :func:`compare` uses for a catalog GPU
#: the caller gives none for: device name -> (price, where it comes from). One provider's
#: list price per GPU where one lists many (RunPod Serverless: per second, times 3600),
#: AWS's for the A10G (only AWS rents it); GPUs no source here lists have none.
DEFAULT_PRICES: Mapping[str, tuple[float, str]] = MappingProxyType(
    {
        "RTX-3090": (0.684, _RUNPOD.format(rate="$0.00019") + ", shared with the L4 and A5000"),
        "L4": (0.684, _RUNPOD.format(rate="$0.00019") + ", shared with the RTX 3090 and A5000"),
        "RTX-4090": (1.116, _RUNPOD.format(rate="$0.00031") + ", '4090 PRO'"),
        "RTX-A6000": (1.224, _RUNPOD.format(rate="$0.00034") + ", shared with the A40"),
        "L40": (1.908, _RUNPOD.format(rate="$0.00053") + ", shared with the L40S"),
        "L40S": (1.908, _RUNPOD.format(rate="$0.00053") + ", shared with the L40"),
        "A100-80GB": (2.736, _RUNPOD.format(rate="$0.00076") + ", 'A100 80 GB'"),
        "H100-SXM": (4.176, _RUNPOD.format(rate="$0.00116") + ", 'H100 PRO 80 GB'"),
        "H200": (5.58, _RUNPOD.format(rate="$0.00155") + ", 'H200 PRO 141 GB'"),
        "B200": (8.64, _RUNPOD.format(rate="$0.00240") + ", 'B200 180 GB'"),
        "A10G": (
            1.006,
            "AWS EC2 g5.xlarge on demand, us-east-1, Linux (1 A10G, 4 vCPU), as quoted from "
            f"AWS's rate card of June 2026 by factualminds.com; read {PRICES_READ}",
        ),
    }
)

Prices = float | int | Mapping[str, float | int] | None


class CompareError(CostawareError, ValueError):
    """Bad input to :func:`compare`: a price, a device list, a sort key; the message says
    what was expected and what arrived."""


@dataclass(frozen=True)
class DeviceOption:
    """One device of a :class:`Comparison`.

    ``fits`` is the budget's decision at the spec's batch size (``reasons`` say why not);
    ``max_batch`` the largest batch size it admits (0: not even 1). Times are seconds, the
    epoch's None without a ``dataset_size``; ``cost_per_epoch`` is in the caller's
    currency, for all ``gpus`` GPUs the spec trains on (its ``world_size``), None
    without a price for the device or an epoch time. ``measured`` says
    whether the model has rows of this device (else its time bound is widened).
    """

    device: str
    fits: bool
    reasons: tuple[str, ...]
    max_batch: int
    max_batch_limited_by: str
    iteration_time: float
    iteration_time_upper: float
    epoch_time: float | None
    epoch_time_upper: float | None
    memory_need: int
    memory_usable: int
    price_per_hour: float | None
    measured: bool
    notes: tuple[str, ...] = ()
    price_source: str | None = None
    gpus: int = 1
    prediction: Prediction | None = field(default=None, repr=False, compare=False)
    decision: Decision | None = field(default=None, repr=False, compare=False)
    batch_search: BatchSizeResult | None = field(default=None, repr=False, compare=False)

    @property
    def cost_per_epoch(self) -> float | None:
        return _cost(self.epoch_time, self.price_per_hour, self.gpus)

    @property
    def cost_per_epoch_upper(self) -> float | None:
        return _cost(self.epoch_time_upper, self.price_per_hour, self.gpus)

    @property
    def cost_per_step(self) -> float | None:
        """The cost of one iteration (what orders the devices when there is no epoch)."""
        return _cost(self.iteration_time, self.price_per_hour, self.gpus)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "fits": self.fits,
            "reasons": list(self.reasons),
            "max_batch_size": self.max_batch,
            "max_batch_limited_by": self.max_batch_limited_by,
            "iteration_time": self.iteration_time,
            "iteration_time_upper": self.iteration_time_upper,
            "epoch_time": self.epoch_time,
            "epoch_time_upper": self.epoch_time_upper,
            "memory_need": self.memory_need,
            "memory_usable": self.memory_usable,
            "price_per_hour": self.price_per_hour,
            "price_source": self.price_source,
            "gpus": self.gpus,
            "cost_per_epoch": self.cost_per_epoch,
            "cost_per_epoch_upper": self.cost_per_epoch_upper,
            "measured": self.measured,
            "notes": list(self.notes),
            "prediction": None if self.prediction is None else self.prediction.to_dict(),
        }


def _cost(seconds: float | None, price: float | None, gpus: int) -> float | None:
    """What ``seconds`` on ``gpus`` GPUs cost at ``price`` per GPU-hour."""
    return None if seconds is None or price is None else seconds / 3600.0 * price * gpus


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` found: one :class:`DeviceOption` per device.

    ``options`` are in the order of :meth:`sorted` with ``sort`` (devices where the step
    does not fit last). ``notes`` are the predictions' notes common to every device (a
    device's own are in its option). ``elapsed_s`` is the whole comparison's wall time.
    """

    spec: Mapping[str, Any]
    options: tuple[DeviceOption, ...]
    sort: str
    currency: str
    measured_on: tuple[str, ...]
    notes: tuple[str, ...]
    elapsed_s: float

    def sorted(self, by: str | None = None) -> list[DeviceOption]:
        """The options ordered by ``by`` (:data:`SORT_KEYS`; default :attr:`sort`): ``cost``
        (cost per epoch, or per step without an epoch; unpriced devices after the priced),
        ``time`` (iteration time), ``batch`` (largest batch size, largest first) or ``name``.
        Devices where the step does not fit at its batch size come last."""
        key = _sort_key(by if by is not None else self.sort)
        return sorted(self.options, key=key)

    def best(self, by: str | None = None) -> DeviceOption | None:
        """The first option by ``by`` where the step fits, or None."""
        return next((o for o in self.sorted(by) if o.fits), None)

    def option(self, device: str | Device) -> DeviceOption:
        """The option of ``device`` (a name as :func:`~costaware.get_device` matches it)."""
        name = device.name if isinstance(device, Device) else device
        for o in self.options:
            if _normalise(o.device) == _normalise(name):
                return o
        dev = get_device(device)
        for o in self.options:
            if o.device == dev.name:
                return o
        raise KeyError(f"{dev.name} is not in this comparison ({', '.join(self.devices)}).")

    @property
    def devices(self) -> list[str]:
        return [o.device for o in self.options]

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": dict(self.spec),
            "sort": self.sort,
            "currency": self.currency,
            "measured_on": list(self.measured_on),
            "notes": list(self.notes),
            "elapsed_s": self.elapsed_s,
            "options": [o.to_dict() for o in self.options],
        }

    def table(self, by: str | None = None) -> str:
        """The comparison as a plain-text table (what ``repr`` and the CLI print)."""
        return _table(self, self.sorted(by))

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return self.table()


def _sort_key(by: str) -> Callable[[DeviceOption], tuple[Any, ...]]:
    if by not in SORT_KEYS:
        raise CompareError(f"sort must be one of {', '.join(SORT_KEYS)}, but got {by!r}.")

    def key(o: DeviceOption) -> tuple[Any, ...]:
        head = (not o.fits,)
        if by == "cost":
            cost = o.cost_per_epoch if o.cost_per_epoch is not None else o.cost_per_step
            return (*head, cost is None, cost if cost is not None else o.iteration_time, o.device)
        if by == "time":
            return (*head, o.iteration_time, o.device)
        if by == "batch":
            return (*head, -o.max_batch, o.iteration_time, o.device)
        return (*head, o.device.lower())

    return key


# --------------------------------------------------------------------------------------
# input
# --------------------------------------------------------------------------------------
def _price(value: Any, where: str) -> float:
    """A price per GPU-hour: a finite number >= 0, or a CompareError saying what arrived."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CompareError(
            f"{where} must be a number (a price per GPU-hour, e.g. 2.5), but got {value!r}."
        )
    x = float(value)
    if math.isnan(x) or math.isinf(x):
        raise CompareError(f"{where} must be a finite number, but got {value!r}.")
    if x < 0:
        raise CompareError(f"{where} must be 0 or more, but got {value!r}.")
    return x


def _resolve(name: str | Device, extra: Sequence[Device]) -> Device:
    """``name`` as a Device: one of ``extra`` by name or alias, else the catalog's."""
    if isinstance(name, Device):
        return name
    if not isinstance(name, str):
        raise CompareError(
            f"a device must be a name or a Device, but got {type(name).__name__} {name!r}."
        )
    return get_device(name, own=extra)


class UnusedPriceWarning(UserWarning):
    """A price given for a device that is not among those compared: it is not used
    (``costaware compare`` refuses it). ``names`` are the prices' names (with the device
    each names where that differs), ``compared`` the devices compared."""

    def __init__(self, message: str, names: Sequence[str] = (), compared: Sequence[str] = ()):
        super().__init__(message)
        self.names, self.compared = list(names), list(compared)


def _prices(
    price_per_hour: Prices, devices: Sequence[Device], extra: Sequence[Device] = ()
) -> dict[str, float]:
    """Device name -> price, for ``devices``, from one number or a mapping. A mapping's
    names are matched as device names are (``extra`` besides the catalog); two names of
    one device are refused, and a device not among ``devices`` is warned of
    (:class:`UnusedPriceWarning`) and left out."""
    if price_per_hour is None:
        return {}
    if isinstance(price_per_hour, Mapping):
        out: dict[str, float] = {}
        named: dict[str, str] = {}  # device -> the name its price was given under
        unused: list[str] = []
        for name, value in price_per_hour.items():
            dev = _resolve(name, [*devices, *extra])
            price = _price(value, f"the price of {name!r}")
            if dev.name in named:
                raise CompareError(
                    f"price_per_hour prices the {dev.name} twice, as {named[dev.name]!r} and "
                    f"{name!r}: give one price per device."
                )
            named[dev.name] = str(name)
            if all(d.name != dev.name for d in devices):
                unused.append(str(name) if name == dev.name else f"{name} (the {dev.name})")
                continue
            out[dev.name] = price
        if unused:
            import warnings

            compared = [d.name for d in devices]
            warnings.warn(
                UnusedPriceWarning(
                    f"price_per_hour prices {', '.join(unused)}, which "
                    f"{'is' if len(unused) == 1 else 'are'} not among the devices compared "
                    f"({', '.join(compared)}); "
                    f"{'its price is' if len(unused) == 1 else 'their prices are'} not used.",
                    unused,
                    compared,
                ),
                stacklevel=_callers_level(),
            )
        return out
    one = _price(price_per_hour, "price_per_hour")
    return {d.name: one for d in devices}


def _callers_level() -> int:
    """The ``stacklevel`` of a warning raised here that names the first frame outside
    costaware (the user's call, however deep inside costaware it is made)."""
    import sys
    from pathlib import Path

    package = str(Path(__file__).resolve().parents[1] / "_")[:-1]  # with its separator
    frame, level = sys._getframe(1), 1
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(package):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


def parse_prices(items: Iterable[str]) -> float | dict[str, float]:
    """Prices written as text (``costaware compare --price``): one number for every device
    (``"2.5"``), or ``NAME=PRICE`` items (``"A10G=1.2"``), possibly comma-separated."""
    one: float | None = None
    named: dict[str, float] = {}
    for item in items:
        for part in (p.strip() for p in str(item).split(",")):
            if not part:
                continue
            name, eq, text = part.rpartition("=")
            name = name.strip()
            if eq and not name:
                raise CompareError(f"expected a price as NAME=PRICE, but got {part!r}.")
            try:
                value = float(text)
            except ValueError:
                raise CompareError(
                    f"expected a price as a number or NAME=PRICE (e.g. 2.5 or A10G=1.2), "
                    f"but got {part!r}."
                ) from None
            where = f"the price of {name!r}" if eq else "the price"
            value = _price(value, where)
            if eq:
                again = next((n for n in named if _normalise(n) == _normalise(name)), None)
                if again is not None:
                    raise CompareError(
                        f"{again!r} has two prices ({again}={named[again]:g} and "
                        f"{name}={value:g}): give each device one price."
                    )
                named[name] = value
            elif one is not None:
                raise CompareError("give one price for every device, or NAME=PRICE for each.")
            else:
                one = value
    if one is not None and named:
        raise CompareError("give one price for every device, or NAME=PRICE for each, not both.")
    return one if one is not None else named


def _catalog_gpus() -> list[Device]:
    return [CATALOG[n] for n in sorted(CATALOG) if CATALOG[n].kind == "cuda"]


# --------------------------------------------------------------------------------------
# the comparison
# --------------------------------------------------------------------------------------
def compare(
    model: CostModel,
    spec: TrainingSpec,
    devices: Iterable[str | Device] | None = None,
    price_per_hour: Prices = None,
    budget: Budget | None = None,
    *,
    sort: str | None = None,
    currency: str = "$",
    limit: int = DEFAULT_LIMIT,
    extra_devices: Sequence[Device] = (),
    default_prices: bool = True,
    on_device: Callable[[str], None] | None = None,
) -> Comparison:
    """Predict ``spec`` on each of ``devices`` (default: every GPU of the catalog).

    Args:
        model: the cost model (:meth:`costaware.CostModel.default`).
        spec: the training configuration.
        devices: catalog names, aliases or :class:`~costaware.Device` objects. Names are
            matched as :func:`~costaware.get_device` matches them (and against
            ``extra_devices``); a device named twice is compared once.
        price_per_hour: the price of one GPU-hour: one number for every device, or a
            mapping from device name to price. A device given none takes its
            :data:`DEFAULT_PRICES` entry (unless ``default_prices`` is False); one without
            either has no cost. A number of 0 or more, in ``currency``. A mapping's
            names are matched as ``devices`` are; one device priced under two of its
            names is refused, and a device not compared is warned of
            (:class:`UnusedPriceWarning`) and its price not used.
        budget: the limits the step must fit (default ``Budget()``: each device's memory).
            A ``max_cost`` is checked at each device's own price where it has one.
        sort: :data:`SORT_KEYS`; default ``"cost"`` with prices, else ``"time"``.
        currency: the symbol costs are written with (the default prices are US dollars:
            with another currency, give every price).
        limit: the largest batch size searched.
        extra_devices: devices of the user's own (:func:`~costaware.device_files.load_devices`)
            that names in ``devices`` may refer to; with ``devices=None`` they are compared
            besides the catalog's GPUs.
        default_prices: whether a device without a given price takes its default.
        on_device: called with each device's name before it is predicted (progress).

    Raises:
        UnknownDeviceError: a device name matches nothing (the message suggests close ones).
        CompareError: a price is not a number, is negative, or one device has two; a sort
            key is unknown; no device.
        NothingFitsError: not even a batch of 1 fits on any of the devices.
        SpecError, TraceError: the spec is invalid or cannot be dry-run.
    """
    from costaware.spec import TrainingSpec

    t0 = time.perf_counter()
    if not isinstance(spec, TrainingSpec):
        raise CompareError(f"compare expects a TrainingSpec, but got {type(spec).__name__}.")
    chosen = _chosen_devices(devices, extra_devices)
    prices = _device_prices(chosen, price_per_hour, currency, default_prices, extra_devices)
    sort = sort if sort is not None else ("cost" if prices else "time")
    _sort_key(sort)  # an unknown key fails before the predictions
    judge = budget if budget is not None else Budget()
    seen = (
        tuple(d for kind in ("cuda", "cpu") for d in model.trained_on(kind)[1])
        if model.is_fitted
        else ()
    )
    options: list[DeviceOption] = []
    needs: list[tuple[str, int, float]] = []  # (device, batch size, memory need) so far
    for dev in chosen.values():
        if on_device is not None:
            on_device(dev.name)
        options.append(
            _device_option(model, spec, dev, judge, prices.get(dev.name), limit, needs, seen)
        )
    if not any(o.max_batch for o in options):
        raise NothingFitsError(_nothing_fits(options))
    result = _comparison(spec, options, sort=sort, currency=currency, measured_on=seen)
    return dataclasses.replace(
        result, options=tuple(result.sorted()), elapsed_s=time.perf_counter() - t0
    )


def _chosen_devices(
    devices: Iterable[str | Device] | None, extra_devices: Sequence[Device]
) -> dict[str, Device]:
    """The devices to compare, by name, in the order given, each once: the catalog's GPUs
    and ``extra_devices`` when ``devices`` is None, else each name resolved against the
    catalog and ``extra_devices``."""
    extra = list(extra_devices)
    if devices is None:
        wanted: list[Device] = [*_catalog_gpus(), *extra]
    else:
        if isinstance(devices, (str, Device)):
            devices = [devices]
        wanted = [_resolve(d, extra) for d in devices]
    chosen: dict[str, Device] = {}
    for d in wanted:
        chosen.setdefault(d.name, d)
    if not chosen:
        raise CompareError("no devices to compare: give at least one device name.")
    return chosen


def _device_prices(
    chosen: Mapping[str, Device],
    price_per_hour: Prices,
    currency: str,
    default_prices: bool,
    extra_devices: Sequence[Device] = (),
) -> dict[str, tuple[float, str]]:
    """Each device's price per hour and where it comes from (``"given"``, or the
    :data:`DEFAULT_PRICES` source); a device with neither is left out. The default prices
    are US dollars, so they apply only with ``currency="$"``."""
    given = _prices(price_per_hour, list(chosen.values()), extra_devices)
    prices: dict[str, tuple[float, str]] = {}
    for name in chosen:
        if name in given:
            prices[name] = (given[name], "given")
        elif default_prices and currency == "$" and name in DEFAULT_PRICES:
            prices[name] = DEFAULT_PRICES[name]
    return prices


def _device_option(
    model: CostModel,
    spec: TrainingSpec,
    dev: Device,
    judge: Budget,
    priced: tuple[float, str] | None,
    limit: int,
    needs: list[tuple[str, int, float]],
    measured_on: tuple[str, ...],
) -> DeviceOption:
    """One device's row: the prediction at the spec's batch size, the budget's decision
    on it (a ``max_cost`` judged at this device's price), and the largest batch size
    admitted. ``needs`` collects the memory needs predicted across the devices, which
    steer the next device's batch search."""
    price, price_source = priced if priced is not None else (None, None)
    if judge.max_cost is not None and price:
        judge = dataclasses.replace(judge, price_per_hour=price)
    pred = model.predict(spec, dev)
    decision = judge.decide(pred, device=dev)
    found = _BatchSearch(model, spec, dev, judge, limit, pred, decision, needs).run()
    return DeviceOption(
        device=dev.name,
        fits=decision.admit,
        reasons=tuple(r.message for r in decision.reasons),
        max_batch=found.batch_size,
        max_batch_limited_by=found.limited_by,
        iteration_time=pred.iteration_time,
        iteration_time_upper=pred.iteration_time_upper,
        epoch_time=pred.epoch_time,
        epoch_time_upper=pred.epoch_time_upper,
        memory_need=int(pred.min_capacity_upper + dev.context_overhead_bytes),
        memory_usable=int(dev.memory_bytes),
        price_per_hour=price,
        price_source=price_source,
        gpus=spec.world_size,
        measured=dev.name in measured_on,
        notes=tuple(pred.notes),
        prediction=pred,
        decision=decision,
        batch_search=found,
    )


def _comparison(
    spec: TrainingSpec,
    options: Sequence[DeviceOption],
    *,
    sort: str,
    currency: str,
    measured_on: tuple[str, ...],
) -> Comparison:
    """The comparison of ``options``: a note every device shares is said once, for the
    whole comparison, and left out of each device's own notes."""
    common = set.intersection(*(set(o.notes) for o in options))
    options = [
        dataclasses.replace(o, notes=tuple(n for n in o.notes if n not in common)) for o in options
    ]
    first_notes = options[0].prediction.notes if options[0].prediction is not None else ()
    summary = spec.summary()
    summary["steps_per_epoch"] = spec.steps_per_epoch
    return Comparison(
        spec=summary,
        options=tuple(options),
        sort=sort,
        currency=currency,
        measured_on=measured_on,
        notes=tuple(n for n in first_notes if n in common),
        elapsed_s=0.0,
    )


class _BatchSearch:
    """The largest batch size ``judge`` admits on ``dev`` (:meth:`run`) with the step's
    need grown by the default headroom, as :func:`~costaware.core.batch_size.max_batch_size` finds it (a
    size admitted, the next one above it rejected, or the search limit), in fewer
    predictions.

    Where :func:`~costaware.core.batch_size.max_batch_size` doubles and bisects, this aims at
    the batch size where the memory need meets the device's memory, on a line through the
    two needs nearest it among those already predicted (for this device, and for the
    others shifted to this one), and gallops from there: a step that doubles while the
    probes stay on one side, then interpolation inside the bracket, halving it where
    interpolation gains less than a bisection. Both searches assume that no size above a
    rejected one is admitted; near the edge the need is not monotone to the byte (the
    allocator rounds), so the two may stop a size or two apart. ``needs`` collects
    (device, batch size, memory need) across the devices of one comparison.

    It holds the predictions and decisions made so far, by batch size, and the steps of
    the search: climb above the sizes admitted, descend below the sizes rejected, narrow
    the bracket between them.
    """

    def __init__(
        self,
        model: CostModel,
        spec: TrainingSpec,
        dev: Device,
        judge: Budget,
        limit: int,
        pred0: Prediction,
        decision0: Decision,
        needs: list[tuple[str, int, float]],
    ) -> None:
        self.model, self.spec, self.dev, self.judge, self.limit = model, spec, dev, judge, limit
        self.pred0, self.decision0, self.needs = pred0, decision0, needs
        self.seen: dict[int, tuple[Prediction, Decision]] = {}
        self.start = max(1, min(spec.batch_size, limit))
        # the need at which the search's headroom is used up
        self.target = float(dev.usable_memory_bytes) / (1 + DEFAULT_HEADROOM)

    def run(self) -> BatchSizeResult:
        """The search: climb from the sizes admitted; where none was, descend below the
        sizes rejected; then narrow the bracket."""
        lo, hi = self.climb()
        if hi is None:
            return self.result(lo, None, "search limit")
        if lo == 0:
            lo, hi = self.descend(hi)
            if lo == 0:
                return self.result(0, None, "nothing fits")
        return self.narrow(lo, hi)

    def admit(self, b: int) -> bool:
        """Whether the budget admits batch size ``b``, predicted once (the spec's own
        size is the prediction already made); each new need joins ``needs``."""
        if b not in self.seen:
            if b == self.spec.batch_size:
                pred, decision = self.pred0, self.decision0
            else:
                pred = self.model.predict(self.spec.with_batch_size(b), self.dev)
                decision = self.judge.decide(pred, device=self.dev)
            self.seen[b] = (pred, with_headroom(decision, DEFAULT_HEADROOM))
            self.needs.append((self.dev.name, b, float(pred.min_capacity_upper)))
        return self.seen[b][1].admit

    def aim(self, lo: int, hi: int | None) -> int | None:
        """The batch size where the need meets the device's memory on a line through two
        needs around it, or None: inside a bracket, this device's needs at its ends; else
        the needs of every device so far, each shifted by its difference from this
        device's at the starting size (the devices' needs differ by a workspace and
        little else)."""
        own = {b: float(p.min_capacity_upper) for b, (p, _) in self.seen.items()}
        if hi is not None and lo in own and hi in own:
            a, c = (lo, own[lo]), (hi, own[hi])
        else:
            pair = self._nearest_pair(own)
            if pair is None:
                return None
            a, c = pair
        if c[0] == a[0]:
            return None
        slope = (c[1] - a[1]) / (c[0] - a[0])
        if not slope > 0:
            return None
        x = a[0] + (self.target - a[1]) / slope
        return int(x) if math.isfinite(x) and x < 2 * self.limit else self.limit

    def _nearest_pair(
        self, own: Mapping[int, float]
    ) -> tuple[tuple[int, float], tuple[int, float]] | None:
        """The two (batch size, need) points nearest the device's memory among this
        device's needs and the other devices' shifted to it: one on each side where
        there are, else the two nearest on the one side; None with fewer than two."""
        start = self.start
        base = {d: n for d, b, n in self.needs if b == start}
        shifted: dict[int, float] = {}
        if start in own:
            shifted = {
                b: n - base[d] + own[start]
                for d, b, n in self.needs
                if d != self.dev.name and d in base
            }
        shifted.update(own)
        pts = sorted(shifted.items())
        below = [pt for pt in pts if pt[1] <= self.target]
        above = [pt for pt in pts if pt[1] > self.target]
        if below and above:
            return below[-1], above[0]
        if len(above) >= 2:
            return above[0], above[1]
        if len(below) >= 2:
            return below[-2], below[-1]
        return None

    def climb(self) -> tuple[int, int | None]:
        """From the starting size up, to where the need line meets the memory (else
        twice the size) but at least a step that doubles while admitted, until a size is
        rejected or the search limit is admitted: (the largest size admitted, 0 for none;
        the smallest rejected, None for none)."""
        lo, hi = 0, None
        if self.admit(self.start):
            lo = self.start
        else:
            hi = self.start
        step = 1
        while hi is None:  # above every size admitted so far
            if lo >= self.limit:
                return lo, None
            guess = self.aim(lo, None)
            nxt = min(max(guess if guess is not None else 2 * lo, lo + step), self.limit)
            if self.admit(nxt):
                lo, step = nxt, step * 2
            else:
                hi = nxt
        return lo, hi

    def descend(self, hi: int) -> tuple[int, int]:
        """From a rejected size down, to where the need line meets the memory (else
        half the size) but at least a step that doubles while rejected, until a size is
        admitted: (that size, 0 where even a batch of 1 is rejected; the smallest size
        rejected)."""
        step = 1
        while True:  # below every size rejected so far
            if hi == 1:
                return 0, hi
            guess = self.aim(hi, None)
            nxt = max(min(guess if guess is not None else hi // 2, hi - step), 1)
            if self.admit(nxt):
                return nxt, hi
            hi, step = nxt, step * 2

    def narrow(self, lo: int, hi: int) -> BatchSizeResult:
        """Between an admitted size and a rejected one, interpolate (or bisect where the
        last interpolation gained less than a bisection) until they are adjacent; the
        result is limited by the first reason the rejected one was refused."""
        halve = False
        while hi - lo > 1:
            guess = None if halve else self.aim(lo, hi)
            nxt = guess if guess is not None and lo < guess < hi else (lo + hi) // 2
            width = hi - lo
            if self.admit(nxt):
                lo = nxt
            else:
                hi = nxt
            halve = (hi - lo) * 2 > width  # interpolation gained less than a bisection
        reasons = self.seen[hi][1].reasons
        return self.result(lo, hi, reasons[0].kind if reasons else "rejected")

    def result(self, best: int, over: int | None, why: str) -> BatchSizeResult:
        """The search's answer: ``best`` admitted (its prediction, or batch 1's where
        nothing fits), ``over`` the size above it rejected, ``why`` what limits it."""
        pred, decision = self.seen[max(best, 1)]
        return BatchSizeResult(
            batch_size=best,
            prediction=pred,
            decision=decision,
            rejected=self.seen[over][1] if over is not None else None,
            limited_by=why,
            device=self.dev.name,
            limit=self.limit,
            tried=tuple(self.seen),
        )


def _nothing_fits(options: Sequence[DeviceOption]) -> str:
    """The message for a spec that fits on none of the devices, not even at batch 1."""
    big = max(options, key=lambda o: o.memory_usable)
    search = big.batch_search
    need = search.prediction if search is not None else big.prediction
    why = ""
    budget_binds = False
    if search is not None and search.decision.reasons:
        why = f": {search.decision.reasons[0].message}"
        mem = search.decision.checked.get("memory") or {}
        budget_binds = mem.get("limit_from") == "budget"
    fix = (
        "Raise the budget's max_memory (--max-memory), or shrink the model or its "
        "activations (bf16, gradient checkpointing): a GPU with more memory would not help"
        if budget_binds  # the budget, not the GPU, is the smaller limit
        else "Shrink the model or its activations (bf16, gradient checkpointing), or compare "
        "devices with more memory"
    )
    at1 = (
        f" it needs {fmt_bytes(need.min_capacity_upper)} (upper bound) at batch size 1"
        if need is not None
        else ""
    )
    names = ", ".join(o.device for o in options) if len(options) <= 6 else f"{len(options)} devices"
    return (
        f"the step fits on none of the devices compared ({names}), not even at batch "
        f"size 1;{at1}, and the largest, the {big.device}, allows "
        f"{fmt_bytes(big.memory_usable)}{why}. {fix}."
    )


# --------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------
def _table(c: Comparison, options: Sequence[DeviceOption]) -> str:
    s = c.spec
    steps = s.get("steps_per_epoch")
    title = (
        f"{s.get('name')}: batch {s.get('batch_size')}, {s.get('optimizer')}, "
        f"{s.get('precision')}" + (f", {steps:,} steps per epoch" if steps else ", no dataset_size")
    )
    world = int(s.get("world_size", 1) or 1)
    if world > 1:  # one rank's figures; the cost pays for every GPU
        title += f", per rank of {world} GPUs (costs for all {world})"
    priced = any(o.price_per_hour is not None for o in options)
    head = ["device", "fits", "max batch", "memory need / usable", "iteration (upper)"]
    head += ["epoch (upper)"] if steps else []
    head += [f"{c.currency}/hour", f"{c.currency}/epoch (upper)"] if priced and steps else []
    # without an epoch the devices are ordered by the cost of a step: shown per 1,000
    head += [f"{c.currency}/hour", f"{c.currency}/1k steps"] if priced and not steps else []
    footnotes: dict[str, int] = {}
    # bf16 on GPUs without bf16 arithmetic: one footnote for all of them
    no_bf16 = [o.device for o in options if any(_is_no_bf16(n, o.device) for n in o.notes)]
    rows = []
    for o in options:
        marks = ""
        if not o.measured:
            marks += "*"
        for n in o.notes:
            if _is_unseen(n, o.device):
                continue  # the * says it
            if _is_no_bf16(n, o.device) and len(no_bf16) > 1:
                n = no_bf16_note(no_bf16)
            num = footnotes.setdefault(n, len(footnotes) + 1)
            marks += f"[{num}]"
        runs = o.max_batch > 0  # at some batch size; else no cost is shown
        row = [
            o.device + (" " + marks if marks else ""),
            "yes" if o.fits else "no",
            (f"{o.max_batch:,}" if runs else "none")
            + ("+" if o.max_batch_limited_by == "search limit" else ""),
            f"{fmt_bytes(o.memory_need)} / {fmt_bytes(o.memory_usable)}",
            f"{fmt_seconds(o.iteration_time)} ({fmt_seconds(o.iteration_time_upper)})",
        ]
        if steps:
            row.append(f"{fmt_seconds(o.epoch_time)} ({fmt_seconds(o.epoch_time_upper)})")
        if priced:
            listed = "~" if o.price_source not in (None, "given") else ""
            row.append(
                listed + fmt_money(o.price_per_hour, c.currency)
                if o.price_per_hour is not None
                else "-"
            )
        if priced and steps:
            row.append(
                f"{fmt_money(o.cost_per_epoch, c.currency)} ({fmt_money(o.cost_per_epoch_upper, c.currency)})"
                if o.cost_per_epoch is not None and runs
                else "-"
            )
        elif priced:
            per_step = o.cost_per_step
            row.append(
                fmt_money(1000 * per_step, c.currency) if per_step is not None and runs else "-"
            )
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    right = set(range(2, len(head)))

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [title, line(head), line(["-" * w for w in widths]), *(line(r) for r in rows)]
    out.append(
        f"sorted by {c.sort}; {len(options)} device{'' if len(options) == 1 else 's'} in "
        f"{c.elapsed_s:.1f} s; memory need is the upper bound of what the step needs plus "
        "the CUDA context"
    )
    if any(o.max_batch == 0 for o in options):
        out.append("none: not even a batch of 1 fits, so the step has no cost there")
    if any(o.max_batch_limited_by == "search limit" for o in options):
        out.append("+: every batch size up to the search limit fits")
    if any(not o.measured for o in options):
        kinds = {device_kind(o.device) for o in options}
        shown = [d for d in c.measured_on if device_kind(d) in kinds]
        where = ", ".join(shown) or "none (an analytic estimate)"
        out.append(
            f"*: no measurements of this device in the model (measured on: {where}); its "
            "time is predicted from the others' and its upper bound is wider"
        )
    out += [f"[{i}] {n}" for n, i in footnotes.items()]
    unfit = [o for o in options if not o.fits and o.reasons]
    for o in unfit[:3]:
        out.append(f"{o.device} does not fit at batch {s.get('batch_size')}: {o.reasons[0]}")
    if len(unfit) > 3:
        out.append(f"and {len(unfit) - 3} more devices where it does not fit")
    # a note every device shares, less what the * says already
    out += [
        f"note: {n}"
        for n in c.notes
        if not any(_is_unseen(n, o.device) and not o.measured for o in options)
    ]
    if any(o.price_source not in (None, "given") for o in options):
        out.append(
            f"~: a public list price read {PRICES_READ} (costaware.core.compare.DEFAULT_PRICES, "
            "docs/compare.md), not a quote: prices differ severalfold between providers; "
            "pass your own (price_per_hour, --price)"
        )
    if not priced:
        out.append("no prices: pass price_per_hour (--price) to see what an epoch costs")
    return "\n".join(out)


def _is_unseen(note: str, device: str) -> bool:
    """Whether ``note`` is the prediction's note that the model has no rows of ``device``
    (what the table's ``*`` says)."""
    return note.startswith(f"{device} is not among")


def _is_no_bf16(note: str, device: str) -> bool:
    """Whether ``note`` is :func:`~costaware.devices.precision_notes`' note on bf16 on
    ``device``, a GPU without bf16 arithmetic."""
    return note.startswith(f"bf16 on the {device}: it has no bf16 arithmetic")
