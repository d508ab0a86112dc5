"""The process group the collective transport runs over inside SkyRL: the trainer's sending rank (rank 0) and
every vLLM worker of the servers it reaches (:mod:`skyrl_glm.skyrl.workers.routes`: under ``auto`` the engines on other
nodes), NCCL between separate GPUs, gloo on CPU. Rank 0 hosts the rendezvous at its own node's address.

SkyRL 0.4.0 builds a group of the same shape for its own weight transfer (vLLM's NCCL engine: master address and a
free port on rank 0's node, ``world_size`` = inference workers + 1, a cumulative ``rank_offset`` per deployment
from ``control_plane.nccl_init_payloads``), but that group is a ``PyNcclCommunicator`` (CUDA only, no gloo) owned by
vLLM's engine, so skyrl-glm's buckets cannot ride it on CPU. This module reuses its rendezvous (the same init
payloads, reached over the servers' ``/collective_rpc``) and builds a stateless ``torch.distributed`` group with
vLLM's ``stateless_init_torch_distributed_process_group``: it stays out of the trainer's and the workers' own
``torch.distributed`` worlds, and the same code runs with either backend.
"""

from __future__ import annotations

import asyncio
import datetime
import socket
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from skyrl_glm.sync.vllm.control import signed

JOIN_METHOD = "skyrl_glm_join_group"
# How long a worker waits for the others and the trainer to join: the trainer joins as soon as it sent the calls,
# so a bound this short only ever cuts a join that cannot complete (a dead or forged rendezvous).
TIMEOUT = datetime.timedelta(seconds=60)


def join(host: str, port: int, rank: int, world_size: int, backend: str) -> dist.ProcessGroup:
    """Join the group at ``host:port`` as ``rank`` (blocks until all ``world_size`` ranks joined)."""
    from vllm.distributed.utils import stateless_init_torch_distributed_process_group

    return stateless_init_torch_distributed_process_group(host, port, rank, world_size, backend, timeout=TIMEOUT)


def worker_rank(parallel_config: Any, rank_offset: int) -> int:
    """A vLLM worker's rank in the group: the rank vLLM's own NCCL weight-transfer engine gives it (unique across
    data-parallel replicas, after ``rank_offset``)."""
    dp_rank = parallel_config.data_parallel_index
    return dp_rank * parallel_config.world_size + parallel_config.rank + rank_offset


def node_address() -> str:
    """This process's node address as Ray knows it (the host part of the URLs SkyRL's servers on this node
    serve); outside Ray (a test), this host."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - outside Ray (a test): this host
        return "127.0.0.1"


NODE_METHOD = "skyrl_glm_node"


async def engine_nodes(client: Any) -> list[tuple[str, str]]:
    """``(server URL, node)`` for every server behind SkyRL's client, the node as its workers report it (several
    joined with ``+`` when an engine's workers span nodes: then no node-local handle reaches all of them)."""

    async def node(url: str) -> tuple[str, str]:
        payload = {"method": NODE_METHOD, "args": list(signed(NODE_METHOD, ()))}
        _, response = await client._call_server(url, "/collective_rpc", payload)
        nodes = sorted({str(n) for n in (response.get("body") or {}).get("results") or []})
        if not nodes:
            raise RuntimeError(f"no vLLM worker of {url} said which node it runs on")
        return url, "+".join(nodes)

    return list(await asyncio.gather(*(node(u) for u in client.server_urls)))


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


async def open_group(client: Any, backend: str, server_urls: Sequence[str]) -> dist.ProcessGroup:
    """On the trainer's sending rank: have every worker of the servers at ``server_urls`` (whole deployments of
    SkyRL's ``RemoteInferenceClient``: the engines the collective transport reaches) join a new group (over
    ``/collective_rpc``) while this rank joins as rank 0, at its node's address."""
    from skyrl.backends.skyrl_train.weight_sync.control_plane import nccl_init_payloads

    _, per_server = await client.get_world_size()
    deployments = max(1, len(server_urls) // max(1, client.data_parallel_size))
    world_size = per_server * deployments + 1
    host = node_address()
    port = _free_port(host)
    init = {"rank_offset": 1, "world_size": world_size}
    payloads = nccl_init_payloads(init, server_urls, client.data_parallel_size)
    joining = asyncio.gather(
        *(
            client._call_server(
                url,
                "/collective_rpc",
                {
                    "method": JOIN_METHOD,
                    "args": list(signed(JOIN_METHOD, (host, port, int(p["rank_offset"]), world_size, backend))),
                },
            )
            for url, p in zip(server_urls, payloads, strict=True)
        )
    )
    group = await asyncio.to_thread(join, host, port, 0, world_size, backend)
    for _, response in await joining:
        ranks = (response.get("body") or {}).get("results") or []  # each worker's rank (the server sends text)
        if not ranks or any(not str(r).isdigit() for r in ranks):
            raise RuntimeError(f"a vLLM worker did not join the skyrl-glm sync group: {ranks!r}")
    return group
