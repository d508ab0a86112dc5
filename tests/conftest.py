"""Shared fixtures. vLLM engines are session-scoped: each costs ~40 s to start on the 2-core CPU machine."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def glm45_dir(tmp_path_factory: pytest.TempPathFactory):
    from skyrl_glm.models.tiny import make_tiny
    from skyrl_glm.plugins import registry

    return make_tiny(registry().model("glm-4.5"), tmp_path_factory.mktemp("glm45"), seed=0)


@pytest.fixture(scope="session")
def glm45_sampler(glm45_dir):
    """One vLLM CPU engine (fp32) for the tiny GLM-4.5 proxy, LoRA on its CPU-supported default targets."""
    from skyrl_glm.check.scorers import vllm_sampler
    from skyrl_glm.plugins import registry

    family = registry().model("glm-4.5")
    targets = family.lora.resolve(sampler="vllm-cpu")
    sampler = vllm_sampler(glm45_dir, family=family, targets=targets, rank=8, device="cpu", allow_unsupported=False)
    yield sampler
    sampler.close()  # now, not at interpreter exit (where vLLM waits 5 s and logs to a closed stream)


class Versions:
    """Adapter versions must grow per engine; tests sharing one engine draw them from here."""

    def __init__(self) -> None:
        self.last = 0

    def next(self, n: int = 1) -> int:
        first = self.last + 1
        self.last += n
        return first


@pytest.fixture(scope="session")
def versions() -> Versions:
    return Versions()


@pytest.fixture
def glm45_trainer(glm45_dir):
    from skyrl_glm.check.scorers import hf_trainer
    from skyrl_glm.plugins import registry

    family = registry().model("glm-4.5")
    targets = family.lora.resolve(sampler="vllm-cpu")
    return hf_trainer(glm45_dir, family=family, targets=targets, rank=8, alpha=16, device="cpu")
