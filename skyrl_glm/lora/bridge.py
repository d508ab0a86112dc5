"""The Megatron-Bridge adapter export, described from a config's shapes (no Bridge import, no allocation).

What ``AutoBridge.export_adapter_weights(model)`` yields for a GLM model with LoRA (read from Megatron-Bridge's
``peft_bridge.stream_adapter_weights_megatron_to_hf`` and ``GLM5Bridge.mapping_registry``):

* one ``(hf_name, tensor)`` per LoRA matrix, named after the HF base weight with ``.weight`` replaced by
  ``.lora_A.weight`` (Megatron ``linear_in``) or ``.lora_B.weight`` (``linear_out``), without the PEFT prefix,
  e.g. ``model.layers.3.self_attn.q_a_proj.lora_A.weight``; alpha is not folded in (scale = alpha / dim);
* a fused Megatron module yields one name per HF base weight: ``linear_fc1`` -> ``gate_proj`` and ``up_proj`` with
  the same ``linear_in`` under both ``lora_A`` names and ``linear_out`` chunked in two along dim 0 (gate first)
  under the ``lora_B`` names; GQA ``linear_qkv`` -> ``q_proj``/``k_proj``/``v_proj`` likewise;
* grouped routed experts (``mlp.experts.linear_fc{1,2}``) are emitted per expert under the checkpoint's per-expert
  names ``model.layers.L.mlp.experts.{e}.{gate,up,down}_proj``. With one adapter for all experts of a layer
  (``share_expert_adapters``; per EP rank when EP > 1) every expert name carries the same tensors: 6 * E names per MoE
  layer, 5 distinct tensors (fc1 A, gate B, up B, fc2 A, fc2 B). The gate and up ``lora_B`` are split from the fused
  ``linear_out`` anew for every expert (Bridge 0.6.2's ``_get_fused_adapter_linear_out_slices``), so each of those
  names comes as a view object of its own (:data:`VIEW_PER_EXPERT`);
* models whose HF checkpoint packs the experts (``mlp.experts.gate_up_proj`` / ``down_proj``, not GLM's) with
  shared-outer grouped-expert LoRA get the shared side as one ``(1, ...)`` tensor under the expert-agnostic name
  and the per-expert side as one 2D slice per expert under one expert-agnostic name, in expert order (SkyRL's file
  sync stacks those back to ``(E, ...)``, ``megatron_worker.py``);
* the order is the model's: layer by layer, module by module, ``lora_A`` before ``lora_B``, experts 0..E-1; the
  dtype is the adapter's parameter dtype; ``cpu=False`` leaves the tensors on the GPU. Whether the names of one
  tensor show one storage or equal copies is up to the exporter (a gather per name hands out copies), so
  :func:`synthetic_bridge_export` reproduces both.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from skyrl_glm.models.base import LoraPolicy

# What PEFT (and SkyRL's Megatron adapter source) puts before the export's names.
PEFT_PREFIX = "base_model.model."
# The export's names that come as a new view object per routed expert: the gate and up lora_B (see above).
VIEW_PER_EXPERT = re.compile(r"\.experts\.\d+\.(?:gate|up)_proj\.lora_B\.weight$")


def adapter_config(rank: int, alpha: float, targets: Sequence[str]) -> dict[str, Any]:
    """The PEFT ``adapter_config`` that travels with an export of these HF targets."""
    return {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": sorted({t.split(".")[-1] for t in targets}),
        "bias": "none",
    }


@dataclass(frozen=True)
class TensorSpec:
    """One public tensor of an adapter layout. Equal ``storage`` keys = the same tensor under several names."""

    name: str
    shape: tuple[int, ...]
    storage: str
    kind: str  # attention | indexer | dense_mlp | shared_expert | routed_expert

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def text_config(config: Any) -> Any:
    """The config that holds the text model's shapes: a multimodal one's (GLM-5.3-Flash's) text config, else
    itself (plain namespaces included)."""
    get = getattr(config, "get_text_config", None)
    return config if get is None else get()


def layer_is_moe(config: Any) -> list[bool]:
    """Per decoder layer of ``config``: whether it is a MoE layer (routed experts) or a dense one."""
    config = text_config(config)
    types = getattr(config, "mlp_layer_types", None)
    if types:
        return [t == "sparse" for t in types]
    k = getattr(config, "first_k_dense_replace", 0) or 0
    return [i >= k for i in range(config.num_hidden_layers)]


def bridge_export_specs(
    config: Any,
    lora: LoraPolicy,
    *,
    rank: int,
    targets: Sequence[str],
    share_expert_adapters: bool = True,
    expert_groups: int = 1,
) -> list[TensorSpec]:
    """The tensors ``export_adapter_weights`` yields for this config and these targets of the family's policy, in
    export order. Names and shapes come from each target's record (:attr:`LoraTarget.modules`, ``shape``); a
    Megatron fused module is adapted as a whole, so one member of a fused group brings the others. A multimodal
    config (GLM-5.3-Flash's) is read through its text model's, which holds the shapes. ``expert_groups``: with
    ``share_expert_adapters``, how many adapters a layer's experts share, one per group of consecutive experts
    (Bridge shares one per EP rank: the EP size)."""
    config = text_config(config)
    chosen = lora.with_fused_peers(targets)
    shapes = {t.hf: t.shape(config) if t.shape is not None else None for t in chosen}
    unknown = [hf for hf, shape in shapes.items() if shape is None]
    if unknown:
        raise ValueError(f"targets {unknown} are not LoRA-able linears of this config")
    specs: list[TensorSpec] = []
    n_exp = getattr(config, "n_routed_experts", 0) or 0
    if n_exp % expert_groups:
        raise ValueError(f"{n_exp} routed experts make no {expert_groups} equal groups")
    for layer, is_moe in enumerate(layer_is_moe(config)):
        for t in chosen:
            if t.kind == "dense_mlp" and is_moe or t.kind in ("shared_expert", "routed_expert") and not is_moe:
                continue
            fin, fout = shapes[t.hf]
            a_owner = lora.fused_owner(t).hf  # fused modules: one linear_in under every member's lora_A
            experts = range(n_exp) if t.kind == "routed_expert" else [None]
            for i in range(len(t.modules)):  # module by module, experts 0..E-1
                for e in experts:
                    if e is None or share_expert_adapters:
                        scope = (
                            f"L{layer}"
                            if e is None or expert_groups == 1
                            else f"L{layer}.g{e * expert_groups // n_exp}"
                        )
                    else:
                        scope = f"L{layer}.e{e}"
                    name = t.module_names(layer, e)[i]
                    specs.append(TensorSpec(f"{name}.lora_A.weight", (rank, fin), f"{scope}.{a_owner}.A", t.kind))
                    specs.append(TensorSpec(f"{name}.lora_B.weight", (fout, rank), f"{scope}.{t.hf}.{i}.B", t.kind))
    return specs


def synthetic_bridge_export(
    config: Any,
    lora: LoraPolicy,
    *,
    rank: int,
    targets: Sequence[str],
    share_expert_adapters: bool = True,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    copies: bool = False,
    device: torch.device | str = "cpu",
) -> Iterator[tuple[str, torch.Tensor]]:
    """A ``(name, tensor)`` stream shaped and shared like Bridge's export (for tests; Bridge itself needs TE), on
    ``device``, lazily. Names with one storage key get the *same* tensor object, as the exporter hands out one
    tensor for them; with ``copies`` each name gets a fresh copy made as it is yielded (a gather per name)."""
    specs = bridge_export_specs(config, lora, rank=rank, targets=targets, share_expert_adapters=share_expert_adapters)
    made = {k: v.to(device) for k, v in synthetic_values(specs, dtype=dtype, seed=seed).items()}
    for s in specs:
        yield s.name, made[s.storage].clone() if copies else made[s.storage]


def synthetic_values(
    specs: Sequence[TensorSpec], *, dtype: torch.dtype, seed: int, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """``{storage key: random value}`` for a layout, drawn in spec order from one seeded generator on ``device`` (so
    a stream and a benchmark built from the same specs, seed and kind of device hold the same values; a CPU and a
    CUDA generator draw different ones). On ``meta`` nothing is drawn: shapes and dtypes only."""
    device = torch.device(device)
    gen = None if device.type == "meta" else torch.Generator(device=device).manual_seed(seed)
    made: dict[str, torch.Tensor] = {}
    for s in specs:
        if s.storage not in made:
            if gen is None:
                made[s.storage] = torch.empty(s.shape, dtype=dtype, device=device)
            else:
                made[s.storage] = (torch.randn(s.shape, generator=gen, device=device) * 0.02).to(dtype)
    return made
