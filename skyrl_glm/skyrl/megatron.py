"""The Megatron policy worker with skyrl-glm's in-memory LoRA sync (adapter-only: ``merge_lora=false``).

SkyRL's Megatron worker module imports Megatron-Bridge, whose LoRA layers need Transformer Engine (CUDA), and
patches Megatron-Bridge's source at import: so this module holds the Megatron half of the sync as a mixin and
:func:`megatron_workers` (called by the plugin registry only for ``trainer.strategy=megatron``) imports SkyRL's
worker and builds the class.
The adapter is exported exactly as SkyRL's file sync exports it (``_save_lora_adapters_and_sync``: the bridge's
collective export, the per-module rank-scale fold, the fused-MoE expert layout vLLM accepts); skyrl-glm's plan
then folds ``alpha / r``, deduplicates and checksums, instead of a PEFT directory being written.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ray
import torch

from skyrl_glm.skyrl.worker_sync import GlmSyncMixin


class MegatronGlmSync(GlmSyncMixin):
    """The Megatron half of the sync, mixed in before SkyRL's ``MegatronPolicyWorkerBase``."""

    def _glm_memory_sync(self) -> bool:
        return super()._glm_memory_sync() and not self.cfg.policy.megatron_config.lora_config.merge_lora

    def _glm_adapter(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
        from megatron.bridge.models.conversion.peft_bridge import (
            build_adapter_config_dict,
            infer_target_modules_from_adapter_weights,
        )
        from skyrl.backends.skyrl_train.distributed.megatron.lora_export import fold_lora_rank_scale_for_vllm
        from skyrl.backends.skyrl_train.workers.megatron.megatron_worker import _convert_moe_experts_lora_to_vllm

        keep = torch.distributed.get_rank() == 0
        per_name: dict[str, list[torch.Tensor]] = {}
        # A collective on every rank; only rank 0 keeps the gathered tensors. Shared-outer grouped experts come
        # as one slice per expert under one name, in expert order: stacked back to (E, out, in).
        for name, tensor in self.bridge.export_adapter_weights(self.actor_module, cpu=keep, show_progress=False):
            if keep:
                per_name.setdefault(f"base_model.model.{name}", []).append(tensor.clone())
        if not keep:
            return None
        state = {n: ts[0] if len(ts) == 1 else torch.stack(ts, dim=0) for n, ts in per_name.items()}
        state, _ = fold_lora_rank_scale_for_vllm(state, config_rank=self.lora_cls.dim)
        state = _convert_moe_experts_lora_to_vllm(
            state, num_moe_experts=getattr(self.provider, "num_moe_experts", None)
        )
        targets = sorted(set(infer_target_modules_from_adapter_weights(state.keys())) - {"base_layer"})
        config = build_adapter_config_dict(
            self.lora_cls, target_modules=targets, base_model_name_or_path=str(self.cfg.policy.model.path)
        )
        return state, config

    def _glm_lora_b_params(self) -> Iterator[torch.Tensor]:
        # Megatron-Bridge LoRA: ``adapter.linear_in`` is A, ``adapter.linear_out`` is B.
        return (p for chunk in self.actor_module for n, p in chunk.named_parameters() if "adapter.linear_out" in n)


def megatron_workers() -> tuple[Any, Any, Any]:
    """``(PolicyWorker, CriticWorker, RefWorker)`` Ray actor classes for ``trainer.strategy=megatron``."""
    from skyrl.backends.skyrl_train.workers.megatron import megatron_worker

    policy = type(
        "MegatronPolicyWorkerBase",
        (MegatronGlmSync, megatron_worker.MegatronPolicyWorkerBase),
        {"__module__": __name__, "__doc__": "SkyRL's Megatron policy worker with skyrl-glm's in-memory LoRA sync."},
    )
    return ray.remote(num_gpus=1)(policy), megatron_worker.CriticWorker, megatron_worker.RefWorker
