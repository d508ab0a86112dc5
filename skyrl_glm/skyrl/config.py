"""The ``skyrl_glm`` section of a SkyRL training config, and the one loader for recipes.

The typed config is SkyRL's ``SkyRLTrainConfig`` (built with SkyRL's ``make_config``, so its strict key
checks stay) plus a top-level ``skyrl_glm`` section. A recipe is an OmegaConf YAML file in the same shape as
the config; ``base: <file or packaged recipe name>`` composes recipes (the base is merged first, recursively),
and ``key=value`` overrides are applied last. Every problem is one :class:`ConfigError` line naming the file
(or ``command line``) and the dotted key.

No ``from __future__ import annotations`` here: SkyRL's ``build_nested_dataclass`` reads ``field.type`` to find
nested dataclasses, which must therefore be real classes, not strings.
"""

import copy
import dataclasses
import difflib
import functools
import math
import os
import tempfile
import time
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from skyrl.train.config import AlgorithmConfig, GeneratorConfig, SkyRLTrainConfig, TrainerConfig, make_config

from skyrl_glm.check.algorithm import MAX_SCALE, MAX_TOLERANCE, CheckConfig
from skyrl_glm.check.faults import NO_FAULT, SKYRL_FAULTS
from skyrl_glm.plugins import registry
from skyrl_glm.skyrl.hardware import HardwareConfig
from skyrl_glm.skyrl.overlong import OverlongPenaltyConfig
from skyrl_glm.skyrl.recipe_rules import problems as recipe_problems
from skyrl_glm.skyrl.value_ranges import range_problem
from skyrl_glm.sync.expert_layout import LAYOUTS, PER_EXPERT, STACKED_3D
from skyrl_glm.sync.plan import DEFAULT_BUCKET_BYTES
from skyrl_glm.usage import UsageError

AUTO_TRANSPORT = "auto"
BASE_KEY = "base"
COMMAND_LINE = "command line"
RECIPE_SUFFIXES = (".yaml", ".yml")
MAX_BASE_DEPTH = 32  # recipes composed through ``base`` (the packaged ones use 2)
MAX_BUCKET_MB = 1 << 16  # 64 GiB: far above any adapter's unique bytes (full GLM-5.3 r32: 0.62 GB)
# The check's probes run through the trainer and the sampler before step 1: bounded so that a typo cannot turn
# the seconds-long check into a long run of its own.
MAX_PROBES = 256
MAX_PROBE_LENGTH = 8192
MAX_DECODE_TOKENS = 1024


class ConfigError(UsageError):
    """A recipe or an override is unusable; the message is one line naming the file and the key."""


def _choice(key: str, value: Any, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}: must be one of {'|'.join(map(str, allowed))}, got {value!r}")


def _bounded(key: str, value: float, low: float, high: float | None) -> None:
    """``low <= value <= high`` (``high`` None: no upper bound), and finite."""
    if not math.isfinite(value) or value < low or (high is not None and value > high):
        where = f">= {low}" if high is None else f"in {low}..{high}"
        raise ConfigError(f"{key}: must be {where}, got {value}")


def _literal_values(cls: type, name: str) -> tuple[Any, ...]:
    return typing.get_args(typing.get_type_hints(cls)[name])


@dataclass
class SyncSection:
    """How the trainer's LoRA reaches vLLM inside SkyRL's loop."""

    mode: Literal["memory", "disk"] = "memory"
    """``memory``: skyrl-glm's plan -> transport -> receiver, no file written; ``disk``: SkyRL's own PEFT-file sync."""
    transport: str = AUTO_TRANSPORT
    """A registered transport (built-in: ``cpu``, ``ipc``, ``nccl``; plugins add theirs), or ``auto``: ``ipc`` when
    colocated on GPUs, ``cpu`` (shared memory, same host) when the trainer is on one node, else ``nccl``."""
    verify: bool = True
    """Receiver checks checksums and finiteness of every tensor (structure is always checked)."""
    bucket_mb: int = DEFAULT_BUCKET_BYTES >> 20
    """Packed bucket size on the transport, MiB."""
    fault: str = NO_FAULT
    """Deliberately break the sync (for tests of the check), one of the fault table's ``in_skyrl`` entries:
    ``no-publish`` reports success after the first sync and sends nothing, so the sampler goes stale."""
    expert_layout: str = PER_EXPERT
    """How vLLM takes the routed experts' LoRA, fixed when its engines start (:mod:`skyrl_glm.sync.expert_layout`):
    ``per-expert`` (every expert name; any adapter), ``shared-outer`` (vLLM's ``enable_moe_shared_loras``: one
    gate/up lora_A and one down lora_B per layer, for Megatron with ``share_expert_adapters``)."""

    def __post_init__(self) -> None:
        _choice("skyrl_glm.sync.mode", self.mode, _literal_values(SyncSection, "mode"))
        _choice("skyrl_glm.sync.expert_layout", self.expert_layout, LAYOUTS)
        _choice("skyrl_glm.sync.fault", self.fault, SKYRL_FAULTS)
        _choice("skyrl_glm.sync.transport", self.transport, [AUTO_TRANSPORT, *sorted(registry().transports)])
        _bounded("skyrl_glm.sync.bucket_mb", self.bucket_mb, 1, MAX_BUCKET_MB)

    @property
    def bucket_bytes(self) -> int:
        return self.bucket_mb << 20


