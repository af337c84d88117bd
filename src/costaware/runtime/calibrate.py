"""Calibrate the cost model to this machine before a study: measure a few corpus models.

The shipped time model learned one H100 (and one CPU). On another GPU it starts from that
GPU's roofline, and the online refit corrects it once a study's own trials are measured.
:func:`calibrate` gives that refit its first rows before the study starts: it measures
``n`` small configurations of the corpus (spread over families and precisions) on this
machine with :func:`costaware.measure.profile.measure`, compares them with the model's
predictions, and judges whether a correction fitted on them predicts left-out rows better
than the model alone:

- it fits the online refit's small-sample line (one factor per precision, a slope from 10
  rows on) leaving each row out in turn, and compares that leave-one-out error with the
  model's own error on the same rows;
- the correction counts as useful when it cuts the error by at least 10% of itself and by
  2 points.

Given a store, the useful rows are recorded there as one study's trials (predictions and
measurements, as the integrations record them), so an :class:`~costaware.runtime.refit.OnlineRefit`
over the store, which the integrations start with ``refit_every``, learns from them from
its first refit. ``record="always"`` records them regardless.

A calibration learns the machine as it runs at the minute it is taken: a shared host's
speed can move by tens of percent within the hour. What it gains is measured by
``benchmarks/refit_replay.py --calibration`` (held-out rows of the accuracy benchmark,
with simulated device shifts) and ``benchmarks/calibration.py`` (architectures outside the
corpus on this machine); ``docs/predictions.md`` and ``docs/benchmarks.md`` give the
figures.

Example:
    >>> from costaware.runtime.calibrate import calibrate               # doctest: +SKIP
    >>> result = calibrate("cuda", store="sqlite:///costaware.db")  # doctest: +SKIP
    >>> print(result)                                            # doctest: +SKIP
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
import torch

from costaware.core.model import CostModel
from costaware.core.residuals import _small_sample_line
from costaware.devices import Device, get_device
from costaware.measure.corpus import Config, corpus
from costaware.measure.profile import host_speed, measure
from costaware.runtime.gate import check_study, open_store
from costaware.spec import TrainingSpec

__all__ = [
    "RECORD_MODES",
    "SEED",
    "STUDY",
    "Calibration",
    "CalibrationRow",
    "calibrate",
    "calibration_configs",
    "judge",
    "useful",
]

#: the study name calibration rows are recorded under
STUDY = "costaware-calibration"
#: when to record the rows in the store: when the correction helps, always, or never
RECORD_MODES = ("auto", "always", "never")
#: a correction is useful when its leave-one-out error is below this share of the
#: model's, and lower by at least USEFUL_GAIN (a model that is already within timing
#: noise has nothing a correction could take off)
USEFUL_BELOW = 0.9
USEFUL_GAIN = 0.02


@dataclass
class CalibrationRow:
    """One measured calibration configuration beside its prediction (seconds, bytes)."""

    id: str
    family: str
    precision: str
    status: str
    predicted_time: float | None = None
    measured_time: float | None = None
    predicted_memory: float | None = None
    measured_memory: float | None = None
    error: str | None = None

    @property
    def time_ratio(self) -> float | None:
        """Measured over predicted time (above 1: this machine is slower than predicted)."""
        if self.predicted_time and self.measured_time:
            return self.measured_time / self.predicted_time
        return None


@dataclass
class Calibration:
    """What :func:`calibrate` measured and decided."""

    device: str
    rows: list[CalibrationRow] = field(default_factory=list)
    #: the model's mean relative time error on the rows the correction could be judged on
    time_error: float | None = None
    #: the corrected model's leave-one-out mean relative time error on the same rows
    corrected_time_error: float | None = None
    #: the model's mean relative error of the peak memory (GPU: the reserved peak)
    memory_error: float | None = None
    useful: bool = False
    recorded: int = 0
    study: str | None = None
    seconds: float = 0.0
    host_speed: dict[str, float] = field(default_factory=dict)

    @property
    def time_ratio(self) -> float | None:
        """The median measured / predicted time over the measured rows."""
        ratios = [r.time_ratio for r in self.rows if r.time_ratio is not None]
        return statistics.median(ratios) if ratios else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "rows": [vars(r) | {"time_ratio": r.time_ratio} for r in self.rows],
            "time_ratio": self.time_ratio,
            "time_error": self.time_error,
            "corrected_time_error": self.corrected_time_error,
            "memory_error": self.memory_error,
            "useful": self.useful,
            "recorded": self.recorded,
            "study": self.study,
            "seconds": round(self.seconds, 2),
            "host_speed": self.host_speed,
        }

    def __str__(self) -> str:
        ok = [r for r in self.rows if r.time_ratio is not None]
        lines = [
            f"calibration on {self.device}: {len(ok)} of {len(self.rows)} configurations "
            f"measured in {self.seconds:.0f} s"
        ]
        if self.time_ratio is not None:
            slower = self.time_ratio >= 1
            factor = self.time_ratio if slower else 1 / self.time_ratio
            lines.append(
                f"  steps took a median {factor:.2f}x {'longer' if slower else 'less'} than "
                "the model predicted"
            )
        if self.time_error is not None and self.corrected_time_error is not None:
            lines.append(
                f"  time error: {100 * self.time_error:.1f}% by the model, "
                f"{100 * self.corrected_time_error:.1f}% corrected (leave-one-out)"
            )
        if self.memory_error is not None:
            lines.append(f"  peak memory error: {100 * self.memory_error:.1f}%")
        verdict = (
            "the correction helps"
            if self.useful
            else "a correction fitted on these rows does not predict the held-out ones "
            "enough better"
        )
        if self.recorded:
            lines.append(
                f"  {verdict}: {self.recorded} rows recorded as study {self.study!r}; an "
                "online refit over this store starts from them"
            )
        else:
            lines.append(f"  {verdict}: nothing recorded")
        return "\n".join(lines)


#: the corpus seed calibration draws from: one the shipped data was not measured on, so
#: the model is judged on configurations it did not learn
SEED = 100


def calibration_configs(kind: str = "gpu", n: int = 20, seed: int = SEED) -> list[Config]:
    """``n`` small configurations of the ``kind`` corpus (seed ``seed``) to calibrate on.

    Candidates run with the default allocator and without cuDNN's benchmark search (each
    allocator needs its own process, and the search's memory measures the card), and do no
    more forward work per step than their family's median. They are taken one family at a
    time, in turn, each time the next of that family in the corpus' order whose precision
    has been taken least so far: every family and every precision comes in.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, but got {n=}.")
    pool = [
        c for c in corpus(kind, seed=seed) if c.allocator == "default" and not c.cudnn_benchmark
    ]
    by_family: dict[str, list[Config]] = {}
    for c in pool:
        by_family.setdefault(c.family, []).append(c)
    for family, configs in by_family.items():  # the smaller half of each family
        work = sorted(c.fwd_flops * c.batch_size for c in configs)
        cap = work[(len(work) - 1) // 2]
        by_family[family] = [c for c in configs if c.fwd_flops * c.batch_size <= cap]
    pool = [c for configs in by_family.values() for c in configs]
    taken: list[Config] = []
    precisions: dict[str, int] = dict.fromkeys(sorted({c.precision for c in pool}), 0)
    while len(taken) < n and any(by_family.values()):
        for family in sorted(by_family):
            left = by_family[family]
            if not left or len(taken) >= n:
                continue
            pick = min(left, key=lambda c: precisions[c.precision])  # first of the least taken
            left.remove(pick)
            precisions[pick.precision] += 1
            taken.append(pick)
    return taken


def _relative_errors(log_ratio: np.ndarray) -> np.ndarray:
    """|predicted / measured - 1| for rows whose log(measured / predicted) is given."""
    return np.asarray(np.abs(np.exp(-log_ratio) - 1.0))


def judge(rows: Sequence[CalibrationRow]) -> tuple[float | None, float | None]:
    """The model's mean relative time error and the corrected model's leave-one-out error,
    over the rows whose precision has another measured row (a lone row cannot be left out).
    """
    timed = [
        (r.time_ratio, r.predicted_time, r.precision)
        for r in rows
        if r.time_ratio is not None and r.predicted_time is not None
    ]
    if len(timed) < 3:
        return None, None
    y = np.log([t[0] for t in timed])
    log_base = np.log([t[1] for t in timed])
    groups = np.asarray([t[2] for t in timed], dtype=object)
    _, _, loo = _small_sample_line(y, log_base, groups)
    judged = np.asarray([np.sum(groups == g) > 1 for g in groups])
    if not judged.any():
        return None, None
    before = float(np.mean(_relative_errors(y[judged])))
    after = float(np.mean(_relative_errors(loo)))
    return before, after


def useful(time_error: float | None, corrected_time_error: float | None) -> bool:
    """Whether a correction whose leave-one-out error is ``corrected_time_error`` is worth
    taking over a model whose error is ``time_error`` (see :data:`USEFUL_BELOW`)."""
    if time_error is None or corrected_time_error is None:
        return False
    return (
        corrected_time_error < USEFUL_BELOW * time_error
        and time_error - corrected_time_error >= USEFUL_GAIN
    )


def calibrate(
    device: str = "auto",
    *,
    n: int = 20,
    store: Any = None,
    study: str = STUDY,
    record: str = "auto",
    model: CostModel | None = None,
    seed: int = SEED,
    max_minutes: float | None = None,
    progress: bool = True,
    stream: TextIO | None = None,
    configs: Sequence[Config] | None = None,
    measure_fn: Callable[..., Any] = measure,
) -> Calibration:
    """Measure ``n`` small corpus configurations on this machine and judge the model on them.

    Args:
        device: ``"auto"`` (the first CUDA GPU, else the CPU), ``"cuda"``, ``"cuda:N"`` or
            ``"cpu"``: where the configurations run.
        n: how many configurations (default 20; the replay above needed about that many).
        store: an ``ObservationStore`` or its URL, to record the rows in (see ``record``).
        study: the study name the rows are recorded under.
        record: ``"auto"`` (when the correction is useful), ``"always"`` or ``"never"``.
        model: the model to judge (default: the shipped one).
        seed: the corpus seed the configurations are drawn from (default :data:`SEED`, not
            one the shipped model learned).
        max_minutes: stop measuring after this long (at least one configuration runs).
        progress: a line per configuration on ``stream`` (default stderr).
        configs: configurations to measure instead of :func:`calibration_configs`.
        measure_fn: what measures one spec (``costaware.measure.profile.measure``).

    Returns:
        A :class:`Calibration`.
    """
    if record not in RECORD_MODES:
        raise ValueError(f"record must be one of {RECORD_MODES}, but got {record!r}.")
    check_study(study, STUDY)
    if store is not None and record != "never":
        store = open_store(store)  # a store that cannot be opened fails before measuring
    t0 = time.perf_counter()
    run_on = _run_device(device)
    target = _target_device(run_on)
    model = model if model is not None else CostModel.default()
    todo = (
        list(configs)
        if configs is not None
        else calibration_configs("gpu" if run_on.startswith("cuda") else "cpu", n, seed)
    )
    out = Calibration(device=target.name, host_speed=host_speed())
    stream = stream if stream is not None else sys.stderr
    measured: list[tuple[Config, TrainingSpec, dict[str, float], dict[str, Any], Any]] = []
    for i, cfg in enumerate(todo):
        if max_minutes is not None and i > 0 and time.perf_counter() - t0 > 60 * max_minutes:
            break
        row = CalibrationRow(id=cfg.id, family=cfg.family, precision=cfg.precision, status="error")
        try:
            spec = cfg.to_spec()
            pred = model.predict(spec, device=target)
            feats = model.features(spec, target)
            row.predicted_time, row.predicted_memory = pred.iteration_time, pred.peak_memory
            m = measure_fn(spec, run_on)
            row.status, row.error = m.status, m.error
            if m.status == "ok":
                row.measured_time = m.iteration_time
                row.measured_memory = m.max_reserved
                measured.append((cfg, spec, feats, pred.to_dict(), m))
        except Exception as e:  # one configuration that fails does not stop the rest
            row.error = f"{type(e).__name__}: {e}"[:300]
        out.rows.append(row)
        if progress:
            stream.write(_progress_line(i + 1, len(todo), row) + "\n")
            stream.flush()
    out.time_error, out.corrected_time_error = judge(out.rows)
    mem = [
        abs(r.predicted_memory / r.measured_memory - 1)
        for r in out.rows
        if r.predicted_memory and r.measured_memory
    ]
    out.memory_error = float(np.mean(mem)) if mem else None
    out.useful = useful(out.time_error, out.corrected_time_error)
    if store is not None and (record == "always" or (record == "auto" and out.useful)):
        out.recorded = _record(store, study, target, measured)
        out.study = study
    out.seconds = time.perf_counter() - t0
    return out


def _run_device(device: str) -> str:
    name = device.strip().lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} needs a visible CUDA GPU; use 'cpu' here.")
        return name
    if name == "cpu":
        return "cpu"
    raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', but got {device!r}.")


