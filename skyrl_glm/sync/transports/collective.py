"""Collective transport: ``torch.distributed`` broadcast of packed buckets from the sender rank.

NCCL between separate GPUs (the production path); the same code runs over gloo on CPU. The receiver
broadcasts straight into slices of its private staging buffer, so nothing is copied after arrival.
The group's own ``broadcast`` / ``allreduce`` are called (ranks are the group's), so a stateless group that is
not in ``torch.distributed``'s world map works too: the group SkyRL's vLLM workers and the trainer's sending rank
join (:mod:`skyrl_glm.skyrl.workers.sync_group`) is one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from skyrl_glm.sync.transports import COLLECTIVE
from skyrl_glm.sync.transports.base import Transport, TransportError

if TYPE_CHECKING:
    from skyrl_glm.sync.manifest import Manifest
    from skyrl_glm.sync.plan import SyncPlan


class CollectiveTransport(Transport):
    """Per update: the sender broadcasts a header ``[total_bytes, buckets]``; every rank then agrees (an all-reduce
    MIN of accept flags) whether to go on, so a receiver that rejects the update releases the sender; then one
    broadcast per bucket. The receiver learns the stream's size from the header, not from the manifest."""

    name = COLLECTIVE
    needs_group = True
    crosses_nodes = True

    def __init__(self, group: dist.ProcessGroup | None = None, src: int = 0) -> None:
        """``group``: default ``torch.distributed``'s world group; ``src``: the sender's rank in ``group``."""
        self.group = group
        self.src = src
        self._header: list[int] | None = None  # receiver: the sender's header of the update in progress

    @property
    def _group(self) -> dist.ProcessGroup:
        return self.group if self.group is not None else dist.group.WORLD

    def _device(self, like: torch.Tensor | None = None) -> torch.device:
        if like is not None:
            return like.device
        if self._group.name() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = self.src
        self._group.broadcast([tensor], opts).wait()

    def _agree(self, accept: bool, device: torch.device) -> bool:
        flag = torch.tensor([int(accept)], dtype=torch.int64, device=device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        self._group.allreduce([flag], opts).wait()
        return bool(flag.item())

    def prepare(self, plan: SyncPlan) -> dict[str, Any]:
        return {"src": self.src, "buckets": len(plan.manifest.buckets())}

    def stream(self, plan: SyncPlan) -> None:
        device = self._device(plan.tensors[0] if plan.tensors else None)
        header = [plan.manifest.total_bytes, len(plan.manifest.buckets())]
        self._broadcast(torch.tensor(header, dtype=torch.int64, device=device))
        if not self._agree(True, device):
            return  # a receiver rejected the update: nothing more is sent
        for _, bucket in plan.buckets():
            self._broadcast(bucket)

    def incoming_bytes(self, manifest: Manifest, handle: dict[str, Any]) -> int:
        header = torch.empty(2, dtype=torch.int64, device=self._device())
        try:
            self._broadcast(header)
        except RuntimeError as e:  # DistBackendError included
            raise TransportError(f"no header from rank {self.src}: {e}") from e
        self._header = header.tolist()
        return self._header[0]

    def decline(self, handle: dict[str, Any]) -> None:
        try:
            if self._header is None:
                self.incoming_bytes(None, handle)  # type: ignore[arg-type]  # consume the sender's header
            self._agree(False, self._device())
        except RuntimeError:  # TransportError and DistBackendError included: the sender is gone, nobody is waiting
            pass
        self._header = None

    def receive(self, manifest: Manifest, handle: dict[str, Any], out: torch.Tensor) -> None:
        header, self._header = self._header, None
        if header is None:
            raise TransportError("receive() before incoming_bytes(): the sender's header was not read")
        ranges = manifest.buckets()
        if header != [manifest.total_bytes, len(ranges)]:
            self._agree(False, out.device)
            raise TransportError(
                f"sender streams {header[0]} bytes in {header[1]} buckets, manifest lays out "
                f"{manifest.total_bytes} in {len(ranges)}"
            )
        try:
            if not self._agree(True, out.device):
                raise TransportError("another rank of the group rejected the update")
            for start, end in ranges:
                self._broadcast(out[start:end])
            if out.is_cuda:  # NCCL runs on its own stream: the stream is in ``out`` only once this returns
                torch.cuda.current_stream(out.device).synchronize()
        except RuntimeError as e:  # DistBackendError included
            raise TransportError(f"broadcast from rank {self.src} failed: {e}") from e