@dataclass
class CheckSection:
    """The five-step handoff check on the live trainer and sampler.

    Logprobs are compared at temperature 1.0 whatever the run samples at: vLLM reports raw (pre-temperature)
    logprobs and SkyRL's trainer divides logits by ``trainer.algorithm.temperature``, so the check sets the
    trainer's temperature to 1.0 while it scores and restores it afterwards.
    """

    before_training: bool = True
    """Run the full five-step check after the initial sync, before step 1."""
    every_n_syncs: int = 1
    """After every N-th training sync, an agree check (steps 1 and 5 only) on fresh probes; 0 turns it off."""
    on_failure: Literal["abort", "warn"] = "abort"
    """``abort``: stop training with the report and a non-zero exit; ``warn``: log the report and go on."""
    num_probes: int = 2
    probe_length: int = 24
    prompt_length: int = 8
    decode_tokens: int = 4
    # The check's own settings, with the defaults of the one record the CLI and the library use (CheckConfig).
    seed: int = CheckConfig.seed
    mean_tol: float = CheckConfig.mean_tol
    max_tol: float = CheckConfig.max_tol
    repeat_tol: float = CheckConfig.repeat_tol
    scale: float = CheckConfig.scale
    """Perturbation of the trainer's LoRA B in step 2 (added to every element)."""
    decode: bool = CheckConfig.decode

    def __post_init__(self) -> None:
        _choice("skyrl_glm.check.on_failure", self.on_failure, _literal_values(CheckSection, "on_failure"))
        _bounded("skyrl_glm.check.every_n_syncs", self.every_n_syncs, 0, None)
        _bounded("skyrl_glm.check.num_probes", self.num_probes, 1, MAX_PROBES)
        _bounded("skyrl_glm.check.probe_length", self.probe_length, 2, MAX_PROBE_LENGTH)
        _bounded("skyrl_glm.check.prompt_length", self.prompt_length, 1, MAX_PROBE_LENGTH)
        _bounded("skyrl_glm.check.decode_tokens", self.decode_tokens, 1, MAX_DECODE_TOKENS)
        for name in ("mean_tol", "max_tol", "repeat_tol"):  # a bound: finite, >= 0, not one that passes anything
            _bounded(f"skyrl_glm.check.{name}", getattr(self, name), 0, MAX_TOLERANCE)
        if not 0 < self.scale <= MAX_SCALE:  # step 3 needs a perturbation the sampler can miss (NaN fails too)
            raise ConfigError(f"skyrl_glm.check.scale: must be > 0 and <= {MAX_SCALE:g}, got {self.scale}")
        if self.prompt_length >= self.probe_length:
            raise ConfigError(
                f"skyrl_glm.check.prompt_length: must be < probe_length ({self.probe_length}), got {self.prompt_length}"
            )
        try:
            self.check_config()
        except UsageError as e:
            raise ConfigError(f"skyrl_glm.check.{e}") from None

    def check_config(self) -> CheckConfig:
        """The algorithm's settings from this section."""
        return CheckConfig(
            mean_tol=self.mean_tol,
            max_tol=self.max_tol,
            repeat_tol=self.repeat_tol,
            scale=self.scale,
            seed=self.seed,
            decode=self.decode,
        )


