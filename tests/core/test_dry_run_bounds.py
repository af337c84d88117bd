"""The dry run is bounded: in time (building the model and tracing it, under one limit that
the user's code cannot swallow, and a timed-out dry run stops), in memory (a model built
for real when it fails on meta), and it leaves the user's timers and signal handlers alone.

Each test that could hang on a regression carries its own ``timeout`` (thread method: the
signal method's SIGALRM is what these tests check is left alone).
"""

from __future__ import annotations

import inspect
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import nn

import costaware as ca
from costaware.core.trace import available_memory, default_real_build_limit
from costaware.runtime.gate import Gate

pytestmark = pytest.mark.timeout(120, method="thread")


class _Opaque:
    """A closure over one of these leaves a factory without a fingerprint: it has no
    attributes to describe (no ``__dict__``), unlike a settings object."""

    __slots__ = ()


def _spec(model: Callable[[], nn.Module] | type[nn.Module]) -> ca.TrainingSpec:
    return ca.TrainingSpec(model=model, batch=ca.ImageBatch((8,), classes=8), batch_size=2)


def _dry_run_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("costaware-dry-run")]


def _wait_until_stopped(bound: float = 30.0) -> list[threading.Thread]:
    """The dry-run threads still alive after waiting up to ``bound`` seconds for them."""
    end = time.monotonic() + bound
    while _dry_run_threads() and time.monotonic() < end:
        time.sleep(0.05)
    return _dry_run_threads()


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    """One dry run first: a process's first imports and compiles for seconds, and the
    tests' short limits are meant for the user's code."""
    ca.dry_run(_spec(lambda: nn.Linear(8, 8)), timeout=None)


@pytest.fixture(autouse=True)
def _no_dry_run_left() -> Iterator[None]:
    assert not _wait_until_stopped(), "a dry run from an earlier test is still running"
    _CatchesException.entered.clear()
    yield


def _spin() -> nn.Module:
    while True:
        pass


def test_a_factory_that_loops_forever_times_out_and_its_thread_stops() -> None:
    before = threading.active_count()
    with pytest.raises(ca.TraceTimeout, match="time limit of 1 s; it was stopped"):
        ca.dry_run(_spec(_spin), timeout=1.0)
    assert not _wait_until_stopped()
    assert threading.active_count() == before


def test_a_factory_that_catches_exception_times_out_once() -> None:
    """A factory whose own ``except Exception`` would swallow a timeout raised inside it
    times out, built once: the build is not run again outside the limit."""
    calls = []

    def factory() -> nn.Module:
        calls.append(1)
        while True:
            try:  # noqa: SIM105 (the user's pattern, as written)
                sum(range(100_000))  # where a timeout lands: inside the try
            except Exception:
                pass

    with pytest.raises(ca.TraceTimeout, match="time limit"):
        ca.dry_run(_spec(factory), timeout=1.0)
    assert not _wait_until_stopped()
    assert calls == [1]


class _CatchesException(nn.Module):
    entered: list[int] = []  # noqa: RUF012 (forward calls, for the tests to check)

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.entered.append(1)
        while True:
            try:
                sum(range(100_000))
                x = x + 0
            except Exception:
                pass


class _CatchesEverything(_CatchesException):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.entered.append(1)
        n = 0
        while True:
            try:  # noqa: SIM105
                n = n + 1
            except:  # noqa: E722 (the point: a loop that catches everything)
                pass


class _CatchesEverythingAroundTorch(_CatchesException):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.entered.append(1)
        while True:
            try:  # noqa: SIM105
                x = x + 0
            except:  # noqa: E722
                pass


@pytest.mark.parametrize(
    "cls", [_CatchesException, _CatchesEverything, _CatchesEverythingAroundTorch]
)
def test_a_forward_that_catches_every_exception_times_out(cls: type[nn.Module]) -> None:
    with pytest.raises(ca.TraceTimeout, match="time limit"):
        ca.dry_run(_spec(cls), timeout=1.0)
    assert _CatchesException.entered == [1]
    assert not _wait_until_stopped()


def test_a_dry_run_in_a_worker_thread_stops_after_its_timeout() -> None:
    """As Optuna's ``n_jobs`` threads run it: the timeout reaches that thread, and the dry
    run's own thread is gone afterwards instead of burning a core."""
    errors: list[BaseException] = []

    def trial() -> None:
        try:
            ca.dry_run(_spec(_CatchesException), timeout=1.0)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=trial)
    t.start()
    t.join(60)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ca.TraceTimeout)
    assert _CatchesException.entered == [1]
    assert not _wait_until_stopped()


def test_a_factory_without_a_fingerprint_is_built_under_the_time_limit() -> None:
    """Keying the trace cache builds such a factory: that build is under the limit too."""
    opaque = _Opaque()

    def factory() -> nn.Module:
        assert opaque is not None
        return _spin()

    spec = _spec(factory)
    assert spec.architecture_key() is None
    with pytest.raises(ca.TraceTimeout, match="time limit"):
        ca.CostModel(trace_timeout=1.0).predict(spec, "cpu")
    assert not _wait_until_stopped()


def test_a_dry_run_stuck_in_one_native_call_is_reported_and_stops_when_it_returns() -> None:
    """One call into C (here a sleep) cannot be interrupted: the caller is told so at the
    deadline, and the thread stops as soon as the call returns."""

    def factory() -> nn.Module:
        time.sleep(5)
        return nn.Linear(8, 8)

    with pytest.raises(ca.TraceTimeout, match=r"native \(C\+\+\) call"):
        ca.dry_run(_spec(factory), timeout=0.5)
    assert not _wait_until_stopped()


