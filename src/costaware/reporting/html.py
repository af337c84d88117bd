"""The HTML rendering of a :class:`~costaware.reporting.Report`: one self-contained page.

Every user-supplied string (trial ids, parameter names and values, model names, reasons,
titles) goes through :func:`html.escape` before it reaches the page; inside plotly's
figures the hover texts are escaped too (plotly reads a subset of HTML in them) and the
figure JSON itself is written with ``<``, ``>`` and ``/`` as ``\\u`` escapes, so a value
such as ``</script>`` cannot end a script element. plotly.js is inlined once, with the
first figure, so the file opens offline.
"""

from __future__ import annotations

import datetime as _dt
import html
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from costaware._format import fmt_bytes, fmt_money, fmt_pct, fmt_seconds, fmt_value
from costaware.reporting.rows import (
    OUTCOME_LABELS,
    OUTCOMES,
    ProgressFn,
    TrialRow,
    fmt_saved,
    lean_words,
    saved_adjusted,
)

if TYPE_CHECKING:
    from costaware.reporting import Report

__all__ = ["render_html"]

#: rows in the page's long tables; the Markdown and to_dict() hold them all
MAX_TABLE_ROWS = 500
#: points in one scatter; beyond it, the largest errors and a sample of the rest
MAX_POINTS = 20_000

COLORS = {
    "completed": "#2e7d32",
    "stopped": "#ef8f00",
    "oom": "#c62828",
    "failed": "#7b1fa2",
    "rejected": "#546e7a",
    "running": "#1565c0",
    "unmeasured": "#9e9e9e",
}
KIND_COLORS = {"analytic": "#1f77b4", "learned": "#d62728"}
_FONT = (
    'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Noto Sans", sans-serif'
)

CSS = """
:root { --fg:#1d2329; --muted:#5f6b76; --line:#e3e7eb; --bg:#f6f8fa; --card:#fff;
        --accent:#0b5cad; --warn-bg:#fff8e1; --warn-line:#f2c94c; }
* { box-sizing: border-box; }
body { margin:0; font-family:FONT; color:var(--fg); background:var(--bg);
       font-size:15px; line-height:1.5; }
main { max-width:1280px; margin:0 auto; padding:28px 32px 48px; }
header h1 { font-size:26px; margin:0 0 4px; font-weight:650; letter-spacing:-0.01em; }
header .meta { color:var(--muted); margin:0; font-size:13.5px; }
nav { margin:18px 0 6px; display:flex; flex-wrap:wrap; gap:6px 18px; font-size:14px; }
nav a { color:var(--accent); text-decoration:none; }
nav a:hover { text-decoration:underline; }
.cards { display:grid; grid-template-columns:repeat(auto-fill, minmax(250px, 1fr));
         gap:12px; margin:20px 0 8px; }
.card { background:var(--card); border:1px solid var(--line); border-radius:10px;
        padding:12px 14px 11px; }
.card .k { font-size:12.5px; color:var(--muted); text-transform:uppercase;
           letter-spacing:0.04em; }
.card .v { font-size:25px; font-weight:650; margin:2px 0 1px; white-space:nowrap; }
.card .s { font-size:12.5px; color:var(--muted); }
.card.bad .v { color:#c62828; } .card.good .v { color:#2e7d32; }
.notes { background:var(--warn-bg); border:1px solid var(--warn-line); border-radius:10px;
         padding:10px 16px; margin:14px 0; }
.notes h3 { margin:2px 0 4px; font-size:14px; }
.notes ul { margin:0; padding-left:20px; } .notes li { margin:3px 0; font-size:14px; }
section { background:var(--card); border:1px solid var(--line); border-radius:12px;
          padding:18px 22px 14px; margin:18px 0; }
section h2 { font-size:19px; margin:0 0 4px; font-weight:650; }
section p.lead { color:var(--muted); margin:0 0 12px; font-size:14px; }
.grid2 { display:grid; grid-template-columns:repeat(auto-fill, minmax(440px, 1fr)); gap:14px; }
.grid2 > div { min-width:0; }
.fig { min-height:160px; margin:6px 0 4px; }
.fig h4 { margin:8px 0 0 4px; font-size:15px; font-weight:600; }
.empty { color:var(--muted); font-style:italic; padding:14px 0; }
table { border-collapse:collapse; width:100%; font-size:13.5px; margin:8px 0 10px; }
th, td { text-align:left; padding:5px 9px; border-bottom:1px solid var(--line);
         vertical-align:top; }
th { font-weight:600; color:var(--muted); font-size:12.5px; text-transform:uppercase;
     letter-spacing:0.03em; background:#fafbfc; position:sticky; top:0; }
td.n, th.n { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
tbody tr:hover { background:#f3f6f9; }
td.params { font-family:ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
            font-size:12.5px; color:#37424d; max-width:380px; overflow-wrap:anywhere; }
td.reason { min-width:260px; max-width:520px; overflow-wrap:anywhere; }
td.params .name { font-family:inherit; font-weight:600; color:var(--fg); font-size:13px; }
.badge { display:inline-block; padding:1px 8px; border-radius:999px; font-size:12px;
         color:#fff; white-space:nowrap; font-weight:550; }
.kv { display:grid; grid-template-columns:max-content 1fr; gap:4px 18px; margin:6px 0 10px;
      font-size:14px; }
.kv dt { color:var(--muted); } .kv dd { margin:0; }
.big { font-size:15px; } .muted { color:var(--muted); }
details summary { cursor:pointer; color:var(--accent); margin:6px 0; }
.scroll { max-height:640px; overflow:auto; border:1px solid var(--line); border-radius:8px; }
.scroll table { margin:0; }
footer { color:var(--muted); font-size:13px; margin-top:26px; }
footer dt { font-weight:600; color:var(--fg); } footer dd { margin:0 0 8px 0; }
""".replace("FONT", _FONT)


def e(value: Any) -> str:
    """HTML-escape anything (quotes included)."""
    return html.escape("" if value is None else str(value), quote=True)


def _params(params: dict[str, Any], limit: int = 160) -> str:
    text = " ".join(f"{k}={fmt_value(v)}" for k, v in params.items())
    return text if len(text) <= limit else text[: limit - 1] + "…"


BADGES = {
    "completed": "completed",
    "stopped": "stopped",
    "oom": "OOM",
    "failed": "failed",
    "rejected": "rejected",
    "running": "running",
    "unmeasured": "no actuals",
}


def _badge(outcome: str) -> str:
    color = COLORS.get(outcome, "#777")
    label = BADGES.get(outcome, outcome)
    return f'<span class="badge" style="background:{color}">{e(label)}</span>'


