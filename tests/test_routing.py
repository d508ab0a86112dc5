"""Multi-rank routing (CPU part): EP-sharded sender ranks -> TP-sharded receiver ranks.

Unit tests of the pure plan (sharding rules, name resolution, cross-rank ownership, routes, per-receiver manifests),
an in-process loopback execution through the real AdapterReceiver, and the 8-process run (4 sender ranks holding an
EP4-sharded synthetic GLM-5.3-shaped adapter -> 4 receiver ranks, TP4 and TP4+EP, gloo broadcasts counted).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

from skyrl_glm.bench.routing_run import (
    RoutingRunOptions,
    ep_sharded_exports,
    full_reference,
    run_routed_sync,
)
from skyrl_glm.bench.verify import bytes_equal
from skyrl_glm.experimental.routing.plan import (
    ReceiverLayout,
    RoutingError,
    Slice,
    TargetRules,
    assign_owners,
    column_parallel,
    expected_slices,
    expert_owner,
    parse_name,
    placement,
    plan_routes,
    replicated,
    row_parallel,
    split,
)
from skyrl_glm.experimental.routing.transport import piece_checksums, route_label
from skyrl_glm.lora.bridge import adapter_config
from skyrl_glm.models import glm4, glm5
from skyrl_glm.sync.manifest import Manifest
from skyrl_glm.sync.plan import SyncPlan, build_plan, pack_into
from skyrl_glm.sync.receiver import AdapterReceiver, UpdateRejected
from skyrl_glm.sync.transports.base import Transport

P = "base_model.model.model.layers"
GQA = TargetRules(glm4.FAMILY.lora)  # GLM-4.5's records: q/k/v attention
MLA = TargetRules(glm5.FAMILY.lora)  # GLM-5.3's: MLA, the indexer, routed experts (what the 8-process run routes)

# ------------------------------------------------------------------------------------------ sharding rules


def test_column_parallel_keeps_a_whole_and_splits_b_rows():
    assert column_parallel("A", (8, 64), 4) == {r: None for r in range(4)}
    assert column_parallel("B", (64, 8), 4) == {r: Slice(0, 16 * r, 16 * (r + 1)) for r in range(4)}
    assert column_parallel("B", (64, 8), 1) == {0: None}


def test_row_parallel_splits_a_columns_and_keeps_b_whole():
    assert row_parallel("A", (8, 64), 4) == {r: Slice(1, 16 * r, 16 * (r + 1)) for r in range(4)}
    assert row_parallel("B", (64, 8), 4) == {r: None for r in range(4)}


def test_replicated_and_kv_head_replicas():
    assert replicated("B", (64, 8), 4) == {r: None for r in range(4)}
    # QKVParallelLinear with 2 kv heads on TP4: ranks 0,1 hold kv head 0, ranks 2,3 head 1 (kv_shard_id = r // 2).
    kv = placement(f"{P}.0.self_attn.k_proj.lora_B.weight", (32, 8), ReceiverLayout(4, num_kv_heads=2), GQA)
    assert kv == {0: Slice(0, 0, 16), 1: Slice(0, 0, 16), 2: Slice(0, 16, 32), 3: Slice(0, 16, 32)}


def test_indivisible_shard_is_refused():
    with pytest.raises(RoutingError, match="not divisible"):
        split((30, 8), 0, 4)
    with pytest.raises(RoutingError, match="num_kv_heads"):
        placement(f"{P}.0.self_attn.v_proj.lora_B.weight", (32, 8), ReceiverLayout(4), GQA)


@pytest.mark.parametrize(
    ("module", "expect"),
    [
        ("self_attn.q_a_proj", ("self_attn.q_a_proj", None)),
        ("self_attn.kv_a_proj_with_mqa", ("self_attn.kv_a_proj_with_mqa", None)),
        ("self_attn.q_b_proj", ("self_attn.q_b_proj", None)),
        ("self_attn.o_proj", ("self_attn.o_proj", None)),
        ("self_attn.indexer.wq_b", ("indexer.wq_b", None)),
        ("mlp.gate_proj", ("mlp.gate_proj", None)),
        ("mlp.shared_experts.down_proj", ("shared_experts.down_proj", None)),
        ("mlp.experts.7.gate_proj", ("mlp.experts.gate_up_proj", 7)),
        ("mlp.experts.12.down_proj", ("mlp.experts.down_proj", 12)),
    ],
)
def test_parse_name(module, expect):
    for prefix in ("model.layers", P):  # Bridge export names and vLLM (PEFT-prefixed) names
        n = parse_name(f"{prefix}.3.{module}.lora_B.weight", MLA)
        assert (n.target, n.expert, n.layer, n.ab) == (*expect, 3, "B")


def test_unknown_and_fused_3d_names_are_refused():
    with pytest.raises(RoutingError, match="no vLLM TP sharding rule"):
        parse_name(f"{P}.3.mlp.experts.base_layer.lora_A.weight", MLA)  # vLLM 3D layout: not routed
    with pytest.raises(RoutingError, match="no vLLM TP sharding rule"):
        parse_name(f"{P}.3.self_attn.mystery_proj.lora_A.weight", MLA)
    with pytest.raises(RoutingError, match="not a per-module"):
        parse_name("lm_head.weight", MLA)


def test_every_family_target_has_a_sharding_rule():
    """Driven by the families' target records (skyrl_glm/models/targets.py): each carries its TP style."""
    from skyrl_glm.plugins import registry

    reg = registry()
    for fam in ("glm-5.3", "glm-5.3-flash", "glm-4.5"):
        rules = TargetRules(reg.model(fam).lora)
        for t in reg.model(fam).lora.targets:
            assert t.tp_style is not None and rules.styles[t.hf] == t.tp_style, (fam, t.hf)


