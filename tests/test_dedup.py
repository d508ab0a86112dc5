"""Exact dedup (``skyrl_glm.sync.dedup``): values proven equal, views recognised across slices, collisions and
reused addresses never alias unequal tensors. CPU here; ``test_checksum_gpu.py`` runs the CUDA branch."""

from __future__ import annotations

import pytest
import torch

from skyrl_glm.sync import dedup
from skyrl_glm.sync.dedup import SLICE, deduplicate


def test_reused_address_of_a_dropped_duplicate_is_not_aliased():
    """An exporter that hands out copies frees each duplicate once dedup is done with its slice; the allocator may
    then give the same address (shape, stride, dtype) to a later tensor holding another value. Simulated by writing
    a new value into a dropped duplicate and yielding it again, in the next slice."""
    g = torch.Generator().manual_seed(0)
    shared = torch.randn(4, 8, generator=g)
    copies = [shared.clone() for _ in range(SLICE)]  # one slice: all but the first become aliases

    def stream():
        for e, t in enumerate(copies):
            yield f"model.layers.1.mlp.experts.{e}.gate_proj.lora_A.weight", t
        reused = copies[-1]  # dropped by dedup as a duplicate of expert 0
        reused.copy_(torch.randn(4, 8, generator=g))  # "freed and reallocated" with a new value
        yield "model.layers.1.mlp.experts.999999.up_proj.lora_A.weight", reused

    d = deduplicate(stream())
    new = "model.layers.1.mlp.experts.999999.up_proj.lora_A.weight"
    assert new in d.unique, "a new value at a reused address was aliased to a dropped tensor"
    assert torch.equal(d.unique[new], copies[-1])
    assert len(d.unique) == 2
    assert d.names["model.layers.1.mlp.experts.0.gate_proj.lora_A.weight"][-1] == (
        f"model.layers.1.mlp.experts.{SLICE - 1}.gate_proj.lora_A.weight"
    )


def test_fused_lora_a_copies_dedup_across_projections():
    """Bridge exports fc1's linear_in under gate_proj and up_proj: copies of it are one sent tensor."""
    a = torch.randn(4, 8)
    d = deduplicate(
        [
            ("model.layers.0.mlp.gate_proj.lora_A.weight", a.clone()),
            ("model.layers.0.mlp.up_proj.lora_A.weight", a.clone()),
            ("model.layers.0.mlp.down_proj.lora_A.weight", torch.randn(4, 8)),
        ]
    )
    assert len(d.unique) == 2
    assert d.aliases == {"model.layers.0.mlp.up_proj.lora_A.weight": "model.layers.0.mlp.gate_proj.lora_A.weight"}


@pytest.mark.parametrize("declared", [False, True])
def test_one_object_across_slices_is_one_tensor(declared):
    t = torch.randn(3, 5)
    names = [f"m.layers.0.mlp.experts.{e}.up_proj.lora_A.weight" for e in range(SLICE + 10)]
    d = deduplicate(((n, t) for n in names), shared_storage=declared)
    assert list(d.names) == [names[0]] and d.names[names[0]] == names
    assert d.public_count == len(names) and d.public_bytes == len(names) * t.nbytes


def test_views_of_one_storage_are_one_tensor_without_comparing(monkeypatch):
    """Separate view objects of one storage view (what an exporter may hand out per expert) need no proof."""
    t = torch.randn(4, 6)
    printed: list[int] = []
    real = dedup.fingerprints
    monkeypatch.setattr(dedup, "fingerprints", lambda ts: printed.append(len(ts)) or real(ts))
    d = deduplicate({f"x.experts.{e}.w.lora_A.weight": t.view(4, 6) for e in range(5)})
    assert len(d.unique) == 1 and len(d.aliases) == 4
    assert printed == [1]  # the first view only: the others are known by address