def test_a_timed_out_prediction_admits_the_trial_with_the_reason() -> None:
    """A timeout is costaware's failure: the gate fails open and records why."""
    gate = Gate(ca.Budget(max_memory="1GiB"), device="cpu", model=ca.CostModel(trace_timeout=1.0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        verdict = gate.judge(_spec(_CatchesException), study=None, trial=7)
    assert verdict.admit and _CatchesException.entered == [1]
    assert verdict.info["error"].startswith("prediction failed: TraceTimeout")
    assert any(issubclass(w.category, ca.CostAwareWarning) for w in caught)
    assert not _wait_until_stopped()


# --------------------------------------------------------------------------------------
# the user's timers and signal handlers
# --------------------------------------------------------------------------------------
@pytest.fixture
def _own_sigalrm() -> Iterator[None]:
    """The test's SIGALRM handler and timer, put back as pytest-timeout had them."""
    handler, timer = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
        if timer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, *timer)


@pytest.mark.usefixtures("_own_sigalrm")
def test_the_users_alarm_and_handler_are_left_as_they_were() -> None:
    fired: list[float] = []

    def handler(signum: int, frame: object) -> None:
        fired.append(time.monotonic())

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 30.0, 7.0)
    model = ca.CostModel(trace_timeout=30.0)
    model.predict(_spec(lambda: nn.Linear(8, 8)), "cpu")  # traced
    with pytest.raises(ca.TraceTimeout):
        ca.dry_run(_spec(_CatchesException), timeout=1.0)  # timed out
    left, interval = signal.getitimer(signal.ITIMER_REAL)
    assert signal.getsignal(signal.SIGALRM) is handler
    assert 0 < left <= 30.0 and interval == pytest.approx(7.0)
    # a timer that comes due during a dry run fires, into the user's handler
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    with pytest.raises(ca.TraceTimeout):
        ca.dry_run(_spec(_CatchesException), timeout=1.5)
    assert fired and signal.getsignal(signal.SIGALRM) is handler
    assert not _wait_until_stopped()


@pytest.mark.usefixtures("_own_sigalrm")
def test_the_users_alarm_that_raises_interrupts_the_dry_run_and_stops_it() -> None:
    class UsersTimeout(Exception):
        pass

    def handler(signum: int, frame: object) -> None:
        raise UsersTimeout

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    with pytest.raises(UsersTimeout):
        ca.dry_run(_spec(_CatchesException), timeout=60.0)
    assert not _wait_until_stopped()


# --------------------------------------------------------------------------------------
# a real build is bounded
# --------------------------------------------------------------------------------------
class _ReadsAValue(nn.Module):
    """Reads a weight's value in its constructor (fails on meta); 16 MiB of weights."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(512, 512)
        self.scale = float(self.first.weight.detach().std())
        self.rest = nn.ModuleList(nn.Linear(512, 512) for _ in range(15))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.first(x)


class _ReadsAndCatches(_ReadsAValue):
    """Goes on building after a failure of its own, whatever it was."""

    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.first = nn.Linear(512, 512)
        self.scale = float(self.first.weight.detach().std())
        self.rest = nn.ModuleList()
        for _ in range(15):
            try:  # noqa: SIM105
                self.rest.append(nn.Linear(512, 512))
            except Exception:
                pass


def _line_of(cls: type, text: str) -> int:
    lines, start = inspect.getsourcelines(cls)
    return start + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize("cls", [_ReadsAValue, _ReadsAndCatches])
def test_a_real_build_past_its_limit_is_refused_naming_the_line_that_failed_on_meta(
    cls: type[nn.Module],
) -> None:
    spec = ca.TrainingSpec(model=cls, batch=ca.ImageBatch((512,), classes=8), batch_size=2)
    with pytest.raises(ca.UntraceableModelError) as info:
        ca.dry_run(spec, real_build_limit=4 * 2**20)
    msg = str(info.value)
    line = _line_of(cls, "float(self.first.weight.detach().std())")
    assert f"{__file__}:{line}" in msg
    assert "float(self.first.weight.detach().std())" in msg
    assert "constructor failed on the meta device" in msg and "4.0 MiB" in msg
    assert "do not read tensor values" in msg
    # within the limit it is built for real, as before
    assert ca.dry_run(spec, real_build_limit=64 * 2**20).build == "cpu"


def test_a_real_build_that_would_fill_more_than_the_memory_available_is_refused_first() -> None:
    """``torch.zeros`` writes every byte at once: its size is checked before it runs."""

    class Huge(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)
            # a value read, which fails on meta; true for any real weights
            if self.fc.weight.detach().abs().sum() >= 0:
                self.register_buffer("table", torch.zeros(2**40, dtype=torch.uint8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x)

    with pytest.raises(ca.UntraceableModelError, match="this machine has available"):
        ca.dry_run(_spec(Huge))


class _PlainAttribute(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)
        self.mask = torch.ones(64)  # not a buffer: stays on meta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.mask


def test_a_tensor_left_on_meta_is_built_for_real_only_within_the_limit() -> None:
    spec = ca.TrainingSpec(
        model=_PlainAttribute, batch=ca.ImageBatch((64,), classes=8), batch_size=2
    )
    assert ca.dry_run(spec).build == "cpu"
    with pytest.raises(ca.UntraceableModelError, match="register_buffer") as info:
        ca.dry_run(spec, real_build_limit=8 * 2**10)  # less than its 16.3 KiB of weights
    assert f"{__file__}:{_line_of(_PlainAttribute, 'self.fc(x) * self.mask')}" in str(info.value)


def test_the_default_real_build_limit_is_half_the_memory_available() -> None:
    avail = available_memory()
    assert avail is not None and avail > 0
    assert 0 < default_real_build_limit() <= avail
