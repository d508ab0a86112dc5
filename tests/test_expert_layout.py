"""Routed-expert LoRA published in vLLM's per-expert layout (skyrl_glm.lora.experts), on a real PEFT model (CPU).

The algebra is checked against PEFT's own delta: for every expert, ``B_e @ A_e`` of the published per-expert tensors
(times alpha / r) must equal the delta PEFT adds to that expert's fused parameter. A publisher that skips the
conversion (PEFT's ``[r*E, d1]`` tensors cut per expert as if they were vLLM's 3D layout) is shown to differ.
"""

from __future__ import annotations

import pytest
import torch

from skyrl_glm.check.trainer_hf import HfPeftTrainer, require_applied
from skyrl_glm.lora.experts import FUSED_PROJECTIONS, fused_expert_loras, vllm_adapter_config
from skyrl_glm.models.tiny import make_tiny
from skyrl_glm.plugins import registry
from skyrl_glm.usage import UsageError

ROUTED = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


@pytest.fixture(scope="module", params=["glm-4.5", "glm-5.3"])
def trainer(request, tmp_path_factory) -> HfPeftTrainer:
    family = registry().model(request.param)
    model_dir = make_tiny(family, tmp_path_factory.mktemp(request.param))
    t = HfPeftTrainer(str(model_dir), targets=["self_attn.o_proj"], target_parameters=ROUTED, rank=4, alpha=8)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in t.model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen))  # B == 0 at init would make every check vacuous
    return t


def _delta(wrapper) -> torch.Tensor:
    return wrapper.get_delta_weight("default")  # [E, d1, d2], the parameter's own layout


def _wrappers(t: HfPeftTrainer) -> dict[str, object]:
    from peft.tuners.lora.layer import ParamWrapper

    return {name: m for name, m in t.model.named_modules() if isinstance(m, ParamWrapper)}


def test_per_expert_views_reproduce_peft_delta(trainer: HfPeftTrainer) -> None:
    adapter = trainer.adapter()
    fused = fused_expert_loras(trainer.model)
    assert len(fused) == 2 * sum(1 for f in fused if f.param == "down_proj") > 0
    wrappers = _wrappers(trainer)
    scaling = trainer.lora_config["lora_alpha"] / trainer.lora_config["r"]
    for f in fused:
        delta = _delta(wrappers[f.key])
        assert f"{f.key}.lora_A.weight" not in adapter  # the fused names are replaced, not kept beside
        for e in range(f.num_experts):
            names = FUSED_PROJECTIONS[f.param]
            b = torch.cat([adapter[f"{f.experts}.{e}.{n}.lora_B.weight"] for n in names])
            a_list = [adapter[f"{f.experts}.{e}.{n}.lora_A.weight"] for n in names]
            for a in a_list[1:]:
                assert a.data_ptr() == a_list[0].data_ptr()  # gate and up share one A: one sent tensor
            assert a_list[0].shape == (f.rank, f.in_features)
            torch.testing.assert_close(scaling * b @ a_list[0], delta[e], rtol=1e-5, atol=1e-5)


def test_views_share_the_live_parameters(trainer: HfPeftTrainer) -> None:
    """Nothing is copied: a training step on PEFT's tensors is what the next publish sends."""
    params = {p.data_ptr() for p in trainer.model.parameters()}
    storages = {t.untyped_storage().data_ptr() for t in trainer.adapter().values()}
    assert storages <= params


def test_unconverted_layout_is_wrong(trainer: HfPeftTrainer) -> None:
    """Negative control: PEFT's fused tensors cut per expert as vLLM's 3D loader reads them (A as (E, r, in), B as
    (out, r, E)) do not give PEFT's delta, so publishing them unconverted trains one policy and serves another."""
    from peft import get_peft_model_state_dict

    raw = get_peft_model_state_dict(trainer.model)
    wrappers = _wrappers(trainer)
    f = fused_expert_loras(trainer.model)[0]
    a = raw[f"{f.key}.lora_A.weight"].view(f.num_experts, f.rank, -1)
    b = raw[f"{f.key}.lora_B.weight"].view(-1, f.rank, f.num_experts)
    scaling = trainer.lora_config["lora_alpha"] / trainer.lora_config["r"]
    naive = scaling * b[:, :, 0] @ a[0]
    delta = _delta(wrappers[f.key])[0]
    torch.testing.assert_close(naive, delta.T, rtol=1e-5, atol=1e-5)  # unconverted, vLLM would apply the transpose
    assert naive.shape != delta.shape or (naive - delta).abs().max() > 1e-2


def test_config_names_per_expert_modules(trainer: HfPeftTrainer) -> None:
    config = vllm_adapter_config(trainer.model.peft_config["default"].to_dict(), fused_expert_loras(trainer.model))
    assert {"gate_proj", "up_proj", "down_proj", "self_attn.o_proj"} <= set(config["target_modules"])
    assert config["target_parameters"] is None
    assert trainer.lora_config == config


def test_a_dropped_target_is_an_error(trainer: HfPeftTrainer) -> None:
    """PEFT 0.21 rewrites GLM MoE targets and drops the shared experts without a word: the trainer refuses."""
    require_applied(trainer.model, ["self_attn.o_proj"], ROUTED)  # what was asked and applied
    with pytest.raises(UsageError, match=r"applied no LoRA to the targets \['shared_experts.gate_proj'\]"):
        require_applied(trainer.model, ["self_attn.o_proj", "shared_experts.gate_proj"], ROUTED)
    with pytest.raises(UsageError, match="mlp.experts.up_proj"):
        require_applied(trainer.model, [], ["mlp.experts.up_proj"])


def test_another_peft_layout_is_refused(trainer: HfPeftTrainer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ParamWrapper whose dims are not PEFT 0.18.1's (as a newer PEFT lays them out) is refused by name instead of
    being published transposed. The other layout is simulated by swapping the wrapper's recorded dims."""
    name, wrapper = next((n, w) for n, w in _wrappers(trainer).items() if w.in_features != w.out_features)
    d_in, d_out = wrapper.in_features, wrapper.out_features
    monkeypatch.setattr(wrapper, "in_features", d_out)
    monkeypatch.setattr(wrapper, "out_features", d_in)
    with pytest.raises(UsageError, match="peft==0.18.1"):
        fused_expert_loras(trainer.model)
