"""``scripts/kernel-resources``: the Triton kernels compiled for a CUDA target on this GPU-less machine, ptxas's
report read into a table and JSON; bad options one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kernel-resources"


def test_each_kernel_is_compiled_and_its_registers_read(tmp_path: Path) -> None:
    older = tmp_path / "checksum_older.py"
    older.write_text(
        (SCRIPT.parents[1] / "skyrl_glm" / "sync" / "checksum.py").read_text().replace("_BLOCK = 1024", "_BLOCK = 4096")
    )
    out = tmp_path / "k.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--source", f"checksum={older}", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    got = {(k["kernel"], k["source"]): k for k in json.loads(out.read_text())["kernels"]}
    mine = {(k, "this tree") for k in ("checksum", "compare", "copy_table")}
    assert set(got) == {*mine, ("checksum", "checksum_older.py")}
    assert all(0 < k["registers"] <= 255 for k in got.values())
    assert got[("checksum", "checksum_older.py")]["BLOCK"] == 4096  # the other copy's constants, not this tree's


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--arch", "ampere"], "--arch 'ampere'"), (["--source", "nope=/nonexistent"], "--source 'nope=/nonexistent'")],
)
def test_bad_options_are_one_line(args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [("x = (\n", "cannot be loaded (SyntaxError"), ("y = 1\n", "has no checksum kernel")],
    ids=["broken", "no-kernel"],
)
def test_a_source_that_is_not_a_kernel_module_is_one_line(text: str, message: str, tmp_path: Path) -> None:
    source = tmp_path / "other.py"
    source.write_text(text)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--source", f"checksum={source}"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
