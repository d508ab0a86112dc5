"""Python's cyclic garbage collector paused around one sync step.

Planning and receiving a full GLM-5.3 update create ~10^5 short-lived objects (names, dict entries, views). Each
collection the allocations trigger walks every tracked object of the process (a trainer or a vLLM worker holds
millions), which made sync times vary by tens of milliseconds per step. Nothing a step creates forms reference
cycles that must be freed before it ends; the collector runs again as usual afterwards.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
