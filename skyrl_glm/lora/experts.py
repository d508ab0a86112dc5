"""Routed-expert LoRA in the layout vLLM loads: PEFT's fused-expert tensors as per-expert checkpoint names.

transformers 5 keeps a MoE layer's routed experts as two 3D parameters (``mlp.experts.gate_up_proj [E, 2I, H]``,
``mlp.experts.down_proj [E, H, I]``, each ``[E, out, in]`` for ``F.linear``) and PEFT targets them with
``target_parameters``. PEFT 0.18.1 (SkyRL 0.4's pin) wraps each such parameter in a ``ParamWrapper`` whose adapter is
``lora_A [r*E, d1]`` and ``lora_B [d2, r*E]`` over the parameter's dims ``[E, d1, d2]``: its delta is
``A_e^T B_e^T`` with ``A_e = A.view(E, r, d1)[e]`` and ``B_e = B.view(d2, r, E)[:, :, e]``, so PEFT's A sits on the
*output* side of ``F.linear`` and its B on the input side. Published unconverted, vLLM either refuses the tensors
or (3D format) applies them transposed.

:func:`vllm_expert_adapter` rewrites them as the checkpoint's per-expert names, the layout Megatron-Bridge exports and
vLLM's GPU build loads without flags (``FusedMoEWithLoRA`` packs ``experts.{e}.{gate,up,down}_proj``):
``lora_A_e = B_e^T [r, in]``, ``lora_B_e = A_e^T [out, r]``, the gate/up halves of ``lora_B_e`` split on dim 0
(gate first, as transformers chunks ``gate_up_proj``) and one ``lora_A_e`` under both names. Every output is a view
of PEFT's live parameters: no copy here; the sync's dedup sends what is unique, its plan copies once into the stream.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from skyrl_glm.usage import UsageError

# The two fused parameters of a transformers 5 MoE experts module and the per-expert names they stand for.
FUSED_PROJECTIONS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}


@dataclass(frozen=True)
class FusedExpertLora:
    """One PEFT ``ParamWrapper`` over a fused expert parameter: where its tensors are and how they are laid out.

    ``key`` is the state-dict prefix of its ``lora_A``/``lora_B`` (``...mlp.experts`` or, when a second parameter
    of the module is wrapped around it, ``...mlp.experts.base_layer``); ``experts`` the module name the per-expert
    names hang from (``...mlp.experts``); ``param`` the wrapped parameter (``gate_up_proj`` / ``down_proj``).
    """

    key: str
    experts: str
    param: str
    num_experts: int
    rank: int
    out_features: int  # the parameter's dim 1 (F.linear's output)
    in_features: int  # the parameter's dim 2 (F.linear's input)


def fused_expert_loras(peft_model: Any, adapter_name: str = "default") -> list[FusedExpertLora]:
    """Every fused-expert ``ParamWrapper`` of a PEFT model, with state-dict keys as PEFT saves them.

    Refuses a layout this module does not convert (another PEFT's ``ParamWrapper`` dims), by name, rather than
    publishing tensors vLLM would apply transposed."""
    from peft.tuners.lora.layer import ParamWrapper

    found = []
    for module_name, module in peft_model.named_modules():
        if not isinstance(module, ParamWrapper) or module.parameter_name not in FUSED_PROJECTIONS:
            continue
        param = module.get_param()
        if param.dim() != 3:
            continue
        num_experts, d1, d2 = param.shape
        if (module.num_experts, module.in_features, module.out_features) != (num_experts, d1, d2):
            import peft

            raise UsageError(
                f"{module_name}.{module.parameter_name}: PEFT {peft.__version__} lays fused-expert LoRA out as "
                f"(E={module.num_experts}, in={module.in_features}, out={module.out_features}) over a parameter "
                f"{list(param.shape)}; skyrl-glm converts PEFT 0.18.1's layout (install peft==0.18.1)"
            )
        found.append(
            FusedExpertLora(
                key=module_name,
                experts=re.sub(r"(\.base_layer)+$", "", module_name),
                param=module.parameter_name,
                num_experts=num_experts,
                rank=module.r[adapter_name],
                out_features=d1,
                in_features=d2,
            )
        )
    return found


def per_expert_views(fused: FusedExpertLora, lora_a: torch.Tensor, lora_b: torch.Tensor) -> dict[str, torch.Tensor]:
    """The per-expert ``{name: view}`` of one fused-expert adapter (see the module docstring for the algebra)."""
    e, r = fused.num_experts, fused.rank
    if lora_a.shape != (r * e, fused.out_features) or lora_b.shape != (fused.in_features, r * e):
        raise ValueError(
            f"{fused.key}: lora_A {list(lora_a.shape)} / lora_B {list(lora_b.shape)} are not PEFT's fused layout for "
            f"E={e}, r={r}, parameter [E, {fused.out_features}, {fused.in_features}]"
        )
    a_side = lora_b.view(fused.in_features, r, e).permute(2, 1, 0)  # [E, r, in]: vLLM's lora_A per expert
    b_side = lora_a.view(e, r, fused.out_features).transpose(1, 2)  # [E, out, r]: vLLM's lora_B per expert
    names = FUSED_PROJECTIONS[fused.param]
    halves = b_side.chunk(len(names), dim=1)
    out: dict[str, torch.Tensor] = {}
    for i in range(e):
        for name, half in zip(names, halves, strict=True):
            out[f"{fused.experts}.{i}.{name}.lora_A.weight"] = a_side[i]
            out[f"{fused.experts}.{i}.{name}.lora_B.weight"] = half[i]
    return out


def vllm_expert_adapter(adapter: Mapping[str, torch.Tensor], fused: list[FusedExpertLora]) -> dict[str, torch.Tensor]:
    """``adapter`` (a PEFT state dict) with every fused-expert pair replaced by its per-expert views; other names
    pass through unchanged, in order."""
    by_key = {f"{f.key}.lora_A.weight": f for f in fused}
    skip = {f"{f.key}.lora_B.weight" for f in fused}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in adapter.items():
        if name in skip:
            continue
        f = by_key.get(name)
        if f is None:
            out[name] = tensor
            continue
        out.update(per_expert_views(f, tensor, adapter[f"{f.key}.lora_B.weight"]))
    return out


def vllm_adapter_config(config: Mapping[str, Any], fused: list[FusedExpertLora]) -> dict[str, Any]:
    """The PEFT config that travels with :func:`vllm_expert_adapter`'s tensors: the per-expert projections are
    ``target_modules`` (as in a per-expert checkpoint's adapter), no ``target_parameters``."""
    out = dict(config)
    modules = list(out.get("target_modules") or [])
    for f in fused:
        modules += [n for n in FUSED_PROJECTIONS[f.param] if n not in modules]
    out["target_modules"] = sorted(modules)
    out["target_parameters"] = None
    return out


def routed_expert_targets() -> frozenset[str]:
    """The HF names of every registered family's routed-expert targets (fused parameters in transformers 5)."""
    from skyrl_glm.plugins import registry

    return frozenset(t.hf for f in registry().models.values() for t in f.lora.targets if t.kind == "routed_expert")


def lora_config_with_expert_parameters(lora_config: type) -> Any:
    """PEFT's ``LoraConfig`` as SkyRL's model wrapper calls it, with routed-expert names in ``target_modules``
    moved to ``target_parameters`` (PEFT would otherwise match no module by them and leave the experts out)."""

    def make(**kwargs: Any) -> Any:
        modules = kwargs.get("target_modules")
        routed = routed_expert_targets()
        if isinstance(modules, list | tuple) and routed & set(modules):
            kwargs["target_modules"] = [m for m in modules if m not in routed]
            kwargs["target_parameters"] = [m for m in modules if m in routed]
        return lora_config(**kwargs)

    make.expert_parameters_from = lora_config
    return make
