"""One plan sent over several transports at once, each receiver handed the handle of its own transport.

The sender's side only (never registered, never named to a receiver): a run whose engines sit on different nodes
sends one update through shared memory or CUDA IPC to the engines on the sender's node and through the collective
transport to the others. The plan is packed once, into the memory of the first transport (the node-local one,
which sends from its own staging; the collective transport broadcasts slices of whatever buffer the plan has).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from skyrl_glm.sync.transports.base import Transport

if TYPE_CHECKING:
    from skyrl_glm.sync.manifest import Manifest
    from skyrl_glm.sync.plan import SyncPlan

HANDLES = "by_transport"


class FanOut(Transport):
    """``prepare`` returns ``{"by_transport": {name: handle}}``; ``stream``, ``release`` and ``forget_staging`` go to
    every part."""

    name = "fanout"

    def __init__(self, parts: Sequence[Transport]) -> None:
        """``parts``: distinct transports, the one whose staging memory the plan packs into first."""
        names = [p.name for p in parts]
        if not parts or len(set(names)) != len(names):
            raise ValueError(f"a fan-out needs distinct transports, got {names}")
        self.parts = list(parts)

    @property
    def needs_group(self) -> bool:  # type: ignore[override]  # a collective part streams over its group
        return any(p.needs_group for p in self.parts)

    @property
    def keeps_staging(self) -> bool:  # type: ignore[override]  # the first part's: it gives the staging memory
        return self.parts[0].keeps_staging

    def staging(self, nbytes: int, device: torch.device) -> torch.Tensor:
        return self.parts[0].staging(nbytes, device)

    def prepare(self, plan: SyncPlan) -> dict[str, Any]:
        return {HANDLES: {p.name: p.prepare(plan) for p in self.parts}}

    def stream(self, plan: SyncPlan) -> None:
        for p in self.parts:
            p.stream(plan)

    def release(self) -> None:
        for p in self.parts:
            p.release()

    def forget_staging(self) -> None:
        for p in self.parts:
            p.forget_staging()

    def incoming_bytes(self, manifest: Manifest, handle: dict[str, Any]) -> int:
        raise TypeError("a fan-out only sends: each receiver is handed its own transport's handle")

    def receive(self, manifest: Manifest, handle: dict[str, Any], out: torch.Tensor) -> None:
        raise TypeError("a fan-out only sends: each receiver is handed its own transport's handle")
