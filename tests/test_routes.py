"""Each engine's transport from where it runs (skyrl_glm.skyrl.workers.routes): the sender's node and colocated on GPUs
-> CUDA IPC, the sender's node otherwise -> shared memory, another node -> the collective transport; a transport
that cannot cross nodes is never handed to an engine on another node. The routes SkyRL's servers get, the
fan-out that sends one plan over several transports, and the dry run's prediction."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from skyrl_glm.skyrl.workers.routes import (
    ROUTE_FAULTS,
    Route,
    RouteError,
    engine_transport,
    plan_routes,
)
from skyrl_glm.sync.plan import build_plan
from skyrl_glm.sync.transports.base import Transport
from skyrl_glm.sync.transports.fanout import HANDLES, FanOut

NODE0, NODE1 = "10.77.0.1", "10.77.0.2"
SERVERS = [f"http://{NODE0}:8000", f"http://{NODE1}:8100"]
ENGINES = [(SERVERS[0], NODE0), (SERVERS[1], NODE1)]


def routes_for(
    configured: str, colocated_gpu: bool, engines: list[tuple[str, str]], fault: str = "none"
) -> list[Route]:
    return plan_routes(configured, colocated_gpu, NODE0, engines, fault)


@pytest.mark.parametrize(
    ("colocated_gpu", "same_node", "expected"),
    [(True, True, "ipc"), (False, True, "cpu"), (True, False, "nccl"), (False, False, "nccl")],
)
def test_auto_picks_the_transport_from_where_the_engine_runs(
    colocated_gpu: bool, same_node: bool, expected: str
) -> None:
    assert engine_transport("auto", colocated_gpu, same_node) == expected


def test_auto_never_hands_an_engine_on_another_node_a_same_host_transport() -> None:
    """The guard of this module: whatever auto picks for an engine on another node must cross nodes."""
    from skyrl_glm.plugins import registry

    for colocated_gpu in (True, False):
        routes = routes_for("auto", colocated_gpu, ENGINES)
        remote = [r for r in routes if r.node != NODE0]
        assert remote and all(registry().transport(r.transport).crosses_nodes for r in remote), routes
        assert [r.transport for r in routes if r.node == NODE0] == ["ipc" if colocated_gpu else "cpu"]


def test_the_remote_same_host_fault_breaks_exactly_that_guard() -> None:
    """The deliberately broken routing hands the engine on node 1 the sender's shared memory: the check above
    would fail on it (and the two-node run does: tests/test_two_nodes.py)."""
    from skyrl_glm.plugins import registry

    routes = routes_for("auto", False, ENGINES, fault="remote-same-host")
    assert [(r.node, r.transport) for r in routes] == [(NODE0, "cpu"), (NODE1, "cpu")]
    assert not all(registry().transport(r.transport).crosses_nodes for r in routes if r.node != NODE0)
    skipped = routes_for("auto", False, ENGINES, fault="skip-remote")
    assert [r.node for r in skipped] == [NODE0] and set(ROUTE_FAULTS) == {"remote-same-host", "skip-remote"}


@pytest.mark.parametrize("named", ["cpu", "ipc"])
def test_a_named_same_host_transport_is_refused_for_an_engine_on_another_node(named: str) -> None:
    assert [r.transport for r in routes_for(named, True, ENGINES[:1])] == [named]
    with pytest.raises(RouteError, match=f"{named} hands a handle only a process on the sender's node can open"):
        routes_for(named, True, ENGINES)


def test_a_named_transport_that_crosses_nodes_goes_to_every_engine() -> None:
    routes = routes_for("nccl", False, ENGINES)
    assert [r.transport for r in routes] == ["nccl", "nccl"]
    assert {r.sender for r in routes} == {f"rank 0 @ {NODE0}"}


def test_a_plugin_transport_is_node_local_unless_it_says_otherwise() -> None:
    class Plugin(Transport):
        name = "plugin-tx"

        def prepare(self, plan):  # type: ignore[no-untyped-def]
            return {}

        def incoming_bytes(self, manifest, handle):  # type: ignore[no-untyped-def]
            return 0

        def receive(self, manifest, handle, out):  # type: ignore[no-untyped-def]
            return None

    assert not Plugin.crosses_nodes
    with pytest.raises(RouteError):
        plan_routes("plugin-tx", False, NODE0, [("e1", NODE1)], crosses_nodes=lambda n: Plugin.crosses_nodes)


def test_an_engine_whose_workers_span_nodes_takes_the_collective_transport() -> None:
    """A TP x PP group larger than a node: its workers on node 0 could open a node-local handle, the rest not."""
    spanning = [(SERVERS[0], f"{NODE0}+{NODE1}")]
    assert [r.transport for r in routes_for("auto", True, spanning)] == ["nccl"]
    with pytest.raises(RouteError):
        routes_for("ipc", True, spanning)


class Recording(Transport):
    """A transport that records what the fan-out asks of it."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name  # type: ignore[misc]
        self.log = log

    def staging(self, nbytes: int, device: torch.device) -> torch.Tensor:
        self.log.append(f"{self.name}.staging")
        return super().staging(nbytes, device)

    def prepare(self, plan):  # type: ignore[no-untyped-def]
        self.log.append(f"{self.name}.prepare")
        return {"from": self.name}

    def stream(self, plan):  # type: ignore[no-untyped-def]
        self.log.append(f"{self.name}.stream")

    def release(self) -> None:
        self.log.append(f"{self.name}.release")

    def incoming_bytes(self, manifest, handle):  # type: ignore[no-untyped-def]
        return 0

    def receive(self, manifest, handle, out):  # type: ignore[no-untyped-def]
        return None


