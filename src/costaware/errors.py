"""Exception types raised by costaware.

Every error a user can trigger derives from :class:`CostawareError`, so an integration can
catch one type and fail open. Errors about bad arguments also derive from ``ValueError``
(or ``TypeError``), so ordinary Python code that expects those keeps working.
"""

from __future__ import annotations

__all__ = [
    "CostAwareWarning",
    "CostawareError",
    "NotFittedError",
    "SpecError",
    "TraceError",
    "TraceTimeout",
    "UntraceableModelError",
]


class CostawareError(Exception):
    """Base class of every error costaware raises on purpose."""


class SpecError(CostawareError, ValueError):
    """A :class:`~costaware.TrainingSpec` argument is invalid (says what was expected)."""


class TraceError(CostawareError, RuntimeError):
    """The dry run of one training step failed. Integrations catch this to fail open."""


class UntraceableModelError(TraceError):
    """The model cannot run on fake tensors (data-dependent ops, unsupported ops, ...)."""


class TraceTimeout(TraceError):
    """The dry run took longer than its time limit."""


class NotFittedError(CostawareError, RuntimeError):
    """A learned component was used before ``fit`` was called."""


class CostAwareWarning(UserWarning):
    """Something costaware could not do (predict, write the store); the study goes on.

    The integrations fail open: they warn with this category, record why, and admit the
    trial (or keep training). Filter it like any warning category.
    """
