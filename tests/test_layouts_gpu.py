"""The routed experts' serving layouts on vLLM's GPU build: each layout applied by vLLM's own loader and kernels
(the five-step check passes with the routed experts as the only targets, a stale or dropped adapter fails), the
shared-outer and shared-all refusals on the real engine, and drop-experts failing the default check on every seed.
One engine per test (``run_matrix`` shares it); each test is setup-dominated, about one minute on one H200.

GPU only (skipped on CPU CI). ``SKYRL_GLM_GPU_RESULTS=DIR`` keeps each matrix's JSON report there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from gpu_vllm import MARKS, keep_result, require_cuda_vllm

pytestmark = MARKS
require_cuda_vllm()

EXPERTS_ONLY = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
SEEDS = list(range(20))


def _outcomes(result: dict) -> dict[tuple[str, int], str]:
    return {(r["fault"], r["seed"]): r["outcome"] for r in result["checks"]}


@pytest.mark.parametrize("layout", ["per-expert", "stacked-3d", "shared-outer", "shared-all", "grouped:2"])
def test_each_layout_serves_the_routed_experts(layout: str) -> None:
    from skyrl_glm.check.matrix import run_matrix
    from skyrl_glm.check.runner import CheckOptions

    options = CheckOptions(model="glm-5.3", device="cuda", lora_targets=EXPERTS_ONLY, expert_layout=layout)
    result = run_matrix(options, ["ipc"], ["none", "no-publish", "drop-experts"], seeds=[0, 1])
    keep_result(f"layout_{layout}_glm53.json", result)
    got = _outcomes(result)
    assert got[("none", 0)] == got[("none", 1)] == "PASS", got
    assert got[("no-publish", 0)] == got[("drop-experts", 0)] == "FAIL at step 5", got
    three = next(r for r in result["checks"] if r["fault"] == "none")["report"]["steps"][2]
    assert three["extra"]["without[routed_expert]"] > 0.1  # leaving the experts out moves the trainer past 2x the bound
    assert result["all_as_expected"]


@pytest.mark.parametrize(
    ("layout", "factor"),
    [("shared-outer", "gate_proj.lora_A"), ("shared-all", "gate_proj.lora_B"), ("grouped:2", "down_proj.lora_A")],
)
def test_a_shared_layout_refuses_a_per_expert_adapter_before_it_serves(layout: str, factor: str) -> None:
    """The layout's refusal on the real engine: an adapter whose experts differ in a factor the layout keeps once
    cannot be served so (the engine would serve expert 0's to all); the receiver refuses, the previous version keeps
    serving. shared-all keeps gate/up lora_B once too, which shared-outer keeps per expert; grouped:2 keeps every
    factor once per group of two (experts 0 and 1 the first)."""
    from skyrl_glm.check.probes import make_probes
    from skyrl_glm.check.runner import CheckOptions, build, prepare, tiny_model_dir

    options = CheckOptions(
        model="glm-5.3", device="cuda", transport="ipc", lora_targets=EXPERTS_ONLY, expert_layout=layout
    )
    plan = prepare(options)
    probes = make_probes(plan.vocab_size)
    model_dir = tiny_model_dir(plan.family, Path(os.environ.get("TMPDIR", "/tmp")))[0]
    trainer, sampler, publisher, cleanup = build(options, plan, model_dir, probes)
    try:
        assert publisher.publish(trainer.adapter(), trainer.lora_config, 1).ok  # shared experts: served
        served = sampler.score(probes.sequences)
        per_expert = dict(trainer.adapter())
        name = next(n for n in per_expert if f".mlp.experts.1.{factor}" in n)
        per_expert[name] = per_expert[name] + 0.5  # expert 1 now differs from expert 0
        result = publisher.publish(per_expert, trainer.lora_config, 2)
        assert not result.ok and layout in result.reason and "expert 1" in result.reason, result.reason
        assert sampler.score(probes.sequences) == served  # version 1 still serves
    finally:
        for step in cleanup:
            step()


@pytest.mark.parametrize("layout", ["grouped:2", "grouped:4", "shared-all"])
def test_the_check_catches_one_group_of_experts_left_stale(layout: str) -> None:
    """The tiny GLM-5.3's 4 experts in groups (grouped:4: one expert each, through the expert-to-group map as
    grouped:2): the check passes, and an update whose first group kept its old lora_B (drop-expert-group) fails at
    step 5 on every seed, as a sampler that lost one EP rank's share of the adapter would."""
    from skyrl_glm.check.matrix import run_matrix
    from skyrl_glm.check.runner import CheckOptions

    options = CheckOptions(model="glm-5.3", device="cuda", lora_targets=EXPERTS_ONLY, expert_layout=layout)
    result = run_matrix(options, ["ipc"], ["none", "drop-expert-group"], seeds=SEEDS[:5])
    keep_result(f"drop_expert_group_{layout.replace(':', '')}_glm53.json", result)
    got = _outcomes(result)
    assert [got[("none", s)] for s in SEEDS[:5]] == ["PASS"] * 5, got
    assert [got[("drop-expert-group", s)] for s in SEEDS[:5]] == ["FAIL at step 5"] * 5, got
    assert result["all_as_expected"]


@pytest.mark.parametrize("model", ["glm-5.3", "glm-4.5"])
def test_drop_experts_fails_the_default_check_on_every_seed(model: str) -> None:
    from skyrl_glm.check.matrix import run_matrix
    from skyrl_glm.check.runner import CheckOptions

    result = run_matrix(CheckOptions(model=model, device="cuda"), ["ipc"], ["drop-experts"], seeds=SEEDS)
    keep_result(f"drop_experts_{model}_x20.json", result)
    outcomes = [r["outcome"] for r in result["checks"]]
    assert outcomes == ["FAIL at step 5"] * len(SEEDS), outcomes
    three = [r["report"]["steps"][2]["extra"] for r in result["checks"]]
    weakest = [min(v for k, v in extra.items() if k.startswith("without[")) for extra in three]
    assert min(weakest) > 0.1, weakest
