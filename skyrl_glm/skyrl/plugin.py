"""What the SkyRL glue registers like any plugin (``skyrl_glm`` entry point ``skyrl``): the worker classes per
strategy, and the check's ``vllm-skyrl`` sampler (the check's vLLM sampler with the worker extension SkyRL runs
load, so the check itself never reaches into this package).

References, not imports: the factories load SkyRL's workers when called (the Megatron one needs Megatron-Bridge,
hence Transformer Engine).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skyrl_glm.plugins import VLLM_ENGINE, Ref, hookimpl, serves_with


@serves_with(VLLM_ENGINE, skyrl_worker=True)
def vllm_skyrl_sampler(model_dir: Path, **kwargs: Any) -> Any:
    """The check's vLLM sampler as SkyRL runs load it: SkyRL's worker wrap plus skyrl-glm's receiver, and the LoRA
    slots SkyRL's servers get by default (``trainer.policy.model.lora.max_loras``: one)."""
    from skyrl.train.config.config import SkyRLLoraConfig

    from skyrl_glm.check.scorers import vllm_sampler
    from skyrl_glm.skyrl.workers.vllm_extension import WORKER_EXTENSION

    engine = {"max_loras": SkyRLLoraConfig.max_loras}
    return vllm_sampler(model_dir, skyrl_worker_extension=WORKER_EXTENSION, engine=engine, **kwargs)


@hookimpl
def skyrl_glm_samplers() -> list[tuple[str, Ref]]:
    return [("vllm-skyrl", vllm_skyrl_sampler)]


@hookimpl
def skyrl_glm_skyrl_workers() -> list[tuple[str, Ref]]:
    return [
        ("fsdp", "skyrl_glm.skyrl.workers.fsdp:fsdp_workers"),
        ("megatron", "skyrl_glm.skyrl.workers.megatron:megatron_workers"),
    ]