def dur(seconds: float | None) -> str:
    """A duration for people; ``0 s`` for nothing, ``-`` for unknown."""
    if seconds is None:
        return "-"
    return "0 s" if seconds == 0 else fmt_seconds(seconds)


def _g(v: float) -> str:
    return f"{v:.3g}"


def short_time(v: float) -> str:
    """An axis tick for seconds: ``200 ms``, ``5 s``, ``2 min``."""
    if v < 1e-3:
        return f"{_g(v * 1e6)} µs"
    if v < 1:
        return f"{_g(v * 1e3)} ms"
    if v < 120:
        return f"{_g(v)} s"
    if v < 7200:
        return f"{_g(v / 60)} min"
    return f"{_g(v / 3600)} h"


def short_mib(v: float) -> str:
    """An axis tick for MiB: ``512 KiB``, ``20 MiB``, ``2 GiB``."""
    if v >= 1024:
        return f"{_g(v / 1024)} GiB"
    if v < 1:
        return f"{_g(v * 1024)} KiB"
    return f"{_g(v)} MiB"


def log_ticks(lo: float, hi: float, fmt: Any) -> tuple[list[float], list[str]]:
    """1-2-5 ticks between ``lo`` and ``hi`` (> 0), with readable labels."""
    k = math.floor(math.log10(lo))
    decades = math.log10(hi) - math.log10(lo)
    mults = (1.0, 2.0, 5.0) if decades <= 3 else (1.0,) if decades > 6 else (1.0, 3.0)
    vals: list[float] = []
    while 10.0**k <= hi * 1.0001:
        for m in mults:
            v = m * 10.0**k
            if lo <= v <= hi:
                vals.append(v)
        k += 1
    return vals, [fmt(v) for v in vals]


def _local(t: _dt.datetime) -> _dt.datetime:
    return t.astimezone().replace(tzinfo=None)


def _unit(seconds: float) -> tuple[float, str]:
    if seconds >= 7200:
        return 3600.0, "hours"
    if seconds >= 120:
        return 60.0, "minutes"
    return 1.0, "seconds"


# --------------------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------------------
class _Fig:
    """The part of plotly's ``Figure`` API the report uses, over plain dicts.

    ``plotly.graph_objects`` validates and deep-copies every array it is given, which takes
    seconds for a study of thousands of trials; the figures here are built from known
    keys, so they go to ``plotly.io.to_html`` as dicts (tests render them validated).
    """

    def __init__(self, *traces: dict[str, Any]) -> None:
        self.data: list[dict[str, Any]] = list(traces)
        self.layout: dict[str, Any] = {}
        self.shapes: list[dict[str, Any]] = []
        self.annotations: list[dict[str, Any]] = []

    def add_trace(self, trace: dict[str, Any]) -> None:
        self.data.append(trace)

    def update_layout(self, **kw: Any) -> None:
        for key, value in kw.items():
            axis, _, prop = key.partition("_")
            if axis in ("xaxis", "yaxis") and prop == "title":
                self.layout.setdefault(axis, {})["title"] = {"text": value}
            elif isinstance(value, dict):
                self.layout.setdefault(key, {}).update(value)
            else:
                self.layout[key] = value

    def update_xaxes(self, **kw: Any) -> None:
        self.layout.setdefault("xaxis", {}).update(kw)

    def update_yaxes(self, **kw: Any) -> None:
        self.layout.setdefault("yaxis", {}).update(kw)

    def add_hline(self, y: float, line: dict[str, Any], annotation_text: str = "") -> None:
        self.shapes.append(
            {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y", "y0": y, "y1": y,
             "line": line}
        )  # fmt: skip
        if annotation_text:
            self.annotations.append(
                {"xref": "paper", "x": 0, "xanchor": "left", "yref": "y", "y": y,
                 "yanchor": "bottom", "text": annotation_text, "showarrow": False,
                 "font": {"color": line.get("color", "#444")}}
            )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        layout = dict(self.layout)
        if self.shapes:
            layout["shapes"] = self.shapes
        if self.annotations:
            layout["annotations"] = self.annotations
        return {"data": self.data, "layout": layout}


_TEMPLATE: dict[str, Any] = {}


def _template() -> dict[str, Any]:
    """plotly's ``plotly_white`` template as a dict (what ``template="plotly_white"`` sends)."""
    if not _TEMPLATE:
        import plotly.io as pio

        _TEMPLATE.update(pio.templates["plotly_white"].to_plotly_json())
    return _TEMPLATE


class _Figures:
    """Renders figures to HTML divs; plotly.js goes inline with the first one."""

    def __init__(self, *, validate: bool = False) -> None:
        self.count = 0
        self.validate = validate

    def div(self, fig: _Fig, name: str, height: int, title: str) -> str:
        """The figure as HTML under its title (``title`` is escaped here)."""
        import plotly.io as pio

        fig.update_layout(
            template=_template(),
            height=height,
            margin={"l": 70, "r": 20, "t": 12, "b": 50},
            font={"family": _FONT, "size": 13, "color": "#1d2329"},
            legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0, "xanchor": "left"},
            hoverlabel={"font": {"family": _FONT, "size": 12}, "align": "left"},
        )
        out = pio.to_html(
            fig.to_dict(),
            full_html=False,
            include_plotlyjs=self.count == 0,
            div_id=f"fig-{name}",
            default_height=f"{height}px",
            default_width="100%",
            config={"displaylogo": False, "displayModeBar": False, "responsive": True},
            validate=self.validate,
        )
        self.count += 1
        return f'<div class="fig"><h4>{e(title)}</h4>{out}</div>'


def _hover(r: TrialRow, extra: Sequence[str] = ()) -> str:
    lines = [f"<b>{e(r.label)}</b> {e(OUTCOME_LABELS.get(r.outcome, r.outcome))}"]
    if r.name:
        lines.append(e(r.name))
    if r.params:
        lines.append(e(_params(r.params, 100)))
    lines += list(extra)
    return "<br>".join(lines)


