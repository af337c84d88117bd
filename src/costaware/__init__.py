"""costaware: predict a training trial's peak GPU memory and epoch time before it runs.

Example:
    >>> import costaware as ca
    >>> from costaware import zoo
    >>> spec = ca.TrainingSpec(model=lambda: zoo.mlp(784, (256,), 10),
    ...                        batch=ca.ImageBatch((784,), classes=10), batch_size=64)
    >>> pred = ca.CostModel.default().predict(spec, device="H100")
    >>> pred.peak_memory > 0
    True
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from costaware import _moved
from costaware.errors import CostawareError as CostawareError
from costaware.errors import CostAwareWarning as CostAwareWarning
from costaware.errors import NotEnoughObservations as NotEnoughObservations
from costaware.errors import NotFittedError as NotFittedError
from costaware.errors import SpecError as SpecError
from costaware.errors import TraceError as TraceError
from costaware.errors import TraceTimeout as TraceTimeout
from costaware.errors import TrialRejected as TrialRejected
from costaware.errors import UntraceableModelError as UntraceableModelError
from costaware.errors import UserCodeError as UserCodeError

if TYPE_CHECKING:
    from costaware._format import fmt_bytes as fmt_bytes
    from costaware._format import fmt_seconds as fmt_seconds
    from costaware.budget import Budget as Budget
    from costaware.budget import BudgetError as BudgetError
    from costaware.budget import Decision as Decision
    from costaware.budget import Reason as Reason
    from costaware.budget import parse_bytes as parse_bytes
    from costaware.budget import parse_duration as parse_duration
    from costaware.core.batch_size import BatchSizeResult as BatchSizeResult
    from costaware.core.batch_size import NothingFitsError as NothingFitsError
    from costaware.core.model import CostModel as CostModel
    from costaware.core.prediction import Prediction as Prediction
    from costaware.core.trace import Trace as Trace
    from costaware.core.trace import dry_run as dry_run
    from costaware.devices import CATALOG as CATALOG
    from costaware.devices import Device as Device
    from costaware.devices import UnknownDeviceError as UnknownDeviceError
    from costaware.devices import get_device as get_device
    from costaware.devices import known_devices as known_devices
    from costaware.observation import Observation as Observation
    from costaware.reporting import Report as Report
    from costaware.reporting import ReportError as ReportError
    from costaware.reporting import report as report
    from costaware.runtime.refit import OnlineRefit as OnlineRefit
    from costaware.runtime.store import ObservationStore as ObservationStore
    from costaware.runtime.store import StoreError as StoreError
    from costaware.spec import ImageBatch as ImageBatch
    from costaware.spec import SegmentationBatch as SegmentationBatch
    from costaware.spec import TokenBatch as TokenBatch
    from costaware.spec import TrainingSpec as TrainingSpec
    from costaware.spec import default_loss as default_loss

__version__ = "0.1.0"

_moved.install()  # the flat module paths (costaware.model, ...) keep working

# Imported on first use: a process that only opens the store (a Ray or Optuna worker)
# or only measures (costaware.measure.profile on a bare GPU box) does not pay for torch's fake
# tensors, CatBoost or SQLAlchemy it never touches.
_LAZY = {
    "fmt_bytes": "costaware._format",
    "fmt_seconds": "costaware._format",
    "BatchSizeResult": "costaware.core.batch_size",
    "NothingFitsError": "costaware.core.batch_size",
    "Budget": "costaware.budget",
    "BudgetError": "costaware.budget",
    "Decision": "costaware.budget",
    "Reason": "costaware.budget",
    "parse_bytes": "costaware.budget",
    "parse_duration": "costaware.budget",
    "CATALOG": "costaware.devices",
    "Device": "costaware.devices",
    "UnknownDeviceError": "costaware.devices",
    "get_device": "costaware.devices",
    "known_devices": "costaware.devices",
    "CostModel": "costaware.core.model",
    "Observation": "costaware.observation",
    "Prediction": "costaware.core.prediction",
    "OnlineRefit": "costaware.runtime.refit",
    "Report": "costaware.reporting",
    "ReportError": "costaware.reporting",
    "report": "costaware.reporting",
    "ImageBatch": "costaware.spec",
    "SegmentationBatch": "costaware.spec",
    "TokenBatch": "costaware.spec",
    "TrainingSpec": "costaware.spec",
    "default_loss": "costaware.spec",
    "ObservationStore": "costaware.runtime.store",
    "StoreError": "costaware.runtime.store",
    "Trace": "costaware.core.trace",
    "dry_run": "costaware.core.trace",
}

__all__ = [
    "CATALOG",
    "BatchSizeResult",
    "Budget",
    "BudgetError",
    "CostAwareWarning",
    "CostModel",
    "CostawareError",
    "Decision",
    "Device",
    "ImageBatch",
    "NotEnoughObservations",
    "NotFittedError",
    "NothingFitsError",
    "Observation",
    "ObservationStore",
    "OnlineRefit",
    "Prediction",
    "Reason",
    "Report",
    "ReportError",
    "SegmentationBatch",
    "SpecError",
    "StoreError",
    "TokenBatch",
    "Trace",
    "TraceError",
    "TraceTimeout",
    "TrainingSpec",
    "TrialRejected",
    "UnknownDeviceError",
    "UntraceableModelError",
    "UserCodeError",
    "__version__",
    "default_loss",
    "dry_run",
    "fmt_bytes",
    "fmt_seconds",
    "get_device",
    "known_devices",
    "parse_bytes",
    "parse_duration",
    "report",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'costaware' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # next time: a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
