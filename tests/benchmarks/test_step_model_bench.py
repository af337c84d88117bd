"""benchmarks/step_model.py: the GPU step model's forms, held out by family and nested."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import step_model  # noqa: E402

from costaware.core.step_models import _Dispatch  # noqa: E402


def _steps(n_per: int = 15, families: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps timed as a soft maximum that pays for views, families apart by their sizes."""
    rng = np.random.default_rng(0)
    rows, fams = [], []
    for f in range(families):
        for _ in range(n_per):
            fwd = float(rng.integers(20, 1500))
            rows.append(
                [
                    float(np.exp(rng.uniform(np.log(0.05), np.log(200.0)))),
                    fwd,
                    fwd * rng.uniform(1.2, 2.5),
                    float(rng.integers(3, 12)),
                    float(rng.integers(4, 700)),
                    fwd * rng.uniform(0.0, 1.5),  # views
                    float(rng.random() < 0.5),
                ]
            )
            fams.append(f"f{f}")
    x = np.asarray(rows)
    truth = _Dispatch(0.9, 0.05, 0.012, 0.06, 0.3, 0.01, 1.25, 1.1, view_ms=0.02, softness=0.3)
    secs = truth._ms(x) / 1e3 * np.exp(rng.normal(0, 0.02, len(x)))
    return x, secs, np.asarray(fams)


def test_the_form_that_made_the_steps_predicts_held_out_families_best() -> None:
    rows, secs, fams = _steps()
    errors = {form: step_model.held_out(form, rows, secs, fams) for form in step_model.FORMS}
    assert all(len(e) == len(secs) and np.all(e >= 0) for e in errors.values())
    shipped = float(np.mean(errors["soft max + views (shipped)"]))
    assert shipped < 0.05  # the steps' own noise is 2%
    assert shipped < min(float(np.mean(errors[f])) for f in ("max", "max + views", "soft max"))


def test_the_nested_choice_is_made_without_the_held_out_family() -> None:
    rows, secs, fams = _steps()
    errors, chosen = step_model.nested(rows, secs, fams, inner_folds=2)
    assert sorted(chosen) == sorted(set(fams.tolist()))
    assert set(chosen.values()) <= set(step_model.FORMS)
    # each family's error is that of the form chosen for it, fitted on the other families
    for fam, form in chosen.items():
        m = fams == fam
        np.testing.assert_allclose(
            errors[m], step_model._fit_predict(form, rows, secs, ~m, m), rtol=1e-12
        )
