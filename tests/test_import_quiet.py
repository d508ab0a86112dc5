"""Importing skyrl-glm's SkyRL glue prints nothing (it printed four third-party lines: vLLM's Triton note, torch's
CUDA_HOME guess, SkyRL's loguru DEBUG and INFO lines about its vLLM patches), while the same loggers' other
warnings still show. Each probe runs in a fresh interpreter: this process's imports do not count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("LOGURU_LEVEL", "TORCH_LOGS", "VLLM_LOGGING_LEVEL")}
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
    )


def test_importing_the_skyrl_glue_prints_nothing():
    proc = _run("import skyrl_glm.skyrl.run.trainer")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == "" and proc.stderr == "", proc.stderr[-3000:]


def test_the_same_loggers_other_warnings_and_errors_still_show():
    code = (
        "import logging, skyrl_glm\n"
        "logging.getLogger('torch.utils.cpp_extension').warning('No CUDA runtime is found, using CUDA_HOME=x')\n"
        "logging.getLogger('torch.utils.cpp_extension').warning('a different warning')\n"
        "logging.getLogger('vllm.triton_utils.importing').error('a real error')\n"
        "from loguru import logger\n"
        "logger.debug('a debug note')\n"
        "logger.warning('a loguru warning')\n"
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr
    assert "No CUDA runtime" not in proc.stderr and "a debug note" not in proc.stderr
    assert "a different warning" in proc.stderr and "a real error" in proc.stderr and "a loguru warning" in proc.stderr


def test_a_level_the_user_set_wins():
    proc = _run("import skyrl_glm\nfrom loguru import logger\nlogger.debug('asked for')", LOGURU_LEVEL="DEBUG")
    assert "asked for" in proc.stderr
