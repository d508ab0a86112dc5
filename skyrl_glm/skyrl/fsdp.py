"""SkyRL's FSDP2 policy worker with skyrl-glm's in-memory LoRA sync.

SkyRL 0.4's FSDP worker syncs LoRA only through files (``lora.sync_mode=memory`` is Megatron-only there); this
subclass adds the in-memory path (:class:`~skyrl_glm.skyrl.worker_sync.GlmSyncMixin`). SkyRL hands
``trainer.policy.model.lora.target_modules`` to PEFT as modules only, and transformers 5 keeps routed experts as
fused parameters (``mlp.experts.gate_up_proj``), which PEFT reaches only as ``target_parameters``: the worker's
``LoraConfig`` moves a registered family's routed-expert targets there (a seam in ``skyrl_glm/seams.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ray
import torch

from skyrl_glm.lora.experts import (
    fused_expert_loras,
    lora_config_with_expert_parameters,
    vllm_adapter_config,
    vllm_expert_adapter,
)
from skyrl_glm.skyrl.bert_padding import provide_bert_padding
from skyrl_glm.skyrl.worker_sync import GlmSyncMixin

provide_bert_padding()  # before SkyRL's worker modules, which import flash_attn.bert_padding

from skyrl.backends.skyrl_train.workers import model_wrapper  # noqa: E402
from skyrl.backends.skyrl_train.workers.fsdp import fsdp_worker  # noqa: E402

if not hasattr(model_wrapper.LoraConfig, "expert_parameters_from"):
    model_wrapper.LoraConfig = lora_config_with_expert_parameters(model_wrapper.LoraConfig)


class FSDPPolicyWorkerBase(GlmSyncMixin, fsdp_worker.FSDPPolicyWorkerBase):
    """SkyRL's FSDP2 policy worker with skyrl-glm's in-memory LoRA sync."""

    def _glm_skips_transfer_engine(self) -> bool:
        # FSDP LoRA never uses SkyRL's weight-transfer engine (it syncs files, or skyrl-glm's transport): skip its
        # NCCL rendezvous (weight_senders.py:157), which would also fail on CPU.
        return self._is_lora

    def _glm_adapter(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
        from skyrl.backends.skyrl_train.distributed.fsdp_utils import collect_lora_params

        tensors = collect_lora_params(module=self.model.model)  # full_tensor(): a collective over the FSDP mesh
        if torch.distributed.get_rank() != 0:
            return None
        peft_model = getattr(self.model.model, "_fsdp_wrapped_module", self.model.model)
        fused = fused_expert_loras(peft_model)  # routed experts: PEFT's fused tensors -> vLLM's per-expert names
        config = vllm_adapter_config(peft_model.peft_config["default"].to_dict(), fused)
        return vllm_expert_adapter(dict(tensors), fused), config

    def _glm_lora_b_params(self) -> Iterator[torch.Tensor]:
        return (p for n, p in self.model.model.named_parameters() if "lora_B" in n)


def fsdp_workers() -> tuple[Any, Any, Any]:
    """``(PolicyWorker, CriticWorker, RefWorker)`` Ray actor classes for ``trainer.strategy=fsdp``."""
    return ray.remote(num_gpus=1)(FSDPPolicyWorkerBase), fsdp_worker.CriticWorker, fsdp_worker.RefWorker