def _budget_figure(rep: Report, figs: _Figures) -> str:
    tl = rep.timeline()
    if not tl:
        return '<p class="empty">No trial has a recorded end time yet: nothing to plot.</p>'
    price = rep.price_per_hour
    word = rep.device_word
    top = max(max(p["spent"] + p["avoided"] for p in tl), rep.caps.get("total_time", 0.0))
    if price is not None:
        scale, ylabel = 3600.0 / price, f"cost ({rep.currency})"
        fmt = "%{y:,.2f}"
    else:
        scale, unit = _unit(top)
        ylabel, fmt = f"{word} time ({unit})", "%{y:,.2f} " + unit
    x = [_local(p["time"]) for p in tl]
    labels = [e(p["trial"]) for p in tl]
    fig = _Fig()
    if any(p["avoided"] for p in tl):
        fig.add_trace(
            dict(
                type="scatter",
                x=x,
                y=[(p["spent"] + p["avoided"]) / scale for p in tl],
                name="without the rejections (spent + what they saved)",
                mode="lines",
                line={"shape": "hv", "dash": "dash", "color": COLORS["rejected"], "width": 2},
                customdata=labels,
                hovertemplate=f"{fmt}<br>after %{{customdata}}<extra></extra>",
            )
        )
    fig.add_trace(
        dict(
            type="scatter",
            x=x,
            y=[p["spent"] / scale for p in tl],
            name=f"spent ({word} time of trials that ran)",
            mode="lines",
            line={"shape": "hv", "color": "#0b5cad", "width": 3},
            fill="tozeroy",
            fillcolor="rgba(11,92,173,0.10)",
            customdata=labels,
            hovertemplate=f"{fmt}<br>after %{{customdata}}<extra></extra>",
        )
    )
    cap = None
    if price is not None and "cost" in rep.caps:
        cap, cap_text = rep.caps["cost"], f"cost cap {fmt_money(rep.caps['cost'], rep.currency)}"
        cap_y = cap
    elif "total_time" in rep.caps:
        cap, cap_text = rep.caps["total_time"], f"cap: {fmt_seconds(rep.caps['total_time'])}"
        cap_y = cap / scale
    if cap is not None:
        fig.add_hline(
            y=cap_y,
            line={"color": "#c62828", "dash": "dot", "width": 2},
            annotation_text=e(cap_text),
        )
    fig.update_layout(
        xaxis_title="time the trial ended (local)",
        yaxis_title=ylabel,
        hovermode="x unified",
    )
    fig.update_yaxes(rangemode="tozero")
    return figs.div(fig, "budget", 400, "Budget consumed over time")


def _outcome_figure(rep: Report, figs: _Figures) -> str:
    counts = rep.counts()
    shown = [o for o in OUTCOMES if counts[o]]
    if not shown:
        return ""
    fig = _Fig(
        dict(
            type="bar",
            x=[counts[o] for o in shown],
            y=[OUTCOME_LABELS[o] for o in shown],
            orientation="h",
            marker={"color": [COLORS[o] for o in shown]},
            text=[str(counts[o]) for o in shown],
            textposition="auto",
            hovertemplate="%{y}: %{x} trials<extra></extra>",
        )
    )
    fig.update_layout(xaxis_title="trials", showlegend=False)
    fig.update_yaxes(autorange="reversed")
    return figs.div(fig, "outcomes", 80 + 40 * len(shown), "What became of the trials")


def _measured_pairs(rep: Report, memory: bool) -> list[TrialRow]:
    rows = []
    for r in rep.trials:
        pred = r.pred_memory if memory else r.pred_epoch_time
        act = r.actual_memory if memory else r.actual_epoch_time
        if pred is None or act is None or pred <= 0 or act <= 0:
            continue
        if memory and r.outcome == "oom":
            continue
        rows.append(r)
    return rows


@dataclass(frozen=True)
class _Quantity:
    """The quantity a predicted-vs-measured figure compares (peak memory or epoch time):
    how to read its prediction, measurement and upper bound off a trial, write it, and
    name it."""

    memory: bool

    @property
    def label(self) -> str:
        return "peak memory" if self.memory else "epoch time"

    def fmt(self, v: float | None) -> str:
        return fmt_bytes(v) if self.memory else fmt_seconds(v)

    def pred(self, r: TrialRow) -> float:
        return float((r.pred_memory if self.memory else r.pred_epoch_time) or 0.0)

    def act(self, r: TrialRow) -> float:
        return float((r.actual_memory if self.memory else r.actual_epoch_time) or 0.0)

    def upper(self, r: TrialRow) -> float | None:
        return r.pred_memory_upper if self.memory else r.pred_epoch_time_upper


def _scatter(rep: Report, figs: _Figures, *, what: str, name: str, height: int = 440) -> str:
    """The predicted-vs-measured figure of ``what`` (``"memory"`` or ``"time"``): one
    point per measured trial with a bar to its upper bound, the trials that ran out of
    memory at what they reached, and the line where prediction equals measurement; or a
    line saying there is nothing to compare."""
    q = _Quantity(memory=what == "memory")
    rows = _measured_pairs(rep, q.memory)[:MAX_POINTS]
    ooms = [
        r
        for r in rep.trials
        if q.memory and r.outcome == "oom" and r.pred_memory and r.oom_memory_reached
    ]
    if not rows and not ooms:
        return (
            f'<div><p class="empty">No trial has both a predicted and a measured {q.label} yet, '
            "so there is nothing to compare.</p></div>"
        )
    raw = [v for r in rows for v in (q.pred(r), q.act(r), q.upper(r) or q.pred(r))]
    raw += [v for r in ooms for v in (r.pred_memory or 0.0, r.oom_memory_reached or 0.0)]
    raw = [v for v in raw if v > 0]
    scale, unit = _scatter_unit(q, max(raw))
    fig = _Fig()
    _add_pair_traces(fig, q, rows, scale)
    if ooms:
        _add_oom_trace(fig, q, ooms, scale)
    _add_identity_and_axes(fig, q, min(raw) / scale, max(raw) / scale, scale, unit)
    return figs.div(fig, name, height, f"{q.label.capitalize()}: predicted vs measured")


def _scatter_unit(q: _Quantity, largest: float) -> tuple[float, str]:
    """The unit the figure's axes are drawn in, with its size in bytes or seconds: GiB
    from 4 GiB up (else MiB), minutes from 10 minutes up (else seconds)."""
    if q.memory:
        return (2.0**30, "GiB") if largest >= 4 * 2**30 else (2.0**20, "MiB")
    return (60.0, "min") if largest >= 600 else (1.0, "s")


