"""Process plumbing for the two-process and multi-rank harnesses: a free port and a JSON control channel."""

from __future__ import annotations

import socket
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a ``TCPStore`` master)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalChannel:
    """The control channel when sender and receiver share one process."""

    def __init__(self) -> None:
        self._d: dict[str, str] = {}

    def put(self, key: str, value: str) -> None:
        self._d[key] = value

    def get(self, key: str) -> str:
        return self._d.pop(key)


class StoreChannel:
    """JSON strings over a ``torch.distributed.TCPStore`` (plain bytes, never pickle)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    PIECE = 4 << 20  # the store refuses values over 8 MiB; a full GLM-5.3 manifest is ~17 MB

    def put(self, key: str, value: str) -> None:
        data = value.encode()
        pieces = [data[i : i + self.PIECE] for i in range(0, len(data), self.PIECE)] or [b""]
        for i, piece in enumerate(pieces):
            self.store.set(f"{key}/{i}", piece)
        self.store.set(f"{key}/n", str(len(pieces)).encode())  # last: a reader waiting on it sees every piece

    def get(self, key: str) -> str:
        n = int(self.store.get(f"{key}/n").decode())
        return b"".join(self.store.get(f"{key}/{i}") for i in range(n)).decode()
