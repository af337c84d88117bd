"""torch's log of a failing op silenced in the dry run's thread: the error the dry run
raises says what happened, and the user's logging and other threads' records stay as
they were.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Iterator

#: torch's loggers that report an op failing inside a dry run (FakeTensorMode logs every
#: meta kernel that raises, with its traceback, at ERROR): silenced in the dry run's
#: thread while it runs, as the error it raises says what happened
_QUIET_LOGGERS = (
    "torch._subclasses.fake_tensor",
    "torch._subclasses.meta_utils",
    "torch.fx.experimental.symbolic_shapes",
)
#: set in a thread (context) whose records of ``_QUIET_LOGGERS`` are dropped
_QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("costaware_quiet", default=False)
_QUIET_LOCK = threading.Lock()
_QUIET_USERS = 0


class _DryRunLogFilter(logging.Filter):
    """Drops the records logged from inside a dry run; every other thread's pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _QUIET.get()


_LOG_FILTER = _DryRunLogFilter()


@contextlib.contextmanager
def _quiet_torch_logs() -> Iterator[None]:
    """Silence ``_QUIET_LOGGERS`` for this thread while the block runs.

    A filter on those loggers, added while any dry run is in progress and removed after the
    last, drops the records of the threads inside one: the levels, handlers and filters the
    user set stay as they are, and other threads log as before.
    """
    global _QUIET_USERS
    with _QUIET_LOCK:
        if _QUIET_USERS == 0:
            for name in _QUIET_LOGGERS:
                logging.getLogger(name).addFilter(_LOG_FILTER)
        _QUIET_USERS += 1
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)
        with _QUIET_LOCK:
            _QUIET_USERS -= 1
            if _QUIET_USERS == 0:
                for name in _QUIET_LOGGERS:
                    logging.getLogger(name).removeFilter(_LOG_FILTER)
