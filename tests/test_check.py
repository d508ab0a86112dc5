"""The five-step check on the real vLLM CPU engine: PASS on the real sync path, FAIL on each broken one."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from background import Background

from skyrl_glm.check.algorithm import CheckConfig, run_check
from skyrl_glm.check.faults import EXPECTED_FAILURE, FaultNotApplicable, inject
from skyrl_glm.check.probes import make_probes
from skyrl_glm.sync.publisher import DiskPublisher, InMemoryPublisher
from skyrl_glm.sync.transports.shm import SharedMemoryTransport

pytestmark = [pytest.mark.vllm]
PROBES = make_probes(512)


def _check(trainer, sampler, publisher, versions, **cfg):
    return run_check(trainer, sampler, publisher, PROBES, CheckConfig(first_version=versions.next(2), **cfg))


def test_passes_on_the_in_memory_path(glm45_trainer, glm45_sampler, versions):
    report = _check(glm45_trainer, glm45_sampler, InMemoryPublisher(glm45_sampler, SharedMemoryTransport()), versions)
    assert report.passed, report.first_failure
    s1, s3, s5 = report.steps[0], report.steps[2], report.steps[4]
    assert s1.prefill.max <= 1e-5 and s5.prefill.max <= 1e-5  # fp32 proxy: exact up to float noise
    assert s1.decode.max <= 1e-5 and s5.decode.max <= 1e-5
    assert s3.prefill.mean > 0.05
    assert s1.extra["repeat_max"] <= 1e-6
    assert report.steps[4].extra["delta_mismatch_mean"] <= 1e-5


def test_passes_on_the_disk_baseline(glm45_trainer, glm45_sampler, versions, tmp_path):
    report = _check(glm45_trainer, glm45_sampler, DiskPublisher(glm45_sampler, root=tmp_path), versions)
    assert report.passed, report.first_failure


@pytest.mark.parametrize("fault", ["no-publish", "double-scale", "wrong-target", "prefill-only"])
def test_each_fault_fails_at_its_step(fault, glm45_trainer, glm45_sampler, versions):
    publisher, sampler = inject(fault, InMemoryPublisher(glm45_sampler, SharedMemoryTransport()), glm45_sampler)
    report = _check(glm45_trainer, sampler, publisher, versions)
    assert not report.passed
    assert report.first_failure.step == EXPECTED_FAILURE[fault], report.first_failure
    if fault == "prefill-only":  # prefill alone would have passed: only the decode path catches it
        assert report.steps[4].prefill.max <= 1e-5
        assert report.steps[4].decode.mean > 0.05


class NanAfterUpdate:
    """A deliberately broken path around the real engine: once the second version is published, every logprob
    the sampler reports is NaN (what a corrupt update does). The check passed this before NaN failed a step."""

    def __init__(self, publisher, sampler) -> None:
        self.publisher, self.sampler, self.published, self.broken = publisher, sampler, 0, False

    def publish(self, adapter, adapter_config, version):
        result = self.publisher.publish(adapter, adapter_config, version)
        self.published += 1
        self.broken = self.published >= 2
        return result

    def score(self, sequences):
        scores = self.sampler.score(sequences)
        return [[math.nan] * len(row) for row in scores] if self.broken else scores

    def generate(self, prompts, max_tokens):
        gens = self.sampler.generate(prompts, max_tokens)
        return [(toks, [math.nan] * len(lps)) for toks, lps in gens] if self.broken else gens


def test_nan_logprobs_fail_the_step(glm45_trainer, glm45_sampler, versions):
    broken = NanAfterUpdate(InMemoryPublisher(glm45_sampler, SharedMemoryTransport()), glm45_sampler)
    report = _check(glm45_trainer, broken, broken, versions)
    assert [s.passed for s in report.steps] == [True, True, True, True, False]
    assert "non-finite" in report.steps[4].detail
    assert not report.passed


def test_drop_aliases_is_rejected_at_step_4_when_tensors_are_shared(glm45_trainer, glm45_sampler, versions):
    # Tie the shared expert's up_proj lora_A to its gate_proj lora_A: one storage, two public names.
    layer = glm45_trainer.model.base_model.model.model.layers[1].mlp.shared_experts
    layer.up_proj.lora_A["default"].weight = layer.gate_proj.lora_A["default"].weight
    publisher, sampler = inject(
        "drop-aliases", InMemoryPublisher(glm45_sampler, SharedMemoryTransport()), glm45_sampler
    )
    report = _check(glm45_trainer, sampler, publisher, versions)
    assert report.first_failure is not None and report.first_failure.step == 4
    assert "missing tensors" in report.first_failure.detail


def test_drop_aliases_refuses_an_adapter_without_aliases(glm45_trainer, glm45_sampler, versions):
    publisher, sampler = inject(
        "drop-aliases", InMemoryPublisher(glm45_sampler, SharedMemoryTransport()), glm45_sampler
    )
    with pytest.raises(FaultNotApplicable):
        _check(glm45_trainer, sampler, publisher, versions)


def test_undetectable_perturbation_is_never_a_pass(glm45_trainer, glm45_sampler, versions):
    # scale 0 is refused as input; one far below what any logprob can show, with one scale for every group
    # (group_margin 0: no per-group calibration, which would grow it until the stale sampler disagrees)
    publisher = InMemoryPublisher(glm45_sampler, SharedMemoryTransport())
    report = _check(glm45_trainer, glm45_sampler, publisher, versions, scale=1e-12, group_margin=0.0)
    assert not report.passed
    assert report.first_failure.step == 2


SEEDS = range(6)


def _seeded_check(trainer, sampler, publisher, versions, seed):
    """One check as ``check-matrix --seeds`` runs it on shared sides: B zeroed, A, probes and noise from ``seed``."""
    trainer.reset_lora_b()
    trainer.seed_lora_a(seed)
    config = CheckConfig(first_version=versions.next(2), seed=seed)
    return run_check(trainer, sampler, publisher, make_probes(512, seed=seed), config)


def test_drop_shared_experts_fails_on_every_seed(glm45_trainer, glm45_sampler, versions):
    # The CPU analogue of drop-experts: vLLM's CPU build serves the shared expert's LoRA, not the routed experts'.
    groups = glm45_trainer.lora_groups()
    assert {"attention", "shared_expert", "dense_mlp"} <= set(groups)
    for seed in SEEDS:
        publisher, sampler = inject(
            "drop-shared-experts", InMemoryPublisher(glm45_sampler, SharedMemoryTransport()), glm45_sampler
        )
        report = _seeded_check(glm45_trainer, sampler, publisher, versions, seed)
        assert report.first_failure is not None and report.first_failure.step == 5, (seed, report.first_failure)
        three = report.steps[2]
        assert all(three.extra[f"without[{g}]"] > CheckConfig().group_bound for g in groups), three.extra
        assert report.steps[4].prefill.mean > CheckConfig().mean_tol


def test_drop_experts_needs_routed_expert_lora(glm45_trainer, glm45_sampler, versions):
    publisher, sampler = inject(
        "drop-experts", InMemoryPublisher(glm45_sampler, SharedMemoryTransport()), glm45_sampler
    )
    with pytest.raises(FaultNotApplicable, match="drop-experts needs an adapter with experts LoRA"):
        _seeded_check(glm45_trainer, sampler, publisher, versions, 0)


def test_a_seeded_check_gives_the_same_figures_twice(glm45_dir, glm45_sampler, versions):
    from skyrl_glm.check.scorers import hf_trainer
    from skyrl_glm.plugins import registry

    family = registry().model("glm-4.5")
    figures = []
    for global_seed in (1, 2):  # PEFT draws lora_A from the global RNG: it differs between the two runs
        torch.manual_seed(global_seed)
        trainer = hf_trainer(
            glm45_dir,
            family=family,
            targets=family.lora.resolve(sampler="vllm-cpu"),
            rank=8,
            alpha=16,
            device="cpu",
            seed=3,
        )
        report = run_check(
            trainer,
            glm45_sampler,
            InMemoryPublisher(glm45_sampler, SharedMemoryTransport()),
            make_probes(512, seed=3),
            CheckConfig(first_version=versions.next(2), seed=3),
        )
        assert report.passed, report.first_failure
        figures.append([(s.step, s.prefill and (s.prefill.mean, s.prefill.max), s.extra) for s in report.steps])
    steps_2_3 = [[f for f in run if f[0] in (2, 3)] for run in figures]
    assert steps_2_3[0] == steps_2_3[1]
    means = [[f[1] for f in run if f[0] in (1, 5)] for run in figures]
    assert means[0] == means[1]


def test_perturbation_requires_zero_b(glm45_trainer):
    glm45_trainer.perturb_lora_b(0.1)
    with pytest.raises(AssertionError, match="not zero"):
        glm45_trainer.perturb_lora_b(0.1)


def test_noise_is_seeded_by_tensor_name(glm45_dir):
    from skyrl_glm.check.trainer_hf import HfPeftTrainer

    a, b = (HfPeftTrainer(str(glm45_dir), targets=["self_attn.q_proj"], rank=4) for _ in range(2))
    a.perturb_lora_b(0.1)
    b.perturb_lora_b(0.1)
    for (na, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        if "lora_B" in na:
            assert torch.equal(pa, pb) and torch.count_nonzero(pa)


def _start_cli(tmp: Path, *args: str) -> Background:
    (tmp / "tmp").mkdir()
    env = {**os.environ, "SKYRL_GLM_CACHE": str(tmp / "cache"), "TMPDIR": str(tmp / "tmp")}
    env.pop("SKYRL_GLM_ENGINE_LOG", None)
    for name in ("VLLM_LOGGING_LEVEL", "LOGURU_LEVEL", "TRANSFORMERS_VERBOSITY"):
        env.pop(name, None)
    return Background.start(tmp, [sys.executable, "-m", "skyrl_glm.cli", *args], env=env)


@pytest.fixture(scope="module")
def cli_checks(tmp_path_factory):
    """The two CLI checks below, started together: each starts its own vLLM engine, ~50 s of start-up that mostly
    keeps one core busy importing, so on 2 cores they overlap well (and with the in-process check before them)."""
    quiet, no_publish = tmp_path_factory.mktemp("cli-quiet"), tmp_path_factory.mktemp("cli-no-publish")
    report = quiet / "reports" / "r"
    started = {
        "quiet": _start_cli(quiet, "check", "--json", f"{report}.json", "--plot", f"{report}.png"),
        "no-publish": _start_cli(no_publish, "-v", "check", "--fault", "no-publish", "--json", f"{no_publish}/r.json"),
    }
    yield started
    for cli in started.values():
        if cli.proc.poll() is None:
            cli.proc.kill()
            cli.proc.wait()


@pytest.mark.slow
@pytest.mark.usefixtures("cli_checks")  # first: the CLI checks start, and run beside this one
def test_check_runs_on_any_glm_checkpoint_dir(tmp_path):
    """A checkpoint made with plain transformers (other sizes than the built-in tiny config) via --model DIR."""
    from transformers import AutoModelForCausalLM, Glm4MoeConfig

    from skyrl_glm.check.runner import CheckOptions, run
    from skyrl_glm.models.tokenizer import build_tokenizer

    config = Glm4MoeConfig(
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=3,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        n_routed_experts=8,
        num_experts_per_tok=2,
        vocab_size=640,
        max_position_embeddings=512,
        initializer_range=0.1,
    )
    torch.manual_seed(5)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "ckpt")
    build_tokenizer(512).save_pretrained(tmp_path / "ckpt")
    report = run(CheckOptions(model=str(tmp_path / "ckpt"), workdir=str(tmp_path)))
    assert report.passed, report.first_failure
    assert report.info["model"] == "glm-4.5" and report.steps[4].prefill.max <= 1e-5


def test_cli_main_command_passes_quietly_and_writes_reports(cli_checks):
    cli = cli_checks["quiet"]
    out, png = cli.tmp / "reports" / "r.json", cli.tmp / "reports" / "r.png"
    proc = cli.wait(timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    report = json.loads(out.read_text())
    assert report["verdict"] == "PASS" and [s["step"] for s in report["steps"]] == [1, 2, 3, 4, 5]
    assert report["steps"][0]["decode"]["max"] <= 1e-5
    assert png.stat().st_size > 1000
    # The model the report names is still there (it was a deleted temporary directory), made from family + seed.
    assert report["info"]["tiny_model"] == {"family": "glm-4.5", "seed": 0}
    assert (Path(report["info"]["model_dir"]) / "model.safetensors").is_file()
    # Quiet by default: no vLLM log lines (there were over a hundred), nothing from the engine process.
    assert " INFO " not in log and "EngineCore" not in log and "Loading weights" not in log, log[-6000:]
    assert len(log.splitlines()) < 40, log[-6000:]
    # Output not a terminal: each setup phase is a line when it starts and one with its seconds when it ends.
    assert "check: starting the trainer (hf) and the sampler (vllm), warming both ...\n" in proc.stdout
    ready = r"^check: trainer and sampler ready \(\d+ s\); running the five steps \.\.\.$"
    assert re.search(ready, proc.stdout, re.M), proc.stdout
    assert re.search(r"^check: sampler stopped \(\d+ s\)$", proc.stdout, re.M), proc.stdout
    assert not list((cli.tmp / "tmp").glob("skyrl-glm-engine-*.log"))  # the engine's output went with the run


@pytest.mark.slow
def test_cli_no_publish_exits_1_naming_step_5_and_verbose_shows_vllm(cli_checks):
    cli = cli_checks["no-publish"]
    out = cli.tmp / "r.json"
    proc = cli.wait(timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert json.loads(out.read_text())["failed_step"] == 5
    assert "FAIL at step 5" in proc.stdout.replace("\n", " ")
    # -v lets vLLM's INFO log through, the engine-core process's included.
    assert "(EngineCore" in proc.stdout + proc.stderr
