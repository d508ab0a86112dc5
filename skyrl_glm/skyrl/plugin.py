"""Built-in SkyRL worker classes per strategy, registered like any plugin (``skyrl_glm`` entry point ``skyrl``).

References, not imports: the factories load SkyRL's workers when called (the Megatron one needs Megatron-Bridge,
hence Transformer Engine).
"""

from __future__ import annotations

from skyrl_glm.plugins import Ref, hookimpl


@hookimpl
def skyrl_glm_skyrl_workers() -> list[tuple[str, Ref]]:
    return [("fsdp", "skyrl_glm.skyrl.fsdp:fsdp_workers"), ("megatron", "skyrl_glm.skyrl.megatron:megatron_workers")]
