"""What a sender and a receiver keep between updates: the sender's plan layout (``plan.PlanCache``) and the
receiver's arrangement of an expert layout (``expert_layout.Arrangement``, kept by ``AdapterReceiver``).

Every update here is also planned or received with nothing kept, and the two must agree bit for bit (manifest
JSON, packed stream, every tensor handed to vLLM). A changed structure (names, shapes, dtypes, sharing, config,
lora name, bucket size) must miss the cache and be laid out anew; a value check that the structure leaves open
(two distinct sent tensors that must be equal) must still run on every update.
"""

from __future__ import annotations

import json

import pytest
import torch

from skyrl_glm.lora.bridge import adapter_config, bridge_export_specs, synthetic_values
from skyrl_glm.models import glm5
from skyrl_glm.sync import expert_layout as layouts
from skyrl_glm.sync.plan import PlanCache, SyncPlan, build_plan
from skyrl_glm.sync.receiver import AdapterReceiver, UpdateRejected
from skyrl_glm.sync.transports.shm import SharedMemoryTransport

RANK = 4
TARGETS = ["self_attn.q_b_proj", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
CONFIG = glm5.tiny_config()
PREFIX = "base_model.model."


def export(seed: int, groups: int | None = 1, rank: int = RANK, dtype: torch.dtype = torch.float32) -> dict:
    """A Megatron-Bridge-shaped export: the experts of each layer share one adapter per group of consecutive
    experts (``groups``), or have one each (None); every name of one tensor shows one storage."""
    specs = bridge_export_specs(
        CONFIG,
        glm5.FAMILY.lora,
        rank=rank,
        targets=TARGETS,
        share_expert_adapters=groups is not None,
        expert_groups=groups or 1,
    )
    values = synthetic_values(specs, dtype=dtype, seed=seed)
    return {PREFIX + s.name: values[s.storage] for s in specs}


def plan(tensors: dict, version: int, cache: PlanCache | None, **kw) -> SyncPlan:
    rank = kw.pop("rank", RANK)
    config = adapter_config(rank, 2 * rank, kw.pop("targets", TARGETS))
    return build_plan(tensors, adapter_config=config, version=version, shared_storage=True, cache=cache, **kw)


def assert_same_plan(got: SyncPlan, want: SyncPlan) -> None:
    text = got.manifest.to_json()
    assert text == want.manifest.to_json()
    assert json.dumps(json.loads(text), separators=(",", ":")) == text  # the layout's kept text: one dumps of all
    assert torch.equal(got.buffer, want.buffer)


@pytest.mark.parametrize("groups", [1, 2, None], ids=["shared-all", "grouped", "per-expert"])
def test_a_kept_plan_layout_gives_the_plan_made_afresh_bit_for_bit(groups: int | None) -> None:
    cache = PlanCache()
    for version, seed in ((1, 0), (2, 1), (3, 2)):
        tensors = export(seed, groups)
        got = plan(tensors, version, cache, lora_name="p")
        assert_same_plan(got, plan(tensors, version, None, lora_name="p"))
        # the layout's digest (what a manifest names a layout by) is made with the layout, not hashed per update
        assert got.manifest.__dict__["layout_digest"] == got.manifest.layout_digest
    assert cache.hits == 2


def test_alpha_is_folded_per_update_not_kept() -> None:
    """Alpha is not part of the layout (the manifest publishes ``lora_alpha == r``): a kept layout folds each
    update by its own alpha."""
    cache = PlanCache()
    tensors = export(0)
    config = adapter_config(RANK, 2 * RANK, TARGETS)
    build_plan(tensors, adapter_config=config, lora_name="p", version=1, shared_storage=True, cache=cache)
    config = adapter_config(RANK, 3 * RANK, TARGETS)
    got = build_plan(tensors, adapter_config=config, lora_name="p", version=2, shared_storage=True, cache=cache)
    want = build_plan(tensors, adapter_config=config, lora_name="p", version=2, shared_storage=True)
    assert cache.hits == 1
    assert_same_plan(got, want)


def test_a_kept_staging_buffer_keeps_its_views_and_packs_each_update_afresh() -> None:
    """A transport that stages every update in the same memory (``keeps_staging``, CUDA IPC; one kept buffer
    here): the layout makes its views of it once, every plan still packs its own values, bit for bit as a plan
    made afresh; a buffer elsewhere gets views of its own, and without ``keep_views`` none are kept."""
    kept: list[torch.Tensor] = []

    def staging(nbytes: int, device: torch.device) -> torch.Tensor:
        if not kept or kept[0].numel() != nbytes:
            kept[:] = [torch.zeros(nbytes, dtype=torch.uint8, device=device)]
        kept[0].zero_()
        return kept[0][:nbytes]

    cache = PlanCache()
    made = []
    for version, seed in ((1, 0), (2, 1), (3, 2)):
        tensors = export(seed, 2)
        got = plan(tensors, version, cache, lora_name="p", staging=staging, keep_views=True)
        made.append(cache.layout._views[1])
        want = plan(tensors, version, None, lora_name="p")
        assert_same_plan(got, want)
        assert all(torch.equal(a, b) for a, b in zip(got.tensors, want.tensors, strict=True))
    assert made[0] is made[2]  # one set of views of the one buffer
    assert got.tensors[0].data_ptr() == kept[0].data_ptr()
    other = plan(export(3, 2), 4, cache, lora_name="p", keep_views=True)  # zeroed memory of its own
    assert other.tensors[0].data_ptr() != kept[0].data_ptr() and cache.layout._views[1] is not made[0]
    unkept = plan(export(4, 2), 5, cache, lora_name="p", staging=staging)
    assert unkept.tensors[0].data_ptr() == kept[0].data_ptr() and cache.layout._views is None


class _KeptStaging(SharedMemoryTransport):
    """A transport that keeps its staging memory between updates, as CUDA IPC does (host memory here)."""

    keeps_staging = True

    def __init__(self) -> None:
        super().__init__()
        self.kept: torch.Tensor | None = None

    def staging(self, nbytes: int, device: torch.device) -> torch.Tensor:
        if self.kept is None or self.kept.numel() != nbytes:
            self.kept = torch.zeros(nbytes, dtype=torch.uint8)
        return self.kept.zero_()

    def forget_staging(self) -> None:
        self.kept = None


def test_an_offload_lets_go_of_the_kept_staging_memory() -> None:
    """SkyRL's offload, through the sync mixin: the publisher's transport lets go of its kept buffer and the plan
    layout of its views, so nothing holds that memory while the trainer is offloaded; the next plan takes it anew."""
    from torch.multiprocessing.reductions import StorageWeakRef

    from skyrl_glm.skyrl.workers.worker_sync import GlmSyncMixin
    from skyrl_glm.sync.publisher import InMemoryPublisher

    transport = _KeptStaging()
    publisher = InMemoryPublisher(None, transport, "p", shared_storage=True)  # type: ignore[arg-type]
    config = adapter_config(RANK, 2 * RANK, TARGETS)
    for version in (1, 2):
        publisher.plan(export(version), config, version)
    assert publisher.plan_cache.layout is not None and publisher.plan_cache.layout._views is not None
    memory = StorageWeakRef(transport.kept.untyped_storage())

    class Offloaded:
        def offload_to_cpu(self, **kwargs):
            return kwargs

    class Worker(GlmSyncMixin, Offloaded):
        _glm_publisher = publisher

    assert Worker().offload_to_cpu(offload_model=True) == {"offload_model": True}  # SkyRL's offload, after
    assert transport.kept is None and publisher.plan_cache.layout._views is None and memory.expired()
    got = publisher.plan(export(3), config, 3)
    assert_same_plan(got, plan(export(3), 3, None, lora_name="p"))


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda: (export(1, 2), {}), id="sharing"),
        pytest.param(lambda: (export(1, None), {}), id="per-expert"),
        pytest.param(lambda: (_widened(export(1)), {}), id="shape"),
        pytest.param(lambda: (export(1, rank=8), {"rank": 8}), id="rank"),
        pytest.param(lambda: (export(1, dtype=torch.bfloat16), {}), id="dtype"),
        pytest.param(lambda: (_renamed(export(1)), {}), id="renamed"),
        pytest.param(lambda: (_dropped(export(1)), {}), id="dropped"),
        pytest.param(lambda: (export(1), {"lora_name": "q"}), id="lora-name"),
        pytest.param(lambda: (export(1), {"bucket_bytes": 4096}), id="bucket"),
        pytest.param(lambda: (export(1), {"targets": [*TARGETS, "self_attn.o_proj"]}), id="config"),
    ],
)
def test_a_changed_structure_never_reuses_the_kept_layout(change) -> None:
    cache = PlanCache()
    plan(export(0), 1, cache, lora_name="p")
    tensors, kw = change()
    kw.setdefault("lora_name", "p")
    got = plan(tensors, 2, cache, **kw)
    assert cache.hits == 0
    assert_same_plan(got, plan(tensors, 2, None, **kw))
    assert_same_plan(plan(tensors, 3, cache, **kw), plan(tensors, 3, None, **kw))
    assert cache.hits == 1  # and the new structure is the one kept