def _add_pair_traces(fig: _Fig, q: _Quantity, rows: Sequence[TrialRow], scale: float) -> None:
    """One trace of measured trials per (cost model, within its upper bound or not),
    each point with its hover text and a bar from the prediction to the upper bound."""
    groups: dict[tuple[str, bool], list[TrialRow]] = {}
    for r in rows:
        upper = q.upper(r)
        covered = upper is None or q.act(r) <= upper
        groups.setdefault((r.model_kind or "unknown", covered), []).append(r)
    kinds = {kind for kind, _ in groups}
    for (kind, covered), members in sorted(groups.items(), key=lambda g: (g[0][0], not g[0][1])):
        texts = []
        for r in members:
            pred, act, upper = q.pred(r), q.act(r), q.upper(r)
            texts.append(
                _hover(
                    r,
                    [
                        f"predicted {e(q.fmt(pred))}, upper bound {e(q.fmt(upper))}",
                        f"measured {e(q.fmt(act))} (error {e(fmt_pct(pred / act - 1, True))})",
                    ],
                )
            )
        color = KIND_COLORS.get(kind, "#555")
        fig.add_trace(
            dict(
                type="scatter",
                x=[q.pred(r) / scale for r in members],
                y=[q.act(r) / scale for r in members],
                mode="markers",
                name=(f"{e(kind)} model, " if len(kinds) > 1 else "")
                + ("within its upper bound" if covered else "above its upper bound"),
                marker={
                    "color": color,
                    "symbol": "circle" if covered else "x",
                    "size": 10 if len(rows) < 300 else 6,
                    "opacity": 0.85,
                    "line": {"width": 0.5, "color": "#fff"},
                },
                error_x={
                    "type": "data",
                    "symmetric": False,
                    "array": [((q.upper(r) or q.pred(r)) - q.pred(r)) / scale for r in members],
                    "arrayminus": [0.0] * len(members),
                    "thickness": 1.2,
                    "width": 0,
                    "color": color,
                },
                text=texts,
                hovertemplate="%{text}<extra></extra>",
            )
        )


def _add_oom_trace(fig: _Fig, q: _Quantity, ooms: Sequence[TrialRow], scale: float) -> None:
    """The trials that ran out of memory, at the memory they reached before the crash:
    a lower bound of their need, so they are drawn apart from the measured peaks."""
    fig.add_trace(
        dict(
            type="scatter",
            x=[(r.pred_memory or 0) / scale for r in ooms],
            y=[(r.oom_memory_reached or 0) / scale for r in ooms],
            mode="markers",
            name="out of memory (measured: reached before the crash)",
            marker={"color": COLORS["oom"], "symbol": "triangle-up", "size": 11},
            text=[
                _hover(
                    r,
                    [
                        f"predicted {e(q.fmt(r.pred_memory))}, upper bound {e(q.fmt(r.pred_memory_upper))}",
                        f"ran out of memory after reaching {e(q.fmt(r.oom_memory_reached))}",
                    ],
                )
                for r in ooms
            ],
            hovertemplate="%{text}<extra></extra>",
        )
    )


def _add_identity_and_axes(
    fig: _Fig, q: _Quantity, lo: float, hi: float, scale: float, unit: str
) -> None:
    """The predicted = measured line and the axes, between ``lo`` and ``hi`` (in
    ``unit``): logarithmic, with readable ticks, where the values span more than 30x."""
    log = hi / lo > 30
    lo, hi = (lo / 1.25, hi * 1.25) if log else (0.0, hi * 1.08)
    fig.add_trace(
        dict(
            type="scatter",
            x=[lo, hi],
            y=[lo, hi],
            mode="lines",
            name="predicted = measured",
            line={"color": "#888", "dash": "dash", "width": 1.5},
            hoverinfo="skip",
        )
    )
    fig.update_layout(
        xaxis_title=f"predicted ({unit}); the bar reaches the upper bound",
        yaxis_title=f"measured ({unit})",
    )
    axis: dict[str, Any] = {"type": "log" if log else "linear", "range": _range(lo, hi, log)}
    if log:
        tick = short_mib if q.memory else short_time
        factor = scale / 2**20 if q.memory else scale
        vals, texts = log_ticks(lo, hi, lambda v: tick(v * factor))
        axis.update(tickvals=vals, ticktext=texts)
    fig.update_xaxes(**axis)
    fig.update_yaxes(**axis)


