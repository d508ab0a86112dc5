"""Which transport carries the LoRA update to each vLLM engine, chosen from where the engine runs.

The trainer's rank 0 sends every update. An engine on rank 0's node takes it through memory both processes map:
CUDA IPC when trainer and sampler are colocated on GPUs, a shared-memory segment otherwise (CPU mode included).
An engine on another node can open neither (an IPC handle names memory of a GPU it does not see, a segment lives
in another host's ``/dev/shm``), so under ``auto`` it joins the collective transport's group with rank 0 (NCCL;
gloo on CPU). A transport named in ``skyrl_glm.sync.transport`` goes to every engine, and is refused for an engine
on another node when it cannot cross nodes (:attr:`~skyrl_glm.sync.transports.base.Transport.crosses_nodes`).

An engine's node is where its workers say they run (``skyrl_glm_node`` on each worker, the address Ray knows the
node by); an engine whose workers span nodes (a TP x PP group larger than a node) is on none of them alone, so it
is routed as another node's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from skyrl_glm.sync.transports import COLLECTIVE, GPU_LOCAL, HOST_LOCAL

AUTO = "auto"
# Deliberately broken routing (``skyrl_glm.sync.fault``), for the two-node test to show the run fails with each.
ROUTE_FAULTS = {
    "remote-same-host": "an engine on another node is handed the sender's same-host transport",
    "skip-remote": "the update's fan-out skips the engines on other nodes",
}


class RouteError(ValueError):
    """No transport the configuration allows reaches this engine."""


@dataclass(frozen=True)
class Route:
    """One engine's way in: its server, its node, the transport it is handed and who sends over it."""

    engine: str
    node: str
    transport: str
    sender: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def local_transport(configured: str, colocated_gpu: bool) -> str:
    """The transport of an engine on the sender's node."""
    if configured != AUTO:
        return configured
    return GPU_LOCAL if colocated_gpu else HOST_LOCAL


def _crosses_nodes(name: str) -> bool:
    from skyrl_glm.plugins import registry

    return registry().transport(name).crosses_nodes


def engine_transport(
    configured: str,
    colocated_gpu: bool,
    same_node: bool,
    crosses_nodes: Callable[[str], bool] = _crosses_nodes,
) -> str:
    """The transport of one engine; :class:`RouteError` when the configured one cannot reach it."""
    if same_node:
        return local_transport(configured, colocated_gpu)
    if configured == AUTO:
        return COLLECTIVE
    if not crosses_nodes(configured):
        raise RouteError(
            f"skyrl_glm.sync.transport: {configured} hands a handle only a process on the sender's node can open, "
            "and an engine runs on another node; use auto or nccl"
        )
    return configured


def plan_routes(
    configured: str,
    colocated_gpu: bool,
    sender_node: str,
    engines: Sequence[tuple[str, str]],
    fault: str = "none",
    crosses_nodes: Callable[[str], bool] = _crosses_nodes,
) -> list[Route]:
    """A route per ``(engine, node)``, rank 0 on ``sender_node`` sending. ``fault`` (one of :data:`ROUTE_FAULTS`)
    breaks it on purpose: ``remote-same-host`` routes every engine as if it were on the sender's node,
    ``skip-remote`` leaves the engines on other nodes out."""
    sender = f"rank 0 @ {sender_node}"
    routes = []
    for engine, node in engines:
        same = node == sender_node
        if not same and fault == "skip-remote":
            continue
        same = same or fault == "remote-same-host"
        routes.append(Route(engine, node, engine_transport(configured, colocated_gpu, same, crosses_nodes), sender))
    return routes