def test_equal_bytes_other_shape_or_dtype_are_distinct():
    z = torch.zeros(4, 8)
    d = deduplicate({"a": z, "b": torch.zeros(8, 4), "c": torch.zeros(4, 8, dtype=torch.int32), "d": z.clone()})
    assert set(d.unique) == {"a", "b", "c"} and d.aliases == {"d": "a"}


def test_forced_fingerprint_collisions_never_alias_unequal_values(monkeypatch):
    """Every tensor gets one fingerprint: each candidate is compared with every value of that print in turn."""
    real = dedup.fingerprints
    monkeypatch.setattr(dedup, "fingerprints", lambda ts: real(ts) * 0)
    g = torch.Generator().manual_seed(3)
    values = [torch.randn(2, 3, generator=g) for _ in range(4)]
    stream = [(f"n{i}", values[i % 4].clone()) for i in range(12)]
    d = deduplicate(stream)
    assert list(d.names) == ["n0", "n1", "n2", "n3"]
    assert d.names["n2"] == ["n2", "n6", "n10"]


def test_non_contiguous_and_odd_sized_tensors_are_compared_by_their_bytes():
    base = torch.arange(24, dtype=torch.bfloat16).reshape(4, 6)
    odd = torch.ones(3, dtype=torch.bfloat16)  # 6 bytes: read through a zero-padded copy
    d = deduplicate({"t": base.t(), "t2": base.t().contiguous(), "odd": odd, "odd2": odd.clone(), "odd3": odd * 2})
    assert d.aliases == {"t2": "t", "odd2": "odd"}
    assert set(d.unique) == {"t", "odd", "odd3"}


def test_repeated_name_across_slices_is_refused():
    t = torch.ones(2)
    names = [f"w{i}" for i in range(SLICE)] + ["w7"]
    with pytest.raises(ValueError, match="repeats the name 'w7'"):
        deduplicate((n, t.clone()) for n in names)


def _reference(stream: list[tuple[str, torch.Tensor]]) -> dict[str, list[str]]:
    """Names grouped by value (shape, dtype, bytes), the group's first name as its key: what exact dedup must give."""
    groups: dict[tuple, list[str]] = {}
    for name, t in stream:
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        groups.setdefault((tuple(t.shape), t.dtype, raw), []).append(name)
    return {ns[0]: ns for ns in groups.values()}


@pytest.mark.parametrize("seed", [0, 1])
def test_mixed_stream_matches_a_brute_force_reference(seed):
    """Shared objects, views, copies, zeros, other dtypes and shapes, spread over several slices in both of the
    reader's modes (by address and by object id)."""
    g = torch.Generator().manual_seed(seed)
    pool = [torch.randn(4, 8, generator=g) for _ in range(6)] + [torch.zeros(4, 8), torch.zeros(8, 4)]
    pool += [p.to(torch.bfloat16) for p in pool[:2]]
    stream = []
    for i in range(int(SLICE * 2.5)):
        p = pool[int(torch.randint(len(pool), (1,), generator=g))]
        how = int(torch.randint(4, (1,), generator=g)) if i > SLICE else int(i % 7 == 0) * 3
        t = (p, p.clone(), p.view(p.shape), p[:])[how]
        stream.append((f"m.layers.{i % 5}.mlp.experts.{i}.w.lora_A.weight", t))
    d = deduplicate(stream)
    reference = _reference(stream)
    assert d.names == reference
    assert list(d.unique) == list(reference)  # sent in stream order of first appearance
    assert d.public_count == len(stream)


