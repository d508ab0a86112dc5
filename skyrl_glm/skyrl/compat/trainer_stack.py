"""What a trainer strategy needs installed, checked before Ray starts: SkyRL's Megatron worker imports
Transformer Engine and Megatron-Bridge inside its Ray actor, where a missing or broken package surfaces minutes
later as an actor's traceback. Here it is one line naming the package or the name (``skyrl-glm train`` exits 2).

SkyRL 0.4.0's Megatron worker imports names from Megatron-Bridge's repository that no Bridge release has:
:func:`bridge_api_problem` reads SkyRL's own import statements and finds each name in the installed Bridge's source
or among the names :mod:`~skyrl_glm.skyrl.compat.bridge_compat` supplies, without importing either (Bridge's
import needs CUDA)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

from skyrl_glm.skyrl.compat.bridge_compat import BRIDGE_PEFT_UTILS, SUPPLIED

# (module SkyRL's Megatron worker imports, the distribution that provides it)
MEGATRON_STACK = (
    ("transformer_engine", "transformer-engine"),
    ("megatron.core", "megatron-core"),
    ("megatron.bridge", "megatron-bridge"),
)
# SkyRL's Megatron modules whose module-level imports of Megatron-Bridge must resolve
SKYRL_MEGATRON = ("backends/skyrl_train/workers/megatron", "backends/skyrl_train/distributed/megatron")
INSTALL_DOC = "docs/install.md, the Megatron trainer"


def _package_dir(module: str) -> Path | None:
    """The folder of an installed package, found without executing it (None: not installed)."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # its parent package is missing
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _defined(source: Path) -> set[str]:
    """Top-level names a module's source binds (functions, classes, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def bridge_api_problem(skyrl_dir: Path, bridge_dir: Path) -> str | None:
    """The first name SkyRL's Megatron modules import at module level from ``megatron.bridge`` that neither the
    Bridge installed at ``bridge_dir`` defines nor the compatibility module supplies, as one line; None when every
    one is there."""
    for folder in SKYRL_MEGATRON:
        for path in sorted((skyrl_dir / folder).glob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("megatron.bridge.")):
                    continue
                parts = node.module.split(".")[2:]
                source = bridge_dir.joinpath(*parts).with_suffix(".py")
                if not source.is_file():
                    source = bridge_dir.joinpath(*parts, "__init__.py")
                have = _defined(source) if source.is_file() else set()
                if node.module == BRIDGE_PEFT_UTILS:
                    have |= set(SUPPLIED)
                for alias in node.names:
                    if alias.name not in have:
                        return (
                            f"trainer.strategy: megatron: SkyRL's {path.stem} imports {alias.name} from "
                            f"{node.module}, which the installed megatron-bridge lacks (no release has it: install "
                            f"Megatron-Bridge from its repository at the revision SkyRL pins; {INSTALL_DOC})"
                        )
    return None


def trainer_stack_problem(strategy: str) -> str | None:
    """Why ``strategy`` cannot train on this machine (one line), or None."""
    if strategy != "megatron":
        return None
    missing = [dist for module, dist in MEGATRON_STACK if _package_dir(module) is None]
    if missing:
        return f"trainer.strategy: megatron needs {', '.join(missing)}, not installed here ({INSTALL_DOC})"
    skyrl_dir, bridge_dir = _package_dir("skyrl"), _package_dir("megatron.bridge")
    if skyrl_dir is not None and bridge_dir is not None and (problem := bridge_api_problem(skyrl_dir, bridge_dir)):
        return problem
    try:  # TE's library loads its CUDA libraries on import: a cuBLAS without a symbol it needs fails here
        importlib.import_module("transformer_engine.pytorch")
    except (ImportError, OSError, RuntimeError) as e:
        lines = str(e).strip().splitlines() or [type(e).__name__]
        return f"trainer.strategy: megatron: transformer_engine does not import here: {lines[-1]} ({INSTALL_DOC})"
    return None
