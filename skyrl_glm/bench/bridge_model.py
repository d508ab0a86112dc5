"""``bench sync --exporter bridge``: the real Megatron-Bridge export, from a Megatron model built on the GPU.

The other exporters stand in for Megatron-Bridge (``bridge-stream`` yields the names and storage sharing
``lora/bridge.py`` describes from the config's shapes). Here Bridge itself builds the model from the family's HF
config cut to ``--layers`` MoE layers (full width with ``--config full``: as many layers as fit), with its LoRA on
the family's default targets as SkyRL's Megatron worker configures it, random base weights and seeded adapter values;
every sync then calls ``export_adapter_weights(cpu=False)`` as SkyRL's memory path and skyrl-glm's Megatron worker
do. One export, taken first, is the reference every rebuilt name is checked against (bit-exact).

Needs a CUDA GPU, Transformer Engine and Megatron-Bridge (SkyRL's Megatron stack); one process (the ``cpu``
transport), since the model lives in the sender.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import torch

from skyrl_glm.bench.synthetic import DTYPES, BenchOptions, Synthetic, model_config
from skyrl_glm.lora.bridge import PEFT_PREFIX


def _single_rank_parallel_state() -> None:
    """torch.distributed and Megatron's model-parallel groups for one rank (idempotent)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            from skyrl_glm.bench.procs import free_port

            os.environ["MASTER_PORT"] = str(free_port())
        dist.init_process_group("nccl", rank=0, world_size=1)
    if not mpu.model_parallel_is_initialized():
        mpu.initialize_model_parallel(1, 1)
        model_parallel_cuda_manual_seed(0)


class BridgeModel:
    """A Megatron model with Bridge LoRA on ``opts.device`` and its export stream."""

    def __init__(self, opts: BenchOptions) -> None:
        from megatron.bridge import AutoBridge
        from megatron.bridge.peft.lora import LoRA

        torch.cuda.set_device(torch.device(opts.device))
        _single_rank_parallel_state()
        family, cfg = model_config(opts.model, opts.config, opts.layers)
        self.targets = family.lora.resolve(sampler="vllm")
        self.n_experts = int(getattr(cfg, "n_routed_experts", 0) or 0)
        family.supply_defaults()
        with tempfile.TemporaryDirectory(prefix="skyrl-glm-bridge-") as folder:
            cfg.save_pretrained(folder)  # Bridge reads an HF config from a folder; no weights are loaded
            self.bridge = AutoBridge.from_hf_pretrained(folder)
            provider = self.bridge.to_megatron_provider(load_weights=False)
        provider.tensor_model_parallel_size = provider.pipeline_model_parallel_size = 1
        provider.expert_model_parallel_size = provider.expert_tensor_parallel_size = 1
        provider.context_parallel_size = 1
        provider.gradient_accumulation_fusion = False  # as SkyRL's worker sets it
        provider.moe_token_dispatcher_type = "alltoall"  # SkyRL's default
        provider.mtp_num_layers = None
        provider.finalize()
        lora = LoRA(
            target_modules=family.lora.megatron_targets(self.targets),
            dim=opts.rank,
            alpha=opts.alpha,
            lora_dtype=DTYPES[opts.dtype],
            share_expert_adapters=opts.share_experts,
        )
        provider.register_pre_wrap_hook(lambda model: lora(model, training=True))
        self.model = provider.provide_distributed_model(wrap_with_ddp=False, bf16=opts.dtype in ("bf16", "bfloat16"))
        gen = torch.Generator(device=opts.device).manual_seed(opts.seed)
        with torch.no_grad():  # B starts at zero in training: seeded values make every name's bytes checkable
            for chunk in self.model:
                for name, p in chunk.named_parameters():
                    if ".adapter." in name:
                        p.copy_(torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32) * 0.02)

    def lora_params(self) -> list[torch.Tensor]:
        """The model's LoRA parameters (``adapter.linear_in``: A, ``adapter.linear_out``: B)."""
        return [p for chunk in self.model for n, p in chunk.named_parameters() if "adapter.linear_" in n]

    def export(self) -> Iterator[tuple[str, torch.Tensor]]:
        """One sync's export, as SkyRL's memory path takes it (on the device, names without the PEFT prefix)."""
        return iter(self.bridge.export_adapter_weights(self.model, cpu=False, show_progress=False))

    def reference(self) -> Synthetic:
        """One export as the benchmark's reference: every public name, which storage it shows (names that show one
        storage share a key) and each storage's values on the CPU."""
        names: dict[str, str] = {}
        unique: dict[str, torch.Tensor] = {}
        seen: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], str] = {}
        for name, tensor in self.export():
            view = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
            key = seen.get(view)
            if key is None:
                key = seen[view] = name
                unique[key] = tensor.detach().to("cpu", copy=True)
            names[PEFT_PREFIX + name] = key
        return Synthetic(names, unique, list(self.targets), self.n_experts)


def exporter_problem(opts: Any) -> str | None:
    """Why ``--exporter bridge`` cannot run with these arguments here (one line), or None."""
    if opts.transport != "cpu":
        return "--exporter bridge: the model lives in the sending process; use --transport cpu"
    if not torch.cuda.is_available() or not str(opts.device or "").startswith("cuda"):
        return "--exporter bridge: Megatron-Bridge builds the model on a GPU; give --device cuda:N on a CUDA machine"
    from skyrl_glm.skyrl.compat.trainer_stack import trainer_stack_problem

    problem = trainer_stack_problem("megatron")
    return None if problem is None else f"--exporter bridge: {problem}"