def _renamed(tensors: dict) -> dict:
    first = next(iter(tensors))
    return {(k.replace("layers.0.", "layers.0.x.") if k == first else k): v for k, v in tensors.items()}


def _widened(tensors: dict) -> dict:
    """Layer 0's q_b_proj lora_B one output row longer (names, dtypes and config unchanged)."""
    name = PREFIX + "model.layers.0.self_attn.q_b_proj.lora_B.weight"
    return {**tensors, name: torch.cat([tensors[name], tensors[name][:1]])}


def _dropped(tensors: dict) -> dict:
    """The q_b_proj pair of layer 0 left out."""
    return {k: v for k, v in tensors.items() if not k.startswith(PREFIX + "model.layers.0.self_attn.q_b_proj")}


def receive(p: SyncPlan, rx: AdapterReceiver):
    tx = SharedMemoryTransport()
    try:
        got = rx.receive(p.manifest.to_json(), tx.prepare(p), tx)
    finally:
        tx.release()
    rx.commit(got.version)
    return got


@pytest.mark.parametrize(
    ("layout", "groups"),
    [
        (layouts.SHARED_ALL, 1),
        (layouts.SHARED_OUTER, 1),
        ("grouped:2", 2),
        ("grouped:4", 4),
        (layouts.STACKED_3D, None),
    ],
)
def test_a_kept_arrangement_hands_vllm_what_a_fresh_one_does(layout: str, groups: int | None) -> None:
    kept = AdapterReceiver(layout=layout)
    for version, seed in ((1, 0), (2, 1), (3, 2)):
        p = plan(export(seed, groups), version, None, lora_name="p")
        got = receive(p, kept)
        want = receive(p, AdapterReceiver(layout=layout))
        assert list(got.tensors) == list(want.tensors)
        for name, t in want.tensors.items():
            assert got.tensors[name].shape == t.shape and got.tensors[name].stride() == t.stride(), name
            assert torch.equal(got.tensors[name], t), name
        if version == 1:
            arrangement = kept.arranged
        assert kept.arranged is arrangement  # the same layout: the same arrangement
    if groups and groups > 1:  # a factor's groups lie back to back: one strided view of the first, no view per group
        assert len(arrangement[1].reads) < len(p.manifest.tensors)


