"""The collective transport's group inside SkyRL with more than one server and worker: the trainer's rank 0 opens
it (``sync_group.open_group``), every vLLM worker joins through the worker extension's ``skyrl_glm_join_group``
with the rank vLLM's own NCCL engine would give it, and one update broadcast over it reaches every worker.

The real loop (tests/test_skyrl_train.py) runs this with one server of one worker. Two servers of two workers each
cannot be started on 2 CPU cores, so SkyRL's ``RemoteInferenceClient`` is stood in by a client whose
``_call_server`` runs the RPC on each worker in its own thread, as a vLLM server's ``collective_rpc`` does; the
workers are plain objects with the ``parallel_config`` fields vLLM gives a worker. The group, the extension's
methods, the transport and the receiver are the real ones (gloo).
"""

from __future__ import annotations

import asyncio
import datetime
import json
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from skyrl_glm.skyrl.workers import sync_group
from skyrl_glm.skyrl.workers.vllm_extension import SkyRLGlmWorkerExtension
from skyrl_glm.sync.plan import build_plan
from skyrl_glm.sync.receiver import AdapterReceiver
from skyrl_glm.sync.transports.base import TransportError
from skyrl_glm.sync.transports.collective import CollectiveTransport
from skyrl_glm.sync.vllm.worker import receiver_state, receiving_transport

pytestmark = pytest.mark.vllm


class Worker(SkyRLGlmWorkerExtension):
    """What the extension reads from vLLM's worker: its ``parallel_config``."""

    def __init__(self, rank_in_server: int, per_server: int) -> None:
        self.parallel_config = SimpleNamespace(data_parallel_index=0, world_size=per_server, rank=rank_in_server)


class Servers:
    """``RemoteInferenceClient`` as the sync group uses it: two servers (one deployment each) of two workers."""

    server_urls = ["http://server-0", "http://server-1"]
    data_parallel_size = 1

    def __init__(self) -> None:
        self.workers = {url: [Worker(0, 2), Worker(1, 2)] for url in self.server_urls}

    async def get_world_size(self) -> tuple[int, int]:
        return 4, 2

    async def _call_server(self, url: str, endpoint: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        assert endpoint == "/collective_rpc"
        calls = [asyncio.to_thread(getattr(w, body["method"]), *body["args"]) for w in self.workers[url]]
        results = await asyncio.gather(*calls)
        return url, {"status": 200, "body": {"results": [str(r) for r in results]}}  # the server answers text


def test_every_worker_of_every_server_joins_and_receives_one_broadcast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync_group, "TIMEOUT", datetime.timedelta(seconds=30))  # a rank clash fails, not hangs
    servers = Servers()
    group = asyncio.run(sync_group.open_group(servers, "gloo", servers.server_urls))
    workers = [w for ws in servers.workers.values() for w in ws]
    assert group.size() == 5 and group.rank() == 0
    # server 0's workers after the trainer (ranks 1, 2), server 1's after them (3, 4): nccl_init_payloads' offsets
    assert sorted(receiver_state(w).group.rank() for w in workers) == [1, 2, 3, 4]

    adapter = {
        "base_model.model.layers.0.q_proj.lora_A.weight": torch.randn(2, 8),
        "base_model.model.layers.0.q_proj.lora_B.weight": torch.randn(8, 2),
    }
    plan = build_plan(adapter, adapter_config={"r": 2, "lora_alpha": 2}, lora_name="p", version=1)
    sender = CollectiveTransport(group=group, src=0)
    handle = sender.prepare(plan)

    def receive(w: Worker) -> dict[str, torch.Tensor]:
        tx = receiving_transport(w, receiver_state(w), CollectiveTransport.name)
        return AdapterReceiver().receive(plan.manifest.to_json(), json.loads(json.dumps(handle)), tx).tensors

    async def one_update() -> list[dict[str, torch.Tensor]]:
        receiving = asyncio.gather(*(asyncio.to_thread(receive, w) for w in workers))
        await asyncio.to_thread(sender.stream, plan)
        return await receiving

    for got in asyncio.run(one_update()):
        assert set(got) == set(adapter) and all(torch.equal(got[n], t) for n, t in adapter.items())


def test_a_worker_that_never_joined_refuses_a_collective_update() -> None:
    """Never vLLM's own world group: the trainer is not in it."""
    with pytest.raises(TransportError, match="has not joined the trainer's sync group"):
        worker = Worker(0, 1)
        receiving_transport(worker, receiver_state(worker), CollectiveTransport.name)
