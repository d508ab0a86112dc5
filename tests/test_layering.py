"""The package's layering, read from its imports (ast, every import statement, function-level ones too).

Top-level command modules (``skyrl_glm.cli``, ``skyrl_glm.train``) are doors entered from outside: no module of the
package imports one. Each domain's commands live in its own package (``models``, ``check``, ``bench``, ``skyrl``,
``dapo``), and the command modules of different domains do not import each other. The sync core (``sync`` outside
``sync/vllm``) imports no engine code and no SkyRL glue: not vLLM, not Ray, not ``sync/vllm``, ``skyrl/``, the check,
the commands; of SkyRL itself only the weight-sync helpers it reuses (the alpha fold, the alias expansion). The
domains below the SkyRL glue (``models``, ``lora``, ``check``, ``dapo``, ``canary``) do not import ``skyrl/``, their
command modules included: the glue hands them what they need (a callback, a worker extension's name). Inside
``skyrl/`` the groups are ranked by where their code runs (``compat``, ``workers``, ``config``, ``run``): each imports
only itself and the groups before it, so what runs in SkyRL's Ray actors and vLLM servers imports no config or driver
module, and no group imports the commands and plugin at ``skyrl/``'s top. No module of the package imports itself
back through others (no import circle).
``experimental`` (code no product path calls yet) keeps the sync core's rule, and only ``bench`` imports it.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
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


def imported(name: str, known: Mapping[str, ast.Module]) -> set[str]:
    """Every module name ``name``'s import statements name, absolute (``from pkg import x`` names ``pkg`` and
    ``pkg.x``)."""
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
    return found


def imports(name: str) -> set[str]:
    """The package's modules that ``name`` imports (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    known = modules()
    return {m for m in imported(name, known) if m in known}


def _is_package(name: str) -> bool:
    return (ROOT.joinpath(*name.split(".")[1:]) / "__init__.py").is_file()


def is_command(name: str, known: Mapping[str, ast.Module] | None = None) -> bool:
    """A module that runs a command: it defines ``main``, ``add_parser`` or a ``_cmd_*`` function."""
    return any(
        isinstance(node, ast.FunctionDef) and (node.name in COMMAND_FUNCTIONS or node.name.startswith("_cmd_"))
        for node in (known or modules())[name].body
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


# What the sync core must not import (a module, or anything under it), and the SkyRL pieces it reuses on purpose.
SYNC_CORE_REFUSES = (
    "vllm",
    "ray",
    "skyrl",
    "skyrl_glm.sync.vllm",
    "skyrl_glm.skyrl",
    "skyrl_glm.check",
    "skyrl_glm.dapo",
    "skyrl_glm.bench",
    "skyrl_glm.cli",
    "skyrl_glm.train",
)
SYNC_CORE_REUSES = (
    "skyrl.backends.skyrl_train.weight_sync.lora_target",  # expand_lora_aliases: the receiver's rebuild
    "skyrl.backends.skyrl_train.distributed.megatron.lora_export",  # mark_alpha_folded: the sender's config
)


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def sync_core_violations(known: Mapping[str, ast.Module]) -> list[str]:
    core = [
        m
        for m in known
        if _under(m, ("skyrl_glm.sync", "skyrl_glm.experimental")) and not _under(m, ("skyrl_glm.sync.vllm",))
    ]
    return [
        f"{m} (the sync core) imports {n}"
        for m in core
        for n in sorted(imported(m, known))
        if _under(n, SYNC_CORE_REFUSES) and not _under(n, SYNC_CORE_REUSES)
    ]


def test_the_sync_core_imports_no_engine_and_no_skyrl_glue():
    assert sync_core_violations(modules()) == []


def test_a_sync_core_import_of_the_engine_or_the_glue_fails_the_rule():
    # The rule can fail: a sync-core module with the imports it must not have, function-level and type-only too.
    bad = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from skyrl_glm.skyrl.workers.publish import SkyRLServers\n"
        "def f():\n    import vllm\n    from ..vllm import engine\n"
        "    from skyrl.train.trainer import RayPPOTrainer\n"
        "    from skyrl.backends.skyrl_train.weight_sync.lora_target import expand_lora_aliases\n"
    )
    known = {**modules(), "skyrl_glm.sync.transports.fake": bad}
    assert sync_core_violations(known) == [
        "skyrl_glm.sync.transports.fake (the sync core) imports skyrl.train.trainer",
        "skyrl_glm.sync.transports.fake (the sync core) imports skyrl.train.trainer.RayPPOTrainer",
        "skyrl_glm.sync.transports.fake (the sync core) imports skyrl_glm.skyrl.workers.publish",
        "skyrl_glm.sync.transports.fake (the sync core) imports skyrl_glm.skyrl.workers.publish.SkyRLServers",
        "skyrl_glm.sync.transports.fake (the sync core) imports skyrl_glm.sync.vllm",
        "skyrl_glm.sync.transports.fake (the sync core) imports skyrl_glm.sync.vllm.engine",
        "skyrl_glm.sync.transports.fake (the sync core) imports vllm",
    ]


