"""CPU transport: one POSIX shared-memory segment holding the packed stream (same host, no GPU).

The receiver opens only segments this transport creates (``skyrl_glm_<32 hex>`` under ``/dev/shm``), as regular
files, without following links and without blocking: a handle naming another file, a FIFO or a device is refused.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets
import stat
import weakref
from typing import TYPE_CHECKING, Any

import torch

from skyrl_glm.sync.transports.base import Transport, TransportError

if TYPE_CHECKING:
    from skyrl_glm.sync.manifest import Manifest
    from skyrl_glm.sync.plan import SyncPlan


SHM_DIR = "/dev/shm"
_SEGMENT = re.compile(r"skyrl_glm_[0-9a-f]{32}")


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(SHM_DIR, name))


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
        self._segment: tuple[str, torch.Tensor] | None = None  # (name, the mapped segment as uint8)

    def staging(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """A fresh segment, mapped: the plan packs straight into it. Owner-only, created exclusively."""
        self.release()
        name = f"skyrl_glm_{secrets.token_hex(16)}"
        flags = os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(os.path.join(SHM_DIR, name), flags, 0o600)
        try:
            os.ftruncate(fd, max(nbytes, 1))
            mapped = mmap.mmap(fd, max(nbytes, 1))
        except BaseException:
            os.unlink(os.path.join(SHM_DIR, name))
            raise
        finally:
            os.close(fd)
        # A plan that is never sent (its publisher raised before send) still leaves no segment behind: the file
        # goes with the last view of the mapping, or at exit, if release() did not unlink it first.
        weakref.finalize(mapped, _unlink, name)
        buf = torch.frombuffer(mapped, dtype=torch.uint8)[:nbytes]
        self._segment = (name, buf)
        return buf

    def prepare(self, plan: SyncPlan) -> dict[str, Any]:
        if self._segment is None or plan.buffer.data_ptr() != self._segment[1].data_ptr():
            try:  # not packed in our segment: copy it into a fresh one
                src = plan.buffer[: plan.manifest.total_bytes]
                self.staging(plan.manifest.total_bytes, torch.device("cpu"))[: src.numel()].copy_(src)
            except BaseException:
                self.release()  # a half-filled segment must not outlive the failed prepare
                raise
        return {"shm_name": self._segment[0]}

    def release(self) -> None:
        """Unlink the segment; its memory goes when the last view of it (the plan's tensors) is gone."""
        if self._segment is not None:
            name, self._segment = self._segment[0], None
            _unlink(name)

    def incoming_bytes(self, manifest: Manifest, handle: dict[str, Any]) -> int:
        fd, size = _open_segment(handle)
        os.close(fd)
        return size

    def receive(self, manifest: Manifest, handle: dict[str, Any], out: torch.Tensor) -> None:
        # Read the segment as a file (no mapping shared with the sender: the receiver's copy is private).
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
