"""The package's layering, read from its imports (ast, every import statement, function-level ones too).

Top-level command modules (``skyrl_glm.cli``, ``skyrl_glm.train``) are doors entered from outside: no module of the
package imports one. Each domain's commands live in its own package (``models``, ``check``, ``bench``, ``skyrl``,
``dapo``), and the command modules of different domains do not import each other.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import skyrl_glm

ROOT = Path(skyrl_glm.__file__).parent
COMMAND_FUNCTIONS = {"main", "add_parser"}


@cache
def modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("skyrl_glm", *path.relative_to(ROOT).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return out


def imports(name: str) -> set[str]:
    """The package's modules that ``name`` imports (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    known = modules()
    package = name if _is_package(name) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(known[name]):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m in known}


def _is_package(name: str) -> bool:
    return (ROOT.joinpath(*name.split(".")[1:]) / "__init__.py").is_file()


def is_command(name: str) -> bool:
    """A module that runs a command: it defines ``main``, ``add_parser`` or a ``_cmd_*`` function."""
    return any(
        isinstance(node, ast.FunctionDef) and (node.name in COMMAND_FUNCTIONS or node.name.startswith("_cmd_"))
        for node in modules()[name].body
    )


def top_level_commands() -> set[str]:
    return {m for m in modules() if m.count(".") == 1 and is_command(m)}


def domain_commands() -> dict[str, str]:
    """``{command module: its domain}`` for the commands inside the domain packages."""
    return {m: m.split(".")[1] for m in modules() if m.count(".") >= 2 and is_command(m)}


def layering_violations() -> list[str]:
    tops, domains = top_level_commands(), domain_commands()
    bad = [f"{m} imports the top-level command module {t}" for m in modules() for t in sorted(imports(m) & tops)]
    for m, domain in domains.items():
        bad += [
            f"{m} ({domain}) imports {n}, a command module of {domains[n]}"
            for n in sorted(imports(m))
            if n in domains and domains[n] != domain
        ]
    return bad


def test_the_walk_sees_the_doors_and_the_domain_commands():
    assert {"skyrl_glm.cli", "skyrl_glm.train"} <= top_level_commands()
    assert {"skyrl_glm.skyrl.cli", "skyrl_glm.skyrl.recipes_cli", "skyrl_glm.dapo.cli"} <= set(domain_commands())
    assert "skyrl_glm.skyrl.run" in imports("skyrl_glm.train")  # function-level imports count
    assert "skyrl_glm.skyrl.cli" in imports("skyrl_glm.cli")  # `from skyrl_glm.skyrl import cli` names the module


def test_no_back_imports_into_command_modules_nor_across_domains():
    assert layering_violations() == []
