"""What the vLLM sampler needs to serve a model family: the engine kwargs for a checkpoint on a device.

Everything family-specific comes from the family's records: the vLLM LoRA module of each target
(:attr:`~skyrl_glm.models.base.LoraTarget.vllm`), the CPU serving dtype and the checkpoint's config overrides
(:class:`~skyrl_glm.models.base.ModelFamily`). A table of the GLM targets is in docs/models.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skyrl_glm.models.base import ModelFamily


def sampler_backend(device: str, *, skyrl_worker: bool = False) -> str:
    """The target-policy backend name for a vLLM device (``cpu`` -> ``vllm-cpu``; anything else -> ``vllm``), with
    ``+skyrl`` when SkyRL's worker wrap is loaded in the engine (it patches vLLM's MLA to apply a ``kv_b_proj``
    LoRA): what a sampler applies is decided by the code it runs, not by the model alone."""
    return ("vllm-cpu" if device == "cpu" else "vllm") + ("+skyrl" if skyrl_worker else "")


def vllm_engine_kwargs(
    family: ModelFamily,
    model_dir: str | Path,
    *,
    lora_targets: Sequence[str] | None,
    device: str,
    max_model_len: int | None = None,
    allow_unsupported: bool = False,
    skyrl_worker: bool = False,
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM(**kwargs)`` serving ``model_dir`` of ``family`` on ``device``.

    Returns ``model``, ``dtype``, the family's ``sampler_overrides`` (e.g. ``hf_overrides`` and ``max_model_len``
    for GLM-5.3 served as dense MLA on CPU), ``max_model_len`` when given, and with ``lora_targets``
    ``enable_lora=True`` plus ``lora_target_modules``. ``lora_targets`` are checked against the family's policy
    for this sampler (an unsupported one raises :class:`UnsupportedTargetError` unless ``allow_unsupported``).
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
    return kwargs
