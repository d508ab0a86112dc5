"""Adapter layouts on real objects: a PEFT adapter on the tiny GLM-5.3 -> each layout -> back, bit-identical."""

from __future__ import annotations

import re

import lora_layouts as L
import pytest
import torch

from skyrl_glm.lora.bridge import bridge_export_specs, synthetic_bridge_export
from skyrl_glm.models import glm5

R = 4
TP = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


@pytest.fixture(scope="module")
def cfg():
    c = glm5.tiny_config()
    c.vocab_size = glm5.FAMILY.tiny_vocab_size
    return c


def _peft_model(cfg, target_parameters, seed=0):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = glm5.FAMILY.build_model(cfg)
    targets = glm5.FAMILY.lora.resolve(sampler="vllm")
    modules = [t for t in targets if not t.startswith("mlp.experts.")]
    pm = get_peft_model(
        model, LoraConfig(r=R, lora_alpha=2 * R, target_modules=modules, target_parameters=target_parameters)
    )
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:  # every tensor distinct and non-zero, so a mix-up cannot go unnoticed
                p.copy_(torch.randn(p.shape, generator=g))
    return pm


@pytest.fixture(scope="module")
def peft_model(cfg):
    return _peft_model(cfg, TP)


@pytest.fixture(scope="module")
def peft_sd(peft_model):
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(peft_model).items()}


def _kw(cfg, tp=TP, layout=L.PEFT_TRANSPOSED):
    return dict(num_experts=cfg.n_routed_experts, target_parameters=tp, fused_layout=layout)


