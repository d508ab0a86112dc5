"""The plugin contract (pluggy hookspecs) and the registry built from the ``skyrl_glm`` entry points.

Everything skyrl-glm knows about models, transports, trainers and samplers arrives through these hooks, the
built-in GLM support included: a third-party package adds a model family by shipping a module with
``@hookimpl`` functions and naming it in its own ``skyrl_glm`` entry-point group.

Loading the registry must stay cheap (``skyrl-glm --help``, ``models`` and the pytest plugin read it): a hook
returns records and *references*, never imports torch, vLLM or SkyRL itself. A reference is either the object
or a ``"package.module:attribute"`` string, imported the first time the registry hands it out.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pluggy

from skyrl_glm.usage import UsageError

if TYPE_CHECKING:
    from skyrl_glm.check.algorithm import SamplerScorer, TrainerScorer
    from skyrl_glm.models.base import ModelFamily
    from skyrl_glm.sync.transports.base import Transport

PROJECT = "skyrl_glm"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

# An object, or "package.module:attribute" naming it (imported on first use).
Ref = Any


class TrainerFactory(Protocol):
    """Builds the check's trainer side for one checkpoint (see :class:`~skyrl_glm.check.algorithm.TrainerScorer`):
    its LoRA A drawn from ``seed``; with ``expert_groups`` G one adapter per group of E/G consecutive routed experts
    of a layer (1: one for all of them), None: one per expert."""

    def __call__(
        self,
        model_dir: Path,
        *,
        family: ModelFamily,
        targets: Sequence[str],
        rank: int,
        alpha: int,
        device: str,
        seed: int,
        expert_groups: int | None,
    ) -> TrainerScorer: ...


class SamplerFactory(Protocol):
    """Builds the check's sampler side for one checkpoint (see :class:`~skyrl_glm.check.algorithm.SamplerScorer`).
    ``allow_unsupported``: serve LoRA targets the sampler is known to ignore (to prove the check catches them);
    ``expert_layout``: how the engine takes routed-expert LoRA (:mod:`skyrl_glm.sync.expert_layout`). What it
    serves with is declared with :func:`serves_with` (a factory without it serves with nothing the check knows)."""

    def __call__(
        self,
        model_dir: Path,
        *,
        family: ModelFamily,
        targets: Sequence[str],
        rank: int,
        device: str,
        allow_unsupported: bool,
        expert_layout: str,
    ) -> SamplerScorer: ...


VLLM_ENGINE = "vllm"
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class SamplerKind:
    """What a sampler factory serves with: ``engine`` (:data:`VLLM_ENGINE`: the check needs vLLM installed and
    serving the model's architecture), ``skyrl_worker``: under SkyRL's vLLM worker wrap (its LoRA patches decide
    which targets are applied)."""

    engine: str | None = None
    skyrl_worker: bool = False


def serves_with(engine: str | None, *, skyrl_worker: bool = False) -> Callable[[F], F]:
    """Declare a sampler factory's :class:`SamplerKind` (read back with :func:`sampler_kind`)."""

    def declare(factory: F) -> F:
        factory.sampler_kind = SamplerKind(engine, skyrl_worker)  # type: ignore[attr-defined]
        return factory

    return declare


def sampler_kind(factory: Any) -> SamplerKind:
    """The kind a sampler factory declared with :func:`serves_with`; an undeclared one serves with nothing known."""
    return getattr(factory, "sampler_kind", SamplerKind())


class Hookspecs:
    """What a plugin may contribute. Every hook is called once, with no arguments, the first time a process asks
    for the registry (:func:`registry`), after all ``skyrl_glm`` entry points are loaded. Each returns a list; the
    lists of all plugins are concatenated and merged by name, and one name registered twice with different values
    is an error (:class:`RegistryError`), so no plugin silently shadows another."""

    @hookspec
    def skyrl_glm_model_families(self) -> list[ModelFamily]:
        """Model adapters (:class:`~skyrl_glm.models.base.ModelFamily`), keyed by ``family.name``: config facts,
        LoRA target records, full and tiny configs, sampler serving settings. Build them without torch."""

    @hookspec
    def skyrl_glm_transports(self) -> list[tuple[str, Ref]]:
        """Sync transports as ``(name, Transport subclass or "module:Class")``: how unique adapter bytes move
        trainer -> sampler. The name is what ``--transport`` and the worker-side receive take."""

    @hookspec
    def skyrl_glm_trainers(self) -> list[tuple[str, Ref]]:
        """Handoff-check trainers as ``(name, factory or "module:factory")``; a factory is a :class:`TrainerFactory`.
        The name is what ``skyrl-glm check --trainer`` takes."""

    @hookspec
    def skyrl_glm_samplers(self) -> list[tuple[str, Ref]]:
        """Handoff-check samplers as ``(name, factory or "module:factory")``; a factory is a :class:`SamplerFactory`.
        The name is what ``skyrl-glm check --sampler`` takes."""

    @hookspec
    def skyrl_glm_skyrl_workers(self) -> list[tuple[str, Ref]]:
        """SkyRL worker classes per ``trainer.strategy`` as ``(strategy, factory or "module:factory")``; the factory
        returns the ``(PolicyWorker, CriticWorker, RefWorker)`` Ray actor classes (imported only when called)."""


class RegistryError(UsageError, LookupError):
    """A name is unknown, two plugins registered the same name, or a plugin implements a hook that does not exist."""


def load_ref(ref: Ref) -> Any:
    """The object a reference names (a non-string reference is the object itself)."""
    if not isinstance(ref, str):
        return ref
    module, sep, attr = ref.partition(":")
    if not sep:
        raise RegistryError(f"reference {ref!r} is not 'package.module:attribute'")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class Registry:
    models: dict[str, ModelFamily]
    transports: dict[str, Ref]
    trainers: dict[str, Ref]
    samplers: dict[str, Ref]
    skyrl_workers: dict[str, Ref]

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
        return load_ref(_lookup(self.transports, name, "transport"))

    def trainer(self, name: str) -> TrainerFactory:
        return load_ref(_lookup(self.trainers, name, "trainer"))

    def sampler(self, name: str) -> SamplerFactory:
        return load_ref(_lookup(self.samplers, name, "sampler"))

    def skyrl_worker_classes(self, strategy: str) -> tuple[Any, Any, Any]:
        return load_ref(_lookup(self.skyrl_workers, strategy, "SkyRL worker strategy"))()


def _lookup[T](table: dict[str, T], name: str, what: str) -> T:
    try:
        return table[name]
    except KeyError:
        raise RegistryError(f"unknown {what} {name!r}; registered: {sorted(table)}") from None


def _merge[T](results: Iterable[list[tuple[str, T]]], what: str) -> dict[str, T]:
    merged: dict[str, T] = {}
    for items in results:
        for name, value in items:
            if name in merged and merged[name] != value:
                raise RegistryError(f"two plugins register the {what} {name!r}")
            merged[name] = value
    return merged


def plugin_manager(extra_plugins: Iterable[object] = ()) -> pluggy.PluginManager:
    """A manager with the hookspecs and every ``skyrl_glm`` entry point loaded (plus ``extra_plugins``).
    A ``skyrl_glm_*`` hookimpl that matches no hookspec (a misspelled hook) is a :class:`RegistryError`."""
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(Hookspecs)
    pm.load_setuptools_entrypoints(PROJECT)
    for plugin in extra_plugins:
        pm.register(plugin)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as e:
        raise RegistryError(f"plugin {e.plugin!r} implements an unknown hook: {e}") from None
    return pm


def build_registry(pm: pluggy.PluginManager) -> Registry:
    hook = pm.hook
    models = _merge(([(f.name, f) for f in fams] for fams in hook.skyrl_glm_model_families()), "model family")
    return Registry(
        models=models,
        transports=_merge(hook.skyrl_glm_transports(), "transport"),
        trainers=_merge(hook.skyrl_glm_trainers(), "trainer"),
        samplers=_merge(hook.skyrl_glm_samplers(), "sampler"),
        skyrl_workers=_merge(hook.skyrl_glm_skyrl_workers(), "SkyRL worker strategy"),
    )


@functools.cache
def registry() -> Registry:
    """The process-wide registry of everything installed plugins provide (entry points read once)."""
    return build_registry(plugin_manager())
