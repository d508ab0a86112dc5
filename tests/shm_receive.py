"""Test helper: one update received over shared memory, the way a worker receives it (stage, receive, release)."""

from __future__ import annotations

from typing import Any

from skyrl_glm.sync.plan import SyncPlan
from skyrl_glm.sync.receiver import AdapterReceiver, ReceivedAdapter
from skyrl_glm.sync.transports.shm import SharedMemoryTransport


def receive_over_shm(
    plan: SyncPlan,
    manifest_json: str | None = None,
    *,
    handle: dict[str, Any] | None = None,
    receiver: AdapterReceiver | None = None,
    tx: SharedMemoryTransport | None = None,
) -> ReceivedAdapter:
    """Stage ``plan`` on shared memory, then receive ``manifest_json`` (default: the plan's own) with ``handle``
    (default: the staged one), so a test can hand the receiver a tampered manifest or handle over real bytes."""
    tx = tx or SharedMemoryTransport()
    staged = tx.prepare(plan)
    try:
        text = plan.manifest.to_json() if manifest_json is None else manifest_json
        return (receiver or AdapterReceiver()).receive(text, staged if handle is None else handle, tx)
    finally:
        tx.release()
