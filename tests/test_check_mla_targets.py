"""The check on the tiny GLM-5.3 (dense MLA in vLLM CPU): default targets PASS with the exact repeat test (1e-6);
a kv_b_proj LoRA, which vLLM silently ignores, FAILs at step 5; asking for kv_b_proj without the override is
refused up front, and what is refused follows what the sampler runs (stock or with SkyRL's worker wrap)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from skyrl_glm.check.algorithm import CheckConfig, run_check
from skyrl_glm.check.probes import make_probes
from skyrl_glm.check.scorers import hf_trainer, vllm_sampler
from skyrl_glm.plugins import registry
from skyrl_glm.sync.publisher import InMemoryPublisher
from skyrl_glm.sync.transports.shm import SharedMemoryTransport

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
FAMILY = registry().model("glm-5.3")
KV_B = "self_attn.kv_b_proj"


@pytest.fixture(scope="module")
def glm5_dir(tmp_path_factory):
    from skyrl_glm.models.tiny import make_tiny

    return make_tiny(FAMILY, tmp_path_factory.mktemp("glm5"), seed=0)


@pytest.fixture(scope="module")
def glm5_sampler(glm5_dir):
    targets = FAMILY.lora.resolve(sampler="vllm-cpu") + [KV_B]
    sampler = vllm_sampler(glm5_dir, family=FAMILY, targets=targets, rank=8, device="cpu", allow_unsupported=True)
    yield sampler
    sampler.close()


def _check(glm5_dir, sampler, targets, first_version):
    trainer = hf_trainer(glm5_dir, family=FAMILY, targets=targets, rank=8, alpha=16, device="cpu")
    publisher = InMemoryPublisher(sampler, SharedMemoryTransport())
    return run_check(
        trainer,
        sampler,
        publisher,
        make_probes(FAMILY.tiny_vocab_size),
        CheckConfig(first_version=first_version),
    )


def test_default_targets_pass_on_glm5(glm5_dir, glm5_sampler):
    report = _check(glm5_dir, glm5_sampler, FAMILY.lora.resolve(sampler="vllm-cpu"), 1)
    assert report.passed, report.first_failure
    assert report.steps[4].decode is not None and report.steps[4].decode.mean <= 0.05


def test_kv_b_proj_lora_fails_at_step_5(glm5_dir, glm5_sampler):
    report = _check(glm5_dir, glm5_sampler, [KV_B], 3)
    assert report.steps[2].passed  # the trainer moved: the perturbation is detectable
    assert report.first_failure is not None and report.first_failure.step == 5, report.first_failure


def test_cli_refuses_kv_b_proj_naming_the_module_and_why():
    proc = subprocess.run(
        [sys.executable, "-m", "skyrl_glm.cli", "check", "--model", "glm-5.3", "--lora-targets", KV_B],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    text = " ".join((proc.stdout + proc.stderr).split())
    assert "kv_b_proj" in text and "silently ignores" in text


def test_the_sampler_backend_decides_kv_b_proj() -> None:
    """SkyRL's worker wrap patches vLLM's MLA only when every piece of its patch imports; the backend name says which
    sampler really runs, and kv_b_proj is refused on every CPU backend (measured: ignored even with the patch)."""
    from skyrl.backends.skyrl_train.patches.vllm.patch_glm5next_lora_packing import apply_glm5next_lora_packing_patch
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention

    from skyrl_glm.models.base import UnsupportedTargetError
    from skyrl_glm.models.vllm_targets import sampler_backend

    apply_glm5next_lora_packing_patch()
    patched = bool(getattr(MLAAttention, "_skyrl_kv_b_proj_lora_patched", False))
    assert sampler_backend("cpu") == "vllm-cpu"
    assert sampler_backend("cpu", skyrl_worker=True) == ("vllm-cpu+skyrl" if patched else "vllm-cpu")
    assert sampler_backend("cuda", skyrl_worker=True) == ("vllm+skyrl" if patched else "vllm")
    for backend in ("vllm", "vllm-cpu", "vllm-cpu+skyrl"):
        with pytest.raises(UnsupportedTargetError, match="kv_b_proj"):
            FAMILY.lora.resolve([KV_B], sampler=backend)
    assert FAMILY.lora.resolve([KV_B], sampler="vllm+skyrl") == [KV_B]  # left to the check, which runs every time
    routed = "mlp.experts.gate_up_proj"
    assert routed in FAMILY.lora.resolve(sampler="vllm") and routed not in FAMILY.lora.resolve(sampler="vllm-cpu+skyrl")
