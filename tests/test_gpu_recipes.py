"""The GPU recipes (tiny_gpu_grpo, canary_gpu) build SkyRL 0.4's real config with the layout the lead runs on one
GPU, and a wrong setting on the GPU path is one line and exit 2 before Ray starts (this machine has no GPU, so
the no-GPU refusal is tested for real here)."""

from __future__ import annotations

import re

import pytest
import ray
from omegaconf import OmegaConf

from skyrl_glm.cli import main
from skyrl_glm.skyrl.config.hardware import local_gpu_problem
from skyrl_glm.skyrl.config.recipes import load_config, resolve_recipe
from skyrl_glm.skyrl.config.sections import ConfigError, resolved_transport

GPU_RECIPES = ("tiny_gpu_grpo", "canary_gpu")


@pytest.mark.parametrize("name", GPU_RECIPES)
@pytest.mark.parametrize("model", ["tiny:glm-5.3", "tiny:glm-4.5"])
def test_gpu_recipe_is_colocated_bf16_memory_sync_over_ipc_checked_after_every_sync(name: str, model: str) -> None:
    cfg = load_config(name, [f"trainer.policy.model.path={model}"])
    assert not cfg.skyrl_glm.cpu and cfg.trainer.placement.colocate_all
    assert cfg.skyrl_glm.sync.mode == "memory" and resolved_transport(cfg.skyrl_glm, cfg.trainer.placement) == "ipc"
    assert cfg.skyrl_glm.check.before_training and cfg.skyrl_glm.check.every_n_syncs == 1
    assert (cfg.skyrl_glm.check.mean_tol, cfg.skyrl_glm.check.prob_tol) == (0.05, 0.1)  # bf16: the defaults
    assert not cfg.trainer.flash_attn and not cfg.trainer.remove_microbatch_padding
    assert cfg.trainer.policy.fsdp_config.mixed_precision.param_dtype == "bf16"
    assert cfg.generator.inference_engine.model_dtype == "bfloat16"
    assert cfg.trainer.max_training_steps >= 5
    # tiny_gpu_grpo: routed experts included (skyrl-glm's FSDP worker moves the fused-expert names to PEFT's
    # target_parameters); canary_gpu: without them (its recipe says why)
    targets = set(cfg.trainer.policy.model.lora.target_modules)
    routed = {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}
    assert "o_proj" in targets and (routed <= targets if name == "tiny_gpu_grpo" else not routed & targets)
    assert cfg.generator.inference_engine.engine_init_kwargs.get("lora_target_modules") is None


def test_canary_gpu_has_tiny_gpu_grpos_gpu_settings() -> None:
    """canary_gpu is composed on the CPU canary and repeats tiny_gpu_grpo's GPU layer: the two must not drift."""
    tiny = OmegaConf.load(resolve_recipe("tiny_gpu_grpo"))
    canary = OmegaConf.load(resolve_recipe("canary_gpu"))
    for key in (
        "trainer.placement",
        "trainer.flash_attn",
        "trainer.remove_microbatch_padding",
        "trainer.logger",
        "trainer.policy.fsdp_config",
        "generator.inference_engine",
        "skyrl_glm",
    ):
        assert OmegaConf.select(canary, key) == OmegaConf.select(tiny, key), key
    built = load_config("canary_gpu")
    assert built.environment.env_class == "glm_canary" and built.generator.n_samples_per_prompt == 16
    # the CPU canary's model; GLM-4.5's default targets without the routed experts (the recipe says why)
    assert built.trainer.policy.model.path == "tiny:glm-4.5"
    targets = set(built.trainer.policy.model.lora.target_modules)
    assert {"q_proj", "o_proj", "gate_proj", "down_proj"} <= targets and not {t for t in targets if "experts" in t}


