"""Checks on a built config that SkyRL's strict keys cannot make: the recipe's own promises.

A layout needing more GPUs than the stated hardware, a LoRA target the sampler silently ignores, an overlong
buffer longer than the response cap, a context longer than a local model's positions. Each problem is one line
naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyrl_glm.skyrl.config.hardware import gpu_needs, layout_problem

if TYPE_CHECKING:
    from skyrl_glm.skyrl.config.sections import GlmTrainConfig


def unsafe_megatron_targets(targets: Any, sampler: str | None = None) -> list[str]:
    """Megatron LoRA target names that every registered model maps to a module ``sampler`` does not apply, with the
    reason. By default the sampler is SkyRL's vLLM server as installed here: ``vllm+skyrl`` where SkyRL's MLA patch
    is in effect (it applies ``linear_kv_up_proj`` = MLA ``kv_b_proj``), stock ``vllm`` otherwise or without vLLM."""
    from skyrl_glm.models.vllm_targets import sampler_backend
    from skyrl_glm.plugins import registry

    sampler = sampler or sampler_backend("cuda", skyrl_worker=True)

    if isinstance(targets, str):
        return []
    found = []
    for name in targets:
        matches = [t for fam in registry().models.values() for t in fam.lora.targets if t.megatron == name]
        if matches and all(sampler in t.unsupported for t in matches):
            found.append(f"{name} ({matches[0].hf}): {matches[0].unsupported[sampler]}")
    return found


MAX_CONFIG_BYTES = 1 << 20  # a model's config.json is a few KiB; a larger one is not read here


def model_positions(path: Any) -> int | None:
    """``max_position_embeddings`` of a model whose folder is on this machine, a multimodal one's from its text
    config (a hub id, an unreadable or odd config: None, and vLLM judges it where the run starts)."""
    from skyrl_glm.checkpoint import text_value

    config_file = Path(str(path)) / "config.json"
    try:
        if not config_file.is_file() or config_file.stat().st_size > MAX_CONFIG_BYTES:
            return None
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    value = text_value(config, "max_position_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def problems(cfg: GlmTrainConfig) -> list[str]:
    """Every broken promise of a built skyrl-glm config (empty when it is consistent)."""
    out = []
    needs = gpu_needs(cfg.trainer, cfg.generator.inference_engine)
    placement = cfg.trainer.placement
    if (layout := layout_problem(cfg.skyrl_glm.hardware, needs, placement.policy_num_gpus_per_node)) is not None:
        out.append(layout)
    lora = cfg.trainer.policy.model.lora
    if lora.rank > 0 and cfg.trainer.strategy == "megatron":
        for bad in unsafe_megatron_targets(lora.target_modules):
            out.append(f"trainer.policy.model.lora.target_modules: the sampler ignores {bad}")
    overlong = cfg.skyrl_glm.overlong
    cap = cfg.generator.sampling_params.max_generate_length
    if overlong.buffer_len > cap:
        out.append(
            f"skyrl_glm.overlong.buffer_len: {overlong.buffer_len} is longer than the response cap "
            f"generator.sampling_params.max_generate_length={cap}"
        )
    model = cfg.trainer.policy.model.path
    context = cfg.generator.inference_engine.engine_init_kwargs.get("max_model_len")
    # vLLM refuses a longer context inside the engine, minutes into the run; the model's config is read only if set
    if isinstance(context, int) and (positions := model_positions(model)) is not None and context > positions:
        out.append(
            f"generator.inference_engine.engine_init_kwargs.max_model_len: {context} is longer than the model's "
            f"max_position_embeddings {positions} ({model}/config.json); set it to at most {positions}"
        )
    return out
