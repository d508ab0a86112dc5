"""The SkyRL glue registers the check's ``vllm-skyrl`` sampler and hands it its worker extension: the check never
reaches into ``skyrl/`` (tests/test_layering.py keeps it so)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skyrl_glm.check import scorers
from skyrl_glm.plugins import registry
from skyrl_glm.skyrl import plugin


def test_vllm_skyrl_is_the_checks_vllm_sampler_with_skyrls_worker_extension(monkeypatch) -> None:
    # the registry first (it keeps what the hooks return), then the check's sampler replaced to see what it is given
    assert registry().sampler("vllm-skyrl") is plugin.vllm_skyrl_sampler
    assert registry().sampler("vllm") is scorers.vllm_sampler
    seen: dict[str, Any] = {}

    def fake_sampler(model_dir: Path, **kwargs: Any) -> str:
        seen.update(model_dir=model_dir, **kwargs)
        return "sampler"

    monkeypatch.setattr(scorers, "vllm_sampler", fake_sampler)
    assert plugin.vllm_skyrl_sampler(Path("/m"), rank=8) == "sampler"
    assert seen == {
        "model_dir": Path("/m"),
        "rank": 8,
        "skyrl_worker_extension": "skyrl_glm.skyrl.workers.vllm_extension.SkyRLGlmWorkerExtension",
        "engine": {"max_loras": 1},  # SkyRL's servers' default LoRA slots (the sampler is SkyRL's engine)
    }


def test_skyrl_runs_start_their_engines_with_the_layouts_flags_alone() -> None:
    """SkyRL 0.4.0 turns ``enable_mixed_moe_lora_format`` on for every LoRA engine; a skyrl-glm memory run sets
    every layout flag itself (engine_init_kwargs win), so shared-outer is not also mixed (an engine the worker's
    receiver refuses as ambiguous) and per-expert runs the engine the standalone check verified."""
    from skyrl_glm.sync.expert_layout import PER_EXPERT, SHARED_OUTER, engine_arguments, layout_of

    per_expert = engine_arguments(PER_EXPERT)
    assert per_expert == {"enable_mixed_moe_lora_format": False, "enable_moe_shared_loras": False}
    shared = engine_arguments(SHARED_OUTER)
    assert shared == {"enable_mixed_moe_lora_format": False, "enable_moe_shared_loras": True}
    assert layout_of({**{"enable_mixed_moe_lora_format": True}, **shared}) == SHARED_OUTER  # SkyRL's flag overridden
