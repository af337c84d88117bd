"""Observation store: what costaware predicted for each trial, and what the trial really cost.

Every trial costaware judges leaves a *prediction record* (written before training by the
Optuna pruner, the Ray Tune searcher or the Lightning callback: the spec summary, the
features the cost model used, the prediction and the admit/reject decision). Every trial
that runs leaves *measurement records* (written after each epoch, or on a crash: the
measured step time, epoch time, peak memory and status). The online refit learns from
the join of the two (:meth:`ObservationStore.observations`); reports read both.

The store is three tables in any database SQLAlchemy reaches. A SQLite file is the
default; it runs in WAL mode with a busy timeout, so several worker processes on one
machine write to it at once without losing a row (WAL needs a local disk, not NFS).
Workers on several machines share a PostgreSQL database
(``pip install 'costaware[postgres]'``). Each record is one transaction.

Example:
    >>> from costaware.runtime.store import ObservationStore
    >>> with ObservationStore("sqlite://") as store:   # in memory; a path for a file
    ...     _ = store.record_prediction(
    ...         study="demo", trial=0, spec={"name": "mlp", "batch_size": 64},
    ...         features={"analytic_reserved_mib": 130.0}, prediction={"peak_memory": 1.4e8},
    ...         decision={"admit": True}, device="H100", status="admitted")
    ...     _ = store.record_measurement(
    ...         study="demo", trial=0, epoch=0, status="ok", device="H100",
    ...         actual={"peak_memory": 1.5e8, "iteration_time": 0.012, "epoch_time": 9.5})
    ...     [(o.status, o.peak_memory, o.iteration_time) for o in store.observations()]
    [('ok', 150000000.0, 0.012)]
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import enum
import importlib.util
import logging
import math
import os
import pathlib
import re
import sqlite3
import statistics
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.pool import ConnectionPoolEntry, NullPool, StaticPool

from costaware.errors import CostawareError, CostAwareWarning
from costaware.observation import (
    MAX_HELD_BEFORE,  # also this module's name, for callers
    Observation,
)

__all__ = [
    "MAX_HELD_BEFORE",
    "MEASUREMENT_STATUSES",
    "PREDICTION_STATUSES",
    "SCHEMA_VERSION",
    "ObservationStore",
    "StoreError",
    "StoreUnreachable",
]

log = logging.getLogger("costaware.store")  # the name users configure, whatever the layout

SCHEMA_VERSION: int = 1
"""The layout of the tables this code writes. A database with a newer one is refused."""

PREDICTION_STATUSES: Final = ("admitted", "rejected", "error")
"""``error``: the prediction itself failed, and the fail-open/closed policy decided."""

MEASUREMENT_STATUSES: Final = ("ok", "oom", "error", "stopped")
"""``stopped``: the trial ended early on purpose (pruned, time budget); its numbers count."""

DEFAULT_URL: Final = "sqlite:///costaware.db"
SQLITE_BUSY_TIMEOUT_S: Final = 30.0
CONNECT_TIMEOUT_S: Final = 10
KEEPALIVE_IDLE_S: Final = 30
"""A server connection idle this long is probed (TCP keepalive), then every 10 s; after 3
unanswered probes it is dropped, so a dead server or network is noticed in about a
minute instead of the kernel's two hours."""
TCP_USER_TIMEOUT_S: Final = 60
"""Data sent to the server and not acknowledged for this long fails the connection (libpq
``tcp_user_timeout``): a ping or query to a server that vanished cannot wait for ever."""
RETRY_WAIT_S: Final = 1.0
"""How long a read or write waits on a store that is down for the try it starts to open it
again; a try that takes longer (a server that takes connections and never answers) goes
on in the background, and the read or write raises :class:`StoreUnreachable`."""
PING_TIMEOUT_S: Final = 10.0
"""The check of a pooled server connection before use (``SELECT 1``) that has no answer
after this long hangs the connection up, so the pool opens a new one: a server that
accepts data but never answers (frozen, or a socket that another process also reads)
cannot hold a trial for ever."""
RETRY_FIRST_S: Final = 1.0
RETRY_MAX_S: Final = 120.0
"""A store opened with ``retry=True`` whose server did not answer tries again after
:data:`RETRY_FIRST_S`, the pause doubling after each failure up to this."""
_MAX_NAME = 255
_LOCK_KEY: Final = 0x636F_7374_6177_6172 % (2**63)  # pg advisory lock id ("costawar")
_SCHEMA_KEY: Final = "schema_version"
_ID_KEY: Final = "store_id"
_WRITE: Final = "costaware_write"  # execution option: this transaction writes


class StoreError(CostawareError, RuntimeError):
    """The observation store cannot be reached, opened, created, read or written."""


class StoreUnreachable(StoreError):
    """The database server did not answer (it is down, or the network does not reach it).

    Not raised for a server that answers and refuses (a wrong password, a missing
    database), nor for a SQLite file that cannot be opened: those are the caller's to fix.
    """


# --------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------
_JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite autoincrements INTEGER only

metadata = sa.MetaData()