# The domains below the SkyRL glue, and what each must not import (their command modules included).
BELOW_THE_GLUE = {
    domain: ("skyrl_glm.skyrl",)
    for domain in ("skyrl_glm.models", "skyrl_glm.lora", "skyrl_glm.check", "skyrl_glm.dapo", "skyrl_glm.canary")
}


def below_the_glue_violations(known: Mapping[str, ast.Module]) -> list[str]:
    return [
        f"{m} ({domain}) imports {n}"
        for domain, refused in BELOW_THE_GLUE.items()
        for m in known
        if _under(m, (domain,))
        for n in sorted(imported(m, known))
        if _under(n, refused)
    ]


def test_the_domains_below_the_glue_do_not_import_it():
    assert below_the_glue_violations(modules()) == []


def test_a_dapo_or_check_import_of_the_glue_fails_the_rule():
    # The rule can fail: a dapo module writing the run summary, a check module naming the worker extension (type-only
    # too), a dapo command module reading the run's summary.
    known = {
        **modules(),
        "skyrl_glm.dapo.fake": ast.parse("from skyrl_glm.skyrl.run.summary import RunSummary\n"),
        "skyrl_glm.check.fake": ast.parse(
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..skyrl.workers import vllm_extension\n"
        ),
        "skyrl_glm.dapo.fake_cli": ast.parse("def main():\n    from skyrl_glm.skyrl.run.summary import GEN_KL\n"),
    }
    assert below_the_glue_violations(known) == [
        "skyrl_glm.check.fake (skyrl_glm.check) imports skyrl_glm.skyrl.workers",
        "skyrl_glm.check.fake (skyrl_glm.check) imports skyrl_glm.skyrl.workers.vllm_extension",
        "skyrl_glm.dapo.fake (skyrl_glm.dapo) imports skyrl_glm.skyrl.run.summary",
        "skyrl_glm.dapo.fake (skyrl_glm.dapo) imports skyrl_glm.skyrl.run.summary.RunSummary",
        "skyrl_glm.dapo.fake_cli (skyrl_glm.dapo) imports skyrl_glm.skyrl.run.summary",
        "skyrl_glm.dapo.fake_cli (skyrl_glm.dapo) imports skyrl_glm.skyrl.run.summary.GEN_KL",
    ]


# skyrl/'s groups by where their code runs, lowest first; a name at skyrl/'s top that is no group is a door.
SKYRL = "skyrl_glm.skyrl"
SKYRL_GROUPS = ("compat", "workers", "config", "run")


def skyrl_place(name: str) -> str | None:
    """The group of a name under ``skyrl/`` (a module or a name in one), ``door`` for the commands and plugin at its
    top, None for the package itself and names outside it."""
    if not _under(name, (SKYRL,)) or name == SKYRL:
        return None
    top = name.split(".")[2]
    return top if top in SKYRL_GROUPS else "door"


def skyrl_violations(known: Mapping[str, ast.Module]) -> list[str]:
    bad = []
    for m in known:
        group = skyrl_place(m)
        if group is None or group == "door":
            continue
        for n in sorted(imported(m, known)):
            other = skyrl_place(n)
            if other == "door":
                bad.append(f"{m} ({group}) imports {n}, a door at skyrl/'s top")
            elif other is not None and SKYRL_GROUPS.index(other) > SKYRL_GROUPS.index(group):
                bad.append(f"{m} ({group}) imports {n} ({other}), a group above it")
    return bad