def test_another_layout_is_arranged_anew() -> None:
    rx = AdapterReceiver(layout="grouped:2")
    receive(plan(export(0, 2), 1, None, lora_name="p"), rx)
    first = rx.arranged
    tensors = export(1, 4)  # four groups: in grouped:2, two distinct sent tensors per group must be equal
    with pytest.raises(UpdateRejected, match="grouped:2: .* has another .* than expert 0"):
        receive(plan(tensors, 2, None, lora_name="p"), rx)
    assert rx.arranged is not first and rx.version == 1
    got = receive(plan(export(2, 1), 3, None, lora_name="p"), rx)  # one group: fits grouped:2 too
    assert rx.arranged is not first and got.version == 3


def test_a_kept_arrangement_still_compares_values_the_structure_leaves_open() -> None:
    """Declared sharing sends an equal copy as its own tensor: the layout then carries a value check, and an update
    of the same layout whose copy differs is refused by the kept arrangement."""
    module = PREFIX + "model.layers.1.mlp.experts"
    copied = f"{module}.3.gate_proj.lora_A.weight"

    def with_copy(seed: int, delta: float) -> dict:
        tensors = export(seed)
        tensors[copied] = tensors[copied].clone() + delta
        return tensors

    rx = AdapterReceiver(layout=layouts.SHARED_OUTER)
    receive(plan(with_copy(0, 0.0), 1, None, lora_name="p"), rx)
    kept = rx.arranged
    bad = plan(with_copy(1, 1e-3), 2, None, lora_name="p")
    with pytest.raises(UpdateRejected, match="shared-outer: .*experts expert 3 has another gate_proj.lora_A"):
        receive(bad, rx)
    assert rx.arranged is kept and rx.version == 1
    assert receive(plan(with_copy(2, 0.0), 3, None, lora_name="p"), rx).version == 3


def test_a_mixed_dtype_adapter_is_packed_bit_for_bit() -> None:
    """One fused copy per dtype into typed views of the stream: every sent tensor comes out as it went in (alpha
    equal to r: no fold), fp32 and bf16 alike, with and without a kept layout."""
    tensors = {k: (v.to(torch.bfloat16) if ".self_attn." in k else v) for k, v in export(0).items()}
    assert {v.dtype for v in tensors.values()} == {torch.float32, torch.bfloat16}
    cache = PlanCache()
    config = adapter_config(RANK, RANK, TARGETS)
    for version in (1, 2):
        p = build_plan(tensors, adapter_config=config, lora_name="p", version=version, shared_storage=True, cache=cache)
        sent = dict(zip((e.name for e in p.manifest.tensors), p.tensors, strict=True))
        for name, t in sent.items():
            assert t.dtype == tensors[name].dtype and torch.equal(t, tensors[name]), name
    assert cache.hits == 1