meta_table = sa.Table(
    "costaware_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

predictions_table = sa.Table(
    "costaware_predictions",
    metadata,
    sa.Column("id", _ID, primary_key=True, autoincrement=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("study", sa.String(_MAX_NAME)),
    sa.Column("trial", sa.String(_MAX_NAME)),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("device", sa.String(_MAX_NAME)),
    sa.Column("spec", _JSON),
    sa.Column("features", _JSON),
    sa.Column("prediction", _JSON),
    sa.Column("decision", _JSON),
    sa.Column("reason", sa.Text),
    sa.Column("meta", _JSON),
    sa.Index("ix_costaware_predictions_study_trial", "study", "trial"),
)

measurements_table = sa.Table(
    "costaware_measurements",
    metadata,
    sa.Column("id", _ID, primary_key=True, autoincrement=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("study", sa.String(_MAX_NAME)),
    sa.Column("trial", sa.String(_MAX_NAME)),
    sa.Column("epoch", sa.Integer),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("device", sa.String(_MAX_NAME)),
    sa.Column("actual", _JSON),
    sa.Column("reason", sa.Text),
    sa.Column("meta", _JSON),
    sa.Index("ix_costaware_measurements_study_trial", "study", "trial"),
)


# --------------------------------------------------------------------------------------
# the store
# --------------------------------------------------------------------------------------
def _table_gone(e: exc.DBAPIError) -> bool:
    """Whether a write failed because the store's table does not exist (SQLite's "no such
    table", PostgreSQL's "relation ... does not exist")."""
    text = str(getattr(e, "orig", e)).lower()
    return "no such table" in text or ("relation" in text and "does not exist" in text)


def _other_device(predicted: str, measured: str) -> bool:
    """Whether a run measured on ``measured`` ran on another device than ``predicted``:
    another kind (a GPU against a CPU), or two catalog devices that differ ("H100" and
    "H100-SXM" are one). A name the catalog does not know ("cuda:0") is not told apart
    from a GPU of the catalog."""
    from costaware.devices import device_kind, get_device

    if device_kind(predicted) != device_kind(measured):
        return True
    try:
        return get_device(predicted).name != get_device(measured).name
    except Exception:
        return False


class ObservationStore:
    """Predictions and measured actuals of HPO trials, in SQLite or any SQLAlchemy database.

    Args:
        url: a SQLAlchemy URL (``"sqlite:///hpo.db"``,
            ``"postgresql+psycopg://user:password@host/db"``), or a plain file path (``str``
            or :class:`~pathlib.Path`) for a SQLite file there. Default:
            ``sqlite:///costaware.db`` in the current directory. ``"sqlite://"`` keeps the
            store in memory (one process). A relative SQLite path is resolved now, so a
            later ``chdir`` does not move the store.
        echo: log every SQL statement (SQLAlchemy's ``echo``).
        retry: when the database server does not answer (:class:`StoreUnreachable`),
            when opened or later, warn with a :class:`~costaware.errors.CostAwareWarning`
            instead of raising, and try again when the store is next used: after
            :data:`RETRY_FIRST_S`, the pause doubling up to :data:`RETRY_MAX_S`. Until it
            answers, every read and write raises :class:`StoreUnreachable` at once (a try
            that is due holds it :data:`RETRY_WAIT_S` at most), without waiting on the
            network; once it answers, they go through. The integrations open their
            stores this way, so that a database that is down or frozen does not stop, or
            stall, a study.

    Raises:
        StoreUnreachable: the database server did not answer (unless ``retry``).
        StoreError: the database cannot be opened or created (a missing directory, a
            wrong password, a missing driver), or it holds a schema newer than
            :data:`SCHEMA_VERSION`. The message never shows the password.
        ValueError: ``url`` cannot be parsed.

    The tables (``costaware_meta``, ``costaware_predictions``, ``costaware_measurements``)
    are created when missing; many processes may open a new store at the same moment.
    A store may be shared by threads, pickled into worker processes (it reconnects), and
    used on both sides of a ``fork``: a forked child drops the pooled connections it
    inherited, without touching them, before its first query, and opens its own.

    A row that does not have the shape this class writes (a JSON column that is not
    valid JSON or not an object, a feature that is not a number, an unknown status:
    something written by other means, or damaged) is skipped by every reader, with a
    :class:`~costaware.errors.CostAwareWarning` naming how many and why; :attr:`skipped`
    lists them.

    Example:
        >>> import tempfile, pathlib
        >>> from costaware.runtime.store import ObservationStore
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "hpo.db"
        >>> store = ObservationStore(path)
        >>> store.record_measurement(study="s", trial=3, status="oom", device="H100",
        ...                          actual={"peak_memory": None}, reason="CUDA out of memory")
        1
        >>> [(m["trial"], m["status"]) for m in store.measurements(study="s")]
        [('3', 'oom')]
        >>> store.path == path
        True
        >>> store.close()
    """

    def __init__(
        self, url: str | os.PathLike[str] | None = None, *, echo: bool = False, retry: bool = False
    ) -> None:
        self._url = _to_url(url)
        self._echo = bool(echo)
        self._retry = bool(retry)
        self._lock: threading.RLock | None = None
        self._pid = os.getpid()
        self._inherited: list[Any] = []  # pools of a parent process: kept, never touched
        self._skipped: dict[tuple[str, int], str] = {}
        self._unwarned: set[tuple[str, int]] = set()
        self._skipped_lock = threading.Lock()
        self._engine = self._create_engine()
        self._writer = self._engine.execution_options(**{_WRITE: True})
        _LIVE_STORES.add(self)
        self._ready = False
        self._down_since = 0.0
        self._retry_at = 0.0
        self._retry_pause = RETRY_FIRST_S
        self._down_reason = ""
        self._reconnecting = threading.Lock()
        try:
            self._ensure_schema()
        except StoreUnreachable as e:
            if not self._retry:
                raise
            self._mark_down(e, stacklevel=2)
        else:
            self._ready = True

    # -- identity -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The database URL, with the password hidden."""
        return self._url.render_as_string(hide_password=True)

    @property
    def path(self) -> pathlib.Path | None:
        """The SQLite file, or None for an in-memory store or a database server."""
        if self._url.get_backend_name() != "sqlite" or _sqlite_in_memory(self._url):
            return None
        return pathlib.Path(str(self._url.database))

    @property
    def store_id(self) -> str:
        """A random id the store is given the first time it is asked for, kept in
        ``costaware_meta``: what tells this store's records from another's at the same
        URL (a SQLite file deleted and made again). Models refitted on the store carry
        it, so that a model learned from records that are gone is not picked up."""
        found = self.__dict__.get("_store_id")
        if found is None:
            found = self.__dict__["_store_id"] = self._read_or_make_id()
        return str(found)

    def _read_or_make_id(self) -> str:
        self._check_fork()
        self._check_ready()
        query = sa.select(meta_table.c.value).where(meta_table.c.key == _ID_KEY)
        try:
            for _ in range(2):  # a second try reads the id another process wrote first
                try:
                    with self._locked(), self._writer.begin() as conn:
                        value = conn.execute(query).scalar_one_or_none()
                        if value is None:
                            value = uuid.uuid4().hex
                            conn.execute(meta_table.insert().values(key=_ID_KEY, value=value))
                        return str(value)
                except exc.IntegrityError:
                    continue
            raise StoreError(f"the observation store at {self.url} has no readable store id.")
        except exc.DBAPIError as e:
            raise self._failed("cannot read or write the store id in", e) from None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def __reduce__(self) -> tuple[Any, tuple[str, bool, bool]]:
        # an engine does not pickle; the copy reconnects (an in-memory store starts empty)
        return (
            _reopen,
            (self._url.render_as_string(hide_password=False), self._echo, self._retry),
        )

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """The malformed rows the readers skipped so far: ``table``, ``id``, ``reason``."""
        with self._skipped_lock:
            items = sorted(self._skipped.items())
        return [{"table": t, "id": i, "reason": why} for (t, i), why in items]

    def close(self) -> None:
        """Close every pooled connection. The store reconnects if used again."""
        self._check_fork()
        self._engine.dispose()

    # -- fork -----------------------------------------------------------------------------
    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            self._after_fork()

    def _after_fork(self) -> None:
        """In a forked child, before anything touches a connection: forget the parent's.

        SQLAlchemy's recipe for engines across ``fork`` (``engine.dispose(close=False)``):
        the pool inherited from the parent is replaced by an empty one, and its
        connections are neither pinged, used nor closed here, since they are the
        parent's sockets too; two processes talking over one socket read each other's
        replies, and a ping can then wait for ever. Runs from ``os.register_at_fork``
        and, for forks that bypass it, from the process-id check before every use.
        """
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        # a thread of the parent may have held these at the fork; nobody here releases them
        self._reconnecting = threading.Lock()
        self._skipped_lock = threading.Lock()
        if self._lock is not None:
            self._lock = threading.RLock()
        if _sqlite_in_memory(self._url):
            return  # the child's copy of the memory database is the only one it can see
        self._inherited.append(self._engine.pool)  # held, so that nothing closes them here
        self._engine.dispose(close=False)

    # -- an unreachable server ------------------------------------------------------------
    def _mark_down(self, e: StoreUnreachable, *, stacklevel: int) -> None:
        """The server stopped answering (at opening, or a read or write): the store is down
        from now, the first retry due after :data:`RETRY_FIRST_S`, and the caller is warned
        that the study goes on without it (``stacklevel`` as the caller would give it)."""
        self._ready = False
        self._down_since = time.monotonic()
        self._retry_pause = RETRY_FIRST_S
        self._went_down(e)
        warnings.warn(
            f"{_sentence(str(e))} The study goes on without it: nothing is recorded (and nothing "
            f"refitted) until it answers; costaware tries again in {RETRY_FIRST_S:g} s, "
            f"then less often (at most every {RETRY_MAX_S:g} s).",
            CostAwareWarning,
            stacklevel=stacklevel + 1,
        )

    def _went_down(self, e: BaseException) -> None:
        self._down_reason = str(e)
        self._retry_at = time.monotonic() + self._retry_pause
        self._retry_pause = min(self._retry_pause * 2, RETRY_MAX_S)

    def _check_ready(self) -> None:
        """Raise :class:`StoreUnreachable` at once while the server is down and the next
        try is not due; when it is due, try (one thread at a time, the others do not
        wait)."""
        if self._ready:
            return
        now = time.monotonic()
        if now >= self._retry_at and self._reconnecting.acquire(blocking=False):
            # the try runs in a thread of its own, so that a server that takes connections
            # and never answers holds the caller RETRY_WAIT_S at most, not the connection
            # timeout; a try that ends within it decides this call
            failed: list[StoreError] = []
            probe = threading.Thread(
                target=self._try_again, args=(failed,), name="costaware-store-retry", daemon=True
            )
            probe.start()
            probe.join(RETRY_WAIT_S)
            if self._ready:
                return
            if failed:
                raise type(failed[0])(self._still_down()) from None
        raise StoreUnreachable(self._still_down())

    def _try_again(self, failed: list[StoreError]) -> None:
        """Open the store again (holding ``_reconnecting``, which it releases): ready on
        success, else the next try is put off and the error appended to ``failed``."""
        try:
            if self._ready:
                return
            try:
                self._ensure_schema()
            except StoreError as e:
                self._went_down(e)
                failed.append(e)
                return
            self._ready = True
            log.warning(
                "costaware: the observation store at %s answers again (after %.0f s); "
                "records are written from now on.",
                self.url,
                time.monotonic() - self._down_since,
            )
        finally:
            self._reconnecting.release()

    def _still_down(self) -> str:
        wait = max(0.0, self._retry_at - time.monotonic())
        return (
            f"{self._down_reason} (costaware tries again in {wait:.0f} s; nothing is "
            "recorded until then)"
        )

    def __enter__(self) -> ObservationStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- writing --------------------------------------------------------------------------
    def record_prediction(
        self,
        *,
        study: str | None,
        trial: str | int | None,
        spec: Mapping[str, Any],
        features: Mapping[str, float] | None,
        prediction: Mapping[str, Any] | None,
        decision: Mapping[str, Any] | None,
        device: str | None,
        status: str,
        reason: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> int:
        """Record what was predicted for a trial before it ran, and what was decided.

        Args:
            study: the study (Optuna study name, Ray experiment), or None.
            trial: the trial's id within the study (Optuna number, Ray trial id); stored
                as a string.
            spec: a JSON-able summary of the training spec (``TrainingSpec.summary()``).
                Its ``"family"`` or ``"name"`` becomes the observation's family.
            features: the feature dict the cost model used (None when the prediction
                failed). NaN and infinities are stored as null.
            prediction: the prediction (``Prediction.to_dict()``), or None.
            decision: the budget decision (``Decision.to_dict()``), or None.
            device: the device the prediction was for.
            status: ``"admitted"``, ``"rejected"``, or ``"error"`` when the prediction
                itself failed and the fail-open/closed policy decided (say why in
                ``reason``).
            reason: a readable reason (why rejected, what failed).
            meta: anything else JSON-able.

        Returns:
            The new row's id.

        Raises:
            ValueError: an unknown ``status``. TypeError: a value is not JSON-able.
            StoreError: the database cannot be written.
        """
        row = {
            "created_at": _now(),
            "study": _name(study, "study"),
            "trial": _trial(trial),
            "status": _status(status, PREDICTION_STATUSES),
            "device": _name(device, "device"),
            "spec": _mapping(spec, "spec", optional=False),
            "features": _features(features),
            "prediction": _mapping(prediction, "prediction"),
            "decision": _mapping(decision, "decision"),
            "reason": _text(reason, "reason"),
            "meta": _mapping(meta, "meta"),
        }
        return self._insert(predictions_table, row)

    def record_measurement(
        self,
        *,
        study: str | None,
        trial: str | int | None,
        status: str,
        actual: Mapping[str, Any],
        device: str | None,
        epoch: int | None = None,
        reason: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> int:
        """Record what a running trial really cost (after an epoch, or when it crashed).

        Args:
            study: the study, as in :meth:`record_prediction`.
            trial: the trial, as in :meth:`record_prediction`.
            status: ``"ok"``, ``"oom"`` (CUDA out of memory), ``"error"`` (another
                crash) or ``"stopped"`` (ended early on purpose; its numbers count).
            actual: the measurements, with keys among ``peak_memory`` (bytes: the
                reserved peak on a GPU, the RSS growth on a CPU), ``peak_allocated``,
                ``iteration_time`` (seconds, median step), ``epoch_time`` (seconds),
                ``nvml_peak``, ``memory_method``, ``device_kind`` and ``steps``. Other keys
                are kept too.
            device: the device the trial ran on.
            epoch: the epoch this record closes (None for a whole-trial record).
            reason: what went wrong, for ``oom`` and ``error``.
            meta: anything else JSON-able.

        Returns:
            The new row's id.

        Raises:
            ValueError: an unknown ``status`` or a negative ``epoch``. TypeError: a value
                is not JSON-able. StoreError: the database cannot be written.
        """
        row = {
            "created_at": _now(),
            "study": _name(study, "study"),
            "trial": _trial(trial),
            "epoch": _epoch(epoch),
            "status": _status(status, MEASUREMENT_STATUSES),
            "device": _name(device, "device"),
            "actual": _mapping(actual, "actual", optional=False),
            "reason": _text(reason, "reason"),
            "meta": _mapping(meta, "meta"),
        }
        return self._insert(measurements_table, row)

    # -- reading --------------------------------------------------------------------------
    def predictions(
        self, *, study: str | None = None, status: str | None = None
    ) -> list[dict[str, Any]]:
        """Prediction records, oldest first, optionally of one study and/or one status.

        Each is a dict with ``id``, ``created_at`` (an aware UTC datetime), ``study``,
        ``trial`` (a string), ``status``, ``device``, ``spec``, ``features``,
        ``prediction``, ``decision``, ``reason`` and ``meta``.
        """
        if status is not None:
            _status(status, PREDICTION_STATUSES)
        return self._rows(predictions_table, study, status)

    def measurements(
        self, *, study: str | None = None, status: str | None = None
    ) -> list[dict[str, Any]]:
        """Measurement records, oldest first, optionally of one study and/or one status.

        Each is a dict with ``id``, ``created_at`` (an aware UTC datetime), ``study``,
        ``trial`` (a string), ``epoch``, ``status``, ``device``, ``actual``, ``reason``
        and ``meta``.
        """
        if status is not None:
            _status(status, MEASUREMENT_STATUSES)
        return self._rows(measurements_table, study, status)

    def observations(self, *, study: str | None = None) -> list[Observation]:
        """Training rows for the cost model: one per trial both predicted and measured.

        A trial counts when it has a prediction record with features and at least one
        measurement record (a rejected trial, never run, does not). Its row has the
        features of its latest prediction with features (nulls back to NaN) and that
        prediction's device (else the measured one), and from its measurements (a trial
        measured on another device than its prediction's is left out, with a warning):

        - ``status``: ``"oom"`` if any record is an OOM, else ``"ok"`` if any is ``ok``
          or ``stopped``, else ``"error"``;
        - ``peak_memory`` / ``peak_allocated``: the maximum over ``ok``/``stopped``
          records, None for an OOM (the true peak did not fit) and for a trial whose
          process held more than :data:`~costaware.observation.MAX_HELD_BEFORE` reserved bytes of something
          else when its training started (``actual["held_before"]``; ``meta
          ["memory_left_out"]`` says so, and its times still count);
        - ``iteration_time``: the time per step that an epoch really took, the median
          epoch time of the ``ok`` records over the predicted steps per epoch (data
          loading and the hooks between steps included: what an epoch-time budget sees),
          when that is longer than the median step; else the median step over
          ``ok``/``stopped`` records (``meta["step_time"]`` keeps the median step);
        - ``meta``: ``study``, ``trial``, ``epoch_time`` (the median), ``epochs`` (how
          many ``ok``/``stopped`` records), ``prediction`` (the prediction record).

        Trials come in the order of their first measurement.
        """
        p, m = predictions_table, measurements_table
        # whole rows, so that every reader skips the same malformed ones
        pq = _select(p, *p.c.keys()).where(p.c.features.is_not(None), p.c.trial.is_not(None))
        mq = _select(m, *m.c.keys()).where(m.c.trial.is_not(None))
        if study is not None:
            pq, mq = pq.where(p.c.study == study), mq.where(m.c.study == study)
        with self._reading() as conn:
            preds = self._fetch(conn, p, pq.order_by(p.c.id), warn=False)
            latest = {(r["study"], r["trial"]): r for r in preds}
            runs: dict[tuple[str | None, str], list[dict[str, Any]]] = {}
            for r in self._fetch(conn, m, mq.order_by(m.c.id), warn=False):
                if (r["study"], r["trial"]) in latest:
                    runs.setdefault((r["study"], r["trial"]), []).append(r)
        self._warn_skipped()

        out: list[Observation] = []
        for key, records in runs.items():
            pred = latest[key]
            ran_on = {r["device"] for r in records if r["device"]}
            if pred["device"] and any(_other_device(pred["device"], d) for d in ran_on):
                # predicted for one device, measured on another: the features describe a
                # run that did not happen, so the row would teach the model a false pair
                self._note_mismatch(key, str(pred["device"]), sorted(ran_on))
                continue
            good = [r["actual"] or {} for r in records if r["status"] in ("ok", "stopped")]
            oom = any(r["status"] == "oom" for r in records)
            status = "oom" if oom else ("ok" if good else "error")
            spec = pred["spec"] or {}
            family = spec.get("family") or spec.get("name")
            device = pred["device"] or next((r["device"] for r in records if r["device"]), None)
            nan = float("nan")
            features = {k: nan if v is None else float(v) for k, v in pred["features"].items()}
            step = _median(good, "iteration_time")
            per_step = _epoch_step_time(
                [r["actual"] or {} for r in records if r["status"] == "ok"], pred["prediction"]
            )
            held = _max(good, "held_before") or 0.0
            left_out = None
            if held > MAX_HELD_BEFORE:
                left_out = (
                    f"{held / 2**20:,.0f} MiB was reserved before training started "
                    "(an earlier trial's tensors or a workspace): the peak is not all this trial's"
                )
            peak_ok = status != "oom" and left_out is None
            out.append(
                Observation(
                    features=features,
                    device=device or "unknown",
                    peak_memory=_max(good, "peak_memory") if peak_ok else None,
                    iteration_time=step if step is not None else per_step,
                    status=status,
                    family=None if family is None else str(family),
                    peak_allocated=_max(good, "peak_allocated") if peak_ok else None,
                    meta={
                        "study": key[0],
                        "trial": key[1],
                        "epoch_time": _median(good, "epoch_time"),
                        "step_time": step,
                        "epochs": len(good),
                        "prediction": pred["prediction"],
                    }
                    | ({} if left_out is None else {"memory_left_out": left_out})
                    | (
                        {"step_gap": max(0.0, per_step - step)}
                        if step is not None and per_step is not None
                        else {}
                    ),
                )
            )
        return out

    def _note_mismatch(self, key: tuple[Any, Any], predicted: str, ran_on: list[str]) -> None:
        """Warn once per trial that ran on another device than its prediction's."""
        seen = self.__dict__.setdefault("_mismatched", set())
        if key in seen:
            return
        seen.add(key)
        warnings.warn(
            f"trial {key[1]} of study {key[0]!r} was predicted for {predicted} but ran on "
            f"{', '.join(ran_on)}: it is not learned from (the prediction's features "
            "describe another device's run).",
            CostAwareWarning,
            stacklevel=3,
        )

    def count_observations(self, *, study: str | None = None) -> int:
        """How many rows :meth:`observations` would return, counted in the database."""
        p, m = predictions_table, measurements_table
        # one index probe of (study, trial) per prediction; the two tables are never scanned
        # against each other
        same_study = m.c.study == (p.c.study if study is None else study)
        if study is None:
            same_study = sa.or_(same_study, sa.and_(m.c.study.is_(None), p.c.study.is_(None)))
        measured = sa.exists().where(m.c.trial == p.c.trial, same_study)
        trials = sa.select(p.c.study, p.c.trial).where(
            p.c.features.is_not(None), p.c.trial.is_not(None), measured
        )
        if study is not None:
            trials = trials.where(p.c.study == study)
        query = sa.select(sa.func.count()).select_from(trials.distinct().subquery())
        with self._reading() as conn:
            return int(conn.execute(query).scalar_one())

    # -- internals ------------------------------------------------------------------------
    def _no_driver(self, error: Exception) -> StoreError:
        """The error for a database whose driver is not installed, or whose name is
        misspelt (``postgresql+pyscopg``: did you mean psycopg?)."""
        import difflib

        postgres = self._url.get_backend_name() == "postgresql"
        driver = self._url.get_driver_name()
        known = {
            "postgresql": ("psycopg", "psycopg2", "pg8000", "asyncpg", "psycopg2cffi"),
            "sqlite": ("pysqlite", "aiosqlite", "pysqlcipher"),
            "mysql": ("mysqldb", "pymysql", "mysqlconnector", "asyncmy", "aiomysql"),
        }.get(self._url.get_backend_name(), ())
        close = difflib.get_close_matches(driver, known, n=1) if driver not in known else []
        if close:
            return StoreError(
                f"cannot open the observation store at {self.url}: no driver is called "
                f"{driver!r}; did you mean {close[0]}? ({self._url.get_backend_name()}+"
                f"{close[0]}://...)"
            )
        hint = " (pip install 'costaware[postgres]')" if postgres else ""
        return StoreError(
            f"cannot open the observation store at {self.url}: its database driver is not "
            f"installed{hint}: {_reason(error, self._url)}"
        )

    def _create_engine(self) -> Engine:
        url = self._url
        backend = url.get_backend_name()
        try:
            url.get_dialect()
        except exc.NoSuchModuleError as e:
            import difflib

            known = ("sqlite", "postgresql", "mysql", "mariadb", "oracle", "mssql")
            if backend not in known:  # else a driver that is not installed, said below
                close = difflib.get_close_matches(backend, known, n=1)
                meant = f"; did you mean {close[0]}?" if close else ""
                raise StoreError(
                    f"cannot open the observation store at {self.url}: no database is called "
                    f"{backend!r}{meant} (a URL such as sqlite:///hpo.db or "
                    "postgresql://user:password@host/db)"
                ) from None
            raise self._no_driver(e) from None
        kwargs: dict[str, Any] = {"echo": self._echo, "json_serializer": _dumps}
        if backend == "sqlite":
            if _sqlite_in_memory(url):
                # one shared connection, or each connection would see its own empty database
                kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
                self._lock = threading.RLock()
            else:
                kwargs.update(poolclass=NullPool, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})
        else:
            kwargs.update(pool_pre_ping=True, pool_size=2, max_overflow=8, pool_recycle=1800)
            if url.get_driver_name() in ("psycopg", "psycopg2"):
                # what libpq waits for is bounded: connecting, and (TCP keepalives, the
                # user timeout) a ping or query to a server or network that went away
                kwargs["connect_args"] = {
                    k: v for k, v in _libpq_timeouts(url).items() if k not in url.query
                }
        try:
            engine = sa.create_engine(url, **kwargs)
        except (ImportError, exc.NoSuchModuleError) as e:
            raise self._no_driver(e) from None
        except exc.ArgumentError as e:
            raise StoreError(
                f"cannot open the observation store at {self.url}: {_reason(e, url)}"
            ) from None
        if backend == "sqlite":
            _sqlite_events(engine, wal=not _sqlite_in_memory(url))
        else:
            _fork_safety(engine)
            _bounded_ping(engine)
        return engine

    def _ensure_schema(self) -> None:
        version: str | None = None
        try:  # first contact, read-only: a failure here is "cannot reach", not worth retrying
            with self._locked(), self._engine.connect() as conn:
                inspector = sa.inspect(conn)
                if all(inspector.has_table(t.name) for t in metadata.sorted_tables):
                    version = conn.execute(
                        sa.select(meta_table.c.value).where(meta_table.c.key == _SCHEMA_KEY)
                    ).scalar_one_or_none()
        except exc.DBAPIError as e:
            raise self._open_error(e) from None

        backend = self._url.get_backend_name()
        attempts = 1 if backend in ("sqlite", "postgresql") else 5  # those two lock; others race
        for attempt in range(attempts if version is None else 0):  # create what is missing
            try:
                with self._locked(), self._writer.begin() as conn:
                    if backend == "postgresql":  # serialise concurrent first opens
                        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_LOCK_KEY)))
                    metadata.create_all(conn, checkfirst=True)
                    version = conn.execute(
                        sa.select(meta_table.c.value).where(meta_table.c.key == _SCHEMA_KEY)
                    ).scalar_one_or_none()
                    if version is None:
                        version = str(SCHEMA_VERSION)
                        conn.execute(meta_table.insert().values(key=_SCHEMA_KEY, value=version))
                break
            except exc.DBAPIError as e:  # another process created the same table first
                if attempt == attempts - 1:
                    raise self._open_error(e) from None
                time.sleep(0.05 * (attempt + 1))
        try:
            found = int(str(version))
        except ValueError:
            raise StoreError(
                f"the observation store at {self.url} has an unreadable schema version "
                f"({version!r} in costaware_meta); it was not written by costaware."
            ) from None
        if found > SCHEMA_VERSION:
            raise StoreError(
                f"the observation store at {self.url} has schema version {found}, but this "
                f"costaware understands versions up to {SCHEMA_VERSION}; upgrade costaware "
                "(pip install -U costaware) to use it."
            )

    def _failed(self, doing: str, e: exc.DBAPIError) -> StoreError:
        """The error for a read or write that failed: :class:`StoreUnreachable` when the
        server stopped answering (connecting timed out or was refused, or the connection
        dropped), else :class:`StoreError`. A store opened with ``retry`` is then treated as
        down, as at opening: until the next try is due, its reads and writes raise at once
        instead of each waiting out the connection timeout again."""
        text = f"{doing} the observation store at {self.url}: {_reason(e, self._url)}"
        lost = e.connection_invalidated or e.statement is None  # not a statement's own error
        if not (lost and _unreachable(e, self._url)):
            return StoreError(text)
        down = StoreUnreachable(text)
        if self._retry and self._ready:
            self._mark_down(down, stacklevel=4)
        return down

    def _open_error(self, e: exc.DBAPIError) -> StoreError:
        """:class:`StoreUnreachable` when a server did not answer, else :class:`StoreError`."""
        text = self._cannot_open(e)
        if _unreachable(e, self._url):
            return StoreUnreachable(text)
        return StoreError(text)

    def _cannot_open(self, e: BaseException) -> str:
        reason = _reason(e, self._url)
        path = self.path
        if path is not None and not path.parent.is_dir():
            reason += f" (the directory {path.parent} does not exist)"
        elif path is not None and not os.access(path.parent, os.W_OK):
            reason += (
                f" (the directory {path.parent} is not writable: SQLite keeps its journal "
                "beside the file, so even a store that exists needs it; give the store a path "
                "in a writable directory)"
            )
        return f"cannot open the observation store at {self.url}: {reason}"

    def _locked(self) -> contextlib.AbstractContextManager[Any]:
        return self._lock if self._lock is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Connection]:
        self._check_fork()
        self._check_ready()
        try:
            with self._locked(), self._engine.begin() as conn:
                yield conn
        except exc.DBAPIError as e:
            raise self._failed("cannot read", e) from None

    def _insert(self, table: sa.Table, row: dict[str, Any]) -> int:
        self._check_fork()
        self._check_ready()
        for attempt in range(2):
            try:
                with self._locked(), self._writer.begin() as conn:
                    pk = conn.execute(table.insert().values(**row)).inserted_primary_key
                    if pk is None:  # pragma: no cover - every SQLAlchemy dialect returns it
                        raise StoreError(f"the observation store at {self.url} returned no row id.")
                    return int(pk[0])
            except exc.DBAPIError as e:
                if attempt == 0 and _table_gone(e):
                    self._recreate(e)
                    continue
                raise self._failed("cannot write to", e) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _recreate(self, error: exc.DBAPIError) -> None:
        """Create the store's tables again where they went away while it was open (its
        SQLite file deleted, its tables dropped), saying so once: the records written
        before are gone, and the ones to come are kept."""
        warnings.warn(
            f"the observation store at {self.url} lost its tables while in use "
            f"({_reason(error, self._url)}): created them again. What was recorded before "
            "is gone; the records from now on are kept.",
            CostAwareWarning,
            stacklevel=4,
        )
        self._ensure_schema()

    def _rows(self, table: sa.Table, study: str | None, status: str | None) -> list[dict[str, Any]]:
        query = _select(table, *table.c.keys())
        if study is not None:
            query = query.where(table.c.study == study)
        if status is not None:
            query = query.where(table.c.status == status)
        with self._reading() as conn:
            return self._fetch(conn, table, query.order_by(table.c.id))

    def _fetch(
        self, conn: Connection, table: sa.Table, query: sa.Select[Any], *, warn: bool = True
    ) -> list[dict[str, Any]]:
        """The rows of ``query`` (made by :func:`_select`) that have the shape this class
        writes, decoded; the others are skipped and remembered in :attr:`skipped`."""
        dialect = conn.dialect
        decoders = {
            name: proc
            for name in _DECODED
            if name in table.c
            and (proc := table.c[name].type.dialect_impl(dialect).result_processor(dialect, None))
        }
        out = []
        bad: dict[tuple[str, int], str] = {}
        for raw in conn.execute(query).mappings():
            d = dict(raw)
            problem = _decode(d, decoders) or _shape_problem(table, d)
            if problem is None:
                out.append(d)
            else:
                bad[(table.name, int(d["id"]))] = problem
        if bad:
            with self._skipped_lock:
                for key, why in bad.items():
                    if key not in self._skipped:
                        self._skipped[key] = why
                        self._unwarned.add(key)
        if warn:
            self._warn_skipped()
        return out

    def _warn_skipped(self) -> None:
        """One :class:`~costaware.errors.CostAwareWarning` for the malformed rows found
        since the last one: how many, where, and why."""
        with self._skipped_lock:
            if not self._unwarned:
                return
            fresh = sorted(self._unwarned)
            self._unwarned.clear()
            reasons = [self._skipped[k] for k in fresh]
        by_reason: dict[str, int] = {}
        for why in reasons:
            by_reason[why] = by_reason.get(why, 0) + 1
        shown = sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))
        why_text = "; ".join(f"{why} ({n} row{'s' * (n > 1)})" for why, n in shown[:5])
        if len(shown) > 5:
            why_text += f"; and {len(shown) - 5} other kinds"
        where = ", ".join(f"{t} id {i}" for t, i in fresh[:10])
        if len(fresh) > 10:
            where += f", and {len(fresh) - 10} more"
        warnings.warn(
            f"costaware skipped {len(fresh)} malformed row(s) of the observation store at "
            f"{self.url} ({where}): {why_text}. They were not written by costaware, or were "
            "damaged; reports and refits leave them out.",
            CostAwareWarning,
            stacklevel=3,
        )


