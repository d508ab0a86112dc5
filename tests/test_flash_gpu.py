"""GLM-5.3-Flash on vLLM's GPU build (0.30 or later: KDA, NoPE-MLA + DSA, mHC), one trainer and one engine for all:

(a) the tiny Flash's prompt logprobs, HF fp32 against vLLM bf16 (the check's tolerances);
(b) the five-step check with the Flash adapter's default targets for stock vLLM, over CUDA IPC and from disk, every
    fault failing at its step;
(c) a Megatron-Bridge ``share_expert_adapters`` export (one routed-expert adapter per layer, the same tensor under
    every expert name: the two-node Flash recipe's layout) through ``InMemoryPublisher`` over CUDA IPC, deduplicated
    on the wire, serving what the trainer scores.

GPU only (skipped on CPU CI). ``SKYRL_GLM_GPU_RESULTS=DIR`` keeps each part's JSON there. Every assertion says what
went wrong in its message, so one run answers each part.
"""

from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from gpu_vllm import MARKS, keep_result, require_cuda_vllm

pytestmark = MARKS
torch = require_cuda_vllm()

MODEL = "glm-5.3-flash"
TRANSPORTS = ["ipc", "disk"]
FAULTS = ["none", "no-publish", "double-scale", "drop-aliases"]
PER_EXPERT = re.compile(r"^(?P<head>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<tail>(?:gate|up|down)_proj\.lora_[AB]\.weight)$")


def keep(name: str, result: dict[str, Any]) -> None:
    from skyrl_glm.provenance import provenance

    keep_result(name, {**result, **provenance()})


@pytest.fixture(scope="module")
def flash(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The check's own sides for the tiny Flash (HF+PEFT fp32 trainer on the GPU, vLLM engine with the worker
    extension), set up once; any failure to start says which side and why."""
    import vllm

    from skyrl_glm.check.probes import make_probes
    from skyrl_glm.check.runner import CheckOptions, build_sides, prepare, tiny_model_dir
    from skyrl_glm.sync.update import describe_error

    options = CheckOptions(model=MODEL, device="cuda")
    plans = {t: prepare(replace(options, transport=t)) for t in TRANSPORTS}
    plan = plans[TRANSPORTS[0]]
    workdir = tmp_path_factory.mktemp("flash")
    model_dir = tiny_model_dir(plan.family, workdir)[0]
    probes = make_probes(plan.vocab_size, seed=options.config.seed)
    try:
        trainer, sampler, stop = build_sides(options, plan, model_dir, probes)
    except Exception as e:  # noqa: BLE001 - the reason is the test's answer
        pytest.fail(
            f"tiny {MODEL} did not start (HF+PEFT trainer and vLLM {vllm.__version__} engine with targets "
            f"{plan.targets}): {describe_error(e)} (the engine's own log is in the captured stderr)"
        )
    yield SimpleNamespace(
        trainer=trainer, sampler=sampler, plans=plans, probes=probes, options=options, workdir=workdir, plan=plan
    )
    for step in stop:
        step()


def test_flash_prompt_logprobs_match_hf(flash: Any) -> None:
    """(a) The base model (lora_B == 0) on both sides: vLLM bf16 against HF fp32, within the check's step-1 bounds."""
    from skyrl_glm.check.algorithm import Diff

    flash.trainer.reset_lora_b()
    hf, vl = flash.trainer.score(flash.probes.sequences), flash.sampler.score(flash.probes.sequences)
    diff = Diff.between(hf, vl)
    result = {
        "model": MODEL,
        "tokens": len(diff.per_token),
        "mean": diff.mean,
        "max": diff.max,
        "prob_max": diff.prob_max,
    }
    keep("flash_hf_vs_vllm_logprobs.json", result)
    config = flash.options.config
    assert diff.within(config.mean_tol, config.prob_tol), (
        f"vLLM bf16 vs HF fp32 on the tiny Flash: mean {diff.mean:.4g} (bound {config.mean_tol}), "
        f"max |dp| {diff.prob_max:.4g} (bound {config.prob_tol}) over {len(diff.per_token)} tokens: the sampler does "
        "not run the trainer's model (a kernel or a config field read otherwise)"
    )


