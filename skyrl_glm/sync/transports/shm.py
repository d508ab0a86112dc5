"""CPU transport: one POSIX shared-memory segment holding the packed stream (same host, no GPU).

The receiver opens only segments this transport creates (``skyrl_glm_<32 hex>`` under ``/dev/shm``), as regular
files, without following links and without blocking: a handle naming another file, a FIFO or a device is refused.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from multiprocessing import shared_memory
from typing import TYPE_CHECKING, Any

import torch

from skyrl_glm.sync.transports.base import Transport, TransportError

if TYPE_CHECKING:
    from skyrl_glm.sync.manifest import Manifest
    from skyrl_glm.sync.plan import SyncPlan


SHM_DIR = "/dev/shm"
_SEGMENT = re.compile(r"skyrl_glm_[0-9a-f]{32}")


def _open_segment(handle: dict[str, Any]) -> tuple[int, int]:
    """``(fd, size)`` of the handle's segment, or :class:`TransportError`."""
    name = handle.get("shm_name") if isinstance(handle, dict) else None
    if not isinstance(name, str) or not _SEGMENT.fullmatch(name):
        raise TransportError(f"handle names no segment of this transport: {name!r:.80}")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(os.path.join(SHM_DIR, name), flags)
    except OSError as e:
        raise TransportError(f"shared-memory segment {name!r} unreadable (sender gone?): {e}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise TransportError(f"{name!r} is not a shared-memory segment")
    return fd, st.st_size


class SharedMemoryTransport(Transport):
    name = "cpu"

    def __init__(self) -> None:
        self._segment: shared_memory.SharedMemory | None = None

    def prepare(self, plan: SyncPlan) -> dict[str, Any]:
        self.release()
        name = f"skyrl_glm_{secrets.token_hex(16)}"
        self._segment = seg = shared_memory.SharedMemory(name=name, create=True, size=max(plan.manifest.total_bytes, 1))
        try:
            if plan.tensors:
                dst = torch.frombuffer(seg.buf, dtype=torch.uint8, count=plan.manifest.total_bytes)
                for start, bucket in plan.buckets():
                    dst[start : start + bucket.numel()].copy_(bucket.cpu())
                del dst  # drop the buffer export before anyone closes the segment
        except BaseException:
            self.release()  # a half-filled segment must not outlive the failed prepare
            raise
        return {"shm_name": name}

    def release(self) -> None:
        if self._segment is not None:
            seg, self._segment = self._segment, None
            seg.close()
            seg.unlink()

    def incoming_bytes(self, manifest: Manifest, handle: dict[str, Any]) -> int:
        fd, size = _open_segment(handle)
        os.close(fd)
        return size

    def receive(self, manifest: Manifest, handle: dict[str, Any], out: torch.Tensor) -> None:
        # Read the segment as a file: attaching a SharedMemory object would register it with this process's
        # resource tracker, which then fights the sender (its owner) over unlinking it.
        fd, size = _open_segment(handle)
        try:
            if size < manifest.total_bytes:
                raise TransportError(f"segment holds {size} bytes, manifest needs {manifest.total_bytes}")
            # A CUDA staging buffer is filled through a pinned host bounce buffer.
            host = out if out.device.type == "cpu" else torch.empty_like(out, device="cpu", pin_memory=True)
            # One read(2) returns at most ~2 GiB on Linux: loop until the whole stream is in.
            view, got = memoryview(host.numpy()), 0
            while got < manifest.total_bytes:
                n = os.readv(fd, [view[got : manifest.total_bytes]])
                if not n:
                    break
                got += n
        except OSError as e:
            raise TransportError(f"shared-memory segment {handle['shm_name']!r} unreadable: {e}") from None
        finally:
            os.close(fd)
        if got != manifest.total_bytes:
            raise TransportError(f"short read: {got} of {manifest.total_bytes} bytes")
        if host is not out:
            out.copy_(host)
            torch.cuda.current_stream(out.device).synchronize()
