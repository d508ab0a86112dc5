"""Routed experts inside SkyRL's FSDP worker: SkyRL hands ``lora.target_modules`` to PEFT as modules only, while
transformers 5 keeps routed experts as fused parameters; the worker's LoraConfig must put them in
``target_parameters`` so PEFT trains them, and the sync must export them in the per-expert names vLLM loads."""

from __future__ import annotations

import peft
import pytest
import torch

from skyrl_glm.lora.experts import fused_expert_loras, lora_config_with_expert_parameters, vllm_expert_adapter
from skyrl_glm.models.tiny import make_tiny
from skyrl_glm.plugins import registry

TARGETS = ["q_proj", "o_proj", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def test_routed_expert_names_move_to_target_parameters() -> None:
    config = lora_config_with_expert_parameters(peft.LoraConfig)(r=4, lora_alpha=8, target_modules=TARGETS)
    assert set(config.target_modules) == {"q_proj", "o_proj"}
    assert set(config.target_parameters) == {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}
    plain = lora_config_with_expert_parameters(peft.LoraConfig)(r=4, lora_alpha=8, target_modules=["q_proj"])
    assert not plain.target_parameters


@pytest.mark.parametrize("wrap", [True, False])
def test_peft_trains_the_routed_experts_only_through_the_wrapped_config(tmp_path, wrap: bool) -> None:
    from transformers import AutoModelForCausalLM

    family = registry().model("glm-4.5")
    model = AutoModelForCausalLM.from_pretrained(make_tiny(family, tmp_path / "m"), dtype=torch.float32)
    config_cls = lora_config_with_expert_parameters(peft.LoraConfig) if wrap else peft.LoraConfig
    peft_model = peft.get_peft_model(model, config_cls(r=4, lora_alpha=8, target_modules=TARGETS))
    fused = fused_expert_loras(peft_model)
    if not wrap:  # PEFT alone matches no module by a fused parameter's name: the experts get no adapter
        assert fused == []
        return
    assert fused, "no routed-expert LoRA under the wrapped config"
    adapter = vllm_expert_adapter(peft.get_peft_model_state_dict(peft_model), fused)
    experts = [n for n in adapter if ".mlp.experts." in n]
    n_experts = model.config.n_routed_experts
    assert len({n.split(".mlp.experts.")[1].split(".")[0] for n in experts}) == n_experts
    assert any(n.endswith("gate_proj.lora_A.weight") for n in experts)
    assert any(n.endswith("down_proj.lora_B.weight") for n in experts)
