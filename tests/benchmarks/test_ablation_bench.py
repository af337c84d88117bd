"""benchmarks/ablation.py: the variants' features, the within-family folds, the section."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import ablation  # noqa: E402
from _docs import splice  # noqa: E402

from costaware.core.features import nsm_feature_names  # noqa: E402


def test_without_nsm_drops_every_nsm_feature_and_keeps_the_rest() -> None:
    nsm = nsm_feature_names()
    feats = {name: 1.0 for name in nsm[:3] + nsm[-2:]} | {"gflops": 2.0, "batch_size": 8.0}
    assert ablation.without_nsm(feats) == {"gflops": 2.0, "batch_size": 8.0}


def test_a_configuration_falls_in_one_fold_and_the_folds_are_even() -> None:
    keys = [f"cfg{i % 23}" for i in range(200)]  # 23 configurations, several rows each
    folds = ablation.configuration_folds(keys, 5, seed=0)
    assert set(folds) == set(keys)
    sizes = sorted(list(folds.values()).count(f"c{i}") for i in range(5))
    assert sizes == [4, 4, 5, 5, 5]
    assert folds == ablation.configuration_folds(list(reversed(keys)), 5, seed=0)
    assert folds != ablation.configuration_folds(keys, 5, seed=1)


def _summary(time_mre: float) -> dict[str, Any]:
    s = {
        "n": 10, "mem_n": 8, "mem_mre": 0.04, "mem_mdre": 0.03, "time_mre": time_mre,
        "time_mdre": time_mre / 2, "time_cov": 0.95, "mem_cov": 0.95, "a_mem_mre": 0.05,
        "a_time_mre": 0.5, "time_bias": 0.0,
    }  # fmt: skip
    return {"overall": s, "families": {"mlp": s, "vgg": s}}


def test_the_section_names_the_best_features_from_the_figures(tmp_path: Path) -> None:
    results = {
        name: {"family": _summary(f), "configuration": _summary(c)}
        for name, f, c in zip(
            ablation.VARIANTS, (0.20, 0.16, 0.18, 0.17), (0.15, 0.12, 0.08, 0.09), strict=True
        )
    }
    assert ablation.best_variant(results, "family") == "+ NSM (shipped)"
    assert ablation.best_variant(results, "configuration") == "+ graph2vec"
    meta = {"date": "d", "files": ["a"], "feature_version": "21", "iterations": 400,
            "seed": 0, "folds": 5}  # fmt: skip
    text = ablation.markdown(results, meta)
    assert text.startswith(ablation.START) and text.endswith(ablation.END)
    assert "Best held out by family: **+ NSM (shipped)** (16.0%" in text
    assert "Best within families: **+ graph2vec** (8.0% against 12.0%)" in text
    assert "| mlp | 20.0% | 16.0% | 18.0% | 17.0% |" in text

    doc = tmp_path / "accuracy.md"
    doc.write_text("# Accuracy\n\nbefore\n")
    splice(doc, text, ablation.START, ablation.END)
    splice(doc, text.replace("16.0%", "15.0%"), ablation.START, ablation.END)
    out = doc.read_text()
    assert out.count(ablation.START) == 1 and "before" in out and "(15.0%" in out