def _assert_identical(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


def test_peft_0181_fused_expert_names_and_shapes(cfg, peft_sd):
    """peft 0.18.1 on transformers 5.x: exact keys and the transposed [r*E, d1] / [d2, r*E] shapes."""
    e, h, i = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
    assert L.installed_peft_fused_layout() == L.PEFT_TRANSPOSED
    p = "base_model.model.model.layers.1.mlp.experts"
    # gate_up_proj param is [E, 2I, H]; peft 0.18 reads it as [E, in=2I, out=H]
    assert tuple(peft_sd[f"{p}.base_layer.lora_A.weight"].shape) == (R * e, 2 * i)
    assert tuple(peft_sd[f"{p}.base_layer.lora_B.weight"].shape) == (h, R * e)
    # down_proj param is [E, H, I]
    assert tuple(peft_sd[f"{p}.lora_A.weight"].shape) == (R * e, h)
    assert tuple(peft_sd[f"{p}.lora_B.weight"].shape) == (i, R * e)
    assert (
        L.detect_fused_layout(peft_sd, target_parameters=TP, hidden_size=h, moe_intermediate_size=i)
        == L.PEFT_TRANSPOSED
    )
    assert "base_model.model.model.layers.1.mlp.shared_experts.gate_proj.lora_A.weight" in peft_sd
    assert "base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight" in peft_sd  # dense MLP kept by 0.18.1


def test_expert_deltas_match_peft_get_delta_weight(cfg, peft_model, peft_sd):
    """Our reading of the fused layout gives PEFT's own per-expert delta, so the orientation is right."""
    from peft.tuners.lora.layer import ParamWrapper

    ours = L.expert_deltas(peft_sd, **_kw(cfg))
    checked = 0
    for name, mod in peft_model.named_modules():
        if isinstance(mod, ParamWrapper):
            head = name.split(".mlp.experts")[0] + ".mlp.experts"
            theirs = mod.get_delta_weight("default") / mod.scaling["default"]
            mine = ours[(head, f"mlp.experts.{mod.parameter_name}")]
            assert theirs.shape == mod.get_param().shape == mine.shape
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
            checked += 1
    assert checked == 2 * (cfg.num_hidden_layers - cfg.first_k_dense_replace)


def test_bridge_names_from_peft(cfg, peft_sd):
    br = L.peft_to_bridge(peft_sd, **_kw(cfg))
    e, h, i = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
    routed = [k for k in br if ".mlp.experts." in k]
    assert len(routed) == 6 * e * (cfg.num_hidden_layers - cfg.first_k_dense_replace)
    pat = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.lora_[AB]\.weight$")
    assert all(pat.match(k) for k in routed)
    assert not any(k.startswith("base_model") for k in br)
    k = "model.layers.2.mlp.experts.3"
    assert tuple(br[f"{k}.gate_proj.lora_A.weight"].shape) == (R, h)
    assert tuple(br[f"{k}.gate_proj.lora_B.weight"].shape) == (i, R)
    assert tuple(br[f"{k}.down_proj.lora_A.weight"].shape) == (R, i)
    assert tuple(br[f"{k}.down_proj.lora_B.weight"].shape) == (h, R)
    # one fc1 adapter: gate and up carry the same A
    assert torch.equal(br[f"{k}.gate_proj.lora_A.weight"], br[f"{k}.up_proj.lora_A.weight"])
    # Bridge's names are exactly what its spec says for these targets
    specs = bridge_export_specs(
        cfg, glm5.FAMILY.lora, rank=R, targets=glm5.FAMILY.lora.resolve(sampler="vllm"), share_expert_adapters=False
    )
    assert sorted(s.name for s in specs) == sorted(br)
    assert all(tuple(br[s.name].shape) == s.shape for s in specs)


@pytest.mark.parametrize("layout", ["bridge", "vllm", "vllm3d"])
def test_round_trip_bit_identical(cfg, peft_sd, layout):
    kw = _kw(cfg)
    to, back = {
        "bridge": (L.peft_to_bridge, L.bridge_to_peft),
        "vllm": (L.peft_to_vllm, L.vllm_to_peft),
        "vllm3d": (L.peft_to_vllm3d, L.vllm3d_to_peft),
    }[layout]
    mid = to(peft_sd, **kw)
    assert sorted(mid) != sorted(peft_sd) or layout == "vllm3d"
    _assert_identical(back(mid, **kw), peft_sd)


def test_bridge_vllm_round_trip(cfg, peft_sd):
    br = L.peft_to_bridge(peft_sd, **_kw(cfg))
    vl = L.bridge_to_vllm(br)
    assert all(k.startswith("base_model.model.model.layers.") for k in vl)
    _assert_identical(L.vllm_to_bridge(vl), br)
    _assert_identical(vl, L.peft_to_vllm(peft_sd, **_kw(cfg)))


def test_vllm3d_matches_vllm_loader_convention(cfg, peft_sd):
    """vLLM's 3D loader (model_manager._convert_3d_to_2d_moe_lora) reshapes A to [E, r, in], B to [out, r, E]
    and splits B's out dim into gate | up. Applying that to our 3D tensors reproduces PEFT's deltas."""
    e = cfg.n_routed_experts
    v3 = L.peft_to_vllm3d(peft_sd, **_kw(cfg))
    deltas = L.expert_deltas(peft_sd, **_kw(cfg))
    head = "base_model.model.model.layers.1.mlp.experts"
    for suffix, param in ((".base_layer", L.GATE_UP), ("", L.DOWN)):
        a = v3[f"{head}{suffix}.lora_A.weight"].reshape(e, -1, v3[f"{head}{suffix}.lora_A.weight"].shape[-1])
        b = v3[f"{head}{suffix}.lora_B.weight"]
        b = b.reshape(b.shape[0], -1, e).permute(2, 0, 1)
        torch.testing.assert_close(torch.bmm(b, a), deltas[(head, param)], rtol=1e-5, atol=1e-5)
    assert v3[f"{head}.base_layer.lora_A.weight"].shape == (R * e, cfg.hidden_size)  # (r*E, H)
    assert v3[f"{head}.base_layer.lora_B.weight"].shape == (2 * cfg.moe_intermediate_size, R * e)  # (2I, r*E)


def test_target_parameters_order_does_not_change_nesting(cfg, peft_sd):
    """PEFT nests the expert wrappers in the module's parameter order (gate_up innermost), not in the order of
    ``target_parameters``: a reversed list gives the same keys and shapes; the rules follow the real object."""
    from peft import get_peft_model_state_dict

    tp = ["mlp.experts.down_proj", "mlp.experts.gate_up_proj"]
    sd = {k: v.detach().clone() for k, v in get_peft_model_state_dict(_peft_model(cfg, tp, seed=3)).items()}
    assert {k: tuple(v.shape) for k, v in sd.items()} == {k: tuple(v.shape) for k, v in peft_sd.items()}
    p = "base_model.model.model.layers.1.mlp.experts"
    assert tuple(sd[f"{p}.base_layer.lora_B.weight"].shape) == (cfg.hidden_size, R * cfg.n_routed_experts)
    assert tuple(sd[f"{p}.lora_B.weight"].shape) == (cfg.moe_intermediate_size, R * cfg.n_routed_experts)  # down
    assert L.expert_wrapper_suffixes(tp) == {L.GATE_UP: ".base_layer", L.DOWN: ""}
    assert L.expert_wrapper_suffixes([L.DOWN]) == {L.DOWN: ""}
    kw = _kw(cfg, tp)
    _assert_identical(L.bridge_to_peft(L.peft_to_bridge(sd, **kw), **kw), sd)
    _assert_identical(L.vllm3d_to_peft(L.peft_to_vllm3d(sd, **kw), **kw), sd)


def test_wrong_orientation_is_caught(cfg, peft_sd):
    """Reading peft 0.18's transposed tensors as standard breaks the gate_up -> down chain: refused."""
    with pytest.raises(L.LayoutError, match="do not chain"):
        L.peft_to_bridge(peft_sd, **_kw(cfg, TP, L.STANDARD))


def test_shared_expert_bridge_export_loads_into_peft(cfg):
    """A Bridge export with one adapter shared by all experts (same tensor under every expert name) becomes a
    PEFT state dict that loads into the real PEFT model and gives every expert the same delta."""
    from peft import set_peft_model_state_dict

    targets = glm5.FAMILY.lora.resolve(sampler="vllm")
    export = list(
        synthetic_bridge_export(cfg, glm5.FAMILY.lora, rank=R, targets=targets, share_expert_adapters=True, seed=5)
    )
    k0 = "model.layers.1.mlp.experts.0.down_proj.lora_B.weight"
    k3 = "model.layers.1.mlp.experts.3.down_proj.lora_B.weight"
    named = dict(export)
    assert named[k0] is named[k3]  # replicated, as Bridge hands it out
    sd = L.bridge_to_peft(export, **_kw(cfg))
    pm = _peft_model(cfg, TP, seed=9)
    res = set_peft_model_state_dict(pm, sd)
    assert not [k for k in res.unexpected_keys if "lora" in k]
    loaded = {k.replace(".default", ""): v for k, v in pm.state_dict().items() if "lora_" in k}
    for k, v in sd.items():
        assert torch.equal(loaded[k], v), k
    deltas = L.expert_deltas(sd, **_kw(cfg))
    for d in deltas.values():
        assert all(torch.equal(d[0], d[j]) for j in range(1, d.shape[0]))
    # and back: the export's values under the export's names
    back = L.peft_to_bridge(sd, **_kw(cfg))
    _assert_identical(back, {k: v for k, v in named.items()})


def test_errors_are_specific(cfg, peft_sd):
    br = L.peft_to_bridge(peft_sd, **_kw(cfg))
    bad = dict(br)
    k = "model.layers.1.mlp.experts.2.up_proj.lora_A.weight"
    bad[k] = bad[k] + 1
    with pytest.raises(L.LayoutError, match="gate_proj and up_proj lora_A differ"):
        L.bridge_to_peft(bad, **_kw(cfg))
    missing = {n: v for n, v in br.items() if ".experts.3." not in n or "layers.1." not in n}
    with pytest.raises(L.LayoutError, match="experts"):
        L.bridge_to_peft(missing, **_kw(cfg))
    with pytest.raises(L.LayoutError, match="PEFT prefix"):
        L.vllm_to_bridge({"model.layers.0.x.lora_A.weight": torch.zeros(1)})
    with pytest.raises(L.LayoutError, match="both"):
        L.peft_to_vllm3d(peft_sd, **_kw(cfg, ["mlp.experts.down_proj"]))
