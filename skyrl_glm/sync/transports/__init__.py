"""Built-in sync transports, registered through the package's ``skyrl_glm`` entry point."""

from __future__ import annotations

from skyrl_glm.plugins import hookimpl
from skyrl_glm.sync.transports.base import Transport, TransportError
from skyrl_glm.sync.transports.collective import CollectiveTransport
from skyrl_glm.sync.transports.cuda_ipc import CudaIpcTransport
from skyrl_glm.sync.transports.shm import SharedMemoryTransport

__all__ = ["CollectiveTransport", "CudaIpcTransport", "SharedMemoryTransport", "Transport", "TransportError"]


@hookimpl
def skyrl_glm_transports() -> list[tuple[str, type[Transport]]]:
    return [(t.name, t) for t in (SharedMemoryTransport, CollectiveTransport, CudaIpcTransport)]
