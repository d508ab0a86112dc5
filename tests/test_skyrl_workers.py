"""The parts of the SkyRL integration that run without Ray or vLLM: the plugin registry's worker factories, the
Megatron half of the worker sync on plain modules (Megatron-Bridge needs Transformer Engine, which needs CUDA),
and the publisher's refusal path."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from skyrl_glm.plugins import registry
from skyrl_glm.skyrl.workers.megatron import MegatronGlmSync, megatron_workers
from skyrl_glm.skyrl.workers.publish import SkyRLServers
from skyrl_glm.skyrl.workers.routes import Route
from skyrl_glm.sync.publisher import InMemoryPublisher
from skyrl_glm.sync.transports.fanout import FanOut
from skyrl_glm.sync.transports.shm import SharedMemoryTransport

ROOT = Path(__file__).resolve().parents[1]


def test_registry_names_both_strategies_without_importing_them() -> None:
    code = (
        "import sys; from skyrl_glm.plugins import registry; print(sorted(registry().skyrl_workers));"
        " print(any(m.startswith('skyrl.backends.skyrl_train.workers') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.split("\n")[:2] == ["['fsdp', 'megatron']", "False"]


def test_megatron_workers_need_megatron_bridge_here() -> None:
    # What did not run on CPU: SkyRL's Megatron worker imports Megatron-Bridge (Transformer Engine, CUDA).
    with pytest.raises(ModuleNotFoundError) as err:
        megatron_workers()
    assert err.value.name == "megatron.bridge"
    with pytest.raises(ModuleNotFoundError):
        registry().skyrl_worker_classes("megatron")


class Chunk(nn.Module):
    """Parameter names as Megatron-Bridge's LoRA gives them (``adapter.linear_in`` = A, ``linear_out`` = B)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear_qkv = nn.Module()
        self.linear_qkv.adapter = nn.Module()
        self.linear_qkv.adapter.linear_in = nn.Linear(8, 2, bias=False)
        self.linear_qkv.adapter.linear_out = nn.Linear(2, 8, bias=False)
        nn.init.zeros_(self.linear_qkv.adapter.linear_out.weight)


class FakeMegatronWorker(MegatronGlmSync):
    """Only the attributes the mixin reads from SkyRL's Megatron worker."""

    def __init__(self, merge_lora: bool) -> None:
        self.actor_module = [Chunk(), Chunk()]
        self._is_lora = True
        lora_config = SimpleNamespace(merge_lora=merge_lora)
        self.cfg = SimpleNamespace(policy=SimpleNamespace(megatron_config=SimpleNamespace(lora_config=lora_config)))


def test_megatron_sync_perturbs_and_restores_lora_b_exactly() -> None:
    worker = FakeMegatronWorker(merge_lora=False)
    before = [p.detach().clone() for c in worker.actor_module for n, p in c.named_parameters()]
    assert worker.skyrl_glm_lora_b_max() == 0.0
    assert worker.skyrl_glm_perturb_lora_b(0.25) == 2  # one B per chunk; A untouched
    assert worker.skyrl_glm_lora_b_max() == pytest.approx(0.25)
    moved = [c.linear_qkv.adapter.linear_in.weight for c in worker.actor_module]
    assert all(torch.equal(m, b) for m, b in zip(moved, before[0::2], strict=True))
    assert worker.skyrl_glm_restore_lora_b() == 2
    after = [p.detach() for c in worker.actor_module for n, p in c.named_parameters()]
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))


@pytest.mark.parametrize(
    ("merge_lora", "mode", "expected"), [(False, "memory", True), (True, "memory", False), (False, "disk", False)]
)
def test_megatron_memory_sync_needs_an_unmerged_adapter(merge_lora: bool, mode: str, expected: bool) -> None:
    worker = FakeMegatronWorker(merge_lora=merge_lora)
    worker.skyrl_glm_configure({"mode": mode, "transport": "cpu", "bucket_bytes": 1 << 20})
    assert worker._glm_memory_sync() is expected
    assert worker._glm_skips_transfer_engine() is expected


