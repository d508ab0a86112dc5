"""Built-in handoff-check trainer and sampler factories, registered through the package's ``skyrl_glm`` entry point.

``hf_trainer`` is a :class:`~skyrl_glm.plugins.TrainerFactory` (HF + PEFT), ``vllm_sampler`` a
:class:`~skyrl_glm.plugins.SamplerFactory` (a vLLM engine with in-memory adapter swaps). Both import their
heavy dependencies when called, so registering them costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skyrl_glm.models.base import ModelFamily
from skyrl_glm.plugins import SamplerFactory, TrainerFactory, hookimpl


def hf_trainer(
    model_dir: Path, *, family: ModelFamily, targets: Sequence[str], rank: int, alpha: int, device: str
) -> Any:
    from skyrl_glm.check.trainer_hf import HfPeftTrainer

    routed = [t for t in targets if family.lora.target(t).kind == "routed_expert"]
    modules = [t for t in targets if t not in routed]
    return HfPeftTrainer(
        str(model_dir), targets=modules, target_parameters=routed, rank=rank, alpha=alpha, device=device
    )


def vllm_sampler(
    model_dir: Path, *, family: ModelFamily, targets: Sequence[str], rank: int, device: str, allow_unsupported: bool
) -> Any:
    from skyrl_glm.models.vllm_targets import vllm_engine_kwargs
    from skyrl_glm.sync.vllm.engine import VllmEngineSampler

    kwargs = vllm_engine_kwargs(
        family, str(model_dir), lora_targets=list(targets), device=device, allow_unsupported=allow_unsupported
    )
    kwargs.pop("model")
    kwargs.pop("enable_lora")
    return VllmEngineSampler(str(model_dir), max_lora_rank=rank, **kwargs)


@hookimpl
def skyrl_glm_trainers() -> list[tuple[str, TrainerFactory]]:
    return [("hf", hf_trainer)]


@hookimpl
def skyrl_glm_samplers() -> list[tuple[str, SamplerFactory]]:
    return [("vllm", vllm_sampler)]
