"""GLM-5.3-Flash (``glm5_next``): KDA linear attention with NoPE-MLA + DSA every 4th layer, mHC, 288+1 experts.

Megatron side: SkyRL 0.4's ``patches/megatron/glm5_next`` (``Glm5NextBridge``, vendored KDA and mHC)
builds the model; megatron-core alone has neither KDA nor mHC. Sampler side: vLLM serves it from 0.30 on
(``vllm.models.glm5next``, GPU only), as ``Glm5NextForConditionalGeneration``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from skyrl_glm.checkpoint import read_config
from skyrl_glm.models.base import LoraPolicy, LoraTarget, ModelFamily, missing_fields
from skyrl_glm.models.glm5 import ROUTER
from skyrl_glm.models.targets import dsa_indexer, mla_attention, moe_mlp

FACTS = {
    "total_params": "320B",
    "active_params": "18B",
    "hidden_size": 4096,
    "num_hidden_layers": 45,
    "mla_layers": "idx % 4 == 3 (NoPE-MLA + DSA); others KDA",
    "n_routed_experts": 288,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048,
    "hc_mult": 4,
    "kv_lora_rank": 512,
    "vocab_size": 154880,
}

VLLM_ARCHITECTURE = "Glm5NextForConditionalGeneration"
# The checkpoint is multimodal; the tiny one has no processor config, and RL scores text: no image, no video.
NO_MULTIMODAL = {"image": 0, "video": 0}


def tiny_config():
    """Every Flash structure at toy width, each size one vLLM 0.30's GPU kernels take (read from its source):

    * MLA: NoPE (``qk_rope_head_dim`` 0, transformers refuses any other), so the MLA cache row is
      ``kv_lora_rank`` wide; the sparse MLA kernels on Hopper take 512 (FlashInfer's SM90 kernel requires it,
      FlashMLA takes only 576 = 512 + 64 rope), hence ``kv_lora_rank`` 512.
    * DSA indexer: ``glm5next/nvidia/attention.py`` asserts head dim 128 (FP8 Hadamard-128 quant); DeepGEMM's
      MQA logits take 32 or 64 heads (fewer are zero-padded to 32): 32, as published. ``index_kpool`` 4 (the
      pooled K cache needs ``block_size`` a multiple of kpool * 32; vLLM aligns it); ``index_topk`` 512 >=
      ``max_position_embeddings``, so DSA selects every key and the model is dense MLA in effect.
    * mHC (tilelang, DeepGEMM's TF32 pre-norm GEMM): ``hc_mult`` 4 as published, ``hidden_size`` 256, so the
      fused post + pre-norm kernel's 128-thread split and the 512-wide pre-norm GEMM tile it evenly.
    * KDA: head dim 32 runs vLLM's Triton chunked kernels (head dim 128 would pick the FlashKDA extension).
    * Router fields (:data:`~skyrl_glm.models.glm5.ROUTER`) in the text config: vLLM's Flash MoE reads
      ``topk_method`` (default none: no ``e_score_correction_bias``, so the checkpoint fails to load).
    * Multimodal token ids inside the vocabulary (the vision tower is one block; vLLM does not build it when
      ``limit_mm_per_prompt`` is 0).
    """
    from transformers.models.glm5_next.configuration_glm5_next import Glm5NextConfig

    text = dict(
        hidden_size=256,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        q_lora_rank=64,
        kv_lora_rank=512,
        qk_nope_head_dim=64,
        v_head_dim=64,
        index_topk=512,
        index_head_dim=128,
        index_n_heads=32,
        index_kpool=4,
        linear_head_dim=32,
        linear_num_heads=2,
        hc_mult=4,
        max_position_embeddings=512,
        pad_token_id=0,
        **ROUTER,
    )
    vision = dict(
        depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=256, projection_intermediate_size=64
    )
    return Glm5NextConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=500,
        video_token_id=501,
        image_start_token_id=502,
        image_end_token_id=503,
        video_start_token_id=504,
        video_end_token_id=505,
    )


def _build(config):
    from transformers.models.glm5_next.modeling_glm5_next import Glm5NextForConditionalGeneration

    config.text_config.vocab_size = config.vocab_size
    return Glm5NextForConditionalGeneration(config)


def sampler_overrides(model_dir, *, device: str, max_model_len: int | None) -> dict[str, Any]:
    """No image or video inputs, and the router fields the checkpoint's text config lacks (nested: vLLM updates
    the text config in place)."""
    text = read_config(model_dir).get("text_config") or {}
    missing = missing_fields(text, ROUTER)
    return {
        "limit_mm_per_prompt": dict(NO_MULTIMODAL),
        **({"hf_overrides": {"text_config": missing}} if missing else {}),
    }


# vLLM 0.30's Glm5NextForConditionalGeneration inherits GLM-4V's packed_modules_mapping ({"qkv_proj": [q, k, v],
# "gate_up_proj": ["gate_up_proj"]}), which names none of Flash's fused projections: an adapter with the HF
# modules below has nothing to assemble them onto, and vLLM's loader refuses it ("expected target modules in ...").
# SkyRL's worker wrap installs the right mapping (its patch_glm5next_lora_packing); that sampler is "vllm+skyrl".
FUSED_QKV_A_UNMAPPED = (
    "stock vLLM 0.30's Glm5Next LoRA mapping has no fused_qkv_a_proj entry: it refuses a q_a/kv_a LoRA at load "
    "(SkyRL's worker wrap adds the entry)"
)
GATE_UP_UNMAPPED = (
    "stock vLLM 0.30's Glm5Next LoRA mapping (GLM-4V's) takes one fused gate_up_proj LoRA: it refuses separate "
    "gate/up LoRAs at load (SkyRL's worker wrap maps them)"
)
STOCK_VLLM_DROPS = {
    "self_attn.q_a_proj": FUSED_QKV_A_UNMAPPED,
    "self_attn.kv_a_proj_with_mqa": FUSED_QKV_A_UNMAPPED,
    "mlp.gate_proj": GATE_UP_UNMAPPED,
    "mlp.up_proj": GATE_UP_UNMAPPED,
    "shared_experts.gate_proj": GATE_UP_UNMAPPED,
    "shared_experts.up_proj": GATE_UP_UNMAPPED,
}


def _targets() -> tuple[LoraTarget, ...]:
    """The GLM-5.x targets, those stock vLLM drops on Flash refused for sampler ``vllm`` (Flash is served from vLLM
    0.30 on, so ``vllm`` means that release here)."""
    out = []
    for t in mla_attention() + dsa_indexer() + moe_mlp():
        if t.hf in STOCK_VLLM_DROPS:
            t = replace(t, unsupported={**t.unsupported, "vllm": STOCK_VLLM_DROPS[t.hf]})
        out.append(t)
    return tuple(out)


FAMILY = ModelFamily(
    name="glm-5.3-flash",
    hf_model_type="glm5_next",
    summary="GLM-5.3-Flash: KDA + NoPE-MLA/DSA every 4th layer, mHC, 288+1 experts",
    facts=FACTS,
    lora=LoraPolicy(targets=_targets(), megatron_lora_kwargs={"share_expert_adapters": True}),
    tiny_config=tiny_config,
    sampler_overrides=sampler_overrides,
    model_class=_build,
    vllm_architecture=VLLM_ARCHITECTURE,
    hf_auto_class="AutoModelForImageTextToText",
    lora_exclude=r".*\.visual\..*",
)