def _range(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        return [math.log10(lo), math.log10(hi)]
    return [lo, hi]


def _ratio_figure(rep: Report, figs: _Figures) -> str:
    series = []
    for memory, label, color in (
        (True, "peak memory", "#6a3d9a"),
        (False, "epoch time", "#e08214"),
    ):
        xs, ys, texts = [], [], []
        for i, r in enumerate(_measured_pairs(rep, memory)):
            pred = float((r.pred_memory if memory else r.pred_epoch_time) or 1.0)
            act = float((r.actual_memory if memory else r.actual_epoch_time) or 1.0)
            xs.append(r.number if r.number is not None else i)
            ys.append(act / pred)
            texts.append(
                _hover(
                    r, [f"measured ÷ predicted: {act / pred:.2f}", f"cost model: {e(r.model_kind)}"]
                )
            )
        if xs:
            series.append((label, color, xs[:MAX_POINTS], ys[:MAX_POINTS], texts[:MAX_POINTS]))
    if not series:
        return ""
    fig = _Fig()
    for label, color, xs, ys, texts in series:
        fig.add_trace(
            dict(
                type="scatter",
                x=xs,
                y=ys,
                mode="markers+lines" if len(xs) <= 60 else "markers",
                name=label,
                marker={"color": color, "size": 8 if len(xs) < 300 else 5},
                line={"color": color, "width": 1},
                text=texts,
                hovertemplate="%{text}<extra></extra>",
            )
        )
    fig.add_hline(y=1.0, line={"color": "#888", "dash": "dash", "width": 1.5})
    values = [y for _, _, _, ys, _ in series for y in ys if y > 0] + [1.0]
    lo, hi = min(values) / 1.25, max(values) * 1.25
    vals, texts = log_ticks(lo, hi, lambda v: f"×{_g(v)}")
    fig.update_layout(
        xaxis_title="trial",
        yaxis_title="measured ÷ predicted",
    )
    fig.update_yaxes(type="log", range=_range(lo, hi, True), tickvals=vals, ticktext=texts)
    return figs.div(fig, "ratio", 360, "Measured ÷ predicted, trial by trial (×1 is exact)")


# --------------------------------------------------------------------------------------
# tables and sections
# --------------------------------------------------------------------------------------
def _ratio(err: dict[str, Any]) -> str:
    r = err.get("median_ratio")
    return "-" if r is None else f"×{r:.2f}"


def _card(key: str, value: str, sub: str = "", cls: str = "") -> str:
    return (
        f'<div class="card {cls}"><div class="k">{e(key)}</div><div class="v">{e(value)}</div>'
        f'<div class="s">{e(sub)}</div></div>'
    )


def _cards(rep: Report) -> str:
    s = rep.summary()
    word = s["device_word"]
    mem, tim = s["memory_error"], s["time_error"]
    spent_sub = f"by {s['spent_trials']:,} trials that ran"
    if s["spent_cost"] is not None:
        spent_sub = f"{fmt_money(s['spent_cost'], rep.currency)} · " + spent_sub
    if s["saved_s"] is None:
        saved_value, saved_sub = "-", "no rejected trial has a figure to count"
    else:
        saved_value = ("≤ " if s["saved_all_upper_bound"] else "") + dur(s["saved_s"])
        saved_sub = f"by {s['saved_trials']:,} rejected trials"
        if s["saved_all_upper_bound"]:
            saved_sub = "an upper bound (see Compute saved) · " + saved_sub
        elif s["saved_upper_bound"]:
            saved_sub = (
                f"{dur(s['saved_upper_bound_s'])} of it an upper bound (see Compute saved) · "
                + saved_sub
            )
        if s["saved_cost"] is not None:
            saved_sub = f"{fmt_money(s['saved_cost'], rep.currency)} · " + saved_sub
    n = s["trials"]
    cards = [
        _card("Trials", f"{n:,}", f"{s['admitted']:,} admitted · {s['completed']:,} completed"),
        _card(
            "Rejected before running",
            f"{s['rejected']:,}",
            f"{s['rejected'] / n:.0%} of trials" if n else "",
        ),
        _card(
            "Out of memory",
            f"{s['oom']:,}",
            f"{dur(s['oom_wasted_s'])} wasted" if s["oom"] else "no admitted trial crashed",
            "bad" if s["oom"] else "good" if n else "",
        ),
        _card(
            "Stopped early",
            f"{s['stopped']:,}",
            f"over budget or pruned · {s['failed']:,} failed",
        ),
        _card(f"{word} time spent", dur(s["spent_s"]), spent_sub),
        _card(f"{word} time saved", saved_value, saved_sub, "good" if s["saved_s"] else ""),
        _card(
            "Memory prediction error",
            fmt_pct(mem.get("median_abs")) if mem["n"] else "-",
            _error_sub(mem) if mem["n"] else "nothing measured yet",
        ),
        _card(
            "Epoch-time prediction error",
            fmt_pct(tim.get("median_abs")) if tim["n"] else "-",
            _error_sub(tim) if tim["n"] else "nothing measured yet",
        ),
    ]
    return '<div class="cards">' + "".join(cards) + "</div>"


def _error_sub(err: dict[str, Any]) -> str:
    parts = [f"median of {err['n']:,} trials"]
    lean = lean_words(err)
    if lean:
        parts.append(lean)
    if err.get("coverage") is not None:
        parts.append(f"upper bound covers {err['coverage']:.0%}")
    return " · ".join(parts)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int]) -> str:
    """A table; cells are HTML already (escape before)."""
    th = "".join(
        f'<th class="n">{e(h)}</th>' if i in numeric else f"<th>{e(h)}</th>"
        for i, h in enumerate(head)
    )
    body = []
    for row in rows:
        tds = []
        for i, cell in enumerate(row):
            cls = ' class="n"' if i in numeric else ""
            if cell.startswith("\0"):  # a cell with its own class
                cls_name, _, cell = cell[1:].partition("\0")
                cls = f' class="{cls_name}"'
            tds.append(f"<td{cls}>{cell}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _cls(name: str, html_text: str) -> str:
    return f"\0{name}\0{html_text}"


def _budget_section(rep: Report, figs: _Figures) -> str:
    s = rep.summary()
    word = s["device_word"]
    caps = rep.caps
    items = []
    if "memory" in caps:
        items.append(
            (
                "peak memory per trial",
                fmt_bytes(caps["memory"]) + (" (CUDA context included)" if word == "GPU" else ""),
            )
        )
    if "epoch_time" in caps:
        items.append(("epoch time", fmt_seconds(caps["epoch_time"])))
    if "trial_time" in caps:
        items.append(("trial time", fmt_seconds(caps["trial_time"])))
    spent = s["budget_spent_s"]
    if "total_time" in caps:
        used = spent / caps["total_time"] if caps["total_time"] else None
        items.append(
            (
                "study total",
                f"{fmt_seconds(caps['total_time'])} ({fmt_pct(used)} used: "
                f"{fmt_seconds(spent)} spent)",
            )
        )
    if "cost" in caps:
        cost_cap = fmt_money(caps["cost"], rep.currency)
        if s["budget_spent_cost"] is not None and caps["cost"]:
            cost_cap += (
                f" ({fmt_pct(s['budget_spent_cost'] / caps['cost'])} used: "
                f"{fmt_money(s['budget_spent_cost'], rep.currency)} spent)"
            )
        items.append(("study cost cap", cost_cap))
    if rep.price_per_hour is not None:
        items.append(("price", f"{fmt_money(rep.price_per_hour, rep.currency)} per {word}-hour"))
    kv = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in items)
    limits = (
        f'<dl class="kv">{kv}</dl>'
        if items
        else '<p class="muted">No budget limits are recorded with the decisions.</p>'
    )
    no_cap = ""
    if "total_time" not in caps and "cost" not in caps:
        no_cap = (
            '<p class="muted">No study-wide cap was recorded (Budget.max_total_time or '
            "max_cost), so the chart shows consumption without a cap line.</p>"
        )
    spent_line = (
        f'<p class="big"><b>{e(fmt_seconds(s["spent_s"]))}</b> of {e(word)} time spent by '
        f"{s['spent_trials']} trials"
        + (
            f" ({e(fmt_money(s['spent_cost'], rep.currency))})"
            if s["spent_cost"] is not None
            else ""
        )
        + f". A trial's {e(word)} time is {e(rep.spent_basis)}.</p>"
    )
    counted = ""
    if "total_time" in caps or "cost" in caps:
        counted = (
            f'<p class="muted">Spent against the study-wide cap: {e(s["budget_spent_basis"])}.</p>'
        )
    return (
        '<section id="budget"><h2>Budget</h2><p class="lead">How much of the budget the study '
        "consumed, and what the rejected trials would have added.</p>"
        f"{spent_line}{limits}{counted}{no_cap}{_budget_figure(rep, figs)}</section>"
    )


KIND_WORDS = {
    "memory": "peak memory over the limit",
    "epoch_time": "epoch time over the limit",
    "trial_time": "trial time over the limit",
    "total_time": "the study's total time would be exceeded",
    "cost": "the study's cost cap would be exceeded",
    "prediction failed": "the prediction failed (fail_open=False)",
}


