"""The load memo (:mod:`skyrl_glm.sync.vllm.load_memo`): a version's ``LoRAModel`` cloned from the last one of its
structure is what vLLM's own ``LoRAModel.from_lora_tensors`` builds from its tensors (vLLM's code, on CPU here),
and a model holding anything but the staged tensors gives no template. (On a real engine, through the five-step
check: ``tests/test_slot_replay.py``.)"""

from __future__ import annotations

import torch
from vllm.lora.lora_model import LoRAModel
from vllm.lora.peft_helper import PEFTHelper

from skyrl_glm.sync.vllm.load_memo import (
    VOUCHED,
    Template,
    forget_structure,
    note_structure,
    structure,
    structure_key,
)

CONFIG = {"r": 4, "lora_alpha": 4, "target_modules": ["q_proj", "o_proj"]}


def _tensors(seed: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for layer in range(2):
        for module, (i, o) in {"self_attn.q_proj": (8, 6), "self_attn.o_proj": (6, 8)}.items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            out[f"{prefix}.lora_A.weight"] = torch.randn(4, i, generator=g).to(dtype)
            out[f"{prefix}.lora_B.weight"] = torch.randn(o, 4, generator=g).to(dtype)
    return out


def _build(lora_id: int, tensors: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> LoRAModel:
    peft = PEFTHelper.from_dict(dict(CONFIG))
    return LoRAModel.from_lora_tensors(lora_id, tensors, peft, device="cpu", dtype=dtype)


def _fields(weights) -> dict:
    return {k: v for k, v in vars(weights).items() if k not in ("lora_a", "lora_b")}


def test_a_clone_is_what_vllm_builds_from_the_new_tensors():
    first = _tensors(0)
    template = Template.of(_build(1, first), first)
    assert template is not None
    second = _tensors(1)
    assert structure(second, CONFIG) == structure(first, CONFIG)
    clone, fresh = template.clone(7, second, is_3d=False), _build(7, second)
    assert clone.id == 7 and clone.rank == fresh.rank and set(clone.loras) == set(fresh.loras)
    for name, weights in fresh.loras.items():
        mine = clone.loras[name]
        assert type(mine) is type(weights) and _fields(mine) == _fields(weights)
        assert mine.lora_a is weights.lora_a and mine.lora_b is weights.lora_b  # the staged tensors themselves
    assert all(w.lora_a is None for w, _, _ in template.modules.values())  # no version's tensor is held


def test_a_model_of_converted_factors_gives_no_template():
    staged = _tensors(0, torch.float32)
    assert Template.of(_build(1, staged, dtype=torch.bfloat16), staged) is None  # vLLM cast each: copies


def test_a_structure_the_receiver_vouched_for_keys_the_load_without_reading_the_tensors():
    """The worker notes the receiver's layout identity for what it just staged through SkyRL's loader (which keeps a
    dict of its own); the load's key is then that note (and the config), taken once, for those tensors only;
    anything else reads every tensor's kind."""
    from skyrl.backends.skyrl_train.patches.vllm.patch_lora_in_memory import (
        _STAGED,
        discard_in_memory_adapter,
        stage_in_memory_adapter,
    )

    def staged(name: str, tensors: dict, vouched=(b"layout", "shared-all")) -> dict:
        stage_in_memory_adapter(name, tensors, CONFIG)
        note_structure(name, vouched)
        return _STAGED[name].tensors  # what the load reads: SkyRL's copy of the mapping

    names = [f"test-load-memo@v{v}" for v in range(1, 7)]
    try:
        a, b = staged(names[0], _tensors(0)), staged(names[1], _tensors(1))
        first, second = structure_key(names[0], a, CONFIG), structure_key(names[1], b, CONFIG)
        assert first == second and VOUCHED in first and first != structure(a, CONFIG)
        assert structure_key(names[0], a, CONFIG) == structure(a, CONFIG)  # taken once
        c = staged(names[2], _tensors(0))
        assert structure_key(names[2], _tensors(0), CONFIG) == structure(c, CONFIG)  # other tensors: not its note
        d = staged(names[3], _tensors(0), (b"other", "shared-all"))
        assert structure_key(names[3], d, CONFIG) != first  # another layout identity: another key
        e = staged(names[4], _tensors(0))
        assert structure_key(names[4], e, {**CONFIG, "lora_alpha": 8}) != first  # the config is in the key
        f = staged(names[5], _tensors(0))
        forget_structure(names[5])  # discarded before its load
        assert structure_key(names[5], f, CONFIG) == structure(f, CONFIG)
    finally:
        for name in names:
            discard_in_memory_adapter(name)


def test_the_receiver_vouches_for_a_parsed_layout_in_its_engine_layout():
    """Two updates of one layout get one structure (the second's layout parsed against the first's), a manifest
    built in code none."""
    from skyrl_glm.sync.plan import build_plan
    from skyrl_glm.sync.receiver import AdapterReceiver
    from skyrl_glm.sync.transports import HOST_LOCAL, open_transport

    tensors = _tensors(0)
    transport, receiver, got = open_transport(HOST_LOCAL), AdapterReceiver(), []
    for version in (1, 2):
        plan = build_plan(
            tensors, adapter_config=CONFIG, lora_name="policy", version=version, staging=transport.staging
        )
        handle = transport.prepare(plan)
        transport.stream(plan)
        got.append(receiver.receive(plan.manifest.to_json(), handle, open_transport(HOST_LOCAL)))
        transport.release()
    assert got[0].structure is not None and got[0].structure == got[1].structure
    assert got[0].structure[1] == "per-expert"


def test_aliasing_and_config_are_part_of_the_structure():
    a, b = _tensors(0), _tensors(0)
    shared = next(iter(b))
    b[list(b)[2]] = b[shared]  # two names, one tensor
    assert structure(a, CONFIG) != structure(b, CONFIG)
    assert structure(a, CONFIG) != structure(a, {**CONFIG, "lora_alpha": 8})


def test_the_slot_replay_keys_a_clone_by_its_template_without_reading_its_factors():
    """Clones of one template (and 3D flag) have one structure by the template's key: the replay's structure for
    them is the template, so a new version costs no pass over its factors; a model the loader built is read."""
    from skyrl_glm.sync.vllm.load_memo import clone_of
    from skyrl_glm.sync.vllm.slot_replay import adapter_factors

    first = _tensors(0)
    template = Template.of(_build(1, first), first)
    assert template is not None
    a, b = template.clone(2, _tensors(1), is_3d=False), template.clone(3, _tensors(2), is_3d=False)
    assert clone_of(a) == (template, False) and clone_of(_build(4, first)) is None
    (fa, ka), (fb, kb) = adapter_factors(a), adapter_factors(b)
    assert ka == kb == ("clone", template, False) and len(fa) == len(fb) == 8
    assert adapter_factors(template.clone(5, _tensors(3), is_3d=True))[1] != ka  # vLLM packs 3D otherwise
    fresh_factors, fresh_key = adapter_factors(_build(6, _tensors(1)))
    assert fresh_key != ka and [t.shape for t in fresh_factors] == [t.shape for t in fa]
