"""Trainer-side scorer: HF transformers + PEFT (CPU or GPU), the reference policy for the check."""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from skyrl_glm.lora.experts import fused_expert_loras, vllm_adapter_config, vllm_expert_adapter
from skyrl_glm.models.base import ModelFamily
from skyrl_glm.usage import UsageError


def require_applied(model: Any, modules: Sequence[str], parameters: Sequence[str]) -> None:
    """Every requested target carries a LoRA after ``get_peft_model``, or a one-line error naming the ones
    that do not: a PEFT that rewrites or drops targets (0.21 does so on GLM MoE models) must not train a
    different adapter than the one asked for."""
    import peft
    from peft.tuners.lora.layer import LoraLayer, ParamWrapper

    wrapped = [(name, m) for name, m in model.named_modules() if isinstance(m, LoraLayer)]
    missing = [t for t in modules if not any(n.endswith("." + t) for n, _ in wrapped)]
    for target in parameters:
        owner, _, param = target.rpartition(".")
        if not any(
            isinstance(m, ParamWrapper)
            and m.parameter_name == param
            and re.sub(r"(\.base_layer)+$", "", n).endswith("." + owner)
            for n, m in wrapped
        ):
            missing.append(target)
    if missing:
        raise UsageError(f"PEFT {peft.__version__} applied no LoRA to the targets {missing} (install peft==0.18.1)")


def _seeded(name: str, seed: int) -> torch.Generator:
    """A generator seeded by a tensor's name and the check's seed: replicated shards of one tensor draw alike."""
    return torch.Generator().manual_seed(zlib.crc32(name.encode()) ^ seed)


def group_of(module: str, groups: Mapping[str, str]) -> str:
    """The target group of a LoRA-wrapped module (``groups``: target -> group; a routed-expert target parameter
    ``mlp.experts.gate_up_proj`` belongs to the ``...mlp.experts`` module), or ``"lora"`` when none is named."""
    module = re.sub(r"(\.base_layer)+$", "", module)
    for target, group in groups.items():
        owner = target.rpartition(".")[0] if target.startswith("mlp.experts.") else target
        if module == owner or module.endswith("." + owner):
            return group
    return "lora"


