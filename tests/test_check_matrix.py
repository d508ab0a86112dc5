"""``skyrl-glm check-matrix`` on the real vLLM CPU engine: several checks on one trainer and one engine, each
starting from B == 0 with newer versions; the matrix verdict holds only when every pair did what it must."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_matrix_shares_one_engine_and_judges_each_pair(tmp_path) -> None:
    out = tmp_path / "matrix.json"
    faults = "none,no-publish,none,double-scale,drop-aliases"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "skyrl_glm.cli",
            "check-matrix",
            "--transports",
            "cpu,disk",
            "--faults",
            faults,
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    rows = [(r["transport"], r["fault"], r["outcome"]) for r in result["checks"]]
    assert rows == [
        ("cpu", "none", "PASS"),
        ("cpu", "no-publish", "FAIL at step 5"),
        ("cpu", "none", "PASS"),  # a later check on the same sides starts clean again
        ("cpu", "double-scale", "FAIL at step 5"),
        ("cpu", "drop-aliases", "n/a"),  # CPU targets (no routed experts) share no tensors to drop
        ("disk", "none", "PASS"),
        ("disk", "no-publish", "FAIL at step 5"),
        ("disk", "none", "PASS"),
        ("disk", "double-scale", "FAIL at step 5"),
        ("disk", "drop-aliases", "n/a"),
    ]
    versions = [s["extra"] for r in result["checks"] if r["report"] for s in r["report"]["steps"] if s["step"] == 1]
    assert all(v["repeat_max"] == 0.0 for v in versions)  # one engine, every repeat exact
    assert result["all_as_expected"] and result["commit"] and result["versions"]["skyrl"] == "0.4.0"


def test_matrix_refuses_an_unknown_fault_before_any_engine() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "skyrl_glm.cli", "check-matrix", "--faults", "none,nope"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "unknown fault 'nope'" in proc.stderr