class RefusingServers:
    """SkyRL's inference client seen from the publisher: one server whose two workers answer the receive RPC
    differently. A real server cannot be made to refuse one worker only, hence this stand-in."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Any]]] = []
        self.loaded: list[str] = []

    async def _call_all_servers(self, endpoint: str, json: dict[str, Any]) -> dict[str, Any]:
        assert endpoint == "/collective_rpc"
        self.calls.append((json["method"], json["args"]))
        if json["method"] == "skyrl_glm_receive":
            results = [{"ok": True, "staged": "skyrl-lora@v1"}, {"ok": False, "reason": "checksum mismatch on 'x'"}]
        else:
            results = [True, True]
        return {"http://server": {"status": 200, "body": {"results": results}}}

    async def load_lora_adapter(self, name: str, path: str) -> None:
        self.loaded.append(path)


def test_a_refused_update_is_not_loaded_and_staged_copies_are_discarded() -> None:
    client = RefusingServers()
    adapter = {
        "base_model.model.layers.0.q_proj.lora_A.weight": torch.randn(2, 8),
        "base_model.model.layers.0.q_proj.lora_B.weight": torch.randn(8, 2),
    }
    servers = SkyRLServers([(Route("http://server", "server", "cpu", "rank 0 @ server"), client)], "skyrl-lora")
    publisher = InMemoryPublisher(servers, FanOut([SharedMemoryTransport()]), "skyrl-lora", 1 << 20)
    result = asyncio.run(publisher.publish_async(adapter, {"r": 2, "lora_alpha": 4}, 1))
    assert not result.ok and "checksum mismatch" in result.reason
    assert client.loaded == []  # the previous adapter keeps serving
    assert [m for m, _ in client.calls] == ["skyrl_glm_receive", "skyrl_glm_discard"]
    assert client.calls[1][1][1:] == ["skyrl-lora@v1"]  # after the call's MAC (skyrl_glm.sync.vllm.control)


def test_sync_verify_off_skips_only_the_per_tensor_checks() -> None:
    """``skyrl_glm.sync.verify=false``: a bad checksum is no longer caught, a broken structure still is."""
    import dataclasses

    from skyrl_glm.sync.plan import build_plan
    from skyrl_glm.sync.receiver import AdapterReceiver, UpdateRejected

    adapter = {
        "base_model.model.layers.0.q_proj.lora_A.weight": torch.randn(2, 8),
        "base_model.model.layers.0.q_proj.lora_B.weight": torch.randn(8, 2),
    }
    plan = build_plan(adapter, adapter_config={"r": 2, "lora_alpha": 2}, lora_name="p", version=1)
    m = plan.manifest
    wrong_sum = dataclasses.replace(m, checksums="0" * 16 + m.checksums[16:]).to_json()
    unpaired = dataclasses.replace(m, tensors=m.tensors[:1], checksums=m.checksum(0)).to_json()
    tx = SharedMemoryTransport()
    handle = tx.prepare(plan)
    try:
        with pytest.raises(UpdateRejected, match="checksum mismatch"):
            AdapterReceiver().receive(wrong_sum, handle, tx)
        assert set(AdapterReceiver().receive(wrong_sum, handle, tx, verify=False).tensors) == set(adapter)
        with pytest.raises(UpdateRejected, match="without its pair"):
            AdapterReceiver().receive(unpaired, handle, tx, verify=False)
    finally:
        tx.release()


class SyncingWorker(FakeMegatronWorker):
    """The mixin's publish step with a stand-in adapter export (the real one is Megatron-Bridge's) and a
    recording publisher standing in for the vLLM servers."""

    publisher: RecordingPublisher

    def _glm_adapter(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return {"a.lora_A.weight": torch.ones(2, 8), "a.lora_B.weight": torch.ones(8, 2)}, {"r": 2}

    def _glm_new_publisher(self, client: Any, lora_name: str) -> Any:
        return self.publisher


class RecordingPublisher:
    lora_name = "skyrl-lora"

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.versions: list[int] = []

    async def publish_async(self, tensors: Any, config: Any, version: int) -> Any:
        if self.fail:
            raise ConnectionError("server gone")
        self.versions.append(version)
        from skyrl_glm.sync.update import UpdateResult

        return UpdateResult(True, version, timings={"total_s": 0.0})


@pytest.fixture
def one_rank(tmp_path: Path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.usefixtures("one_rank")
def test_publish_counts_versions_and_the_no_publish_fault_sends_nothing_after_the_first() -> None:
    worker = SyncingWorker(merge_lora=False)
    worker.skyrl_glm_configure({"mode": "memory", "transport": "cpu", "bucket_bytes": 1 << 20, "fault": "no-publish"})
    worker._glm_routes = [Route("http://server", "server", "cpu", "rank 0 @ server")]
    worker.publisher = publisher = RecordingPublisher(fail=False)
    for _ in range(3):
        asyncio.run(worker._glm_publish(None, "skyrl-lora"))
    assert publisher.versions == [1]  # versions 2 and 3 "succeeded" without being sent
    assert worker.skyrl_glm_last_sync() == {
        "ok": True,
        "version": 3,
        "reason": "fault no-publish: nothing sent",
        "transport": "cpu",
    }


@pytest.mark.usefixtures("one_rank")
def test_a_failed_publish_raises_after_the_barrier_with_its_reason() -> None:
    worker = SyncingWorker(merge_lora=False)
    worker.skyrl_glm_configure({"mode": "memory", "transport": "cpu", "bucket_bytes": 1 << 20})
    worker.publisher = RecordingPublisher(fail=True)
    with pytest.raises(RuntimeError, match="version 1 failed: ConnectionError: server gone"):
        asyncio.run(worker._glm_publish(None, "skyrl-lora"))
    assert worker.skyrl_glm_last_sync()["ok"] is False  # type: ignore[index]
