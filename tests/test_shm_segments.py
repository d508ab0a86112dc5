"""Shared memory that fails safe: an update larger than the free space of ``/dev/shm`` is one clear error with
nothing left behind (not a SIGBUS while packing), and segments whose maker is gone are swept at the next start,
never a live process's."""

from __future__ import annotations

import errno
import os
import secrets
import subprocess
import sys

import pytest
import torch

from skyrl_glm.sync.transports import shm
from skyrl_glm.sync.transports.shm import SharedMemoryFull, SharedMemoryTransport


def _mine() -> set[str]:
    prefix = f"skyrl_glm_{shm._owner()}_"
    return {n for n in os.listdir(shm.SHM_DIR) if n.startswith(prefix)}


class Statvfs:
    def __init__(self, free: int) -> None:
        self.f_bavail, self.f_frsize = free // 4096, 4096


def test_an_update_larger_than_the_free_space_is_one_clear_error_and_leaves_nothing(monkeypatch):
    before = _mine()
    monkeypatch.setattr(shm.os, "statvfs", lambda path: Statvfs(64 << 20))  # docker's default --shm-size
    with pytest.raises(SharedMemoryFull) as refused:
        SharedMemoryTransport().staging(465_000_000, torch.device("cpu"))
    message = str(refused.value)
    assert "\n" not in message and "needs 465,000,000 bytes in /dev/shm, 67,108,864 are free" in message
    assert "--shm-size" in message
    assert _mine() == before


def test_space_taken_between_the_check_and_the_reservation_is_the_same_error(monkeypatch):
    before = _mine()

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shm.os, "posix_fallocate", full)
    with pytest.raises(SharedMemoryFull, match="needs 4,096 bytes"):
        SharedMemoryTransport().staging(4096, torch.device("cpu"))
    assert _mine() == before


def test_a_segment_is_allocated_whole_before_packing():
    tx = SharedMemoryTransport()
    buf = tx.staging(1 << 20, torch.device("cpu"))
    try:
        st = os.stat(os.path.join(shm.SHM_DIR, tx._segment[0]))
        assert st.st_blocks * 512 >= 1 << 20 and buf.numel() == 1 << 20
    finally:
        tx.release()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_segments_of_gone_makers_are_swept_and_live_ones_kept():
    namespace, pid, start = shm._owner().split("_")
    dead = _dead_pid()
    names = {
        "a killed sender": f"skyrl_glm_{namespace}_{dead}_{start}_{secrets.token_hex(16)}",
        "a reused pid": f"skyrl_glm_{namespace}_{pid}_{int(start) + 1}_{secrets.token_hex(16)}",
        "this process": shm.segment_name(),
        "another pid namespace": f"skyrl_glm_{int(namespace) + 1}_{dead}_{start}_{secrets.token_hex(16)}",
        "an older release's name": f"skyrl_glm_{secrets.token_hex(16)}",
    }
    for name in names.values():
        with open(os.path.join(shm.SHM_DIR, name), "wb") as f:
            f.write(b"x")
    try:
        removed = shm.sweep_stale()
        gone = {what for what, name in names.items() if not os.path.exists(os.path.join(shm.SHM_DIR, name))}
    finally:
        for name in names.values():
            if os.path.exists(os.path.join(shm.SHM_DIR, name)):
                os.unlink(os.path.join(shm.SHM_DIR, name))
    assert gone == {"a killed sender", "a reused pid"}
    assert {names["a killed sender"], names["a reused pid"]} <= set(removed)


def test_a_killed_senders_segment_is_swept_when_the_next_sender_starts(tmp_path):
    """A sender SIGKILLed after packing leaves its segment; the next process that makes one removes it."""
    pack = (
        "import os, signal, sys, torch\n"
        "from skyrl_glm.sync.transports.shm import SharedMemoryTransport\n"
        "tx = SharedMemoryTransport()\n"
        "tx.staging(4096, torch.device('cpu'))\n"
        "print(tx._segment[0], flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", pack], capture_output=True, text=True, env=env, timeout=120)
    left = os.path.join(shm.SHM_DIR, out.stdout.strip())
    assert out.returncode == -9 and os.path.exists(left), out.stderr[-2000:]
    sweep = (
        "import torch\n"
        "from skyrl_glm.sync.transports.shm import SharedMemoryTransport\n"
        "SharedMemoryTransport().staging(1, torch.device('cpu'))\n"
    )
    try:
        subprocess.run([sys.executable, "-c", sweep], check=True, env=env, timeout=120)
        assert not os.path.exists(left)
    finally:
        if os.path.exists(left):
            os.unlink(left)
