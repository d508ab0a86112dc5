"""LoRA target names as users write them: qualified HF names, PEFT short names (suffix match; an ambiguous one
means every match) and Megatron names, everywhere targets are accepted."""

from __future__ import annotations

import logging

import pytest

from skyrl_glm.lora.sizes import family_sizes
from skyrl_glm.models import glm4, glm5
from skyrl_glm.models.base import SAMPLER_BACKENDS, LoraTarget, UnsupportedTargetError
from skyrl_glm.models.vllm_targets import sampler_backend, vllm_engine_kwargs
from skyrl_glm.usage import UsageError

MLA = glm5.FAMILY.lora
GQA = glm4.FAMILY.lora


def test_short_names_match_by_suffix():
    assert MLA.expand(["q_a_proj"]) == ["self_attn.q_a_proj"]
    assert MLA.expand(["self_attn.o_proj", "wk"]) == ["self_attn.o_proj", "indexer.wk"]


def test_an_ambiguous_short_name_means_every_match_and_says_so(caplog):
    with caplog.at_level(logging.INFO, logger="skyrl_glm.models.base"):
        got = MLA.expand(["gate_proj"])
    assert got == ["mlp.gate_proj", "shared_experts.gate_proj"]
    assert "mlp.gate_proj, shared_experts.gate_proj" in caplog.text
    assert MLA.expand(["down_proj"]) == ["mlp.down_proj", "shared_experts.down_proj", "mlp.experts.down_proj"]


def test_megatron_names():
    assert GQA.expand(["linear_qkv"]) == ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]
    assert MLA.expand(["linear_fc2"]) == ["mlp.down_proj", "shared_experts.down_proj", "mlp.experts.down_proj"]
    assert MLA.expand(["linear_q_down_proj", "linear_proj"]) == ["self_attn.q_a_proj", "self_attn.o_proj"]


def test_unknown_and_empty_names_are_errors():
    with pytest.raises(UnsupportedTargetError, match="'nope' is not a LoRA target"):
        MLA.expand(["nope"])
    with pytest.raises(UnsupportedTargetError, match="'proj' is not a LoRA target"):
        MLA.expand(["proj"])  # a suffix matches whole dotted parts only
    with pytest.raises(UnsupportedTargetError, match="empty"):
        MLA.expand([""])
    with pytest.raises(UnsupportedTargetError, match="no LoRA targets"):
        MLA.resolve([])


def test_a_misspelt_sampler_backend_is_refused_not_taken_as_one_that_applies_everything():
    # Before: "vllm-gpu" matched no target's ``unsupported`` entry, so kv_b_proj (which vLLM drops) was allowed.
    with pytest.raises(UsageError, match="unknown sampler backend 'vllm-gpu'"):
        MLA.resolve(["kv_b_proj"], sampler="vllm-gpu")
    with pytest.raises(UsageError, match="unknown sampler backend 'vlm'"):
        MLA.resolve(sampler="vlm")
    with pytest.raises(ValueError, match=r"unknown sampler backends \['vllm_cpu'\]"):
        LoraTarget("self_attn.o_proj", None, "attention", unsupported={"vllm_cpu": "a typo"})
    named = {sampler_backend(d) for d in ("cpu", "cuda")}
    assert named <= set(SAMPLER_BACKENDS) and MLA.resolve(sampler="vllm")


def test_the_sampler_policy_applies_to_expanded_names():
    # "linear_fc1" includes the routed experts, which vLLM's CPU build does not apply.
    with pytest.raises(UnsupportedTargetError, match="mlp.experts.gate_up_proj"):
        MLA.resolve(["linear_fc1"], sampler="vllm-cpu")
    assert MLA.resolve(["linear_fc1"], sampler="vllm") == [
        "mlp.gate_proj",
        "mlp.up_proj",
        "shared_experts.gate_proj",
        "shared_experts.up_proj",
        "mlp.experts.gate_up_proj",
    ]


def test_sizes_and_engine_kwargs_take_user_names(tmp_path):
    short = family_sizes(glm5.FAMILY, full=False, rank=4, targets=["q_a_proj", "o_proj"])
    qualified = family_sizes(glm5.FAMILY, full=False, rank=4, targets=["self_attn.q_a_proj", "self_attn.o_proj"])
    assert short.public_tensors == qualified.public_tensors > 0
    kw = vllm_engine_kwargs(glm4.FAMILY, tmp_path, lora_targets=["linear_qkv", "o_proj"], device="cpu")
    assert kw["lora_target_modules"] == ["qkv_proj", "o_proj"]
