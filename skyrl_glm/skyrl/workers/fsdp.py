"""SkyRL's FSDP2 policy worker with skyrl-glm's in-memory LoRA sync.

SkyRL 0.4's FSDP worker syncs LoRA only through files (``lora.sync_mode=memory`` is Megatron-only there); this
subclass adds the in-memory path (:class:`~skyrl_glm.skyrl.workers.worker_sync.GlmSyncMixin`). SkyRL hands
``trainer.policy.model.lora.target_modules`` to PEFT as modules only, and transformers 5 keeps routed experts as
fused parameters (``mlp.experts.gate_up_proj``), which PEFT reaches only as ``target_parameters``: the worker's
``LoraConfig`` moves a registered family's routed-expert targets there (a seam in ``skyrl_glm/seams.py``).
"""

from __future__ import annotations

import os
import time
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
from skyrl_glm.skyrl.compat.flash_attn_stub import provide_bert_padding
from skyrl_glm.skyrl.workers.worker_sync import GlmSyncMixin

# SkyRL's FSDP worker imports flash_attn.bert_padding at module level: the stand-in first where flash-attn is
# missing (CPU mode, or a GPU stack without a flash-attn wheel). Here because a Ray worker process imports this
# module to rebuild the actor class.
provide_bert_padding()

from skyrl.backends.skyrl_train.workers import model_wrapper  # noqa: E402
from skyrl.backends.skyrl_train.workers.fsdp import fsdp_worker  # noqa: E402

if not hasattr(model_wrapper.LoraConfig, "expert_parameters_from"):
    model_wrapper.LoraConfig = lora_config_with_expert_parameters(model_wrapper.LoraConfig)


def lora_state_where_it_lives(module: Any) -> dict[str, torch.Tensor]:
    """The adapter's PEFT state, each tensor whole and on the device it trains on: SkyRL's ``collect_lora_params``
    without its copy to host memory, which suits its file sync, while the CUDA IPC transport sends GPU memory.
    ``full_tensor()`` is a collective over the FSDP mesh (call on every rank); a tensor that is not sharded is
    copied, so what is sent never aliases a parameter the next optimizer step changes."""
    from peft import get_peft_model_state_dict

    return {
        name: p.full_tensor().detach() if hasattr(p, "full_tensor") else p.detach().clone()
        for name, p in get_peft_model_state_dict(module).items()
    }


class FSDPPolicyWorkerBase(GlmSyncMixin, fsdp_worker.FSDPPolicyWorkerBase):
    """SkyRL's FSDP2 policy worker with skyrl-glm's in-memory LoRA sync."""

    def _glm_skips_transfer_engine(self) -> bool:
        # FSDP LoRA never uses SkyRL's weight-transfer engine (it syncs files, or skyrl-glm's transport): skip its
        # NCCL rendezvous (weight_senders.py:157), which would also fail on CPU.
        return self._is_lora

    def _glm_adapter(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
        tensors = lora_state_where_it_lives(self.model.model)
        if torch.distributed.get_rank() != 0:
            return None
        peft_model = getattr(self.model.model, "_fsdp_wrapped_module", self.model.model)
        fused = fused_expert_loras(peft_model)  # routed experts: PEFT's fused tensors -> vLLM's per-expert names
        config = vllm_adapter_config(peft_model.peft_config["default"].to_dict(), fused)
        return vllm_expert_adapter(dict(tensors), fused), config

    def _glm_lora_b_params(self) -> Iterator[torch.Tensor]:
        return (p for n, p in self.model.model.named_parameters() if "lora_B" in n)

    async def _save_lora_adapters_and_sync(
        self, peft_model: Any, lora_sync_path: str, inference_engine_client: Any, *args: Any, **kwargs: Any
    ) -> None:
        """SkyRL's own file sync (``skyrl_glm.sync.mode=disk``), timed: its save (gather, safetensors file, config)
        and vLLM's load of the file, so memory and disk syncs compare stage by stage."""
        t0 = time.perf_counter()
        load_s: list[float] = []
        load = inference_engine_client.load_lora_adapter

        async def timed_load(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return await load(*a, **k)
            finally:
                load_s.append(time.perf_counter() - t)

        inference_engine_client.load_lora_adapter = timed_load  # an instance attribute shadows the method
        try:
            await super()._save_lora_adapters_and_sync(
                peft_model, lora_sync_path, inference_engine_client, *args, **kwargs
            )
        finally:
            del inference_engine_client.load_lora_adapter
        if torch.distributed.get_rank() == 0:
            total = time.perf_counter() - t0
            self._glm_version += 1
            adapter_file = os.path.join(lora_sync_path, "adapter_model.safetensors")
            self._glm_last = {
                "ok": True,
                "version": self._glm_version,
                "transport": "disk",
                "save_s": total - sum(load_s),
                "load_s": sum(load_s),
                "total_s": total,
                "file_bytes": os.path.getsize(adapter_file) if os.path.isfile(adapter_file) else None,
            }


def fsdp_workers() -> tuple[Any, Any, Any]:
    """``(PolicyWorker, CriticWorker, RefWorker)`` Ray actor classes for ``trainer.strategy=fsdp``."""
    return ray.remote(num_gpus=1)(FSDPPolicyWorkerBase), fsdp_worker.CriticWorker, fsdp_worker.RefWorker
