"""``skyrl-glm bench load``: a real vLLM (CPU build) engine takes every in-memory and disk update; the report has
the load stage of both paths. Bad options: one line, exit 2, before any engine starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "skyrl_glm.cli", "bench", "load", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--rounds", "0"], "--rounds must be a positive integer"), (["--warmup", "-1"], "--warmup must be >= 0")],
)
def test_bad_options_are_one_line(args, message):
    got = _cli(*args, timeout=60)
    assert got.returncode == 2
    assert got.stderr.strip().splitlines() == [f"skyrl-glm bench load: error: {message}, got {args[1]}"]


@pytest.mark.vllm
@pytest.mark.slow
def test_load_stage_of_both_paths_on_a_real_engine(tmp_path):
    out = tmp_path / "load.json"
    got = _cli("--model", "glm-4.5", "--rounds", "2", "--warmup", "1", "--json", str(out))
    assert got.returncode == 0, got.stderr[-2000:]
    report = json.loads(out.read_text())
    assert len(report["runs"]["memory"]) == len(report["runs"]["disk"]) == 3
    med = report["medians_s"]
    for path in ("memory", "disk"):
        assert 0 < med[path]["load_s"] < med[path]["total_s"]
    assert 0 < med["memory"]["receive_s"] and 0 < med["disk"]["write_s"]
    assert report["public_tensors"] > 0 and "vLLM load stage" in got.stdout
