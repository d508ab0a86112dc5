"""The GLM-5.3-Flash adapter on CPU: what stock vLLM 0.30 applies (its inherited LoRA mapping), the serving
arguments its checkpoints need, the HF+PEFT trainer the check runs on it (through the family's loader, the vision
tower left alone), and the one-line refusal of a vLLM without its model class. The GPU half is test_flash_gpu.py."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from skyrl_glm.models.base import UnsupportedTargetError
from skyrl_glm.plugins import registry
from skyrl_glm.usage import UsageError


@pytest.fixture(scope="module")
def flash_dir(tmp_path_factory: pytest.TempPathFactory):
    from skyrl_glm.models.tiny import make_tiny

    return make_tiny(registry().model("glm-5.3-flash"), tmp_path_factory.mktemp("flash"), seed=0)


def test_stock_vllm_refuses_the_targets_its_flash_mapping_drops() -> None:
    flash, glm53 = registry().model("glm-5.3-flash").lora, registry().model("glm-5.3").lora
    defaults = flash.resolve(sampler="vllm")
    for dropped in ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa", "shared_experts.gate_proj", "mlp.up_proj"):
        assert dropped not in defaults
    assert {"self_attn.q_b_proj", "self_attn.o_proj", "shared_experts.down_proj", "mlp.experts.gate_up_proj"} <= set(
        defaults
    )
    with pytest.raises(UnsupportedTargetError, match="fused_qkv_a_proj"):
        flash.resolve(["q_a_proj"], sampler="vllm")
    with pytest.raises(UnsupportedTargetError, match="gate_up_proj"):
        flash.resolve(["shared_experts.gate_proj"], sampler="vllm")
    # SkyRL's worker wrap maps them; GLM-5.3's own vLLM mapping has them: the refusal is Flash's, on stock vLLM.
    assert "self_attn.q_a_proj" in flash.resolve(sampler="vllm+skyrl")
    assert glm53.resolve(["q_a_proj", "shared_experts.gate_proj"], sampler="vllm")
    with pytest.raises(UnsupportedTargetError, match="kv_b_proj"):
        flash.resolve(["kv_b_proj"], sampler="vllm")
    # under SkyRL's MLA patch (written for Flash) kv_b_proj is left to the check; on GLM-5.3 it was measured ignored
    assert flash.resolve(["kv_b_proj"], sampler="vllm+skyrl") == ["self_attn.kv_b_proj"]
    with pytest.raises(UnsupportedTargetError, match="DSA"):
        glm53.resolve(["kv_b_proj"], sampler="vllm+skyrl")


def test_flash_serving_arguments(flash_dir, tmp_path) -> None:
    from skyrl_glm.models.vllm_targets import vllm_engine_kwargs

    flash = registry().model("glm-5.3-flash")
    kwargs = vllm_engine_kwargs(flash, flash_dir, lora_targets=flash.lora.resolve(sampler="vllm"), device="cuda")
    assert kwargs["limit_mm_per_prompt"] == {"image": 0, "video": 0}
    assert "hf_overrides" not in kwargs  # the tiny config carries the router fields
    assert json.loads((flash_dir / "config.json").read_text())["text_config"]["topk_method"] == "noaux_tc"
    assert kwargs["lora_target_modules"] == ["q_b_proj", "o_proj", "down_proj", "experts"]

    held_out = tmp_path / "no-router"
    shutil.copytree(flash_dir, held_out)
    config = json.loads((held_out / "config.json").read_text())
    del config["text_config"]["topk_method"], config["text_config"]["scoring_func"]
    (held_out / "config.json").write_text(json.dumps(config))
    kwargs = vllm_engine_kwargs(flash, held_out, lora_targets=None, device="cuda")
    assert kwargs["hf_overrides"] == {"text_config": {"topk_method": "noaux_tc", "scoring_func": "sigmoid"}}


def test_flash_trainer_loads_through_its_family_and_leaves_the_vision_tower_alone(flash_dir) -> None:
    from skyrl_glm.check.scorers import hf_trainer

    flash = registry().model("glm-5.3-flash")
    targets = flash.lora.resolve(sampler="vllm")
    trainer = hf_trainer(flash_dir, family=flash, targets=targets, rank=4, alpha=8, device="cpu")
    names = list(trainer.adapter())
    assert names and all(".language_model.layers." in n for n in names), [n for n in names if "language" not in n]
    assert any(".mlp.experts.3.gate_proj.lora_A" in n for n in names)  # routed experts per expert, as vLLM loads
    assert any(".layers.0.self_attn.o_proj." in n for n in names)  # KDA's o_proj: the same vLLM module name
    scores = trainer.score([[8, 9, 10, 11]])
    assert len(scores[0]) == 3 and all(s < 0 for s in scores[0])


def test_a_vllm_without_the_model_class_is_refused_in_one_line() -> None:
    from skyrl_glm.check.scorers import require_vllm_serves

    flash = registry().model("glm-5.3-flash")
    require_vllm_serves(flash)  # the installed vLLM (0.32) has the class, whatever its device
    with pytest.raises(UsageError, match="cannot serve glm-5.3-flash: it has no Glm5NextForNothing"):
        require_vllm_serves(replace(flash, vllm_architecture="Glm5NextForNothing"))