@pytest.mark.parametrize("declared", [False, True])
def test_views_at_one_address_are_one_tensor_only_with_the_same_shape_strides_and_dtype(declared):
    """Grouped in bulk by (address, shape, strides, dtype): the transpose, a reshape and a reinterpretation of one
    storage each stay their own tensor, however many further view objects show them, declared or not."""
    base = torch.randn(6, 6)  # square: its transpose has its shape and address, only the strides differ
    views = {"a": base, "t": base.t(), "flat": base.view(36), "int": base.view(torch.int32)}
    stream = [(f"{k}{i}", v.view(v.shape)) for i in range(3) for k, v in views.items()]  # a new object per name
    d = deduplicate(stream, shared_storage=declared)
    assert sorted(d.names) == ["a0", "flat0", "int0", "t0"]
    assert all(d.names[f"{k}0"] == [f"{k}{i}" for i in range(3)] for k in views)
    assert all(torch.equal(d.unique[f"{k}0"], v) and d.unique[f"{k}0"].dtype == v.dtype for k, v in views.items())


@pytest.mark.parametrize("declared", [False, True])
def test_an_empty_stream_is_an_empty_dedup(declared):
    """Nothing to send (a fault or filter removed every tensor): an empty result, not a crash."""
    d = deduplicate(iter(()), shared_storage=declared)
    assert (d.unique, d.names, d.aliases, d.public_count, d.public_bytes) == ({}, {}, {}, 0, 0)
    assert deduplicate({}).unique == {}


@pytest.mark.parametrize("length", [5, 40])
def test_a_part_keeps_the_last_names_tensor_per_address(length):
    """Views of one address differ in size: a part counts the last name's, read per name or (long) per object."""
    base = torch.randn(64)
    views = [base[:8], base, base[:8].view(2, 4)]
    tensors = [views[i % 3] for i in range(length)] + [torch.randn(2) for _ in range(3)]
    by_address = dedup.Part.of([f"n{i}" for i in range(len(tensors))], tensors).by_address
    expected = dict(zip(map(torch.Tensor.data_ptr, tensors), tensors, strict=True))
    assert set(by_address) == set(expected)
    assert all(by_address[p] is t for p, t in expected.items())


def test_declared_sharing_counts_no_bytes_and_sends_each_storage_in_stream_order(monkeypatch):
    """Guards the declared (``shared_storage``) path: every fresh object of a slice is sent in one bulk step and the
    reader counts no bytes (every storage is sent, so a slice holds nothing the result does not). A bulk step that
    mixes up indices, order or views, or a reader that still counts, fails here: the result must equal the proven
    (undeclared) one on a stream of distinct storages shown under many names, over several slices."""
    g = torch.Generator().manual_seed(0)
    storages = [torch.randn(4, 8, generator=g) for _ in range(300)] + [torch.randn(8, generator=g)]
    stream = [(f"m.layers.{i % 7}.mlp.experts.{i}.w.lora_A.weight", storages[(i * 37) % 301]) for i in range(3 * SLICE)]
    stream += [(f"v{i}", storages[i].view(32)) for i in range(3)]  # views: their own tensors, declared or not
    proven = deduplicate(stream, slice_bytes=1 << 20)
    monkeypatch.setattr(dedup.Part, "of", lambda *a: pytest.fail("declared sharing counted a part's bytes"))
    declared = deduplicate(stream, shared_storage=True, slice_bytes=1 << 20)
    assert declared.names == proven.names and list(declared.unique) == list(proven.unique)
    assert all(declared.unique[n] is proven.unique[n] for n in proven.unique)
    assert (declared.public_count, declared.public_bytes) == (proven.public_count, proven.public_bytes)


E = "m.layers.3.mlp.experts."


def _expert_stream(spans: list[tuple[torch.Tensor, range]], tail: str = ".gate_proj.lora_A.weight") -> list:
    return [(f"{E}{e}{tail}", t) for t, experts in spans for e in experts]


def _rebuilt(d: dedup.Dedup) -> dict[str, str]:
    """Public name -> sent name, as the receiver expands the rules."""
    out = {sent: sent for sent in d.unique}
    out.update(d.explicit)
    for run in d.runs:
        out.update(dict.fromkeys(run.names(), run.sent))
    return out