class HfPeftTrainer:
    """A PEFT LoRA model whose adapter starts at B == 0 (PEFT's default init) and A drawn from ``seed`` (so a check
    gives the same numbers run to run). ``groups`` names each target's group (attention, dense MLP, shared expert,
    routed experts): the check perturbs and measures them one by one. ``expert_groups`` G: every routed expert of
    a group of E/G consecutive experts holds the group's adapter (drawn once, perturbed once, as Megatron-Bridge's
    ``share_expert_adapters`` trains it, one group per EP rank), the adapter the shared and grouped layouts serve;
    None: one per expert."""

    def __init__(
        self,
        model_dir: str,
        *,
        targets: Sequence[str],
        rank: int = 8,
        alpha: int = 16,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        target_parameters: Sequence[str] = (),
        groups: Mapping[str, str] | None = None,
        seed: int = 0,
        expert_groups: int | None = None,
        family: ModelFamily | None = None,
    ) -> None:
        """``family`` (default: none, a causal LM) says how the checkpoint loads and which modules no adapter
        touches."""
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        load = family.load_pretrained if family else AutoModelForCausalLM.from_pretrained
        base = load(model_dir, dtype=dtype).to(device).eval()
        config = LoraConfig(
            r=rank,
            lora_alpha=alpha,
            target_modules=list(targets),
            target_parameters=list(target_parameters) or None,
            exclude_modules=family.lora_exclude if family else None,
        )
        self.model = get_peft_model(base, config)
        self.device = device
        require_applied(self.model, targets, target_parameters)
        self._fused_experts = fused_expert_loras(self.model)
        uneven = [f.key for f in self._fused_experts if expert_groups and f.num_experts % expert_groups]
        if uneven:
            raise UsageError(f"{uneven[0]}: its experts make no {expert_groups} equal groups")
        self._expert_groups = expert_groups or 1
        self._shared = (
            {f"{f.key}.lora_{ab}.default.weight": (f, ab) for f in self._fused_experts for ab in "AB"}
            if expert_groups is not None
            else {}
        )
        self._groups = {
            name: group_of(name.split(".lora_")[0], groups or {})
            for name, _ in self.model.named_parameters()
            if "lora_B" in name
        }
        self.seed_lora_a(seed)

    @property
    def vocab_size(self) -> int:
        """The token ids the model scores (its input embedding's rows): the probes must stay below it."""
        return int(self.model.get_input_embeddings().num_embeddings)

    @property
    def lora_config(self) -> dict[str, Any]:
        """The PEFT config of :meth:`adapter`'s tensors (routed experts as per-expert target modules)."""
        return vllm_adapter_config(self.model.peft_config["default"].to_dict(), self._fused_experts)

    def adapter(self) -> dict[str, torch.Tensor]:
        """The adapter under the names vLLM loads (routed experts per expert, :mod:`skyrl_glm.lora.experts`),
        every tensor a view of the live parameters."""
        from peft import get_peft_model_state_dict

        return vllm_expert_adapter(get_peft_model_state_dict(self.model), self._fused_experts)

    @torch.no_grad()
    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        out = []
        for seq in sequences:
            ids = torch.tensor([seq], device=self.device)
            logp = torch.log_softmax(self.model(ids).logits[0].float(), dim=-1)
            out.append(logp[:-1].gather(1, ids[0, 1:, None])[:, 0].tolist())
        return out

    def _draw(self, name: str, shape: torch.Size, seed: int, uniform: bool) -> torch.Tensor:
        """Seeded noise of ``shape``; for a grouped routed-expert tensor one expert's per group, repeated over the
        group's experts (PEFT's fused ``lora_A [r*E, d1]`` is ``[E, r, d1]``, ``lora_B [d2, r*E]`` is
        ``[d2, r, E]``; E as G groups of consecutive experts)."""
        draw = torch.rand if uniform else torch.randn
        if name not in self._shared:
            return draw(shape, generator=_seeded(name, seed))
        fused, ab = self._shared[name]
        g, r = self._expert_groups, fused.rank
        size = fused.num_experts // g
        if ab == "A":
            return draw((g, 1, r, shape[-1]), generator=_seeded(name, seed)).expand(-1, size, -1, -1).reshape(shape)
        return draw((shape[0], r, g, 1), generator=_seeded(name, seed)).expand(-1, -1, -1, size).reshape(shape)

    @torch.no_grad()
    def seed_lora_a(self, seed: int) -> None:
        """Draw every lora_A again as PEFT does (uniform within 1/sqrt(fan_in)), from the tensor's name and
        ``seed`` instead of the global RNG."""
        for name, p in self.model.named_parameters():
            if "lora_A" in name:
                bound = 1 / math.sqrt(p.shape[-1])
                p.copy_((self._draw(name, p.shape, seed, uniform=True) * 2 - 1).to(p) * bound)

    def lora_groups(self) -> list[str]:
        return sorted(set(self._groups.values()))

    @torch.no_grad()
    def perturb_lora_b(self, scale: float | Mapping[str, float], seed: int = 0) -> int:
        """Add noise to every (zero-initialised) lora_B, or with a scale per group to those groups' only; noise is
        seeded by the tensor's name, so replicated shards of one tensor get identical noise. Returns how many
        tensors changed."""
        changed = 0
        for name, p in self.model.named_parameters():
            if "lora_B" not in name:
                continue
            if torch.count_nonzero(p):
                raise AssertionError(f"{name} is not zero before the perturbation: the check needs B == 0 at start")
            s = scale.get(self._groups[name]) if isinstance(scale, Mapping) else scale
            if s is None:
                continue
            p.add_(self._draw(name, p.shape, seed, uniform=False).to(p) * s)
            changed += 1
        return changed

    @torch.no_grad()
    def reset_lora_b(self) -> int:
        """Zero every lora_B again (the state a check starts from), so one trainer can serve several checks."""
        zeroed = 0
        for name, p in self.model.named_parameters():
            if "lora_B" in name:
                p.zero_()
                zeroed += 1
        return zeroed
