"""Side-by-side HPO benchmark: how much compute does costaware save in a real study?

Four arms run the same Optuna TPE study (same objective, search space, sampler seed and
trial count) on this CPU, where a trial really runs out of memory:

- ``baseline``: plain TPE; an out-of-memory error is caught with ``catch=`` and the
  trial ends as FAIL (what most users do);
- ``baseline-pruned``: the out-of-memory error (or the time-budget breach) becomes
  ``optuna.TrialPruned``, as Optuna's maintainers advise, so TPE learns from it;
- ``costaware``: ``CostAwarePruner`` with the shipped model (``CostModel.default()``)
  rejects trials before they start, costaware's Lightning callback records what every
  admitted trial really cost into an ``ObservationStore``, and ``OnlineRefit`` refits
  the model on those measurements every 5 measured trials (the defaults);
- ``oracle``: knows every configuration's true feasibility (from the ground-truth table
  below) and never spends compute on an infeasible trial: the physical limit.

Each trial trains a small Transformer sequence classifier with Lightning (2 epochs) in a
process forked from a fork server, whose address space is capped with
``setrlimit(RLIMIT_AS)`` at a measured baseline (the address space of a process that ran
a tiny configuration through the same code) plus the memory budget: an over-budget trial
fails with ``DefaultCPUAllocator: can't allocate memory``. An epoch that runs past
``max_epoch_time`` is stopped (the same check in every arm) and counts as waste.

Ground truth: every run's outcome is kept per *cost key* (the parameters that decide
memory and time: everything but the learning rate) in ``ground_truth.json`` in the work
directory. The oracle reads it (a configuration nobody ran yet is run, and not charged to
the oracle if it turns out infeasible); trials the costaware arm rejected are run
afterwards, uncharged, to count false rejections.

Run: ``python benchmarks/hpo.py --seeds 3 --trials 24 --out docs/benchmarks.md``
(7-8 minutes on 2 shared cores); ``--quick`` for a smoke run of well under a minute.
``--actuals address-space`` makes the costaware arm record the address-space peak itself
instead of through the Lightning callback (to separate the callback's CPU measurement
from the rest of costaware).

``--gpu`` runs the GPU mode instead (``benchmarks/_hpo_gpu.py``): GPT and ResNet trials
of tens of seconds on a GPU under a simulated smaller card, the same arms plus Lightning's
BatchSizeFinder, resumable from a JSONL file (``python benchmarks/hpo.py --gpu --help``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import functools
import json
import math
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

ARMS = ("baseline", "baseline-pruned", "costaware", "oracle")
#: the order the arms run in, per seed: the baselines fill the ground-truth table first
RUN_ORDER = ("baseline", "baseline-pruned", "oracle", "costaware")
SPACE: dict[str, list[Any]] = {
    "width": [16, 32, 64, 128],
    "depth": [1, 2, 4],
    "seq_len": [16, 32, 64, 128],
    "batch_size": [16, 32, 64, 128],
    "precision": ["fp32", "bf16"],
    "optimizer": ["adamw", "sgd"],
}
LR_RANGE = (1e-4, 1e-1)
COST_KEYS = tuple(SPACE)  # memory and time do not depend on the learning rate
#: the smallest configuration: its address-space peak is the baseline of every cap
TINY = {
    "width": 16,
    "depth": 1,
    "seq_len": 16,
    "batch_size": 16,
    "precision": "fp32",
    "optimizer": "adamw",
    "lr": 1e-3,
}
#: the configuration whose epoch time sets ``--max-epoch-time auto``
REFERENCE = {
    "width": 32,
    "depth": 2,
    "seq_len": 64,
    "batch_size": 32,
    "precision": "fp32",
    "optimizer": "adamw",
    "lr": 1e-3,
}
WASTE = ("oom", "crash", "timeout", "stopped")
MiB = 2**20


# --------------------------------------------------------------------------------------
# running one trial in a capped process
# --------------------------------------------------------------------------------------
class Runner:
    """Runs configurations in processes forked from a fork server that imported torch,
    Lightning and costaware once (so a trial starts in milliseconds, not seconds)."""

    def __init__(self, threads: int, max_epoch_time: float) -> None:
        # set before the fork server starts: it and every trial process inherit them
        os.environ["MALLOC_ARENA_MAX"] = "1"  # no 64 MiB arena reservations per thread
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = str(HERE) + (os.pathsep + old if old else "")
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(["_hpo_trial"])
        self.threads = threads
        self.max_epoch_time = max_epoch_time
        self.limit: int | None = None
        self.runs = 0
        self.seconds = 0.0

    def _spawn(self, target: Callable[..., None], args: tuple[Any, ...], timeout: float) -> Any:
        """Run ``target(conn, *args)`` in a forked process; (what it sent, its exit code)."""
        r, w = self.ctx.Pipe(duplex=False)
        p = self.ctx.Process(target=target, args=(w, *args), daemon=True)
        p.start()
        w.close()
        res = None
        try:
            if r.poll(timeout):
                res = r.recv()
        except (EOFError, OSError):
            res = None
        finally:
            r.close()
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()
        return res, p.exitcode

    def run(
        self,
        params: dict[str, Any],
        *,
        limit: int | str | None = "default",
        costaware: dict[str, Any] | None = None,
        max_epoch_time: float | None = None,
    ) -> dict[str, Any]:
        """Train ``params`` in a fresh capped process; the result and its wall time."""
        import _hpo_trial

        cap = self.limit if limit == "default" else limit
        met = max_epoch_time if max_epoch_time is not None else self.max_epoch_time
        settings = {
            "limit": cap,
            "threads": self.threads,
            "max_epoch_time": met,
            "costaware": costaware,
        }
        hard = 60.0 + 4 * met * _hpo_trial.EPOCHS
        t0 = time.perf_counter()
        res, code = self._spawn(_hpo_trial.child_main, (dict(params), settings), hard)
        wall = time.perf_counter() - t0
        if res is None:  # killed by a signal (an allocation failure inside C++), or hung
            res = {"status": "crash", "error": f"trial process ended with exit code {code}"}
        res["compute_s"] = wall
        res.setdefault("epoch_times", [])
        self.runs += 1
        self.seconds += wall
        return res

    def probe(self, limit: int, sizes: list[int]) -> dict[str, Any]:
        import _hpo_trial

        res, code = self._spawn(_hpo_trial.probe_main, (limit, sizes), 120.0)
        return res if res is not None else {"error": f"exit code {code}", "results": []}


def as_peak(res: dict[str, Any], baseline: int) -> int | None:
    """Address-space peak of a trial above the baseline, in bytes."""
    peak = (res.get("vm_end") or {}).get("VmPeak")
    return None if peak is None else int(peak) - baseline


# --------------------------------------------------------------------------------------
# ground truth
# --------------------------------------------------------------------------------------
class GroundTruth:
    """What running each cost key really did: ``{key: [run, ...]}`` in a JSON file.

    A key is feasible when at least half of its runs (every arm's runs of it, at any
    learning rate) completed both epochs within the memory cap and the epoch-time budget;
    ``flaky()`` counts the keys whose runs disagree (timing noise near the budget).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs: dict[str, list[dict[str, Any]]] = {}
        if path.is_file():
            self.runs = json.loads(path.read_text())

    @staticmethod
    def key(params: dict[str, Any]) -> str:
        return json.dumps({k: params[k] for k in COST_KEYS}, sort_keys=True)

    def add(
        self, params: dict[str, Any], res: dict[str, Any], *, source: str, baseline: int
    ) -> None:
        self.runs.setdefault(self.key(params), []).append(
            {
                "status": res["status"],
                "source": source,
                "lr": params["lr"],
                "value": res.get("value"),
                "compute_s": round(res["compute_s"], 4),
                "epoch_times": [round(t, 4) for t in res.get("epoch_times", [])],
                "as_peak": as_peak(res, baseline),
                "error": res.get("error"),
            }
        )

    def feasible(self, key: str) -> bool | None:
        """Feasible when at least half of the key's runs completed within the budget
        (out of memory is deterministic; the epoch time is noisy on a shared machine)."""
        runs = self.runs.get(key)
        if not runs:
            return None
        return 2 * sum(r["status"] == "ok" for r in runs) >= len(runs)

    def flaky(self) -> tuple[int, int]:
        """(keys run more than once whose runs disagree on feasibility, keys run more than once)."""
        multi = [r for r in self.runs.values() if len(r) > 1]
        return sum(len({x["status"] == "ok" for x in r}) > 1 for r in multi), len(multi)

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.runs, indent=1))
        tmp.replace(self.path)


