"""Faults on the real plan -> shared-memory transport -> receiver path, with a toy trainer and sampler (fast; no
engine). vLLM's CPU build serves no routed-expert LoRA, so drop-experts on an adapter that holds only routed
experts is checked here at this level; ``test_layouts_gpu.py`` runs it on the GPU engine."""

from __future__ import annotations

import pytest
import torch

from skyrl_glm.check.algorithm import CheckConfig, run_check
from skyrl_glm.check.faults import NO_FAULT, inject
from skyrl_glm.check.probes import make_probes
from skyrl_glm.plugins import registry
from skyrl_glm.sync.publisher import InMemoryPublisher
from skyrl_glm.sync.receiver import AdapterReceiver, UpdateRejected
from skyrl_glm.sync.transports.shm import SharedMemoryTransport
from skyrl_glm.sync.update import UpdateResult

V, R, ALPHA = 512, 8, 16
# routed experts only: every name is one the drop-experts fault removes
A = "base_model.model.model.layers.1.mlp.experts.0.gate_proj.lora_A.weight"
B = A.replace("lora_A", "lora_B")


def _logprobs(adapter: dict[str, torch.Tensor], scale: float, sequences: list[list[int]]) -> list[list[float]]:
    """A toy bigram model whose next-token logits move with the LoRA delta B @ A."""
    base = torch.randn(V, V, generator=torch.Generator().manual_seed(0))
    table = torch.log_softmax(base + scale * (adapter[B].float() @ adapter[A].float()).T, dim=-1)
    return [[float(table[p, t]) for p, t in zip(s[:-1], s[1:], strict=False)] for s in sequences]


class _Trainer:
    def __init__(self) -> None:
        self.tensors = {A: torch.randn(R, V, generator=torch.Generator().manual_seed(1)), B: torch.zeros(V, R)}
        self.lora_config = {"peft_type": "LORA", "r": R, "lora_alpha": ALPHA, "target_modules": ["gate_proj"]}

    def adapter(self) -> dict[str, torch.Tensor]:
        return dict(self.tensors)

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        return _logprobs(self.tensors, ALPHA / R, sequences)

    def perturb_lora_b(self, scale: float, seed: int = 0) -> int:
        noise = torch.randn(V, R, generator=torch.Generator().manual_seed(seed))
        self.tensors[B] = self.tensors[B] + scale * noise
        return 1


class _Sampler:
    """Serves what the receiver committed; before any update, the base model (a zero delta)."""

    def __init__(self) -> None:
        self.rx, self.adapter, self.scale = AdapterReceiver(), {A: torch.zeros(R, V), B: torch.zeros(V, R)}, 1.0
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
        return _logprobs(self.adapter, self.scale, sequences)

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
        return [(toks, [0.0] * len(toks)) for toks in ([8] * max_tokens for _ in prompts)]


@pytest.mark.parametrize(("fault", "failed"), [(NO_FAULT, None), ("no-publish", 5), ("drop-experts", 5)])
def test_drop_experts_of_a_routed_experts_only_adapter_fails_at_step_5(fault, failed):
    """Every tensor is a routed expert's: drop-experts leaves nothing to send, the sampler keeps the stale adapter
    and the check fails where a skipped handoff does (step 5), not inside the plan."""
    sampler = _Sampler()
    publisher, sampler_seen = inject(fault, InMemoryPublisher(sampler, SharedMemoryTransport()), sampler)
    report = run_check(_Trainer(), sampler_seen, publisher, make_probes(V), CheckConfig(decode=False))
    got = report.first_failure.step if report.first_failure is not None else None
    assert got == failed, [(s.step, s.passed, s.detail) for s in report.steps]
    served = 2 if fault == NO_FAULT else 1  # the broken update reaches no sampler: version 1 keeps serving
    assert (sampler.updates, sampler.rx.version) == (served, served)


def test_an_empty_update_is_refused_by_the_receiver_not_the_plan():
    """Without the fault, an update holding no tensor goes through the plan and is refused with one line."""
    sampler = _Sampler()
    result = InMemoryPublisher(sampler, SharedMemoryTransport()).publish({}, _Trainer().lora_config, 1)
    assert (result.ok, result.reason, sampler.rx.version) == (False, "empty adapter: the update lists no tensors", None)