def _reopen(url: str, echo: bool, retry: bool = False) -> ObservationStore:
    return ObservationStore(url, echo=echo, retry=retry)


_LIVE_STORES: weakref.WeakSet[ObservationStore] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_LIVE_STORES):
        with contextlib.suppress(Exception):  # the per-use process-id check tries again
            store._after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)

# A server that answers and refuses: the caller's to fix, not worth waiting for.
_REFUSALS: Final = (
    "password authentication failed",
    "authentication failed",
    "no pg_hba.conf entry",
    "does not exist",
    "permission denied",
    "access denied",
)


def _unreachable(e: exc.DBAPIError, url: URL) -> bool:
    """Whether ``e`` says the database server did not answer (not that it refused)."""
    if url.get_backend_name() == "sqlite":
        return False
    if not isinstance(e, (exc.OperationalError, exc.InterfaceError)):
        return False
    text = _reason(e, url).lower()
    return not any(marker in text for marker in _REFUSALS)


# --------------------------------------------------------------------------------------
# engines
# --------------------------------------------------------------------------------------
#: the databases whose URL a path-like string may have meant ("sqlite:/tmp/x.db")
_SCHEMES = frozenset({"sqlite", "postgresql", "postgres", "mysql", "mariadb"})


def _to_url(url: str | os.PathLike[str] | None) -> URL:
    if url is None:
        url = DEFAULT_URL
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if isinstance(url, URL):
        parsed = url
    elif isinstance(url, str):
        if "://" not in url:  # a plain path: a SQLite file there
            if not url.strip():
                raise ValueError("url must be a SQLAlchemy URL or a file path, but got ''.")
            scheme, colon, rest = url.partition(":")
            if colon and rest.startswith("/") and scheme.split("+")[0] in _SCHEMES:
                # "sqlite:/tmp/x.db" would be a file named so in a folder "sqlite:"
                meant = f"{scheme}:///{rest}" if scheme.startswith("sqlite") else (
                    f"{scheme}://{rest.lstrip('/')}"
                )
                raise ValueError(
                    f"url {url!r} is neither a URL (it lacks the '//' after '{scheme}:') nor "
                    f"a path; did you mean '{meant}'?"
                )
            parsed = URL.create("sqlite", database=url)
        else:
            try:
                parsed = make_url(url)
            except (exc.ArgumentError, ValueError):
                raise ValueError(
                    "url must be a SQLAlchemy URL such as 'sqlite:///hpo.db' or "
                    "'postgresql+psycopg://user:password@host/db', but got a string that "
                    "SQLAlchemy cannot parse."
                ) from None
    else:
        raise TypeError(f"url must be a str, an os.PathLike or None, but got {type(url).__name__}.")
    if (
        parsed.get_backend_name() == "sqlite"
        and not _sqlite_in_memory(parsed)
        and "uri" not in parsed.query  # file:... URIs are the driver's business
    ):
        path = pathlib.Path(str(parsed.database)).expanduser()
        parsed = parsed.set(database=str(path.absolute()))
    if parsed.drivername == "postgresql" and _missing("psycopg2") and not _missing("psycopg"):
        parsed = parsed.set(drivername="postgresql+psycopg")  # the driver costaware installs
    return parsed


