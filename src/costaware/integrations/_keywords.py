"""One shape for the adapters' constructors: the wrapped object (a pruner, a searcher, a
scheduler) first, every option keyword-only, under the same names in every adapter
(``spec_fn``, ``budget``, ``device``, ``model``, ``store``, ``study``, ``refit_every``,
``fail_open``).

:func:`keyword_options` keeps the positional calls of the earlier signatures working: it
maps the options given by position to their names, in the order the earlier signature
took them, and warns with a :class:`FutureWarning` that names the keywords to write.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["keyword_options"]

F = TypeVar("F", bound=Callable[..., None])


def keyword_options(
    old_order: Sequence[str],
    *,
    positional: int = 0,
    is_old_first: Callable[[Any], bool] | None = None,
) -> Callable[[F], F]:
    """Wrap an ``__init__`` whose first ``positional`` parameters may be given by
    position and the rest only by keyword, so that a call in the earlier shape (``old_order``:
    the parameter names the earlier signature took by position, in order) still works,
    with a ``FutureWarning``.

    ``is_old_first``, where the first positional parameter changed meaning: true for a
    first argument that is the earlier signature's first option (a ``spec_fn`` where the
    wrapped pruner now goes), which then maps by ``old_order`` from the start.
    """

    def wrap(init: F) -> F:
        signature = inspect.signature(init)
        params = list(signature.parameters)[1 : 1 + positional]
        takes = [n for n in list(signature.parameters)[1:] if not n.startswith("_")]
        any_keyword = any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
        )

        @functools.wraps(init)
        def init_with_old_positions(self: Any, *args: Any, **kwargs: Any) -> None:
            keep = positional
            names = list(old_order[positional:])
            if is_old_first is not None and args and is_old_first(args[0]):
                keep, names = 0, list(old_order)
            for name in params[: min(keep, len(args))]:
                if name in kwargs:
                    raise TypeError(
                        f"{type(self).__name__}() got {name} twice: give it once, first or "
                        f"as {name}=."
                    )
            extra = args[keep:]
            if extra:
                cls = type(self).__name__
                if len(extra) > len(names):
                    raise TypeError(
                        f"{cls}() takes at most {keep + len(names)} positional arguments "
                        f"({len(args)} given); pass the options as keywords."
                    )
                given = names[: len(extra)]
                for name in given:
                    if name in kwargs:
                        raise TypeError(f"{cls}() got multiple values for argument {name!r}.")
                lead = params[:keep]
                fix = ", ".join([*lead, *(f"{n}=..." for n in given)])
                warnings.warn(
                    f"{cls}() takes {', '.join(given)} as keyword arguments; giving them by "
                    f"position is deprecated and will stop working: write {cls}({fix}).",
                    FutureWarning,
                    stacklevel=2,
                )
                kwargs.update(zip(given, extra))
                args = args[:keep]
            if not any_keyword:
                _known_keywords(type(self).__name__, kwargs, takes)
            init(self, *args, **kwargs)

        return init_with_old_positions  # type: ignore[return-value]

    return wrap


def _known_keywords(cls: str, kwargs: dict[str, Any], takes: Sequence[str]) -> None:
    """Refuse a keyword ``takes`` lacks in the public class's name (not the private base
    class whose ``__init__`` it is), with the closest keyword it takes."""
    import difflib

    for name in kwargs:
        if name not in takes:
            close = difflib.get_close_matches(name, takes, n=1)
            hint = f"did you mean {close[0]}=?" if close else f"it takes {', '.join(takes)}."
            raise TypeError(f"{cls}() got an unexpected keyword argument {name!r}: {hint}")