def test_a_family_routes_by_its_own_records_only():
    # GLM-4.5's k_proj is no target of GLM-5.3 (MLA): with GLM-5.3's rules it is refused, not routed by another
    # family's record (as the registry-wide rules did).
    assert parse_name(f"{P}.0.self_attn.k_proj.lora_A.weight", GQA).target == "self_attn.k_proj"
    with pytest.raises(RoutingError, match="no vLLM TP sharding rule"):
        parse_name(f"{P}.0.self_attn.k_proj.lora_A.weight", MLA)


def test_receiver_expert_parallel_places_each_expert_whole_on_its_block_owner():
    lay = ReceiverLayout(4, expert_parallel=True, num_experts=16)
    assert [expert_owner(e, 16, 4) for e in (0, 3, 4, 15)] == [0, 0, 1, 3]
    assert placement(f"{P}.1.mlp.experts.5.up_proj.lora_B.weight", (32, 8), lay, MLA) == {1: None}
    # Non-expert modules keep their TP rule under EP.
    assert placement(f"{P}.1.self_attn.o_proj.lora_A.weight", (8, 64), lay, MLA) == row_parallel("A", (8, 64), 4)
    with pytest.raises(RoutingError, match="divisible"):
        ReceiverLayout(4, expert_parallel=True, num_experts=6)


# ---------------------------------------------------------------------------------------- ownership + plan


def test_assign_owners_lowest_rank_keeps_stream_order():
    owned = assign_owners([["a", "b", "x0"], ["b", "a", "x1"], ["c", "a"]])
    assert owned == [["a", "b", "x0"], ["x1"], ["c"]]


OPTS = RoutingRunOptions()


@pytest.fixture(scope="module")
def sender_plans() -> list[SyncPlan]:
    streams = ep_sharded_exports(OPTS)
    owned = assign_owners([[n for n, _ in s] for s in streams])
    return [
        build_plan(
            [(n, t) for n, t in s if n in set(o)],
            adapter_config=adapter_config(OPTS.rank, OPTS.alpha, OPTS.resolved().targets),
            lora_name="policy",
            version=1,
            bucket_bytes=OPTS.bucket_bytes,
        )
        for s, o in zip(streams, owned, strict=True)
    ]


def test_cross_rank_dedup_replicated_names_from_rank_0_experts_from_their_owner(sender_plans):
    streams = ep_sharded_exports(OPTS)
    per = OPTS.experts // OPTS.senders
    all_names = {n for s in streams for n, _ in s}
    sent = [set(p.manifest.public_names) for p in sender_plans]
    assert set().union(*sent) == all_names
    assert sum(len(s) for s in sent) == len(all_names)  # disjoint: every name sent by one rank
    for s, names in enumerate(sent):
        experts = {parse_name(n, MLA).expert for n in names} - {None}
        assert experts == set(range(s * per, (s + 1) * per))
        assert all(parse_name(n, MLA).expert is not None for n in names) == (s > 0)  # replicas only from rank 0
    # Within-rank exact dedup still applies: one shared adapter per EP rank -> 5 unique tensors per MoE layer.
    assert [len(p.tensors) for p in sender_plans[1:]] == [10, 10, 10]


def _pieces_by_tensor(plan) -> dict[tuple[int, str], list[tuple[Any, tuple[int, ...]]]]:
    out: dict[tuple[int, str], list] = {}
    for route in plan.routes:
        for p in route.pieces:
            out.setdefault((p.src, p.sent), []).append((p, route.receivers))
    return out


