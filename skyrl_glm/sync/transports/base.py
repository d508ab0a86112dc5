"""The transport contract: move one plan's packed byte stream from the sender to a receiver.

The manifest and the handle travel on the control channel as JSON; only raw bytes use the transport.
Sender side: ``prepare`` (stage data, return the handle) -> control message to the receiver -> ``stream``
(push data, for collective transports whose receiver must be waiting) -> ``release`` once the receiver
answered. Receiver side: ``incoming_bytes`` (what the sender staged, learned from the transport itself, before
anything is allocated) -> ``receive`` fills a private ``uint8[total_bytes]`` buffer; or ``decline`` when the
update is rejected first (a collective sender then stops instead of waiting for a peer that never joins).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from skyrl_glm.sync.manifest import Manifest
    from skyrl_glm.sync.plan import SyncPlan


class TransportError(RuntimeError):
    """The data channel failed (peer gone, segment missing, short read): the update is rejected."""


class Transport(ABC):
    name: ClassVar[str]
    needs_group: ClassVar[bool] = False
    """A collective transport: built with ``(group, src)``, a process group spanning the sender and every receiver."""
    needs_cuda: ClassVar[bool] = False
    """It moves CUDA memory: the adapter must be on a GPU."""
    crosses_nodes: ClassVar[bool] = False
    """A receiver on another node can open its handle. False (a shared-memory segment, a CUDA IPC handle, and any
    plugin transport that does not say otherwise): only a receiver on the sender's node is handed one."""
    keeps_staging: ClassVar[bool] = False
    """:meth:`staging` hands out the same memory every update of one size, kept between updates (:meth:`release`
    leaves it): a sender's plan may keep its views of it."""

    def staging(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """A zeroed ``uint8[nbytes]`` buffer the plan packs its stream into (``build_plan(staging=...)``): a transport
        that can send from its own memory (a shared segment, an IPC-shared buffer) returns that, so
        :meth:`prepare` copies nothing."""
        return torch.zeros(nbytes, dtype=torch.uint8, device=device)

    @abstractmethod
    def prepare(self, plan: SyncPlan) -> dict[str, Any]:
        """Stage the plan's bytes (nothing to do when they are already in :meth:`staging` memory); return the
        JSON-able handle the receiver needs."""

    def stream(self, plan: SyncPlan) -> None:
        """Push the bytes while the receiver is inside :meth:`receive` (collective transports only)."""
        return None

    def release(self) -> None:
        """Free what :meth:`prepare` staged, after the receiver answered."""
        return None

    def forget_staging(self) -> None:
        """Let go of the staging memory kept between updates (``keeps_staging``): before the trainer offloads, so
        that the memory goes back with it (the next update takes it anew)."""
        return None

    @abstractmethod
    def incoming_bytes(self, manifest: Manifest, handle: dict[str, Any]) -> int:
        """How many bytes the sender staged for this update, read from the transport (segment size, IPC buffer
        size, a size the sender broadcasts), never from the manifest: the receiver allocates only after checking
        the manifest's ``total_bytes`` against it."""

    def decline(self, handle: dict[str, Any]) -> None:
        """The receiver rejected the update before :meth:`receive`; tell the sender where the transport needs to."""
        return None

    @abstractmethod
    def receive(self, manifest: Manifest, handle: dict[str, Any], out: torch.Tensor) -> None:
        """Fill ``out`` (``uint8[manifest.total_bytes]``, private to the receiver) with the stream."""
