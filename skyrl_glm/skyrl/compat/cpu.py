"""CPU mode (``skyrl_glm.cpu=true``): SkyRL 0.4's training loop on a machine without CUDA.

Everything CPU mode changes is here, and nothing here runs unless a config asks for it:

- :data:`REQUIRED` / :data:`DEFAULTS`: config settings (``apply_settings``, called by the recipe loader);
- :func:`ray_init_kwargs`: Ray with *logical* GPUs (SkyRL's actors and placement groups ask for GPUs), and
  :func:`install` as the worker-process setup hook so every Ray worker gets the patches;
- :func:`install`: runtime patches of SkyRL's CUDA assumptions, applied when the patched module is first
  imported (no installed file is edited).

Each lifted assumption, with the SkyRL file and line it comes from, is tabled in ``docs/skyrl.md``.
Read from SkyRL 0.4.0's source and a CPU run of its loop (2026-11-30).
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass
from typing import Any

from skyrl_glm.skyrl.compat.after_import import after_import
from skyrl_glm.skyrl.compat.flash_attn_stub import provide_bert_padding

SETUP_HOOK = f"{__name__}.install"
VLLM_CPU_WORKER = "vllm.v1.worker.cpu_worker.CPUWorker"
LOGICAL_GPUS = 2  # one policy worker + one vLLM engine, each on its own logical GPU


@dataclass(frozen=True)
class Setting:
    key: str
    value: Any
    why: str


REQUIRED = (
    Setting("trainer.placement.colocate_all", False, "colocation needs vLLM sleep mode, which vLLM's CPU build lacks"),
    Setting("trainer.flash_attn", False, "no flash-attention kernels on CPU"),
    Setting("trainer.remove_microbatch_padding", False, "padding-free micro-batches assert flash-attention 2"),
    Setting(
        "generator.inference_engine.engine_init_kwargs.worker_cls",
        VLLM_CPU_WORKER,
        "SkyRL's server actor forces vLLM's CUDA worker class unless one is given",
    ),
)
DEFAULTS = (
    Setting("trainer.logger", "console", "wandb needs an API key"),
    Setting("trainer.enable_ray_gpu_monitor", False, "there is no GPU to monitor"),
    Setting("trainer.gradient_checkpointing", False, "tiny CPU models do not need it"),
    Setting("trainer.algorithm.use_kl_loss", False, "no reference model: one logical GPU fewer"),
    Setting("trainer.placement.policy_num_gpus_per_node", 1, "GPU counts > 1 trigger CUDA peer-access probing"),
    Setting("generator.inference_engine.num_engines", 1, "one engine per logical GPU"),
    Setting("generator.inference_engine.tensor_parallel_size", 1, "GPU counts > 1 trigger CUDA peer-access probing"),
    Setting("generator.inference_engine.distributed_executor_backend", "mp", "a Ray executor would ask for GPUs"),
    Setting("generator.inference_engine.enable_ray_prometheus_stats", False, "no metrics server needed"),
    Setting("generator.inference_engine.gpu_memory_utilization", 0.1, "on vLLM CPU this is a fraction of host RAM"),
    Setting(
        "generator.inference_engine.engine_init_kwargs.enforce_eager",
        True,
        "SkyRL turns eager mode off when LoRA is on; torch.compile on CPU costs minutes",
    ),
)


def _get(values: dict[str, Any], key: str) -> Any:
    node: Any = values
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _set(values: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = values
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def apply_settings(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (the merged recipe, nested) with CPU mode's settings: a required one the recipe contradicts is
    an error; a default fills a key the recipe left unset."""
    for s in REQUIRED:
        current = _get(values, s.key)
        if current is not None and current != s.value:
            raise ValueError(f"{s.key}: skyrl_glm.cpu=true needs {s.value!r} ({s.why}), got {current!r}")
        _set(values, s.key, s.value)
    for s in DEFAULTS:
        if _get(values, s.key) is None:
            _set(values, s.key, s.value)
    return values


def runtime_env_vars() -> dict[str, str]:
    """Environment for every Ray worker in CPU mode (vLLM's CPU KV cache in GiB; keep it small)."""
    return {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}


def ray_init_kwargs(env_vars: dict[str, str]) -> dict[str, Any]:
    """``ray.init`` arguments: logical GPUs (SkyRL's ``initialize_ray`` passes none, so Ray would see 0) and the
    patch installer as the worker setup hook."""
    return {
        "num_gpus": LOGICAL_GPUS,
        "runtime_env": {"env_vars": {**env_vars, **runtime_env_vars()}, "worker_process_setup_hook": SETUP_HOOK},
    }


