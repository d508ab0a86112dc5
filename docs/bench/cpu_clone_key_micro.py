"""What a version like the last costs the load memo and the slot replay per update, off the engine: the structure
key of the staged tensors, the clone of the template and the replay's key, on a GLM-4.5-shaped LoRAModel of 78
layers (546 LoRA modules, 1,092 factors) built by vLLM's own loader. Median of 25 updates after 5, in ms, as one JSON
line: ``median_ms`` with the key read off every tensor, ``vouched_median_ms`` (where the code has it) with the key
the receiver noted for the staged tensors. Run from the repository root:
``python docs/bench/cpu_clone_key_micro.py``."""

from __future__ import annotations

import json
import statistics
import time

import torch
from vllm.lora.lora_model import LoRAModel
from vllm.lora.peft_helper import PEFTHelper

import skyrl_glm
from skyrl_glm.sync.vllm import load_memo
from skyrl_glm.sync.vllm.load_memo import Template, structure
from skyrl_glm.sync.vllm.slot_replay import adapter_factors

MODULES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
MODULES += tuple(f"mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down"))
CONFIG = {"r": 8, "lora_alpha": 8, "target_modules": [m.rsplit(".", 1)[1] for m in MODULES]}


def staged(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for layer in range(78):
        for module in MODULES:
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            out[f"{prefix}.lora_A.weight"] = torch.randn(8, 64, generator=g)
            out[f"{prefix}.lora_B.weight"] = torch.randn(64, 8, generator=g)
    return out


first = staged(0)
lora = LoRAModel.from_lora_tensors(1, first, PEFTHelper.from_dict(dict(CONFIG)), device="cpu", dtype=torch.float32)
template = Template.of(lora, first)
assert template is not None


def median_ms(key, prepare=None) -> float:
    """``key(tensors)`` then the clone and the replay key, timed per update; ``prepare(tensors)`` before the clock."""
    new, seconds = staged(1), []
    for _ in range(30):
        tensors = new if prepare is None else prepare(new)
        t0 = time.perf_counter()
        key(tensors)
        adapter_factors(template.clone(2, tensors, is_3d=False))
        seconds.append(time.perf_counter() - t0)
    return round(statistics.median(seconds[5:]) * 1e3, 3)


def stage_and_note(new: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """As the worker does on receiving: SkyRL stages a copy of the mapping, the receiver's word is noted on it."""
    from skyrl.backends.skyrl_train.patches.vllm.patch_lora_in_memory import _STAGED, stage_in_memory_adapter

    stage_in_memory_adapter("policy@v2", new, CONFIG)
    load_memo.note_structure("policy@v2", (b"layout", "per-expert"))
    return _STAGED["policy@v2"].tensors


out = {"module": skyrl_glm.__file__, "modules": len(lora.loras), "median_ms": median_ms(lambda t: structure(t, CONFIG))}
if hasattr(load_memo, "structure_key"):
    out["vouched_median_ms"] = median_ms(lambda t: load_memo.structure_key("policy@v2", t, CONFIG), stage_and_note)
print(json.dumps(out))
