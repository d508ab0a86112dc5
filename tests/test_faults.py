"""Faults on the real plan -> shared-memory transport -> receiver path, with a toy trainer and sampler (fast; no
engine). vLLM's CPU build serves no routed-expert LoRA, so drop-experts on an adapter that holds only routed
experts is checked here at this level; ``test_layouts_gpu.py`` runs it on the GPU engine."""

from __future__ import annotations

import asyncio

import pytest
import torch
from toy_lora import ToySampler, ToyTrainer, V

from skyrl_glm.check.algorithm import CheckConfig, run_check
from skyrl_glm.check.faults import NO_FAULT, SKYRL_FAULTS, FaultNotApplicable, inject, inject_in_skyrl
from skyrl_glm.check.probes import make_probes
from skyrl_glm.sync.publisher import InMemoryPublisher
from skyrl_glm.sync.transports.shm import SharedMemoryTransport
from skyrl_glm.sync.update import UpdateResult

MODULE = "1.mlp.experts.0.gate_proj"  # routed experts only: every name is one the drop-experts fault removes


@pytest.mark.parametrize(("fault", "failed"), [(NO_FAULT, None), ("no-publish", 5), ("drop-experts", 5)])
def test_drop_experts_of_a_routed_experts_only_adapter_fails_at_step_5(fault, failed):
    """Every tensor is a routed expert's: drop-experts leaves nothing to send, the sampler keeps the stale adapter
    and the check fails where a skipped handoff does (step 5), not inside the plan."""
    sampler = ToySampler(MODULE)
    publisher, sampler_seen = inject(fault, InMemoryPublisher(sampler, SharedMemoryTransport()), sampler)
    report = run_check(ToyTrainer(MODULE), sampler_seen, publisher, make_probes(V), CheckConfig(decode=False))
    got = report.first_failure.step if report.first_failure is not None else None
    assert got == failed, [(s.step, s.passed, s.detail) for s in report.steps]
    served = 2 if fault == NO_FAULT else 1  # the broken update reaches no sampler: version 1 keeps serving
    assert (sampler.updates, sampler.rx.version) == (served, served)


def test_an_empty_update_is_refused_by_the_receiver_not_the_plan():
    """Without the fault, an update holding no tensor goes through the plan and is refused with one line."""
    sampler = ToySampler(MODULE)
    result = InMemoryPublisher(sampler, SharedMemoryTransport()).publish({}, ToyTrainer(MODULE).lora_config, 1)
    assert (result.ok, result.reason, sampler.rx.version) == (False, "empty adapter: the update lists no tensors", None)


class OffOnLongerSequences(ToyTrainer):
    """A trainer whose scores are off past the prefill probes' prompt length only on the decode sequences (a
    trainer-side mistake the decode path alone shows)."""

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        rows = super().score(sequences)
        off = [len(s) < 32 for s in sequences]
        return [[x + 0.2 if o and i >= 11 else x for i, x in enumerate(r)] for o, r in zip(off, rows, strict=True)]


@pytest.mark.parametrize(
    ("fault", "trainer", "own_prefill_off"),
    [(NO_FAULT, ToyTrainer, False), ("prefill-only", ToyTrainer, True), (NO_FAULT, OffOnLongerSequences, False)],
)
def test_a_decode_mismatch_says_which_side_it_is_on(fault, trainer, own_prefill_off):
    """The decode diff carries the sampler's decode against its own prefill of the same tokens: large where the
    sampler's decode path serves something else (prefill-only: decode keeps the first adapter), small where the
    trainer is the one off."""
    sampler = ToySampler(MODULE)
    publisher, sampler_seen = inject(fault, InMemoryPublisher(sampler, SharedMemoryTransport()), sampler)
    report = run_check(trainer(MODULE), sampler_seen, publisher, make_probes(V), CheckConfig())
    step5 = report.steps[4] if len(report.steps) == 5 else report.first_failure
    assert step5.decode is not None and step5.decode.own_prefill is not None, step5
    assert (step5.decode.own_prefill.mean > 0.05) == own_prefill_off, step5.detail
    assert report.passed == (fault == NO_FAULT and trainer is ToyTrainer), [(s.step, s.detail) for s in report.steps]
    if not report.passed:
        assert "its own prefill" in report.first_failure.detail, report.first_failure.detail


