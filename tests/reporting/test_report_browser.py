"""The quickstart study's HTML report, rendered in headless Chromium as a person would see it.

Runs ``examples/optuna_quickstart.py`` (a real Optuna study with CostAwarePruner and the
Lightning CostAwareCallback, on the CPU) for a few trials, writes its report with the
``costaware report`` command, and opens the page in Debian's Chromium (``bash
.ci/chromium.sh`` installs it; without ``/usr/bin/chromium`` the tests skip): every figure
must be drawn, the console must stay clean, and a screenshot is kept for people to look at
(``screenshot-quickstart.png`` under the test's temporary directory, copied to
``$TMPDIR/costaware-report-screenshot.png``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
#: a console message in Chromium's log: [pid:tid:date:INFO:CONSOLE:line] "message", source: url (line)
CONSOLE = re.compile(r":CONSOLE(?::\d+)?\]\s*(.*)$")

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.is_file(), reason="no /usr/bin/chromium (bash .ci/chromium.sh installs it)"
)


def _chromium(page: Path, *args: str, timeout: float = 120.0) -> tuple[str, str]:
    """Run headless Chromium on ``page``; returns (stdout, stderr). Retries once on a hang."""
    for attempt in range(2):
        with tempfile.TemporaryDirectory(prefix="costaware-chromium-") as profile:
            cmd = [
                str(CHROMIUM),
                *FLAGS,
                f"--user-data-dir={profile}",
                "--enable-logging=stderr",
                "--v=0",
                "--virtual-time-budget=5000",
                *args,
                page.resolve().as_uri(),
            ]
            try:
                done = subprocess.run(
                    cmd, capture_output=True, text=True, timeout=timeout, check=False
                )
            except subprocess.TimeoutExpired:
                if attempt == 0:
                    continue
                raise
            return done.stdout, done.stderr
    raise AssertionError("unreachable")


def console_messages(log: str) -> list[str]:
    """The page's console messages (errors, warnings, logs) from Chromium's stderr."""
    return [m.group(1) for line in log.splitlines() if (m := CONSOLE.search(line))]


def _figure_ids(page: str) -> list[str]:
    return re.findall(r'<div id="(fig-[a-z]+)" class="plotly-graph-div', page)


def _drawn(dom: str, fig_id: str) -> bool:
    """Whether plotly drew the figure: its div became a plot with an SVG holding marks."""
    start = dom.find(f'id="{fig_id}"')
    if start < 0:
        return False
    nxt = dom.find('id="fig-', start + 1)  # the next figure
    block = dom[start : nxt if nxt > 0 else len(dom)]
    head = block[: block.find(">")]
    marks = ('class="point"', 'class="js-line"', 'class="bars"')
    return (
        "js-plotly-plot" in head and 'class="main-svg"' in block and any(m in block for m in marks)
    )


@needs_chromium
def test_console_errors_are_caught(tmp_path: Path) -> None:
    """The console check itself: a page that throws is caught."""
    page = tmp_path / "broken.html"
    page.write_text("<!doctype html><p>x</p><script>undefinedFunction();</script>")
    _, log = _chromium(page, "--dump-dom")
    assert any("Uncaught ReferenceError" in m for m in console_messages(log)), log[-2000:]


@needs_chromium
def test_quickstart_report_renders_in_chromium(tmp_path: Path) -> None:
    work = tmp_path / "quickstart"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "optuna_quickstart.py"), "--trials", "6",
         "--workdir", str(work)],
        capture_output=True, text=True, timeout=240, cwd=ROOT, env=env, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]

    reports = tmp_path / "reports"
    reports.mkdir()
    html = reports / "quickstart.html"
    cli = subprocess.run(
        [sys.executable, "-m", "costaware.cli", "report",
         "--storage", f"sqlite:///{work / 'hpo.db'}", "--study", "digits",
         "--store", f"sqlite:///{work / 'costaware.db'}",
         "--html", str(html), "--markdown", str(reports / "quickstart.md")],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert "costaware report: digits" in cli.stdout and "Traceback" not in cli.stderr
    source = html.read_text(encoding="utf-8")
    figures = _figure_ids(source)
    assert {"fig-budget", "fig-outcomes"} <= set(figures), figures

    dom, log = _chromium(html, "--dump-dom")
    messages = console_messages(log)
    assert not messages, f"console messages on the report page: {messages}"
    assert "costaware report: digits" in dom
    undrawn = [f for f in figures if not _drawn(dom, f)]
    assert not undrawn, f"figures plotly did not draw: {undrawn}"

    shot = reports / "screenshot-quickstart.png"
    _, log = _chromium(html, f"--screenshot={shot}", "--window-size=1400,3000")
    assert not console_messages(log)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000
    shutil.copyfile(shot, Path(tempfile.gettempdir()) / "costaware-report-screenshot.png")
    shutil.copyfile(html, Path(tempfile.gettempdir()) / "costaware-report-quickstart.html")
    try:
        from PIL import Image
    except ImportError:  # pillow is not a dependency: the size check above must do
        return
    with Image.open(shot) as im:
        assert im.size == (1400, 3000)
        colors = im.convert("RGB").resize((140, 300)).getcolors(maxcolors=1 << 16)
    assert colors is not None and len(colors) > 50  # not a blank page