def test_tp4_each_unique_tensor_crosses_once_per_receiver_group(sender_plans):
    plan = plan_routes([p.manifest for p in sender_plans], ReceiverLayout(4), MLA)
    keys = [p.key for r in plan.routes for p in r.pieces]
    assert len(keys) == len(set(keys))  # a piece is in exactly one route
    assert len({r.key for r in plan.routes}) == len(plan.routes)
    for (s, sent), pieces in _pieces_by_tensor(plan).items():
        entry = next(e for e in sender_plans[s].manifest.tensors if e.name == sent)
        if len(pieces) == 1:  # needed whole by every TP rank: one broadcast to the full group
            ((p, rs),) = pieces
            assert p.slice is None and rs == (0, 1, 2, 3), sent
        else:  # split: each rank only its slice; the slices partition the tensor
            assert sorted(rs for _, rs in pieces) == [(0,), (1,), (2,), (3,)], sent
            assert sum(p.nbytes for p, _ in pieces) == entry.nbytes
            dims = {p.slice.dim for p, _ in pieces}
            assert len(dims) == 1
    table = plan.wire_table()
    assert set(table) == {f"s{s}->r{r}" for s in range(4) for r in range(4)}
    # Per receiver: the same bytes from each expert-owning sender (symmetric EP shards).
    assert len({table[f"s{s}->r{r}"]["bytes"] for s in (1, 2, 3) for r in range(4)}) == 1


def test_plan_refuses_inconsistent_sender_manifests(sender_plans):
    ms = [p.manifest for p in sender_plans]
    with pytest.raises(RoutingError, match="assign owners first"):
        plan_routes([ms[0], ms[0]], ReceiverLayout(4), MLA)
    bumped = Manifest.from_json(ms[1].to_json().replace('"version":1', '"version":2'))
    with pytest.raises(RoutingError, match="disagrees"):
        plan_routes([ms[0], bumped], ReceiverLayout(4), MLA)


# ------------------------------------------------------------------------------------- loopback execution


class Loopback(Transport):
    """Moves each route's packed stream by copying (stands in for the broadcasts); counts route deliveries."""

    name = "loopback"

    def __init__(self, packed: dict, corrupt: str | None = None) -> None:
        self.packed, self.corrupt, self.delivered = packed, corrupt, Counter()

    def prepare(self, plan):  # pragma: no cover - not used
        raise TypeError

    def incoming_bytes(self, manifest, handle) -> int:
        return max(r["base"] + r["nbytes"] for r in handle["routes"])

    def receive(self, manifest, handle, out) -> None:
        for r in handle["routes"]:
            key = (r["src"], tuple(r["receivers"]))
            src = self.packed[key]
            out[r["base"] : r["base"] + r["nbytes"]].copy_(src[: r["nbytes"]])
            self.delivered[route_label(key)] += 1
        if self.corrupt is not None:
            e = next(e for e in manifest.tensors if e.name == self.corrupt)
            out[e.offset] ^= 1


def _pack(plan, sender_plans) -> tuple[dict, dict]:
    packed, sums = {}, {}
    for s, sp in enumerate(sender_plans):
        s_sums, tensors = piece_checksums(plan, s, sp)
        sums.update(s_sums)
        for route in plan.routes_from(s):
            buf = torch.zeros(route.manifest.total_bytes, dtype=torch.uint8)
            pack_into(buf, route.manifest.tensors, tensors[route.key])
            packed[route.key] = buf
    return packed, sums


@pytest.mark.parametrize("layout", [ReceiverLayout(4), ReceiverLayout(4, True, 16)], ids=["tp4", "tp4_ep"])
def test_loopback_every_receiver_rebuilds_exactly_its_slices(sender_plans, layout):
    plan = plan_routes([p.manifest for p in sender_plans], layout, MLA)
    packed, sums = _pack(plan, sender_plans)
    full = full_reference(OPTS)
    for r in range(4):
        manifest, handle = plan.receiver_update(r, sums)
        manifest = Manifest.from_json(manifest.to_json())  # plain JSON on the control channel
        assert manifest.extra["routing"] == {"receiver": r, "layout": layout.to_json()}
        transport = Loopback(packed)
        got = AdapterReceiver().receive(manifest.to_json(), handle, transport)
        expected = expected_slices(full, layout, r, MLA)
        assert set(got.tensors) == set(expected)
        assert all(bytes_equal(got.tensors[n], t) for n, t in expected.items())
        assert set(transport.delivered.values()) == {1}  # each route once


def test_loopback_corrupt_piece_is_rejected(sender_plans):
    plan = plan_routes([p.manifest for p in sender_plans], ReceiverLayout(4), MLA)
    packed, sums = _pack(plan, sender_plans)
    manifest, handle = plan.receiver_update(2, sums)
    victim = manifest.tensors[-1].name
    with pytest.raises(UpdateRejected, match="checksum mismatch"):
        AdapterReceiver().receive(manifest.to_json(), handle, Loopback(packed, corrupt=victim))