@pytest.mark.parametrize("declared", [False, True])
def test_runs_interrupted_by_another_tensor_rebuild_every_name(declared):
    """Expert 8 shows another storage: its tensor's runs stop there and go on after, the rules name every public
    name exactly once and under its own tensor."""
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    stream = _expert_stream([(a, range(8)), (b, range(8, 9)), (a, range(9, 16))])
    d = deduplicate(stream, shared_storage=declared)
    sent = {n: next(s for s, t in d.unique.items() if t is x) for n, x in stream}
    assert _rebuilt(d) == sent
    assert [(r.start, r.stop) for r in d.runs] == [(0, 8), (9, 16)]
    assert d.explicit == {} and d.public_count == len(stream)


@pytest.mark.parametrize(
    "spans",
    [
        [(0, range(6)), (1, range(3, 9))],  # two runs of two tensors overlap at experts 3..5
        [(0, range(6)), (1, range(2, 3))],  # a run's name again, alone, under another tensor
        [(0, range(6)), (0, range(4, 5))],  # ... under its own tensor
    ],
)
@pytest.mark.parametrize("declared", [False, True])
def test_a_name_repeated_inside_alias_runs_is_refused(spans, declared):
    """The repeat check works on the rules, not on every name: a repeat hidden in a run is still found."""
    pool = [torch.randn(4, 8), torch.randn(4, 8)]
    stream = _expert_stream([(pool[k], experts) for k, experts in spans])
    first = spans[1][1][0]
    with pytest.raises(ValueError, match=rf"repeats the name '{E}{first}\.gate_proj"):
        deduplicate(stream, shared_storage=declared)


def test_a_wrong_declaration_sends_a_duplicate_and_keeps_every_name_exact():
    """Two storages holding one value, declared as distinct: both are sent, each under its own names' runs."""
    a = torch.randn(4, 8)
    stream = _expert_stream([(a, range(4)), (a.clone(), range(4, 8))])
    d = deduplicate(stream, shared_storage=True)
    assert len(d.unique) == 2 and [(r.start, r.stop) for r in d.runs] == [(0, 4), (4, 8)]
    assert all(torch.equal(d.unique[s], t) for s, t in zip(d.unique, (a, a), strict=True))
    assert _rebuilt(d) == {n: d.runs[e >= 4].sent for e, (n, _) in enumerate(stream)}


@pytest.mark.parametrize("declared", [False, True])
def test_a_prefix_on_the_rules_equals_a_prefix_on_every_name(declared):
    """The Megatron stream renames its result (``Dedup.prefixed``), not each name: it must equal the dedup of the
    renamed stream, runs, explicit aliases and names alike."""
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    stream = _expert_stream([(a, range(5)), (b, range(5, 6)), (a, range(6, 9))]) + [("m.odd", b), ("m.7x", a)]
    prefix = "base_model.model."
    renamed = deduplicate(stream, shared_storage=declared).prefixed(prefix)
    direct = deduplicate([(prefix + n, t) for n, t in stream], shared_storage=declared)
    assert (renamed.runs, renamed.explicit, renamed.names) == (direct.runs, direct.explicit, direct.names)
    assert list(renamed.unique) == list(direct.unique) and renamed.public_bytes == direct.public_bytes


