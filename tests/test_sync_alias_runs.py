"""The alias structure as compact rules (``sync/aliases.py``): exact on the sender, strict on the receiver.

A full GLM-5.3 update names 116,292 public tensors; the manifest carries ~450 runs (expert-index ranges) instead of
114,903 map entries. These tests show the rules rebuild exactly the names the exporter used, that names the rules
cannot express stay explicit, and that every malformed or ambiguous rule set is one rejection with a reason.
"""

from __future__ import annotations

import json

import pytest
import torch
from shm_receive import receive_over_shm

from skyrl_glm.bench.synthetic import BenchOptions, synthetic_adapter
from skyrl_glm.lora.bridge import adapter_config
from skyrl_glm.sync.aliases import AliasRun, cover
from skyrl_glm.sync.plan import build_plan
from skyrl_glm.sync.receiver import AdapterReceiver, UpdateRejected
from skyrl_glm.sync.transports.shm import SharedMemoryTransport

E = "base_model.model.model.layers.3.mlp.experts."


def test_runs_cover_expert_ranges_and_leave_the_rest_explicit():
    names = [f"{E}{e}.gate_proj.lora_A.weight" for e in range(8)] + [f"{E}{e}.up_proj.lora_A.weight" for e in range(8)]
    names += [
        f"{E}9.gate_proj.lora_A.weight",
        "base_model.model.model.layers.3.mlp.shared_experts.up_proj.lora_A.weight",
    ]
    runs, lone = cover(names, [len(names)], [names[0]])  # one sent tensor's names
    assert runs == [
        AliasRun(E, 0, 8, ".gate_proj.lora_A.weight", names[0]),
        AliasRun(E, 0, 8, ".up_proj.lora_A.weight", names[0]),
    ]
    assert [n for n, _ in lone] == names[16:]


def test_runs_never_claim_a_name_out_of_order():
    # expert 2 missing, 5 before 4: the probe finds candidates, the joined comparison keeps only exact runs
    names = [f"{E}{e}.down_proj.lora_B.weight" for e in (0, 1, 3, 5, 4, 6, 7, 8)]
    runs, lone = cover(names, [len(names)], [names[0]])
    rebuilt = [n for r in runs for n in r.names()] + [n for n, _ in lone]
    assert sorted(rebuilt) == sorted(names)  # every name exactly once
    assert [(r.start, r.stop) for r in runs] == [(6, 9)]


def test_full_size_rules_rebuild_every_public_name():
    """Full GLM-5.3 (2 MoE layers to stay small): the manifest's rules name exactly the exporter's names."""
    opts = BenchOptions(config="full", layers=2, rank=4).resolved()
    syn = synthetic_adapter(opts)
    made = {k: v[:1] for k, v in syn.unique.items()}  # the shapes do not matter here, only names and storage
    public = {n: made[k] for n, k in syn.names.items()}
    plan = build_plan(
        public, adapter_config=adapter_config(4, 8.0, syn.targets), lora_name="p", version=1, shared_storage=True
    )
    m = plan.manifest
    # per MoE layer: fc1 A under gate and up (2 runs), gate B, up B, down A, down B
    assert len(m.alias_runs) == 2 * 6
    full = {t.name: t.name for t in m.tensors} | m.alias_map()
    assert set(full) == set(public)
    for pub, sent in full.items():
        assert syn.names[pub] == syn.names[sent], pub
    assert len(m.to_json()) < 0.05 * len(json.dumps(m.alias_map()))


def _expert_plan():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 16, generator=g), torch.randn(32, 4, generator=g)
    adapter = {}
    for e in range(8):
        adapter[f"{E}{e}.gate_proj.lora_A.weight"] = a
        adapter[f"{E}{e}.gate_proj.lora_B.weight"] = b
    return build_plan(adapter, adapter_config={"r": 4, "lora_alpha": 4}, lora_name="p", version=1, shared_storage=True)


def test_expert_plan_uses_runs_and_is_received():
    p = _expert_plan()
    assert len(p.manifest.alias_runs) == 2 and p.manifest.aliases == {}
    tx = SharedMemoryTransport()
    handle = tx.prepare(p)
    try:
        got = AdapterReceiver().receive(p.manifest.to_json(), handle, tx).tensors
    finally:
        tx.release()
    assert len(got) == 16 and got[f"{E}7.gate_proj.lora_B.weight"] is got[f"{E}0.gate_proj.lora_B.weight"]


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda d: d["alias_runs"].__setitem__(0, {"head": E}), "must be \\[head, start, stop, tail, sent\\]"),
        (lambda d: d["alias_runs"][0].__setitem__(1, "0"), "must be \\[head, start, stop, tail, sent\\]"),
        (lambda d: d["alias_runs"][0].__setitem__(2, True), "must be \\[head, start, stop, tail, sent\\]"),
        (lambda d: d["alias_runs"][0].__setitem__(2, 0), "empty or outside"),
        (lambda d: d["alias_runs"][0].__setitem__(2, 2**40), "empty or outside"),
        (lambda d: d["alias_runs"][0].__setitem__(0, E[:-1]), "whole dotted component"),
        (lambda d: d["alias_runs"][0].__setitem__(4, "nope"), "which is not sent"),
        (lambda d: d.__setitem__("alias_runs", {"x": 1}), "'alias_runs' must be a list"),
        (lambda d: d["alias_runs"].append(list(d["alias_runs"][0])), "overlap"),
        (
            lambda d: d["aliases"].__setitem__(f"{E}3.gate_proj.lora_A.weight", d["tensors"][0][0]),
            "both explicit and in an alias run",
        ),
        (
            lambda d: d["alias_runs"].append(
                [
                    "base_model.model.model.layers.",
                    0,
                    9,
                    ".mlp.experts.3.gate_proj.lora_A.weight",
                    d["tensors"][0][0],
                ]
            ),
            "can name the same tensor",
        ),
    ],
)
def test_malformed_or_ambiguous_rules_are_rejected(edit, reason):
    p = _expert_plan()
    d = json.loads(p.manifest.to_json())
    edit(d["layout"])
    with pytest.raises(UpdateRejected, match=reason):
        receive_over_shm(p, json.dumps(d))


def test_a_run_without_its_pair_or_with_another_rank_is_rejected():
    p = _expert_plan()
    d = json.loads(p.manifest.to_json())
    b_run = next(r for r in d["layout"]["alias_runs"] if ".lora_B." in r[3])
    b_run[2] = 5  # experts 5..7 keep lora_A only
    with pytest.raises(UpdateRejected, match="missing tensors"):
        receive_over_shm(p, json.dumps(d))
    d = json.loads(p.manifest.to_json())
    d["layout"]["adapter_config"] = {"r": 8, "lora_alpha": 8}
    with pytest.raises(UpdateRejected, match="rank r=8"):
        receive_over_shm(p, json.dumps(d))
