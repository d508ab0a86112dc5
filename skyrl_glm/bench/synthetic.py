"""The benchmark's options and its synthetic adapter: a Megatron-Bridge-shaped export of a registered model family."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from skyrl_glm.lora.bridge import PEFT_PREFIX
from skyrl_glm.sync.transports import HOST_LOCAL
from skyrl_glm.usage import UsageError

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class BenchOptions:
    model: str = "glm-5.3"
    config: str = "tiny"  # tiny | full
    layers: int | None = None  # keep only this many MoE layers (after the leading dense ones)
    rank: int = 32
    alpha: float | None = None  # default 2 * rank, so the fold is not a no-op
    dtype: str = "bf16"
    share_experts: bool = True
    expert_groups: int = 1  # with share_experts: one adapter per group of E/G consecutive experts
    copies: bool = False
    exporter: str = "resident"  # resident | bridge-stream | bridge
    transport: str = HOST_LOCAL
    device: str | None = None
    recv_device: str | None = None
    bucket_mb: int = 512
    seed: int = 0
    repeat: int = 1
    warmup: int = 1
    disk: bool = True
    disk_dir: str | None = None

    def resolved(self) -> BenchOptions:
        from skyrl_glm.plugins import registry

        o = BenchOptions(**asdict(self))
        transport = registry().transport(o.transport)
        cuda = torch.cuda.is_available()
        if o.alpha is None:
            o.alpha = float(2 * o.rank)
        if o.device is None:
            o.device = "cuda:0" if cuda and o.transport != "cpu" else "cpu"
        if o.recv_device is None:
            if transport.needs_group and o.device.startswith("cuda"):
                o.recv_device = "cuda:1" if torch.cuda.device_count() > 1 else "cuda:0"
            else:
                o.recv_device = o.device
        for flag, name in (("--device", o.device), ("--recv-device", o.recv_device)):
            _check_device(flag, name)
        if transport.needs_cuda and not (o.device.startswith("cuda") and o.recv_device.startswith("cuda")):
            raise UsageError(f"--transport {o.transport} moves CUDA memory: it needs CUDA devices (--device cuda:N)")
        if o.dtype not in DTYPES:
            raise UsageError(f"--dtype must be one of {sorted(DTYPES)}")
        return o


def _check_device(flag: str, name: str) -> None:
    """``name`` is this machine's CPU or one of its CUDA devices (UsageError otherwise)."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UsageError(f"{flag} {name!r}: not a device (cpu, cuda or cuda:N)") from None
    if device.type == "cpu":
        return
    if device.type != "cuda":
        raise UsageError(f"{flag} {name!r}: the benchmark runs on cpu or cuda devices")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise UsageError(f"{flag} {name!r}: no CUDA device on this machine (use cpu)")
    if (device.index or 0) >= count:
        raise UsageError(f"{flag} {name!r}: this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")


# ----------------------------------------------------------------------------------------------- synthetic adapter


EXPERT_WIDTH_STEP = 64  # a narrowed expert width stays a whole number of the fused-MoE kernels' column blocks


def model_config(model: str, config: str, layers: int | None, expert_width: int | None = None) -> tuple[Any, Any]:
    """The registered family and its tiny or full HF (text) config, cut to ``layers`` MoE layers when asked, naming
    its architecture as a checkpoint's config does. ``expert_width`` narrows the routed (and shared) experts'
    intermediate size alone: every layer keeps its modules, experts, names and other widths, so a full-width
    GLM-5.3's 75 MoE layers fit on one GPU (its experts take ~19 GB per layer at 2048)."""
    from skyrl_glm.lora.bridge import layer_is_moe, text_config
    from skyrl_glm.plugins import registry

    family = registry().model(model)
    cfg = text_config(family.config(config))
    if layers is not None:
        moe_idx = [i for i, m in enumerate(layer_is_moe(cfg)) if m]
        if not 0 < layers <= len(moe_idx):
            raise UsageError(f"--layers must be in 1..{len(moe_idx)} for {model}'s {config} config, got {layers}")
        keep = moe_idx[layers - 1] + 1
        for attr in ("mlp_layer_types", "layer_types"):
            if isinstance(getattr(cfg, attr, None), list):
                setattr(cfg, attr, getattr(cfg, attr)[:keep])
        cfg.num_hidden_layers = keep
    if expert_width is not None:
        full = int(cfg.moe_intermediate_size)
        if not (0 < expert_width <= full and expert_width % EXPERT_WIDTH_STEP == 0):
            raise UsageError(
                f"--expert-width must be a multiple of {EXPERT_WIDTH_STEP} in {EXPERT_WIDTH_STEP}..{full} for "
                f"{model}'s {config} config, got {expert_width}"
            )
        cfg.moe_intermediate_size = expert_width
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(cfg.model_type)
    if architecture and not getattr(cfg, "architectures", None):  # a checkpoint's config names it; Bridge needs it
        cfg.architectures = [architecture]
    return family, cfg


@dataclass
class Synthetic:
    """The export's public names, which storage each one shows, and the unique values (on CPU)."""

    names: dict[str, str]  # public name -> storage key
    unique: dict[str, torch.Tensor]  # storage key -> value
    targets: list[str]
    n_experts: int


def synthetic_adapter(
    opts: BenchOptions, expert_width: int | None = None, device: str | torch.device = "cpu"
) -> Synthetic:
    """The export of ``opts``'s model (its experts narrowed to ``expert_width``: :func:`model_config`), its values
    drawn on ``device`` (``meta``: none drawn, for what counts shapes and bytes only)."""
    from skyrl_glm.lora.bridge import bridge_export_specs, synthetic_values

    family, cfg = model_config(opts.model, opts.config, opts.layers, expert_width)
    targets = family.lora.resolve(sampler="vllm")
    specs = bridge_export_specs(
        cfg,
        family.lora,
        rank=opts.rank,
        targets=targets,
        share_expert_adapters=opts.share_experts,
        expert_groups=opts.expert_groups,
    )
    unique = synthetic_values(specs, dtype=DTYPES[opts.dtype], seed=opts.seed, device=device)
    names = {PEFT_PREFIX + s.name: s.storage for s in specs}
    return Synthetic(names, unique, targets, int(getattr(cfg, "n_routed_experts", 0) or 0))


def values_device(opts: BenchOptions, device: str) -> str:
    """Where a benchmark process on ``device`` draws the synthetic values: there, when the sender's and the
    receiver's devices are of one kind (both processes then draw the same values, which the receiver's bit-exact
    check confirms), else on the host. A full-size adapter drawn on the host took most of a benchmark's wall time on
    the GPU machine (measured 2026-12-04)."""
    same = torch.device(opts.device).type == torch.device(opts.recv_device).type
    return device if same else "cpu"


def is_lora_b(key: str) -> bool:
    """A LoRA B tensor (the alpha fold scales it), by its public or sent name."""
    return key.endswith(".B") or key.endswith(".lora_B.weight")


def fold_value(t: torch.Tensor, scale: float) -> torch.Tensor:
    """SkyRL's ``fold_lora_alpha_for_vllm`` arithmetic for one lora_B (float32 multiply, cast back)."""
    return t if scale == 1 else (t.to(torch.float32) * scale).to(t.dtype)