def _target_device(run_on: str) -> Device:
    """The catalog device of ``run_on``: the GPU's own entry by its name where the catalog
    knows it, else NVML's description of it (a GPU the catalog lacks)."""
    if run_on == "cpu":
        return get_device("cpu")
    name = torch.cuda.get_device_name(torch.device(run_on).index or 0)
    try:
        return get_device(name)
    except ValueError:
        found = get_device("auto")
    if found.kind != "cuda":
        raise RuntimeError(
            f"cannot describe GPU {name!r}: it is not in the catalog and NVML did not answer "
            "(install nvidia-ml-py)."
        )
    return found


def _progress_line(i: int, total: int, row: CalibrationRow) -> str:
    head = f"[calibrate] {i}/{total} {row.id} ({row.precision})"
    if row.measured_time is not None and row.predicted_time is not None:
        return (
            f"{head}: step {1e3 * row.measured_time:.1f} ms measured, "
            f"{1e3 * row.predicted_time:.1f} ms predicted"
        )
    return f"{head}: {row.status}{f' ({row.error})' if row.error else ''}"


def _record(
    store: Any,
    study: str,
    target: Device,
    measured: Sequence[tuple[Config, TrainingSpec, dict[str, float], dict[str, Any], Any]],
) -> int:
    """Record each measured row as a trial of ``study``: its prediction, then what it cost."""
    store = open_store(store)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for cfg, spec, feats, pred, m in measured:
        trial = f"{stamp}-{cfg.id}"
        store.record_prediction(
            study=study,
            trial=trial,
            spec=spec.summary() | {"family": cfg.family, "calibration": True},
            features=feats,
            prediction=pred,
            decision=None,
            device=target.name,
            status="admitted",
            meta={"calibration": True, "config": cfg.to_dict()},
        )
        actual = {
            "iteration_time": m.iteration_time,
            "peak_memory": m.max_reserved,
            "peak_allocated": m.max_allocated,
            "memory_method": m.memory_method,
            "device_kind": target.kind,
            "steps": m.steps,
        }
        if m.reserved_before is not None:
            actual["held_before"] = m.reserved_before
        store.record_measurement(
            study=study, trial=trial, status="ok", actual=actual, device=target.name
        )
    return len(measured)