class Sent:
    """What a fault hands on to the publisher behind it, in order (the wrapper's routing alone is under test)."""

    def __init__(self) -> None:
        self.adapters: list[dict[str, torch.Tensor]] = []

    def publish(self, adapter: dict, adapter_config: dict, version: int) -> UpdateResult:
        self.adapters.append(dict(adapter))
        return UpdateResult(True, version)

    async def publish_async(self, adapter: dict, adapter_config: dict, version: int) -> UpdateResult:
        return self.publish(adapter, adapter_config, version)


ADAPTER = {
    f"base_model.model.model.layers.{layer}.{module}.lora_{x}.weight": torch.full((2, 2), 1.0 + layer)
    for layer in (0, 1)
    for module in ("self_attn.q_proj", "mlp.shared_experts.gate_proj", "mlp.experts.0.gate_proj")
    for x in "AB"
}


def _intact(sent: dict[str, torch.Tensor]) -> bool:
    return sent.keys() == ADAPTER.keys() and all(torch.equal(sent[k], ADAPTER[k]) for k in ADAPTER)


@pytest.mark.parametrize("fault", [f for f in SKYRL_FAULTS if f != NO_FAULT])
@pytest.mark.parametrize(("spare_first", "intact"), [(True, [True]), (False, [])])
def test_a_skyrl_fault_spares_the_first_update_only_when_it_starts_with_the_run(fault, spare_first, intact):
    """From the start (``skyrl_glm.sync.fault``) the first update goes out intact, as the initial sync must; started
    after step k (``fault_at_step``) the first update it sees is already broken, and so is every later one."""
    inner = Sent()
    broken = inject_in_skyrl(fault, inner, spare_first=spare_first)
    results = [asyncio.run(broken.publish_async(ADAPTER, {"r": 8, "lora_alpha": 16}, v)) for v in (1, 2, 3)]
    assert all(r.ok for r in results), results  # a broken handoff claims success: only the check can tell
    assert [_intact(a) for a in inner.adapters if _intact(a)] == intact, fault
    sent_broken = [a for a in inner.adapters if not _intact(a)]
    assert len(sent_broken) == (0 if fault == "no-publish" else 3 - len(intact)), fault


@pytest.mark.parametrize("fault", ["double-scale", "wrong-target", "drop-shared-experts"])
def test_a_fault_that_rewrites_names_refuses_an_adapter_without_them(fault):
    """Megatron's streamed export arrives deduplicated, not as name -> tensor: such a fault says so, one line."""
    broken = inject_in_skyrl(fault, Sent(), spare_first=False)
    with pytest.raises(FaultNotApplicable, match=f"{fault} needs the adapter as a name -> tensor map"):
        broken.publish(iter(()), {"r": 8, "lora_alpha": 16}, 1)


class Published:
    """The inner publisher's side of a fault: what reached it."""

    def __init__(self) -> None:
        self.tensors: dict = {}

    def publish(self, adapter, adapter_config, version):
        from skyrl_glm.sync.update import UpdateResult

        self.tensors = dict(adapter)
        return UpdateResult(True, version)


@pytest.mark.parametrize(("groups", "lost"), [(2, {0, 1}), (4, {0}), (1, {0, 1, 2, 3})])
def test_drop_expert_group_zeroes_lora_b_of_expert_0s_group_only(groups: int, lost: set[int]) -> None:
    """The experts holding expert 0's adapter (its group) lose their update (lora_B back to zero), the others and
    every lora_A arrive as they are: what a sampler that missed one group's part of the update serves."""
    import torch

    gen = torch.Generator().manual_seed(0)
    draws = {(g, f): torch.randn(4, 4, generator=gen) for g in range(groups) for f in ("A", "B")}
    adapter = {
        f"model.layers.1.mlp.experts.{e}.{proj}.lora_{f}.weight": draws[(e // (4 // groups), f)]
        for e in range(4)
        for proj in ("gate_proj", "up_proj", "down_proj")
        for f in "AB"
    }
    adapter["model.layers.1.self_attn.q_proj.lora_B.weight"] = torch.ones(4, 4)
    inner = Published()
    publisher, _ = inject("drop-expert-group", inner, None)
    publisher.publish(adapter, {}, 1)  # the first update goes out intact
    assert inner.tensors == adapter
    publisher.publish(adapter, {}, 2)
    for name, t in inner.tensors.items():
        e = int(name.split(".experts.")[1].split(".")[0]) if ".experts." in name else None
        zeroed = e in lost and ".lora_B." in name
        assert torch.equal(t, torch.zeros_like(t) if zeroed else adapter[name]), name
