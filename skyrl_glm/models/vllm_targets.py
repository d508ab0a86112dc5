"""What the vLLM sampler needs for a model family: its LoRA module names and the engine kwargs for a checkpoint.

vLLM names LoRA-able modules after its own (fused) layers, not after the HF weights. For the GLM models
(``Glm4MoeForCausalLM`` / ``Glm4MoeLiteForCausalLM``, which the CPU path uses for GLM-5.3, and vLLM's GLM-5 class):

==============================================  ===================  =========================================
HF/PEFT target                                  vLLM module          note
==============================================  ===================  =========================================
self_attn.q_a_proj, self_attn.kv_a_proj_with_mqa  fused_qkv_a_proj   MLA with q_lora_rank (packed, 2 slices)
self_attn.q_b_proj                              q_b_proj
self_attn.kv_b_proj                             kv_b_proj            accepted but never applied (absorbed MLA)
self_attn.o_proj                                o_proj
self_attn.q_proj / k_proj / v_proj              qkv_proj             GQA (glm4_moe)
mlp.gate_proj / up_proj, shared_experts.*       gate_up_proj         one vLLM name for dense MLP and shared expert
mlp.down_proj, shared_experts.down_proj         down_proj
mlp.experts.gate_up_proj / down_proj            experts              fused-MoE LoRA (GPU only)
==============================================  ===================  =========================================
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skyrl_glm.models.base import ModelFamily, UnsupportedTargetError

HF_TO_VLLM = {
    "self_attn.q_a_proj": "fused_qkv_a_proj",
    "self_attn.kv_a_proj_with_mqa": "fused_qkv_a_proj",
    "self_attn.q_b_proj": "q_b_proj",
    "self_attn.kv_b_proj": "kv_b_proj",
    "self_attn.o_proj": "o_proj",
    "self_attn.q_proj": "qkv_proj",
    "self_attn.k_proj": "qkv_proj",
    "self_attn.v_proj": "qkv_proj",
    "mlp.gate_proj": "gate_up_proj",
    "mlp.up_proj": "gate_up_proj",
    "mlp.down_proj": "down_proj",
    "shared_experts.gate_proj": "gate_up_proj",
    "shared_experts.up_proj": "gate_up_proj",
    "shared_experts.down_proj": "down_proj",
    "mlp.experts.gate_up_proj": "experts",
    "mlp.experts.down_proj": "experts",
}

# dtype vLLM serves a family in, per device. MLA on vLLM CPU runs in bf16 only; glm4_moe (GQA) runs in fp32 on
# CPU, which is what makes a bit-tight CPU handoff check possible.
_CPU_DTYPE = {"glm4_moe": "float32", "glm_moe_dsa": "bfloat16", "glm4_moe_lite": "bfloat16"}


def sampler_backend(device: str) -> str:
    """The target-policy backend name for a vLLM device (``cpu`` -> ``vllm-cpu``; anything else -> ``vllm``)."""
    return "vllm-cpu" if device == "cpu" else "vllm"


def vllm_lora_target_modules(hf_targets: Sequence[str]) -> list[str]:
    """vLLM ``lora_target_modules`` for resolved HF/PEFT targets (deduplicated, order kept)."""
    out: list[str] = []
    for t in hf_targets:
        if t not in HF_TO_VLLM:
            raise UnsupportedTargetError(f"no vLLM LoRA module for HF target {t!r} (known: {sorted(HF_TO_VLLM)})")
        if HF_TO_VLLM[t] not in out:
            out.append(HF_TO_VLLM[t])
    return out


def vllm_engine_kwargs(
    family: ModelFamily,
    model_dir: str | Path,
    *,
    lora_targets: Sequence[str] | None,
    device: str,
    max_model_len: int | None = None,
    allow_unsupported: bool = False,
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM(**kwargs)`` serving ``model_dir`` of ``family`` on ``device``.

    Returns ``model``, ``dtype``, ``hf_overrides`` (only where needed: GLM-5.3 on CPU is served as dense MLA),
    ``max_model_len`` (when given or required), and with ``lora_targets`` ``enable_lora=True`` plus
    ``lora_target_modules``. ``lora_targets`` are HF/PEFT names, checked against the family's policy for this
    sampler (an unsupported one raises :class:`UnsupportedTargetError` unless ``allow_unsupported``).
    ``max_lora_rank`` and engine sizing are left to the caller.
    """
    kwargs: dict[str, Any] = {"model": str(model_dir)}
    if device == "cpu":
        dtype = _CPU_DTYPE.get(family.hf_model_type)
        if dtype is None:
            raise ValueError(f"family {family.name!r} ({family.hf_model_type}) has no known vLLM CPU serving path")
        kwargs["dtype"] = dtype
        if family.hf_model_type == "glm_moe_dsa":
            from transformers import AutoConfig

            from skyrl_glm.models.glm5_vllm_cpu import cpu_sampler_overrides

            config = AutoConfig.from_pretrained(model_dir)
            max_model_len = max_model_len or min(int(config.index_topk), int(config.max_position_embeddings))
            kwargs["hf_overrides"] = cpu_sampler_overrides(config, max_model_len)
    else:
        kwargs["dtype"] = "bfloat16"
    if max_model_len is not None:
        kwargs["max_model_len"] = max_model_len
    if lora_targets:
        resolved = family.lora.resolve(
            list(lora_targets), sampler=sampler_backend(device), allow_unsupported=allow_unsupported
        )
        kwargs["enable_lora"] = True
        kwargs["lora_target_modules"] = vllm_lora_target_modules(resolved)
    return kwargs
