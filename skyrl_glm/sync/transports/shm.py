"""CPU transport: one POSIX shared-memory segment holding the packed stream (same host, no GPU).

A segment is named for the process that made it (``skyrl_glm_<pid namespace>_<pid>_<start time>_<32 hex>`` under
``/dev/shm``): its space is reserved whole before anything is packed (a clear error naming the bytes and the container
setting when ``/dev/shm`` is too small, never a SIGBUS while packing), and the first segment a process makes sweeps
this user's segments whose maker is gone (a sender killed after packing), never a live process's.

The receiver opens only segments of this transport's names, as regular files, without following links and without
blocking: a handle naming another file, a FIFO or a device is refused. The name is not trusted: before any byte is
read, the open segment must be owned by this user (who runs both the trainer and the sampler), writable by nobody
else, have one link, the manifest's size, and that many bytes allocated (a sparse segment costs its maker nothing
but would cost the receiver its full size to read).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import mmap
import os
import re
import secrets
import stat
import weakref
from typing import TYPE_CHECKING, Any

import torch

from skyrl_glm.sync.transports import HOST_LOCAL
from skyrl_glm.sync.transports.base import Transport, TransportError

if TYPE_CHECKING:
    from skyrl_glm.sync.manifest import Manifest
    from skyrl_glm.sync.plan import SyncPlan


log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
_SEGMENT = re.compile(r"skyrl_glm_([0-9]{1,20})_([1-9][0-9]{0,9})_([0-9]{1,20})_[0-9a-f]{32}")


class SharedMemoryFull(TransportError):
    """``/dev/shm`` cannot hold the update; nothing was left behind."""

    def __init__(self, needed: int, free: int) -> None:
        super().__init__(
            f"shared memory too small: the update needs {needed:,} bytes in {SHM_DIR}, {free:,} are free; give the "
            "container more (docker run --shm-size, or an emptyDir of medium Memory at /dev/shm on Kubernetes) or "
            "sync through another transport"
        )


def _start_time(pid: int | str) -> int | None:
    """The process's start time in clock ticks since boot (None when there is no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _owner() -> str:
    """This process as a segment's maker: pid namespace, pid, start time (a reused pid has another start time); read
    each time, so a forked child names its own segments."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"{namespace}_{os.getpid()}_{_start_time('self') or 0}"


def segment_name() -> str:
    """A fresh segment name of this process."""
    return f"skyrl_glm_{_owner()}_{secrets.token_hex(16)}"


def _maker_gone(name: str) -> bool:
    """Whether the segment ``name`` was made by a process of this pid namespace that no longer runs."""
    found = _SEGMENT.fullmatch(name)
    if found is None:
        return False
    namespace, pid, start = found.groups()
    if namespace == "0" or namespace != _owner().split("_")[0]:
        return False  # made where this process cannot see whether its maker runs
    return _start_time(pid) != int(start)


def sweep_stale() -> list[str]:
    """Unlink this user's segments whose maker is gone; returns their names."""
    removed = []
    for name in os.listdir(SHM_DIR):
        if not _maker_gone(name):
            continue
        with contextlib.suppress(OSError):
            if os.stat(os.path.join(SHM_DIR, name), follow_symlinks=False).st_uid == os.geteuid():
                os.unlink(os.path.join(SHM_DIR, name))
                removed.append(name)
                log.info("removed the shared-memory segment %s of a sender that is gone", name)
    return removed


@functools.cache
def _swept_once() -> None:
    """:func:`sweep_stale` at the first segment this process makes."""
    sweep_stale()


def _reserve(fd: int, nbytes: int) -> None:
    """Allocate the segment's pages now, or :class:`SharedMemoryFull` (a page touched past the free space of a tmpfs
    would kill the packing process with SIGBUS)."""
    st = os.statvfs(SHM_DIR)
    free = st.f_bavail * st.f_frsize
    if nbytes > free:
        raise SharedMemoryFull(nbytes, free)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        raise SharedMemoryFull(nbytes, free) from None


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(SHM_DIR, name))


PAGE = mmap.PAGESIZE


def _open_segment(handle: dict[str, Any], manifest: Manifest) -> int:
    """An open fd of the handle's segment once it passed every check against ``manifest``, or
    :class:`TransportError`."""
    name = handle.get("shm_name") if isinstance(handle, dict) else None
    if not isinstance(name, str) or not _SEGMENT.fullmatch(name):
        raise TransportError(f"handle names no segment of this transport: {name!r:.80}")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(os.path.join(SHM_DIR, name), flags)
    except OSError as e:
        raise TransportError(f"shared-memory segment {name!r} unreadable (sender gone?): {e}") from None
    problem = _segment_problem(os.fstat(fd), manifest.total_bytes)
    if problem:
        os.close(fd)
        raise TransportError(f"shared-memory segment {name!r} refused: {problem}")
    return fd


def _segment_problem(st: os.stat_result, total_bytes: int) -> str | None:
    """Why a segment is not one this user's sender staged for a stream of ``total_bytes`` (None if it is)."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user ({os.geteuid()})"
    if st.st_mode & 0o022:
        return f"writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    if st.st_nlink != 1:
        return f"{st.st_nlink} links (a segment has one)"
    if st.st_size != max(total_bytes, 1):
        return f"holds {st.st_size} bytes, the manifest describes {total_bytes}"
    allocated = st.st_blocks * 512
    if allocated < total_bytes // PAGE * PAGE:  # the sender wrote every page it packed
        return f"only {allocated} of its {st.st_size} bytes are allocated (sparse)"
    return None


class SharedMemoryTransport(Transport):
    name = HOST_LOCAL

    def __init__(self) -> None:
        self._segment: tuple[str, torch.Tensor] | None = None  # (name, the mapped segment as uint8)

    def staging(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """A fresh segment, mapped: the plan packs straight into it. Owner-only, created exclusively."""
        self.release()
        _swept_once()
        name = segment_name()
        flags = os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(os.path.join(SHM_DIR, name), flags, 0o600)
        try:
            _reserve(fd, max(nbytes, 1))
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
        os.close(_open_segment(handle, manifest))
        return manifest.total_bytes

    def receive(self, manifest: Manifest, handle: dict[str, Any], out: torch.Tensor) -> None:
        # Read the segment as a file (no mapping shared with the sender: the receiver's copy is private).
        fd = _open_segment(handle, manifest)
        try:
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
