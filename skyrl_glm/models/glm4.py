"""GLM-4.x families: real GLM architectures that vLLM's CPU build serves, used as CPU sampler proxies.

``glm-4.5`` (``glm4_moe``: GQA + MoE + shared expert) runs in vLLM CPU in fp32 and matches HF to ~5e-7,
which is what makes a bit-tight CPU handoff check possible.
"""

from __future__ import annotations

from skyrl_glm.models.base import LoraPolicy, ModelFamily
from skyrl_glm.models.targets import gqa_attention, moe_mlp

FACTS = {
    "total_params": "355B",
    "active_params": "32B",
    "hidden_size": 5120,
    "num_hidden_layers": 92,
    "n_routed_experts": 160,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
}


def tiny_config():
    """head_dim 32: vLLM's CPU attention takes head sizes {32, 64, 80, ...}, not 16."""
    from transformers import Glm4MoeConfig

    return Glm4MoeConfig(
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=512,
        initializer_range=0.1,
    )


FAMILY = ModelFamily(
    name="glm-4.5",
    hf_model_type="glm4_moe",
    summary="GLM-4.5/4.6/4.7: GQA + MoE with a shared expert (the CPU sampler proxy)",
    facts=FACTS,
    lora=LoraPolicy(targets=tuple(gqa_attention() + moe_mlp())),
    tiny_config=tiny_config,
    vllm_architecture="Glm4MoeForCausalLM",
    vllm_cpu_dtype="float32",  # GQA runs in fp32 on vLLM CPU: what makes a bit-tight CPU handoff check possible
)
