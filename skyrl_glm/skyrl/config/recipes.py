"""The one loader for recipes: an OmegaConf YAML file (or a packaged recipe name) to a run's typed config.

A recipe is in the same shape as the config (SkyRL's sections plus ``skyrl_glm``,
:mod:`skyrl_glm.skyrl.config.sections`);
``base: <file or packaged recipe name>`` composes recipes (the base is merged first, recursively), and
``key=value`` overrides are applied last. Every key of every layer is checked against the config's dataclasses
before the merge, so a problem is one :class:`~skyrl_glm.skyrl.config.sections.ConfigError` line naming the file (or
``command line``) that set the dotted key; the built config is then checked whole
(:func:`skyrl_glm.skyrl.config.validation.validate`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import tempfile
import time
import types
import typing
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from skyrl_glm.skyrl.config.sections import ConfigError, SkyRLGlmConfig
from skyrl_glm.skyrl.config.validation import validate

if TYPE_CHECKING:
    from skyrl.train.config import SkyRLTrainConfig

BASE_KEY = "base"
COMMAND_LINE = "command line"
RECIPE_SUFFIXES = (".yaml", ".yml")
MAX_BASE_DEPTH = 32  # recipes composed through ``base`` (the packaged ones use 2)


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
    from skyrl_glm.skyrl.compat import cpu

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
