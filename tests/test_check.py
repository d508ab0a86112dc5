"""The five-step check on the real vLLM CPU engine: PASS on the real sync path, FAIL on each broken one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

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
    report = _check(
        glm45_trainer, glm45_sampler, InMemoryPublisher(glm45_sampler, SharedMemoryTransport()), versions, scale=0.0
    )
    assert not report.passed
    assert report.first_failure.step == 2


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


@pytest.mark.slow
def test_cli_main_command_passes_and_writes_reports(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    proc = subprocess.run(
        [sys.executable, "-m", "skyrl_glm.cli", "check", "--json", str(out), "--plot", str(png)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["verdict"] == "PASS" and [s["step"] for s in report["steps"]] == [1, 2, 3, 4, 5]
    assert report["steps"][0]["decode"]["max"] <= 1e-5
    assert png.stat().st_size > 1000


@pytest.mark.slow
def test_cli_no_publish_exits_1_naming_step_5(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "skyrl_glm.cli", "check", "--fault", "no-publish", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert json.loads(out.read_text())["failed_step"] == 5
    assert "FAIL at step 5" in proc.stdout.replace("\n", " ")


@pytest.mark.slow
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
