"""Trainer-side scorer: HF transformers + PEFT (CPU or GPU), the reference policy for the check."""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import Any

import torch

from skyrl_glm.lora.experts import fused_expert_loras, vllm_adapter_config, vllm_expert_adapter
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
            isinstance(m, ParamWrapper) and m.parameter_name == param and re.sub(r"(\.base_layer)+$", "", n).endswith(
                "." + owner
            )
            for n, m in wrapped
        ):
            missing.append(target)
    if missing:
        raise UsageError(f"PEFT {peft.__version__} applied no LoRA to the targets {missing} (install peft==0.18.1)")


class HfPeftTrainer:
    """A PEFT LoRA model whose adapter starts at B == 0 (PEFT's default init)."""

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
    ) -> None:
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        config = LoraConfig(
            r=rank, lora_alpha=alpha, target_modules=list(targets), target_parameters=list(target_parameters) or None
        )
        self.model = get_peft_model(base, config)
        self.device = device
        require_applied(self.model, targets, target_parameters)
        self._fused_experts = fused_expert_loras(self.model)

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

    @torch.no_grad()
    def perturb_lora_b(self, scale: float, seed: int = 0) -> int:
        """Add noise to every (zero-initialised) lora_B; noise is seeded by the tensor's name, so replicated
        shards of one tensor get identical noise. Returns how many tensors changed."""
        changed = 0
        for name, p in self.model.named_parameters():
            if "lora_B" not in name:
                continue
            if torch.count_nonzero(p):
                raise AssertionError(f"{name} is not zero before the perturbation: the check needs B == 0 at start")
            gen = torch.Generator().manual_seed(zlib.crc32(name.encode()) ^ seed)
            p.add_(torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p) * scale)
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
