"""A built config checked as a whole before anything starts: what no single section can see.

Each section checks its own values (:mod:`skyrl_glm.skyrl.config.sections`); here are the combinations of
skyrl-glm's keys with SkyRL's that cannot work, SkyRL bounds SkyRL itself does not check
(:mod:`~skyrl_glm.skyrl.config.value_ranges`), the recipe's promises (:mod:`~skyrl_glm.skyrl.config.recipe_rules`)
and SkyRL's own ``validate_cfg``. Every problem is one :class:`~skyrl_glm.skyrl.config.sections.ConfigError` line
naming the key.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyrl_glm.check.faults import NO_FAULT
from skyrl_glm.lora.experts import routed_expert_targets
from skyrl_glm.plugins import registry
from skyrl_glm.skyrl.config.recipe_rules import problems as recipe_problems
from skyrl_glm.skyrl.config.sections import (
    AUTO_TRANSPORT,
    ConfigError,
    GlmSection,
    GlmTrainConfig,
    SyncSection,
    resolved_transport,
)
from skyrl_glm.skyrl.config.value_ranges import range_problem
from skyrl_glm.sync.expert_layout import (
    ENGINE_FLAGS,
    PER_EXPERT,
    SHARED_OUTER,
    STACKED_3D,
    LayoutError,
    engine_arguments,
    expert_groups,
    layout_of,
)
from skyrl_glm.sync.transports import GPU_LOCAL

if TYPE_CHECKING:
    from skyrl.train.config import DataConfig, TrainerConfig


def check_consistency(glm: GlmSection, trainer: TrainerConfig) -> None:
    """Combinations of ``skyrl_glm`` keys with SkyRL's trainer keys that cannot work; one :class:`ConfigError` each."""
    lora = trainer.policy.model.lora.rank > 0
    if glm.cpu and trainer.strategy != "fsdp":
        raise ConfigError(
            "skyrl_glm.cpu: SkyRL's Megatron worker needs Transformer Engine (CUDA); use trainer.strategy=fsdp"
        )
    if glm.sync.mode == "memory" and not lora:
        raise ConfigError("skyrl_glm.sync.mode: memory syncs a LoRA adapter; set trainer.policy.model.lora.rank > 0")
    if glm.sync.mode == "memory" and trainer.strategy == "megatron":
        if trainer.policy.megatron_config.lora_config.merge_lora:
            raise ConfigError(
                "skyrl_glm.sync.mode: memory ships the adapter alone; set "
                "trainer.policy.megatron_config.lora_config.merge_lora=false"
            )
    transport = resolved_transport(glm, trainer.placement)
    if glm.sync.mode == "memory" and registry().transport(transport).needs_group:
        from skyrl_glm.sync.transports.collective import CollectiveTransport

        if registry().transport(transport) is not CollectiveTransport:  # the group SkyRL runs open (sync_group)
            raise ConfigError(
                f"skyrl_glm.sync.transport: {transport} inside SkyRL needs a process group with the vLLM workers; "
                f"SkyRL runs open one for {CollectiveTransport.name} only"
            )
    spans = trainer.placement.policy_num_nodes > 1
    if glm.sync.mode == "memory" and spans and glm.sync.transport != AUTO_TRANSPORT:
        if not registry().transport(glm.sync.transport).crosses_nodes:
            raise ConfigError(
                f"skyrl_glm.sync.transport: {glm.sync.transport} reaches only engines on the trainer's sending node, "
                f"and the policy spans {trainer.placement.policy_num_nodes} nodes; use auto (per engine) or nccl"
            )
    if glm.cpu and glm.sync.transport == GPU_LOCAL:
        raise ConfigError(
            "skyrl_glm.sync.transport: ipc moves CUDA memory; with skyrl_glm.cpu=true use cpu, nccl (over gloo) or auto"
        )
    if glm.sync.mode == "memory" and transport == GPU_LOCAL and not trainer.placement.colocate_all:
        raise ConfigError(
            "skyrl_glm.sync.transport: ipc maps the trainer's GPU memory into vLLM on the same GPU; set "
            "trainer.placement.colocate_all=true, or transport=auto (shared memory on one node, nccl across nodes)"
        )
    if glm.sync.mode == "disk" and trainer.strategy == "fsdp" and lora and not glm.cpu:
        routed = sorted(routed_expert_targets() & set(trainer.policy.model.lora.target_modules or ()))
        if routed:  # measured on one H200: vLLM 0.30's fused_moe.py:386 assert isinstance(lora_a, list)
            raise ConfigError(
                f"skyrl_glm.sync.mode: disk loads PEFT's file, whose fused routed-expert tensors ({', '.join(routed)}) "
                "vLLM 0.30 takes only with is_3d_lora_weight, which SkyRL 0.4.0 does not send; use mode=memory or "
                "drop them from trainer.policy.model.lora.target_modules"
            )
    if glm.sync.fault != NO_FAULT and glm.sync.mode != "memory":
        raise ConfigError(
            "skyrl_glm.sync.fault: faults are injected into the memory sync; set skyrl_glm.sync.mode=memory"
        )
    if glm.sync.expert_layout != PER_EXPERT:
        expert_layout_problem = _expert_layout_problem(glm, trainer)
        if expert_layout_problem:
            raise ConfigError(f"skyrl_glm.sync.expert_layout: {expert_layout_problem}")
    if glm.check.before_training and not lora:
        raise ConfigError(
            "skyrl_glm.check.before_training: the check perturbs LoRA B; set trainer.policy.model.lora.rank > 0"
        )


