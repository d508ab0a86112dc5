"""vLLM general plugin (entry point ``vllm.general_plugins``): runs in every vLLM process.

* Installs SkyRL's in-memory LoRA loader (``skyrl-memory://<name>`` adapters built from staged tensors), and keeps
  vLLM's LoRA name parses per name across loads (:mod:`skyrl_glm.sync.vllm.lora_names`); a version of a structure
  loaded before is cloned from its ``LoRAModel`` (:mod:`skyrl_glm.sync.vllm.load_memo`).
* Installs the shared-all and grouped expert layouts' slots (:mod:`skyrl_glm.sync.vllm.shared_factors`), on only
  in an engine that asks for it; packs per-expert factors as views of the received update where they allow one
  (:mod:`skyrl_glm.sync.vllm.expert_views`).
* Activates an adapter by replaying vLLM's own slot writes, recorded on the first activation of each adapter
  structure (:mod:`skyrl_glm.sync.vllm.slot_replay`).
* On CPU only: keeps the CPU fused-MoE backend when LoRA is enabled. vLLM otherwise forces the Triton
  MoE-LoRA backend, which fails on CPU; routed experts then carry no LoRA, so the target list must
  exclude them (the model policies do, for sampler ``vllm-cpu``).
* Registers the dense-MLA GLM-5.3 class for CPU serving (see :mod:`skyrl_glm.models.glm5_vllm_cpu`).
* Puts the run key on the API server's control routes (``/collective_rpc``, the other dev-mode routes, LoRA
  loading, SkyRL's own control routes): see :mod:`skyrl_glm.sync.vllm.route_guard`.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)
_DONE = False


def _keep_cpu_moe_backend_with_lora() -> None:
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig

    original = FusedMoEConfig.__post_init__

    def post_init(self) -> None:
        self.is_lora_enabled = False
        original(self)

    FusedMoEConfig.__post_init__ = post_init


def register() -> None:
    global _DONE
    if _DONE:
        return
    _DONE = True
    from skyrl.backends.skyrl_train.patches.vllm.patch_lora_in_memory import apply_lora_in_memory_patch
    from vllm.platforms import current_platform

    from skyrl_glm.sync.vllm import expert_views, load_memo, lora_names, route_guard, shared_factors, slot_replay

    apply_lora_in_memory_patch()
    load_memo.install()
    lora_names.install()
    route_guard.install()
    shared_factors.install()
    expert_views.install()
    slot_replay.install()
    if current_platform.is_cpu():
        _keep_cpu_moe_backend_with_lora()
        from skyrl_glm.models.glm5_vllm_cpu import register_cpu_model

        register_cpu_model()
    log.debug("skyrl_glm vLLM plugin registered")
