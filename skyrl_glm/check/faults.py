"""Deliberately broken handoffs: each must make the check FAIL at the step named in ``EXPECTED_FAILURE``.

They exist so users (and this project's tests) can prove that their check catches broken sync paths.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from skyrl_glm.sync.update import UpdateResult
from skyrl_glm.usage import UsageError

if TYPE_CHECKING:
    import torch

    from skyrl_glm.sync.publisher import InMemoryPublisher


class FaultNotApplicable(UsageError):
    """The fault cannot be injected into this adapter (e.g. no aliased tensors to drop)."""


class _BreaksUpdates:
    """A publisher fault: the initial adapter goes out intact (so step 1 can agree, and a SkyRL run starts on the
    trainer's adapter), every later update goes through :meth:`altered`. ``spare_first=False`` breaks every update
    from the first (a fault started mid-run, ``skyrl_glm.sync.fault_at_step``). ``publish_async`` is the same for a
    publisher driven from an event loop (SkyRL's policy workers)."""

    def __init__(self, inner: Any, *, spare_first: bool = True) -> None:
        self.inner = inner
        self.first = spare_first

    def _intact(self) -> bool:
        first, self.first = self.first, False
        return first

    def publish(self, adapter: Any, adapter_config: Mapping[str, Any], version: int) -> UpdateResult:
        if self._intact():
            return self.inner.publish(adapter, adapter_config, version)
        altered = self.altered(adapter, adapter_config, version)
        if isinstance(altered, UpdateResult):
            return altered
        return self.inner.publish(altered, adapter_config, version)

    async def publish_async(self, adapter: Any, adapter_config: Mapping[str, Any], version: int) -> UpdateResult:
        if self._intact():
            return await self.inner.publish_async(adapter, adapter_config, version)
        altered = self.altered(adapter, adapter_config, version)
        if isinstance(altered, UpdateResult):
            return altered
        return await self.inner.publish_async(altered, adapter_config, version)

    def altered(self, adapter: Any, adapter_config: Mapping[str, Any], version: int) -> Any:
        """The adapter the broken handoff sends instead, or the result it reports without sending anything."""
        raise NotImplementedError


def _tensors(adapter: Any, fault: str) -> dict[str, torch.Tensor]:
    """The adapter as name -> tensor; an adapter that arrives already deduplicated (Megatron's streamed export)
    has no per-name tensors to break."""
    if not isinstance(adapter, Mapping):
        raise FaultNotApplicable(f"{fault} needs the adapter as a name -> tensor map, got {type(adapter).__name__}")
    return dict(adapter)


class NoPublish(_BreaksUpdates):
    """Claims success and sends nothing: the sampler stays stale."""

    def altered(self, adapter: Any, adapter_config: Mapping[str, Any], version: int) -> UpdateResult:
        return UpdateResult(True, version, reason="fault no-publish: nothing sent")


class DropAliases(_BreaksUpdates):
    """Sends the unique tensors but forgets the alias map: aliased public names never reach the sampler."""

    inner: InMemoryPublisher

    def publish(self, adapter: Any, adapter_config: Mapping[str, Any], version: int) -> UpdateResult:
        if self._intact():
            return self.inner.publish(adapter, adapter_config, version)
        if not hasattr(self.inner, "plan"):
            raise FaultNotApplicable("drop-aliases needs an in-memory transport (the disk baseline sends no alias map)")
        plan = self.inner.plan(adapter, adapter_config, version)
        if not plan.manifest.aliases and not plan.manifest.alias_runs:
            raise FaultNotApplicable("drop-aliases needs an adapter with aliased (shared) tensors; this one has none")
        plan.manifest = dataclasses.replace(plan.manifest, aliases={}, alias_runs=())
        return self.inner.send(plan)


class DropGroup(_BreaksUpdates):
    """Publishes every tensor but one target group's (names holding ``marker``): the sampler serves everything but
    that group, as a loader that silently skips it would. An adapter of that group alone leaves nothing to send:
    success is claimed and nothing is sent (an empty update would be refused), so the sampler stays stale."""

    def __init__(self, inner: Any, marker: str, label: str, *, spare_first: bool = True) -> None:
        super().__init__(inner, spare_first=spare_first)
        self.marker, self.label = marker, label

    def altered(self, adapter: Any, adapter_config: Mapping[str, Any], version: int) -> Any:
        tensors = _tensors(adapter, f"drop-{self.label}")
        kept = {k: v for k, v in tensors.items() if self.marker not in k}
        if len(kept) == len(tensors):
            raise FaultNotApplicable(f"drop-{self.label} needs an adapter with {self.label} LoRA; this one has none")
        if not kept:
            return UpdateResult(True, version, reason=f"fault drop-{self.label}: every tensor dropped, nothing sent")
        return kept


def drop_experts(inner: Any, *, spare_first: bool = True) -> DropGroup:
    """The routed experts dropped (the per-expert names vLLM loads hold ``.mlp.experts.``)."""
    return DropGroup(inner, ".mlp.experts.", "experts", spare_first=spare_first)


class DropExpertGroup(_BreaksUpdates):
    """Publishes every tensor, but in each MoE layer the routed experts that hold expert 0's adapter (its group:
    all of them in a shared layout, E/G consecutive ones in grouped:G, expert 0 alone per expert) with lora_B zero,
    the value the sampler served before: an update that lost one group of experts on the way, which every layout's
    receiver takes (the group stays equal inside)."""

    _EXPERT = re.compile(r"(?P<module>.+\.mlp\.experts)\.(?P<e>\d+)\.(?P<rest>\w+_proj\.lora_[AB]\.weight)")

    def altered(self, adapter: Any, adapter_config: Mapping[str, Any], version: int) -> dict[str, Any]:
        import torch

        tensors = dict(adapter)
        experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
        for name, t in tensors.items():
            if m := self._EXPERT.fullmatch(name):
                experts.setdefault(m["module"], {}).setdefault(int(m["e"]), {})[m["rest"]] = t
        if not experts:
            raise FaultNotApplicable("drop-expert-group needs an adapter with routed-expert LoRA; this one has none")
        for module, per_expert in experts.items():
            first = per_expert[0]
            for e, factors in per_expert.items():
                if factors.keys() == first.keys() and all(torch.equal(t, first[k]) for k, t in factors.items()):
                    for rest, t in factors.items():
                        if ".lora_B." in rest:
                            tensors[f"{module}.{e}.{rest}"] = torch.zeros_like(t)
        return tensors


def drop_shared_experts(inner: Any, *, spare_first: bool = True) -> DropGroup:
    """The shared expert dropped: the CPU sampler's analogue of drop-experts (vLLM's CPU build serves no routed
    expert LoRA, but it serves the shared expert's)."""
    return DropGroup(inner, ".shared_experts.", "shared-experts", spare_first=spare_first)


class DoubleScale(_BreaksUpdates):
    """Scales lora_B by alpha/r before the plan folds it again: the upstream aliasing bug's symptom."""

    def altered(self, adapter: Any, adapter_config: Mapping[str, Any], version: int) -> Any:
        scale = adapter_config["lora_alpha"] / adapter_config["r"]
        if scale == 1:
            raise FaultNotApplicable("double-scale needs lora_alpha != r")
        return {k: (v * scale if ".lora_B." in k else v) for k, v in _tensors(adapter, "double-scale").items()}


_LAYER = re.compile(r"\.layers\.(\d+)\.self_attn\.")


class WrongTarget(_BreaksUpdates):
    """Publishes attention adapters under the next layer's names (same shapes, wrong modules)."""

    def altered(self, adapter: Any, adapter_config: Mapping[str, Any], version: int) -> Any:
        tensors = _tensors(adapter, "wrong-target")
        layers = sorted({int(m.group(1)) for k in tensors if (m := _LAYER.search(k))})
        if len(layers) < 2:
            raise FaultNotApplicable("wrong-target needs attention adapters on at least two layers")
        nxt = {a: b for a, b in zip(layers, layers[1:] + layers[:1], strict=True)}
        return {_LAYER.sub(lambda m: f".layers.{nxt[int(m.group(1))]}.self_attn.", k): v for k, v in tensors.items()}


class PrefillOnlySampler:
    """A sampler whose updates reach prompt scoring but not generation: decode keeps its first adapter."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.decode_adapter: Any = None

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        return self.inner.score(sequences)

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
        current = self.inner.adapter
        if self.decode_adapter is None:
            self.decode_adapter = current
        self.inner.adapter = self.decode_adapter
        try:
            return self.inner.generate(prompts, max_tokens)
        finally:
            self.inner.adapter = current


@dataclass(frozen=True)
class Fault:
    """One deliberately broken handoff: what it wraps, and the step of the check that must catch it."""

    fails_at: int
    publisher: Callable[[Any], Any] | None = None
    sampler: Callable[[Any], Any] | None = None
    in_skyrl: bool = False
    """Also injectable into a SkyRL run's memory sync (``skyrl_glm.sync.fault``, from the start or from the sync
    after step k: ``skyrl_glm.sync.fault_at_step``)."""
    needs: str | None = None
    """The target kind the adapter must hold for the fault to apply (checked before any engine starts)."""


# The one table of faults. drop-aliases fails at step 4: the receiver itself rejects the update, whose
# lora_A/lora_B pairs are incomplete.
FAULT_TABLE: dict[str, Fault] = {
    "no-publish": Fault(5, publisher=NoPublish, in_skyrl=True),
    "drop-aliases": Fault(4, publisher=DropAliases),
    "double-scale": Fault(5, publisher=DoubleScale, in_skyrl=True),
    "wrong-target": Fault(5, publisher=WrongTarget, in_skyrl=True),
    "prefill-only": Fault(5, sampler=PrefillOnlySampler),
    "drop-experts": Fault(5, publisher=drop_experts, needs="routed_expert", in_skyrl=True),
    "drop-shared-experts": Fault(5, publisher=drop_shared_experts, needs="shared_expert", in_skyrl=True),
    "drop-expert-group": Fault(5, publisher=DropExpertGroup, needs="routed_expert"),
}
NO_FAULT = "none"
FAULTS = (NO_FAULT, *FAULT_TABLE)
EXPECTED_FAILURE = {name: f.fails_at for name, f in FAULT_TABLE.items()}
SKYRL_FAULTS = (NO_FAULT, *(name for name, f in FAULT_TABLE.items() if f.in_skyrl))


def inject(fault: str, publisher: Any, sampler: Any) -> tuple[Any, Any]:
    """``(publisher, sampler)`` with ``fault`` applied."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; choose from {FAULTS}")
    if fault == NO_FAULT:
        return publisher, sampler
    record = FAULT_TABLE[fault]
    if record.publisher is not None:
        publisher = record.publisher(publisher)
    if record.sampler is not None:
        sampler = record.sampler(sampler)
    return publisher, sampler


def inject_in_skyrl(fault: str, publisher: Any, *, spare_first: bool = True) -> Any:
    """A SkyRL worker's publisher with ``fault`` applied (one of :data:`SKYRL_FAULTS`: publisher faults only);
    ``spare_first=False``: every update broken, the first too (a fault started after step k)."""
    if fault not in SKYRL_FAULTS:
        raise ValueError(f"fault {fault!r} cannot be injected into a SkyRL run; choose from {SKYRL_FAULTS}")
    if fault == NO_FAULT:
        return publisher
    make = FAULT_TABLE[fault].publisher
    assert make is not None  # in_skyrl faults are publisher faults (tests/test_check_settings.py)
    return make(publisher, spare_first=spare_first)
