"""A LoRA target's module-name pattern is one field of its record: the export names, the name -> target parse of
routing and the Megatron fused groups all derive from it, so a family with other module names needs its targets
alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from skyrl_glm.experimental.routing.plan import TargetRules, parse_name
from skyrl_glm.lora.bridge import PEFT_PREFIX, bridge_export_specs
from skyrl_glm.models import glm4, glm5
from skyrl_glm.models.base import LoraTarget


def _round_trip(family, config) -> int:
    """Every export name parses back to its own target, layer and expert, and that record rebuilds the name."""
    specs = bridge_export_specs(config, family.lora, rank=4, targets=[t.hf for t in family.lora.targets])
    rules = TargetRules(family.lora)
    for s in specs:
        for name in (s.name, PEFT_PREFIX + s.name):
            n = parse_name(name, rules)
            module = s.name.rsplit(".lora_", 1)[0]
            assert module in family.lora.target(n.target).module_names(n.layer, n.expert), (name, n)
    return len(specs)


@pytest.mark.parametrize("family", [glm5.FAMILY, glm4.FAMILY], ids=lambda f: f.name)
def test_builtin_export_names_round_trip(family):
    assert _round_trip(family, family.tiny_config()) > 0


def test_fused_groups_come_from_the_records():
    names = [t.hf for t in glm4.FAMILY.lora.with_fused_peers(["self_attn.k_proj", "mlp.down_proj"])]
    assert names == ["self_attn.k_proj", "mlp.down_proj", "self_attn.q_proj", "self_attn.v_proj"]
    mla = glm5.FAMILY.lora
    assert [t.hf for t in mla.with_fused_peers(["shared_experts.up_proj"])] == [
        "shared_experts.up_proj",
        "shared_experts.gate_proj",
    ]
    assert mla.fused_owner(mla.target("shared_experts.up_proj")).hf == "shared_experts.gate_proj"
    assert [t.hf for t in mla.with_fused_peers(["self_attn.q_a_proj"])] == ["self_attn.q_a_proj"]  # own module


def test_a_pattern_must_name_its_layer_and_only_a_routed_expert_its_expert():
    with pytest.raises(ValueError, match="must hold"):
        LoraTarget("attn.wq", None, "attention", modules=("blocks.attn.wq",))
    with pytest.raises(ValueError, match="must hold"):
        LoraTarget("moe.w1", None, "routed_expert", modules=("blocks.{layer}.moe.w1",))
    with pytest.raises(ValueError, match="plain module name"):
        LoraTarget("moe.w1", None, "routed_expert", modules=("blocks.{layer}.moe.w{expert}",))


# A third-party family whose checkpoints name their modules otherwise ("blocks.N.attn.wq", "...moe.experts.E.w1"),
# on the tiny GLM-4.5 shapes (2 layers: 1 dense + 1 MoE with 4 experts).
ACME = """
from skyrl_glm.models.base import COLUMN, EXPERT_COLUMN, EXPERT_ROW, QKV_KV, ROW, LoraPolicy, LoraTarget, ModelFamily
from skyrl_glm.models.glm4 import tiny_config
from skyrl_glm.plugins import hookimpl

B = "blocks.{layer}."


def heads(c, n):
    return n * c.head_dim


TARGETS = (
    LoraTarget("attn.wq", "linear_qkv", "attention", tp_style=COLUMN, modules=(B + "attn.wq",),
               shape=lambda c: (c.hidden_size, heads(c, c.num_attention_heads))),
    LoraTarget("attn.wk", "linear_qkv", "attention", tp_style=QKV_KV, modules=(B + "attn.wk",),
               shape=lambda c: (c.hidden_size, heads(c, c.num_key_value_heads))),
    LoraTarget("attn.wv", "linear_qkv", "attention", tp_style=QKV_KV, modules=(B + "attn.wv",),
               shape=lambda c: (c.hidden_size, heads(c, c.num_key_value_heads))),
    LoraTarget("attn.wo", "linear_proj", "attention", tp_style=ROW, modules=(B + "attn.wo",),
               shape=lambda c: (heads(c, c.num_attention_heads), c.hidden_size)),
    LoraTarget("ffn.w13", "linear_fc1", "dense_mlp", tp_style=COLUMN, modules=(B + "ffn.w1", B + "ffn.w3"),
               shape=lambda c: (c.hidden_size, c.intermediate_size)),
    LoraTarget("ffn.w2", "linear_fc2", "dense_mlp", tp_style=ROW, modules=(B + "ffn.w2",),
               shape=lambda c: (c.intermediate_size, c.hidden_size)),
    LoraTarget("moe.w13", "linear_fc1", "routed_expert", tp_style=EXPERT_COLUMN,
               modules=(B + "moe.experts.{expert}.w1", B + "moe.experts.{expert}.w3"),
               shape=lambda c: (c.hidden_size, c.moe_intermediate_size)),
    LoraTarget("moe.w2", "linear_fc2", "routed_expert", tp_style=EXPERT_ROW, modules=(B + "moe.experts.{expert}.w2",),
               shape=lambda c: (c.moe_intermediate_size, c.hidden_size)),
)