def test_alias_across_sharding_rules_ships_whole_and_slice():
    """A sent tensor aliased by names with different TP rules (equal zero lora_B of a column- and a row-parallel
    module in one layer) reaches each receiver as the whole tensor and as its slice, each once."""
    g = torch.Generator().manual_seed(0)
    adapter = {
        "model.layers.0.self_attn.q_b_proj.lora_A.weight": torch.randn(8, 32, generator=g),
        "model.layers.0.self_attn.q_b_proj.lora_B.weight": torch.zeros(64, 8),
        "model.layers.0.self_attn.o_proj.lora_A.weight": torch.randn(8, 64, generator=g),
        "model.layers.0.self_attn.o_proj.lora_B.weight": torch.zeros(64, 8),
    }
    sp = build_plan(adapter, adapter_config={"r": 8, "lora_alpha": 8}, lora_name="x", version=1)
    assert sp.manifest.aliases == {
        "model.layers.0.self_attn.o_proj.lora_B.weight": "model.layers.0.self_attn.q_b_proj.lora_B.weight"
    }
    layout = ReceiverLayout(4)
    plan = plan_routes([sp.manifest], layout, MLA)
    b = "model.layers.0.self_attn.q_b_proj.lora_B.weight"
    pieces = _pieces_by_tensor(plan)[(0, b)]
    assert sorted((p.slice is None, rs) for p, rs in pieces) == [
        (False, (0,)),
        (False, (1,)),
        (False, (2,)),
        (False, (3,)),
        (True, (0, 1, 2, 3)),
    ]
    packed, sums = _pack(plan, [sp])
    for r in range(4):
        manifest, handle = plan.receiver_update(r, sums)
        got = AdapterReceiver().receive(manifest.to_json(), handle, Loopback(packed))
        expected = expected_slices(adapter, layout, r, MLA)
        assert set(got.tensors) == set(expected)
        assert all(bytes_equal(got.tensors[n], t) for n, t in expected.items())
        assert got.tensors[b].shape == (16, 8) and got.tensors[
            "model.layers.0.self_attn.o_proj.lora_B.weight"
        ].shape == (
            64,
            8,
        )


# ------------------------------------------------------------------------------------------ 8 processes


def _check_run(res: dict[str, Any], expert_parallel: bool) -> None:
    senders, receivers = res["senders"], res["receivers"]
    for r in receivers:
        assert r["names_ok"] and r["bit_exact"] and r["mismatched"] == [], r
    routes = {x["label"]: x for x in senders[0]["plan"]["routes"]}
    # Sender-side counts: every route broadcast exactly once per bucket, with the planned bytes.
    sent = {k: v for s in senders for k, v in s["stats"].items()}
    assert set(sent) == set(routes)
    for label, x in routes.items():
        assert sent[label]["broadcasts"] == x["buckets"], label
        assert sent[label]["bytes"] == x["wire_bytes"], label
        assert sent[label]["pieces"] == x["pieces"], label
    # Receiver-side counts agree with the sender's for every route the receiver is in.
    for r in receivers:
        me = r["rank"] - len(senders)
        mine = {lbl for lbl in routes if me in map(int, lbl.split("->r")[1].split(","))}
        assert set(r["stats"]) == mine
        for lbl in mine:
            assert r["stats"][lbl]["broadcasts"] == sent[lbl]["broadcasts"]
            assert r["stats"][lbl]["bytes"] == sent[lbl]["bytes"]
    # Each (sender, unique tensor, slice) crosses the wire in exactly one route.
    keys = [
        (s["rank"], name, json_slice)
        for s in senders
        for pieces in s["pieces"].values()
        for name, json_slice, _ in [(p[0], str(p[1]), p[2]) for p in pieces]
    ]
    assert len(keys) == len(set(keys))
    # Cross-rank dedup: owned names disjoint; non-expert replicas only from rank 0.
    owned = [set(s["owned_names"]) for s in senders]
    assert sum(map(len, owned)) == len(set().union(*owned))
    assert all(s["held"] == senders[0]["held"] for s in senders)
    if expert_parallel:  # an EP sender's experts go to exactly one receiver: the EP block owner
        for s in senders[1:]:
            assert list(s["stats"]) == [f"s{s['rank']}->r{s['rank']}"]


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp4", "tp4_ep"])
def test_eight_processes_ep4_senders_to_tp4_receivers(expert_parallel):
    res = run_routed_sync(RoutingRunOptions(expert_parallel=expert_parallel))
    _check_run(res, expert_parallel)
    table = res["senders"][0]["plan"]["wire_table"]
    print({k: (v["tensors"], v["bytes"]) for k, v in table.items()}, f"wall {res['wall_s']:.1f}s")
