"""Exception types raised by costaware.

Every error a user can trigger derives from :class:`CostawareError`, so an integration can
catch one type and fail open. Errors about bad arguments also derive from ``ValueError``
(or ``TypeError``), so ordinary Python code that expects those keeps working.
"""

from __future__ import annotations

__all__ = [
    "CostAwareWarning",
    "CostawareError",
    "NotEnoughObservations",
    "NotFittedError",
    "SpecError",
    "TraceError",
    "TraceTimeout",
    "TrialRejected",
    "UntraceableModelError",
    "first_line",
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


class TrialRejected(CostawareError):
    """A trial was rejected before it ran: its predicted cost breaks the budget.

    Raised by the Lightning callback (``on_reject="raise"``) when no Optuna trial is
    attached (one that is ends as ``optuna.TrialPruned``). ``reasons`` holds each reason's
    message; the exception's message joins them.
    """

    def __init__(self, reasons: list[str] | tuple[str, ...]) -> None:
        self.reasons = tuple(reasons)
        super().__init__("; ".join(self.reasons) or "rejected by costaware")


class NotFittedError(CostawareError, RuntimeError):
    """A learned component was used before ``fit`` was called."""


class NotEnoughObservations(CostawareError, ValueError):
    """``fit`` was given too few observations with a measured peak or time to learn from
    (an OOM or a crash counts as an observation, but carries no measurement)."""


class CostAwareWarning(UserWarning):
    """Something costaware could not do (predict, write the store); the study goes on.

    The integrations fail open: they warn with this category, record why, and admit the
    trial (or keep training). Filter it like any warning category.
    """


def first_line(exc: BaseException, limit: int = 500) -> str:
    """``"TypeName: first line of the message"``, at most ``limit`` characters: for reasons
    recorded next to a trial, where a whole traceback would not help."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return (f"{type(exc).__name__}: {line}" if line else type(exc).__name__)[:limit]
