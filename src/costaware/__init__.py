"""costaware: predict a training trial's peak GPU memory and epoch time before it runs."""

from costaware.errors import (
    CostawareError,
    NotFittedError,
    SpecError,
    TraceError,
    TraceTimeout,
    UntraceableModelError,
)
from costaware.spec import ImageBatch, SegmentationBatch, TokenBatch, TrainingSpec, default_loss
from costaware.trace import Trace, dry_run

__version__ = "0.1.0"

__all__ = [
    "CostawareError",
    "ImageBatch",
    "NotFittedError",
    "SegmentationBatch",
    "SpecError",
    "TokenBatch",
    "Trace",
    "TraceError",
    "TraceTimeout",
    "TrainingSpec",
    "UntraceableModelError",
    "__version__",
    "default_loss",
    "dry_run",
]