def _libpq_timeouts(url: URL) -> dict[str, int]:
    """libpq's connection parameters that bound how long a connection can wait."""
    out = {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "keepalives": 1,
        "keepalives_idle": KEEPALIVE_IDLE_S,
        "keepalives_interval": 10,
        "keepalives_count": 3,
    }
    if _libpq_version(url.get_driver_name()) >= 120000:  # libpq 12 added it (Linux only)
        out["tcp_user_timeout"] = TCP_USER_TIMEOUT_S * 1000
    return out


def _libpq_version(driver: str) -> int:
    try:
        if driver == "psycopg":
            import psycopg

            return int(psycopg.pq.version())
        import psycopg2.extensions

        return int(psycopg2.extensions.libpq_version())
    except Exception:  # no driver: create_engine says so
        return 0


def _missing(module: str) -> bool:
    return importlib.util.find_spec(module) is None


def _sqlite_in_memory(url: URL) -> bool:
    db = url.database
    return not db or db == ":memory:" or url.query.get("mode") == "memory"


def _sqlite_events(engine: Engine, *, wal: bool) -> None:
    busy_ms = int(SQLITE_BUSY_TIMEOUT_S * 1000)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: ConnectionPoolEntry) -> None:
        # SQLAlchemy emits BEGIN itself (below), so that a write can take the lock up front
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            if wal:
                _set_wal(cursor)
                # in WAL mode, NORMAL still commits atomically and survives a crashed
                # process; only a power cut can drop the last commits. One fsync per
                # checkpoint instead of one per record.
                cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # BEGIN IMMEDIATE waits (busy_timeout) for the write lock before anything else, so
        # a writer never has to upgrade a read lock, the one case where SQLite gives up
        # with "database is locked" at once.
        immediate = conn.get_execution_options().get(_WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _set_wal(cursor: Any) -> None:
    """``PRAGMA journal_mode = WAL``, waiting for processes that open the same new file.

    Switching a database to WAL needs it to itself, and SQLite answers "database is
    locked" at once instead of calling the busy handler, so several workers opening a
    fresh store together would fail; this retries, with backoff, up to the busy timeout.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    pause = 0.01
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.2)


def _fork_safety(engine: Engine) -> None:
    """Never hand a pooled connection across a fork (SQLAlchemy's documented recipe)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: ConnectionPoolEntry) -> None:
        record.info["pid"] = os.getpid()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        if record.info.get("pid") != os.getpid():
            record.dbapi_connection = proxy.dbapi_connection = None
            raise exc.DisconnectionError("connection was opened in another process")


def _bounded_ping(engine: Engine) -> None:
    """Make the pool's check of a connection before use (``pool_pre_ping``) give up after
    :data:`PING_TIMEOUT_S`: a timer hangs the socket up, the ping fails as a
    disconnection, and SQLAlchemy replaces the pool's connections. TCP keepalives bound a
    dead server; this bounds one that is alive and does not answer."""
    dialect = engine.dialect  # this engine's own instance
    ping = dialect.do_ping

    def do_ping(dbapi_connection: Any) -> bool:
        timer = threading.Timer(PING_TIMEOUT_S, _hang_up, (dbapi_connection, engine.url))
        timer.daemon = True
        timer.start()
        try:
            return ping(dbapi_connection)
        finally:
            timer.cancel()

    setattr(dialect, "do_ping", do_ping)  # noqa: B010 - an instance, not the class


def _hang_up(dbapi_connection: Any, url: URL) -> None:
    """Shut the connection's socket down (both ways), waking whoever waits on it."""
    import socket

    try:
        dup = socket.socket(fileno=os.dup(dbapi_connection.fileno()))
    except Exception:  # closed meanwhile, or no socket to shut
        return
    try:
        dup.shutdown(socket.SHUT_RDWR)  # acts on the socket, not just this descriptor
    except OSError:
        pass
    finally:
        dup.close()
    log.warning(
        "costaware: the observation store at %s did not answer a connection check in %g s; "
        "the connection was dropped and a new one is opened.",
        url.render_as_string(hide_password=True),
        PING_TIMEOUT_S,
    )


def _sentence(text: str) -> str:
    """``text`` ending as a sentence does."""
    return text if text.endswith((".", "?", "!")) else text + "."


def _reason(e: BaseException, url: URL) -> str:
    """The driver's message on one line, with the password (if any) masked."""
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e) or type(e).__name__
    text = " ".join(text.split())
    if url.password:
        # the password where a driver writes one (a URL's user:password@, a DSN's
        # password=...), not every occurrence of its text: a password that is a common
        # word ("costaware") would mask that word throughout the message
        pw = re.escape(str(url.password))
        text = re.sub(rf"(://[^\s:/@]*:){pw}@", r"\1***@", text)
        text = re.sub(rf"(password\s*=\s*['\"]?){pw}", r"\1***", text, flags=re.IGNORECASE)
    return text


# columns whose values SQLAlchemy decodes (JSON text, SQLite's date strings): read raw and
# decoded row by row, so that one that does not decode skips its row, not the whole read
_DECODED: Final = ("created_at", "spec", "features", "prediction", "decision", "meta", "actual")
_OBJECTS: Final = ("spec", "features", "prediction", "decision", "meta", "actual")


def _select(table: sa.Table, *names: str) -> sa.Select[Any]:
    """``SELECT names FROM table``, the decoded columns as they are stored."""
    cols: list[Any] = [
        sa.type_coerce(table.c[n], sa.Text).label(n) if n in _DECODED else table.c[n] for n in names
    ]
    return sa.select(*cols)


def _decode(row: dict[str, Any], decoders: Mapping[str, Any]) -> str | None:
    """Decode ``row``'s raw columns in place; what did not decode, or None."""
    for name, decode in decoders.items():
        if name not in row or row[name] is None:
            continue
        try:
            row[name] = decode(row[name])
        except (ValueError, TypeError, OverflowError):  # json.JSONDecodeError is a ValueError
            return f"{name} is not valid JSON" if name in _OBJECTS else f"{name} is unreadable"
    return None


def _shape_problem(table: sa.Table, row: dict[str, Any]) -> str | None:
    """What makes ``row`` unlike the rows this module writes (normalising
    ``created_at`` to aware UTC), or None."""
    if "created_at" in row:
        created = row["created_at"]
        if not isinstance(created, _dt.datetime):
            return "created_at is not a date and time"
        row["created_at"] = (  # SQLite hands back naive UTC
            created.replace(tzinfo=_dt.timezone.utc)
            if created.tzinfo is None
            else created.astimezone(_dt.timezone.utc)
        )
    for name in ("study", "trial", "device", "reason"):
        value = row.get(name)
        if value is not None and not isinstance(value, str):
            return f"{name} is not text ({_kind(value)})"
    if "status" in row:
        valid = PREDICTION_STATUSES if table is predictions_table else MEASUREMENT_STATUSES
        if row["status"] not in valid:
            return f"status {str(row['status'])[:40]!r} is unknown"
    epoch = row.get("epoch")
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0):
        return f"epoch is not a whole number >= 0 ({_kind(epoch)})"
    for name in _OBJECTS:
        value = row.get(name)
        if value is not None and not isinstance(value, dict):
            return f"{name} is not a JSON object ({_kind(value)})"
    for key, value in (row.get("features") or {}).items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"features[{str(key)[:40]!r}] is not a number ({_kind(value)})"
        try:
            float(value)
        except OverflowError:
            return f"features[{str(key)[:40]!r}] is out of range"
    return None


