"""The plugin contract (pluggy hookspecs) and the registry built from the ``skyrl_glm`` entry points.

Everything skyrl-glm knows about models, transports and check scorers arrives through these hooks,
the built-in GLM support included: a third-party package adds a model family by shipping a module
with ``@hookimpl`` functions and naming it in its own ``skyrl_glm`` entry-point group.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from skyrl_glm.models.base import ModelFamily
    from skyrl_glm.sync.transports.base import Transport

PROJECT = "skyrl_glm"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class Hookspecs:
    """What a plugin may contribute. Each hook returns a list; the registry merges them by name."""

    @hookspec
    def skyrl_glm_model_families(self) -> list[ModelFamily]:
        """Model adapters: config facts, LoRA target policy, name rules, tiny-checkpoint factory."""

    @hookspec
    def skyrl_glm_transports(self) -> list[tuple[str, type[Transport]]]:
        """Sync transports as ``(name, class)``: how unique adapter tensors move trainer -> sampler."""

    @hookspec
    def skyrl_glm_scorers(self) -> list[tuple[str, Callable[..., Any]]]:
        """Handoff-check scorers as ``(name, factory)``; names are ``trainer:<x>`` or ``sampler:<x>``."""

    @hookspec
    def skyrl_glm_skyrl_workers(self) -> list[tuple[str, Callable[[], tuple[Any, Any, Any]]]]:
        """SkyRL worker classes per ``trainer.strategy`` as ``(strategy, factory)``; the factory returns the
        ``(PolicyWorker, CriticWorker, RefWorker)`` Ray actor classes (imported when called, not at registration)."""


class RegistryError(LookupError):
    """A name is unknown, or two plugins registered the same name."""


@dataclass(frozen=True)
class Registry:
    models: dict[str, ModelFamily]
    transports: dict[str, type[Transport]]
    scorers: dict[str, Callable[..., Any]]
    skyrl_workers: dict[str, Callable[[], tuple[Any, Any, Any]]]

    def model(self, name: str) -> ModelFamily:
        return _lookup(self.models, name, "model family")

    def model_for_type(self, hf_model_type: str) -> ModelFamily:
        """The family whose checkpoints carry this ``config.model_type``."""
        for family in self.models.values():
            if family.hf_model_type == hf_model_type:
                return family
        raise RegistryError(
            f"no registered model family handles model_type {hf_model_type!r}; "
            f"known: {sorted(f.hf_model_type for f in self.models.values())}"
        )

    def transport(self, name: str) -> type[Transport]:
        return _lookup(self.transports, name, "transport")

    def scorer(self, name: str) -> Callable[..., Any]:
        return _lookup(self.scorers, name, "scorer")

    def skyrl_worker_classes(self, strategy: str) -> tuple[Any, Any, Any]:
        return _lookup(self.skyrl_workers, strategy, "SkyRL worker strategy")()


def _lookup[T](table: dict[str, T], name: str, what: str) -> T:
    try:
        return table[name]
    except KeyError:
        raise RegistryError(f"unknown {what} {name!r}; registered: {sorted(table)}") from None


def _merge[T](results: Iterable[list[tuple[str, T]]], what: str) -> dict[str, T]:
    merged: dict[str, T] = {}
    for items in results:
        for name, value in items:
            if name in merged and merged[name] is not value:
                raise RegistryError(f"two plugins register the {what} {name!r}")
            merged[name] = value
    return merged


def plugin_manager(extra_plugins: Iterable[object] = ()) -> pluggy.PluginManager:
    """A manager with the hookspecs and every ``skyrl_glm`` entry point loaded (plus ``extra_plugins``)."""
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(Hookspecs)
    pm.load_setuptools_entrypoints(PROJECT)
    for plugin in extra_plugins:
        pm.register(plugin)
    return pm


def build_registry(pm: pluggy.PluginManager) -> Registry:
    hook = pm.hook
    models = _merge(([(f.name, f) for f in fams] for fams in hook.skyrl_glm_model_families()), "model family")
    return Registry(
        models=models,
        transports=_merge(hook.skyrl_glm_transports(), "transport"),
        scorers=_merge(hook.skyrl_glm_scorers(), "scorer"),
        skyrl_workers=_merge(hook.skyrl_glm_skyrl_workers(), "SkyRL worker strategy"),
    )


@functools.cache
def registry() -> Registry:
    """The process-wide registry of everything installed plugins provide (entry points read once)."""
    return build_registry(plugin_manager())
