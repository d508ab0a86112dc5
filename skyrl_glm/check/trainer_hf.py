"""Trainer-side scorer: HF transformers + PEFT (CPU or GPU), the reference policy for the check."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import torch


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

    @property
    def lora_config(self) -> dict[str, Any]:
        return self.model.peft_config["default"].to_dict()

    def adapter(self) -> dict[str, torch.Tensor]:
        """The adapter as PEFT saves it (public names), sharing the live parameters' storage."""
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.model)

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
