"""Per-expert LoRA packed as views: the per-expert layout's routed-expert factors without a copy per version.

vLLM packs a fused-MoE layer's per-expert factors (``experts.{e}.{gate,down,up}_proj``) with
``PackedLoRALayerWeights.pack_moe``, which stacks them into fresh ``[E, ...]`` tensors for every ``LoRAModel`` it
adds. From a directory those live in host memory; skyrl-glm's in-memory load hands vLLM the received tensors on the
GPU, so each resident version's stacks were GPU memory beside the engine's budget: for full GLM-5.3 rank 32 about
the per-expert slots' 28.55 GiB a version, and on one H200 an engine at 0.82 of the GPU serving 75 narrowed MoE
layers ran out of memory in the second version's load (measured 2026-12-04).

The received experts' factors often need no stack: under Megatron-Bridge's ``share_expert_adapters`` every expert of
a layer shows one tensor (a broadcast view, stride 0, serves them all), and a sender that lays a factor's experts
back to back gives tensors of one storage at a constant distance (a strided view). This patch hands vLLM such a view
where the factor allows one and stacks the rest as vLLM does; ``set_lora`` then copies the same values into the
slots. Only for factors vLLM will not scale in place (``scaling`` 1, which a skyrl-glm update always has: the sender
folds alpha into ``lora_B``), since a view shares its memory with the received update and its other names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

_ON = "_skyrl_glm_expert_views"  # on PackedLoRALayerWeights: vLLM's own pack_moe, once installed


def stacked_view(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """``torch.stack(tensors)`` as a view of their memory, or None where none exists: one tensor shown by every
    expert (a broadcast view), or tensors of one storage, shape, dtype and strides whose offsets step by a constant
    that keeps them apart (a strided view)."""
    first = tensors[0]
    kind = (first.shape, first.stride(), first.dtype, first.device, first.untyped_storage().data_ptr())
    if any((t.shape, t.stride(), t.dtype, t.device, t.untyped_storage().data_ptr()) != kind for t in tensors[1:]):
        return None
    offsets = [t.storage_offset() for t in tensors]
    step = offsets[1] - offsets[0] if len(offsets) > 1 else 0
    if any(o != offsets[0] + i * step for i, o in enumerate(offsets)):
        return None
    if step and (step < 0 or step < first.numel() or not first.is_contiguous()):
        return None  # overlapping or reversed rows: only a copy is a stack of them
    return first.as_strided((len(tensors), *first.shape), (step, *first.stride()), offsets[0])


def _as_views(pack_moe: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's ``pack_moe``, with each factor a :func:`stacked_view` of the experts' tensors where it has one (gated
    experts, every expert present, ``scaling`` 1); anything else is vLLM's own packing."""

    def packed(cls: Any, loras: Sequence[Any], module_name: str, is_non_gated_moe: bool = False, **kwargs: Any) -> Any:
        if is_non_gated_moe or kwargs or not loras or any(lora is None or lora.scaling != 1 for lora in loras):
            return pack_moe(cls, loras, module_name, is_non_gated_moe=is_non_gated_moe, **kwargs)
        projections = [loras[k::3] for k in range(3)]  # w1 (gate), w2 (down), w3 (up), expert by expert

        def stack(factors: list[torch.Tensor]) -> torch.Tensor:
            view = stacked_view(factors)
            return torch.stack(factors) if view is None else view

        first = loras[0]
        return cls(
            module_name,
            first.rank,
            [first.lora_alpha] * 3,
            [stack([lora.lora_a for lora in p]) for p in projections],
            [stack([lora.lora_b for lora in p]) for p in projections],
            scaling=[1.0] * 3,
        )

    return packed


def install() -> None:
    """Wrap ``PackedLoRALayerWeights.pack_moe`` (once per process; vLLM's general plugin calls it)."""
    from vllm.lora.lora_weights import PackedLoRALayerWeights as Packed

    if _ON in Packed.__dict__:
        return
    original = Packed.__dict__["pack_moe"].__func__
    setattr(Packed, _ON, original)
    Packed.pack_moe = classmethod(_as_views(original))