def test_the_fan_out_packs_once_and_hands_each_transport_its_own_handle() -> None:
    log: list[str] = []
    fan = FanOut([Recording("cpu", log), Recording("nccl", log)])
    adapter = {"m.q_proj.lora_A.weight": torch.ones(2, 4), "m.q_proj.lora_B.weight": torch.ones(4, 2)}
    plan = build_plan(adapter, adapter_config={"r": 2, "lora_alpha": 2}, lora_name="p", version=1, staging=fan.staging)
    assert fan.prepare(plan) == {HANDLES: {"cpu": {"from": "cpu"}, "nccl": {"from": "nccl"}}}
    fan.stream(plan)
    fan.release()
    assert log == [
        "cpu.staging",
        "cpu.prepare",
        "nccl.prepare",
        "cpu.stream",
        "nccl.stream",
        "cpu.release",
        "nccl.release",
    ]
    with pytest.raises(ValueError, match="distinct transports"):
        FanOut([Recording("cpu", log), Recording("cpu", log)])
    with pytest.raises(TypeError, match="only sends"):
        fan.receive(plan.manifest, {}, torch.empty(0, dtype=torch.uint8))


def test_a_route_is_plain_data() -> None:
    r = Route(SERVERS[1], NODE1, "nccl", f"rank 0 @ {NODE0}")
    assert r.to_dict() == {"engine": SERVERS[1], "node": NODE1, "transport": "nccl", "sender": f"rank 0 @ {NODE0}"}


def test_the_dry_run_lays_out_each_node_of_both_multi_node_recipes() -> None:
    from skyrl_glm.skyrl.config.placement import placement_lines
    from skyrl_glm.skyrl.config.recipes import load_config

    def lines(recipe: str, *overrides: str) -> list[str]:
        cfg = load_config(recipe, list(overrides))
        return placement_lines(cfg.trainer, cfg.generator.inference_engine, cfg.skyrl_glm)

    assert lines("glm53_flash_dapo_math_2node") == [
        "node 0: trainer ranks 0-7; engine 0 on GPUs 0-7: ipc from rank 0 @ node 0",
        "node 1: trainer ranks 8-15; engine 1 on GPUs 0-7: nccl from rank 0 @ node 0",
    ]
    # GLM-5.3's engines are TP 8 x PP 2: each spans two nodes, so even engine 0 cannot take rank 0's IPC handle
    assert lines("glm53_dapo_math") == [
        "node 0: trainer ranks 0-7; engine 0 on nodes 0-1 (16 GPUs): nccl from rank 0 @ node 0",
        "node 1: trainer ranks 8-15; no engine",
        "node 2: trainer ranks 16-23; engine 1 on nodes 2-3 (16 GPUs): nccl from rank 0 @ node 0",
        "node 3: trainer ranks 24-31; no engine",
    ]
    refused = ("skyrl_glm.sync.transport=ipc",)
    with pytest.raises(Exception, match="reaches only engines on the trainer's sending node"):
        lines("glm53_flash_dapo_math_2node", *refused)


