"""Replay the online refit's small-sample time correction on families no model saw.

An online refit (:class:`costaware.runtime.refit.OnlineRefit`) corrects the shipped model with a
study's own first measurements: after 2, 4, 8 and 13 measured trials, fewer than
``SMALL_SAMPLE`` rows, it fits ``log(measured / predicted) = a[precision] + slope *
log(predicted)`` (``costaware.core.model._small_sample_line``; the slope only where
leave-one-out prefers it). This replays that on the held-out predictions that
``benchmarks/accuracy.py --rows FILE`` writes, where each row was predicted by a model
that never saw its architecture family: for each family, in many random orders, its first
k rows are the study's measurements and its other rows the trials still to predict.

Printed per device kind and k: the mean relative error of the time predictions of the
other rows, for the shipped model alone (no refit) and four refit rules: one factor per
precision (no slope), a slope tried at any size, the factor rule with a slope tried from
``_MIN_SLOPE_ROWS`` rows on, and the shipped rule, which is that one with an excess over
the baseline held as seconds beyond the largest row it was fitted on
(:class:`costaware.core.residuals._PrecisionLine`'s ``span``). Besides the measured rows as
they are (the same machine the model was trained on), every scenario is also replayed on
a simulated other device or loop: every time 1.6x (slower), 0.625x (faster), 1.6x at the
median step growing with size as ``(predicted / median) ** 0.2``, and a fixed cost added
to every step (20% or 50% of the median step: a framework's hooks, a logged metric), alone
or after 1.3x. A family's rows vary more than one study's trials do (depth, width, batch,
optimizer, precision), so this is a hard case for a refit.

``--calibration`` replays ``costaware calibrate`` instead: for each family, k rows drawn
at random from the *other* families are the calibration measurements; the shipped rule is
fitted on them, and applied to the family only where ``costaware.runtime.calibrate.judge`` finds
that it cuts their leave-one-out error enough (``--record auto``); the table gives both,
and how often the correction was taken.

``--unseen-device`` replays both on a real other GPU instead of simulated ones: where the
data holds two GPUs, accuracy.py also writes each GPU's rows as predicted by models fitted
on the other GPU's rows alone (of every family, and of the other families).

Usage:
    python benchmarks/accuracy.py --rows rows.jsonl   # about 25 minutes
    python benchmarks/refit_replay.py rows.jsonl [--orders 40] [--seed 0] [--calibration]
        [--unseen-device]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from costaware.core.model import _MIN_SLOPE_ROWS, _small_sample_line
from costaware.core.residuals import _PrecisionLine, _spans
from costaware.runtime.calibrate import CalibrationRow, judge, useful

#: the refit schedule's first steps: measured trials when a refit happens
STEPS = (2, 4, 8, 13)
#: rows a family must have beyond k to be replayed at k
MIN_LEFT = 5

#: a refit's correction of rows (log predictions, precisions) -> log factors
Correction = Callable[[np.ndarray, np.ndarray], np.ndarray]
#: a rule: the rows a refit learns (log(measured / predicted), log predictions,
#: precisions) -> its correction
Rule = Callable[[np.ndarray, np.ndarray, np.ndarray], Correction]


def _line(min_slope_rows: int, span: bool) -> Rule:
    """The small-sample time line as the model fits and applies it
    (:class:`_PrecisionLine`), with ``span`` or without (always a factor)."""

    def rule(y: np.ndarray, lb: np.ndarray, g: np.ndarray) -> Correction:
        by, slope, _ = _small_sample_line(y, lb, g, min_slope_rows)
        names = sorted({str(x) for x in g} | set(by))
        columns = {name: i for i, name in enumerate(names)}
        line = _PrecisionLine(by, columns, slope, _spans(y, lb, g) if span else {})

        def correct(lp: np.ndarray, groups: np.ndarray) -> np.ndarray:
            out = []
            for v, name in zip(lp, groups):
                x = np.zeros((1, len(names)))
                if str(name) in columns:
                    x[0, columns[str(name)]] = 1.0
                r = line.correction(x, math.exp(v))
                out.append(0.0 if math.isnan(r) else r)
            return np.asarray(out)

        return correct

    return rule


#: the shipped rule
SHIPPED = "shipped (excess added beyond the rows)"
RULES: dict[str, Rule] = {
    "one factor": _line(10**9, False),
    "slope always tried": _line(0, False),
    f"factor (slope from {_MIN_SLOPE_ROWS})": _line(_MIN_SLOPE_ROWS, False),
    SHIPPED: _line(_MIN_SLOPE_ROWS, True),
}

#: scenario -> (log measured seconds, log predicted, log of the median prediction) -> the
#: log seconds as measured there
Scenario = Callable[[np.ndarray, np.ndarray, float], np.ndarray]
SCENARIOS: dict[str, Scenario] = {
    "as measured": lambda lm, lp, med: lm,
    "1.6x slower": lambda lm, lp, med: lm + math.log(1.6),
    "0.625x faster": lambda lm, lp, med: lm + math.log(0.625),
    "1.6x, more with size": lambda lm, lp, med: lm + math.log(1.6) + 0.2 * (lp - med),
    "+20% of the median step a step": lambda lm, lp, med: np.log(np.exp(lm) + 0.2 * math.exp(med)),
    "+50% of the median step a step": lambda lm, lp, med: np.log(np.exp(lm) + 0.5 * math.exp(med)),
    "1.3x, +20% a step": lambda lm, lp, med: np.log(1.3 * np.exp(lm) + 0.2 * math.exp(med)),
}


def load(paths: list[str], unseen_device: bool = False) -> list[dict[str, Any]]:
    """The timed held-out rows of ``paths``: the leave-family-out ones, or with
    ``unseen_device`` those of a GPU predicted by models that never saw it."""
    rows = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            r = json.loads(line)
            if bool(r.get("unseen_device")) != unseen_device:
                continue
            if r.get("secs") and r.get("p_secs") and r.get("family"):
                rows.append(r)
    if not rows:
        what = (
            "unseen-device rows (accuracy.py writes them with two GPUs' data)"
            if unseen_device
            else "rows"
        )
        raise SystemExit(f"no timed {what} in {paths}: write them with accuracy.py --rows")
    return rows


def _error_after(
    correct: Correction | None, y: np.ndarray, lp: np.ndarray, g: np.ndarray
) -> float:
    """Mean relative error of rows (``y`` = log(measured / predicted)) once a refit's
    correction is applied; None is the shipped model's error."""
    corr = correct(lp, g) if correct is not None else np.zeros_like(lp)
    return float(np.mean(np.abs(np.exp(corr - y) - 1)))


