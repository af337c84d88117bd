"""Compiled models (``torch.compile``) and the eager modules they wrap.

costaware dry-runs and measures a model in eager mode: a compiled module is recognised
(:func:`compiled_parts`), unwrapped (:func:`eager_module`, :func:`uncompiled`) and copied
without its compiled calls (:func:`drop_compiled`), so that no compiled code runs in a dry
run and the prediction can say that its figures are those of eager mode.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from torch import nn

__all__ = ["compiled_parts", "drop_compiled", "eager_module", "uncompiled"]


def _optimized_module_type() -> type | None:
    """torch.compile's wrapper class, where torch._dynamo is loaded (a compiled module
    exists only then; importing it costs seconds, so it is never imported here)."""
    found = getattr(sys.modules.get("torch._dynamo.eval_frame"), "OptimizedModule", None)
    return found if isinstance(found, type) else None


#: the methods Lightning replaces by compiled ones on a LightningModule given to ``fit``
#: compiled (``lightning.pytorch.utilities.compile.from_compiled``)
_LIGHTNING_COMPILED = ("forward", "training_step", "validation_step", "test_step", "predict_step")


def compiled_parts(module: nn.Module) -> list[str]:
    """The names of the parts of ``module`` that torch.compile runs (``""`` for ``module``
    itself): a ``torch.compile(m)`` wrapper (``OptimizedModule``), a module compiled in
    place (``m.compile()``), or a LightningModule that a Trainer was given compiled."""
    wrapper = _optimized_module_type()
    found = []
    for name, m in module.named_modules():
        if (
            (wrapper is not None and isinstance(m, wrapper))
            or m.__dict__.get("_compiled_call_impl") is not None
            or isinstance(m.__dict__.get("_compiler_ctx"), Mapping)
        ):
            found.append(name)
    return found


def eager_module(module: nn.Module) -> nn.Module:
    """The module a ``torch.compile(m)`` wrapper runs (``m``), else ``module`` itself."""
    wrapper = _optimized_module_type()
    while wrapper is not None and isinstance(module, wrapper):
        inner: nn.Module = getattr(module, "_orig_mod")  # noqa: B009  (set by torch.compile)
        module = inner
    return module


def drop_compiled(module: nn.Module) -> None:
    """Make ``module`` (one module, not its children) run in eager mode: its in-place
    compiled call and Lightning's compiled step methods are removed from its own
    attributes. For a copy: the methods are shared with the module it was copied from."""
    if module.__dict__.get("_compiled_call_impl") is not None:
        module.__dict__["_compiled_call_impl"] = None
    if isinstance(module.__dict__.get("_compiler_ctx"), Mapping):
        for name in _LIGHTNING_COMPILED:
            module.__dict__.pop(name, None)
        module.__dict__["_compiler_ctx"] = None


def uncompiled(module: nn.Module) -> nn.Module:
    """``module`` in eager mode, changed in place (call it on a copy): every
    ``torch.compile`` wrapper replaced by the module it wraps, every compiled call
    dropped (see :func:`drop_compiled`)."""
    module = eager_module(module)
    for m in list(module.modules()):
        drop_compiled(m)
        for name, child in list(m._modules.items()):
            if child is not None:
                m._modules[name] = eager_module(child)
    return module
