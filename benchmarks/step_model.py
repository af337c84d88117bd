"""The GPU step model alone, held out by family: which form of it carries to a family it
never saw.

The time residual of a GPU is learned over a step model
(:class:`costaware.core.step_models._Dispatch`): the op-level kernel time against the
CPU's issue time, with constants fitted on whole-model timings. This script scores that
step model alone, with no learned correction on top, in four forms:

- **max**: the larger of the kernel and the issue time, the issue time counting kernels
  and parameter tensors (the form before views and softness were modelled);
- **max + views**: the issue time also pays for each view (``ops:shape``), an op that
  launches no kernel;
- **soft max**: ``(k^p + i^p)^(1/p)`` with p fitted, for the part of the two pipelines
  that does not overlap;
- **soft max + views**: both (the shipped form).

Each family is predicted by constants fitted on the other families' rows. Choosing the
form by these held-out figures would be choosing on the test set, so a nested figure
goes with them: for each held-out family, the form is chosen by grouped cross-validation
over the other families alone (``--inner-folds`` groups of families), and that choice
predicts the held-out family. That is the error of the procedure that picked the shipped
form, not of the form picked with every family in view.

Usage:
    python benchmarks/step_model.py [DATA.jsonl.gz ...] [--cache FILE] [--inner-folds 4]

With no DATA it reads the GPU files the shipped model learned from
(``data/gpu/h*-shard*.jsonl.gz``, ``data/gpu/h200-small-seed0.jsonl.gz`` and the op
timings, ``data/gpu/*-ops-*.jsonl.gz``). Features come from the accuracy benchmark's
cache (``--cache``); a row without one is dry-run first.
"""

from __future__ import annotations

import argparse
import glob
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import accuracy

ROOT = accuracy.ROOT
#: name -> (views in the issue time, soft maximum)
FORMS: dict[str, tuple[bool, bool]] = {
    "max": (False, False),
    "max + views": (True, False),
    "soft max": (False, True),
    "soft max + views (shipped)": (True, True),
}
_DEFAULT_DATA = (
    "data/gpu/h*-shard*.jsonl.gz",
    "data/gpu/h200-small-seed0.jsonl.gz",
    "data/gpu/*-ops-*.jsonl.gz",
)


