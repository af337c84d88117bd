"""What makes a measured row an observation of one configuration, shared by the places
that read measurements: the collector's rows (:func:`costaware.measure.collect.observations`),
the observation store (:meth:`costaware.runtime.store.ObservationStore.observations`), the
Lightning callback and the report."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

__all__ = ["MAX_HELD_BEFORE", "Observation"]

MAX_HELD_BEFORE: Final = 256 << 20
"""Bytes a GPU process may hold reserved beyond a trial's own tensors when its training
starts (``actual["held_before"]``, recorded by the Lightning callback; a collected row's
``reserved_before``) for the trial's reserved peak to still count as its own: above this,
the peak is partly memory that an earlier trial or a pinned workspace left behind, and the
row is left out of the memory rows. Configurations measured one after another in one
process reuse a cuBLAS workspace kept from an earlier one, but a workspace left inside a
large segment pins the whole segment, and ``empty_cache`` cannot return it, so every small
model measured after it "peaks" at the segment's size."""


@dataclass
class Observation:
    """One measured training configuration: the features it had and what it cost.

    ``peak_memory`` is the measured ``max_memory_reserved`` (bytes) and ``iteration_time``
    the measured median step time (seconds); either may be None (an OOM has no peak).
    ``family`` names the architecture family, used to hold families out for calibration.
    """

    features: dict[str, float]
    device: str
    peak_memory: float | None = None
    iteration_time: float | None = None
    status: str = "ok"
    family: str | None = None
    peak_allocated: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Observation:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})
