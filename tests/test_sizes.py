"""Public vs unique adapter sizes from shapes only, checked against an allocated synthetic export."""

from __future__ import annotations

import torch

from skyrl_glm.lora.bridge import layer_is_moe, synthetic_bridge_export
from skyrl_glm.lora.sizes import GB, adapter_sizes, family_sizes, print_sizes_table
from skyrl_glm.models import glm5


def test_tiny_sizes_equal_an_allocated_export():
    """The shape-only count equals what a Bridge-like export (same tensor under every shared name) holds."""
    cfg = glm5.tiny_config()
    cfg.vocab_size = glm5.FAMILY.tiny_vocab_size
    targets = glm5.FAMILY.lora.resolve(sampler="vllm")
    for share in (True, False):
        s = adapter_sizes(
            cfg, glm5.FAMILY.lora, rank=32, targets=targets, share_expert_adapters=share, dtype=torch.bfloat16
        )
        export = list(
            synthetic_bridge_export(
                cfg, glm5.FAMILY.lora, rank=32, targets=targets, share_expert_adapters=share, dtype=torch.bfloat16
            )
        )
        uniq = {id(t): t for _, t in export}
        assert s.public_tensors == len(export)
        assert s.public_bytes == sum(t.numel() * t.element_size() for _, t in export)
        assert s.unique_tensors == len(uniq)
        assert s.unique_bytes == sum(t.numel() * t.element_size() for t in uniq.values())
    shared = adapter_sizes(cfg, glm5.FAMILY.lora, rank=32, targets=targets)
    # 2 MoE layers x 4 experts x 6 names; 5 distinct tensors per MoE layer (fc1 A, gate B, up B, fc2 A, fc2 B)
    assert shared.by_kind["routed_expert"][0] == 2 * 4 * 6
    assert shared.by_kind["routed_expert"][2] == 2 * 5


def test_full_glm53_rank32():
    """Full GLM-5.3 (transformers' GlmMoeDsaConfig defaults), rank 32, bf16, Bridge export with shared experts."""
    s = family_sizes(glm5.FAMILY)  # default targets: no kv_b_proj, no indexer
    assert s.public_tensors == 116_292 and s.unique_tensors == 1_389
    assert round(s.public_bytes / GB, 2) == 30.61 and round(s.unique_bytes / GB, 3) == 0.465
    routed = s.by_kind["routed_expert"]
    assert routed[0] == 75 * 256 * 6 and routed[2] == 75 * 5  # 115,200 public names, 375 unique tensors
    assert round(routed[1] / GB, 2) == 30.20 and round(routed[3] / GB, 3) == 0.088
    # SkyRL PR #2250 quotes 30.77 GB public / 0.62 GB unique: its adapter also trains kv_b_proj
    with_kvb = family_sizes(glm5.FAMILY, targets=[*glm5.FAMILY.lora.resolve(sampler="vllm"), "self_attn.kv_b_proj"])
    assert abs(with_kvb.public_bytes / GB - 30.77) < 0.03
    assert abs(with_kvb.unique_bytes / GB - 0.62) < 0.015


def test_table_prints():
    from rich.console import Console

    console = Console(record=True, width=140)
    print_sizes_table([family_sizes(glm5.FAMILY), family_sizes(glm5.FAMILY, full=False)], console)
    text = console.export_text()
    assert "glm-5.3 (full)" in text and "116,292" in text and "routed_expert" in text


def test_a_multimodal_config_is_sized_by_its_text_model():
    """GLM-5.3-Flash's config is multimodal: its shapes live in its text config (read there, not off the top)."""
    from skyrl_glm.models import glm5_flash

    cfg = glm5_flash.tiny_config()
    assert not hasattr(cfg, "hidden_size") and cfg.get_text_config() is not cfg
    targets = glm5_flash.FAMILY.lora.resolve(sampler="vllm")
    s = adapter_sizes(cfg, glm5_flash.FAMILY.lora, rank=32, targets=targets)
    export = list(synthetic_bridge_export(cfg, glm5_flash.FAMILY.lora, rank=32, targets=targets))
    text = cfg.get_text_config()
    assert s.public_tensors == len(export) > 0
    assert s.by_kind["routed_expert"][0] == sum(layer_is_moe(text)) * text.n_routed_experts * 6
