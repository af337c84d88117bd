"""The flat module paths (``costaware.model``, ``costaware.collect``, ...) as names of the
modules in the layer subpackages.

``import costaware.model`` gives :mod:`costaware.core.model` itself: one module object
under both names, so an attribute set or patched through one name is seen through the
other, private names included. ``python -m costaware.collect`` runs
:mod:`costaware.measure.collect` as ``__main__``.

The old paths are served by an import finder rather than by files at the old places: a
file at an old place would make git read the move as a new file beside an edited one,
and edits made to the old file on another branch would not merge into the moved one.
Code in the package imports the new paths (``tests/test_architecture.py`` checks it).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import CodeType, ModuleType
from typing import Final

#: old module path -> where the module lives
MOVED: Final[dict[str, str]] = {
    "costaware.allocator": "costaware.core.allocator",
    "costaware.analytic": "costaware.core.analytic",
    "costaware.batch_size": "costaware.core.batch_size",
    "costaware.features": "costaware.core.features",
    "costaware.flops": "costaware.core.flops",
    "costaware.graph2vec": "costaware.core.graph2vec",
    "costaware.model": "costaware.core.model",
    "costaware.optime": "costaware.core.optime",
    "costaware.trace": "costaware.core.trace",
    "costaware.collect": "costaware.measure.collect",
    "costaware.corpus": "costaware.measure.corpus",
    "costaware.oomprobe": "costaware.measure.oomprobe",
    "costaware.opbench": "costaware.measure.opbench",
    "costaware.profile": "costaware.measure.profile",
    "costaware.calibrate": "costaware.runtime.calibrate",
    "costaware.gate": "costaware.runtime.gate",
    "costaware.refit": "costaware.runtime.refit",
    "costaware.store": "costaware.runtime.store",
    "costaware._report_html": "costaware.reporting.html",
    "costaware._report_text": "costaware.reporting.text",
}


class _Alias(importlib.abc.InspectLoader):
    """Loads an old path as the module at its new one."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system set the old path's spec on the module: give it its own back
        if self._spec is not None:
            module.__spec__ = self._spec

    def get_source(self, fullname: str) -> str | None:
        loader = self._target_loader()
        return None if loader is None else loader.get_source(self.target)

    def get_code(self, fullname: str) -> CodeType | None:
        """The moved module's code, for ``python -m <old path>``."""
        loader = self._target_loader()
        return None if loader is None else loader.get_code(self.target)

    def _target_loader(self) -> importlib.abc.InspectLoader | None:
        spec = importlib.util.find_spec(self.target)
        loader = None if spec is None else spec.loader
        return loader if isinstance(loader, importlib.abc.InspectLoader) else None


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED` (and nothing else)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        real = importlib.util.find_spec(new)
        origin = None if real is None else real.origin
        return importlib.machinery.ModuleSpec(fullname, _Alias(new), origin=origin)


def install() -> None:
    """Serve the old paths (once per process)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
