"""Serve GLM-5.3 (``glm_moe_dsa``) on vLLM's CPU build as dense MLA.

vLLM CPU refuses DSA sparse attention. When ``index_topk >= max_model_len`` the indexer selects every
key, so DSA equals dense MLA exactly and the indexer can be dropped: the model is then GLM-4.7-Flash's
MLA + MoE layer structure (``Glm4MoeLiteForCausalLM``). :func:`cpu_sampler_overrides` gives the
``hf_overrides`` that present a checkpoint this way; it refuses when the equivalence does not hold.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

ARCH = "GlmMoeDsaDenseMlaForCausalLM"
INDEX_FIELDS = ("index_topk", "index_head_dim", "index_n_heads", "indexer_types")


class DenseMlaUnsafe(ValueError):
    """DSA would drop keys at this length, so serving it as dense MLA would change the model."""


def cpu_sampler_overrides(config: Any, max_model_len: int) -> dict[str, Any]:
    """``hf_overrides`` for ``vllm.LLM`` that serve a GLM-5.3 checkpoint as dense MLA on CPU."""
    if config.index_topk < max_model_len:
        raise DenseMlaUnsafe(
            f"index_topk={config.index_topk} < max_model_len={max_model_len}: DSA would select a subset of "
            "keys, so dense MLA is not the same model. Lower max_model_len to <= index_topk."
        )
    overrides: dict[str, Any] = {"architectures": [ARCH], "model_type": "glm4_moe_lite"}
    overrides.update({k: None for k in INDEX_FIELDS})
    return overrides


def register_cpu_model() -> None:
    from vllm import ModelRegistry
    from vllm.model_executor.models.glm4_moe_lite import Glm4MoeLiteForCausalLM

    class GlmMoeDsaDenseMlaForCausalLM(Glm4MoeLiteForCausalLM):
        """Glm4MoeLite that skips the DSA indexer's weights (unused when every key is selected)."""

        def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
            return super().load_weights((n, w) for n, w in weights if ".indexer." not in n)

    if ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCH, GlmMoeDsaDenseMlaForCausalLM)