def _more(shown: int, total: int) -> str:
    if total <= shown:
        return ""
    return (
        f'<p class="muted">Showing {shown:,} of {total:,}; the Markdown report and '
        "Report.to_dict() list them all.</p>"
    )


def _trials_section(rep: Report, figs: _Figures) -> str:
    counts = rep.counts()
    rej = rep.rejections()["by_kind"]
    parts = [
        '<section id="trials"><h2>Trials</h2><p class="lead">Admitted, rejected, out of '
        "memory, stopped and completed, each with its reason.</p>"
    ]
    fig = _outcome_figure(rep, figs)
    if not fig:
        parts.append('<p class="empty">No trials recorded yet.</p></section>')
        return "".join(parts)
    rows_kind = [
        [e(KIND_WORDS.get(k, k)), str(n), fmt_pct(n / max(counts["rejected"], 1))]
        for k, n in rej.items()
    ]
    reasons_html = (
        "<h3>Why trials were rejected</h3>"
        + _table(["limit broken", "trials", "of the rejected"], rows_kind, {1, 2})
        + '<p class="muted">A trial can break several limits at once.</p>'
        if rows_kind
        else '<p class="muted">No trial was rejected.</p>'
    )
    parts.append(f'<div class="grid2"><div>{fig}</div><div>{reasons_html}</div></div>')

    ran_badly = [r for r in rep.trials if r.outcome in ("oom", "stopped", "failed")]
    if ran_badly:
        shown = ran_badly[:MAX_TABLE_ROWS]
        rows = [
            [
                e(r.label),
                _badge(r.outcome),
                _cls("params", _params_html(r)),
                e(fmt_bytes(r.actual_memory if r.outcome != "oom" else r.oom_memory_reached)),
                e(fmt_seconds(r.actual_epoch_time)),
                e(dur(r.spent)),
                _cls("reason", e("; ".join(r.reasons))),
            ]
            for r in shown
        ]
        parts.append(
            f"<h3>Stopped, out of memory or failed while running ({len(ran_badly):,})</h3>"
            '<div class="scroll">'
            + _table(
                [
                    "trial",
                    "outcome",
                    "parameters",
                    "measured peak",
                    "measured epoch",
                    f"{rep.device_word} time",
                    "reason",
                ],
                rows,
                {3, 4, 5},
            )
            + "</div>"
            + _more(len(shown), len(ran_badly))
        )
    rejected = [r for r in rep.trials if r.outcome == "rejected"]
    if rejected:
        shown = rejected[:MAX_TABLE_ROWS]
        rows = [
            [
                e(r.label),
                _cls("params", _params_html(r)),
                e(f"{fmt_bytes(r.pred_memory)} / {fmt_bytes(r.pred_memory_upper)}"),
                e(f"{fmt_seconds(r.pred_epoch_time)} / {fmt_seconds(r.pred_epoch_time_upper)}"),
                e(dur(r.predicted_cost)),
                _cls("reason", e("; ".join(r.reasons) or r.prediction_error or "")),
            ]
            for r in shown
        ]
        parts.append(
            f"<h3>Rejected before running ({len(rejected):,})</h3>"
            '<p class="muted">Predicted figures: the point prediction / the upper bound. '
            "A default Budget checks memory at its upper bound and times at the point "
            "prediction; each reason names the figure it compared.</p>"
            '<div class="scroll">'
            + _table(
                [
                    "trial",
                    "parameters",
                    "pred. peak memory",
                    "pred. epoch time",
                    "pred. trial cost",
                    "reason",
                ],
                rows,
                {2, 3, 4},
            )
            + "</div>"
            + _more(len(shown), len(rejected))
        )
    parts.append("</section>")
    return "".join(parts)


def _params_html(r: TrialRow, limit: int = 160) -> str:
    """The model name (when known) over the parameters, escaped."""
    name = f'<div class="name">{e(r.name)}</div>' if r.name else ""
    return name + e(_params(r.params, limit))


def _saved_section(rep: Report) -> str:
    s = rep.summary()
    word = s["device_word"]
    cur = rep.currency
    tim = s["time_error"]
    items = []
    if s["rejected"]:
        if s["saved_s"] is not None and s["saved_trials"]:
            bound = ", an upper bound" if s["saved_all_upper_bound"] else ""
            basis = "".join(f"<li>{e(b)}</li>" for b in s["saved_basis"])
            items.append(
                f"<li><b>{e(fmt_saved(s, cur))}</b> of {e(word)} time not spent by the "
                f"{s['saved_trials']:,} rejected trials{e(bound)}. What it rests on:"
                f"<ul>{basis}</ul></li>"
            )
            if (adjusted := saved_adjusted(s)) is not None:
                items.append(f"<li>{e(adjusted)}</li>")
            predicted = s["saved_by_basis"].get("predicted_run", {}).get("trials", 0)
            predicted += s["saved_by_basis"].get("upper_bound", {}).get("trials", 0)
            if tim["n"] and predicted:
                bias = tim["median"]  # the median signed error: its sign is the direction
                how = "too high" if bias > 0 else "too low"
                if abs(bias) >= 0.5 or bias <= -1 / 3:  # a factor of 1.5 either way
                    items.append(
                        "<li>Read the part that rests on predicted times as an estimate: on "
                        f"the {tim['n']:,} trials that ran, the epoch-time predictions were "
                        f"{e(how)} (median signed error {e(fmt_pct(bias, True))}).</li>"
                    )
        if s["saved_unknown"]:
            items.append(
                f"<li>{s['saved_unknown']:,} rejected trials are not counted (see Missing "
                "from the records).</li>"
            )
        if s["gate_latency_median_s"] is not None:
            items.append(
                "<li>Each decision cost one dry run on the CPU: "
                f"{e(fmt_seconds(s['gate_latency_median_s']))} median.</li>"
            )
    else:
        items.append("<li>No trial was rejected, so rejections saved nothing.</li>")
    if s["oom"]:
        items.append(
            f"<li><b>{e(dur(s['oom_wasted_s']))}</b> measured on {s['oom']:,} "
            f"trial{'s' * (s['oom'] != 1)} that ran out of memory anyway (OOMs that were not "
            "prevented).</li>"
        )
    elif s["admitted"]:
        items.append("<li>No admitted trial ran out of memory.</li>")
    if s["stopped"]:
        items.append(
            f"<li>{s['stopped']:,} trials were stopped early, after {e(dur(s['stopped_spent_s']))} "
            "in all.</li>"
        )
    top = sorted(
        (r for r in rep.trials if r.outcome == "rejected" and rep.saving(r)[0]),
        key=lambda r: -(rep.saving(r)[0] or 0.0),
    )[:10]
    table = ""
    if top:
        rows = []
        for r in top:
            saved, basis = rep.saving(r)
            rows.append(
                [
                    e(r.label),
                    _cls("params", _params_html(r)),
                    e(dur(saved)) + f'<div class="muted">{e(_BASIS_WORDS.get(basis, basis))}</div>',
                    e(dur(r.predicted_cost)),
                    e(fmt_bytes(r.pred_memory)),
                    e(fmt_seconds(r.pred_epoch_time)),
                ]
            )
        table = "<h3>The rejections that saved the most</h3>" + _table(
            [
                "trial",
                "parameters",
                "counted as saved",
                "predicted run",
                "pred. peak memory",
                "pred. epoch time",
            ],
            rows,
            {2, 3, 4, 5},
        )
    return (
        '<section id="saved"><h2>Compute saved</h2><p class="lead">What the rejections '
        "avoided, what each figure rests on, and what the misses cost.</p>"
        f"<ul>{''.join(items)}</ul>{table}</section>"
    )


