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

from costaware._format import fmt_bytes, fmt_seconds
from costaware.budget import Budget, BudgetError, Decision, Reason, parse_bytes, parse_duration
from costaware.devices import CATALOG, Device, UnknownDeviceError, get_device, known_devices
from costaware.errors import (
    CostawareError,
    NotFittedError,
    SpecError,
    TraceError,
    TraceTimeout,
    UntraceableModelError,
)
from costaware.model import CostModel, Observation, Prediction
from costaware.spec import ImageBatch, SegmentationBatch, TokenBatch, TrainingSpec, default_loss
from costaware.trace import Trace, dry_run

__version__ = "0.1.0"

__all__ = [
    "CATALOG",
    "Budget",
    "BudgetError",
    "CostModel",
    "CostawareError",
    "Decision",
    "Device",
    "ImageBatch",
    "NotFittedError",
    "Observation",
    "Prediction",
    "Reason",
    "SegmentationBatch",
    "SpecError",
    "TokenBatch",
    "Trace",
    "TraceError",
    "TraceTimeout",
    "TrainingSpec",
    "UnknownDeviceError",
    "UntraceableModelError",
    "__version__",
    "default_loss",
    "dry_run",
    "fmt_bytes",
    "fmt_seconds",
    "get_device",
    "known_devices",
    "parse_bytes",
    "parse_duration",
]

_LAZY = {
    "ObservationStore": "costaware.store",
    "StoreError": "costaware.store",
    "OnlineRefit": "costaware.refit",
}


def __getattr__(name: str) -> object:
    # the store needs SQLAlchemy, which a bare GPU box measuring with costaware.profile
    # may lack: import it on first use only
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'costaware' has no attribute {name!r}")