def replay(
    rows: list[dict[str, Any]],
    shift: Scenario,
    orders: int,
    seed: int,
) -> dict[str, dict[int, float]]:
    """Mean relative error per rule (and "no refit") and k, over families and orders."""
    rng = np.random.default_rng(seed)
    log_pred_all = np.log([r["p_secs"] for r in rows])
    med = float(np.median(log_pred_all))
    errs: dict[str, dict[int, list[float]]] = {
        name: {k: [] for k in STEPS} for name in ("no refit", *RULES)
    }
    for fam in sorted({r["family"] for r in rows}):
        fr = [r for r in rows if r["family"] == fam]
        lp = np.log([r["p_secs"] for r in fr])
        y = shift(np.log([r["secs"] for r in fr]), lp, med) - lp  # log(measured / predicted)
        g = np.asarray([str(r.get("precision") or "") for r in fr], dtype=object)
        for _ in range(orders):
            order = rng.permutation(len(fr))
            for k in STEPS:
                if k > len(fr) - MIN_LEFT:
                    continue
                seen, rest = order[:k], order[k:]
                errs["no refit"][k].append(_error_after(None, y[rest], lp[rest], g[rest]))
                for name, rule in RULES.items():
                    correct = rule(y[seen], lp[seen], g[seen])
                    errs[name][k].append(_error_after(correct, y[rest], lp[rest], g[rest]))
    return {
        name: {k: float(np.mean(v)) if v else math.nan for k, v in by_k.items()}
        for name, by_k in errs.items()
    }


#: calibration rows replayed
CALIBRATION_STEPS = (8, 12, 20)


