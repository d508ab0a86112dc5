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
        "skyrl_worker_extension": "skyrl_glm.skyrl.vllm_extension.SkyRLGlmWorkerExtension",
    }
