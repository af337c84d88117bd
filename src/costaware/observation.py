"""What makes a measured row an observation of one configuration, shared by the places
that read measurements: the collector's rows (:func:`costaware.measure.collect.observations`),
the observation store (:meth:`costaware.runtime.store.ObservationStore.observations`), the
Lightning callback and the report."""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_HELD_BEFORE"]

MAX_HELD_BEFORE: Final = 256 << 20
"""Bytes a GPU process may hold reserved beyond a trial's own tensors when its training
starts (``actual["held_before"]``, recorded by the Lightning callback; a collected row's
``reserved_before``) for the trial's reserved peak to still count as its own: above this,
the peak is partly memory that an earlier trial or a pinned workspace left behind, and the
row is left out of the memory rows. Configurations measured one after another in one
process reuse a cuBLAS workspace kept from an earlier one, but a workspace left inside a
large segment pins the whole segment, and ``empty_cache`` cannot return it, so every small
model measured after it "peaks" at the segment's size."""