def replay_calibration(
    rows: list[dict[str, Any]],
    shift: Scenario,
    orders: int,
    seed: int,
) -> dict[str, dict[int, float]]:
    """Mean relative error of each family's rows after k calibration rows of the others:
    "no refit", "always" (the correction applied), "auto" (applied where judged useful) and
    "taken" (the share of calibrations judged useful)."""
    rng = np.random.default_rng(seed)
    lp = np.log([r["p_secs"] for r in rows])
    y = shift(np.log([r["secs"] for r in rows]), lp, float(np.median(lp))) - lp
    g = np.asarray([str(r.get("precision") or "") for r in rows], dtype=object)
    fam = np.asarray([r["family"] for r in rows], dtype=object)
    rule = RULES[SHIPPED]
    errs: dict[str, dict[int, list[float]]] = {
        n: {k: [] for k in CALIBRATION_STEPS} for n in ("no refit", "always", "auto", "taken")
    }
    for f in sorted(set(fam)):
        target, others = np.nonzero(fam == f)[0], np.nonzero(fam != f)[0]
        none = _error_after(None, y[target], lp[target], g[target])
        for _ in range(orders):
            for k in CALIBRATION_STEPS:
                seen = rng.choice(others, size=k, replace=False)
                fixed = _error_after(rule(y[seen], lp[seen], g[seen]), y[target], lp[target], g[target])
                cal = [
                    CalibrationRow(
                        id=str(i), family=str(fam[i]), precision=str(g[i]), status="ok",
                        predicted_time=float(np.exp(lp[i])), measured_time=float(np.exp(lp[i] + y[i])),
                    )
                    for i in seen
                ]  # fmt: skip
                taken = useful(*judge(cal))
                errs["no refit"][k].append(none)
                errs["always"][k].append(fixed)
                errs["auto"][k].append(fixed if taken else none)
                errs["taken"][k].append(float(taken))
    return {n: {k: float(np.mean(v)) for k, v in by_k.items()} for n, by_k in errs.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="+", help="held-out prediction rows from accuracy.py --rows")
    p.add_argument("--orders", type=int, default=40, help="random orders per family (default 40)")
    p.add_argument("--seed", type=int, default=0, help="seed of the orders (default 0)")
    p.add_argument(
        "--calibration",
        action="store_true",
        help="replay costaware calibrate (rows of other families) instead of a study's refit",
    )
    p.add_argument(
        "--unseen-device",
        action="store_true",
        help="replay on a real other GPU instead of simulated ones: each GPU's rows as "
        "predicted by models fitted on the other GPUs' rows alone (accuracy.py writes them "
        "when the data holds two GPUs)",
    )
    args = p.parse_args()
    rows = load(args.rows, args.unseen_device)
    scenarios = SCENARIOS
    groups = _by_kind
    if args.unseen_device:  # the device is real: no simulated one on top
        scenarios = {"as measured": SCENARIOS["as measured"]}
        groups = _by_unseen_device
    if args.calibration:
        print_calibration(rows, args.orders, args.seed, scenarios, groups)
        return
    for mine in groups(rows, f"{args.orders} orders each"):
        print(
            "\nMean relative error of the time predictions of a family's other rows, "
            "after k of its rows refit the shipped model:\n"
        )
        names = ("no refit", *RULES)
        print("| scenario | k | " + " | ".join(names) + " |")
        print("|---|---|" + "---|" * len(names))
        for scenario, shift in scenarios.items():
            res = replay(mine, shift, args.orders, args.seed)
            for k in STEPS:
                cells = " | ".join(f"{100 * res[n][k]:.1f}%" for n in names)
                print(f"| {scenario} | {k} | {cells} |")


def _by_kind(rows: list[dict[str, Any]], each: str) -> Iterator[list[dict[str, Any]]]:
    """Each device kind's rows, after a heading that counts them."""
    for kind in sorted({"cpu" if r["kind"] == "cpu" else "gpu" for r in rows}):
        mine = [r for r in rows if ("cpu" if r["kind"] == "cpu" else "gpu") == kind]
        fams = len({r["family"] for r in mine})
        print(f"\n## {kind.upper()}: {len(mine)} rows, {fams} families, {each}")
        yield mine


def _by_unseen_device(rows: list[dict[str, Any]], each: str) -> Iterator[list[dict[str, Any]]]:
    """Each GPU's rows as predicted by models that never saw it, the families seen (on
    another GPU) and unseen apart, after a heading that counts them."""
    for dev, how in sorted({(r["device"], r["unseen_device"]) for r in rows}):
        mine = [r for r in rows if (r["device"], r["unseen_device"]) == (dev, how)]
        fams = len({r["family"] for r in mine})
        seen = "seen on other GPUs" if how == "families_seen" else "unseen"
        print(f"\n## {dev}, never seen by the model, families {seen}: {len(mine)} rows, "
              f"{fams} families, {each}")  # fmt: skip
        yield mine


def print_calibration(
    rows: list[dict[str, Any]],
    orders: int,
    seed: int,
    scenarios: dict[str, Scenario] = SCENARIOS,
    groups: Callable[[list[dict[str, Any]], str], Iterator[list[dict[str, Any]]]] = _by_kind,
) -> None:
    for mine in groups(rows, f"{orders} draws each"):
        print(
            "\nMean relative error of the time predictions of a family after k calibration "
            "rows of the other families (always corrected, or as --record auto decides):\n"
        )
        print("| scenario | k | no refit | always | auto | auto took it |")
        print("|---|---|---|---|---|---|")
        for scenario, shift in scenarios.items():
            res = replay_calibration(mine, shift, orders, seed)
            for k in CALIBRATION_STEPS:
                print(
                    f"| {scenario} | {k} | {100 * res['no refit'][k]:.1f}% | "
                    f"{100 * res['always'][k]:.1f}% | {100 * res['auto'][k]:.1f}% | "
                    f"{100 * res['taken'][k]:.0f}% |"
                )


if __name__ == "__main__":
    main()
