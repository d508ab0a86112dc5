"""Built-in handoff-check scorers, registered through the package's ``skyrl_glm`` entry point."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from skyrl_glm.plugins import hookimpl


@hookimpl
def skyrl_glm_scorers() -> list[tuple[str, Callable[..., Any]]]:
    return []