# --------------------------------------------------------------------------------------
# the study
# --------------------------------------------------------------------------------------
def suggest(trial: Any) -> dict[str, Any]:
    """The search space, in the same order for every arm."""
    params = {name: trial.suggest_categorical(name, choices) for name, choices in SPACE.items()}
    params["lr"] = trial.suggest_float("lr", *LR_RANGE, log=True)
    return params


def spec_fn(params: dict[str, Any]) -> Any:
    """The costaware TrainingSpec of a trial: the same model, batch and optimizer it runs."""
    import _hpo_trial

    import costaware as ca

    kwargs: dict[str, Any] = {"lr": params["lr"]}
    if params["optimizer"] == "sgd":
        kwargs["momentum"] = 0.9
    return ca.TrainingSpec(
        model=functools.partial(
            _hpo_trial.build_model, params["width"], params["depth"], params["seq_len"]
        ),
        batch=ca.TokenBatch(params["seq_len"], _hpo_trial.VOCAB),
        batch_size=params["batch_size"],
        optimizer=params["optimizer"],
        optimizer_kwargs=kwargs,
        precision=params["precision"],
        dataset_size=_hpo_trial.TRAIN_SIZE,
        epochs=_hpo_trial.EPOCHS,
        name=f"seqcls-w{params['width']}-d{params['depth']}",
    )


@dataclass
class Bench:
    """Settings and shared state of one benchmark run."""

    runner: Runner
    truth: GroundTruth
    workdir: Path
    max_memory: int
    max_epoch_time: float
    baseline: int
    trials: int
    startup: int
    progress: Callable[[str], None] = lambda _: None
    actuals: str = "callback"
    time_bound: str = "point"
    checks_s: float = 0.0  # uncharged ground-truth runs (oracle probes, false-rejection checks)
    notes: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)  # the shipped model, as each seed found it


def refit_summary(pruner: Any) -> dict[str, Any]:
    """What the costaware arm's online refit did over a study, once the refit in flight
    has finished (empty for an arm without one)."""
    if pruner is None or pruner.refit is None:
        return {}
    pruner.refit.wait()
    history = pruner.refit.history
    return {
        "refits": len(history),
        "refit_s": sum(h["seconds"] for h in history),
        "rows": [h["rows"] for h in history],
        "error": pruner.refit.last_error,
    }


#: the costaware prediction attributes a benchmark record keeps
PREDICTION_KEYS = (
    "peak_memory",
    "peak_memory_upper",
    "epoch_time",
    "epoch_time_upper",
    "model",
    "reason_kinds",
    "latency_ms",
    "error",
)


def judge(trial: Any, study: Any, pruner: Any, rec: dict[str, Any], keys: Sequence[str]) -> None:
    """The costaware arm's decision on ``trial``, as a user's objective makes it: the time
    it took and the prediction's ``keys`` into ``rec``; a rejected trial raises
    ``optuna.TrialPruned``; an admitted one waits for a refit in flight (which would slow
    the trial down)."""
    import optuna

    t0 = time.perf_counter()
    reject = trial.should_prune()
    rec["pred_s"] = time.perf_counter() - t0
    attrs = study._storage.get_trial_user_attrs(trial._trial_id)
    rec["prediction"] = {
        k.split(":", 1)[1]: v
        for k, v in attrs.items()
        if k.startswith("costaware:") and k.split(":", 1)[1] in keys
    }
    if reject:
        rec["status"] = "rejected"
        raise optuna.TrialPruned("rejected by costaware")
    if pruner.refit is not None:
        t0 = time.perf_counter()
        pruner.refit.wait()
        rec["refit_wait_s"] = time.perf_counter() - t0


