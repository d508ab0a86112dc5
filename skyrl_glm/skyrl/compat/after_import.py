"""Run a function on a module right after its first import, without importing it first: the runtime patches
(CPU mode, the Megatron-Bridge compatibility names) must not import CUDA-bound packages themselves, and must be in
place before SkyRL's modules import them inside a Ray actor."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable
from typing import Any

Patch = Callable[[types.ModuleType], None]

_PENDING: dict[str, list[Patch]] = {}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs the registered patches of a module right after the module executes (first import only)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _PENDING:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run_module = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            run_module(module)
            for patch in _PENDING.pop(fullname, []):
                patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_FINDER = _AfterImport()


def after_import(module_name: str, patch: Patch) -> None:
    """``patch(module)`` once ``module_name`` has executed: now if it is already imported, else at its import."""
    if module_name in sys.modules:
        patch(sys.modules[module_name])
        return
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    _PENDING.setdefault(module_name, []).append(patch)
