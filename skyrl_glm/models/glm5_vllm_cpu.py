"""Serve GLM-5.3 (``glm_moe_dsa``) on vLLM's CPU build as dense MLA.

vLLM CPU refuses DSA sparse attention, and vLLM switches sparse attention on whenever the config *has* an
``index_topk`` attribute (``hasattr``; transformers 5 config classes carry it as a class default, so deleting or
nulling the field does not help). When ``index_topk >= max_model_len`` the indexer selects every key, so DSA equals
dense MLA exactly and the indexer can be dropped: the model is then GLM-4.7-Flash's MLA + MoE layer structure.

:func:`cpu_sampler_overrides` returns ``hf_overrides`` (a picklable callable) that rebuilds the checkpoint's config
as a ``Glm4MoeLiteConfig`` without the indexer fields, with ``first_k_dense_replace`` (vLLM still reads it) and the
architecture ``GlmMoeDsaDenseMlaForCausalLM``: a CPU-only class registered by the package's vLLM plugin, which
skips the indexer's weights and refuses to build when ``max_model_len > index_topk``. No file on disk is edited.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch

ARCH = "GlmMoeDsaDenseMlaForCausalLM"
INDEX_FIELDS = (
    "index_topk",
    "index_head_dim",
    "index_n_heads",
    "indexer_types",
    "indexer_rope_interleave",
    "index_topk_freq",
    "index_skip_topk_offset",
    "index_topk_pattern",
    "index_share",
    "layer_types",
)
# Stashed on the rebuilt config so the engine side can re-check the equivalence.
SOURCE_TOPK = "dense_mla_source_index_topk"


class DenseMlaUnsafe(ValueError):
    """DSA would drop keys at this length, so serving it as dense MLA would change the model."""


def check_dense_equivalent(index_topk: int, max_model_len: int) -> None:
    if index_topk < max_model_len:
        raise DenseMlaUnsafe(
            f"index_topk={index_topk} < max_model_len={max_model_len}: DSA would select a subset of keys, so "
            "dense MLA is not the same model. Lower max_model_len to <= index_topk."
        )


def _first_k_dense(config: Any) -> int:
    k = getattr(config, "first_k_dense_replace", None)
    if k is not None:
        return int(k)
    types = getattr(config, "mlp_layer_types", None) or []
    return next((i for i, t in enumerate(types) if t != "dense"), len(types))


def as_dense_mla_config(config: Any, *, max_model_len: int) -> Any:
    """``hf_overrides`` body: a GLM-5.3 config -> an equivalent dense-MLA ``Glm4MoeLiteConfig`` for vLLM CPU."""
    from transformers import Glm4MoeLiteConfig

    if getattr(config, SOURCE_TOPK, None) is not None:
        return config  # already rebuilt (vLLM may apply overrides more than once)
    if str(getattr(config, "model_type", "")).startswith("dummy_"):
        return config  # vLLM probes the callable with a dummy config to learn the output model_type
    topk = getattr(config, "index_topk", None)
    if topk is None:
        raise DenseMlaUnsafe("config has no index_topk: not a glm_moe_dsa checkpoint")
    check_dense_equivalent(int(topk), max_model_len)
    d = config.to_dict()
    for k in (*INDEX_FIELDS, "model_type", "architectures", "transformers_version", "qk_head_dim", "head_dim"):
        d.pop(k, None)
    new = Glm4MoeLiteConfig(**d)
    new.architectures = [ARCH]
    new.first_k_dense_replace = _first_k_dense(config)
    setattr(new, SOURCE_TOPK, int(topk))
    for k in INDEX_FIELDS:
        if hasattr(new, k):
            raise AssertionError(f"rebuilt config still has {k}; vLLM would switch sparse attention on")
    return new


def cpu_sampler_overrides(config: Any, max_model_len: int) -> functools.partial:
    """``hf_overrides`` for ``vllm.LLM`` that serve a GLM-5.3 checkpoint as dense MLA on CPU (checked up front)."""
    check_dense_equivalent(int(config.index_topk), max_model_len)
    return functools.partial(as_dense_mla_config, max_model_len=max_model_len)


def register_cpu_model() -> None:
    from vllm import ModelRegistry
    from vllm.model_executor.models.glm4_moe_lite import Glm4MoeLiteForCausalLM

    class GlmMoeDsaDenseMlaForCausalLM(Glm4MoeLiteForCausalLM):
        """Glm4MoeLite that skips the DSA indexer's weights (unused when every key is selected)."""

        def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
            topk = getattr(vllm_config.model_config.hf_config, SOURCE_TOPK, None)
            if topk is None:
                raise DenseMlaUnsafe(f"{ARCH} needs hf_overrides from skyrl_glm cpu_sampler_overrides")
            check_dense_equivalent(int(topk), vllm_config.model_config.max_model_len)
            super().__init__(vllm_config=vllm_config, prefix=prefix)

        def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
            return super().load_weights((n, w) for n, w in weights if ".indexer." not in n)

    GlmMoeDsaDenseMlaForCausalLM.__name__ = ARCH
    GlmMoeDsaDenseMlaForCausalLM.__qualname__ = ARCH
    if ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCH, GlmMoeDsaDenseMlaForCausalLM)
