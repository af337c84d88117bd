"""Which features the learned model needs: NSM and graph2vec, held out by family and within.

The design feeds CatBoost three kinds of structure: the node-sequence matrix (NSM,
operator-pair counts along the graph), a graph2vec embedding of the operator graph, and
the hyperparameters with the analytic figures (the dry run's FLOPs, bytes, simulated
allocator peak and op-level time sum) and the device. This script fits the cost model
four ways on the GPU rows and says what each part is worth:

- **analytic + hyperparameters**: no NSM and no embedding;
- **+ NSM**: the shipped features;
- **+ graph2vec**: the embedding instead of NSM;
- **+ NSM + graph2vec**: both.

Each is scored two ways, with the settings of ``benchmarks/accuracy.py`` (400 trees,
seed 0, cross-conformal bounds at 95%):

- **held out by family**: each family predicted by a model fitted on the other families
  alone, its embedding too (``accuracy._graph2vec_features``): what a user's new
  architecture gets;
- **within families**: five folds of configurations, drawn at random, each configuration
  (its model, optimizer, precision and input, apart from the batch size) in one fold
  with all its batch sizes and GPUs: the families were seen, the configuration was not.
  This is what the online refit inside a study meets, where one architecture comes back
  with other hyperparameters.

The unfitted analytic estimate (simulated peak, roofline time) is a row of its own. The
results of each (features, split) are kept in ``--results`` so that a run that was cut
off goes on where it stopped.

Usage:
    python benchmarks/ablation.py [DATA.jsonl.gz ...] [--update-docs]

With no DATA it reads the GPU files the shipped model learned from
(``data/gpu/h*-shard*.jsonl.gz`` and ``data/gpu/*-ops-*.jsonl.gz``). ``--update-docs`` writes the section
between the ablation markers of ``docs/accuracy.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import accuracy

ROOT = accuracy.ROOT
START = "<!-- ablation:start -->"
END = "<!-- ablation:end -->"
#: name -> (NSM features kept, graph2vec embedding added)
VARIANTS: dict[str, tuple[bool, bool]] = {
    "analytic + hyperparameters": (False, False),
    "+ NSM (shipped)": (True, False),
    "+ graph2vec": (False, True),
    "+ NSM + graph2vec": (True, True),
}
#: how the rows are split: leave-family-out, or random folds of configurations
SPLITS = ("family", "configuration")
_DEFAULT_RESULTS = Path(tempfile.gettempdir()) / "costaware-ablation"


def without_nsm(features: dict[str, float]) -> dict[str, float]:
    """``features`` less the NSM ones (operator-pair shares, edge and op-group counts)."""
    from costaware.core.features import nsm_feature_names

    nsm = set(nsm_feature_names())
    return {k: v for k, v in features.items() if k not in nsm}


def configuration_folds(keys: Sequence[str], folds: int, seed: int) -> dict[str, str]:
    """Each configuration key's fold (``"c0"`` .. ``"c<folds-1>"``): the distinct keys in a
    random order drawn from ``seed``, dealt out in turn, so that a configuration's rows
    (every batch size and GPU) fall in one fold and the folds differ in size by one key."""
    distinct = sorted(set(keys))
    order = np.random.default_rng(seed).permutation(len(distinct))
    return {distinct[int(j)]: f"c{i % folds}" for i, j in enumerate(order)}


def _refeature(keep_nsm: bool, graph2vec: accuracy.Refeature | None) -> accuracy.Refeature | None:
    """A fold's features for a variant: the embedding added (fitted on the fold's training
    graphs), the NSM features dropped."""
    if keep_nsm:
        return graph2vec
    import dataclasses

    def refeature(train: list[Any], test: list[Any]) -> tuple[list[Any], list[Any]]:
        if graph2vec is not None:
            train, test = graph2vec(train, test)

        def drop(os_: list[Any]) -> list[Any]:
            return [dataclasses.replace(o, features=without_nsm(o.features)) for o in os_]

        return drop(train), drop(test)

    return refeature


def _summary(res: dict[str, Any]) -> dict[str, Any]:
    """What the tables need of an :func:`accuracy._evaluate` result (JSON-safe)."""
    keep = ("n", "mem_n", "mem_mre", "mem_mdre", "time_mre", "time_mdre", "time_cov",
            "mem_cov", "a_mem_mre", "a_time_mre", "time_bias")  # fmt: skip
    return {
        "overall": {k: res["overall"][k] for k in keep},
        "families": {f: {k: s[k] for k in keep} for f, s in res["families"].items()},
    }


def best_variant(results: dict[str, dict[str, Any]], split: str = "family") -> str:
    """The variant with the lowest iteration-time MRE under ``split``."""
    return min(results, key=lambda v: results[v][split]["overall"]["time_mre"])


def markdown(results: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    """The ablation section of ``docs/accuracy.md``."""
    pct = accuracy._pct
    some = next(iter(results.values()))  # the row counts and the unfitted estimate's errors
    first = some["family"]["overall"]
    lines = [
        START,
        "## What each part of the features is worth (ablation)",
        "",
        f"Generated by `python benchmarks/ablation.py --update-docs` on {meta['date']} from "
        f"{', '.join(meta['files'])} ({first['n']} GPU rows, feature version "
        f"{meta['feature_version']}), with the settings of the sections above "
        f"({meta['iterations']} trees, seed {meta['seed']}). *Held out by family*: each "
        "family predicted by a model fitted on the others, the graph2vec embedding fitted on "
        "their graphs alone. *Within families*: "
        f"{meta['folds']} random folds of configurations (a configuration's every batch size "
        "and GPU in one fold): the family was seen, the configuration was not, as in the "
        "online refit inside a study. *analytic* is the unfitted estimate (simulated "
        "allocator peak, roofline time). Memory is learned as a line over the simulated "
        "peak, which uses none of these features, so its column shows that the parts move "
        "only the time.",
        "",
        "| features | by family: time MRE | median | time cov | mem MRE "
        "| within families: time MRE | median | time cov | mem MRE |",
        "|" + "---|" * 9,
        f"| analytic (unfitted) | {pct(first['a_time_mre'])} | | | {pct(first['a_mem_mre'])} "
        f"| {pct(some['configuration']['overall']['a_time_mre'])} "
        "| | | |",
    ]
    for name, by_split in results.items():
        f, c = by_split["family"]["overall"], by_split["configuration"]["overall"]
        lines.append(
            f"| {name} | {pct(f['time_mre'])} | {pct(f['time_mdre'])} | {pct(f['time_cov'])} "
            f"| {pct(f['mem_mre'])} | {pct(c['time_mre'])} | {pct(c['time_mdre'])} "
            f"| {pct(c['time_cov'])} | {pct(c['mem_mre'])} |"
        )
    families = sorted(some["family"]["families"])
    lines += [
        "",
        "Iteration-time MRE by family, held out by family:",
        "",
        "| family | " + " | ".join(results) + " |",
        "|" + "---|" * (len(results) + 1),
    ]
    for fam in families:
        cells = [pct(r["family"]["families"][fam]["time_mre"]) for r in results.values()]
        lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    by_family, within = best_variant(results, "family"), best_variant(results, "configuration")
    shipped = "+ NSM (shipped)"
    lines += [
        "",
        f"Best held out by family: **{by_family}** "
        f"({pct(results[by_family]['family']['overall']['time_mre'])} against the shipped "
        f"features' {pct(results[shipped]['family']['overall']['time_mre'])}). "
        f"Best within families: **{within}** "
        f"({pct(results[within]['configuration']['overall']['time_mre'])} against "
        f"{pct(results[shipped]['configuration']['overall']['time_mre'])}).",
        END,
    ]
    return "\n".join(lines)


def _result_name(variant: str, split: str) -> str:
    """The file a (variant, split) result is kept in."""
    slug = variant.strip("+ ").replace(" ", "-").replace("(", "").replace(")", "")
    return f"{split}-{slug}.json"


def _cache_key(files: Sequence[Path], meta: dict[str, Any]) -> str:
    """What a kept result depends on: the data's bytes, the features and the settings."""
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.read_bytes())
    for k in ("feature_version", "iterations", "seed", "folds"):
        h.update(f"{k}={meta[k]}".encode())
    return h.hexdigest()[:16]


