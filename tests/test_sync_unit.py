"""Plan, manifest, transports and receiver without vLLM: exact dedup, bit-exact rebuild, rejections."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from shm_receive import receive_over_shm

from skyrl_glm.sync.dedup import deduplicate
from skyrl_glm.sync.manifest import Manifest, ManifestError
from skyrl_glm.sync.plan import build_plan
from skyrl_glm.sync.receiver import AdapterReceiver, UpdateRejected
from skyrl_glm.sync.transports.shm import SharedMemoryTransport

CONFIG = {"r": 4, "lora_alpha": 8, "target_modules": {"experts", "q_proj"}}


def expert_adapter(experts: int = 8, shared: bool = True, copies: bool = False) -> dict[str, torch.Tensor]:
    """Bridge-export shape: one adapter per (projection, A/B) shared by all experts, under every expert name."""
    gen = torch.Generator().manual_seed(0)
    out: dict[str, torch.Tensor] = {}
    for layer in range(2):
        base = {p: (torch.randn(4, 16, generator=gen), torch.randn(32, 4, generator=gen)) for p in ("gate", "down")}
        for e in range(experts):
            for p, (a, b) in base.items():
                if not shared:
                    a, b = torch.randn(4, 16, generator=gen), torch.randn(32, 4, generator=gen)
                pre = f"base_model.model.model.layers.{layer}.mlp.experts.{e}.{p}_proj"
                out[f"{pre}.lora_A.weight"] = a.clone() if copies else a
                out[f"{pre}.lora_B.weight"] = b.clone() if copies else b
        out[f"base_model.model.model.layers.{layer}.self_attn.q_proj.lora_A.weight"] = torch.randn(4, 16, generator=gen)
        out[f"base_model.model.model.layers.{layer}.self_attn.q_proj.lora_B.weight"] = torch.zeros(16, 4)
    return out


@pytest.mark.parametrize("copies", [False, True])
def test_dedup_sends_each_unique_tensor_once(copies):
    adapter = expert_adapter(copies=copies)
    d = deduplicate(adapter)
    assert d.public_count == len(adapter) == 2 * (8 * 4 + 2)
    # per layer: gate/down x A/B plus q_proj A; q_proj B is zero in both layers: one value, sent once
    assert len(d.unique) == 2 * (4 + 1) + 1
    for public, sent in d.aliases.items():
        assert torch.equal(adapter[public], adapter[sent])
        assert adapter[public].shape == adapter[sent].shape and adapter[public].dtype == adapter[sent].dtype
    assert d.aliases["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"] == (
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    )


def test_dedup_keeps_distinct_experts_distinct():
    adapter = expert_adapter(shared=False)
    assert len(deduplicate(adapter).unique) == len(adapter) - 1  # all distinct but the two zero q_proj lora_B


def test_dedup_never_aliases_unequal_tensors_with_equal_sums():
    # Same integer-word sums, different values (a permutation within the weighting period would not do this,
    # a swap of two words does change the weighted sum), so build a true tie on the plain sum only.
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    b = torch.tensor([1.0, 2.0, 4.0, 3.0])
    d = deduplicate({"x.experts.0.w.lora_A.weight": a, "x.experts.1.w.lora_A.weight": b})
    assert len(d.unique) == 2


def test_dedup_rejects_repeated_names():
    t = torch.ones(2)
    with pytest.raises(ValueError, match="repeats"):
        deduplicate([("a", t), ("a", t)])


def test_plan_folds_alpha_once_per_unique_tensor_and_publishes_alpha_eq_r():
    adapter = expert_adapter()
    plan = build_plan(adapter, adapter_config=CONFIG, lora_name="p", version=1)
    assert plan.manifest.adapter_config["lora_alpha"] == plan.manifest.adapter_config["r"] == 4
    by_name = dict(zip((t.name for t in plan.manifest.tensors), plan.tensors, strict=True))
    for name, t in by_name.items():
        expected = adapter[name] * 2 if ".lora_B." in name else adapter[name]
        assert torch.equal(t, expected), name
    # the trainer's tensors are untouched
    assert torch.equal(adapter[next(iter(by_name))], expert_adapter()[next(iter(by_name))])


def test_manifest_round_trips_as_json_and_buckets_cover_the_stream():
    plan = build_plan(expert_adapter(), adapter_config=CONFIG, lora_name="p", version=3, bucket_bytes=1024)
    m = Manifest.from_json(plan.manifest.to_json())
    assert m == plan.manifest
    ranges = m.buckets()
    assert len(ranges) > 1 and ranges[0][0] == 0 and ranges[-1][1] >= m.tensors[-1].offset + m.tensors[-1].nbytes
    assert all(e - s <= 1024 for s, e in ranges)


@pytest.mark.parametrize("bucket_bytes", [256, 1 << 20])
def test_receiver_rebuilds_every_public_name_bit_exactly(bucket_bytes):
    adapter = expert_adapter(copies=True)
    plan = build_plan(adapter, adapter_config=CONFIG, lora_name="p", version=1, bucket_bytes=bucket_bytes)
    got = receive_over_shm(plan).tensors
    assert set(got) == set(adapter)
    for name, t in adapter.items():
        expected = t * 2 if ".lora_B." in name else t
        assert torch.equal(got[name], expected), name
        assert got[name].untyped_storage().data_ptr() != t.untyped_storage().data_ptr()  # private storage


def _bad(plan, **changes):
    return dataclasses.replace(plan.manifest, **changes).to_json()


def test_rejections_name_their_reason():
    plan = build_plan(expert_adapter(), adapter_config=CONFIG, lora_name="p", version=5)
    m = plan.manifest
    t0 = m.tensors[0]
    cases = {
        "checksum mismatch": _bad(plan, checksums="0" * 16 + m.checksums[16:]),
        "not sent": _bad(plan, aliases={"extra.lora_A.weight": "missing"}),
        "does not match": _bad(plan, tensors=(t0._replace(shape=(3, 3)),) + m.tensors[1:]),
        "unsupported dtype": _bad(plan, tensors=(t0._replace(dtype="int8"),) + m.tensors[1:]),
        "lora_alpha": _bad(plan, adapter_config={**m.adapter_config, "lora_alpha": 16}),
        "missing field": '{"format": "skyrl-glm/lora-sync/3"}',
        "'version' must be an integer": '{"format": "skyrl-glm/lora-sync/3", "version": "x"}',
        "unknown manifest format 'pickle'": '{"format": "pickle"}',
        "unknown manifest format 'skyrl-glm/lora-sync/2'": '{"format": "skyrl-glm/lora-sync/2"}',
    }
    for reason, text in cases.items():
        with pytest.raises(UpdateRejected, match=reason):
            receive_over_shm(plan, text)


def test_rejects_nan_and_old_versions():
    adapter = expert_adapter()
    receiver = AdapterReceiver()
    receiver.commit(receive_over_shm(build_plan(adapter, adapter_config=CONFIG, lora_name="p", version=2)).version)
    with pytest.raises(UpdateRejected, match="not newer"):
        receive_over_shm(build_plan(adapter, adapter_config=CONFIG, lora_name="p", version=2), receiver=receiver)
    bad = dict(adapter)
    bad["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"] = torch.full((16, 4), float("nan"))
    with pytest.raises(UpdateRejected, match="non-finite"):
        receive_over_shm(build_plan(bad, adapter_config=CONFIG, lora_name="p", version=3), receiver=receiver)


def test_sender_gone_or_short_segment_is_rejected():
    plan = build_plan(expert_adapter(), adapter_config=CONFIG, lora_name="p", version=1)
    tx = SharedMemoryTransport()
    handle = tx.prepare(plan)
    tx.release()  # the sender died and its segment is gone
    with pytest.raises(UpdateRejected, match="transfer failed"):
        AdapterReceiver().receive(plan.manifest.to_json(), handle, tx)
    bigger = _bad(plan, total_bytes=plan.manifest.total_bytes + (1 << 20))
    with pytest.raises(UpdateRejected, match="transfer failed"):
        receive_over_shm(plan, bigger)


def test_partial_transfer_is_caught_by_checksums():
    plan = build_plan(expert_adapter(), adapter_config=CONFIG, lora_name="p", version=1)
    tx = SharedMemoryTransport()
    handle = tx.prepare(plan)
    with open(f"/dev/shm/{handle['shm_name'].lstrip('/')}", "r+b") as f:  # sender died half-way: tail zeroed
        f.seek(plan.manifest.total_bytes // 2)
        f.write(bytes(plan.manifest.total_bytes - plan.manifest.total_bytes // 2))
    try:
        with pytest.raises(UpdateRejected, match="checksum mismatch"):
            AdapterReceiver().receive(plan.manifest.to_json(), handle, tx)
    finally:
        tx.release()


def test_manifest_validation_is_structural():
    plan = build_plan(expert_adapter(), adapter_config=CONFIG, lora_name="p", version=1)
    with pytest.raises(ManifestError, match="twice"):
        m = plan.manifest
        dataclasses.replace(m, tensors=m.tensors[:1] * 2, checksums=m.checksum(0) * 2).validate()


def test_incomplete_or_rank_mismatched_adapters_are_rejected_before_any_transfer():
    adapter = expert_adapter()
    no_b = {k: v for k, v in adapter.items() if "layers.1.self_attn.q_proj.lora_B" not in k}
    with pytest.raises(UpdateRejected, match="missing tensors: 1"):
        receive_over_shm(build_plan(no_b, adapter_config=CONFIG, lora_name="p", version=1))
    bad_rank = dict(adapter)
    bad_rank["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"] = torch.zeros(16, 3)
    plan = build_plan(bad_rank, adapter_config=CONFIG, lora_name="p", version=1)

    class NeverCalled(SharedMemoryTransport):
        def receive(self, manifest, handle, out):
            raise AssertionError("the transfer must not start")

    with pytest.raises(UpdateRejected, match="shape mismatch"):
        AdapterReceiver().receive(plan.manifest.to_json(), {}, NeverCalled())


def test_views_of_a_stream_with_mixed_dtypes_and_a_storage_offset():
    """``views`` (one typed view per dtype, ``as_strided`` per tensor) gives each tensor's bytes at its offset, also
    when the stream is itself a slice of a larger buffer (``as_strided`` offsets are absolute in the storage)."""
    from skyrl_glm.sync.manifest import pack_entries, views

    g = torch.Generator().manual_seed(3)
    tensors = {
        "a": torch.randn(3, 5, generator=g),
        "b": torch.randn(2, 7, generator=g).to(torch.bfloat16),
        "c": torch.randn(4, generator=g).to(torch.float16),
        "d": torch.randn(2, 3, 2, generator=g),
        "e": torch.randn(1, 9, generator=g).to(torch.bfloat16),
    }
    names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    entries, total = pack_entries(
        (n, names[t.dtype], tuple(t.shape), t.numel() * t.element_size()) for n, t in tensors.items()
    )
    backing = torch.zeros(128 + total, dtype=torch.uint8)
    stream = backing[128:]
    for e, t in zip(entries, tensors.values(), strict=True):
        stream[e.offset : e.offset + e.nbytes].copy_(t.reshape(-1).view(torch.uint8))
    got = views(stream, entries)
    for (name, t), v in zip(tensors.items(), got, strict=True):
        assert v.dtype == t.dtype and v.shape == t.shape and torch.equal(v, t), name
        assert v.untyped_storage().data_ptr() == backing.untyped_storage().data_ptr()  # a view, no copy
    got[0].zero_()
    assert not stream[: entries[0].nbytes].any() and stream[entries[1].offset :].any()