def _kind(value: object) -> str:
    """A JSON value's kind, in words."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


# --------------------------------------------------------------------------------------
# values
# --------------------------------------------------------------------------------------
def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value, allow_nan=False, separators=(",", ":"))


def _status(status: object, valid: tuple[str, ...]) -> str:
    if status not in valid:
        raise ValueError(
            f"status must be one of {', '.join(map(repr, valid))}, but got {status!r}."
        )
    return str(status)


def _name(value: object, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str or None, but got {type(value).__name__}.")
    if len(value) > _MAX_NAME:
        raise ValueError(
            f"{what} must be at most {_MAX_NAME} characters, but got {len(value)} characters."
        )
    return value


def _trial(trial: object) -> str | None:
    if trial is None:
        return None
    if isinstance(trial, bool) or not isinstance(trial, (str, int)):
        if type(trial).__module__ == "numpy" and hasattr(trial, "item"):
            return _trial(trial.item())
        raise TypeError(f"trial must be a str, an int or None, but got {type(trial).__name__}.")
    return _name(str(trial), "trial")


def _epoch(epoch: object) -> int | None:
    if epoch is None:
        return None
    if type(epoch).__module__ == "numpy" and hasattr(epoch, "item"):
        epoch = epoch.item()
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        raise TypeError(f"epoch must be an int or None, but got {type(epoch).__name__}.")
    if epoch < 0:
        raise ValueError(f"epoch must be at least 0, but got {epoch=}.")
    return epoch


def _text(value: object, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str or None, but got {type(value).__name__}.")
    return value


def _mapping(value: object, what: str, *, optional: bool = True) -> dict[str, Any] | None:
    if value is None and optional:
        return None
    if not isinstance(value, Mapping):
        allowed = "a mapping or None" if optional else "a mapping"
        raise TypeError(f"{what} must be {allowed}, but got {type(value).__name__}.")
    out = _jsonable(value, what)
    assert isinstance(out, dict)
    return out


def _features(features: object) -> dict[str, float | None] | None:
    if features is None:
        return None
    if not isinstance(features, Mapping):
        raise TypeError(f"features must be a mapping or None, but got {type(features).__name__}.")
    out: dict[str, float | None] = {}
    for key, value in features.items():
        if not isinstance(key, str):
            raise TypeError(f"features keys must be str, but got {type(key).__name__} {key!r}.")
        v = _jsonable(value, f"features[{key!r}]")
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise TypeError(f"features[{key!r}] must be a number, but got {type(value).__name__}.")
        out[key] = None if v is None else float(v)
    return out


def _jsonable(value: Any, where: str) -> Any:
    """``value`` as JSON: NaN/inf to None, numpy and torch scalars and arrays to Python."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int) and not isinstance(value, enum.Enum):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {_key(k, where): _jsonable(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if type(value).__module__.split(".")[0] in ("numpy", "torch") and hasattr(value, "tolist"):
        return _jsonable(value.tolist(), where)
    if isinstance(value, enum.Enum):
        return _jsonable(value.value, where)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value), where)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return _jsonable(to_dict(), where)
    raise TypeError(f"{where} must be JSON-serialisable, but got {type(value).__name__}.")


