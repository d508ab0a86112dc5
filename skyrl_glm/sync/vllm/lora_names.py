"""vLLM's LoRA name parser, kept per name across loads.

A per-expert update hands vLLM 116,292 names (full GLM-5.3), the same every update of a run, and each name is parsed
three times per load (``vllm.lora.utils.parse_fine_tuned_lora_name``: SkyRL's unexpected-module check, then twice in
``LoRAModel.from_lora_tensors``): most of the per-expert load's Python work, measured on the CPU machine. The parse
is a pure function of the name when no weights mapper is given (GLM-5.3's model has none), so its result is kept per
name (the receiver hands over the same name objects each update, whose hashes Python keeps) and the name's
parse costs one lookup from the second load on. With a mapper (a mutable object vLLM makes anew per load) the parse
runs as vLLM ships it. A name the parser refuses is refused again each time (nothing is kept for it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAX_KEPT = 1 << 18  # names kept (about twice a full GLM-5.3 per-expert update); all are dropped when it is reached
_ON = "_skyrl_glm_kept_names"


def kept(parse: Callable[..., tuple[str, bool]]) -> Callable[..., tuple[str, bool]]:
    """``parse`` with its results kept per name for calls without a weights mapper."""
    results: dict[str, tuple[str, bool]] = {}

    def parse_fine_tuned_lora_name(name: str, weights_mapper: Any = None) -> tuple[str, bool]:
        if weights_mapper is not None or type(name) is not str:
            return parse(name, weights_mapper)
        got = results.get(name)
        if got is None:
            got = parse(name)
            if len(results) >= MAX_KEPT:
                results.clear()
            results[name] = got
        return got

    setattr(parse_fine_tuned_lora_name, _ON, results)
    parse_fine_tuned_lora_name.__doc__ = parse.__doc__
    parse_fine_tuned_lora_name.__wrapped__ = parse  # type: ignore[attr-defined]  # vLLM's own, for inspect.unwrap
    return parse_fine_tuned_lora_name


def install() -> None:
    """Put the kept parser where vLLM's LoRA loader and SkyRL's in-memory check look it up (once per process;
    vLLM's general plugin calls it)."""
    from vllm.lora import lora_model, utils

    if hasattr(utils.parse_fine_tuned_lora_name, _ON):
        return
    utils.parse_fine_tuned_lora_name = lora_model.parse_fine_tuned_lora_name = kept(utils.parse_fine_tuned_lora_name)
