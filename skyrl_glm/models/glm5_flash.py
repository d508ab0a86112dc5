"""GLM-5.3-Flash (``glm5_next``): KDA linear attention with NoPE-MLA + DSA every 4th layer, mHC, 288+1 experts.

Megatron side: SkyRL 0.4's ``patches/megatron/glm5_next`` (``Glm5NextBridge``, vendored KDA and mHC)
builds the model; megatron-core alone has neither KDA nor mHC.
"""

from __future__ import annotations

from skyrl_glm.models.base import LoraPolicy, ModelFamily
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


def tiny_config():
    from transformers.models.glm5_next.configuration_glm5_next import Glm5NextConfig

    text = dict(
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        n_routed_experts=4,
        num_experts_per_tok=2,
        q_lora_rank=32,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        index_topk=512,
        index_head_dim=32,
        index_n_heads=2,
        linear_head_dim=32,
        linear_num_heads=2,
        hc_mult=2,
        max_position_embeddings=512,
        pad_token_id=0,
    )
    vision = dict(
        depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64, projection_intermediate_size=64
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


FAMILY = ModelFamily(
    name="glm-5.3-flash",
    hf_model_type="glm5_next",
    summary="GLM-5.3-Flash: KDA + NoPE-MLA/DSA every 4th layer, mHC, 288+1 experts",
    facts=FACTS,
    lora=LoraPolicy(
        targets=tuple(mla_attention() + dsa_indexer() + moe_mlp()),
        megatron_lora_kwargs={"share_expert_adapters": True},
    ),
    tiny_config=tiny_config,
    model_class=_build,
)
