"""GLM-5.3 (``glm_moe_dsa``): MLA + DSA indexer, 3 dense + 75 MoE layers, 256 routed + 1 shared expert.

Megatron side: Megatron-Bridge's ``GLM5Bridge`` builds the model (SkyRL 0.4 uses it); this adapter
only supplies facts, LoRA targets and tiny checkpoints.
"""

from __future__ import annotations

from skyrl_glm.checkpoint import read_config
from skyrl_glm.models.base import LoraPolicy, ModelFamily
from skyrl_glm.models.targets import KV_B_DSA_PATCHED, dsa_indexer, mla_attention, moe_mlp

# Full-size config (transformers' GlmMoeDsaConfig defaults equal GLM-5.3's published config).
FACTS = {
    "total_params": "744B",
    "active_params": "40B",
    "hidden_size": 6144,
    "num_hidden_layers": 78,
    "first_k_dense_replace": 3,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048,
    "intermediate_size": 12288,
    "num_attention_heads": 64,
    "q_lora_rank": 2048,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "index_topk": 2048,
    "vocab_size": 154880,
}


# Config fields HF's GlmMoeDsa modeling hard-codes but vLLM and Megatron-Bridge read from the config (published GLM-5
# configs carry them; transformers' GlmMoeDsaConfig does not write them, so a checkpoint saved from it lacks them):
# - the router: HF routes with sigmoid scores plus e_score_correction_bias (noaux_tc); vLLM's DeepSeek-V2 MoE
#   defaults to softmax without the bias;
# - the DSA indexer's RoPE: HF ropes it interleaved (modeling_glm_moe_dsa); vLLM reads indexer_rope_interleave and
#   defaults to the half-split (neox) layout, Megatron-Bridge 0.6.2's GLM-5 bridge reads it with no default.
ROUTER = {"topk_method": "noaux_tc", "scoring_func": "sigmoid"}
INDEXER = {"indexer_rope_interleave": True}
CHECKPOINT_DEFAULTS = {**ROUTER, **INDEXER}


def full_config():
    from transformers import GlmMoeDsaConfig

    return GlmMoeDsaConfig()


def tiny_config():
    """Every GLM-5.3 structure at toy width. kv_lora_rank 512 + qk_rope 64 is what vLLM's CPU MLA
    kernel takes (576); index_topk 512 >= max_position_embeddings makes DSA select every key."""
    from transformers import GlmMoeDsaConfig

    return GlmMoeDsaConfig(
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        first_k_dense_replace=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        q_lora_rank=32,
        kv_lora_rank=512,
        qk_nope_head_dim=32,
        qk_rope_head_dim=64,
        v_head_dim=32,
        head_dim=64,
        index_topk=512,
        index_head_dim=128,  # >= qk_rope_head_dim (the indexer ropes its first 64 dims)
        index_n_heads=32,  # the GPU indexer (DeepGEMM): 16, 32 or 64 heads on vLLM 0.26, only 32 or 64 on vLLM 0.30
        max_position_embeddings=512,
        **CHECKPOINT_DEFAULTS,
    )


def sampler_overrides(model_dir, *, device: str, max_model_len: int | None) -> dict:
    """On GPU, the fields the checkpoint lacks (:data:`CHECKPOINT_DEFAULTS`); on vLLM CPU, serve the checkpoint as
    dense MLA (exact while ``max_model_len <= index_topk``)."""
    if device != "cpu":
        missing = FAMILY.missing_defaults(read_config(model_dir))
        return {"hf_overrides": missing} if missing else {}
    from transformers import AutoConfig

    from skyrl_glm.models.glm5_vllm_cpu import cpu_sampler_overrides

    config = AutoConfig.from_pretrained(model_dir)
    max_model_len = max_model_len or min(int(config.index_topk), int(config.max_position_embeddings))
    return {"hf_overrides": cpu_sampler_overrides(config, max_model_len), "max_model_len": max_model_len}


FAMILY = ModelFamily(
    name="glm-5.3",
    hf_model_type="glm_moe_dsa",
    summary="GLM-5.3: MLA + DSA sparse attention, 256+1 experts",
    facts=FACTS,
    lora=LoraPolicy(
        targets=tuple(mla_attention(kv_b_patched=KV_B_DSA_PATCHED) + dsa_indexer() + moe_mlp()),
        megatron_lora_kwargs={"share_expert_adapters": True},
    ),
    tiny_config=tiny_config,
    vllm_architecture="GlmMoeDsaForCausalLM",
    full_config=full_config,
    vllm_cpu_dtype="bfloat16",  # MLA on vLLM CPU runs in bf16 only
    sampler_overrides=sampler_overrides,
    checkpoint_defaults=CHECKPOINT_DEFAULTS,
)