@hookimpl
def skyrl_glm_model_families():
    return [ModelFamily(name="acme-blocks", hf_model_type="acme_blocks", summary="other module names", facts={},
                        lora=LoraPolicy(targets=TARGETS), tiny_config=tiny_config)]
"""

# Run where the plugin is installed: round trip, routing placement on TP 2 (+ EP), sizes and the sync benchmark.
PROBE = """
import json, sys
from skyrl_glm.lora.bridge import PEFT_PREFIX, bridge_export_specs
from skyrl_glm.lora.sizes import family_sizes
from skyrl_glm.plugins import registry
from skyrl_glm.experimental.routing.plan import ReceiverLayout, TargetRules, parse_name, placement

fam = registry().model("acme-blocks")
cfg = fam.config("tiny")
specs = bridge_export_specs(cfg, fam.lora, rank=4, targets=fam.lora.resolve())
rules = TargetRules(fam.lora)  # the third-party family's own records route its names
back = []
for s in specs:
    n = parse_name(PEFT_PREFIX + s.name, rules)
    rebuilt = {m + ".lora_" + n.ab + ".weight" for m in fam.lora.target(n.target).module_names(n.layer, n.expert)}
    back.append(s.name in rebuilt)
tp = ReceiverLayout(2, num_kv_heads=cfg.num_key_value_heads)
ep = ReceiverLayout(2, expert_parallel=True, num_experts=cfg.n_routed_experts)
routed = [s for s in specs if s.kind == "routed_expert"]
sizes = family_sizes(fam, full=False, rank=4)
json.dump({
    "names": [s.name for s in specs],
    "round_trip": back,
    "tp_ranks": [sorted(placement(s.name, s.shape, tp, rules)) for s in specs],
    "ep_owner": [sorted(placement(s.name, s.shape, ep, rules)) for s in routed],
    "sizes": [sizes.public_tensors, sizes.unique_tensors],
}, sys.stdout)
"""


def test_a_family_with_other_module_names_reaches_sizes_bench_and_routing(tmp_path):
    """Installed through a ``skyrl_glm`` entry point like any third-party package, it declares its targets and
    nothing else: names round-trip (name -> parse -> same name), routing places them, sizes and bench count them."""
    (tmp_path / "acme_blocks.py").write_text(textwrap.dedent(ACME))
    dist = tmp_path / "acme_blocks-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-blocks\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[skyrl_glm]\nacme = acme_blocks\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}

    def run(*args: str) -> str:
        out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    got = json.loads(run("-c", PROBE))
    # 1 dense layer: q/k/v/o + w1/w3/w2; 1 MoE layer: q/k/v/o + 4 experts x w1/w3/w2; A and B each.
    assert len(got["names"]) == 2 * (4 + 3) + 2 * (4 + 4 * 3) == 46
    assert "blocks.1.moe.experts.3.w3.lora_B.weight" in got["names"]
    assert "blocks.0.ffn.w1.lora_A.weight" in got["names"]
    assert all(got["round_trip"]), got
    assert all(ranks == [0, 1] for ranks in got["tp_ranks"])  # every piece reaches both TP ranks
    assert sorted({r for ranks in got["ep_owner"] for r in ranks}) == [0, 1]  # experts 0-1 on rank 0, 2-3 on 1
    # Unique per layer: qkv one A + 3 B, wo A + B; fc1 one A + 2 B, fc2 A + B (experts share one adapter).
    assert got["sizes"] == [46, 2 * (6 + 5)]
    assert "acme-blocks (tiny)" in run("-m", "skyrl_glm.cli", "sizes", "acme-blocks", "--tiny", "--rank", "4")
    report = tmp_path / "bench.json"
    bench = ["-m", "skyrl_glm.cli", "bench", "sync", "--model", "acme-blocks", "--config", "tiny", "--rank", "4"]
    run(*bench, "--warmup", "0", "--no-disk", "--json", str(report))
    result = json.loads(report.read_text())
    assert result["adapter"]["model"] == "acme-blocks" and result["paths"]["ours"]["bit_exact"]