def step_rows(obs: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The step model's rows (:meth:`_Dispatch.row`), measured seconds and families of the
    timed observations (a GPU's) that have every feature it needs."""
    from costaware.core.step_models import _Dispatch

    rows, secs, fams = [], [], []
    for o in obs:
        row = _Dispatch.row(o.features)
        if row is None or not o.iteration_time:
            continue
        rows.append(row)
        secs.append(o.iteration_time)
        fams.append(o.family)
    return np.asarray(rows, dtype=np.float64), np.asarray(secs), np.asarray(fams)


def _fit_predict(
    form: str, rows: np.ndarray, secs: np.ndarray, train: np.ndarray, test: np.ndarray
) -> np.ndarray:
    """``form``'s step model fitted on the ``train`` rows, its relative errors on ``test``."""
    from costaware.core.step_models import _Dispatch

    views, soft = FORMS[form]
    x = rows.copy()
    if not views:
        x[:, _Dispatch.INPUTS.index("ops:shape")] = 0.0  # no view is paid for
    model = _Dispatch.fit(x[train], secs[train], soft=soft)
    predicted = model._ms(x[test]) / 1e3
    errors: np.ndarray = np.abs(predicted / secs[test] - 1.0)
    return errors


def held_out(form: str, rows: np.ndarray, secs: np.ndarray, fams: np.ndarray) -> np.ndarray:
    """Each row's relative error, predicted by ``form`` fitted on the other families."""
    errors = np.zeros(len(secs))
    for fam in np.unique(fams):
        test = fams == fam
        errors[test] = _fit_predict(form, rows, secs, ~test, test)
    return errors


def nested(
    rows: np.ndarray, secs: np.ndarray, fams: np.ndarray, inner_folds: int, seed: int = 0
) -> tuple[np.ndarray, dict[str, str]]:
    """Each row's relative error under the form chosen without its family, and the form
    chosen for each family: the lowest mean error over ``inner_folds`` groups of the other
    families (drawn from ``seed``), each group predicted by a fit on the rest."""
    rng = np.random.default_rng(seed)
    errors = np.zeros(len(secs))
    chosen: dict[str, str] = {}
    for fam in np.unique(fams):
        others = [str(f) for f in np.unique(fams) if f != fam]
        order = [others[int(i)] for i in rng.permutation(len(others))]
        groups = [set(order[i::inner_folds]) for i in range(inner_folds)]
        outer = fams != fam
        score = {}
        for form in FORMS:
            inner = []
            for g in groups:
                val = np.isin(fams, list(g))
                inner.append(_fit_predict(form, rows, secs, outer & ~val, val))
            score[form] = float(np.mean(np.concatenate(inner)))
        best = min(score, key=score.__getitem__)
        chosen[str(fam)] = best
        test = fams == fam
        errors[test] = _fit_predict(best, rows, secs, outer, test)
    return errors, chosen


def markdown(
    errors: dict[str, np.ndarray], fams: np.ndarray, chosen: dict[str, str], command: str
) -> str:
    """The table: each form's held-out error overall and by family, and the nested one."""
    pct = accuracy._pct
    names = [n for n in errors if n != "nested"]
    lines = [
        f"`{command}`: the GPU step model alone (no learned correction), {len(fams)} rows, "
        "each family predicted by constants fitted on the others (mean relative error; "
        "median in brackets). *Nested*: the form chosen without the family, by grouped "
        "cross-validation over the others.",
        "",
        "| family | n | " + " | ".join(names) + " | nested (form chosen) |",
        "|---|---|" + "---|" * (len(names) + 1),
    ]
    for fam in np.unique(fams):
        m = fams == fam
        cells = [pct(float(np.mean(errors[n][m]))) for n in names]
        cells.append(f"{pct(float(np.mean(errors['nested'][m])))} ({chosen.get(str(fam), '')})")
        lines.append(f"| {fam} | {int(m.sum())} | " + " | ".join(cells) + " |")
    cells = [f"{pct(float(np.mean(e)))} ({pct(float(np.median(e)))})" for e in errors.values()]
    lines.append(f"| **overall** | {len(fams)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("data", nargs="*", help="jsonl.gz files (default: the shipped GPU data)")
    p.add_argument(
        "--cache",
        default=str(accuracy._DEFAULT_CACHE),
        help="the features cache of benchmarks/accuracy.py",
    )
    p.add_argument(
        "--inner-folds", type=int, default=4, help="groups of families the nested choice uses"
    )
    p.add_argument("--seed", type=int, default=0, help="how the inner groups are drawn")
    p.add_argument("--trace-timeout", type=float, default=600.0, help="seconds per dry run")
    args = p.parse_args(argv)
    if args.inner_folds < 2:
        p.error("--inner-folds must be at least 2")

    names = args.data or sorted({f for pat in _DEFAULT_DATA for f in glob.glob(str(ROOT / pat))})
    _, obs, _ = accuracy._gpu_observations(
        [Path(f) for f in names], Path(args.cache), args.trace_timeout
    )
    rows, secs, fams = step_rows(obs)
    if len(np.unique(fams)) < args.inner_folds + 1:
        p.error(f"{len(np.unique(fams))} families: too few for {args.inner_folds} inner folds")
    errors = {form: held_out(form, rows, secs, fams) for form in FORMS}
    errors["nested"], chosen = nested(rows, secs, fams, args.inner_folds, args.seed)
    command = " ".join(["python benchmarks/step_model.py", *map(accuracy._rel, args.data)])
    print(markdown(errors, fams, chosen, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
