"""``skyrl-glm recipes``, and what ``skyrl-glm train --dry-run`` prints.

Parser building imports nothing heavy; SkyRL is imported inside the commands. Quieting and bad input are
``skyrl_glm.cli.main``'s, as for every command: a :class:`~skyrl_glm.skyrl.config.sections.ConfigError` (unknown
recipe, bad key, wrong type) raised here is its one ``error:`` line and exit 2.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyrl_glm import terminal
from skyrl_glm.usage import UsageError

if TYPE_CHECKING:
    from skyrl.train.config import PlacementConfig

    from skyrl_glm.skyrl.config.hardware import HardwareConfig
    from skyrl_glm.skyrl.config.sections import GlmTrainConfig

console = terminal.console(soft_wrap=True)

RAY_PORT = 6379


def _load(recipe: str, overrides: list[str], runnable: bool = True) -> GlmTrainConfig:
    """The recipe's config; ``runnable``: also what a run needs of this machine's environment (a multi-node run's
    private key directory), as ``recipes validate`` and ``train --dry-run`` check and ``recipes list`` does not."""
    from skyrl_glm.skyrl.config.key_placement import key_problem
    from skyrl_glm.skyrl.config.recipes import load_config  # also layout vs hardware, sampler-safe targets
    from skyrl_glm.skyrl.config.sections import ConfigError

    cfg = load_config(recipe, overrides)
    if runnable and (problem := key_problem(cfg.trainer, cfg.generator.inference_engine)):
        raise ConfigError(f"{recipe}: {problem}")
    return cfg


def summary_sentence(path: Path) -> str:
    """The first sentence of a recipe's opening comment (it may span several comment lines)."""
    words: list[str] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        text = line.removeprefix("#")
        if not line.startswith("#") or not text.strip() or text.startswith("   "):  # blank or an indented example
            break
        words += text.split()
    paragraph = " ".join(words)
    end = re.search(r"\.(\s|$)", paragraph)
    return paragraph[: end.start() + 1] if end else paragraph


def _hardware_line(cfg: GlmTrainConfig) -> str:
    from skyrl_glm.skyrl.config.hardware import gpu_needs

    hw = cfg.skyrl_glm.hardware
    needs = gpu_needs(cfg.trainer, cfg.generator.inference_engine)
    use = (
        f"{needs.total} GPUs, trainer and sampler colocated"
        if needs.colocated
        else f"{needs.total} GPUs: {needs.trainer} trainer + {needs.sampler} sampler"
    )
    if not hw.stated:
        return f"not stated; the layout uses {use}"
    host = f", >= {hw.host_memory_gb} GB host RAM per node" if hw.host_memory_gb else ""
    return f"{hw.nodes} node(s) x {hw.gpus_per_node} {hw.gpu or 'GPU'} ({hw.gpu_memory_gb} GB){host}; uses {use}"


def _layout_line(cfg: GlmTrainConfig) -> str:
    t = cfg.trainer
    if t.strategy == "megatron":
        m = t.policy.megatron_config
        dp = t.placement.policy_num_nodes * t.placement.policy_num_gpus_per_node
        dp //= m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size
        etp = m.expert_tensor_parallel_size or m.tensor_model_parallel_size
        trainer = (
            f"megatron TP {m.tensor_model_parallel_size} x PP {m.pipeline_model_parallel_size} x CP "
            f"{m.context_parallel_size} (DP {dp}), EP {m.expert_model_parallel_size} x ETP {etp}"
        )
    else:
        trainer = f"{t.strategy} on {t.placement.policy_num_nodes} x {t.placement.policy_num_gpus_per_node}"
    e = cfg.generator.inference_engine
    sampler = (
        f"{e.num_engines} x {e.backend} (TP {e.tensor_parallel_size} x PP {e.pipeline_parallel_size} x DP "
        f"{e.data_parallel_size}, EP {e.expert_parallel_size})"
    )
    from skyrl_glm.skyrl.config.placement import sync_transports

    lora = t.policy.model.lora
    sync = f"{cfg.skyrl_glm.sync.mode} sync via {sync_transports(cfg.skyrl_glm, t.placement)}"
    if cfg.skyrl_glm.sync.mode == "disk":  # skyrl-glm's sync is off: SkyRL's own, by files or its memory mode
        sync = f"SkyRL's own sync (trainer.policy.model.lora.sync_mode={t.policy.model.lora.sync_mode})"
    return f"trainer {trainer}; sampler {sampler}; LoRA r{lora.rank}/alpha {lora.alpha}; {sync}"


def _cmd_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    from skyrl_glm.skyrl.config.recipes import packaged_recipes, resolve_recipe
    from skyrl_glm.skyrl.config.sections import ConfigError

    table = Table(title="packaged recipes (skyrl-glm recipes show NAME)")
    for col in ("name", "model", "hardware", "what"):
        table.add_column(col, overflow="fold")
    for name in packaged_recipes():
        path = resolve_recipe(name)
        try:
            cfg = _load(name, [], runnable=False)
            model = cfg.trainer.policy.model.path
            hardware = _hardware_line(cfg) if model else "-"
            model = model or "(a base for other recipes)"
        except ConfigError as e:
            model, hardware = "-", f"does not build: {e}"
        table.add_row(name, model, hardware, summary_sentence(path))
    console.print(table)
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from skyrl_glm.skyrl.config.recipes import resolve_recipe

    path = resolve_recipe(args.recipe)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{args.recipe}: unreadable recipe ({e})") from None
    console.print(f"[bold]{path}[/]", highlight=False)
    print(text, end="")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    cfg = _load(args.recipe, args.overrides)
    console.print(f"[green]ok[/] {args.recipe}: {cfg.trainer.policy.model.path}", highlight=False)
    console.print(f"  hardware: {_hardware_line(cfg)}", highlight=False)
    console.print(f"  layout:   {_layout_line(cfg)}", highlight=False)
    return 0


