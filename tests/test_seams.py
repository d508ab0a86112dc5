"""Every private SkyRL / vLLM / torch name skyrl-glm uses is recorded in ``skyrl_glm.seams`` and still exists in
the installed versions, so an upgrade that removes one fails here by name."""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path

import pytest

import skyrl_glm
from skyrl_glm.seams import SEAMS, Seam, SeamMissing, locate

PACKAGE = Path(skyrl_glm.__file__).parent


@pytest.mark.parametrize("seam", SEAMS, ids=lambda s: s.qualname)
def test_seam_exists_in_installed_version(seam: Seam) -> None:
    assert locate(seam)


def _seam(name: str) -> Seam:
    return next(s for s in SEAMS if s.name == name)


@pytest.mark.parametrize(
    "seam",
    [_seam(n) for n in ("_call_all_servers", "_convert_moe_experts_lora_to_vllm", "_is_lora", "_fsdp_wrapped_module")],
    ids=lambda s: s.kind + ":" + s.name,
)
def test_a_renamed_seam_is_reported_missing(seam: Seam) -> None:
    # The check can fail: the same record with the name changed, as an upgrade would change it (the Megatron
    # worker one is read from source: its module does not import without Transformer Engine).
    gone = dataclasses.replace(seam, name=seam.name + "_renamed")
    with pytest.raises(SeamMissing, match="_renamed"):
        locate(gone)


def test_a_missing_class_is_reported() -> None:
    owner = "skyrl.backends.skyrl_train.workers.worker:NoSuchWorker"
    gone = dataclasses.replace(_seam("_weight_sync_engine"), owner=owner)
    with pytest.raises(SeamMissing, match="no such class"):
        locate(gone)


def _defined_names(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names.add(leaf.id)
                    elif isinstance(leaf, ast.Attribute) and ast.unparse(leaf.value) in ("self", "cls"):
                        names.add(leaf.attr)
    return names


def private_names_used() -> dict[str, str]:
    """Private names the package reads but never defines (so a library defines them): name -> first use."""
    trees = {path: ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}
    own = set().union(*(_defined_names(tree) for tree in trees.values()))
    used: dict[str, str] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            found: list[str] = []
            if isinstance(node, ast.Attribute) and ast.unparse(node.value).split(".")[0] not in sys.stdlib_module_names:
                found.append(node.attr)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith("skyrl_glm"):
                found += [alias.name for alias in node.names]
            elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("getattr", "hasattr", "setattr"):
                arg = node.args[1] if len(node.args) > 1 else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.append(arg.value)
            for name in found:
                if name.startswith("_") and not name.startswith("__") and name not in own:
                    used.setdefault(name, f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return used


def test_every_private_name_used_is_recorded() -> None:
    recorded = {s.name for s in SEAMS}
    unrecorded = {name: where for name, where in private_names_used().items() if name not in recorded}
    assert not unrecorded, f"private library names used without a record in skyrl_glm/seams.py: {unrecorded}"


def test_the_scan_finds_a_private_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The completeness check can fail: a module that calls a private vLLM method is found.
    fake = tmp_path / "skyrl_glm"
    fake.mkdir()
    (fake / "m.py").write_text("def f(llm):\n    return llm.llm_engine._private_step()\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert private_names_used() == {"_private_step": "skyrl_glm/m.py:2"}
