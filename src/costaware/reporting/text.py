"""The Markdown and terminal renderings of a :class:`~costaware.reporting.Report`.

User-supplied strings are neutralised for each medium: in Markdown, ``|`` and newlines
cannot break a table and ``<``, ``>``, ``&`` are written as entities (Markdown renderers
pass raw HTML through); in the terminal, they are printed as plain text, never as rich
markup.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from costaware._format import fmt_bytes, fmt_money, fmt_pct, fmt_seconds, fmt_value
from costaware.reporting.rows import OUTCOME_LABELS, OUTCOMES, fmt_saved, lean_words

if TYPE_CHECKING:
    from costaware.reporting import Report
    from costaware.reporting.rows import TrialRow

__all__ = ["print_summary", "render_markdown"]


# --------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------
def md(value: Any) -> str:
    """A table-safe, HTML-safe Markdown cell."""
    text = "" if value is None else str(value)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = text.replace("|", "\\|").replace("\r", " ").replace("\n", " ")
    for ch in "`*_[]":
        text = text.replace(ch, "\\" + ch)
    return text


def _params(params: dict[str, Any], limit: int = 120) -> str:
    text = " ".join(f"{k}={fmt_value(v)}" for k, v in params.items())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    out = ["| " + " | ".join(md(h) for h in head) + " |"]
    out.append("|" + "|".join("---:" if i in right else "---" for i in range(len(head))) + "|")
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return [*out, ""]


def render_markdown(rep: Report) -> str:
    """The report as GitHub-flavoured Markdown."""
    s = rep.summary()
    word = s["device_word"]
    cur = rep.currency
    lines = [f"# {md(rep.title)}", "", f"_{md(rep.source)}_", ""]
    mem, tim = s["memory_error"], s["time_error"]
    head = [
        ("trials", f"{s['trials']:,} ({s['admitted']:,} admitted, {s['completed']:,} completed)"),
        ("rejected before running", f"{s['rejected']:,}"),
        ("out of memory", f"{s['oom']:,}"),
        ("stopped early", f"{s['stopped']:,}"),
        ("failed", f"{s['failed']:,}"),
        (
            f"{word} time spent",
            fmt_seconds(s["spent_s"])
            + (f" ({fmt_money(s['spent_cost'], cur)})" if s["spent_cost"] is not None else ""),
        ),
        (f"{word} time saved by the rejections", fmt_saved(s, cur)),
        ("memory prediction error (median)", _err(mem)),
        ("epoch-time prediction error (median)", _err(tim)),
    ]
    lines += _md_table(["", ""], [[md(k), md(v)] for k, v in head], set())
    if rep.notes:
        lines += ["> **Missing from the records**", ">"]
        lines += [f"> - {md(n)}" for n in rep.notes]
        lines.append("")

    lines += ["## Budget", ""]
    caps = rep.caps
    cap_rows = []
    for key, label, fmt in (
        ("memory", "peak memory per trial", fmt_bytes),
        ("epoch_time", "epoch time", fmt_seconds),
        ("trial_time", "trial time", fmt_seconds),
        ("total_time", "study total", fmt_seconds),
    ):
        if key in caps:
            cap_rows.append([md(label), md(fmt(caps[key]))])
    if "cost" in caps:
        cap_rows.append(["study cost cap", md(fmt_money(caps["cost"], cur))])
    lines.append(
        f"{md(fmt_seconds(s['spent_s']))} of {word} time spent by {s['spent_trials']} trials; "
        f"a trial's {word} time is {md(rep.spent_basis)}."
    )
    lines.append("")
    if cap_rows:
        lines += _md_table(["limit", "value"], cap_rows, {1})
    if caps.get("total_time"):
        lines += [
            f"Used {fmt_pct(s['spent_s'] / caps['total_time'])} of the study's total time.",
            "",
        ]
    elif "cost" not in caps:
        lines += ["No study-wide cap was recorded (Budget.max_total_time or max_cost).", ""]

    lines += ["## Trials", ""]
    counts = rep.counts()
    rows = [[md(OUTCOME_LABELS[o]), f"{counts[o]:,}"] for o in OUTCOMES if counts[o]]
    if rows:
        lines += _md_table(["outcome", "trials"], rows, {1})
    by_kind = rep.rejections()["by_kind"]
    if by_kind:
        lines += _md_table(
            ["rejected for", "trials"], [[md(k), str(n)] for k, n in by_kind.items()], {1}
        )
    notable = [r for r in rep.trials if r.outcome in ("rejected", "oom", "stopped", "failed")]
    if notable:
        lines += [f"### Rejected, out of memory, stopped and failed ({len(notable):,})", ""]
        lines += _md_table(
            [
                "trial",
                "outcome",
                "parameters",
                "pred. memory / upper",
                "pred. epoch / upper",
                "reason",
            ],
            [
                [
                    md(r.label),
                    md(OUTCOME_LABELS[r.outcome]),
                    md(_params(r.params)),
                    md(f"{fmt_bytes(r.pred_memory)} / {fmt_bytes(r.pred_memory_upper)}"),
                    md(
                        f"{fmt_seconds(r.pred_epoch_time)} / {fmt_seconds(r.pred_epoch_time_upper)}"
                    ),
                    md("; ".join(r.reasons) or r.prediction_error or ""),
                ]
                for r in notable
            ],
            {3, 4},
        )

    lines += ["## Compute saved", ""]
    if s["rejected"] and s["saved_trials"]:
        bound = ", an upper bound" if s["saved_upper_bound"] else ""
        lines.append(
            f"- **{md(fmt_saved(s, cur))}** of {word} time not spent by {s['saved_trials']} "
            f"rejected trials{bound}. What it rests on:"
        )
        lines += [f"  - {md(b)}" for b in s["saved_basis"]]
        if s["saved_adjusted_s"] is not None:
            lines.append(
                "- With the predicted times corrected by the measured ÷ predicted epoch time "
                f"of the trials that ran (×{tim['median_ratio']:.2f}): about "
                f"{md(fmt_seconds(s['saved_adjusted_s']))}."
            )
    elif s["rejected"]:
        lines.append("- No rejected trial has a figure to count (see the notes above).")
    else:
        lines.append("- No trial was rejected.")
    if s["rejected"] and s["saved_trials"] and s["saved_unknown"]:
        lines.append(f"- {s['saved_unknown']} rejected trials are not counted (see the notes).")
    if s["oom"]:
        lines.append(
            f"- {md(fmt_seconds(s['oom_wasted_s']))} measured on {s['oom']} "
            f"trial{'s' * (s['oom'] != 1)} that ran out of memory anyway."
        )
    else:
        lines.append("- No admitted trial ran out of memory.")
    lines.append("")

    lines += ["## Predictions vs reality", ""]
    acc = rep.accuracy()
    rows = []
    for key, label in (("memory", "peak memory"), ("time", "epoch time")):
        err = acc[key]
        if err["n"]:
            rows.append(
                [
                    label,
                    str(err["n"]),
                    fmt_pct(err["median_abs"]),
                    fmt_pct(err["median"], True),
                    fmt_pct(err["coverage"]),
                ]
            )
    if rows:
        lines += _md_table(
            ["quantity", "trials", "median \\|error\\|", "bias", "upper bound covers"],
            rows,
            {1, 2, 3, 4},
        )
    else:
        lines += ["No trial has both a prediction and a measurement yet.", ""]
    for key, title in (("by_model", "cost model"), ("by_family", "family")):
        groups = acc[key]
        if len(groups) >= (1 if key == "by_model" else 2):
            lines += _md_table(
                [title, "trials", "memory \\|error\\|", "time \\|error\\|", "time bias"],
                [
                    [
                        md(g["group"]),
                        str(g["trials"]),
                        fmt_pct(g["memory"].get("median_abs")),
                        fmt_pct(g["time"].get("median_abs")),
                        fmt_pct(g["time"].get("median"), True),
                    ]
                    for g in groups[:30]
                ],
                {1, 2, 3, 4},
            )

    from costaware.reporting.gpus import markdown_lines

    lines += markdown_lines(rep)
    lines += ["## Best trials", ""]
    best = rep.best(10)
    if best:
        lines += _md_table(
            [
                "rank",
                "trial",
                md(rep.metric or "value"),
                "parameters",
                f"{word} time",
                "measured peak",
            ],
            [
                [
                    str(i + 1),
                    md(r.label),
                    md(fmt_value(r.value)),
                    md(_params(r.params)),
                    md(fmt_seconds(r.spent)),
                    md(fmt_bytes(r.actual_memory)),
                ]
                for i, r in enumerate(best)
            ],
            {0, 2, 4, 5},
        )
    else:
        lines += ["No ranked trials (no objective values or no direction recorded).", ""]

    if rep.trials:
        lines += ["## All trials", ""]
        lines += _md_table(
            [
                "trial",
                "outcome",
                "parameters",
                "pred./meas. memory",
                "pred./meas. epoch",
                f"{word} time",
            ],
            [_md_trial(r) for r in rep.trials],
            {3, 4, 5},
        )
    lines.append(f"_Generated by costaware on {rep.generated_at.strftime('%Y-%m-%d %H:%M UTC')}._")
    return "\n".join(lines) + "\n"


def _md_trial(r: TrialRow) -> list[str]:
    return [
        md(r.label),
        md(OUTCOME_LABELS[r.outcome]),
        md(_params(r.params)),
        md(f"{fmt_bytes(r.pred_memory)} / {fmt_bytes(r.actual_memory)}"),
        md(f"{fmt_seconds(r.pred_epoch_time)} / {fmt_seconds(r.actual_epoch_time)}"),
        md(fmt_seconds(r.spent)),
    ]


def _err(err: dict[str, Any]) -> str:
    if not err.get("n"):
        return "- (nothing measured)"
    text = f"{fmt_pct(err['median_abs'])} ({err['n']} trials"
    lean = lean_words(err)
    if lean:
        text += f", {lean}"
    if err.get("coverage") is not None:
        text += f", upper bound covers {fmt_pct(err['coverage'])}"
    return text + ")"


# --------------------------------------------------------------------------------------
# terminal
# --------------------------------------------------------------------------------------
KIND_SHORT = {
    "memory": "peak memory",
    "epoch_time": "epoch time",
    "trial_time": "trial time",
    "total_time": "study total time",
    "cost": "cost cap",
}


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return "0 s" if seconds == 0 else fmt_seconds(seconds)


def print_summary(rep: Report, console: Any = None) -> None:
    """A one-screen summary with rich: headline, trials that went wrong, rejections,
    best trials, and what the records lack."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    con = console if console is not None else Console()
    s = rep.summary()
    word = s["device_word"]
    cur = rep.currency
    con.print(Text(rep.title, style="bold"))
    con.print(Text(rep.source, style="dim"))
    if not rep.trials:
        for n in rep.notes:
            if n not in rep.warned:
                con.print(Text("! " + n, style="yellow"))
        return
    head = Table(box=box.SIMPLE_HEAD, show_header=False, pad_edge=False)
    head.add_column(style="dim")
    head.add_column(justify="right")
    head.add_column(style="dim")
    head.add_column()
    spent = _dur(s["spent_s"]) + (
        f" ({fmt_money(s['spent_cost'], cur)})" if s["spent_cost"] is not None else ""
    )
    head.add_row("trials", f"{s['trials']:,}", f"{word} time spent", spent)
    head.add_row("rejected", f"{s['rejected']:,}", f"{word} time saved", fmt_saved(s, cur))
    head.add_row(
        "out of memory",
        Text(f"{s['oom']:,}", style="red" if s["oom"] else "green"),
        "lost to OOMs",
        _dur(s["oom_wasted_s"]),
    )
    head.add_row("stopped early", f"{s['stopped']:,}", "memory error", _err(s["memory_error"]))
    head.add_row("completed", f"{s['completed']:,}", "epoch-time error", _err(s["time_error"]))
    con.print(head)
    for line in s["saved_basis"]:
        con.print(Text("saved: " + line, style="dim"))

    went_wrong = [r for r in rep.trials if r.outcome in ("oom", "stopped", "failed")]
    if went_wrong:
        t = Table(
            title=f"Stopped, out of memory or failed while running ({len(went_wrong)})",
            title_justify="left",
            box=box.SIMPLE_HEAD,
        )
        t.add_column("trial", no_wrap=True)
        t.add_column("outcome", no_wrap=True)
        t.add_column(f"{word} time", justify="right", no_wrap=True)
        t.add_column("reason", overflow="fold", ratio=1)
        for r in went_wrong[:10]:
            t.add_row(
                Text(r.label),
                Text(OUTCOME_LABELS[r.outcome]),
                _dur(r.spent),
                Text("; ".join(r.reasons) or "-"),
            )
        if len(went_wrong) > 10:
            t.caption = f"and {len(went_wrong) - 10} more (see --html or --markdown)"
        con.print(t)
    by_kind = rep.rejections()["by_kind"]
    if by_kind:
        line = Text(f"Rejected before running ({s['rejected']:,}): ", style="bold")
        line += Text(
            "for " + ", ".join(f"{KIND_SHORT.get(k, k)} ({n})" for k, n in by_kind.items())
        )
        costly = sorted(
            (r for r in rep.trials if r.outcome == "rejected" and rep.saving(r)[0]),
            key=lambda r: -(rep.saving(r)[0] or 0.0),
        )[:3]
        if costly:
            line += Text(
                "; most saved: " + ", ".join(f"{r.label} {_dur(rep.saving(r)[0])}" for r in costly)
            )
        con.print(line)
    best = rep.best(5)
    if best:
        t = Table(title="Best trials", title_justify="left", box=box.SIMPLE_HEAD)
        t.add_column("trial", no_wrap=True)
        t.add_column(rep.metric or "value", justify="right", no_wrap=True)
        t.add_column("parameters", overflow="fold", ratio=1)
        t.add_column(f"{word} time", justify="right", no_wrap=True)
        t.add_column("peak", justify="right", no_wrap=True)
        for r in best:
            t.add_row(
                Text(r.label),
                fmt_value(r.value),
                Text(_params(r.params, 80)),
                _dur(r.spent),
                fmt_bytes(r.actual_memory),
            )
        con.print(t)
    for n in rep.notes:
        if n not in rep.warned:  # given as a warning already: once is enough
            con.print(Text("! " + n, style="yellow"))
