"""Collective transport: ``torch.distributed`` broadcast of packed buckets from the sender rank.

NCCL between separate GPUs (the production path); the same code runs over gloo on CPU. The receiver
broadcasts straight into slices of its private staging buffer, so nothing is copied after arrival.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from skyrl_glm.sync.transports.base import Transport, TransportError

if TYPE_CHECKING:
    from skyrl_glm.sync.manifest import Manifest
    from skyrl_glm.sync.plan import SyncPlan


class CollectiveTransport(Transport):
    name = "nccl"

    def __init__(self, group: dist.ProcessGroup | None = None, src: int = 0) -> None:
        self.group = group
        self.src = src

    def prepare(self, plan: SyncPlan) -> dict[str, Any]:
        return {"src": self.src, "buckets": len(plan.manifest.buckets())}

    def stream(self, plan: SyncPlan) -> None:
        for _, bucket in plan.buckets():
            dist.broadcast(bucket, src=self.src, group=self.group)

    def receive(self, manifest: Manifest, handle: dict[str, Any], out: torch.Tensor) -> None:
        ranges = manifest.buckets()
        if handle.get("buckets") != len(ranges):
            raise TransportError(f"sender announces {handle.get('buckets')} buckets, manifest lays out {len(ranges)}")
        try:
            for start, end in ranges:
                dist.broadcast(out[start:end], src=int(handle["src"]), group=self.group)
            if out.is_cuda:  # NCCL runs on its own stream: the stream is in ``out`` only once this returns
                torch.cuda.current_stream(out.device).synchronize()
        except (RuntimeError, dist.DistBackendError) as e:
            raise TransportError(f"broadcast from rank {handle['src']} failed: {e}") from e
