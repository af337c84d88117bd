"""Exception types raised by costaware.

Every error a user can trigger derives from :class:`CostawareError`. They fall in two
families, which the integrations treat differently:

- the user's bug, :class:`UserCodeError` (and its :class:`SpecError`): the user's code or
  spec is wrong, and a real training step would fail the same way (a factory that needs
  arguments, a shape mismatch, an exception in the factory, ``spec_fn``, forward or
  loss). The integrations raise it, so the first trial fails with it (fail fast).
- costaware's own failure, :class:`TraceError` (:class:`UntraceableModelError`,
  :class:`TraceTimeout`) and the rest: the prediction could not be made, although the
  training would run. The integrations admit the trial with a :class:`CostAwareWarning`
  and record why (fail open), or reject it with ``fail_open=False``.

Errors about bad arguments also derive from ``ValueError`` (or ``TypeError``), so ordinary
Python code that expects those keeps working.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import types
import warnings
from typing import Any

__all__ = [
    "CostAwareWarning",
    "CostawareError",
    "FitCancelled",
    "NotEnoughObservations",
    "NotFittedError",
    "SpecError",
    "TraceError",
    "TraceTimeout",
    "TrialRejected",
    "UntraceableModelError",
    "UserCodeError",
    "first_line",
    "is_user_error",
    "user_code_error",
]


class CostawareError(Exception):
    """Base class of every error costaware raises on purpose."""


class UserCodeError(CostawareError):
    """The user's own code failed in a way a real training step would too: the model
    factory, ``spec_fn``, the model's forward or the loss raised, or the model does not
    take the batch's shape. The message says where and what to change; the user's own
    exception, with its traceback, is the ``__cause__``.

    The integrations raise it rather than fail open: the first trial fails with it, and
    the study stops unless its objective catches it.
    """


class SpecError(UserCodeError, ValueError):
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


class FitCancelled(CostawareError):
    """A fit stopped before its end because the event it was given
    (:func:`costaware.core.model.stop_fits_when`) was set: the process is exiting."""


class CostAwareWarning(UserWarning):
    """Something costaware could not do (predict, write the store); the study goes on.

    The integrations fail open: they warn with this category, record why, and admit the
    trial (or keep training). Filter it like any warning category.
    """


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the user's bug (fail fast) rather than costaware's own failure
    (fail open): a :class:`UserCodeError`, :class:`SpecError` included."""
    return isinstance(exc, UserCodeError)


#: the packages whose frames a warning about the user's study is not attributed to
_FRAMEWORKS = ("costaware", "optuna", "ray", "lightning", "pytorch_lightning", "torch")


@functools.cache
def _framework_dirs() -> tuple[str, ...]:
    import importlib.util

    dirs = []
    for name in _FRAMEWORKS:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            dirs.append(os.path.join(os.path.realpath(location), ""))
    return tuple(dirs)


def warn_at_users_line(message: str, category: type[Warning] = CostAwareWarning) -> None:
    """``warnings.warn(message, category)``, attributed to the innermost frame outside
    costaware and the frameworks it plugs into (Optuna, Ray, Lightning, torch): the user's
    objective or script line, not Optuna's ``_trial.py``."""
    dirs = _framework_dirs()
    frame: types.FrameType | None = sys._getframe(1)
    level = 2  # warn's caller's frame
    while frame is not None and os.path.realpath(frame.f_code.co_filename).startswith(dirs):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


def first_line(exc: BaseException, limit: int = 800) -> str:
    """``"TypeName: first line of the message"``, at most ``limit`` characters: for reasons
    recorded next to a trial, where a whole traceback would not help. A longer one is cut
    at its last sentence that fits, or else at a word, and ends with "…"."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return shorten(f"{type(exc).__name__}: {line}" if line else type(exc).__name__, limit)


def shorten(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters; else cut to fit, ending with "…":
    after its last sentence that fits (where that keeps at least half of the limit), else
    at its last word that fits, else mid-word."""
    if len(text) <= limit:
        return text
    if limit < 3:
        return text[:limit]
    head = text[: limit - 2]  # room for " …"
    ends = [m.end() for m in re.finditer(r"[.!?;](?=\s|$)", head)]
    if ends and ends[-1] >= limit // 2:
        return head[: ends[-1]] + " …"
    space = head.rfind(" ")
    cut = head[:space] if space >= limit // 2 else text[: limit - 1]
    return cut.rstrip(" ,;:(") + "…"


def user_code_error(
    message: str, cause: BaseException, kind: type[UserCodeError] = UserCodeError
) -> UserCodeError:
    """``kind(message)`` with the user's own exception ``cause`` as its ``__cause__``, and
    an instance of ``cause``'s type as well wherever that type can be a base: an objective
    that catches the user's error (``except ValueError``, Optuna's ``catch=(ValueError,)``,
    a hyperparameter that makes some trials fail) catches it as it would the error itself.
    Its name, message and ``__cause__`` are ``kind``'s as ever."""
    cls = _of_users_type(kind, type(cause))
    try:
        error = cls(message)
    except Exception:  # a type whose constructor needs more than a message
        error = kind(message)
    error.__cause__ = cause
    return error


#: the classes :func:`_of_users_type` made, by (kind, the user's type): one class per pair
_OF_USERS_TYPE: dict[tuple[type[Any], type[Any]], type[Any]] = {}


def _of_users_type(kind: type[UserCodeError], user: type[BaseException]) -> type[UserCodeError]:
    """``kind`` subclassed with ``user`` as a second base, named as ``kind``; ``kind``
    itself where ``user`` is not an ordinary ``Exception`` or cannot be a base."""
    made = _OF_USERS_TYPE.get((kind, user))
    if made is None:
        made = _OF_USERS_TYPE.setdefault((kind, user), _subclass(kind, user))
    return made


def _subclass(kind: type[UserCodeError], user: type[BaseException]) -> type[UserCodeError]:
    if (
        not issubclass(user, Exception)
        or issubclass(kind, user)
        or issubclass(user, CostawareError)
    ):
        return kind

    def __init__(self: Exception, *args: Any) -> None:  # the user's type may need more arguments
        Exception.__init__(self, *args)

    def __str__(self: Exception) -> str:  # not KeyError's repr of the message
        return Exception.__str__(self)

    def __reduce__(self: Exception) -> Any:  # picklable: Ray ships errors
        return _rebuilt, (kind, user, self.args)

    namespace = {
        "__module__": kind.__module__,
        "__qualname__": kind.__qualname__,
        "__doc__": kind.__doc__,
        "__init__": __init__,
        "__str__": __str__,
        "__reduce__": __reduce__,
    }
    try:
        return type(kind.__name__, (kind, user), namespace)
    except TypeError:  # a layout or metaclass that cannot be combined
        return kind


def _rebuilt(kind: type[UserCodeError], user: type[BaseException], args: tuple[Any, ...]) -> Any:
    return _of_users_type(kind, user)(*args)