# -- runtime patches -------------------------------------------------------------------------------


def _cuda_missing(torch: types.ModuleType) -> bool:
    return not torch.cuda.is_available()


def _patch_torch(torch: types.ModuleType) -> None:
    if not _cuda_missing(torch):
        return
    # fsdp_strategy.py:109,132,146,452 and worker.py:451: set_device / synchronize raise without CUDA.
    torch.cuda.set_device = lambda *args, **kwargs: None
    torch.cuda.synchronize = lambda *args, **kwargs: None
    # worker.py:1090,1384,1473,... and fsdp_utils.py:52,83,249: tensors go to ``torch.cuda.current_device()``.
    torch.cuda.current_device = lambda: "cpu"
    # fsdp_utils.py:125 ``_sync_non_persistent_buffers`` moves buffers with ``.cuda()``.
    torch.Tensor.cuda = lambda self, *args, **kwargs: self


def _patch_distributed(distributed: types.ModuleType) -> None:
    # worker.py:124: ``init_process_group(backend="cpu:gloo,cuda:nccl")``; NCCL refuses to start without GPUs.
    init_process_group = distributed.init_process_group

    def gloo_process_group(*args: Any, **kwargs: Any) -> Any:
        import torch

        if _cuda_missing(torch) and "nccl" in str(kwargs.get("backend", "")):
            kwargs["backend"] = "gloo"
        return init_process_group(*args, **kwargs)

    distributed.init_process_group = gloo_process_group


def _patch_device_mesh(device_mesh: types.ModuleType) -> None:
    # worker.py:134 and fsdp_utils.py:256: ``init_device_mesh("cuda", ...)``.
    init_device_mesh = device_mesh.init_device_mesh

    def cpu_device_mesh(device_type: str, *args: Any, **kwargs: Any) -> Any:
        import torch

        if _cuda_missing(torch) and device_type == "cuda":
            device_type = "cpu"
        return init_device_mesh(device_type, *args, **kwargs)

    device_mesh.init_device_mesh = cpu_device_mesh


def _patch_fsdp_utils(fsdp_utils: types.ModuleType) -> None:
    # fsdp_utils.py:127 ``_sync_non_persistent_buffers``: with more than one policy rank, the ranks other than 0
    # receive rank 0's non-persistent buffers (rotary ``inv_freq``) into ``device="cuda"`` tensors. The same
    # broadcast into CPU tensors.
    import torch
    import torch.distributed as dist

    if not _cuda_missing(torch):
        return

    def sync_on_cpu(model: Any, loaded_sd: dict[str, Any]) -> None:
        for module in model.modules():
            for key in sorted(getattr(module, "_non_persistent_buffers_set", set())):
                buf = module._buffers.get(key)
                if buf is None:
                    continue
                src = buf.detach().clone() if dist.get_rank() == 0 else torch.empty(buf.shape, dtype=buf.dtype)
                dist.broadcast(src, src=0)
                module._buffers[key] = src

    fsdp_utils._sync_non_persistent_buffers = sync_on_cpu


def _patch_engine_placement(setup: types.ModuleType) -> None:
    # inference_servers/setup.py:221: without colocation the engines get a placement group of their own, PACKed,
    # so on a cluster with free GPUs on every node all engines land on one node. The multi-node recipes colocate,
    # which puts engine i beside the trainer ranks of node i; CPU mode cannot colocate (no sleep mode), so it
    # SPREADs the engines' bundles (one logical GPU each: TP is 1 in CPU mode) for that same one engine per node.
    # On one node SPREAD packs as PACK does.
    place = setup.ray_placement_group

    def spread(bundles: Any, strategy: str = "PACK", *args: Any, **kwargs: Any) -> Any:
        return place(bundles, "SPREAD" if strategy == "PACK" else strategy, *args, **kwargs)

    setup.ray_placement_group = spread


_installed = False


def install() -> None:
    """Apply CPU mode's patches in this process (idempotent). Also the Ray worker-process setup hook."""
    global _installed
    if _installed:
        return
    _installed = True
    os.environ.update(runtime_env_vars())
    provide_bert_padding()
    after_import("torch", _patch_torch)
    after_import("torch.distributed", _patch_distributed)
    after_import("torch.distributed.device_mesh", _patch_device_mesh)
    after_import("skyrl.backends.skyrl_train.inference_servers.setup", _patch_engine_placement)
    after_import("skyrl.backends.skyrl_train.distributed.fsdp_utils", _patch_fsdp_utils)