def test_skyrl_groups_import_only_themselves_and_the_groups_below():
    assert {m.split(".")[2] for m in modules() if skyrl_place(m) not in (None, "door")} == set(SKYRL_GROUPS)
    assert skyrl_violations(modules()) == []


def test_workers_import_no_config_or_run_module():
    known = modules()
    workers = [m for m in known if skyrl_place(m) == "workers"]
    assert "skyrl_glm.skyrl.workers.worker_sync" in workers
    assert not [n for m in workers for n in imported(m, known) if skyrl_place(n) in ("config", "run")]


def test_an_import_up_inside_skyrl_fails_the_rule():
    # The rule can fail: a worker reading the config (type-only too), the config reading the driver, a run module
    # entering a command; the driver reading the config and a worker reading the compat layer are allowed.
    known = {
        **modules(),
        "skyrl_glm.skyrl.workers.fake": ast.parse(
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..config.sections import GlmSection\n"
            "from skyrl_glm.skyrl.compat import cpu\n"
        ),
        "skyrl_glm.skyrl.config.fake": ast.parse("def f():\n    from skyrl_glm.skyrl.run import summary\n"),
        "skyrl_glm.skyrl.run.fake": ast.parse(
            "from skyrl_glm.skyrl.config.sections import GlmSection\nfrom skyrl_glm.skyrl import cli\n"
        ),
    }
    assert skyrl_violations(known) == [
        "skyrl_glm.skyrl.workers.fake (workers) imports skyrl_glm.skyrl.config.sections (config), a group above it",
        "skyrl_glm.skyrl.workers.fake (workers) imports skyrl_glm.skyrl.config.sections.GlmSection (config), "
        "a group above it",
        "skyrl_glm.skyrl.config.fake (config) imports skyrl_glm.skyrl.run (run), a group above it",
        "skyrl_glm.skyrl.config.fake (config) imports skyrl_glm.skyrl.run.summary (run), a group above it",
        "skyrl_glm.skyrl.run.fake (run) imports skyrl_glm.skyrl.cli, a door at skyrl/'s top",
    ]


def import_circles(known: Mapping[str, ast.Module]) -> list[list[str]]:
    """Each set of the package's modules that import each other round a circle (every import statement counts)."""
    graph = {m: sorted(n for n in imported(m, known) if n in known and n != m) for m in known}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in graph[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in order:
            visit(v)
    return sorted(circles)


def test_no_import_circles():
    assert import_circles(modules()) == []


def test_an_import_circle_fails_the_rule():
    known = {
        **modules(),
        "skyrl_glm.bench.fake_a": ast.parse("from skyrl_glm.bench.fake_b import X\n"),
        "skyrl_glm.bench.fake_b": ast.parse(
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .fake_a import Y\n"
        ),
    }
    assert import_circles(known) == [["skyrl_glm.bench.fake_a", "skyrl_glm.bench.fake_b"]]


def experiment_violations(known: Mapping[str, ast.Module]) -> list[str]:
    return [
        f"{m} imports the experiment {n}"
        for m in known
        if not _under(m, ("skyrl_glm.experimental", "skyrl_glm.bench"))
        for n in sorted(imported(m, known))
        if _under(n, ("skyrl_glm.experimental",))
    ]


def test_only_the_bench_imports_the_experiments():
    assert experiment_violations(modules()) == []
    known = {**modules(), "skyrl_glm.skyrl.fake": ast.parse("from skyrl_glm.experimental.routing import plan\n")}
    assert experiment_violations(known) == [
        "skyrl_glm.skyrl.fake imports the experiment skyrl_glm.experimental.routing",
        "skyrl_glm.skyrl.fake imports the experiment skyrl_glm.experimental.routing.plan",
    ]


def test_the_walk_sees_the_doors_and_the_domain_commands():
    assert {"skyrl_glm.cli", "skyrl_glm.train"} <= top_level_commands()
    assert {"skyrl_glm.skyrl.cli", "skyrl_glm.skyrl.recipes_cli", "skyrl_glm.dapo.cli"} <= set(domain_commands())
    assert "skyrl_glm.skyrl.run.launch" in imports("skyrl_glm.train")  # function-level imports count
    assert "skyrl_glm.skyrl.cli" in imports("skyrl_glm.cli")  # `from skyrl_glm.skyrl import cli` names the module


def test_no_back_imports_into_command_modules_nor_across_domains():
    assert layering_violations() == []