def run_arm(bench: Bench, arm: str, seed: int) -> dict[str, Any]:
    """One arm's study for one seed: its per-trial records and costaware's bookkeeping."""
    import optuna

    import costaware as ca

    records: list[dict[str, Any]] = []
    budget = ca.Budget(
        max_memory=bench.max_memory,
        max_epoch_time=bench.max_epoch_time,
        time_bound=bench.time_bound,
    )
    pruner: Any = None
    store: Any = None
    store_url = None
    name = f"{arm}-seed{seed}"
    if arm == "costaware":
        from costaware.integrations.optuna import CostAwarePruner
        from costaware.runtime.store import ObservationStore

        db = bench.workdir / f"costaware-seed{seed}.db"
        store = ObservationStore(db)
        store_url = store.url
        model = ca.CostModel.default()  # the shipped model, loaded afresh for each seed
        bench.models.append(describe_model(model))
        pruner = CostAwarePruner(
            spec_fn=spec_fn, budget=budget, device="cpu", store=store, model=model
        )
    study = optuna.create_study(
        study_name=name,
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=bench.startup),
        pruner=pruner if pruner is not None else optuna.pruners.NopPruner(),
    )

    def objective(trial: optuna.Trial) -> float:
        params = suggest(trial)
        key = GroundTruth.key(params)
        rec: dict[str, Any] = {
            "number": trial.number,
            "params": params,
            "key": key,
            "status": None,
            "compute_s": 0.0,
            "pred_s": 0.0,
            "value": None,
        }
        records.append(rec)
        known = bench.truth.feasible(key)
        if arm == "costaware":
            judge(trial, study, pruner, rec, PREDICTION_KEYS)
        if arm == "oracle" and known is False:
            rec["status"] = "skipped"
            raise optuna.TrialPruned("infeasible (oracle)")
        costaware = None
        if arm == "costaware" and bench.actuals == "callback":
            # judge_before=False: the pruner judged this trial in the driver already. The
            # callback in the trial process gets the trial's number, not the Optuna trial
            # (which does not cross the fork), so it cannot see that, and would predict
            # the fit a second time inside the capped process: a second model load and dry
            # run under the address-space cap, which failed with std::bad_alloc there
            costaware = {
                "store": store_url,
                "study": name,
                "trial": trial.number,
                "budget": budget,
                "device": "cpu",
                "judge_before": False,
            }
        res = bench.runner.run(params, costaware=costaware)
        bench.truth.add(params, res, source=f"{arm}/seed{seed}", baseline=bench.baseline)
        status = res["status"]
        rec["as_peak"] = as_peak(res, bench.baseline)
        rec["epoch_times"] = res.get("epoch_times", [])
        rec["error"] = res.get("error")
        if arm == "oracle" and known is None and status != "ok":
            # the oracle would have known: this run only established the ground truth
            rec["status"] = "skipped"
            rec["probe_s"] = res["compute_s"]
            bench.checks_s += res["compute_s"]
            raise optuna.TrialPruned("infeasible (oracle)")
        rec["status"] = status
        rec["compute_s"] = res["compute_s"]
        if arm == "costaware" and bench.actuals == "address-space":
            record_actuals(store, name, trial.number, res, rec["as_peak"])
        elif arm == "costaware" and res.get("killed"):
            record_killed(store, name, trial.number, res)
        if status == "ok":
            rec["value"] = res["value"]
            return float(res["value"])
        if status == "error":
            bench.notes.append(f"{name} #{trial.number}: error {res.get('error')}")
        if arm == "baseline" or (arm == "costaware" and status in ("oom", "crash", "error")):
            raise RuntimeError(res.get("error") or status)  # caught by catch=: FAIL
        raise optuna.TrialPruned(res.get("error") or status)

    def tick(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        rec = records[-1] if records else {}
        bench.progress(f"seed {seed} {arm}: #{trial.number} {rec.get('status')}")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.optimize(
            objective,
            n_trials=bench.trials,
            catch=(RuntimeError, MemoryError),
            callbacks=[tick],
            gc_after_trial=False,
        )
        refit_info = refit_summary(pruner)
    bench.truth.save()
    return {"arm": arm, "seed": seed, "records": records, "refit": refit_info}


def describe_model(model: Any) -> str:
    """What ``CostModel.default()`` is, and what it means on this CPU."""
    analytic = (
        "dry run: the live-tensor peak with a 1.25x upper bound, the roofline time with a "
        "1/0.41 upper bound"
    )
    if not model.is_fitted:
        return f"analytic: `CostModel.default()` carries no learned model ({analytic})"
    t = model.training_
    what = (
        f"learned: {t.get('rows')} rows on {', '.join(t.get('devices', []))}, fitted "
        f"{t.get('date', '?')}, data hash `{t.get('data_hash', '?')}`"
    )
    if model.covers("cpu"):
        return what + "; it covers the CPU"
    return (
        what
        + f"; it does not cover the CPU, so on this machine it predicts the analytic estimate ({analytic})"
    )


def record_killed(store: Any, study: str, trial: int, res: dict[str, Any]) -> None:
    """A trial the watchdog ended mid-batch never reached the callback's ``on_exception``:
    record what it cost in its place (the measured batch times, a lower bound)."""
    with contextlib.suppress(Exception):
        epoch_times = res.get("epoch_times") or []
        store.record_measurement(
            study=study,
            trial=trial,
            status="stopped",
            actual={
                "iteration_time": res.get("iteration_time"),
                "epoch_time": epoch_times[-1] if epoch_times else None,
                "peak_memory": None,
                "device_kind": "cpu",
                "steps": res.get("steps"),
                "memory_method": "not measured (the benchmark's watchdog ended the process)",
            },
            device="CPU",
            epoch=max(0, len(epoch_times) - 1),
            reason=res.get("error"),
            meta={"source": "benchmarks/hpo.py watchdog"},
        )


def record_actuals(
    store: Any, study: str, trial: int, res: dict[str, Any], peak: int | None
) -> None:
    """``--actuals address-space``: record a trial's measured cost in the store as the
    Lightning callback would (one row per trial), with the address-space peak above the
    baseline (the figure the cap enforces) as its peak memory."""
    status = {"ok": "ok", "timeout": "stopped", "stopped": "stopped", "oom": "oom"}.get(
        res["status"], "error"
    )
    epoch_times = res.get("epoch_times") or []
    actual = {
        "peak_memory": None if status == "oom" or peak is None else max(0, peak),
        "iteration_time": res.get("iteration_time"),
        "epoch_time": statistics.median(epoch_times) if epoch_times else None,
        "device_kind": "cpu",
        "memory_method": "address-space peak above the baseline (VmPeak), benchmarks/hpo.py",
    }
    with contextlib.suppress(Exception):
        store.record_measurement(
            study=study,
            trial=trial,
            status=status,
            actual=actual,
            device="CPU",
            epoch=None,
            reason=res.get("error"),
            meta={"source": "benchmarks/hpo.py --actuals address-space"},
        )


def check_rejections(bench: Bench, result: dict[str, Any]) -> None:
    """Run, uncharged, every configuration the costaware arm rejected that nobody ran yet."""
    for rec in result["records"]:
        if rec["status"] != "rejected" or bench.truth.feasible(rec["key"]) is not None:
            continue
        res = bench.runner.run(rec["params"])
        bench.truth.add(
            rec["params"], res, source=f"check/seed{result['seed']}", baseline=bench.baseline
        )
        bench.checks_s += res["compute_s"]
        bench.progress(f"seed {result['seed']} checking a rejection: {res['status']}")
    bench.truth.save()


# --------------------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------------------
def curve(records: Sequence[dict[str, Any]]) -> list[tuple[float, float | None]]:
    """(compute spent so far, best value so far) after each trial."""
    spent, best, out = 0.0, None, []
    for rec in records:
        spent += rec["compute_s"] + rec["pred_s"]
        if rec["value"] is not None:
            best = rec["value"] if best is None else max(best, rec["value"])
        out.append((spent, best))
    return out


def best_at(points: Sequence[tuple[float, float | None]], budget: float) -> float | None:
    best = None
    for spent, value in points:
        if spent > budget + 1e-9:
            break
        best = value
    return best


def compute_to(points: Sequence[tuple[float, float | None]], target: float) -> float | None:
    for spent, value in points:
        if value is not None and value >= target - 1e-12:
            return spent
    return None


def seed_figures(
    bench: Any, results: dict[str, dict[str, Any]], arms: Sequence[str] = ARMS
) -> dict[str, dict[str, Any]]:
    """Per-arm figures of one seed (the ground truth is complete by now); ``bench`` needs
    only ``truth.feasible(key)``."""
    figs: dict[str, dict[str, Any]] = {}
    curves = {arm: curve(results[arm]["records"]) for arm in arms}
    totals = {arm: curves[arm][-1][0] if curves[arm] else 0.0 for arm in arms}
    equal = min(totals.values())
    base_best = max(
        (r["value"] for r in results["baseline"]["records"] if r["value"] is not None),
        default=None,
    )
    for arm in arms:
        recs = results[arm]["records"]
        ran = [r for r in recs if r["compute_s"] > 0]
        waste = [r for r in recs if r["status"] in WASTE]
        feas = [r for r in recs if bench.truth.feasible(r["key"]) is True]
        infeas = [r for r in recs if bench.truth.feasible(r["key"]) is False]
        rejected = [r for r in recs if r["status"] in ("rejected", "skipped")]
        false_rej = [r for r in rejected if bench.truth.feasible(r["key"]) is True]
        values = [r["value"] for r in recs if r["value"] is not None]
        pred = [r["pred_s"] for r in recs if r["pred_s"] > 0]
        ctb = compute_to(curves[arm], base_best) if base_best is not None else None
        figs[arm] = {
            "total_s": totals[arm],
            "trial_s": sum(r["compute_s"] for r in recs),
            "waste_s": sum(r["compute_s"] for r in waste),
            "waste_n": len(waste),
            "oom_n": sum(r["status"] in ("oom", "crash") for r in recs),
            "timeout_n": sum(r["status"] in ("timeout", "stopped") for r in recs),
            "ran_n": len(ran),
            "rejected_n": len(rejected),
            "false_rej_n": len(false_rej),
            "feasible_n": len(feas),
            "infeasible_n": len(infeas),
            "best": max(values) if values else None,
            "best_at_equal": best_at(curves[arm], equal),
            "equal_s": equal,
            "compute_to_best": ctb,
            "pred_mean_s": statistics.fmean(pred) if pred else None,
            "pred_median_s": statistics.median(pred) if pred else None,
            "pred_n": len(pred),
            "pred_all": pred,
            "trial_all": [r["compute_s"] for r in ran],
            "mean_trial_s": statistics.fmean([r["compute_s"] for r in ran]) if ran else None,
            "curve": curves[arm],
        }
        figs[arm]["waste_pct"] = (
            100 * figs[arm]["waste_s"] / totals[arm] if totals[arm] > 0 else 0.0
        )
    bw, bctb = figs["baseline"]["waste_s"], figs["baseline"]["compute_to_best"]
    for arm in arms:
        f = figs[arm]
        f["waste_saved_pct"] = 100 * (1 - f["waste_s"] / bw) if bw > 0 else None
        f["ctb_ratio"] = (
            f["compute_to_best"] / bctb if f["compute_to_best"] is not None and bctb else None
        )
        f["compute_ratio"] = f["total_s"] / totals["baseline"] if totals["baseline"] else None
    return figs


def mean_sd(values: Iterable[float | None]) -> tuple[float | None, float | None, int]:
    vals = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return None, None, 0
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return statistics.fmean(vals), sd, len(vals)


def fmt_ms(values: Iterable[float | None], digits: int = 1, unit: str = "", n: int = 0) -> str:
    m, s, k = mean_sd(values)
    if m is None:
        return "-"
    if round(m, digits) == 0:
        m = 0.0  # no "-0%"
    text = f"{m:.{digits}f}{unit} ± {s:.{digits}f}"
    if n and k < n:
        text += f" ({k}/{n})"
    return text


def summarize(
    per_seed: list[dict[str, dict[str, Any]]], arms: Sequence[str] = ARMS
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for arm in arms:
        rows = [s[arm] for s in per_seed]
        fr = sum(r["false_rej_n"] for r in rows)
        feas = sum(r["feasible_n"] for r in rows)
        pred = [p for r in rows for p in r["pred_all"]]
        trial = [t for r in rows for t in r["trial_all"]]
        out[arm] = {
            "rows": rows,
            "false_rej_n": fr,
            "feasible_n": feas,
            "false_rej_pct": 100 * fr / feas if feas else 0.0,
            "oom_n": sum(r["oom_n"] for r in rows),
            "pred_mean_s": statistics.fmean(pred) if pred else None,
            "pred_median_s": statistics.median(pred) if pred else None,
            "pred_max_s": max(pred) if pred else None,
            "trial_mean_s": statistics.fmean(trial) if trial else None,
        }
        if out[arm]["pred_mean_s"] is not None and out[arm]["trial_mean_s"]:
            out[arm]["overhead_pct"] = 100 * out[arm]["pred_mean_s"] / out[arm]["trial_mean_s"]
    return out


TABLE_COLUMNS = (
    "arm",
    "wasted compute (s)",
    "wasted %",
    "wasted trials",
    "OOM crashes",
    "rejected before running",
    "false rejections",
    "best val acc @ equal compute",
    "best val acc (all trials)",
    "total compute (s)",
    "waste saved vs baseline",
    "compute-to-best vs baseline",
)


def table_rows(
    summary: dict[str, dict[str, Any]], seeds: int, arms: Sequence[str] = ARMS
) -> list[list[str]]:
    rows = []
    for arm in arms:
        r = summary[arm]["rows"]
        s = summary[arm]
        fr = f"{s['false_rej_n']}/{s['feasible_n']} ({s['false_rej_pct']:.0f}%)"
        if arm in ("baseline", "baseline-pruned", "batch-size-finder"):
            fr = "-"
        saved = "-" if arm == "baseline" else fmt_ms([x["waste_saved_pct"] for x in r], 0, "%")
        ctb = "1.00" if arm == "baseline" else fmt_ms([x["ctb_ratio"] for x in r], 2, "x", n=seeds)
        rows.append(
            [
                arm,
                fmt_ms([x["waste_s"] for x in r]),
                fmt_ms([x["waste_pct"] for x in r], 0, "%"),
                fmt_ms([x["waste_n"] for x in r]),
                str(s["oom_n"]),
                fmt_ms([x["rejected_n"] for x in r]),
                fr,
                fmt_ms([x["best_at_equal"] for x in r], 3, n=seeds),
                fmt_ms([x["best"] for x in r], 3, n=seeds),
                fmt_ms([x["total_s"] for x in r]),
                saved,
                ctb,
            ]
        )
    return rows


def curve_rows(
    per_seed: list[dict[str, dict[str, Any]]], arms: Sequence[str] = ARMS
) -> list[list[str]]:
    """Best value (mean over seeds) at fractions of the baseline's total compute."""
    fracs = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
    rows = []
    for arm in arms:
        row = [arm]
        for frac in fracs:
            vals = [best_at(s[arm]["curve"], frac * s["baseline"]["total_s"]) for s in per_seed]
            m, _, k = mean_sd(vals)
            row.append("-" if m is None else f"{m:.3f}" + ("" if k == len(vals) else f" ({k})"))
        rows.append(row)
    return [["arm", *[f"{int(f * 100)}%" for f in fracs]], *rows]


def targets(summary: dict[str, dict[str, Any]], seeds: int) -> list[tuple[str, str, bool | None]]:
    """(target, figure, met) for each of issue 7's targets."""
    ca_rows = summary["costaware"]["rows"]
    out: list[tuple[str, str, bool | None]] = []
    saved, sd, _ = mean_sd([r["waste_saved_pct"] for r in ca_rows])
    out.append(
        (
            ">= 90% of the baseline's wasted compute avoided",
            "-" if saved is None else f"{saved:.0f}% ± {sd:.0f}",
            None if saved is None else saved >= 90,
        )
    )
    oom = summary["costaware"]["oom_n"]
    out.append(("0 OOM crashes in the costaware arm", f"{oom}", oom == 0))
    frp = summary["costaware"]["false_rej_pct"]
    out.append(
        (
            "<= 5% false rejections (of the feasible trials proposed)",
            f"{summary['costaware']['false_rej_n']} of {summary['costaware']['feasible_n']} "
            f"({frp:.1f}%)",
            frp <= 5,
        )
    )
    ca_eq = [r["best_at_equal"] for r in ca_rows]
    b_eq = [r["best_at_equal"] for r in summary["baseline"]["rows"]]
    wins = sum(
        1 for c, b in zip(ca_eq, b_eq, strict=True) if c is not None and (b is None or c >= b)
    )
    mc, _, _ = mean_sd(ca_eq)
    mb, _, _ = mean_sd(b_eq)
    out.append(
        (
            "best value at equal compute >= baseline",
            f"{'-' if mc is None else f'{mc:.3f}'} vs {'-' if mb is None else f'{mb:.3f}'} "
            f"(mean); >= in {wins} of {seeds} seeds",
            None if mc is None else (mb is None or mc >= mb),
        )
    )
    ov = summary["costaware"].get("overhead_pct")
    pm = summary["costaware"]["pred_mean_s"]
    pmed = summary["costaware"]["pred_median_s"]
    tm = summary["costaware"]["trial_mean_s"]
    out.append(
        (
            "prediction overhead < 1% of the average trial's compute",
            "-"
            if ov is None or pm is None or tm is None
            else f"{ov:.1f}% ({pm * 1e3:.0f} ms mean, {pmed * 1e3:.0f} ms median per "
            f"prediction; {tm:.2f} s per trial that ran)",
            None if ov is None else ov < 1,
        )
    )

    def gaps(arm: str) -> tuple[float | None, float | None]:
        w = mean_sd(
            [
                a["waste_s"] - o["waste_s"]
                for a, o in zip(summary[arm]["rows"], summary["oracle"]["rows"], strict=True)
            ]
        )[0]
        b = mean_sd(
            [
                (o["best_at_equal"] - a["best_at_equal"])
                if a["best_at_equal"] is not None and o["best_at_equal"] is not None
                else None
                for a, o in zip(summary[arm]["rows"], summary["oracle"]["rows"], strict=True)
            ]
        )[0]
        return w, b

    g = {arm: gaps(arm) for arm in ("baseline", "baseline-pruned", "costaware")}
    cw, cb = g["costaware"]

    def closer(i: int) -> bool:
        c = g["costaware"][i]
        others = [g[a][i] for a in ("baseline", "baseline-pruned")]
        return c is not None and all(o is None or abs(c) <= abs(o) for o in others)

    text = "; ".join(
        f"{arm}: waste {g[arm][0]:+.1f} s, best@equal {'-' if g[arm][1] is None else f'{-g[arm][1]:+.3f}'}"
        for arm in g
        if g[arm][0] is not None
    )
    out.append(
        (
            "closer to the oracle than both baselines (wasted compute and best value at "
            "equal compute, gaps to the oracle)",
            text,
            (closer(0) and closer(1)) if cw is not None and cb is not None else None,
        )
    )
    return out


def diagnostics(bench: Bench, results: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """How the costaware arm's predictions compare with what the trials really did, by the
    kind of model that predicted (the shipped one, or an online refit of it)."""
    ratios: dict[str, dict[str, list[float]]] = {}
    kinds: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for res in results:
        for rec in res["costaware"]["records"]:
            pred = rec.get("prediction") or {}
            kind = pred.get("model", "?")
            kinds[kind] = kinds.get(kind, 0) + 1
            for why in pred.get("reason_kinds") or []:
                reasons[why] = reasons.get(why, 0) + 1
            r = ratios.setdefault(kind, {"mem": [], "mem_hi": [], "time": [], "time_hi": []})
            ok = [x for x in bench.truth.runs.get(rec["key"], []) if x["status"] == "ok"]
            peaks = [x["as_peak"] for x in ok if x["as_peak"] is not None]
            # peaks under 2 MiB are within the baseline's run-to-run noise
            if peaks and pred.get("peak_memory") and max(peaks) >= 2 * MiB:
                r["mem"].append(pred["peak_memory"] / max(peaks))
                r["mem_hi"].append(pred["peak_memory_upper"] / max(peaks))
            epochs = [t for x in ok for t in x["epoch_times"]]
            if epochs and pred.get("epoch_time"):
                ep = statistics.median(epochs)
                r["time"].append(pred["epoch_time"] / ep)
                r["time_hi"].append(pred["epoch_time_upper"] / ep)

    def q(v: list[float]) -> str:
        if not v:
            return "-"
        s = sorted(v)
        return (
            f"median {statistics.median(s):.2f}x, range {s[0]:.2f}-{s[-1]:.2f}x, "
            f"{sum(x < 1 for x in s)} of {len(s)} below 1"
        )

    by_kind = {
        kind: {name: q(values) for name, values in r.items()} for kind, r in sorted(ratios.items())
    }
    return {
        "model_kinds": kinds,
        "reject_reasons": reasons,
        "by_kind": by_kind,
        "callback_memory": callback_memory(bench, results),
        "arm_address_space": arm_address_space(bench),
    }


def arm_address_space(bench: Bench) -> str:
    """How much more address space the costaware arm's trial processes took than the other
    arms' for the same configuration (completed runs only): the Lightning callback's own
    memory (its profiler over the first batches, its store writes), which the cap counts
    and the prediction, of training's tensors, does not."""
    diffs: list[float] = []
    for runs in bench.truth.runs.values():
        ok = [r for r in runs if r["status"] == "ok" and r["as_peak"] is not None]
        mine = [r["as_peak"] for r in ok if r["source"].startswith("costaware/")]
        other = [r["as_peak"] for r in ok if not r["source"].startswith("costaware/")]
        if mine and other:
            diffs.append((statistics.median(mine) - statistics.median(other)) / MiB)
    if not diffs:
        return "-"
    s = sorted(diffs)
    return (
        f"median {statistics.median(s):+.1f} MiB (range {s[0]:+.1f} to {s[-1]:+.1f} MiB, "
        f"{len(s)} configurations that the costaware arm and another arm completed)"
    )


def callback_memory(bench: Bench, results: list[dict[str, dict[str, Any]]]) -> str:
    """The peak memory costaware's Lightning callback recorded for each completed trial
    (what the online refit learns from), against the address-space peak the cap saw."""
    from costaware.runtime.store import ObservationStore

    diffs: list[float] = []
    for res in results:
        seed = res["costaware"]["seed"]
        db = bench.workdir / f"costaware-seed{seed}.db"
        if not db.is_file():
            continue
        recorded: dict[str, float] = {}
        with contextlib.suppress(Exception):
            for m in ObservationStore(db).measurements(study=f"costaware-seed{seed}"):
                peak = (m.get("actual") or {}).get("peak_memory")
                if m["status"] in ("ok", "stopped") and peak is not None:
                    recorded[m["trial"]] = max(recorded.get(m["trial"], 0.0), float(peak))
        for rec in res["costaware"]["records"]:
            got = recorded.get(str(rec["number"]))
            if rec["status"] == "ok" and got is not None and rec.get("as_peak") is not None:
                diffs.append((got - rec["as_peak"]) / MiB)
    if not diffs:
        return "-"
    s = sorted(diffs)
    return (
        f"recorded minus address-space peak: median {statistics.median(s):+.1f} MiB "
        f"(range {s[0]:+.1f} to {s[-1]:+.1f} MiB, {len(s)} trials)"
    )


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    import lightning
    import optuna
    import torch

    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = "unknown"
    with contextlib.suppress(Exception):
        # the short hash, "-dirty" when the working tree differs from it (tags ignored)
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=7", "--exclude=*"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "optuna": optuna.__version__,
        "commit": commit,
        "platform": platform.platform(),
    }


def md_table(rows: list[list[str]], header: Sequence[str] | None = None) -> str:
    if header is not None:
        rows = [list(header), *rows]
    head, body = rows[0], rows[1:]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def print_report(report: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 200)
    table = Table(
        title=f"HPO benchmark: {report['seeds']} seeds x {report['trials']} trials per arm "
        f"(mean ± sd over seeds)",
        box=box.SIMPLE_HEAD,
    )
    for col in TABLE_COLUMNS:
        table.add_column(col, justify="left" if col == "arm" else "right")
    for row in report["table"]:
        table.add_row(*row)
    console.print(table)
    curve_table = Table(
        title="Best val acc (mean over seeds) at a share of the baseline's total compute",
        box=box.SIMPLE_HEAD,
    )
    for col in report["curve"][0]:
        curve_table.add_column(col, justify="left" if col == "arm" else "right")
    for row in report["curve"][1:]:
        curve_table.add_row(*row)
    console.print(curve_table)
    for name, figure, met in report["targets"]:
        mark = "[green]met[/green]" if met else ("[red]missed[/red]" if met is False else "n/a")
        console.print(f"  {mark}  {name}: {figure}", highlight=False)
    d = report["diagnostics"]
    console.print(
        f"  shipped model: {report['model']}; predictions by kind {d['model_kinds']}; "
        f"rejections by reason {d['reject_reasons']}",
        highlight=False,
    )
    for kind, r in d["by_kind"].items():
        console.print(
            f"  {kind}: predicted/measured peak memory {r['mem']} (upper bound {r['mem_hi']}); "
            f"epoch time {r['time']} (upper bound {r['time_hi']})",
            highlight=False,
        )
    console.print(f"  callback memory: {d['callback_memory']}", highlight=False)
    console.print(
        f"  costaware arm's address space minus the other arms': {d['arm_address_space']}",
        highlight=False,
    )
    console.print(
        f"  budget: {report['budget']}; wall time {report['wall_s']:.0f} s",
        highlight=False,
    )


def write_doc(path: Path, report: dict[str, Any]) -> None:
    m = report["machine"]
    d = report["diagnostics"]
    targets_md = "\n".join(
        f"| {name} | {figure} | {'met' if met else ('**missed**' if met is False else 'n/a')} |"
        for name, figure, met in report["targets"]
    )
    per_seed = []
    for i, seed in enumerate(report["seed_list"]):
        for arm in ARMS:
            f = report["per_seed"][i][arm]
            per_seed.append(
                [
                    str(seed),
                    arm,
                    f"{f['total_s']:.1f}",
                    f"{f['waste_s']:.1f}",
                    str(f["waste_n"]),
                    str(f["oom_n"]),
                    str(f["timeout_n"]),
                    str(f["rejected_n"]),
                    str(f["false_rej_n"]),
                    "-" if f["best"] is None else f"{f['best']:.3f}",
                    "-" if f["best_at_equal"] is None else f"{f['best_at_equal']:.3f}",
                ]
            )
    flaky, multi = report["flaky"]
    kind_table = md_table(
        [
            [kind, r["mem"], r["mem_hi"], r["time"], r["time_hi"]]
            for kind, r in d["by_kind"].items()
        ],
        (
            "model",
            "peak memory",
            "peak memory, upper bound",
            "epoch time",
            "epoch time, upper bound",
        ),
    )
    text = f"""# Benchmarks: HPO compute saved

What costaware saves in a real hyperparameter search, measured side by side against what
people do today (issue 7). Written by `benchmarks/hpo.py`; every figure below comes from
the run described here.

```bash
{report["command"]}
```

- **Date**: {report["date"]}; **wall time** {report["wall_s"]:.0f} s ({
        report["wall_s"] / 60:.1f} min).
- **Machine**: {m["cpu"]}, {m["cores"]} cores, {m["memory_gib"]} GiB; {m["platform"]};
  Python {m["python"]}, torch {m["torch"]}, Lightning {m["lightning"]}, Optuna
  {m["optuna"]}; costaware at commit `{m["commit"]}`. Shared machine: load average
  {report["load_start"]} at the start, {report["load_end"]} at the end (on {m["cores"]} cores),
  so absolute seconds are noisy; compare the arms within one run.
- **Seeds**: {", ".join(map(str, report["seed_list"]))} (TPE sampler seed; the same seed gives
  every arm the same first {report["startup"]} random trials); **{
        report["trials"]
    } trials** per arm and seed.
- **Shipped model**: {report["model"]}.

## Setup

- **Objective**: validation accuracy (maximised) of a Transformer sequence classifier
  trained for 2 epochs with Lightning on a synthetic task (does token 1 occur more often
  than token 2 in a 128-token sequence; a trial sees the first `seq_len` tokens, so longer
  sequences can do better), 256 training and 256 validation sequences.
- **Search space**: width {SPACE["width"]}, depth {SPACE["depth"]}, sequence length
  {SPACE["seq_len"]}, batch size {SPACE["batch_size"]}, precision {SPACE["precision"]}
  (bf16 is autocast on a CPU without bf16 arithmetic: slow), optimizer
  {SPACE["optimizer"]} (SGD with momentum 0.9), learning rate log-uniform
  {LR_RANGE[0]:g}-{LR_RANGE[1]:g}. Optuna `TPESampler(seed, n_startup_trials={report["startup"]})`.
- **Budget**: {report["budget"]}.
  Of the baseline's proposals, {report["infeasible"]["baseline"][0]:.0f}% were infeasible
  ({report["infeasible"]["baseline"][1]:.0f}% out of memory, the rest over the epoch-time
  budget); of its random start-up trials (a uniform sample of the search space),
  {report["infeasible"]["startup"][0]:.0f}% ({
        report["infeasible"]["startup"][1]:.0f}% out of memory).
- **Real out-of-memory**: each trial runs in a process forked from a fork server (torch,
  Lightning, Optuna and costaware imported once) with `setrlimit(RLIMIT_AS)` set to
  {report["baseline_mib"]:.0f} MiB (the address-space peak of a process that trained the
  smallest configuration through the same code, measured at the start) plus the memory
  budget; glibc serves allocations above 64 KiB with `mmap` and uses one arena, so the
  address space follows the live tensors. At the start the benchmark checks that a
  process under that cap can allocate half the budget and fails to allocate twice the
  budget: {report["oom_check"]}.
- **Time budget**: every arm stops a trial as soon as its epoch in progress passes
  `max_epoch_time` (at a batch end, or by a watchdog when one batch alone runs past it);
  the compute it used until then is waste. A baseline user would usually let it run to
  the end, so the baselines' time waste here is a lower bound.
- **Arms**: `baseline` (plain TPE, OOM and over-time trials end as FAIL through
  `catch=`), `baseline-pruned` (they end as PRUNED), `costaware` (`CostAwarePruner(spec_fn=spec_fn,
  budget=budget, device="cpu", store=ObservationStore(...))` with the default model and `Budget`
  (memory checked at its upper bound, epoch time at the prediction unless the run says
  otherwise) and `refit_every=5` (the first refits after 2, 4 and 8 measured trials); `CostAwareCallback(store=store, budget=budget, enforce=True)` in
  every trial process; a trial the costaware arm admitted that still OOMs ends as FAIL),
  `oracle` (prunes every configuration that the ground truth says is infeasible).
- **Compute** is the wall time of each trial process (start to exit) plus, for the
  costaware arm, the wall time of `trial.should_prune()` (the prediction, the decision
  and the store writes). The online refit runs between trials (the benchmark waits for
  it so that it does not slow a trial down: on a GPU machine it runs on the host CPU while
  the GPU trains) and is not counted as compute: {report["refit"]}.
- **Ground truth**: a cost key (all parameters but the learning rate) is feasible when at
  least half of its runs, by any arm at any learning rate, completed within the budget. Every arm's trials are really run by that arm; the table is
  only read by the oracle and by the false-rejection check. Runs of the same key that
  disagreed on feasibility (timing noise near the budget): {flaky} of {multi} keys run
  more than once. Uncharged ground-truth runs (oracle probes that turned out infeasible,
  rejected configurations run afterwards): {report["checks_s"]:.0f} s.

## Results

Mean ± standard deviation over {len(report["seed_list"])} seeds. *Wasted* = trials that ran
out of memory or broke the epoch-time budget. *Equal compute* = the smallest total compute
of the four arms in that seed. *Compute-to-best* = compute spent until the arm first
reached the baseline's best value, relative to the baseline (in parentheses: the number
of seeds in which it got there).

{md_table(report["table"], TABLE_COLUMNS)}

Best validation accuracy reached (mean over seeds) against compute spent, as a share of the
baseline's total compute in each seed:

{md_table(report["curve"])}

### Targets (issue 7)

| target | this run | |
|---|---|---|
{targets_md}

### Prediction against measurement (costaware arm)

Predictions by model kind: {d["model_kinds"]} (*learned* = an online refit of the shipped
model); rejections by reason: {d["reject_reasons"]}. Predicted / measured, for every
costaware trial whose configuration completed somewhere (measured: the address-space peak
above the baseline, configurations over 2 MiB; the median epoch time):

{kind_table}

What costaware's Lightning callback recorded as each completed trial's peak memory (the
figure the online refit learns from): {d["callback_memory"]}. The costaware arm's trial
processes' address-space peak minus the other arms' for the same configuration (the
callback's own memory, which the cap counts): {d["arm_address_space"]}.

### Per seed

{
        md_table(
            per_seed,
            (
                "seed",
                "arm",
                "compute (s)",
                "wasted (s)",
                "wasted trials",
                "OOM",
                "over time",
                "rejected",
                "false rejections",
                "best",
                "best @ equal compute",
            ),
        )
    }
"""
    if report["notes"]:
        text += "\nNotes from the run:\n\n" + "\n".join(f"- {n}" for n in report["notes"]) + "\n"
    path.write_text(text)


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/hpo.py",
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--seeds", type=int, default=3, help="sampler seeds (0..N-1)")
    parser.add_argument("--trials", type=int, default=24, help="trials per arm and seed")
    parser.add_argument(
        "--startup", type=int, default=None, help="TPE random startup trials (default: trials/3)"
    )
    parser.add_argument("--max-memory", default="32MiB", help="memory budget above the baseline")
    parser.add_argument(
        "--max-epoch-time",
        default="auto",
        help="epoch-time budget in seconds, or 'auto': --time-factor x the measured epoch "
        "time of a reference configuration (adapts to the machine's speed and load)",
    )
    parser.add_argument("--time-factor", type=float, default=3.0, help="see --max-epoch-time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per trial")
    parser.add_argument(
        "--actuals",
        choices=("callback", "address-space"),
        default="callback",
        help="how the costaware arm records what its trials cost: costaware's Lightning "
        "callback (as shipped), or the benchmark's own address-space peak per trial",
    )
    parser.add_argument(
        "--time-bound",
        choices=("upper", "point"),
        default="point",
        help="what the costaware arm checks the epoch-time budget against: the point "
        "prediction (the default Budget) or the upper bound (Budget(time_bound='upper')); "
        "memory is always checked at the upper bound",
    )
    parser.add_argument("--out", default=None, help="write the Markdown report here")
    parser.add_argument("--json", default=None, help="write every figure and trial here")
    parser.add_argument("--workdir", default=None, help="stores and caches (default: temp dir)")
    parser.add_argument(
        "--cache",
        default=None,
        help="ground-truth JSON to reuse across runs (default: a fresh one in the workdir)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (1 seed, 4 trials)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.trials = 1, 4
        args.startup = 2 if args.startup is None else args.startup
    if args.seeds < 1 or args.trials < 1:
        parser.error(f"--seeds and --trials must be at least 1, got {args.seeds}, {args.trials}")
    if args.startup is None:
        args.startup = max(1, args.trials // 3)
    return args


def calibrate(runner: Runner, quick: bool) -> tuple[int, dict[str, Any]]:
    """The address-space baseline: the peak of processes that trained the tiny config."""
    peaks, starts = [], []
    for _ in range(1 if quick else 2):
        res = runner.run(TINY, limit=None, max_epoch_time=60.0)
        if res["status"] != "ok":
            raise RuntimeError(f"the calibration run failed: {res.get('error')}")
        peaks.append(res["vm_end"]["VmPeak"])
        starts.append(res["vm_start"]["VmSize"])
    return max(peaks), {"peaks": peaks, "starts": starts}


def reference_epoch_time(runner: Runner, quick: bool) -> float:
    times = []
    for _ in range(1 if quick else 3):
        res = runner.run(REFERENCE, limit=None, max_epoch_time=60.0)
        times += res.get("epoch_times", [])
    if not times:
        raise RuntimeError("the reference configuration did not complete an epoch")
    return float(statistics.median(times))


def check_oom(runner: Runner, limit: int, budget: int) -> str:
    out = runner.probe(limit, [budget // 2, 2 * budget])
    res = out.get("results", [])
    if len(res) != 2 or not res[0]["ok"] or res[1]["ok"] or not res[1]["oom"]:
        raise RuntimeError(f"the address-space cap does not behave as expected: {out}")
    return f"{fmt_mib(budget // 2)} allocated, {fmt_mib(2 * budget)} failed with `{res[1]['error'][:110]}...`"


def fmt_mib(n: float) -> str:
    return f"{n / MiB:.0f} MiB"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--gpu" in argv:  # the GPU mode: benchmarks/_hpo_gpu.py
        import _hpo_gpu

        return _hpo_gpu.main([a for a in argv if a != "--gpu"])
    args = parse_args(argv)
    t_start = time.perf_counter()
    load_start = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    import optuna

    import costaware as ca

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="costaware-hpo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    budget = ca.parse_bytes(args.max_memory)
    runner = Runner(args.threads, 60.0)
    print(f"workdir {workdir}; starting the trial fork server ...", flush=True)
    baseline, cal = calibrate(runner, args.quick)
    limit = baseline + budget
    oom_check = check_oom(runner, limit, budget)
    if args.max_epoch_time == "auto":
        ref = reference_epoch_time(runner, args.quick)
        max_epoch_time = round(args.time_factor * ref, 2)
        time_note = (
            f"max_epoch_time {max_epoch_time:.2f} s ({args.time_factor:g} x the "
            f"{ref:.2f} s measured epoch of width 32, depth 2, seq_len 64, batch 32, fp32)"
        )
    else:
        max_epoch_time = ca.parse_duration(args.max_epoch_time)
        time_note = f"max_epoch_time {max_epoch_time:.2f} s"
    runner.limit = limit
    runner.max_epoch_time = max_epoch_time
    budget_text = (
        f"max_memory {args.max_memory} (cap: {fmt_mib(limit)} of address space), {time_note}"
        + (
            "; costaware checks the epoch time at its upper bound"
            if args.time_bound == "upper"
            else ""
        )
    )
    print(f"baseline {fmt_mib(baseline)}; {budget_text}; OOM check: {oom_check}", flush=True)
    truth = GroundTruth(Path(args.cache) if args.cache else workdir / "ground_truth.json")
    bench = Bench(
        runner=runner,
        truth=truth,
        workdir=workdir,
        max_memory=budget,
        max_epoch_time=max_epoch_time,
        baseline=baseline,
        trials=args.trials,
        startup=args.startup,
        actuals=args.actuals,
        time_bound=args.time_bound,
    )
    seeds = list(range(args.seeds))
    results: list[dict[str, dict[str, Any]]] = []
    progress_ctx: Any = contextlib.nullcontext()
    task = None
    if not args.no_progress:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        progress_ctx = Progress(
            TextColumn("{task.description:<44}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} trials"),
            TimeElapsedColumn(),
        )
    with progress_ctx as progress:
        if progress is not None:
            task = progress.add_task("starting", total=len(seeds) * len(ARMS) * args.trials)

            def tick(text: str) -> None:
                advance = 0 if "checking" in text else 1
                progress.update(task, advance=advance, description=text[:44])

            bench.progress = tick
        for seed in seeds:
            per_arm: dict[str, dict[str, Any]] = {}
            for arm in RUN_ORDER:
                per_arm[arm] = run_arm(bench, arm, seed)
            check_rejections(bench, per_arm["costaware"])
            results.append(per_arm)
    per_seed = [seed_figures(bench, r) for r in results]
    summary = summarize(per_seed)
    mem_keys = {
        k for k, runs in bench.truth.runs.items() if runs and runs[0]["status"] in ("oom", "crash")
    }

    def share(recs: list[dict[str, Any]]) -> tuple[float, float]:
        """% infeasible, % out of memory, of ``recs`` whose feasibility is known."""
        known = [r for r in recs if bench.truth.feasible(r["key"]) is not None]
        bad = sum(bench.truth.feasible(r["key"]) is False for r in known)
        oom = sum(r["key"] in mem_keys for r in known)
        return 100 * bad / max(1, len(known)), 100 * oom / max(1, len(known))

    base_recs = [rec for r in results for rec in r["baseline"]["records"]]
    startup_recs = [rec for r in results for rec in r["baseline"]["records"][: args.startup]]
    infeasible = {"baseline": share(base_recs), "startup": share(startup_recs)}
    refits = [r["costaware"]["refit"] for r in results]
    refit_text = (
        f"{sum(r.get('refits', 0) for r in refits)} refits in all, "
        f"{sum(r.get('refit_s', 0.0) for r in refits):.1f} s"
    )
    report = {
        "command": "python benchmarks/hpo.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": _dt.datetime.now().astimezone().isoformat(timespec="minutes"),
        "machine": machine(),
        "seeds": args.seeds,
        "seed_list": seeds,
        "trials": args.trials,
        "startup": args.startup,
        "budget": budget_text,
        "baseline_mib": baseline / MiB,
        "calibration": cal,
        "oom_check": oom_check,
        "model": "; ".join(dict.fromkeys(bench.models))
        + (" (**the shipped model changed during the run**)" if len(set(bench.models)) > 1 else ""),
        "table": table_rows(summary, args.seeds),
        "curve": curve_rows(per_seed),
        "targets": targets(summary, args.seeds),
        "diagnostics": diagnostics(bench, results),
        "flaky": bench.truth.flaky(),
        "checks_s": bench.checks_s,
        "refit": refit_text,
        "infeasible": infeasible,
        "notes": bench.notes,
        "per_seed": [
            {arm: {k: v for k, v in f.items() if k != "curve"} for arm, f in s.items()}
            for s in per_seed
        ],
    }
    report["wall_s"] = time.perf_counter() - t_start
    report["load_start"] = load_start
    report["load_end"] = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print_report(report)
    if args.out:
        write_doc(Path(args.out), report)
        print(f"wrote {args.out}")
    raw = {
        **report,
        "results": results,
        "curves": [{a: s[a]["curve"] for a in ARMS} for s in per_seed],
    }
    json_path = Path(args.json) if args.json else workdir / "results.json"
    json_path.write_text(json.dumps(raw, indent=1, default=str))
    print(f"raw results: {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
