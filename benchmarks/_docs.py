"""Generated sections of the docs: a benchmark writes its section between two markers."""

from __future__ import annotations

from pathlib import Path


def splice(doc: Path, text: str, start: str, end: str) -> None:
    """Put ``text`` (which begins with ``start`` and ends with ``end``) in place of the
    section between those markers of ``doc``, or append it where ``doc`` has none."""
    old = doc.read_text() if doc.is_file() else ""
    if start in old and end in old:
        head, rest = old.split(start, 1)
        new = head + text + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    doc.write_text(new)
