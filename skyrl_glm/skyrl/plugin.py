"""Built-in SkyRL worker classes per strategy, registered like any plugin (``skyrl_glm`` entry point ``skyrl``).

The factories import their workers when called: the Megatron one needs Megatron-Bridge (and Transformer Engine).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from skyrl_glm.plugins import hookimpl


def _fsdp() -> tuple[Any, Any, Any]:
    from skyrl_glm.skyrl.fsdp import fsdp_workers

    return fsdp_workers()


def _megatron() -> tuple[Any, Any, Any]:
    from skyrl_glm.skyrl.megatron import megatron_workers

    return megatron_workers()


@hookimpl
def skyrl_glm_skyrl_workers() -> list[tuple[str, Callable[[], tuple[Any, Any, Any]]]]:
    return [("fsdp", _fsdp), ("megatron", _megatron)]