def test_flash_check_passes_and_faults_fail(flash: Any) -> None:
    """(b) Default targets (routed experts included) over CUDA IPC and disk; every fault fails at its step."""
    from skyrl_glm.check.matrix import run_pairs

    rows = run_pairs(flash.trainer, flash.sampler, flash.plans, FAULTS, flash.options, flash.workdir, [0])
    targets = sorted(flash.trainer.lora_config.get("target_modules") or [])
    keep(f"check_matrix_{MODEL}.json", {"model": MODEL, "lora_targets": targets, "checks": rows})
    assert {"gate_proj", "up_proj", "down_proj", "q_b_proj"} <= {t.rsplit(".", 1)[-1] for t in targets}, targets
    by_pair = {(r["transport"], r["fault"]): r for r in rows}

    def why(row: dict[str, Any]) -> str:
        steps = (row["report"] or {}).get("steps") or []
        failed = next((s for s in steps if not s.get("passed", True)), None)
        return f"{row['outcome']} (expected {row['expected']}); first failed step: {failed}" + row.get("note", "")

    for transport in TRANSPORTS:
        assert by_pair[(transport, "none")]["outcome"] == "PASS", f"{transport}: {why(by_pair[(transport, 'none')])}"
    wrong = {f"{t}/{f}": why(r) for (t, f), r in by_pair.items() if not r["as_expected"]}
    assert not wrong, wrong
    assert by_pair[("ipc", "drop-aliases")]["outcome"] != "n/a", "routed experts give the IPC path aliases to drop"


def share_experts(trainer: Any) -> int:
    """Make every routed expert's LoRA equal expert 0's in the trainer's fused PEFT parameters (what one shared
    adapter per layer means); returns the fused tensors changed."""
    changed = 0
    with torch.no_grad():
        for fused in trainer._fused_experts:
            module = trainer.model.get_submodule(fused.key)
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
            e, r = fused.num_experts, fused.rank
            a.view(e, r, -1)[1:] = a.view(e, r, -1)[:1]  # PEFT 0.18's lora_A: experts on dim 0 (vLLM's B side)
            b.view(-1, r, e)[..., 1:] = b.view(-1, r, e)[..., :1]  # lora_B: experts last (vLLM's A side)
            changed += 2
    return changed


def bridge_shared_layout(adapter: dict[str, Any]) -> dict[str, Any]:
    """The per-expert adapter as Megatron-Bridge exports ``share_expert_adapters``: every expert name of a layer
    carries expert 0's tensor object (one storage, so the sender dedups it by identity)."""
    out = {}
    for name, tensor in adapter.items():
        m = PER_EXPERT.match(name)
        out[name] = adapter[f"{m['head']}.0.{m['tail']}"] if m else tensor
    return out


def test_shared_expert_adapter_syncs_in_memory_deduplicated(flash: Any) -> None:
    """(c) InMemoryPublisher over CUDA IPC (the check's memory path, ``shared_storage`` as SkyRL's Megatron export
    hands it): the stale sampler disagrees, the deduplicated update lands, and then trainer and sampler agree."""
    from skyrl_glm.check.algorithm import Diff
    from skyrl_glm.plugins import registry
    from skyrl_glm.sync.publisher import InMemoryPublisher

    trainer, sampler, seqs, config = flash.trainer, flash.sampler, flash.probes.sequences, flash.options.config
    trainer.reset_lora_b()
    trainer.perturb_lora_b(config.scale, seed=config.seed)
    assert share_experts(trainer) > 0, "the trainer has no fused routed-expert LoRA to share"
    adapter = bridge_shared_layout(trainer.adapter())
    stale = Diff.between(trainer.score(seqs), sampler.score(seqs))
    publisher = InMemoryPublisher(sampler, registry().transport("ipc")(), shared_storage=True)
    plan = publisher.plan(adapter, trainer.lora_config, version=1000)
    unique = len(plan.manifest.tensors)
    result = publisher.send(plan)
    after = Diff.between(trainer.score(seqs), sampler.score(seqs))
    keep(
        "flash_shared_expert_sync.json",
        {
            "model": MODEL,
            "public_tensors": plan.public_count,
            "unique_tensors": unique,
            "aliases": len(plan.manifest.aliases),
            "ok": result.ok,
            "reason": result.reason,
            "timings": result.timings,
            "stale_mean": stale.mean,
            "after_mean": after.mean,
            "after_max": after.max,
        },
    )
    experts = sum(1 for n in adapter if PER_EXPERT.match(n))
    assert experts and unique < plan.public_count, (
        f"{plan.public_count} public names ({experts} per-expert) went out as {unique} tensors: the shared expert "
        "adapter was not deduplicated"
    )
    assert stale.mean > config.mean_tol, f"the perturbation is not visible to the stale sampler (mean {stale.mean:.4g})"
    assert result.ok, f"the sampler refused the shared-expert update: {result.reason}"
    assert after.within(config.mean_tol, config.prob_tol), (
        f"after the in-memory update: mean {after.mean:.4g}, max |dp| {after.prob_max:.4g} (bounds {config.mean_tol}, "
        f"{config.prob_tol}): the update was accepted but the sampler does not serve the trainer's adapter"
    )