#: how a rejection's saving was counted (see Report.saving), in words
_BASIS_WORDS = {
    "until_oom": "until the crash (measured OOMs)",
    "upper_bound": "whole predicted run (upper bound)",
    "predicted_run": "whole predicted run",
}


def _accuracy_section(rep: Report, figs: _Figures) -> str:
    acc = rep.accuracy()
    parts = [
        '<section id="accuracy"><h2>Predictions vs reality</h2><p class="lead">Each point is '
        "a trial that ran: its predicted figure (x) against what was measured (y). Points on "
        "the dashed line were predicted exactly; above it, the prediction was too low. The "
        "horizontal bar reaches the upper bound.</p>"
    ]
    rows = []
    for key, label in (("memory", "peak memory"), ("time", "epoch time")):
        err = acc[key]
        if err["n"]:
            rows.append(
                [
                    e(label),
                    str(err["n"]),
                    e(fmt_pct(err["median_abs"])),
                    e(f"×{err['median_ratio']:.2f}"),
                    e(fmt_pct(err["coverage"]))
                    + (f" of {err['n_upper']}" if err["n_upper"] else ""),
                ]
            )
    if rows:
        parts.append(
            _table(
                [
                    "quantity",
                    "trials",
                    "median |error|",
                    "measured ÷ predicted (median)",
                    "upper bound covers",
                ],
                rows,
                {1, 2, 3, 4},
            )
        )
    parts.append(
        '<div class="grid2">'
        + _scatter(rep, figs, what="memory", name="memory")
        + _scatter(rep, figs, what="time", name="time")
        + "</div>"
    )
    if acc["oom_with_prediction"]:
        parts.append(
            f'<p class="muted">{acc["oom_with_prediction"]} trials ran out of memory; their true '
            "peak is unknown (above what was reached), so they are drawn apart and left out of "
            "the error figures.</p>"
        )
    parts.append(_ratio_figure(rep, figs))
    for key, title in (("by_model", "Error by cost model"), ("by_family", "Error by model family")):
        groups = acc[key]
        if len(groups) < (1 if key == "by_model" else 2):
            continue
        rows = [
            [
                e(g["group"]),
                str(g["trials"]),
                e(fmt_pct(g["memory"].get("median_abs"))),
                e(_ratio(g["memory"])),
                e(fmt_pct(g["time"].get("median_abs"))),
                e(_ratio(g["time"])),
                e(fmt_pct(g["time"].get("coverage"))),
            ]
            for g in groups[:30]
        ]
        parts.append(
            f"<h3>{e(title)}</h3>"
            + _table(
                [
                    "model" if key == "by_model" else "family",
                    "trials",
                    "memory |error|",
                    "memory meas. ÷ pred.",
                    "time |error|",
                    "time meas. ÷ pred.",
                    "time upper covers",
                ],
                rows,
                {1, 2, 3, 4, 5, 6},
            )
        )
    parts.append("</section>")
    return "".join(parts)


def _best_section(rep: Report) -> str:
    best = rep.best(10)
    head = '<section id="best"><h2>Best trials</h2>'
    if not best:
        c = rep.counts()
        why = (
            f"No trial has completed with an objective value yet ({c['stopped']} stopped early, "
            f"{c['oom']} out of memory, {c['failed']} failed, {c['running']} running)."
            if rep.direction
            else "The records hold no optimisation direction or no objective values (see the notes above)."
        )
        return head + f'<p class="empty">{e(why)}</p></section>'
    word = rep.device_word
    metric = rep.metric or "objective"
    lead = f"Ranked by {metric} ({'higher' if rep.direction == 'maximize' else 'lower'} is better), with what each cost."
    rows = [
        [
            str(i + 1),
            e(r.label),
            e(fmt_value(r.value)),
            _cls("params", _params_html(r)),
            e(dur(r.spent)),
            e(fmt_money(rep.cost(r.spent), rep.currency)) if rep.price_per_hour is not None else "",
            e(fmt_bytes(r.actual_memory)),
            e(fmt_seconds(r.actual_epoch_time)),
            _badge(r.outcome),
        ]
        for i, r in enumerate(best)
    ]
    heads = [
        "rank",
        "trial",
        metric,
        "parameters",
        f"{word} time",
        "cost",
        "measured peak",
        "measured epoch",
        "outcome",
    ]
    if rep.price_per_hour is None:
        heads.pop(5)
        for row in rows:
            row.pop(5)
    numeric = {0, 2, 4, 5, 6, 7} if rep.price_per_hour is not None else {0, 2, 4, 5, 6}
    return head + f'<p class="lead">{e(lead)}</p>' + _table(heads, rows, numeric) + "</section>"


def _all_section(rep: Report) -> str:
    trials = rep.trials
    if not trials:
        return ""
    shown = trials[:MAX_TABLE_ROWS]
    rows = [
        [
            e(r.label),
            _badge(r.outcome),
            _cls("params", _params_html(r, 120)),
            e(fmt_bytes(r.pred_memory)),
            e(fmt_bytes(r.actual_memory)),
            e(fmt_seconds(r.pred_epoch_time)),
            e(fmt_seconds(r.actual_epoch_time)),
            e(dur(r.spent)),
            e(fmt_value(r.value) if r.value is not None else "-"),
        ]
        for r in shown
    ]
    table = _table(
        [
            "trial",
            "outcome",
            "parameters",
            "pred. peak",
            "meas. peak",
            "pred. epoch",
            "meas. epoch",
            f"{rep.device_word} time",
            rep.metric or "value",
        ],
        rows,
        {3, 4, 5, 6, 7, 8},
    )
    opened = " open" if len(trials) <= 40 else ""
    return (
        f'<section id="all"><h2>All trials</h2><details{opened}><summary>{len(trials):,} '
        f'trials</summary><div class="scroll">{table}</div>{_more(len(shown), len(trials))}'
        "</details></section>"
    )