def launch_commands(
    recipe: str, overrides: list[str], hw: HardwareConfig, placement: PlacementConfig, key_dir: str | None = None
) -> dict[str, list[str]]:
    """Shell lines that start the run: on one node, and as a multi-node Ray cluster (head first). ``key_dir``:
    where the run's control key is made (:func:`skyrl_glm.skyrl.config.key_placement.key_dir`), which every node must
    see; named in the multi-node lines."""
    from skyrl_glm.skyrl.config.key_placement import default_key_dir, launch_lines

    train = shlex.join(["skyrl-glm", "train", recipe, *overrides])
    gpus = hw.gpus_per_node or placement.policy_num_gpus_per_node
    nodes = max(hw.nodes, 1)
    multi = [
        *launch_lines(key_dir or str(default_key_dir())),
        f"# on the head node:  ray start --head --port={RAY_PORT} --num-gpus={gpus}",
        f"# on each of the other {nodes - 1} node(s):  ray start --address=<head-ip>:{RAY_PORT} --num-gpus={gpus}",
        f"RAY_ADDRESS=<head-ip>:{RAY_PORT} {train}   # on the head node; the job spreads over the cluster",
    ]
    single = "single node" if nodes == 1 else f"single node (this layout needs {nodes} nodes: scale it down first)"
    return {single: [train], f"multi-node Ray ({nodes} nodes)": multi}


def dry_run(recipe: str, overrides: list[str], show_config: bool = False) -> int:
    """``skyrl-glm train RECIPE [k=v ...] --dry-run``: what would run (model, hardware, layout, steps, sync and
    check, data, outputs) and the launch commands; with ``show_config`` the full resolved config first. Nothing is
    started (no Ray, no engine, no model load). Every summary line is a YAML comment, so the output stays YAML."""
    from skyrl_glm.skyrl.config.recipes import config_yaml

    cfg = _load(recipe, overrides)
    if show_config:
        print(config_yaml(cfg), end="")
    t, glm = cfg.trainer, cfg.skyrl_glm
    steps = f"{t.max_training_steps} steps" if t.max_training_steps else f"{t.epochs} epoch(s)"
    check = "off" if not glm.check.before_training else f"before step 1, agree every {glm.check.every_n_syncs} sync(s)"
    lines = [
        ("model", f"{t.policy.model.path} ({t.strategy})"),
        ("hardware", _hardware_line(cfg)),
        ("layout", _layout_line(cfg)),
        ("training", f"{steps}, {t.train_batch_size} prompts x {cfg.generator.n_samples_per_prompt} samples per step"),
        ("check", f"{check}; on failure {glm.check.on_failure}"),
    ]
    for role, files in (("train data", cfg.data.train_data), ("eval data", cfg.data.val_data)):
        for f in files:
            lines.append((role, f"{f}: " + ("present" if Path(f).exists() else "missing (skyrl-glm data prepare ...)")))
    lines += [("export", t.export_path), ("logs", t.log_path)]
    for key, value in lines:
        console.print(f"[bold]# {key}:[/] {value}", highlight=False)
    if glm.sync.mode == "memory":
        from skyrl_glm.skyrl.config.placement import placement_lines

        console.print("[bold]# per node (trainer ranks; engines: transport and sender of their LoRA sync):[/]")
        for line in placement_lines(t, cfg.generator.inference_engine, glm):
            console.print(f"#   {line}", highlight=False)
    from skyrl_glm.skyrl.config.key_placement import key_dir

    directory = key_dir(t, cfg.generator.inference_engine)
    for where, commands in launch_commands(recipe, overrides, glm.hardware, t.placement, directory).items():
        console.print(f"[bold]# launch, {where}:[/]", highlight=False)
        for line in commands:
            print(line)
    shown = "" if show_config else " (--show-config or -v: the full resolved config)"
    console.print(f"# dry run: nothing was started{shown}", highlight=False)
    return 0


def add_parser(sub: Any) -> None:
    recipes = sub.add_parser("recipes", help="packaged training recipes").add_subparsers(
        dest="recipes_cmd", required=True
    )
    recipes.add_parser("list", help="the packaged recipes, their model and hardware").set_defaults(func=_cmd_list)
    show = recipes.add_parser("show", help="print a recipe file")
    show.add_argument("recipe", help="packaged recipe name or YAML file")
    show.set_defaults(func=_cmd_show)
    validate = recipes.add_parser(
        "validate", help="build SkyRL's real config from a recipe (strict keys, types, layout vs hardware)"
    )
    validate.add_argument("recipe", help="packaged recipe name or YAML file")
    validate.add_argument("overrides", nargs="*", help="key=value overrides")
    validate.set_defaults(func=_cmd_validate)
