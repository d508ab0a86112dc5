"""CUDA IPC transport for colocated trainer and sampler: the receiver maps the sender's packed GPU buffer.

The IPC handle crosses the control channel as JSON (bytes base64-encoded), never as a pickle.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import torch

from skyrl_glm.sync.transports import GPU_LOCAL
from skyrl_glm.sync.transports.base import Transport, TransportError

if TYPE_CHECKING:
    from skyrl_glm.sync.manifest import Manifest
    from skyrl_glm.sync.plan import SyncPlan


def _enc(v: Any) -> Any:
    return {"b64": base64.b64encode(v).decode()} if isinstance(v, bytes) else v


def _dec(v: Any) -> Any:
    return base64.b64decode(v["b64"], validate=True) if isinstance(v, dict) else v


class CudaIpcTransport(Transport):
    """The sender's buffer is kept from one update to the next of the same size (zeroed again each time, a memset),
    so the plan packs into memory it already has views of (``keeps_staging``); it goes with the transport, at
    :meth:`forget_staging` (a trainer's offload), or when an update of another size or device replaces it. A receiver
    maps it per update and unmaps it after."""

    name = GPU_LOCAL
    needs_cuda = True
    keeps_staging = True

    def __init__(self) -> None:
        self._buffer: torch.Tensor | None = None
        self._mapped: tuple[int, torch.UntypedStorage] | None = None  # receiver: the handle incoming_bytes opened

    def staging(self, nbytes: int, device: torch.device) -> torch.Tensor:
        if device.type != "cuda":
            raise TransportError("the CUDA IPC transport needs the adapter on a CUDA device")
        buf = self._buffer
        if buf is not None and buf.numel() == max(nbytes, 1) and buf.device == device:
            buf.zero_()
        else:
            self._buffer = None  # the old one freed before the new one is taken
            buf = self._buffer = torch.zeros(max(nbytes, 1), dtype=torch.uint8, device=device)
        return buf[:nbytes]

    def prepare(self, plan: SyncPlan) -> dict[str, Any]:
        buf = self._buffer
        if buf is None or plan.buffer.data_ptr() != buf.data_ptr():  # not packed in our memory: copy it there
            src = plan.buffer[: plan.manifest.total_bytes]
            buf = self.staging(plan.manifest.total_bytes, src.device)
            buf[: src.numel()].copy_(src)
        torch.cuda.current_stream(buf.device).synchronize()
        shared = buf.untyped_storage()._share_cuda_()
        return {"storage": [_enc(v) for v in shared], "nbytes": buf.untyped_storage().nbytes()}

    def release(self) -> None:
        """Nothing to free per update: the buffer stays for the next (see the class)."""

    def forget_staging(self) -> None:
        self._buffer = None

    @staticmethod
    def _open(handle: dict[str, Any]) -> torch.UntypedStorage:
        """Map the sender's buffer (no allocation: the IPC mapping of memory the sender already holds)."""
        try:
            args = [_dec(v) for v in handle["storage"]]
            return torch.UntypedStorage._new_shared_cuda(*args)
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise TransportError(f"cannot open the sender's CUDA IPC buffer: {e}") from None

    def incoming_bytes(self, manifest: Manifest, handle: dict[str, Any]) -> int:
        storage = self._open(handle)
        self._mapped = (id(handle), storage)  # mapped once per update: receive reads it
        return storage.nbytes()

    def decline(self, handle: dict[str, Any]) -> None:
        self._mapped = None

    def receive(self, manifest: Manifest, handle: dict[str, Any], out: torch.Tensor) -> None:
        mapped, self._mapped = self._mapped, None
        if manifest.total_bytes == 0:
            return
        storage = mapped[1] if mapped is not None and mapped[0] == id(handle) else self._open(handle)
        if storage.nbytes() < manifest.total_bytes:
            raise TransportError(f"IPC buffer holds {storage.nbytes()} bytes, manifest needs {manifest.total_bytes}")
        src = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (manifest.total_bytes,))
        out.copy_(src)
        torch.cuda.current_stream(out.device).synchronize()
        del src, storage