def _expert_layout_problem(glm: GlmSection, trainer: TrainerConfig) -> str | None:
    """Why the run cannot serve its adapter in a stacked expert layout, or None."""
    layout = glm.sync.expert_layout
    if layout == STACKED_3D:
        return (
            "stacked-3d needs LoRARequest(is_3d_lora_weight=True), which SkyRL 0.4.0's servers do not send "
            "(load_lora_adapter); use per-expert or shared-outer"
        )
    if glm.sync.mode != "memory":
        return f"{layout} is built by the in-memory receiver; set skyrl_glm.sync.mode=memory"
    if trainer.strategy != "megatron" or not trainer.policy.model.lora.share_expert_adapters:
        return (
            f"{layout} serves one adapter per layer or per group of experts; only Megatron with "
            "trainer.policy.model.lora.share_expert_adapters=true trains such an adapter (use per-expert)"
        )
    ep = trainer.policy.megatron_config.expert_model_parallel_size
    groups = 1 if layout == SHARED_OUTER else expert_groups(layout)
    if groups is not None and groups % ep:
        return (
            f"{layout} keeps {groups} adapter(s) per layer, but share_expert_adapters trains one per EP rank: "
            f"expert_model_parallel_size={ep} gives {ep} groups of consecutive experts; use grouped:{ep}"
        )
    return None


def _engine_layout_problem(sync: SyncSection, engine: Mapping[str, Any]) -> str | None:
    """Why the engine arguments cannot start an engine in one expert layout, the run's, or None: both layout flags
    on (vLLM refuses them only after start-up), or, with the memory sync (whose layout's arguments join the user's
    there, :mod:`~skyrl_glm.skyrl.run.experiment`, the user's winning), a flag that contradicts the run's layout."""
    try:
        layout_of(engine)
        wanted = engine_arguments(sync.expert_layout, engine) if sync.mode == "memory" else {}
    except LayoutError as e:
        return str(e)
    for flag, on in wanted.items():
        if flag in ENGINE_FLAGS.values() and flag in engine and bool(engine[flag]) != on:
            return (
                f"{flag}={engine[flag]} contradicts skyrl_glm.sync.expert_layout={sync.expert_layout}; "
                "leave the flag out (the layout sets it)"
            )
    return None


def validate(cfg: GlmTrainConfig) -> None:
    """Everything a run needs of its config, checked before anything starts: SkyRL bounds it does not check itself,
    skyrl-glm's combinations, the recipe's rules, then SkyRL's own ``validate_cfg`` (on a copy). One
    :class:`ConfigError` (naming the key) for the first problem."""
    from skyrl.train.utils import validate_cfg

    if problem := range_problem(cfg):  # SkyRL values it takes at any value (counts, sampling, LoRA, engine args)
        raise ConfigError(problem)
    check_consistency(cfg.skyrl_glm, cfg.trainer)
    if problem := _engine_layout_problem(cfg.skyrl_glm.sync, cfg.generator.inference_engine.engine_init_kwargs):
        raise ConfigError(f"generator.inference_engine.engine_init_kwargs: {problem}")
    if found := recipe_problems(cfg):  # layout vs stated hardware, sampler-ignored LoRA targets, overlong buffer
        raise ConfigError(found[0])
    # On a copy: validate_cfg also rewrites a few keys (the run's own call, in train, keeps them), and it asks this
    # machine for WANDB_API_KEY, which only the run's machine must have (train checks it there).
    probe = copy.deepcopy(cfg)
    if probe.trainer.logger == "wandb" and not os.environ.get("WANDB_API_KEY"):
        probe.trainer.logger = "console"
    try:
        validate_cfg(probe)
    except AssertionError as e:  # SkyRL's checks are asserts, some without a message
        raise ConfigError(f"SkyRL's validate_cfg refused the config: {_assertion(e)}") from None


def _assertion(e: AssertionError) -> str:
    if str(e):
        return str(e).splitlines()[0]
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"assertion at {Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}" if tb else "assertion failed"


def missing_data(data: DataConfig) -> str | None:
    """The first training or eval data file that does not exist (checked before a run starts), or None."""
    for role, files in (("data.train_data", data.train_data), ("data.val_data", data.val_data or [])):
        for f in files:
            if not Path(f).is_file():
                return f"{role}: {f}: no such file (skyrl-glm data prepare ... writes it)"
    return None
