"""The ranges of SkyRL values that SkyRL accepts at any value but that fail only after Ray, the models and vLLM
started (or make a run loop forever, or allocate on a typo): checked by the validation pass, one line each."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from skyrl.train.config import SkyRLTrainConfig

# A count past int32 is a typo (vLLM and torch keep counts like these in 32-bit fields).
MAX_COUNT = 2**31 - 1
# SkyRL counts: each must be in 1..MAX_COUNT.
COUNTS = (
    "trainer.epochs",
    "trainer.train_batch_size",
    "trainer.policy_mini_batch_size",
    "trainer.micro_train_batch_size_per_gpu",
    "trainer.micro_forward_batch_size_per_gpu",
    "trainer.update_epochs_per_batch",
    "trainer.max_prompt_length",
    "trainer.placement.policy_num_nodes",
    "trainer.placement.policy_num_gpus_per_node",
    "generator.max_input_length",
    "generator.n_samples_per_prompt",
    "generator.eval_n_samples_per_prompt",
    "generator.sampling_params.max_generate_length",
    "generator.eval_sampling_params.max_generate_length",
    "generator.inference_engine.num_engines",
    "generator.inference_engine.tensor_parallel_size",
    "generator.inference_engine.pipeline_parallel_size",
    "generator.inference_engine.data_parallel_size",
    "generator.inference_engine.max_num_seqs",
    "generator.inference_engine.max_num_batched_tokens",
)
# vLLM engine arguments a recipe may pass through ``engine_init_kwargs`` (untyped in SkyRL's config): counts.
ENGINE_COUNTS = (
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_loras",
    "max_cpu_loras",
    "max_lora_rank",
)
ENGINE_KWARGS = "generator.inference_engine.engine_init_kwargs"
SAMPLING = ("generator.sampling_params", "generator.eval_sampling_params")
MAX_LOGPROBS = 20  # vLLM's default max_logprobs (an engine argument): more is refused at the first request
LORA = "trainer.policy.model.lora"
MAX_LORA_RANK = 512  # vLLM's largest max_lora_rank


def _select(root: object, dotted: str) -> Any:
    return functools.reduce(lambda node, key: getattr(node, key, None), dotted.split("."), root)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _count_problem(key: str, value: Any) -> str | None:
    if value is None and key.startswith(SAMPLING[1]):  # eval sampling defaults to the training one
        return None
    if not _is_int(value) or not 1 <= value <= MAX_COUNT:
        return f"{key}: must be an integer in 1..{MAX_COUNT}, got {value!r:.60}"
    return None


def _sampling_problem(prefix: str, params: Any, max_logprobs: int) -> str | None:
    if params is None:
        return None
    checks = (
        ("temperature", lambda v: _number(v) and v >= 0, "a finite number >= 0"),
        ("top_p", lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]"),
        ("min_p", lambda v: _number(v) and 0 <= v <= 1, "a number in 0..1"),
        ("top_k", lambda v: _is_int(v) and -1 <= v <= MAX_COUNT, f"-1 or 0 (off) or a count up to {MAX_COUNT}"),
        ("logprobs", lambda v: v is None or (_is_int(v) and 0 <= v <= max_logprobs), f"null or in 0..{max_logprobs}"),
    )
    for name, ok, want in checks:
        if hasattr(params, name) and not ok(value := getattr(params, name)):
            return f"{prefix}.{name}: must be {want}, got {value!r:.60}"
    return None


def _names(value: Any) -> bool:
    """A module selection PEFT and Megatron-Bridge take: one name (``all-linear``) or a non-empty list of names."""
    if isinstance(value, str):
        return bool(value.strip())
    return isinstance(value, Sequence) and bool(value) and all(isinstance(v, str) and v.strip() for v in value)


def _lora_problem(lora: Any) -> str | None:
    if lora is None:
        return None
    rank = getattr(lora, "rank", 0)
    if not _is_int(rank) or not 0 <= rank <= MAX_LORA_RANK:
        return f"{LORA}.rank: must be an integer in 0..{MAX_LORA_RANK} (0: no LoRA), got {rank!r:.60}"
    if rank == 0:
        return None
    checks = (
        ("alpha", lambda v: _number(v) and v > 0, "a finite number > 0"),
        ("dropout", lambda v: _number(v) and 0 <= v < 1, "a number in [0, 1)"),
        ("target_modules", _names, "a module name (all-linear) or a non-empty list of module names"),
        ("exclude_modules", lambda v: v is None or _names(v), "null, a module name or a list of module names"),
    )
    for name, ok, want in checks:
        if hasattr(lora, name) and not ok(value := getattr(lora, name)):
            return f"{LORA}.{name}: must be {want}, got {value!r:.60}"
    return None


def range_problem(cfg: SkyRLTrainConfig) -> str | None:
    """The first SkyRL value out of its range (one line naming the key), or None."""
    if (problem := _lora_problem(_select(cfg, LORA))) is not None:
        return problem
    for key in COUNTS:
        if (problem := _count_problem(key, _select(cfg, key))) is not None:
            return problem
    engine = _select(cfg, ENGINE_KWARGS) or {}
    for name in ENGINE_COUNTS:
        if name in engine and (problem := _count_problem(f"{ENGINE_KWARGS}.{name}", engine[name])) is not None:
            return problem
    for prefix in SAMPLING:
        max_logprobs = engine.get("max_logprobs", MAX_LOGPROBS)
        max_logprobs = max_logprobs if _is_int(max_logprobs) else MAX_LOGPROBS
        if (problem := _sampling_problem(prefix, _select(cfg, prefix), max_logprobs)) is not None:
            return problem
    return None
