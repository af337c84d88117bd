"""How costaware writes bytes and seconds for people: one place, one style."""

from __future__ import annotations

from typing import Any

__all__ = ["fmt_apart", "fmt_bytes", "fmt_money", "fmt_pct", "fmt_seconds", "fmt_value"]


def fmt_bytes(n: float | None) -> str:
    """``3.47 GiB``, ``160 MiB``, ``12.5 MiB``, ``512 B``; ``-`` for None."""
    if n is None:
        return "-"
    a = abs(n)
    if a >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if a >= 2**20:
        return f"{n / 2**20:.0f} MiB" if a >= 100 * 2**20 else f"{n / 2**20:.1f} MiB"
    if a >= 2**10:
        return f"{n / 2**10:.1f} KiB"
    return f"{n:.0f} B"


def fmt_seconds(s: float | None) -> str:
    """``850 µs``, ``15.8 ms``, ``2.4 s``, ``4.6 min``, ``1.25 h``; ``-`` for None."""
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


_UNITS = {
    "B": 1.0, "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30,
    "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0,
}  # fmt: skip


def fmt_apart(value: float, limit: float, *, seconds: bool) -> tuple[str, str]:
    """``value`` and ``limit`` written as :func:`fmt_seconds` (``seconds``) or
    :func:`fmt_bytes` does, with more decimals, in the limit's unit, when those would read the
    same: "3.04 s exceeds 3.00 s", not "3.0 s exceeds 3.0 s"."""
    fmt = fmt_seconds if seconds else fmt_bytes
    a, b = fmt(value), fmt(limit)
    if a != b or value == limit:
        return a, b
    unit = b.rsplit(" ", 1)[-1]
    scale = _UNITS[unit]
    for digits in range(1, 7):
        a, b = f"{value / scale:.{digits}f} {unit}", f"{limit / scale:.{digits}f} {unit}"
        if a != b:
            break
    return a, b


def fmt_pct(x: float | None, signed: bool = False) -> str:
    """``12%``, ``+12%``; ``-`` for None."""
    if x is None:
        return "-"
    return f"{x:+.0%}" if signed else f"{x:.0%}"


def fmt_money(x: float | None, currency: str) -> str:
    """``$1,234.50``; under a dime two significant digits, trailing zero kept (``$0.040``,
    not ``$0.04``; ``$0.0012``, not ``$0.00``); ``-`` for None."""
    if x is None:
        return "-"
    if x == 0:
        return f"{currency}0"
    return f"{currency}{x:,.2f}" if abs(x) >= 0.095 else f"{currency}{x:#.2g}"


def fmt_value(v: Any) -> str:
    """A parameter or objective value, short."""
    if isinstance(v, float):
        if v == 0 or 1e-3 <= abs(v) < 1e5:
            return f"{v:.4g}"
        return f"{v:.3g}"
    return str(v)
