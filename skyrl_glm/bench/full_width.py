"""The full-width GLM-5.3 engine both load benches serve (``bench load --config full``, with ``--layouts`` too): its
config-only checkpoint, an update timed to the first request served on it, and the name of the engine without LoRA."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

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


class Served(NamedTuple):
    """One update timed to the first request served on it (seconds): from before the publish to its end
    (``published_s``) and to the first request's end (``first_s``); the same request again on the adapter already
    active (``repeat_s``); and, with a switch clock, the time vLLM's worker spent pointing each request at its
    adapter (``switch_s``, ``repeat_switch_s``) and in the publish's ``add_adapter`` (``add_s``: the worker's share
    of the load; see :class:`~skyrl_glm.bench.load_layouts.SlotReport`)."""

    result: Any
    published_s: float
    first_s: float
    repeat_s: float | None
    switch_s: float | None
    repeat_switch_s: float | None
    add_s: float | None


def _request(sampler: Any) -> float:
    """One greedy one-token request on the sampler's current adapter; its seconds."""
    from vllm import SamplingParams

    t0 = time.perf_counter()
    sampler.llm.generate(
        [{"prompt_token_ids": [1, 2, 3, 4]}],
        SamplingParams(max_tokens=1, temperature=0.0, detokenize=False),
        lora_request=sampler.adapter,
        use_tqdm=False,
    )
    return time.perf_counter() - t0


def publish_to_first_request(
    sampler: Any,
    publisher: Any,
    adapter: Any,
    config: dict[str, Any],
    version: int,
    *,
    repeat: bool = True,
    switch_clock: Callable[[], dict[str, float]] | None = None,
) -> Served:
    """One update on a GPU engine, timed to the end of the first request served on it, then (``repeat``) the same
    request again; a rejected update raises. ``switch_clock``: the worker's seconds in vLLM's adapter switch
    (``set_active_adapters``) and load (``add_adapter``) since its last call (called after the publish, then after
    each request), read apart from the requests' own time, which on a 75-layer engine varies by up to 0.1 s from
    one request to the next (measured on one H200)."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = publisher.publish(adapter, config, version)
    if not result.ok:
        raise RuntimeError(f"update {version} was rejected: {result.reason}")
    published = time.perf_counter() - t0

    def clock(method: str) -> float | None:
        return None if switch_clock is None else switch_clock()[method]

    added = clock("add_adapter")  # the publish's load (no switch: nothing is served in it)
    first = published + _request(sampler)
    switch = clock("set_active_adapters")
    if not repeat:
        return Served(result, published, first, None, switch, None, added)
    again = _request(sampler)
    return Served(result, published, first, again, switch, clock("set_active_adapters"), added)
