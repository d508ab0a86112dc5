"""Transports come from the registry everywhere: a plugin's transport can be chosen in a SkyRL run's config, and
what a transport needs (a process group) is the transport's own record, not a test for the name ``nccl``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from skyrl_glm import plugins
from skyrl_glm.plugins import hookimpl
from skyrl_glm.skyrl.config.recipes import load_config
from skyrl_glm.skyrl.config.sections import ConfigError, resolved_transport
from skyrl_glm.sync.transports.base import Transport
from skyrl_glm.usage import UsageError


class PluginTransport(Transport):
    """A third party's transport (never sends anything here: only the choice of it is tested)."""

    name = "plugin-tx"

    def __init__(self, group: Any = None, src: int = 0) -> None:
        self.group, self.src = group, src

    def prepare(self, plan: Any) -> dict[str, Any]:
        return {}

    def incoming_bytes(self, manifest: Any, handle: dict[str, Any]) -> int:
        return 0

    def receive(self, manifest: Any, handle: dict[str, Any], out: Any) -> None:
        return None


class PluginGroupTransport(PluginTransport):
    name = "plugin-group-tx"
    needs_group = True


class ThirdParty:
    @hookimpl
    def skyrl_glm_transports(self) -> list[tuple[str, Any]]:
        return [(PluginTransport.name, PluginTransport), (PluginGroupTransport.name, PluginGroupTransport)]


@pytest.fixture
def with_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    real = plugins.plugin_manager
    monkeypatch.setattr(plugins, "plugin_manager", lambda extra=(): real([ThirdParty(), *extra]))
    plugins.registry.cache_clear()
    yield
    plugins.registry.cache_clear()


def test_a_plugin_transport_is_chosen_in_a_skyrl_config(with_plugin: None) -> None:
    cfg = load_config("tiny_cpu_grpo", ["skyrl_glm.sync.transport=plugin-tx"])
    assert resolved_transport(cfg.skyrl_glm, cfg.trainer.placement) == "plugin-tx"


def test_a_transport_that_needs_a_process_group_is_refused_inside_skyrl_by_its_record(with_plugin: None) -> None:
    """SkyRL runs open a group for the collective transport only (the trainer's rank 0 and every vLLM worker)."""
    with pytest.raises(ConfigError, match="plugin-group-tx inside SkyRL needs a process group"):
        load_config("tiny_cpu_grpo", ["skyrl_glm.sync.transport=plugin-group-tx"])
    assert load_config("tiny_cpu_grpo", ["skyrl_glm.sync.transport=nccl"]).skyrl_glm.sync.transport == "nccl"


def test_an_unregistered_transport_is_refused_with_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match=r"skyrl_glm.sync.transport: must be one of auto\|cpu\|ipc\|nccl, got 'tcp'"):
        load_config("tiny_cpu_grpo", ["skyrl_glm.sync.transport=tcp"])


def test_the_check_refuses_a_group_transport_by_its_record(with_plugin: None) -> None:
    from skyrl_glm.check.runner import CheckOptions, prepare

    with pytest.raises(UsageError, match="the plugin-group-tx transport needs a process group") as e:
        prepare(CheckOptions(transport="plugin-group-tx"))
    assert "plugin-tx" in str(e.value) and "nccl" not in str(e.value).split("use --transport")[1]


def test_each_side_opens_a_transport_by_its_declared_needs(with_plugin: None) -> None:
    """One opener for the sender, the vLLM worker and the bench: a transport that declares a group gets the one
    given; one that does not is built bare (a group given to it is not its business)."""
    from skyrl_glm.sync.transports import needs_group, open_transport

    group = object()
    built = open_transport("plugin-group-tx", group=group)
    assert isinstance(built, PluginGroupTransport) and built.group is group
    assert open_transport("plugin-tx", group=group).group is None
    assert needs_group("plugin-group-tx") and not needs_group("plugin-tx") and needs_group("nccl")


def test_each_sampler_declares_what_it_serves_with() -> None:
    """The check reads a sampler's engine and SkyRL's worker wrap from the factory's declaration, not its name: the
    two built-in samplers declare vLLM (one under SkyRL's wrap); a third party's undeclared one needs no vLLM."""
    from skyrl_glm.plugins import VLLM_ENGINE, SamplerKind, registry, sampler_kind, serves_with

    reg = registry()
    assert sampler_kind(reg.sampler("vllm")) == SamplerKind(VLLM_ENGINE, skyrl_worker=False)
    assert sampler_kind(reg.sampler("vllm-skyrl")) == SamplerKind(VLLM_ENGINE, skyrl_worker=True)
    assert sampler_kind(lambda model_dir, **kw: None) == SamplerKind()
    declared = serves_with("sglang")(lambda model_dir, **kw: None)
    assert sampler_kind(declared).engine == "sglang" and not sampler_kind(declared).skyrl_worker
