"""The shared-all expert layout inside vLLM: every routed-expert LoRA factor of a layer kept once, not per expert.

vLLM's ``enable_moe_shared_loras`` (0.30-0.32) keeps a fused-MoE layer's gate/up ``lora_A`` and down ``lora_B``
slots at expert-dim 1 and hands its kernels a stride-0 view over the experts; gate/up ``lora_B`` and down
``lora_A`` keep a slot per expert, 99 % of what shared-outer leaves (a quarter of the per-expert bytes at rank 32
on GLM-5.3). For an adapter whose experts share those too (Megatron-Bridge's ``share_expert_adapters``), this patch
keeps them the same way: ``[max_loras, 1, ...]`` storage behind a stride-0 ``[max_loras, E, ...]`` view. vLLM's
fused-MoE LoRA kernels index every factor by its strides, so they read expert 0's factor for every expert; vLLM
writes a slot through its storage, where ``_match_expert_dim`` already puts expert 0's factor of a per-expert
source. The receiver refuses an adapter whose experts differ in any factor before it gets here
(:mod:`skyrl_glm.sync.expert_layout`).

On only in an engine started with ``expert_layout.engine_arguments("shared-all")`` (its ``additional_config``),
decided when each layer creates its slots; every other engine runs vLLM's code unchanged. An engine where the
patch did not take serves the same tensors correctly as shared-outer, only with shared-outer's slot memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from skyrl_glm.sync.expert_layout import SHARED_ALL, layout_of

_ON = "_skyrl_glm_shared_all"  # set on a layer (and, as None, on the class once patched)
_A_SLOTS, _B_SLOTS = "w2_lora_a_stacked", "w13_lora_b_stacked"  # the factors vLLM keeps per expert


def _collapse(slots: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Each ``[L, E, ...]`` slot tensor as fresh ``[L, 1, ...]`` storage behind a stride-0 ``[L, E, ...]`` view."""
    return tuple(torch.zeros_like(t[:, :1]).expand_as(t) for t in slots)


@contextmanager
def _storage_in_place(layer: Any) -> Iterator[None]:
    """The collapsed slots as their ``[L, 1, ...]`` storage while vLLM writes them (torch refuses a copy into a
    stride-0 view); ``set_lora``'s ``_match_expert_dim`` then takes expert 0's factor for it."""
    views = {name: getattr(layer, name) for name in (_A_SLOTS, _B_SLOTS)}
    for name, view in views.items():
        setattr(layer, name, tuple(t[:, :1] for t in view))
    try:
        yield
    finally:
        for name, view in views.items():
            setattr(layer, name, view)


def _engine_asks() -> bool:
    """Whether the engine whose model is being built asked for shared-all (vLLM sets its config around that)."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    return config is not None and layout_of(config) == SHARED_ALL


def _collapsing(create: Callable[..., None], slots: str) -> Callable[..., None]:
    """``create`` (one of vLLM's slot-creating methods), then, in a shared-all layer, its ``slots`` collapsed: before
    ``create_lora_weights`` takes per-expert views of them."""

    def created(self: Any, *args: Any, **kwargs: Any) -> None:
        create(self, *args, **kwargs)
        if getattr(self, _ON, False):
            setattr(self, slots, _collapse(getattr(self, slots)))

    return created


def _through_storage(write: Callable[..., None]) -> Callable[..., None]:
    """``write`` (``set_lora`` or ``reset_lora``), in a shared-all layer with its collapsed slots as their storage."""

    def written(self: Any, *args: Any, **kwargs: Any) -> None:
        if not getattr(self, _ON, False):
            return write(self, *args, **kwargs)
        with _storage_in_place(self):
            return write(self, *args, **kwargs)

    return written


def install() -> None:
    """Wrap ``FusedMoEWithLoRA``'s slot creation and writes (once per process; vLLM's general plugin calls it)."""
    from vllm.lora.layers.fused_moe import FusedMoEWithLoRA as Layer

    if hasattr(Layer, _ON):
        return
    create = Layer.create_lora_weights

    def create_lora_weights(self: Any, max_loras: int, lora_config: Any, *args: Any, **kwargs: Any) -> None:
        setattr(self, _ON, bool(lora_config.enable_moe_shared_loras) and _engine_asks())
        create(self, max_loras, lora_config, *args, **kwargs)

    Layer.create_lora_weights = create_lora_weights
    Layer._create_lora_a_weights = _collapsing(Layer._create_lora_a_weights, _A_SLOTS)
    Layer._create_lora_b_weights = _collapsing(Layer._create_lora_b_weights, _B_SLOTS)
    Layer.set_lora = _through_storage(Layer.set_lora)
    Layer.reset_lora = _through_storage(Layer.reset_lora)
    setattr(Layer, _ON, None)
