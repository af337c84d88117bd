"""A griffe extension: render costaware's reST-flavoured Google docstrings as Markdown.

costaware's docstrings are Google style written for Sphinx habits. Before mkdocstrings
parses them, this extension rewrites three things, for every object it loads (static
analysis or inspection alike):

- Sphinx roles (``:class:`~costaware.Budget```, ``:func:`dry_run```, ...) become code
  spans; a leading ``~`` keeps only the last dotted part, as in Sphinx.
- An ``Example:`` section title becomes ``Examples:``, the title griffe's Google parser
  knows, so the ``>>>`` lines render as code instead of nested quotes.
- An argument line that documents several parameters at once (``a, b, c: text``) becomes
  one entry per parameter with the same text, so each matches the signature.

Loaded from mkdocs.yml (``extensions: [docs/_ext/griffe_rst.py]``); not part of the site.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj|const):`(~?)([^`]+)`")
_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters|Attributes):\s*$")
_MULTI = re.compile(r"^(\s+)([A-Za-z_]\w*(?:,\s*[A-Za-z_]\w*)+):\s+(.*)$")


def _role(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    target = target.strip()
    if target.endswith(">") and "<" in target:  # :class:`text <target>`
        target = target[: target.index("<")].strip()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def _split_names(text: str) -> str:
    lines = text.splitlines()
    out: list[str] = []
    section_indent: int | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        head = _SECTION.match(line)
        if head:
            section_indent = len(head.group(1))
            out.append(line)
            continue
        indent = len(line) - len(line.lstrip())
        if section_indent is not None and line.strip() and indent <= section_indent:
            section_indent = None
        multi = _MULTI.match(line) if section_indent is not None else None
        if not multi:
            out.append(line)
            continue
        lead, names, first = multi.groups()
        body = [first]  # the entry's continuation lines belong to every name
        while (
            i < len(lines)
            and lines[i].strip()
            and len(lines[i]) - len(lines[i].lstrip()) > len(lead)
        ):
            body.append(lines[i].strip())
            i += 1
        out += [f"{lead}{name.strip()}: {' '.join(body)}" for name in names.split(",")]
    return "\n".join(out)


def rewrite(text: str) -> str:
    """The Markdown-ready form of one docstring."""
    text = _ROLE.sub(_role, text)
    text = _EXAMPLE.sub(r"\1Examples:", text)
    return _split_names(text)


class RstToMarkdown(griffe.Extension):
    """Rewrites each object's docstring once it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