def _footer(rep: Report) -> str:
    """The page's footer: where the numbers come from (the peak memory in the words of
    the ``memory_method`` the measurements recorded) and how they are read."""
    return FOOTER.replace("{peak}", e(_peak_words(rep)))


def _peak_words(rep: Report) -> str:
    """How the measured peaks were taken: the highest reserved peak over a trial's
    epochs on a GPU, and on a CPU (or where recorded) the ``memory_method`` the
    measurements name, most common first."""
    cpu = Counter(
        r.memory_method for r in rep.trials if r.memory_method and r.device_kind != "cuda"
    )
    text = "the highest peak over its epochs"
    if any(r.device_kind == "cuda" for r in rep.trials if r.actual_memory is not None):
        text += " (on a GPU, the allocator's reserved peak)"
    if cpu:
        methods = [m if len(m) <= 300 else m[:299] + "…" for m, _ in cpu.most_common(2)]
        more = f"; and {len(cpu) - 2} other methods" if len(cpu) > 2 else ""
        text += "; as the measurements record it: " + "; ".join(methods) + more
    else:
        text += "; each measurement records how it was taken as its memory_method"
    return text


FOOTER = """
<footer><dl>
<dt>Where the numbers come from</dt>
<dd>Predictions and decisions are what costaware recorded before each trial ran (the
<code>costaware:*</code> trial attributes and the observation store's predictions). Measured
figures are what CostAwareCallback or CostAwareScheduler recorded while the trial ran:
the peak memory is {peak}. The epoch time is the median over its epochs.</dd>
<dt>Compute saved</dt>
<dd>A trial rejected for memory would have crashed when it ran out of memory, not run to its
end: it counts the median measured time to the crash of this study's trials that ran out of
memory (never more than its predicted run). Where no OOM was measured, it counts its whole
predicted run, an upper bound, and the total says how much of it is one. A trial rejected for
time or cost counts its whole predicted run: its predicted epoch time times its planned epochs
(the point prediction, not the upper bound), which it would have used had it been admitted.
A trial rejected only for the study's total time or cost cap counts nothing (it would not
have run within the budget), and a configuration rejected again counts once.</dd>
<dt>Error</dt>
<dd>predicted ÷ measured − 1: +20% means the prediction was 20% too high. The upper bound
covers a trial when the measured figure is at most the bound.</dd>
</dl></footer>
"""


# plotly sizes a figure when it is drawn, while the page is still being parsed; lay them out
# again once the page is complete (responsive figures listen to the window's resize)
_RESIZE = (
    "<script>window.addEventListener('load',function(){"
    "window.dispatchEvent(new Event('resize'));});</script>"
)


def render_html(rep: Report, *, progress: ProgressFn | None = None, validate: bool = False) -> str:
    """The whole page; ``validate`` checks every figure against plotly's schema (slow)."""
    figs = _Figures(validate=validate)
    steps = ["header", "budget", "trials", "saved", "accuracy", "best", "all"]

    def step(i: int) -> None:
        if progress is not None:
            progress("rendering HTML", i, len(steps))

    step(0)
    s = rep.summary()
    devices = sorted({r.device for r in rep.trials if r.device})
    kinds = sorted({r.model_kind for r in rep.trials if r.model_kind})
    starts = [r.start for r in rep.trials if r.start] + [r.end for r in rep.trials if r.end]
    meta = [e(rep.source)]
    if devices:
        meta.append("device " + e(", ".join(devices[:4])) + (" …" if len(devices) > 4 else ""))
    if kinds:
        meta.append("cost model " + e(", ".join(kinds)))
    if starts:
        first, last = _local(min(starts)), _local(max(starts))
        meta.append(
            f"trials from {e(first.strftime('%Y-%m-%d %H:%M'))} to {e(last.strftime('%Y-%m-%d %H:%M'))}"
        )
    meta.append("generated " + e(_local(rep.generated_at).strftime("%Y-%m-%d %H:%M")))
    notes = (
        '<div class="notes"><h3>Missing from the records</h3><ul>'
        + "".join(f"<li>{e(n)}</li>" for n in rep.notes)
        + "</ul></div>"
        if rep.notes
        else ""
    )
    nav = (
        '<nav><a href="#budget">Budget</a><a href="#trials">Trials</a>'
        '<a href="#saved">Compute saved</a><a href="#accuracy">Predictions vs reality</a>'
        '<a href="#best">Best trials</a>'
        + ('<a href="#all">All trials</a>' if rep.trials else "")
        + "</nav>"
    )
    body = [
        f'<header><h1>{e(rep.title)}</h1><p class="meta">{" · ".join(meta)}</p></header>',
        _cards(rep),
        notes,
        nav,
    ]
    step(1)
    body.append(_budget_section(rep, figs))
    step(2)
    body.append(_trials_section(rep, figs))
    step(3)
    body.append(_saved_section(rep))
    step(4)
    body.append(_accuracy_section(rep, figs))
    step(5)
    body.append(_best_section(rep))
    body.append(_gpus_section(rep))
    step(6)
    body.append(_all_section(rep))
    body.append(_footer(rep))
    step(7)
    del s
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="generator" content="costaware">'
        f"<title>{e(rep.title)}</title><style>{CSS}</style></head>\n<body><main>\n"
        + "\n".join(b for b in body if b)
        + "\n</main>"
        + _RESIZE
        + "</body></html>\n"
    )


def _gpus_section(rep: Report) -> str:
    """The "On other GPUs" section (:mod:`costaware.reporting.gpus`; empty when no trial
    can be moved)."""
    from costaware.reporting.gpus import section_rows

    found = section_rows(rep)
    if found is None:
        return ""
    head, rows, lead, left_out = found
    left = (
        f"<p>{left_out} admitted trials have no recorded step or GPU and are left out.</p>"
        if left_out
        else ""
    )
    return (
        '<section id="gpus"><h2>On other GPUs</h2>'
        f'<p class="lead">{html.escape(lead)}</p>'
        + _table(head, [[html.escape(c) for c in row] for row in rows], {1, 2, 3, 4})
        + left
        + "</section>"
    )
