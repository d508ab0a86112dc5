"""Every private SkyRL / vLLM / torch name skyrl-glm uses, and every library name it patches, is recorded in
``skyrl_glm.seams`` and still exists in the installed versions, so an upgrade that removes one fails here by
name."""

from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Callable
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


def _in_a_package(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the scans at a package of one module, ``skyrl_glm/m.py`` with ``source``."""
    fake = tmp_path / "skyrl_glm"
    fake.mkdir()
    (fake / "m.py").write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)


def test_the_scan_finds_a_private_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The completeness check can fail: a module that calls a private vLLM method is found.
    _in_a_package("def f(llm):\n    return llm.llm_engine._private_step()\n", tmp_path, monkeypatch)
    assert private_names_used() == {"_private_step": "skyrl_glm/m.py:2"}


def _library_roots(tree: ast.AST) -> set[str]:
    """Names bound in a module to a third-party module or its members, and parameters typed ``types.ModuleType``
    (a patch function handed the module it patches)."""
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in sys.stdlib_module_names | {"skyrl_glm"}:
                    roots.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in sys.stdlib_module_names | {"skyrl_glm"}:
                roots.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.arg) and node.annotation is not None:
            if ast.unparse(node.annotation) == "types.ModuleType":
                roots.add(node.arg)
    return roots


def library_names_assigned() -> dict[str, str]:
    """Attributes the package assigns on a library's module or class (``torch.cuda.set_device = ...``): name ->
    first assignment."""
    assigned: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        roots = _library_roots(tree)
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                root = target
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(target, ast.Attribute) and isinstance(root, ast.Name) and root.id in roots:
                    assigned.setdefault(target.attr, f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return assigned


@pytest.mark.parametrize("scan", [private_names_used, library_names_assigned], ids=["used", "patched"])
def test_every_private_name_used_and_library_name_patched_is_recorded(scan: Callable[[], dict[str, str]]) -> None:
    recorded = {s.name for s in SEAMS}
    unrecorded = {name: where for name, where in scan().items() if name not in recorded}
    assert not unrecorded, f"{scan.__name__}: names without a record in skyrl_glm/seams.py: {unrecorded}"


def test_the_scan_finds_a_patched_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The completeness check can fail: an imported module's attribute and a handed-in module's are both found.
    source = (
        "import types\nimport torch\n\n\ndef f(dist: types.ModuleType, local):\n"
        "    torch.cuda.empty_cache = None\n    dist.barrier = None\n    local.field = 1\n"
    )
    _in_a_package(source, tmp_path, monkeypatch)
    assert library_names_assigned() == {"empty_cache": "skyrl_glm/m.py:6", "barrier": "skyrl_glm/m.py:7"}


def test_an_added_name_needs_its_owner() -> None:
    gone = dataclasses.replace(_seam("pd_disaggregation"), owner="vllm_router.router_args:NoSuchArgs")
    with pytest.raises(SeamMissing, match="no such class"):
        locate(gone)