def test_gpu_recipes_validate_and_dry_run_here(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("canary", *GPU_RECIPES):
        assert main(["recipes", "validate", name]) == 0
        assert f"ok {name}" in capsys.readouterr().out
    assert main(["train", "tiny_gpu_grpo", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "memory sync via ipc" in out and "1 node(s) x 1 H200" in out and "nothing was started" in out, out
    assert not ray.is_initialized()


def test_ipc_without_colocation_is_refused() -> None:
    with pytest.raises(ConfigError, match="skyrl_glm.sync.transport: ipc .* set trainer.placement.colocate_all=true"):
        load_config("tiny_gpu_grpo", ["trainer.placement.colocate_all=false", "skyrl_glm.sync.transport=ipc"])


def test_disk_sync_of_routed_experts_is_refused() -> None:
    """SkyRL 0.4.0's file sync hands vLLM PEFT's fused routed-expert tensors without is_3d_lora_weight: on one
    H200 every load stopped in vLLM 0.30's fused_moe.py (assert isinstance(lora_a, list)). Refused before Ray;
    without the routed experts the file sync runs (the comparison lanes of scripts/gpu-verify)."""
    with pytest.raises(
        ConfigError, match=r"skyrl_glm.sync.mode: disk .*\(mlp.experts.down_proj, mlp.experts.gate_up_proj\)"
    ):
        load_config("tiny_gpu_grpo", ["skyrl_glm.sync.mode=disk"])
    dense = "trainer.policy.model.lora.target_modules=[q_a_proj,q_b_proj,kv_a_proj_with_mqa,o_proj]"
    assert load_config("tiny_gpu_grpo", ["skyrl_glm.sync.mode=disk", dense]).skyrl_glm.sync.mode == "disk"


def _local_problem(cfg, cuda_available: bool, device_count: int) -> str | None:
    return local_gpu_problem(
        cfg.trainer,
        cfg.generator.inference_engine,
        cpu=cfg.skyrl_glm.cpu,
        cuda_available=cuda_available,
        device_count=device_count,
    )


def test_local_gpu_problem_names_what_is_missing() -> None:
    cfg = load_config("tiny_gpu_grpo")
    assert "no CUDA GPU is visible here" in (_local_problem(cfg, False, 0) or "")
    assert _local_problem(cfg, True, 1) is None
    two = load_config("tiny_gpu_grpo", ["trainer.placement.colocate_all=false", "skyrl_glm.hardware.gpus_per_node=2"])
    assert "needs 2 GPUs (1 trainer + 1 sampler) but 1 are visible here" in (_local_problem(two, True, 1) or "")
    assert _local_problem(load_config("tiny_cpu_grpo"), False, 0) is None  # CPU mode: logical GPUs


def _bridge_matches(pattern: str, module: str) -> bool:
    """Megatron-Bridge's target rule (its LoRA docs): the module's own name equals the target, or the target with
    each '*' read as any text matches the module's full name."""
    return module.rsplit(".", 1)[-1] == pattern or re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), module)


def test_the_megatron_canary_is_the_gpu_canary_with_the_megatron_trainer() -> None:
    """canary_gpu_megatron changes the trainer alone: its Megatron settings are tiny_gpu_megatron's, and its
    targets reach attention, the dense MLP and the shared experts of GLM-4.5's Megatron modules, never the routed
    experts (grouped or one module per expert), as canary_gpu's targets do."""
    canary, megatron = load_config("canary_gpu"), load_config("canary_gpu_megatron")
    tiny = load_config("tiny_gpu_megatron")
    assert megatron.trainer.strategy == "megatron" and megatron.generator == canary.generator
    assert megatron.skyrl_glm == canary.skyrl_glm and megatron.environment == canary.environment
    assert megatron.trainer.policy.megatron_config == tiny.trainer.policy.megatron_config
    assert (megatron.trainer.policy.model.path, megatron.trainer.policy.optimizer_config) == (
        canary.trainer.policy.model.path,
        canary.trainer.policy.optimizer_config,
    )
    targets = list(megatron.trainer.policy.model.lora.target_modules)
    trained = [
        "decoder.layers.0.self_attention.linear_qkv",
        "decoder.layers.0.self_attention.linear_proj",
        "decoder.layers.0.mlp.linear_fc1",
        "decoder.layers.0.mlp.linear_fc2",
        "decoder.layers.1.mlp.shared_experts.linear_fc1",
        "decoder.layers.1.mlp.shared_experts.linear_fc2",
    ]
    routed = ["decoder.layers.1.mlp.experts.linear_fc1", "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2"]
    assert all(any(_bridge_matches(t, m) for t in targets) for m in trained)
    assert not any(_bridge_matches(t, m) for t in targets for m in routed)
