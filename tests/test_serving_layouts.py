"""The routed experts' serving layouts (``skyrl_glm.sync.expert_layout``) against vLLM's own loader code.

vLLM's CPU build cannot run routed-expert LoRA, but the code that turns a loaded adapter into the tensors its
fused-MoE LoRA slots take runs anywhere (identical in vLLM 0.30 and 0.32): ``PackedLoRALayerWeights.pack_moe`` for
per-expert names, ``LoRAModelManager._convert_3d_to_2d_moe_lora`` for the 3D format, ``pack_moe_stacked`` plus
``FusedMoEWithLoRA._match_expert_dim`` for shared-outer, and a ``FusedMoEWithLoRA`` layer's own slot creation and
``set_lora`` (a layer object without its MoE kernel) for shared-all's slots. Each layout, fed through its vLLM path,
must give the slots exactly what the per-expert names give through theirs. The GPU tests prove the engines (and
their kernels) apply them.
"""

from __future__ import annotations

import itertools
import re
import types

import pytest
import torch

from skyrl_glm.lora.bridge import adapter_config, synthetic_bridge_export
from skyrl_glm.models import glm5
from skyrl_glm.sync import expert_layout as layouts
from skyrl_glm.sync.plan import build_plan
from skyrl_glm.sync.receiver import AdapterReceiver, UpdateRejected
from skyrl_glm.sync.transports.shm import SharedMemoryTransport

