"""What the tests of vLLM's GPU build share: their marks, the skip where no CUDA GPU or no vLLM is found, and the
JSON reports they keep where ``SKYRL_GLM_GPU_RESULTS=DIR`` names a directory (the GPU kit collects them)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

MARKS = [pytest.mark.gpu, pytest.mark.vllm]


def require_cuda_vllm() -> ModuleType:
    """torch; or the calling test module (which calls this as it is imported) skipped: no torch, CUDA GPU or vLLM."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU", allow_module_level=True)
    pytest.importorskip("vllm")
    return torch


def keep_result(name: str, result: dict[str, Any]) -> None:
    """``result`` as ``DIR/name`` where ``SKYRL_GLM_GPU_RESULTS=DIR`` is set."""
    if out := os.environ.get("SKYRL_GLM_GPU_RESULTS"):
        Path(out, name).write_text(json.dumps(result, indent=1))