def _bridge_stream(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    """A tiny GLM-5.3 export with ``share_expert_adapters`` (one object under every expert name of a layer)."""
    from skyrl_glm.lora.bridge import synthetic_bridge_export
    from skyrl_glm.models import glm5

    targets = ["self_attn.q_b_proj", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    return list(synthetic_bridge_export(glm5.tiny_config(), glm5.FAMILY.lora, rank=4, targets=targets, seed=seed))


def _rules(d: dedup.Dedup) -> tuple:
    return list(d.unique), list(d.grouped), d.ends, d.runs, d.explicit, d.public_count, d.public_bytes


def test_a_memo_dedups_an_update_like_the_last_per_sent_tensor_and_anything_else_in_full():
    memo = dedup.DedupMemo()
    first = _bridge_stream(seed=0)
    want = deduplicate(iter(first), shared_storage=True)
    assert _rules(deduplicate(iter(first), shared_storage=True, memo=memo)) == _rules(want) and memo.hits == 0
    again = _bridge_stream(seed=1)  # new values, new objects, the same names and sharing
    got = deduplicate(iter(again), shared_storage=True, memo=memo)
    assert memo.hits == 1 and _rules(got) == _rules(want)
    assert all(t is dict(again)[n] for n, t in got.unique.items())  # this update's tensors, not the last one's
    assert memo.result is not None and memo.result.unique == {}  # the memo holds no tensor
    renamed = [(n.replace("layers.2.", "layers.9."), t) for n, t in again]  # other names: deduplicated in full
    got = deduplicate(iter(renamed), shared_storage=True, memo=memo)
    assert memo.hits == 1 and _rules(got) == _rules(deduplicate(iter(renamed), shared_storage=True))
    assert _rules(deduplicate(iter(_bridge_stream(seed=2)), shared_storage=True, memo=memo)) == _rules(want)
    assert memo.hits == 1  # the memo now holds the renamed layout


def _new_view_per_expert(stream: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """Every routed expert's gate and up ``lora_B`` a view object of its own, as Megatron-Bridge hands them out
    (it splits the fused ``linear_out`` anew for each expert)."""
    from skyrl_glm.lora.bridge import VIEW_PER_EXPERT

    return [(n, t.view(t.shape) if VIEW_PER_EXPERT.search(n) else t) for n, t in stream]


def test_a_memo_dedups_an_update_whose_names_show_one_tensor_through_new_view_objects():
    memo = dedup.DedupMemo()
    deduplicate(iter(_new_view_per_expert(_bridge_stream(seed=0))), shared_storage=True, memo=memo)
    again = _new_view_per_expert(_bridge_stream(seed=1))
    got = deduplicate(iter(again), shared_storage=True, memo=memo)
    assert memo.hits == 1 and _rules(got) == _rules(deduplicate(iter(again), shared_storage=True))
    # a view object of another part of the storage under one expert's name is another tensor: in full
    shifted = [(n, t[1:] if "layers.1.mlp.experts.2.up_proj.lora_B" in n else t) for n, t in _bridge_stream(seed=2)]
    shifted = _new_view_per_expert(shifted)
    got = deduplicate(iter(shifted), shared_storage=True, memo=memo)
    assert memo.hits == 1 and _rules(got) == _rules(deduplicate(iter(shifted), shared_storage=True))
    assert len(got.unique) == len(deduplicate(iter(again), shared_storage=True).unique) + 1


@pytest.mark.parametrize(
    "change",
    [
        lambda n, t: t.clone() if ".experts.3.down_proj.lora_B" in n else t,  # one expert's own tensor (split)
        lambda n, t: t.t() if n.endswith("q_b_proj.lora_A.weight") else t,  # another shape and strides
    ],
    ids=["split", "reshaped"],
)
def test_a_memo_takes_no_update_whose_tensors_differ_from_the_last_ones_pattern(change):
    memo = dedup.DedupMemo()
    deduplicate(iter(_bridge_stream()), shared_storage=True, memo=memo)
    changed = [(n, change(n, t)) for n, t in _bridge_stream(seed=1)]
    got = deduplicate(iter(changed), shared_storage=True, memo=memo)
    assert memo.hits == 0 and _rules(got) == _rules(deduplicate(iter(changed), shared_storage=True))
    # and back: the tensors the changed update showed apart are one again (a hit would send a duplicate): in full
    got = deduplicate(iter(_bridge_stream(seed=2)), shared_storage=True, memo=memo)
    assert memo.hits == 0 and _rules(got) == _rules(deduplicate(iter(_bridge_stream()), shared_storage=True))
