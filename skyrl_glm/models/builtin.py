"""The built-in model families, registered through the package's own ``skyrl_glm`` entry point."""

from __future__ import annotations

from skyrl_glm.models import glm4, glm5, glm5_flash
from skyrl_glm.models.base import ModelFamily
from skyrl_glm.plugins import hookimpl


@hookimpl
def skyrl_glm_model_families() -> list[ModelFamily]:
    return [glm5.FAMILY, glm5_flash.FAMILY, glm4.FAMILY]
