"""Routed collective transport: executes a :class:`~skyrl_glm.experimental.routing.plan.RoutingPlan` with one
broadcast per (route, bucket) from the route's sender to its receiver group.

Every rank (senders and receivers) creates one process group per route, in the plan's global route order, and
runs its own routes in that order, so overlapping groups never wait on each other in a cycle. The receiver side
is a :class:`Transport` (``receive`` fills the receiver's private staging buffer route by route), so the unchanged
:class:`~skyrl_glm.sync.receiver.AdapterReceiver` verifies and rebuilds. Every broadcast is counted (per route:
broadcasts, bytes, pieces) on both sides, so tests can prove what crossed the wire.
NCCL between GPUs, gloo on CPU (the same code). Not registered as a named transport: it needs the plan's groups.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from skyrl_glm.sync.checksum import checksums
from skyrl_glm.sync.plan import SyncPlan, pack_into
from skyrl_glm.sync.transports.base import Transport, TransportError

if TYPE_CHECKING:
    from skyrl_glm.experimental.routing.plan import Route, RoutingPlan
    from skyrl_glm.sync.manifest import Manifest

GroupKey = tuple[int, tuple[int, ...]]


def route_label(key: GroupKey) -> str:
    return f"s{key[0]}->r{','.join(map(str, key[1]))}"


def make_groups(
    plan: RoutingPlan, sender_rank: Callable[[int], int], receiver_rank: Callable[[int], int]
) -> dict[GroupKey, Any]:
    """One process group per route, created in plan order; every rank of the world must call this (a rank outside
    a group gets a non-member handle it never uses)."""
    groups = {}
    for key in plan.group_keys():
        ranks = sorted([sender_rank(key[0])] + [receiver_rank(r) for r in key[1]])
        groups[key] = dist.new_group(ranks)
    return groups


def route_tensors(route: Route, sender_plan: SyncPlan) -> list[torch.Tensor]:
    """The pieces of ``route`` cut (contiguous) from the sender's unique, alpha-folded tensors."""
    by_name = {e.name: t for e, t in zip(sender_plan.manifest.tensors, sender_plan.tensors, strict=True)}
    out = []
    for p in route.pieces:
        t = by_name[p.sent]
        if p.slice is not None:
            t = t.narrow(p.slice.dim, p.slice.start, p.slice.stop - p.slice.start)
        out.append(t.contiguous())
    return out


def piece_checksums(plan: RoutingPlan, sender: int, sender_plan: SyncPlan) -> tuple[dict[str, str], dict]:
    """``({piece key: checksum}, {route key: piece tensors})`` for every piece this sender sends."""
    sums: dict[str, str] = {}
    tensors: dict[GroupKey, list[torch.Tensor]] = {}
    for route in plan.routes_from(sender):
        ts = tensors[route.key] = route_tensors(route, sender_plan)
        for p, cs in zip(route.pieces, checksums(ts), strict=True):
            sums[p.key] = cs
    return sums, tensors


class RoutedTransport(Transport):
    name = "routed"

    def __init__(self, groups: Mapping[GroupKey, Any], sender_rank: Callable[[int], int]) -> None:
        self.groups = groups
        self.sender_rank = sender_rank
        self.stats: dict[str, dict[str, Any]] = {}

    def _count(self, key: GroupKey, nbytes: int, pieces: int = 0) -> None:
        cell = self.stats.setdefault(route_label(key), {"broadcasts": 0, "bytes": 0, "pieces": 0})
        cell["broadcasts"] += 1
        cell["bytes"] += nbytes
        cell["pieces"] += pieces

    def prepare(self, plan: SyncPlan) -> dict[str, Any]:
        raise TypeError("a routed update is many routes: use send_route() per route of the RoutingPlan")

    def send_route(self, route: Route, tensors: list[torch.Tensor]) -> None:
        """Sender side: pack the route's pieces and broadcast its buckets to its group."""
        device = tensors[0].device if tensors else torch.device("cpu")
        buffer = torch.zeros(route.manifest.total_bytes, dtype=torch.uint8, device=device)
        pack_into(buffer, route.manifest.tensors, tensors)
        src, group = self.sender_rank(route.src), self.groups[route.key]
        for i, (start, end) in enumerate(route.manifest.buckets()):
            dist.broadcast(buffer[start:end], src=src, group=group)
            self._count(route.key, end - start, len(route.pieces) if i == 0 else 0)

    def incoming_bytes(self, manifest: Manifest, handle: dict[str, Any]) -> int:
        """The end of the last route the handle lists, for routes of this plan's groups only (the routing plan,
        which every rank computes itself, fixed those routes and sizes)."""
        try:
            end = 0
            for r in handle["routes"]:
                key = (int(r["src"]), tuple(int(x) for x in r["receivers"]))
                if key not in self.groups:
                    raise TransportError(f"handle names route {route_label(key)}, which the plan does not have")
                end = max(end, int(r["base"]) + int(r["nbytes"]))
            return end
        except (KeyError, TypeError, ValueError) as e:
            raise TransportError(f"malformed routing handle: {type(e).__name__}: {e}") from None

    def receive(self, manifest: Manifest, handle: dict[str, Any], out: torch.Tensor) -> None:
        """Receiver side: each route of the handle, in order, broadcast straight into ``out[base + start: ...]``."""
        try:
            for r in handle["routes"]:
                key = (int(r["src"]), tuple(int(x) for x in r["receivers"]))
                group, base = self.groups[key], int(r["base"])
                if base < 0 or base + int(r["nbytes"]) > out.numel():
                    raise TransportError(f"route {route_label(key)} [{base}, +{r['nbytes']}) outside the stream")
                for start, end in r["buckets"]:
                    if not 0 <= start < end <= int(r["nbytes"]):
                        raise TransportError(f"route {route_label(key)}: bad bucket [{start}, {end})")
                    dist.broadcast(out[base + start : base + end], src=self.sender_rank(key[0]), group=group)
                    self._count(key, end - start)
            if out.is_cuda:
                torch.cuda.current_stream(out.device).synchronize()
        except KeyError as e:
            raise TransportError(f"routing handle names an unknown route or field: {e}") from None
        except RuntimeError as e:  # DistBackendError included
            raise TransportError(f"routed broadcast failed: {e}") from e