def _key(key: object, where: str) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, (int, float)):  # what json.dumps does with them
        return str(key)
    raise TypeError(f"{where} keys must be str, but got {type(key).__name__} {key!r}.")


def _numbers(records: list[dict[str, Any]], key: str) -> list[float]:
    out = []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
    return out


def _max(records: list[dict[str, Any]], key: str) -> float | None:
    values = _numbers(records, key)
    return max(values) if values else None


def _median(records: list[dict[str, Any]], key: str) -> float | None:
    values = _numbers(records, key)
    return float(statistics.median(values)) if values else None


def _epoch_step_time(records: list[dict[str, Any]], prediction: Any) -> float | None:
    """The median over epochs of an epoch's time over its steps: the steps the epoch
    measured (``actual["steps"]``), else the predicted steps per epoch (None if unknown)."""
    spec = prediction.get("spec") if isinstance(prediction, dict) else None
    predicted = spec.get("steps_per_epoch") if isinstance(spec, dict) else None
    per_step = []
    for r in records:
        epoch, steps = r.get("epoch_time"), r.get("steps") or predicted
        if (
            isinstance(epoch, int | float)
            and epoch > 0
            and isinstance(steps, int | float)
            and steps >= 1
        ):
            per_step.append(float(epoch) / float(steps))
    return float(statistics.median(per_step)) if per_step else None
