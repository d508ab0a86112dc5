"""Shared fixtures. vLLM engines are session-scoped: each costs ~40 s to start on the 2-core CPU machine."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(autouse=True)
def _logging_and_quiet_settings_restored():
    """What an in-process command changes for the rest of the process, put back after each test: the environment
    variables and logger levels ``quiet.configure`` sets (a later test's vLLM server inherits the environment: at
    ``VLLM_LOGGING_LEVEL=ERROR`` its log loses the route guard's refusals) and any logger another library disabled."""
    import logging

    from skyrl_glm import quiet

    names = {*quiet.QUIET, *quiet.VERBOSE, quiet.ENGINE_LOG_ENV}
    env = {name: os.environ.get(name) for name in names}
    known = [v for v in logging.root.manager.loggerDict.values() if isinstance(v, logging.Logger)]
    state = {lg: (lg.level, lg.disabled) for lg in [logging.getLogger(), *known]}
    yield
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    for lg, (level, disabled) in state.items():
        lg.setLevel(level)
        lg.disabled = disabled
    for lg in (v for v in logging.root.manager.loggerDict.values() if isinstance(v, logging.Logger)):
        if lg not in state:  # created during the test: not left disabled by a library's logging config
            lg.disabled = False


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
