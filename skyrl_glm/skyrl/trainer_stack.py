"""What a trainer strategy needs installed, checked before Ray starts: SkyRL's Megatron worker imports
Transformer Engine and Megatron-Bridge inside its Ray actor, where a missing or broken package surfaces minutes
later as an actor's traceback. Here it is one line naming the package (``skyrl-glm train`` exits 2)."""

from __future__ import annotations

import importlib
import importlib.util

# (module SkyRL's Megatron worker imports, the distribution that provides it)
MEGATRON_STACK = (
    ("transformer_engine", "transformer-engine"),
    ("megatron.core", "megatron-core"),
    ("megatron.bridge", "megatron-bridge"),
)
INSTALL_DOC = "docs/install.md, the Megatron trainer"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def trainer_stack_problem(strategy: str) -> str | None:
    """Why ``strategy`` cannot train on this machine (one line), or None."""
    if strategy != "megatron":
        return None
    missing = [dist for module, dist in MEGATRON_STACK if not _installed(module)]
    if missing:
        return f"trainer.strategy: megatron needs {', '.join(missing)}, not installed here ({INSTALL_DOC})"
    try:  # TE's library loads its CUDA libraries on import: a cuBLAS without a symbol it needs fails here
        importlib.import_module("transformer_engine.pytorch")
    except (ImportError, OSError, RuntimeError) as e:
        lines = str(e).strip().splitlines() or [type(e).__name__]
        return f"trainer.strategy: megatron: transformer_engine does not import here: {lines[-1]} ({INSTALL_DOC})"
    return None
