"""Which code is the user's, and how the dry run's messages point to it.

A failed dry run is the user's bug when their code raised it (their model, their loss,
a library they call, a zoo model they chose) and costaware's own when costaware's code
did; the messages name the line of the user's code that failed and the factory they
wrote. Code is told apart by the folder its file is in.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sysconfig
import traceback
from typing import Any

import torch

from costaware.errors import first_line

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
#: the ``costaware`` package's folder (this module is ``costaware/core/trace/user_code.py``)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_OWN_DIR = os.path.join(_PACKAGE_DIR, "core") + os.sep
#: the zoo's models are code the user chose, not costaware's (found by path: the core
#: does not import the zoo)
_ZOO_DIR = os.path.join(_PACKAGE_DIR, "zoo") + os.sep


def _own_dirs() -> tuple[str, ...]:
    """costaware's source folders: the package, and its integrations where an install
    keeps them apart."""
    import importlib.util

    import costaware

    dirs = [_OWN_DIR, os.path.dirname(os.path.abspath(costaware.__file__)) + os.sep]
    with contextlib.suppress(ImportError, ValueError):
        found = importlib.util.find_spec("costaware.integrations")
        for path in (found.submodule_search_locations or []) if found else []:
            dirs.append(os.path.abspath(path) + os.sep)
    return tuple(dirs)


_OWN_DIRS = _own_dirs()
_STDLIB_DIR = sysconfig.get_paths()["stdlib"] + os.sep


_INSTALLED = re.compile(r"[/\\](?:site|dist)-packages[/\\]([^/\\.]+)")


def _installed_package(path: str) -> str | None:
    """The top-level package an installed source file belongs to (``transformers`` for
    ``.../site-packages/transformers/models/...``), or None for a file not installed."""
    found = _INSTALLED.search(path)
    return found.group(1) if found else None


def _is_theirs(path: str) -> bool:
    """Whether a source file is the user's code (their own, a library's, the zoo's model
    they chose), not torch's, costaware's or the standard library's."""
    if path.startswith(_ZOO_DIR):
        return True
    if path.startswith("<frozen "):  # the import machinery (``<frozen importlib...>``)
        return False
    if path.startswith((_TORCH_DIR, *_OWN_DIRS)):
        return False
    return _installed_package(path) is not None or not path.startswith(_STDLIB_DIR)


def _raised_by_costaware(exc: BaseException) -> bool:
    """Whether costaware's own code (not the zoo's models) raised ``exc``: its bug.

    costaware's torch modes that hand an op on (``return func(*args, **kwargs)``) are not
    where an op's error arises: the code that called the op is (a user's forward indexing
    a tensor with a string fails in torch, called through such a mode)."""
    frames = traceback.extract_tb(exc.__traceback__)
    while (
        frames
        and frames[-1].name in ("__torch_function__", "__torch_dispatch__")
        and "func(" in (frames[-1].line or "")
    ):
        frames.pop()
    path = frames[-1].filename if frames else ""
    return path.startswith(_OWN_DIRS) and not _is_theirs(path)


def _user_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The frames of ``exc``'s traceback in the user's code, outermost first."""
    return [f for f in traceback.extract_tb(exc.__traceback__) if _is_theirs(f.filename)]


def _failing_line(exc: BaseException) -> str:
    """Where ``exc`` arose in the user's code: ``path:line (`code`)``, and the outermost
    user frame it was reached from, when that is another."""
    frames = _user_frames(exc)
    if not frames:
        return "inside torch"
    last, first = frames[-1], frames[0]
    where = f"{last.filename}:{last.lineno}" + (f" (`{last.line.strip()}`)" if last.line else "")
    if first is not last:
        where += f", reached from {first.filename}:{first.lineno}"
    return where


def _where(exc: BaseException) -> str:
    """``"at path:line (`code`)"`` in the user's code, or ``"inside torch"``."""
    line = _failing_line(exc)
    return line if line == "inside torch" else "at " + line


def _said(exc: BaseException) -> str:
    """``first_line(exc)`` without its closing period, to go inside a sentence."""
    return first_line(exc).rstrip(". ")


def _factory_name(factory: Any) -> str:
    """How the user wrote the factory: ``MyNet``, ``make_model``, ``partial(make, ...)``."""
    if isinstance(factory, functools.partial):
        return f"functools.partial({_factory_name(factory.func)}, ...)"
    name = getattr(factory, "__qualname__", None) or getattr(factory, "__name__", None)
    return str(name) if name else type(factory).__name__