RANK = 4
TARGETS = ["self_attn.q_b_proj", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
CONFIG = glm5.tiny_config()
EXPERTS = CONFIG.n_routed_experts
MOE_LAYERS = range(CONFIG.first_k_dense_replace, CONFIG.num_hidden_layers)


def adapter(shared: bool) -> dict[str, torch.Tensor]:
    """A Megatron-Bridge-shaped export (``share_expert_adapters`` = ``shared``) under vLLM's PEFT prefix."""
    stream = synthetic_bridge_export(
        CONFIG, glm5.FAMILY.lora, rank=RANK, targets=TARGETS, share_expert_adapters=shared, seed=1
    )
    return {f"base_model.model.{name}": t for name, t in stream}


def receive(tensors: dict[str, torch.Tensor], layout: str, receiver: AdapterReceiver | None = None, version: int = 1):
    plan = build_plan(tensors, adapter_config=adapter_config(RANK, RANK, TARGETS), lora_name="p", version=version)
    tx = SharedMemoryTransport()
    try:
        rx = receiver or AdapterReceiver(layout=layout)
        return rx.receive(plan.manifest.to_json(), tx.prepare(plan), tx)
    finally:
        tx.release()


def vllm_loras(tensors: dict[str, torch.Tensor]):
    """vLLM's ``LoRAModel`` of these tensors, as its in-memory loader builds it (SkyRL's patch calls the same)."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    helper = PEFTHelper.from_dict(adapter_config(RANK, RANK, TARGETS))
    return LoRAModel.from_lora_tensors(1, dict(tensors), helper, device="cpu", dtype=torch.float32)


def experts_module(layer: int) -> str:
    return f"model.layers.{layer}.mlp.experts"


def expert_loras(model, layer: int) -> list:
    """A loaded model's per-expert LoRAs of one layer in ``pack_moe``'s order: experts.{e}.{gate,down,up}_proj."""
    module = experts_module(layer)
    return [model.loras[f"{module}.{e}.{p}"] for e in range(EXPERTS) for p in ("gate_proj", "down_proj", "up_proj")]


def slots_per_expert(tensors: dict[str, torch.Tensor], layer: int) -> tuple[list, list]:
    """What the per-expert names give vLLM's 2D MoE slots: ``pack_moe`` over experts.{e}.{gate,down,up}_proj."""
    from vllm.lora.lora_weights import PackedLoRALayerWeights

    packed = PackedLoRALayerWeights.pack_moe(expert_loras(vllm_loras(tensors), layer), experts_module(layer))
    return packed.lora_a, packed.lora_b


def slots_stacked_3d(tensors: dict[str, torch.Tensor], layer: int) -> tuple[list, list]:
    """What the 3D tensors give the same slots: vLLM's own 3D -> 2D conversion, run on its loaded model."""
    from vllm.lora.model_manager import LoRAModelManager

    model = vllm_loras(tensors)
    module = types.SimpleNamespace(local_num_experts=EXPERTS, global_num_experts=EXPERTS, ep_rank=0)
    manager = types.SimpleNamespace(
        model=types.SimpleNamespace(config=types.SimpleNamespace(architectures=["GlmMoeDsaForCausalLM"])),
        _get_lora_layer_weights=lambda lora_model, name: lora_model.loras.get(name),
    )
    LoRAModelManager._convert_3d_to_2d_moe_lora(manager, model, module, experts_module(layer))
    lora = model.loras[experts_module(layer)]
    return lora.lora_a, lora.lora_b


def slots_shared_outer(tensors: dict[str, torch.Tensor], layer: int) -> tuple[list, list]:
    """What shared-outer gives them: ``pack_moe_stacked`` over experts.w{1,2,3}, each factor matched to its slot's
    expert-dim as ``set_lora`` does (shared: 1, read by every expert at kernel time; so broadcast here)."""
    from vllm.lora.layers.fused_moe import FusedMoEWithLoRA
    from vllm.lora.lora_weights import PackedLoRALayerWeights

    model = vllm_loras(tensors)
    stacks = [model.loras[f"{experts_module(layer)}.w{i}"] for i in (1, 2, 3)]
    packed = PackedLoRALayerWeights.pack_moe_stacked(stacks, experts_module(layer))
    shared_dims = {"a": (1, EXPERTS, 1), "b": (EXPERTS, 1, EXPERTS)}  # the w1, w2, w3 slots' expert-dims
    out = {}
    for side, factors in (("a", packed.lora_a), ("b", packed.lora_b)):
        matched = []
        for factor, dim in zip(factors, shared_dims[side], strict=True):
            buffer = torch.empty(1, dim)  # _match_expert_dim reads the buffer's dim 1
            got = FusedMoEWithLoRA._match_expert_dim(None, factor, buffer)
            assert got.shape[0] == dim
            matched.append(got.expand(EXPERTS, *got.shape[1:]))
        out[side] = matched
    return out["a"], out["b"]


def fused_moe_layer(shared: bool, layout: str, experts: int = EXPERTS, ep: tuple[int, int] = (1, 0)):
    """A ``FusedMoEWithLoRA`` of the tiny config's MoE shape (``experts`` routed experts, spread over ``ep`` =
    (EP size, this rank)) with its slots made by vLLM's ``create_lora_weights`` inside an engine config of
    ``layout`` (skyrl-glm's vLLM plugin patch installed, as in every engine); no base layer or kernel: the slots
    are what is under test."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.config.lora import LoRAConfig
    from vllm.lora.layers.fused_moe import FusedMoEWithLoRA

    from skyrl_glm.sync.vllm import shared_factors

    shared_factors.install()
    layer = FusedMoEWithLoRA.__new__(FusedMoEWithLoRA)
    torch.nn.Module.__init__(layer)
    layer.moe_config = types.SimpleNamespace(
        hidden_dim=CONFIG.hidden_size,
        num_local_experts=experts // ep[0],
        num_experts=experts,
        intermediate_size_per_partition=CONFIG.moe_intermediate_size,
        experts_per_token=CONFIG.num_experts_per_tok,
        moe_parallel_config=types.SimpleNamespace(use_ep=ep[0] > 1, ep_rank=ep[1]),
    )
    layer.tp_size, layer.tp_rank, layer.device, layer._w13_slices = 1, 0, torch.device("cpu"), 2
    layer._enable_aux_cuda_stream, layer._lora_stream, layer._events = False, None, None
    lora = LoRAConfig(max_lora_rank=8, max_loras=2, enable_moe_shared_loras=shared, lora_dtype=torch.float32)  # >= RANK
    extra = layouts.engine_arguments(layout).get("additional_config", {})
    with set_current_vllm_config(VllmConfig(lora_config=lora, additional_config=extra)):
        layer.create_lora_weights(2, lora)
    return layer


SLOT_NAMES = ("w13_lora_a_stacked", "w13_lora_b_stacked", "w2_lora_a_stacked", "w2_lora_b_stacked")


def slots_set(layer, lora_a: list, lora_b: list) -> list[torch.Tensor]:
    """``set_lora`` into slot 1, then what the kernels read of that slot: every factor ``[E, ...]`` (a stride-0
    view where one slot serves all experts, as the shared layouts hand their kernels)."""
    layer.set_lora(1, lora_a, lora_b)
    return [t[1].expand(EXPERTS, *t.shape[2:]) for name in SLOT_NAMES for t in getattr(layer, name)]


def slot_bytes(layer) -> int:
    return sum(t.untyped_storage().nbytes() for name in SLOT_NAMES for t in getattr(layer, name))


def assert_same_slots(got: tuple[list, list], want: tuple[list, list]) -> None:
    for side, (g, w) in enumerate(zip(got, want, strict=True)):
        for i, (x, y) in enumerate(zip(g, w, strict=True)):
            assert x.shape == y.shape, (side, i, x.shape, y.shape)
            assert torch.equal(x, y), (side, i)


@pytest.mark.parametrize("shared", [True, False])
def test_stacked_3d_fills_vllm_slots_as_the_per_expert_names_do(shared: bool) -> None:
    tensors = adapter(shared)
    per_expert = receive(tensors, layouts.PER_EXPERT).tensors
    stacked = receive(tensors, layouts.STACKED_3D).tensors
    for layer in MOE_LAYERS:
        assert_same_slots(slots_stacked_3d(stacked, layer), slots_per_expert(per_expert, layer))
    others = [n for n in per_expert if ".mlp.experts." not in n]
    assert len(stacked) == len(others) + 4 * len(MOE_LAYERS)  # four tensors per MoE layer instead of 12 * E names


def test_shared_outer_fills_vllm_slots_as_the_per_expert_names_do() -> None:
    tensors = adapter(shared=True)
    per_expert = receive(tensors, layouts.PER_EXPERT).tensors
    shared = receive(tensors, layouts.SHARED_OUTER).tensors
    for layer in MOE_LAYERS:
        assert_same_slots(slots_shared_outer(shared, layer), slots_per_expert(per_expert, layer))
        w1_a = shared[f"base_model.model.{experts_module(layer)}.w1.lora_A.weight"]
        w1_b = shared[f"base_model.model.{experts_module(layer)}.w1.lora_B.weight"]
        assert w1_a.shape[0] == 1 and w1_b.shape[0] == EXPERTS and w1_b.stride(0) == 0  # one broadcast, no copies


def test_shared_all_fills_vllm_slots_as_the_per_expert_names_do_in_a_fraction_of_the_memory() -> None:
    tensors = adapter(shared=True)
    per_expert = receive(tensors, layouts.PER_EXPERT).tensors
    shared = receive(tensors, layouts.SHARED_ALL).tensors
    assert set(shared) == set(receive(tensors, layouts.SHARED_OUTER).tensors)  # shared-outer's tensors, as said
    from vllm.lora.lora_weights import PackedLoRALayerWeights

    layer = MOE_LAYERS[0]
    stacks = [vllm_loras(shared).loras[f"{experts_module(layer)}.w{i}"] for i in (1, 2, 3)]
    packed = PackedLoRALayerWeights.pack_moe_stacked(stacks, experts_module(layer))
    want_layer = fused_moe_layer(shared=False, layout=layouts.PER_EXPERT)
    want = slots_set(want_layer, *slots_per_expert(per_expert, layer))
    got_layer = fused_moe_layer(shared=True, layout=layouts.SHARED_ALL)
    got = slots_set(got_layer, packed.lora_a, packed.lora_b)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert all(t.shape[1] == 1 or t.stride(1) == 0 for name in SLOT_NAMES for t in getattr(got_layer, name))  # one slot
    assert slot_bytes(got_layer) * EXPERTS == slot_bytes(want_layer)  # each factor once instead of once per expert
    outer = fused_moe_layer(shared=True, layout=layouts.SHARED_OUTER)  # vLLM's own: two factors of four shared
    assert slot_bytes(got_layer) < slot_bytes(outer) < slot_bytes(want_layer)
    assert got_layer.w2_lora_a_stacked[0].stride(1) == 0 and outer.w2_lora_a_stacked[0].stride(1) != 0
    got_layer.reset_lora(1)  # vLLM's reset writes through the storage too
    assert not any(t[1].any() for name in SLOT_NAMES for t in getattr(got_layer, name))


def test_shared_all_refuses_an_adapter_whose_experts_differ_in_a_factor_shared_outer_keeps_per_expert() -> None:
    tensors = adapter(shared=True)
    name = f"base_model.model.{experts_module(MOE_LAYERS[0])}.2.up_proj.lora_B.weight"
    tensors[name] = tensors[name] + 1e-3
    assert receive(tensors, layouts.SHARED_OUTER).tensors  # lora_B of gate/up has a slot per expert there
    with pytest.raises(UpdateRejected, match=r"shared-all: .*experts expert 2 has another up_proj.lora_B"):
        receive(tensors, layouts.SHARED_ALL)


@pytest.mark.parametrize("layout", [layouts.STACKED_3D, layouts.SHARED_OUTER, layouts.SHARED_ALL])
def test_other_targets_pass_through_bit_exact(layout: str) -> None:
    tensors = adapter(shared=True)
    per_expert = receive(tensors, layouts.PER_EXPERT).tensors
    got = receive(tensors, layout).tensors
    others = {n: t for n, t in per_expert.items() if ".mlp.experts." not in n}
    assert others and all(torch.equal(got[n], t) for n, t in others.items())
    assert not any(".mlp.experts." in n and ".experts.0." in n for n in got)  # no per-expert name left


def test_shared_outer_refuses_an_adapter_whose_experts_differ_and_the_previous_version_stays() -> None:
    rx = AdapterReceiver(layout=layouts.SHARED_OUTER)
    first = receive(adapter(shared=True), layouts.SHARED_OUTER, rx, version=1)
    rx.commit(first.version)
    known = rx.known
    with pytest.raises(UpdateRejected, match=r"shared-outer: .*experts expert 1 has another gate_proj.lora_A"):
        receive(adapter(shared=False), layouts.SHARED_OUTER, rx, version=2)
    assert rx.version == 1 and rx.known is known


def test_shared_outer_compares_values_when_the_sender_sent_equal_copies() -> None:
    tensors = adapter(shared=True)
    name = f"base_model.model.{experts_module(MOE_LAYERS[0])}.3.gate_proj.lora_A.weight"
    tensors[name] = tensors[name].clone()  # equal values, another storage: the sender's dedup still aliases it
    assert receive(tensors, layouts.SHARED_OUTER).tensors
    tensors[name] = tensors[name] + 1e-3
    with pytest.raises(UpdateRejected, match="expert 3 has another gate_proj.lora_A"):
        receive(tensors, layouts.SHARED_OUTER)


def test_stacked_3d_refuses_gate_and_up_with_different_lora_a() -> None:
    tensors = adapter(shared=False)
    name = f"base_model.model.{experts_module(MOE_LAYERS[0])}.2.up_proj.lora_A.weight"
    tensors[name] = tensors[name] + 1.0
    with pytest.raises(UpdateRejected, match="stacked-3d: .* expert 2 has different gate_proj and up_proj lora_A"):
        receive(tensors, layouts.STACKED_3D)


def test_a_stacked_layout_refuses_an_expert_missing() -> None:
    tensors = adapter(shared=False)
    for ab in "AB":
        del tensors[f"base_model.model.{experts_module(MOE_LAYERS[0])}.1.down_proj.lora_{ab}.weight"]
    with pytest.raises(UpdateRejected, match=r"down_proj.lora_A misses experts \[1\]"):
        receive(tensors, layouts.STACKED_3D)


def test_the_engine_arguments_decide_the_layout() -> None:
    assert layouts.layout_of({}) == layouts.PER_EXPERT
    for layout in (*layouts.NAMED, GROUPED):
        assert layouts.layout_of(layouts.engine_arguments(layout)) == layout
        assert layouts.layout_of(types.SimpleNamespace(**layouts.engine_arguments(layout))) == layout
    assert layouts.request_fields(layouts.STACKED_3D) == {"is_3d_lora_weight": True}
    assert layouts.request_fields(layouts.SHARED_OUTER) == {}
    with pytest.raises(layouts.LayoutError, match="exclusive"):
        layouts.layout_of({"enable_moe_shared_loras": True, "enable_mixed_moe_lora_format": True})
    with pytest.raises(layouts.LayoutError, match="unknown expert layout 'stacked'"):
        layouts.engine_arguments("stacked")


def test_shared_all_is_shared_outer_with_an_additional_config_entry_merged_into_the_users() -> None:
    args = layouts.engine_arguments(layouts.SHARED_ALL, {"additional_config": {"mine": 1}})
    assert args == {
        "enable_mixed_moe_lora_format": False,
        "enable_moe_shared_loras": True,
        "additional_config": {"mine": 1, layouts.ADDITIONAL_CONFIG_KEY: layouts.SHARED_ALL},
    }
    lora = types.SimpleNamespace(enable_moe_shared_loras=True)  # inside a worker: its VllmConfig
    assert layouts.layout_of(types.SimpleNamespace(lora_config=lora, additional_config=args["additional_config"])) == (
        layouts.SHARED_ALL
    )
    assert layouts.layout_of(types.SimpleNamespace(lora_config=lora, additional_config={})) == layouts.SHARED_OUTER
    off = types.SimpleNamespace(enable_moe_shared_loras=False)  # the entry alone changes nothing
    assert layouts.layout_of(types.SimpleNamespace(lora_config=off, additional_config=args["additional_config"])) == (
        layouts.PER_EXPERT
    )
    with pytest.raises(layouts.LayoutError, match="additional_config must be a mapping .* got int"):
        layouts.engine_arguments(layouts.SHARED_ALL, {"additional_config": 5})
    layer = fused_moe_layer(shared=True, layout=layouts.SHARED_OUTER)  # the plugin's patch is off there
    assert layer.w13_lora_b_stacked[0].stride(1) != 0


GROUPED = f"{layouts.GROUPED}:2"  # two groups of two consecutive experts in the tiny config


def grouped_adapter(groups: int) -> dict[str, torch.Tensor]:
    """A per-expert export whose experts agree inside each of ``groups`` groups of consecutive experts (what
    ``share_expert_adapters`` trains under expert parallelism): every expert shows its group's first expert's
    tensors, the groups differ."""
    tensors = adapter(shared=False)
    size = EXPERTS // groups
    for name in list(tensors):
        m = re.search(r"\.experts\.(\d+)\.", name)
        if m and int(m[1]) % size:
            tensors[name] = tensors[name.replace(f".experts.{m[1]}.", f".experts.{int(m[1]) - int(m[1]) % size}.")]
    return tensors


def packed_stacks(tensors: dict[str, torch.Tensor], layer: int) -> tuple[list, list]:
    """What vLLM's loader hands ``set_lora`` for ``experts.w{1,2,3}`` stacks (shared-outer's path)."""
    from vllm.lora.lora_weights import PackedLoRALayerWeights

    stacks = [vllm_loras(tensors).loras[f"{experts_module(layer)}.w{i}"] for i in (1, 2, 3)]
    packed = PackedLoRALayerWeights.pack_moe_stacked(stacks, experts_module(layer))
    return packed.lora_a, packed.lora_b


class ReferenceMoeLora:
    """What vLLM's fused-MoE LoRA kernels compute, in torch (its CPU build has none), for LoRA slot ``slot``: each
    (token, k) pair bucketed by ``expert_map[topk_id]`` (the id itself without a map) and multiplied through that
    id's factors; an id outside the slots' expert-dim is an error (a kernel would read memory that is not its
    expert's). ``add_lora_w2`` takes gate/up's ids, as vLLM's down projection does."""

    def __init__(self, slot: int) -> None:
        self.slot = slot

    def add_lora_w13(self, y, x, lora_a, lora_b, topk_ids, topk_weights, expert_map, *rest, **kwargs):
        ids = (topk_ids if expert_map is None else expert_map[topk_ids.long()]).long()
        assert 0 <= int(ids.min()) and int(ids.max()) < lora_a[0].shape[1], (ids, lora_a[0].shape)
        out = y.view(x.shape[0], topk_ids.shape[1], -1)
        for s, (a, b) in enumerate(zip(lora_a, lora_b, strict=True)):
            delta = torch.einsum("tkir,tkrh,th->tki", b[self.slot][ids], a[self.slot][ids], x)
            out[..., s * delta.shape[-1] : (s + 1) * delta.shape[-1]] += delta
        return None, ids, None, None

    def add_lora_w2(self, y, x, lora_a, lora_b, topk_weights, sorted_ids, ids, *rest, **kwargs):
        a, b = lora_a[0][self.slot][ids], lora_b[0][self.slot][ids]
        y += topk_weights[..., None] * torch.einsum("tkhr,tkri,tki->tkh", b, a, x)


def moe_lora_delta(layer, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """gate/up and down LoRA deltas of LoRA slot 1 for random tokens through vLLM's own ``LoRAExpertsMixin``
    halves (as patched by the plugin), on the context the layer builds for its kernels."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.experts.lora_experts_mixin import LoRAExpertsMixin

    gen = torch.Generator().manual_seed(seed)
    tokens, k, hidden, inter = 16, CONFIG.num_experts_per_tok, CONFIG.hidden_size, CONFIG.moe_intermediate_size
    x = torch.randn(tokens, hidden, generator=gen)
    topk_ids = torch.stack([torch.randperm(layer.global_num_experts, generator=gen)[:k] for _ in range(tokens)])
    topk_weights = torch.rand(tokens, k, generator=gen)
    layer.punica_wrapper = ReferenceMoeLora(slot=1)
    context = layer._build_lora_context()
    experts = types.SimpleNamespace(moe_config=types.SimpleNamespace(activation=MoEActivation.SILU))
    gate_up = torch.zeros(tokens * k, 2 * inter)
    _, ids, _, _ = LoRAExpertsMixin.apply_w13_lora(
        experts, context, y=gate_up, x=x, topk_ids=topk_ids, topk_weights=topk_weights, expert_map=None,
        w1=None, w2=None, num_tokens=tokens, top_k_num=k,
    )  # fmt: skip
    down = torch.zeros(tokens, k, hidden)
    LoRAExpertsMixin.apply_w2_lora(
        experts, context, y=down, x=torch.randn(tokens, k, inter, generator=gen), topk_weights=topk_weights,
        sorted_token_ids_lora=None, expert_ids_lora=ids, num_tokens_post_padded_lora=None, token_lora_mapping=None,
        num_tokens=tokens, w1=None, w2=None, top_k_num=k,
    )  # fmt: skip
    return gate_up, down


def test_grouped_keeps_each_factor_once_per_group_and_maps_each_expert_to_its_group() -> None:
    tensors = grouped_adapter(2)
    per_expert = receive(tensors, layouts.PER_EXPERT).tensors
    grouped = receive(tensors, GROUPED).tensors
    layer = MOE_LAYERS[0]
    received = {t.untyped_storage().data_ptr() for t in grouped.values()}
    assert len(received) == 1  # every factor stack a view of the received stream: nothing copied
    for i, ab in itertools.product((1, 2, 3), "AB"):
        assert grouped[f"base_model.model.{experts_module(layer)}.w{i}.lora_{ab}.weight"].shape[0] == 2
    want_layer = fused_moe_layer(shared=False, layout=layouts.PER_EXPERT)
    want = slots_set(want_layer, *slots_per_expert(per_expert, layer))
    got_layer = fused_moe_layer(shared=True, layout=GROUPED)
    got_layer.set_lora(1, *packed_stacks(grouped, layer))
    expert_map = got_layer._skyrl_glm_expert_map
    assert expert_map.tolist() == [0, 0, 1, 1] and expert_map.dtype == torch.int32
    slots = [t for name in SLOT_NAMES for t in getattr(got_layer, name)]
    assert all(t.shape[1] == 2 and t.stride(1) != 0 for t in slots)  # storage per group, no view over the experts
    assert all(torch.equal(t[1][expert_map.long()], w) for t, w in zip(slots, want, strict=True))
    assert slot_bytes(got_layer) * EXPERTS == slot_bytes(want_layer) * 2  # each factor once per group
    shared_all = fused_moe_layer(shared=True, layout=layouts.SHARED_ALL)
    assert slot_bytes(shared_all) * 2 == slot_bytes(got_layer)  # shared-all: the same storage at G=1
    got_layer.reset_lora(1)
    assert not any(t[1].any() for t in slots)


def test_grouped_kernels_compute_what_the_per_expert_slots_compute_and_a_wrong_map_does_not() -> None:
    tensors = grouped_adapter(2)
    layer = MOE_LAYERS[0]
    want_layer = fused_moe_layer(shared=False, layout=layouts.PER_EXPERT)
    want_layer.set_lora(1, *slots_per_expert(receive(tensors, layouts.PER_EXPERT).tensors, layer))
    got_layer = fused_moe_layer(shared=True, layout=GROUPED)
    got_layer.set_lora(1, *packed_stacks(receive(tensors, GROUPED).tensors, layer))
    want, got = moe_lora_delta(want_layer), moe_lora_delta(got_layer)
    assert want[0].abs().sum() > 0 and want[1].abs().sum() > 0
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    got_layer._skyrl_glm_expert_map = torch.tensor([0, 1, 0, 1], dtype=torch.int32)  # interleaved, not consecutive
    assert not torch.allclose(moe_lora_delta(got_layer)[0], want[0])
    got_layer._skyrl_glm_expert_map = torch.arange(4, dtype=torch.int32)  # no map: expert ids past the 2 groups
    with pytest.raises(AssertionError):
        moe_lora_delta(got_layer)


@pytest.mark.parametrize(
    ("experts", "ep", "layout", "expert_map", "served"),
    [
        # EP 4 ranks of 2 experts, 2 groups of 4: rank 1 lies inside group 0 (one group: a stride-0 view, no map)
        (8, (4, 1), "grouped:2", None, [0]),
        # EP 2 ranks of 4 experts, 4 groups of 2: rank 1 holds groups 2 and 3
        (8, (2, 1), "grouped:4", [-1, -1, -1, -1, 0, 0, 1, 1], [2, 3]),
        # EP 2 ranks of 6 experts, 3 groups of 4: rank 1 holds experts 6..11, the end of group 1 and group 2
        (12, (2, 1), "grouped:3", [-1] * 6 + [0, 0, 1, 1, 1, 1], [1, 2]),
        # shared-all under EP: one group everywhere
        (8, (2, 1), layouts.SHARED_ALL, None, [0]),
    ],
)
def test_grouped_slots_under_expert_parallelism(experts, ep, layout, expert_map, served) -> None:
    layer = fused_moe_layer(shared=True, layout=layout, experts=experts, ep=ep)
    groups = layouts.expert_groups(layout)
    assert getattr(layer, "_skyrl_glm_expert_map", None) is None or layer._skyrl_glm_expert_map.tolist() == expert_map
    if expert_map is None:  # one local group: every expert's slot a stride-0 view of the group's storage
        assert layer.w13_lora_b_stacked[0].shape[1] == experts // ep[0] and layer.w13_lora_b_stacked[0].stride(1) == 0
    a_shapes = [
        t.shape[2:] for t in (*layer.w13_lora_a_stacked[:1], *layer.w2_lora_a_stacked, layer.w13_lora_a_stacked[1])
    ]
    b_shapes = [
        t.shape[2:] for t in (*layer.w13_lora_b_stacked[:1], *layer.w2_lora_b_stacked, layer.w13_lora_b_stacked[1])
    ]
    stack = lambda shape: torch.arange(groups, dtype=torch.float32).add(1).view(-1, 1, 1).expand(groups, *shape)  # noqa: E731
    layer.set_lora(1, [stack(s) for s in a_shapes], [stack(s) for s in b_shapes])  # group g's factors hold g + 1
    for name in SLOT_NAMES:
        for t in getattr(layer, name):
            held = t[1].amax(dim=(1, 2)).tolist()
            assert sorted(set(held)) == [g + 1 for g in served], (name, held)


def test_grouped_refuses_an_adapter_whose_experts_differ_inside_a_group_and_the_previous_version_stays() -> None:
    rx = AdapterReceiver(layout=GROUPED)
    first = receive(grouped_adapter(2), GROUPED, rx, version=1)
    rx.commit(first.version)
    tensors = grouped_adapter(2)
    name = f"base_model.model.{experts_module(MOE_LAYERS[0])}.3.up_proj.lora_B.weight"
    tensors[name] = tensors[name] + 1e-3
    with pytest.raises(UpdateRejected, match=r"grouped:2: .*experts expert 3 has another up_proj.lora_B than expert 2"):
        receive(tensors, GROUPED, rx, version=2)
    assert rx.version == 1
    with pytest.raises(UpdateRejected, match=r"grouped:3: .*experts has 4 experts, not 3 equal groups"):
        receive(grouped_adapter(2), "grouped:3")
    assert receive(grouped_adapter(4), "grouped:4").tensors  # one expert per group: any per-expert adapter


def test_grouped_is_asked_for_like_shared_all_and_read_back_with_its_groups() -> None:
    args = layouts.engine_arguments("grouped:64")
    assert args["enable_moe_shared_loras"] and args["additional_config"] == {
        layouts.ADDITIONAL_CONFIG_KEY: "grouped:64"
    }
    assert layouts.layout_of(args) == "grouped:64" and layouts.expert_groups("grouped:64") == 64
    assert layouts.expert_groups(layouts.SHARED_ALL) == 1 and layouts.expert_groups(layouts.SHARED_OUTER) is None
    for bad in ("grouped", "grouped:0", "grouped:x", "grouped:-1", "grouped:4.0", "grouped:99999999", "grouped:٣"):
        with pytest.raises(layouts.LayoutError, match="unknown expert layout"):
            layouts.engine_arguments(bad)
    asked = types.SimpleNamespace(lora_config=types.SimpleNamespace(enable_moe_shared_loras=True))
    asked.additional_config = {layouts.ADDITIONAL_CONFIG_KEY: "grouped:nope"}  # not a layout: vLLM's shared-outer
    assert layouts.layout_of(asked) == layouts.SHARED_OUTER


@pytest.mark.parametrize("layout", [layouts.SHARED_ALL, GROUPED])
def test_the_slot_replay_repeats_vllms_writes_into_a_shared_or_grouped_layer(layout: str) -> None:
    """vLLM's ``set_lora`` of a received adapter into this layout's ``FusedMoEWithLoRA`` (through the plugin's
    patch) is recorded once and replayed for another version at another slot: every write replayable (each factor
    reaches its slot as a view, whatever expert-dim the receiver hands it with), and the replayed slot holds what
    vLLM's own ``set_lora`` writes there."""
    from skyrl_glm.sync.vllm.slot_replay import _Recorder, slot_tensors

    layer = MOE_LAYERS[0]
    groups = 1 if layout == layouts.SHARED_ALL else 2

    def factors(seed: int) -> tuple[list, list]:
        tensors = grouped_adapter(groups) if groups > 1 else adapter(shared=True)
        tensors = {n: t * (seed + 1) for n, t in tensors.items()}  # another version: other values
        return packed_stacks(receive(tensors, layout).tensors, layer)

    moe = fused_moe_layer(shared=True, layout=layout)
    first = factors(0)
    recorder = _Recorder(slot_tensors({"experts": moe}, 2), [*first[0], *first[1]], 0)
    with recorder:
        moe.set_lora(0, *first)
    recording = recorder.recording()  # NotReplayable: a factor reached its slot other than as a view
    second = factors(1)
    recording.replay(1, [*second[0], *second[1]])
    replayed = [t[1].clone() for name in SLOT_NAMES for t in getattr(moe, name)]
    moe.set_lora(1, *second)
    written = [t[1] for name in SLOT_NAMES for t in getattr(moe, name)]
    assert all(torch.equal(r, w) for r, w in zip(replayed, written, strict=True))
    assert any(r.any() for r in replayed)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-adapter", "own-adapters"])
def test_per_expert_factors_are_packed_as_views_of_the_update_and_fill_the_slots_alike(shared: bool) -> None:
    """vLLM's ``pack_moe`` stacks every expert's factors into fresh tensors per adapter version (on the GPU, with
    the in-memory load, beside the engine's budget); skyrl-glm's plugin hands it views of the received update
    instead: a broadcast view where every expert shows one tensor (Bridge's shared adapter), a strided one where the
    sender laid a factor's experts back to back. The slots get what vLLM's own packing gives them."""
    from vllm.lora.lora_weights import PackedLoRALayerWeights as Packed

    from skyrl_glm.sync.vllm import expert_views

    expert_views.install()
    own = Packed._skyrl_glm_expert_views  # vLLM's pack_moe, as the plugin found it
    received = receive(adapter(shared), layouts.PER_EXPERT).tensors
    update = {t.untyped_storage().data_ptr() for t in received.values()}
    model = vllm_loras(received)
    for layer in MOE_LAYERS:
        loras = expert_loras(model, layer)
        got, want = Packed.pack_moe(loras, experts_module(layer)), own(Packed, loras, experts_module(layer))
        assert_same_slots((got.lora_a, got.lora_b), (want.lora_a, want.lora_b))
        factors = (*got.lora_a, *got.lora_b)
        assert all(t.untyped_storage().data_ptr() in update for t in factors)  # no copy: the update's memory
        assert all((t.stride(0) == 0) == shared for t in factors)
        assert not any(t.untyped_storage().data_ptr() in update for t in (*want.lora_a, *want.lora_b))
        views, copies = fused_moe_layer(False, layouts.PER_EXPERT), fused_moe_layer(False, layouts.PER_EXPERT)
        written = slots_set(views, got.lora_a, got.lora_b), slots_set(copies, want.lora_a, want.lora_b)
        assert all(torch.equal(g, w) for g, w in zip(*written, strict=True))


def test_a_factor_without_a_view_of_its_experts_is_stacked_as_vllm_does() -> None:
    """Rows that overlap, run backwards, sit in other storages or differ in kind have no view; a LoRA vLLM would
    scale in place (``scaling`` != 1) is packed by vLLM's own code, a copy the scaling cannot reach the update
    through."""
    from vllm.lora.lora_weights import PackedLoRALayerWeights as Packed

    from skyrl_glm.sync.vllm import expert_views

    base = torch.arange(48.0).reshape(12, 4)
    assert expert_views.stacked_view([base[0:2], base[1:3]]) is None  # overlapping
    assert expert_views.stacked_view([base[4:6], base[2:4], base[0:2]]) is None  # backwards
    assert expert_views.stacked_view([base[0:2], base[0:2].clone()]) is None  # another storage
    assert expert_views.stacked_view([base[0:2], base[2:4].double()]) is None
    assert expert_views.stacked_view([base[0:2, :2], base[2:4, :2]]) is None  # rows apart but not contiguous
    strided = expert_views.stacked_view([base[0:2], base[4:6], base[8:10]])
    assert strided is not None and torch.equal(strided, torch.stack([base[0:2], base[4:6], base[8:10]]))
    assert strided.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    expert_views.install()
    received = receive(adapter(True), layouts.PER_EXPERT).tensors
    model = vllm_loras(received)
    layer = MOE_LAYERS[0]
    loras = expert_loras(model, layer)
    loras[0].scaling = 2.0
    packed = Packed.pack_moe(loras, experts_module(layer))
    update = {t.untyped_storage().data_ptr() for t in received.values()}
    assert not any(t.untyped_storage().data_ptr() in update for t in (*packed.lora_a, *packed.lora_b))
