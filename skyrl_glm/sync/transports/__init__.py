"""Built-in sync transports, registered through the package's ``skyrl_glm`` entry point.

    base.py          the Transport contract (sender: staging, prepare, stream, release; receiver: incoming_bytes,
                     then receive or decline)
    shm.py           "cpu": shared-memory segments, sender and receiver on one host
    collective.py    "nccl": a torch.distributed broadcast (NCCL between GPUs, gloo on CPU)
    cuda_ipc.py      "ipc": CUDA IPC handles, sender and receiver on one GPU
    fanout.py        the sender's side of one plan sent over several of them at once (never registered)

Registered by reference, so reading the registry imports no transport (nor torch); import a transport's module
where it is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from skyrl_glm.plugins import hookimpl

if TYPE_CHECKING:
    from skyrl_glm.sync.transports.base import Transport

# The built-in transports' names: the one record every route, check and benchmark reads them from.
HOST_LOCAL = "cpu"  # shared memory: sender and receiver on one host
COLLECTIVE = "nccl"  # a collective broadcast: across GPUs and nodes
GPU_LOCAL = "ipc"  # CUDA IPC: sender and receiver on one GPU

_BUILTIN = {
    HOST_LOCAL: "skyrl_glm.sync.transports.shm:SharedMemoryTransport",
    COLLECTIVE: "skyrl_glm.sync.transports.collective:CollectiveTransport",
    GPU_LOCAL: "skyrl_glm.sync.transports.cuda_ipc:CudaIpcTransport",
}


@hookimpl
def skyrl_glm_transports() -> list[tuple[str, str]]:
    return list(_BUILTIN.items())


def needs_group(name: str) -> bool:
    """Whether the registered transport ``name`` moves the update over a process group (a collective)."""
    from skyrl_glm.plugins import registry

    return registry().transport(name).needs_group


def open_transport(name: str, group: Any = None, src: int = 0) -> Transport:
    """One end of the registered transport ``name``: over ``group`` (the sender at ``src``) where the transport
    declares it needs one and a group is given, else the transport's own default."""
    from skyrl_glm.plugins import registry

    cls = registry().transport(name)
    return cls(group=group, src=src) if cls.needs_group and group is not None else cls()
