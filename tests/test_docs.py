"""The documentation: the site builds with warnings as errors, and every quickstart runs.

Each quickstart page is one program split into ``python`` blocks; the test joins a page's
blocks in order and runs them as one script in a fresh process, in a temporary directory,
on the CPU, exactly as a reader who pastes them would.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)

# page -> (modules it needs, lines its output must contain, files it must write)
QUICKSTARTS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "optuna": (
        ("optuna",),
        ("PRUNED", "rejected: predicted memory need", "COMPLETE"),
        ("costaware.db", "report.html"),
    ),
    "ray": (
        ("ray", "optuna"),
        ("rejected before launch: width 4096", "ran: width"),
        ("costaware.db",),
    ),
    "lightning": (
        ("lightning",),
        (
            "admit: memory ok",
            "epoch 1: ok",
            "rejected: predicted epoch time",
            "stopped: measured epoch",
        ),
        ("costaware.db",),
    ),
}


def fenced_blocks(page: Path) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block of a Markdown page, in order."""
    return [(lang, code) for lang, code in FENCE.findall(page.read_text(encoding="utf-8"))]


def quickstart_script(name: str) -> str:
    """A quickstart page's ``python`` blocks, joined in order: the program it describes."""
    blocks = fenced_blocks(DOCS / "quickstart" / f"{name}.md")
    langs = {lang for lang, _ in blocks}
    assert langs <= {"python", "bash"}, f"quickstart/{name}.md: unexpected fences {langs}"
    return "\n\n".join(code for lang, code in blocks if lang == "python")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RAY_AUTH_MODE="disabled",  # a local test cluster needs no token
        OMP_NUM_THREADS="1",  # small models: threads only contend on a shared CPU
        CUDA_VISIBLE_DEVICES="",  # the quickstarts are for the CPU
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.mark.parametrize("name", sorted(QUICKSTARTS))
def test_quickstart_blocks_compile(name: str) -> None:
    script = quickstart_script(name)
    assert script.count("\n") > 20, f"quickstart/{name}.md has almost no code"
    compile(script, f"quickstart/{name}.md", "exec")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(QUICKSTARTS))
def test_quickstart_runs(name: str, tmp_path: Path) -> None:
    modules, expected, files = QUICKSTARTS[name]
    for module in modules:
        pytest.importorskip(module)
    script = tmp_path / f"quickstart_{name}.py"
    script.write_text(quickstart_script(name), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, script.name],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"quickstart/{name}.md failed:\n{output[-4000:]}"
    for text in expected:
        assert text in proc.stdout, (
            f"quickstart/{name}.md: {text!r} not in its output:\n{output[-4000:]}"
        )
    for file in files:
        assert (tmp_path / file).is_file(), f"quickstart/{name}.md did not write {file}"


def test_nav_lists_every_page() -> None:
    """Every page is in the nav and every nav entry exists (the build checks it too)."""
    nav = re.findall(r":\s*([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert sorted(set(nav)) == sorted(pages)


def test_griffe_extension_rewrites_rst() -> None:
    spec = importlib.util.spec_from_file_location("griffe_rst", DOCS / "_ext" / "griffe_rst.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    pytest.importorskip("griffe")
    spec.loader.exec_module(module)
    text = (
        "Uses :class:`~costaware.Budget` and :func:`costaware.dry_run`.\n\n"
        "Example:\n    >>> 1 + 1\n    2\n\n"
        "Args:\n    a, b: the two sides, which\n        may be long.\n    c: alone.\n"
    )
    out = module.rewrite(text)
    assert "Uses `Budget` and `costaware.dry_run`." in out
    assert "Examples:\n    >>> 1 + 1" in out
    assert (
        "    a: the two sides, which may be long.\n    b: the two sides, which may be long." in out
    )
    assert "    c: alone." in out


@pytest.mark.slow
def test_site_builds_without_warnings(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    site = tmp_path / "site"
    env = _env()
    env["NO_MKDOCS_2_WARNING"] = "1"  # mkdocs-material's banner about its successor
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-6000:]
    # the API reference is rendered from the docstrings, integrations included
    for page, name in (
        ("api/spec/index.html", "TrainingSpec"),
        ("api/model/index.html", "CostModel"),
        ("api/optuna/index.html", "CostAwarePruner"),
        ("api/lightning/index.html", "warmup_steps"),
        ("api/ray/index.html", "CostAwareScheduler"),
        ("api/report/index.html", "to_html"),
    ):
        html = (site / page).read_text(encoding="utf-8")
        assert name in html, f"{page} lacks {name}"
        assert ":class:`" not in html, f"{page} shows a raw Sphinx role"