@dataclass
class GlmSection:
    """Everything skyrl-glm adds to a SkyRL config: ``skyrl_glm.sync``, ``skyrl_glm.check``, ``skyrl_glm.cpu``."""

    sync: SyncSection = field(default_factory=SyncSection)
    check: CheckSection = field(default_factory=CheckSection)
    overlong: OverlongPenaltyConfig = field(default_factory=OverlongPenaltyConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    cpu: bool = False
    """Run SkyRL's loop on CPU (logical Ray GPUs, CUDA assumptions lifted: skyrl_glm.skyrl.cpu). Never implicit."""


def make_glm_config(
    algorithm_cls: type[AlgorithmConfig] | None = None,
    trainer_cls: type[TrainerConfig] | None = None,
    generator_cls: type[GeneratorConfig] | None = None,
) -> type[SkyRLTrainConfig]:
    """SkyRL's ``make_config`` (custom algorithm/trainer/generator sections) plus the ``skyrl_glm`` section."""
    base = make_config(algorithm_cls=algorithm_cls, trainer_cls=trainer_cls, generator_cls=generator_cls)
    namespace = {"__annotations__": {"skyrl_glm": GlmSection}, "skyrl_glm": field(default_factory=GlmSection)}
    return dataclass(type("SkyRLGlmConfig", (base,), namespace))


SkyRLGlmConfig = make_glm_config()


def resolved_transport(cfg: Any) -> str:
    """``skyrl_glm.sync.transport`` with ``auto`` resolved: CUDA IPC when colocated on GPUs, shared memory when the
    trainer is on one node (CPU mode included), else the collective transport (NCCL, over a group of the
    trainer's sending rank and every vLLM worker)."""
    transport = cfg.skyrl_glm.sync.transport
    if transport != AUTO_TRANSPORT:
        return transport
    if cfg.trainer.placement.colocate_all and not cfg.skyrl_glm.cpu:
        return "ipc"
    return "cpu" if cfg.trainer.placement.policy_num_nodes == 1 else "nccl"


def check_consistency(cfg: Any) -> None:
    """Combinations of ``skyrl_glm`` keys with SkyRL keys that cannot work; one :class:`ConfigError` each."""
    glm, trainer = cfg.skyrl_glm, cfg.trainer
    lora = trainer.policy.model.lora.rank > 0
    if glm.cpu and trainer.strategy != "fsdp":
        raise ConfigError(
            "skyrl_glm.cpu: SkyRL's Megatron worker needs Transformer Engine (CUDA); use trainer.strategy=fsdp"
        )
    if glm.sync.mode == "memory" and not lora:
        raise ConfigError("skyrl_glm.sync.mode: memory syncs a LoRA adapter; set trainer.policy.model.lora.rank > 0")
    if glm.sync.mode == "memory" and trainer.strategy == "megatron":
        if trainer.policy.megatron_config.lora_config.merge_lora:
            raise ConfigError(
                "skyrl_glm.sync.mode: memory ships the adapter alone; set "
                "trainer.policy.megatron_config.lora_config.merge_lora=false"
            )
    transport = resolved_transport(cfg)
    if glm.sync.mode == "memory" and registry().transport(transport).needs_group:
        from skyrl_glm.sync.transports.collective import CollectiveTransport

        if registry().transport(transport) is not CollectiveTransport:  # the group SkyRL runs open (sync_group)
            raise ConfigError(
                f"skyrl_glm.sync.transport: {transport} inside SkyRL needs a process group with the vLLM workers; "
                f"SkyRL runs open one for {CollectiveTransport.name} only"
            )
    if glm.cpu and glm.sync.transport == "ipc":
        raise ConfigError(
            "skyrl_glm.sync.transport: ipc moves CUDA memory; with skyrl_glm.cpu=true use cpu, nccl (over gloo) or auto"
        )
    if glm.sync.mode == "memory" and transport == "ipc" and not trainer.placement.colocate_all:
        raise ConfigError(
            "skyrl_glm.sync.transport: ipc maps the trainer's GPU memory into vLLM on the same GPU; set "
            "trainer.placement.colocate_all=true, or transport=auto (shared memory on one node, nccl across nodes)"
        )
    if glm.sync.fault != NO_FAULT and glm.sync.mode != "memory":
        raise ConfigError(
            "skyrl_glm.sync.fault: faults are injected into the memory sync; set skyrl_glm.sync.mode=memory"
        )
    if glm.sync.expert_layout != PER_EXPERT:
        expert_layout_problem = _expert_layout_problem(cfg)
        if expert_layout_problem:
            raise ConfigError(f"skyrl_glm.sync.expert_layout: {expert_layout_problem}")
    if glm.check.before_training and not lora:
        raise ConfigError(
            "skyrl_glm.check.before_training: the check perturbs LoRA B; set trainer.policy.model.lora.rank > 0"
        )


def _expert_layout_problem(cfg: Any) -> str | None:
    """Why the run cannot serve its adapter in a stacked expert layout, or None."""
    glm, trainer = cfg.skyrl_glm, cfg.trainer
    layout = glm.sync.expert_layout
    if layout == STACKED_3D:
        return (
            "stacked-3d needs LoRARequest(is_3d_lora_weight=True), which SkyRL 0.4.0's servers do not send "
            "(load_lora_adapter); use per-expert or shared-outer"
        )
    if glm.sync.mode != "memory":
        return f"{layout} is built by the in-memory receiver; set skyrl_glm.sync.mode=memory"
    if trainer.strategy != "megatron" or not trainer.policy.model.lora.share_expert_adapters:
        return (
            f"{layout} serves one gate/up lora_A and one down lora_B per layer for all experts; only Megatron with "
            "trainer.policy.model.lora.share_expert_adapters=true trains such an adapter (use per-expert)"
        )
    return None


def validate(cfg: Any) -> None:
    """Everything a run needs of its config, checked before anything starts: skyrl-glm's combinations, SkyRL
    bounds it does not check itself, the recipe's rules, then SkyRL's own ``validate_cfg`` (on a copy). One
    :class:`ConfigError` (naming the key) for the first problem."""
    from skyrl.train.utils import validate_cfg

    check_consistency(cfg)
    if problem := range_problem(cfg):  # SkyRL values it takes at any value (counts, sampling, engine arguments)
        raise ConfigError(problem)
    if found := recipe_problems(cfg):  # layout vs stated hardware, sampler-ignored LoRA targets, overlong buffer
        raise ConfigError(found[0])
    # On a copy: validate_cfg also rewrites a few keys (the run's own call, in train, keeps them), and it asks this
    # machine for WANDB_API_KEY, which only the run's machine must have (train checks it there).
    probe = copy.deepcopy(cfg)
    if probe.trainer.logger == "wandb" and not os.environ.get("WANDB_API_KEY"):
        probe.trainer.logger = "console"
    try:
        validate_cfg(probe)
    except AssertionError as e:  # SkyRL's checks are asserts, some without a message
        raise ConfigError(f"SkyRL's validate_cfg refused the config: {_assertion(e)}") from None


def _assertion(e: AssertionError) -> str:
    if str(e):
        return str(e).splitlines()[0]
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"assertion at {Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}" if tb else "assertion failed"


def missing_data(cfg: Any) -> str | None:
    """The first training or eval data file that does not exist (checked before a run starts), or None."""
    for role, files in (("data.train_data", cfg.data.train_data), ("data.val_data", cfg.data.val_data or [])):
        for f in files:
            if not Path(f).is_file():
                return f"{role}: {f}: no such file (skyrl-glm data prepare ... writes it)"
    return None


# -- recipes ---------------------------------------------------------------------------------------


@functools.cache
def run_dir(root: str = "") -> str:
    """A directory name of this run alone, under ``root`` (default: the temp dir): a recipe writes its artifacts
    under ``${skyrl_glm_run:ROOT}`` so that two runs of one recipe never share a path. Fixed per process."""
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    return os.path.join(root or os.path.join(tempfile.gettempdir(), "skyrl-glm-runs"), stamp)


OmegaConf.register_resolver("skyrl_glm_run", run_dir, replace=True)


def packaged_data(name: str) -> str:
    """Path of a data file shipped in the package; recipes use it as ``${skyrl_glm_data:<file>}``."""
    path = resources.files("skyrl_glm") / "data" / name
    if "/" in name or not path.is_file():
        raise ConfigError(f"skyrl_glm_data:{name}: no such packaged data file")
    return str(path)


OmegaConf.register_resolver("skyrl_glm_data", packaged_data, replace=True)


def packaged_recipes() -> list[str]:
    """Names of the recipes shipped in the package (``skyrl_glm/recipes/<name>.yaml``)."""
    root = resources.files("skyrl_glm") / "recipes"
    return sorted(p.name.rsplit(".", 1)[0] for p in root.iterdir() if p.name.endswith(RECIPE_SUFFIXES))


def resolve_recipe(name: str | Path, relative_to: Path | None = None) -> Path:
    """A recipe file: a path (relative to ``relative_to`` or the working directory), else a packaged name."""
    path = Path(name)
    candidate = (relative_to / path) if relative_to is not None and not path.is_absolute() else path
    if candidate.is_file():
        return candidate
    stem = path.name.removesuffix(path.suffix) if path.suffix in RECIPE_SUFFIXES else path.name
    if path.parent == Path("."):
        packaged = resources.files("skyrl_glm") / "recipes" / f"{stem}.yaml"
        if packaged.is_file():
            return Path(str(packaged))
    raise ConfigError(f"{name}: no such recipe file, and no packaged recipe of that name ({packaged_recipes()})")


def _read_recipe(path: Path, chain: tuple[Path, ...]) -> list[tuple[str, DictConfig]]:
    """The layers of one recipe, its bases first."""
    if path.resolve() in chain:
        raise ConfigError(f"{path}: {BASE_KEY}: circular composition ({' -> '.join(map(str, chain + (path,)))})")
    if len(chain) >= MAX_BASE_DEPTH:
        raise ConfigError(f"{path}: {BASE_KEY}: more than {MAX_BASE_DEPTH} recipes composed ({chain[0]} -> ...)")
    try:
        layer = OmegaConf.load(path)
    except (OSError, OmegaConfBaseException, ValueError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: unreadable YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(layer, DictConfig):
        raise ConfigError(f"{path}: a recipe must be a mapping of config sections, got {type(layer).__name__}")
    layers: list[tuple[str, DictConfig]] = []
    if BASE_KEY in layer:
        base = layer.pop(BASE_KEY)
        if not isinstance(base, str) or not base:
            raise ConfigError(f"{path}: {BASE_KEY}: must be a file or a packaged recipe name, got {base!r}")
        try:
            base_path = resolve_recipe(base, relative_to=path.parent)
        except ConfigError as e:
            raise ConfigError(f"{path}: {BASE_KEY}: {e}") from None
        layers += _read_recipe(base_path, chain + (path.resolve(),))
    return [*layers, (str(path), layer)]


def _override_layer(overrides: Iterable[str]) -> DictConfig:
    items = list(overrides)
    for item in items:
        key = item.split("=", 1)[0]
        if "=" not in item or not key:
            raise ConfigError(f"{COMMAND_LINE}: {item!r}: overrides are key=value (e.g. trainer.epochs=2)")
        if key.startswith("+"):
            raise ConfigError(f"{COMMAND_LINE}: {key}: the '+' prefix is not supported; every key is in the schema")
    try:
        return OmegaConf.from_cli(items)
    except (OmegaConfBaseException, yaml.YAMLError, ValueError) as e:  # YAMLError: a value such as "[1"
        first = " ".join(str(e).split())
        raise ConfigError(f"{COMMAND_LINE}: cannot read the overrides {items}: {first:.200}") from None


# -- schema checks ---------------------------------------------------------------------------------


def _dataclass_of(hint: Any) -> type | None:
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        found = [c for a in typing.get_args(hint) if (c := _dataclass_of(a)) is not None]
        return found[0] if found else None
    if origin is typing.Annotated:
        return _dataclass_of(typing.get_args(hint)[0])
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def _scalar_problem(hint: Any, value: Any) -> str | None:
    """Why ``value`` cannot be a ``hint`` (only plain scalars and Literals are checked), or None."""
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin is Literal:
        return None if value in args else f"must be one of {'|'.join(map(str, args))}, got {value!r}"
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        problems = [_scalar_problem(a, value) for a in args if a is not type(None)]
        return None if any(p is None for p in problems) else problems[0]
    if hint is bool:
        return None if isinstance(value, bool) else f"expected true/false, got {value!r}"
    if hint is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else f"expected an integer, got {value!r}"
    if hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if ok and not math.isfinite(value):
            return f"expected a finite number, got {value}"
        return None if ok else f"expected a number, got {value!r}"
    if hint is str:
        return None if isinstance(value, str) else f"expected a string, got {value!r}"
    return None


def _yaml(value: Any) -> str:
    return "null" if value is None else repr(value)


def _check_keys(cls: type, node: Mapping[str, Any], source: str, prefix: str = "") -> None:
    """Every key of ``node`` exists in the dataclass ``cls`` and every plain scalar has its type."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        if not isinstance(key, str):
            raise ConfigError(f"{source}: {dotted}: a key must be a name, got {type(key).__name__} {key!r}")
        if key not in names:
            near = difflib.get_close_matches(key, names, n=1)
            hint = f"did you mean {prefix}{near[0]}?" if near else f"valid here: {', '.join(sorted(names))}"
            raise ConfigError(f"{source}: {dotted}: unknown key ({hint})")
        hint = hints[key]
        nested = _dataclass_of(hint)
        if nested is not None and isinstance(value, Mapping):
            _check_keys(nested, value, source, f"{dotted}.")
        elif nested is not None and (value is not None or type(None) not in typing.get_args(hint)):
            raise ConfigError(f"{source}: {dotted}: expected a section (mapping), got {_yaml(value)}")
        elif (isinstance(value, str | int | float | bool) or hint in (int, float, bool)) and (
            problem := _scalar_problem(hint, value)
        ):
            raise ConfigError(f"{source}: {dotted}: {problem}")


def _flatten(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted leaves (a dict value with keys becomes dotted keys; lists and empty dicts stay values)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _source_of(layers: list[tuple[str, DictConfig]], message: str, default: str) -> str:
    """The last layer that sets the dotted key a message starts with (where the user must fix it)."""
    key = message.split(":", 1)[0]
    for source, layer in reversed(layers):
        if OmegaConf.select(layer, key, default=None) is not None:
            return source
    return default


def _container(layer: DictConfig, source: str) -> dict[str, Any]:
    try:
        return typing.cast(dict[str, Any], OmegaConf.to_container(layer, resolve=True))
    except OmegaConfBaseException as e:
        raise ConfigError(f"{source}: {str(e).splitlines()[0]}") from None


def load_config(
    recipe: str | Path | None,
    overrides: Iterable[str] = (),
    config_cls: type[SkyRLTrainConfig] = SkyRLGlmConfig,
) -> SkyRLTrainConfig:
    """The typed config of ``recipe`` (a YAML file or a packaged recipe name; None: defaults only) with
    ``overrides`` (``key=value``) applied; ``skyrl_glm.cpu=true`` adds the CPU-mode settings first."""
    from skyrl_glm.skyrl import cpu

    layers = _read_recipe(resolve_recipe(recipe), ()) if recipe is not None else []
    layers.append((COMMAND_LINE, _override_layer(overrides)))
    for source, layer in layers:
        _check_keys(config_cls, _container(layer, source), source)
    try:
        merged = OmegaConf.merge(*(layer for _, layer in layers)) if layers else OmegaConf.create()
    except OmegaConfBaseException as e:
        raise ConfigError(f"{recipe}: cannot merge the recipe layers: {str(e).splitlines()[0]}") from None
    where = str(recipe) if recipe is not None else COMMAND_LINE
    values = _container(merged, where)
    if OmegaConf.select(merged, "skyrl_glm.cpu", default=False) is True:
        try:
            values = cpu.apply_settings(values)
        except ValueError as e:
            raise ConfigError(f"{_source_of(layers, str(e), where)}: {e}") from None
    try:
        cfg = config_cls.from_cli_overrides(_flatten(values))
        validate(cfg)
        return cfg
    except ConfigError as e:
        raise ConfigError(f"{_source_of(layers, str(e), where)}: {e}") from None
    except (ValueError, TypeError, AssertionError, OmegaConfBaseException) as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{_source_of(layers, message, where)}: {message}") from None


def config_yaml(cfg: SkyRLTrainConfig) -> str:
    """The full resolved config as YAML (what a run used)."""
    return OmegaConf.to_yaml(OmegaConf.create(dataclasses.asdict(cfg)))


__all__ = [
    "CheckSection",
    "check_consistency",
    "missing_data",
    "run_dir",
    "validate",
    "ConfigError",
    "GlmSection",
    "SkyRLGlmConfig",
    "SyncSection",
    "config_yaml",
    "load_config",
    "make_glm_config",
    "packaged_data",
    "packaged_recipes",
    "resolve_recipe",
    "resolved_transport",
]
