"""LoRA target building blocks shared by the GLM families (MLA/GQA attention, dense MLP, experts).

HF names are PEFT ``target_modules`` suffixes (routed experts: ``target_parameters``), written with
their parent so that a dense MLP, a shared expert and a routed expert are distinct targets.
Megatron names are Megatron-Core module names, as Megatron-Bridge's LoRA ``target_modules`` takes them.
"""

from __future__ import annotations

from skyrl_glm.models.base import LoraTarget

# Measured (../shared/ENVIRONMENT.md): vLLM absorbs kv_b_proj into its MLA kernels; a LoRA on it
# changes nothing in the sampler (shift 0.0) while HF+PEFT moves (mean |dlogp| 0.070).
KV_B_IGNORED = (
    "vLLM's MLA absorbs kv_b_proj into the attention kernels and silently ignores a LoRA on it "
    "(measured: sampler output unchanged, trainer mean |dlogp| 0.07)"
)
ROUTED_EXPERTS_CPU = "vLLM's CPU build has no fused-MoE LoRA kernels (PunicaWrapperCPU)"


def mla_attention() -> list[LoraTarget]:
    return [
        LoraTarget("self_attn.q_a_proj", "linear_q_down_proj", "attention"),
        LoraTarget("self_attn.q_b_proj", "linear_q_up_proj", "attention"),
        LoraTarget("self_attn.kv_a_proj_with_mqa", "linear_kv_down_proj", "attention"),
        LoraTarget(
            "self_attn.kv_b_proj",
            "linear_kv_up_proj",
            "attention",
            default=False,
            unsupported={"vllm": KV_B_IGNORED, "vllm-cpu": KV_B_IGNORED},
        ),
        LoraTarget("self_attn.o_proj", "linear_proj", "attention"),
    ]


def gqa_attention() -> list[LoraTarget]:
    return [
        LoraTarget("self_attn.q_proj", "linear_qkv", "attention"),
        LoraTarget("self_attn.k_proj", "linear_qkv", "attention"),
        LoraTarget("self_attn.v_proj", "linear_qkv", "attention"),
        LoraTarget("self_attn.o_proj", "linear_proj", "attention"),
    ]


def dsa_indexer() -> list[LoraTarget]:
    # Off by default: the indexer only ranks keys (top-k selection), it is not on the policy's value path.
    return [
        LoraTarget("indexer.wq_b", None, "indexer", default=False),
        LoraTarget("indexer.wk", None, "indexer", default=False),
    ]


def moe_mlp() -> list[LoraTarget]:
    routed = {"vllm-cpu": ROUTED_EXPERTS_CPU}
    return [
        LoraTarget("mlp.gate_proj", "linear_fc1", "dense_mlp"),
        LoraTarget("mlp.up_proj", "linear_fc1", "dense_mlp"),
        LoraTarget("mlp.down_proj", "linear_fc2", "dense_mlp"),
        LoraTarget("shared_experts.gate_proj", "linear_fc1", "shared_expert"),
        LoraTarget("shared_experts.up_proj", "linear_fc1", "shared_expert"),
        LoraTarget("shared_experts.down_proj", "linear_fc2", "shared_expert"),
        LoraTarget("mlp.experts.gate_up_proj", "linear_fc1", "routed_expert", unsupported=routed),
        LoraTarget("mlp.experts.down_proj", "linear_fc2", "routed_expert", unsupported=routed),
    ]
