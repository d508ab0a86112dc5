"""Routed-expert LoRA factors kept once per group of experts inside vLLM: the shared-all and grouped layouts.

vLLM's ``enable_moe_shared_loras`` (0.30-0.32) keeps a fused-MoE layer's gate/up ``lora_A`` and down ``lora_B``
slots at expert-dim 1 and hands its kernels a stride-0 view over the experts; gate/up ``lora_B`` and down
``lora_A`` keep a slot per expert. For an adapter trained with Megatron-Bridge's ``share_expert_adapters`` (one
adapter per layer, or per EP rank's block of E/G consecutive experts) this patch keeps every factor once per group:
``[max_loras, G_local, ...]`` storage, G_local being the groups this rank's experts fall in.

How vLLM's fused-MoE LoRA kernels reach a group's factor:

* one local group (shared-all, G=1; or an EP rank inside one group): a stride-0 ``[max_loras, E_local, ...]`` view
  of the storage. The kernels index every factor by its strides, so every expert reads the group's factor, and
  vLLM's own block assignment is untouched.
* several (``grouped:G``): the storage itself, and an expert-to-group map composed with EP's (global expert ->
  local group, -1 where EP has the expert elsewhere) passed as the ``expert_map`` that vLLM's
  ``moe_lora_align_block_size`` buckets tokens by, so the kernels' expert ids are group ids. Base experts never
  see the map: it goes to the LoRA half of the MoE call only (``LoRAExpertsMixin.apply_w13_lora``; the down
  projection reuses its buckets).

vLLM writes a slot through the storage, each factor first brought to the local groups (a ``[G, ...]`` stack is
narrowed to this rank's groups, a per-expert one, like vLLM's warm-up dummy, gives each group's first expert).
The receiver refuses an adapter whose experts differ inside a group before it gets here
(:mod:`skyrl_glm.sync.expert_layout`). On only in an engine started with ``expert_layout.engine_arguments`` of
shared-all or ``grouped:G`` (its ``additional_config``), decided when each layer creates its slots; every other
engine runs vLLM's code unchanged. vLLM places experts on EP ranks in consecutive blocks (``_slice_moe_lora_ep``
assumes it too), and so does the map.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from skyrl_glm.sync.expert_layout import expert_groups, layout_of

_ON = "_skyrl_glm_grouping"  # on a layer: its Grouping or None; on a MoELoRAContext: (local groups, expert map)
_STORAGE = "_skyrl_glm_slot_storage"  # on a grouped layer: slot name -> its [L, local, ...] storage tensors
_MAP = "_skyrl_glm_expert_map"  # on a layer of several local groups: global expert -> local group
SLOTS = ("w13_lora_a_stacked", "w13_lora_b_stacked", "w2_lora_a_stacked", "w2_lora_b_stacked")


@dataclass(frozen=True)
class Grouping:
    """Which groups a layer's local experts fall in: ``groups`` over all ``experts``, ``size`` experts each; this
    rank holds experts ``[first_expert, first_expert + local_experts)``, which fall in groups
    ``[first, first + local)``."""

    groups: int
    experts: int
    local_experts: int
    first_expert: int

    @classmethod
    def of(cls, groups: int, experts: int, local_experts: int, ep_rank: int) -> Grouping:
        if experts % groups:
            raise ValueError(f"expert layout grouped:{groups}: the model's {experts} experts make no {groups} groups")
        return cls(groups, experts, local_experts, ep_rank * local_experts)

    @property
    def size(self) -> int:
        return self.experts // self.groups

    @property
    def first(self) -> int:
        return self.first_expert // self.size

    @property
    def local(self) -> int:
        return (self.first_expert + self.local_experts - 1) // self.size + 1 - self.first

    def heads(self) -> list[int]:
        """Per local group, the first of its experts this rank holds (a local expert index)."""
        return [
            max(g * self.size, self.first_expert) - self.first_expert
            for g in range(self.first, self.first + self.local)
        ]

    def expert_map(self, device: torch.device | str) -> torch.Tensor:
        """Global expert -> local group, -1 where another EP rank holds the expert (int32, as vLLM's EP map)."""
        experts = torch.arange(self.experts, device=device)
        local = (experts >= self.first_expert) & (experts < self.first_expert + self.local_experts)
        return torch.where(local, experts // self.size - self.first, -1).to(torch.int32)

    def to_local(self, factor: torch.Tensor | None) -> torch.Tensor | None:
        """One LoRA factor brought to ``[local, ...]``: a stack per group (all groups, or this rank's), per expert
        (all experts, or this rank's: each group's first), or one for all experts (``[1, ...]``, broadcast)."""
        if factor is None or factor.shape[0] == self.local:
            return factor
        if factor.shape[0] == self.groups:
            return factor[self.first : self.first + self.local]
        if factor.shape[0] in (self.local_experts, self.experts):
            offset = 0 if factor.shape[0] == self.local_experts else self.first_expert
            rows = [offset + h for h in self.heads()]
            step = rows[1] - rows[0] if len(rows) > 1 else 1
            if rows == list(range(rows[0], rows[-1] + 1, step)):  # evenly spaced: a view (the slot replay needs one)
                return factor[rows[0] : rows[-1] + 1 : step]
            return factor[rows]
        if factor.shape[0] == 1:
            return factor.expand(self.local, *factor.shape[1:])
        raise ValueError(
            f"a routed-expert LoRA factor of expert-dim {factor.shape[0]} fits none of {self.groups} groups, "
            f"{self.experts} experts or this rank's {self.local_experts}"
        )


def _engine_groups() -> int | None:
    """G of the engine whose model is being built (vLLM sets its config around that), None if it asked for none."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    return None if config is None else expert_groups(layout_of(config))


def _grouped_slots(create: Callable[..., None], names: tuple[str, str]) -> Callable[..., None]:
    """``create`` (one of vLLM's slot-creating methods), then, in a grouped layer, each of its ``names``' tensors
    ``[L, n, ...]`` with ``n`` not the local groups as fresh ``[L, local, ...]`` storage behind a stride-0
    ``[L, n, ...]`` view: what vLLM's ``create_lora_weights`` indexes per expert right after (its dummy-adapter
    shapes) and, with one local group, what the kernels read."""

    def created(self: Any, *args: Any, **kwargs: Any) -> None:
        create(self, *args, **kwargs)
        grouping: Grouping | None = getattr(self, _ON, None)
        if grouping is None:
            return
        for name in names:
            slots = getattr(self, name)
            storage = tuple(
                t if t.shape[1] == grouping.local else t.new_zeros(t.shape[0], grouping.local, *t.shape[2:])
                for t in slots
            )
            getattr(self, _STORAGE)[name] = storage
            setattr(
                self,
                name,
                tuple(s if s is t else s[:, :1].expand(t.shape) for s, t in zip(storage, slots, strict=True)),
            )

    return created


@contextmanager
def _storage_in_place(layer: Any) -> Iterator[None]:
    """The slots as their ``[L, local, ...]`` storage while vLLM writes them (torch refuses a copy into a stride-0
    view)."""
    views = {name: getattr(layer, name) for name in SLOTS}
    for name, storage in getattr(layer, _STORAGE).items():
        setattr(layer, name, storage)
    try:
        yield
    finally:
        for name, view in views.items():
            setattr(layer, name, view)


def _through_storage(write: Callable[..., None]) -> Callable[..., None]:
    """``write`` (``set_lora`` or ``reset_lora``), in a grouped layer with its slots as their storage and each
    factor brought to the local groups (``set_lora``'s ``lora_a``, ``lora_b`` lists)."""

    def written(self: Any, index: int, *factors: Any) -> None:
        grouping: Grouping | None = getattr(self, _ON, None)
        if grouping is None:
            return write(self, index, *factors)
        local = [[grouping.to_local(f) for f in side] for side in factors]
        with _storage_in_place(self):
            return write(self, index, *local)

    return written


def _with_groups(build: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``_build_lora_context``, then, in a layer of several local groups, the context marked with their count and
    the expert-to-group map its kernels take (built once, when the slots were)."""

    def built(self: Any) -> Any:
        context = build(self)
        grouping: Grouping | None = getattr(self, _ON, None)
        if grouping is not None and grouping.local > 1:
            setattr(context, _ON, (grouping.local, getattr(self, _MAP)))
        return context

    return built


def _by_group(apply: Callable[..., Any], maps: bool) -> Callable[..., Any]:
    """One of ``LoRAExpertsMixin``'s LoRA halves of a MoE call; with a grouped context, run on the slots as they
    are (``[L, local, ...]``: no expansion to the experts, ``local`` experts to the kernels) and, for gate/up
    (``maps``: it buckets the tokens, down reuses the buckets), the expert-to-group map as ``expert_map``."""

    def applied(self: Any, lora_context: Any, **kwargs: Any) -> Any:
        grouped = getattr(lora_context, _ON, None)
        if grouped is None:
            return apply(self, lora_context, **kwargs)
        local, expert_map = grouped
        context = dataclasses.replace(lora_context, local_num_experts=local, enable_moe_shared_loras=False)
        if maps:
            kwargs["expert_map"] = expert_map
        return apply(self, context, **kwargs)

    return applied


def install() -> None:
    """Wrap ``FusedMoEWithLoRA``'s slot creation and writes and ``LoRAExpertsMixin``'s LoRA halves (once per
    process; vLLM's general plugin calls it)."""
    from vllm.lora.layers.fused_moe import FusedMoEWithLoRA as Layer
    from vllm.model_executor.layers.fused_moe.experts.lora_experts_mixin import LoRAExpertsMixin as Experts

    if hasattr(Layer, _ON):
        return
    create = Layer.create_lora_weights

    def create_lora_weights(self: Any, max_loras: int, lora_config: Any, *args: Any, **kwargs: Any) -> None:
        groups = _engine_groups() if lora_config.enable_moe_shared_loras else None
        ep_rank = self.ep_rank if self.use_ep else 0
        grouping = (
            None if groups is None else Grouping.of(groups, self.global_num_experts, self.local_num_experts, ep_rank)
        )
        setattr(self, _ON, grouping)
        setattr(self, _STORAGE, {})
        create(self, max_loras, lora_config, *args, **kwargs)
        if grouping is not None and grouping.local > 1:
            for name, storage in getattr(self, _STORAGE).items():
                setattr(self, name, storage)
            setattr(self, _MAP, grouping.expert_map(self.device))

    Layer.create_lora_weights = create_lora_weights
    Layer._create_lora_a_weights = _grouped_slots(
        Layer._create_lora_a_weights, ("w13_lora_a_stacked", "w2_lora_a_stacked")
    )
    Layer._create_lora_b_weights = _grouped_slots(
        Layer._create_lora_b_weights, ("w13_lora_b_stacked", "w2_lora_b_stacked")
    )
    Layer.set_lora = _through_storage(Layer.set_lora)
    Layer.reset_lora = _through_storage(Layer.reset_lora)
    Layer._build_lora_context = _with_groups(Layer._build_lora_context)
    Experts.apply_w13_lora = _by_group(Experts.apply_w13_lora, maps=True)
    Experts.apply_w2_lora = _by_group(Experts.apply_w2_lora, maps=False)
    setattr(Layer, _ON, None)