def test_cpu_mode_spreads_the_engines_placement_group_over_the_nodes() -> None:
    """Without colocation SkyRL PACKs the engines' placement group (all engines on one node); CPU mode asks Ray to
    SPREAD it, so a two-node CPU run places one engine per node as the colocated recipes do."""
    import types

    from skyrl_glm.skyrl.compat import cpu

    asked: list[str] = []
    setup = types.SimpleNamespace(ray_placement_group=lambda bundles, strategy="PACK": asked.append(strategy))
    cpu._patch_engine_placement(setup)  # type: ignore[arg-type]
    setup.ray_placement_group([{"GPU": 1}], strategy="PACK")
    setup.ray_placement_group([{"GPU": 1}])
    setup.ray_placement_group([{"GPU": 1}], strategy="STRICT_PACK")
    assert asked == ["SPREAD", "SPREAD", "STRICT_PACK"]


class OneServer:
    """A one-server SkyRL client as ``SkyRLServers`` drives it: records each call, every worker accepts."""

    def __init__(self, answer: dict[str, Any] | None = None) -> None:
        self.calls: list[tuple[str, list[Any]]] = []
        self.loaded: list[str] = []
        self.answer = answer or {"ok": True, "version": 1, "staged": "skyrl-lora@v1"}

    async def _call_all_servers(self, endpoint: str, json: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((json["method"], json["args"][1:]))  # after the call's MAC
        if json["method"] == "skyrl_glm_discard" and not self.answer.get("ok"):
            raise RuntimeError("500: skyrl_glm_discard: 'skyrl-lora@v1' was not staged by this worker")
        return {"url": {"body": {"results": [self.answer] if json["method"] == "skyrl_glm_receive" else [True]}}}

    async def load_lora_adapter(self, name: str, path: str) -> None:
        self.loaded.append(path)


def test_each_server_is_handed_its_own_routes_handle() -> None:
    import asyncio

    from skyrl_glm.skyrl.workers.publish import SkyRLServers

    near, far = OneServer(), OneServer()
    routes = routes_for("auto", False, ENGINES)
    servers = SkyRLServers(list(zip(routes, [near, far], strict=True)), "skyrl-lora")
    handles = {HANDLES: {"cpu": {"shm_name": "seg"}, "nccl": {"src": 0, "buckets": 1}}}
    result = asyncio.run(servers.apply_update("{}", handles, FanOut.name))
    assert result.ok, result.reason
    assert near.calls[0] == ("skyrl_glm_receive", ["{}", {"shm_name": "seg"}, "cpu", True])
    assert far.calls[0] == ("skyrl_glm_receive", ["{}", {"src": 0, "buckets": 1}, "nccl", True])
    assert [m for m, _ in far.calls] == ["skyrl_glm_receive", "skyrl_glm_commit"] and far.loaded


def test_a_refusal_on_one_engine_is_reported_and_only_the_engines_that_staged_discard() -> None:
    """The engine on node 1 handed a segment it cannot open refuses; the update is rejected with that reason, the
    engine on node 0 drops its staged copy, and node 1 (which staged nothing) is not asked to."""
    import asyncio

    from skyrl_glm.skyrl.workers.publish import SkyRLServers

    refusal = {"ok": False, "reason": "shared-memory segment 'skyrl_glm_x' unreadable (sender gone?)"}
    near, far = OneServer(), OneServer(refusal)
    routes = routes_for("auto", False, ENGINES, fault="remote-same-host")
    servers = SkyRLServers(list(zip(routes, [near, far], strict=True)), "skyrl-lora")
    result = asyncio.run(servers.apply_update("{}", {HANDLES: {"cpu": {"shm_name": "x"}}}, FanOut.name))
    assert not result.ok and result.reason == f"update rejected by {SERVERS[1]}: {refusal['reason']}"
    assert [m for m, _ in near.calls] == ["skyrl_glm_receive", "skyrl_glm_discard"] and not near.loaded
    assert [m for m, _ in far.calls] == ["skyrl_glm_receive"] and not far.loaded
