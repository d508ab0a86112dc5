"""The environment variables a sampler engine reads on GPU, and their parsers: imports nothing, so a script reads
them as the engine does (``scripts/gpu-verify``) and a command refuses a bad value before anything starts."""

from __future__ import annotations

import os
from typing import Any

GPU_SHARE_ENV = "SKYRL_GLM_GPU_MEMORY_UTILIZATION"
"""The share of GPU memory a sampler engine takes (vLLM's default 0.9 leaves room for one engine per GPU): set
it to run several checks side by side on one GPU."""


def _env_number(env: str, value: str, high: float, what: str) -> float:
    """``value`` of environment variable ``env`` as a number in (0, high], else one ``ValueError`` naming both."""
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not 0.0 < number <= high:
        raise ValueError(f"{env}={value!r}: {what} in (0, {high:g}]")
    return number


def gpu_share(value: str) -> float:
    return _env_number(GPU_SHARE_ENV, value, 1.0, "a share of GPU memory")


KV_CACHE_ENV = "SKYRL_GLM_KV_CACHE_GIB"
"""A fixed KV cache per sampler engine, in GiB, on GPU: vLLM then skips its memory profiling, which counts what
other processes allocate or free meanwhile as its own (engines started side by side on one GPU, or beside SkyRL's
colocated loop that sleeps and wakes its engine, failed it on one H200)."""


def kv_cache_bytes(value: str) -> int:
    return int(_env_number(KV_CACHE_ENV, value, 1024.0, "a KV cache size in GiB,") * 2**30)


def gpu_environment_settings() -> dict[str, Any]:
    """The engine arguments this process's environment sets on GPU (:data:`GPU_SHARE_ENV`, :data:`KV_CACHE_ENV`);
    a bad value is one ``ValueError`` naming the variable."""
    settings: dict[str, Any] = {}
    if share := os.environ.get(GPU_SHARE_ENV):
        settings["gpu_memory_utilization"] = gpu_share(share)
    if kv := os.environ.get(KV_CACHE_ENV):
        settings["kv_cache_memory_bytes"] = kv_cache_bytes(kv)
    return settings


SLOT_REPLAY_ENV = "SKYRL_GLM_SLOT_REPLAY"
"""``0``: an engine activates adapters with vLLM's own per-module writes, not the slot replay
(:mod:`skyrl_glm.sync.vllm.slot_replay`); ``1`` or unset: the replay."""


def slot_replay_on(value: str | None) -> bool:
    """:data:`SLOT_REPLAY_ENV`'s value as on/off, else one ``ValueError`` naming it."""
    if value in (None, "", "1"):
        return True
    if value == "0":
        return False
    raise ValueError(f"{SLOT_REPLAY_ENV}={value!r}: 1 (the slot replay, the default) or 0 (vLLM's own writes)")


def environment_problem(gpu: bool) -> str | None:
    """The first of these variables whose value an engine would refuse (one line naming it), else None: read by a
    command before anything starts (the slot replay's everywhere; the memory settings where engines run on GPU)."""
    try:
        slot_replay_on(os.environ.get(SLOT_REPLAY_ENV))
        if gpu:
            gpu_environment_settings()
    except ValueError as e:
        return str(e)
    return None
