"""The full-width GLM-5.3 engine both load benches serve (``bench load --config full``, with ``--layouts`` too): its
config-only checkpoint, an update timed to the first request served on it, and the name of the engine without LoRA."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

NO_ADAPTER = "none"  # --layouts: an engine without LoRA, the decode baseline


def full_width_model(directory: Path, layers: int, expert_width: int | None = None) -> Path:
    """A config-only GLM-5.3 checkpoint with its 3 dense layers and ``layers`` full-size MoE layers (the experts
    narrowed to ``expert_width``: :func:`~skyrl_glm.bench.synthetic.model_config`), with the router fields vLLM
    needs (see :data:`skyrl_glm.models.glm5.ROUTER`); vLLM fills the weights (``load_format="dummy"``)."""
    from skyrl_glm.bench.synthetic import model_config
    from skyrl_glm.models.glm5 import ROUTER

    _, config = model_config("glm-5.3", "full", layers, expert_width)
    config.update(ROUTER)
    config.save_pretrained(directory)
    return directory


def publish_to_first_request(
    sampler: Any, publisher: Any, adapter: Any, config: dict[str, Any], version: int, *, repeat: bool = True
) -> tuple[Any, float, float, float | None]:
    """One update on a GPU engine, timed to the end of the first request served on it: ``(result, seconds to the
    end of the publish, seconds to the end of that request, seconds of the same request again)``. The repeat
    (``repeat``; else None) runs on the adapter already active, so the first request's extra over it is what the new
    version cost to activate (vLLM copies a new LoRA into its slots on first use); a rejected update raises."""
    import torch
    from vllm import SamplingParams

    first = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    prompt = [{"prompt_token_ids": [1, 2, 3, 4]}]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = publisher.publish(adapter, config, version)
    if not result.ok:
        raise RuntimeError(f"update {version} was rejected: {result.reason}")
    t1 = time.perf_counter()
    sampler.llm.generate(prompt, first, lora_request=sampler.adapter, use_tqdm=False)
    t2 = time.perf_counter()
    if not repeat:
        return result, t1 - t0, t2 - t0, None
    sampler.llm.generate(prompt, first, lora_request=sampler.adapter, use_tqdm=False)
    return result, t1 - t0, t2 - t0, time.perf_counter() - t2
