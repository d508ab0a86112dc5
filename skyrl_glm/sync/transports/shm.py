"""CPU transport: one POSIX shared-memory segment holding the packed stream (same host, no GPU)."""

from __future__ import annotations

import os
from multiprocessing import shared_memory
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from skyrl_glm.sync.transports.base import Transport, TransportError

if TYPE_CHECKING:
    from skyrl_glm.sync.manifest import Manifest
    from skyrl_glm.sync.plan import SyncPlan


SHM_DIR = "/dev/shm"


class SharedMemoryTransport(Transport):
    name = "cpu"

    def __init__(self) -> None:
        self._segment: shared_memory.SharedMemory | None = None

    def prepare(self, plan: SyncPlan) -> dict[str, Any]:
        self.release()
        seg = shared_memory.SharedMemory(create=True, size=max(plan.manifest.total_bytes, 1))
        self._segment = seg
        dst = torch.frombuffer(seg.buf, dtype=torch.uint8, count=plan.manifest.total_bytes) if plan.tensors else None
        for start, bucket in plan.buckets():
            dst[start : start + bucket.numel()].copy_(bucket.cpu())
        del dst  # drop the buffer export before anyone closes the segment
        return {"shm_name": seg.name}

    def release(self) -> None:
        if self._segment is not None:
            self._segment.close()
            self._segment.unlink()
            self._segment = None

    def receive(self, manifest: Manifest, handle: dict[str, Any], out: torch.Tensor) -> None:
        # Read the segment as a file: attaching a SharedMemory object would register it with this process's
        # resource tracker, which then fights the sender (its owner) over unlinking it.
        path = Path(SHM_DIR) / str(handle.get("shm_name", "")).lstrip("/")
        # A CUDA staging buffer is filled through a pinned host bounce buffer.
        host = out if out.device.type == "cpu" else torch.empty_like(out, device="cpu", pin_memory=True)
        try:
            with open(path, "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                if size < manifest.total_bytes:
                    raise TransportError(f"segment holds {size} bytes, manifest needs {manifest.total_bytes}")
                # One read(2) returns at most ~2 GiB on Linux: loop until the whole stream is in.
                view, got = memoryview(host.numpy()), 0
                while got < manifest.total_bytes:
                    n = f.readinto(view[got : manifest.total_bytes])
                    if not n:
                        break
                    got += n
        except OSError as e:
            raise TransportError(f"shared-memory segment {path.name!r} unreadable (sender gone?): {e}") from None
        if got != manifest.total_bytes:
            raise TransportError(f"short read: {got} of {manifest.total_bytes} bytes")
        if host is not out:
            out.copy_(host)
            torch.cuda.current_stream(out.device).synchronize()
