"""A toy bigram model whose next-token logits move with one LoRA pair's delta ``B @ A``, with a trainer and a
sampler over it: fast stand-ins for engines on the real plan -> transport -> receiver path (the entry-point plugin
of test_foundation.py, the faults of test_faults.py). ``module``: the LoRA'd module's path under ``layers.``."""

from __future__ import annotations

import torch

from skyrl_glm.plugins import registry
from skyrl_glm.sync.receiver import AdapterReceiver, UpdateRejected
from skyrl_glm.sync.update import UpdateResult

V, R, ALPHA = 512, 8, 16


def lora_names(module: str) -> tuple[str, str]:
    a = f"base_model.model.model.layers.{module}.lora_A.weight"
    return a, a.replace("lora_A", "lora_B")


def _table(adapter: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
    """Next-token logits per previous token: a fixed random base plus the scaled delta (one column per token)."""
    a, b = (next(adapter[k] for k in adapter if f".lora_{x}." in k) for x in "AB")
    base = torch.randn(V, V, generator=torch.Generator().manual_seed(0))
    return base + scale * (b.float() @ a.float()).T


def logprobs(adapter: dict[str, torch.Tensor], scale: float, sequences: list[list[int]]) -> list[list[float]]:
    table = torch.log_softmax(_table(adapter, scale), dim=-1)
    return [[float(table[p, t]) for p, t in zip(s[:-1], s[1:], strict=False)] for s in sequences]


class ToyTrainer:
    def __init__(self, module: str) -> None:
        a, b = lora_names(module)
        self.b = b
        self.tensors = {a: torch.randn(R, V, generator=torch.Generator().manual_seed(1)), b: torch.zeros(V, R)}
        target = module.rsplit(".", 1)[-1]
        self.lora_config = {"peft_type": "LORA", "r": R, "lora_alpha": ALPHA, "target_modules": [target]}

    def adapter(self) -> dict[str, torch.Tensor]:
        return dict(self.tensors)

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        return logprobs(self.tensors, ALPHA / R, sequences)

    def perturb_lora_b(self, scale: float, seed: int = 0) -> int:
        noise = torch.randn(V, R, generator=torch.Generator().manual_seed(seed))
        self.tensors[self.b] = self.tensors[self.b] + scale * noise
        return 1


class ToySampler:
    """Serves what its receiver committed; before any update, the base model (a zero delta), as a real sampler."""

    def __init__(self, module: str) -> None:
        a, b = lora_names(module)
        self.rx, self.adapter, self.scale = AdapterReceiver(), {a: torch.zeros(R, V), b: torch.zeros(V, R)}, 1.0
        self.updates = 0

    def apply_update(self, manifest_json: str, handle: dict, transport: str) -> UpdateResult:
        self.updates += 1
        try:
            got = self.rx.receive(manifest_json, handle, registry().transport(transport)())
        except UpdateRejected as e:
            return UpdateResult(False, None, e.reason)
        self.rx.commit(got.version)
        self.adapter = got.tensors
        self.scale = got.adapter_config["lora_alpha"] / got.adapter_config["r"]
        return UpdateResult(True, got.version)

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        return logprobs(self.adapter, self.scale, sequences)

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
        out = []
        for prompt in prompts:
            seq, table = list(prompt), _table(self.adapter, self.scale)
            for _ in range(max_tokens):
                seq.append(int(table[seq[-1]].argmax()))
            toks = seq[len(prompt) :]
            out.append((toks, logprobs(self.adapter, self.scale, [seq])[0][-len(toks) :]))
        return out