def run(
    obs: list[Any],
    rows: list[dict[str, Any]],
    settings: dict[str, Any],
    meta: dict[str, Any],
    results_dir: Path,
    graph2vec: Callable[[], accuracy.Refeature],
    splits: Sequence[str] = SPLITS,
    variants: Sequence[str] = tuple(VARIANTS),
) -> dict[str, dict[str, Any]]:
    """Every (variant, split) kept in ``results_dir`` read back (another process's too),
    and those of ``variants`` under ``splits`` that are not there evaluated (the graph2vec
    embedding of a fold is fitted once for the variants that share it)."""
    key = accuracy._graph_key_of(rows)
    folds = configuration_folds([key(o) for o in obs], meta["folds"], meta["seed"])
    fold_of: dict[str, Callable[[Any], str] | None] = {
        "family": None,
        "configuration": lambda o: folds[key(o)],
    }
    g2v: accuracy.Refeature | None = None
    out: dict[str, dict[str, Any]] = {}
    for split in SPLITS:
        for name, (keep_nsm, with_g2v) in VARIANTS.items():
            path = results_dir / _result_name(name, split)
            if path.is_file():
                out.setdefault(name, {})[split] = json.loads(path.read_text())
                continue
            if split not in splits or name not in variants:
                continue
            if with_g2v and g2v is None:
                g2v = graph2vec()
            t = time.perf_counter()
            print(f"{name}, {split}:", file=sys.stderr)
            res = accuracy._evaluate(
                obs,
                "gpu",
                settings,
                _refeature(keep_nsm, g2v if with_g2v else None),
                fold_of[split],
            )
            out.setdefault(name, {})[split] = summary = _summary(res)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(summary))
            print(
                f"  time MRE {accuracy._pct(summary['overall']['time_mre'])} "
                f"({time.perf_counter() - t:.0f}s)",
                file=sys.stderr,
            )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "data", nargs="*", help="jsonl.gz files (default: the shipped model's GPU files)"
    )
    p.add_argument("--iterations", type=int, default=400, help="CatBoost trees per fit")
    p.add_argument("--threads", type=int, default=2, help="CatBoost threads")
    p.add_argument("--seed", type=int, default=0, help="CatBoost's seed and the folds'")
    p.add_argument("--folds", type=int, default=5, help="folds of the within-family split")
    p.add_argument(
        "--cache",
        default=str(accuracy._DEFAULT_CACHE),
        help="the features cache of benchmarks/accuracy.py (the graphs are kept beside it)",
    )
    p.add_argument(
        "--results",
        default=str(_DEFAULT_RESULTS),
        help="folder for each (features, split) result, read back by a later run",
    )
    p.add_argument(
        "--splits",
        default=",".join(SPLITS),
        help="the splits to evaluate, comma-separated (default both; two processes can "
        "share --results, one per split)",
    )
    p.add_argument(
        "--no-graph2vec",
        action="store_true",
        help="only the variants without the embedding (minutes, not an hour: how much of a "
        "difference between them is the seed's, with --seed)",
    )
    p.add_argument("--trace-timeout", type=float, default=600.0, help="seconds per dry run")
    p.add_argument(
        "--update-docs", action="store_true", help="write the section into docs/accuracy.md"
    )
    args = p.parse_args(argv)
    splits = [x.strip() for x in args.splits.split(",") if x.strip()]
    if not splits or not set(splits) <= set(SPLITS):
        p.error(f"--splits takes {' and/or '.join(SPLITS)}, got {args.splits!r}")
    if args.folds < 2:
        p.error(f"--folds must be at least 2, got {args.folds}")
    from costaware.core.features import FEATURE_VERSION

    gpu = ROOT / "data" / "gpu"
    files = [Path(f) for f in args.data] or sorted(
        [*gpu.glob("h*-shard*.jsonl.gz"), *gpu.glob("*-ops-*.jsonl.gz")]
    )
    if not files:
        print("no data files: see data/README.md", file=sys.stderr)
        return 2
    cache = Path(args.cache)
    rows, obs, skipped = accuracy._gpu_observations(files, cache, args.trace_timeout)
    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "files": [accuracy._rel(f) for f in files],
        "feature_version": FEATURE_VERSION,
        "iterations": args.iterations,
        "seed": args.seed,
        "folds": args.folds,
    }
    settings = {
        "iterations": args.iterations,
        "thread_count": args.threads,
        "time_baseline": "optime",
        "random_state": args.seed,
        "memory_model": "line",
    }
    measured = {accuracy._obs_key(o) for o in obs}
    used = [r for r in rows if accuracy._key(r) in measured]
    results_dir = Path(args.results) / _cache_key(files, meta)
    results = run(
        obs,
        used,
        settings,
        meta,
        results_dir,
        lambda: accuracy._graph2vec_features(
            used, cache.with_name("graphs.json.gz"), args.trace_timeout
        ),
        splits,
        [v for v, (_, g2v) in VARIANTS.items() if not (g2v and args.no_graph2vec)],
    )
    missing = [(v, s) for v in VARIANTS for s in SPLITS if s not in results.get(v, {})]
    if missing:  # what there is, and no section until every variant and split is there
        for name, by_split in results.items():
            for split, res in by_split.items():
                o = res["overall"]
                print(
                    f"{name}, {split}: time MRE {accuracy._pct(o['time_mre'])} "
                    f"(median {accuracy._pct(o['time_mdre'])}), memory MRE "
                    f"{accuracy._pct(o['mem_mre'])}"
                )
        print(f"kept in {results_dir}; not yet run: " + "; ".join(f"{v}, {s}" for v, s in missing))
        return 0
    text = markdown(results, meta)
    if skipped:
        text = text.replace(
            END, f"\n{len(skipped)} rows were skipped: " + "; ".join(skipped[:10]) + "\n" + END
        )
    print(text)
    if args.update_docs:
        from _docs import splice

        splice(ROOT / "docs" / "accuracy.md", text, START, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
