"""``skyrl-glm train``'s exit codes (docs/exit-codes.md): what cannot start is refused before it starts (2), a run
that fails after it started is one line with the log's path (3), never 1 (the handoff check's FAIL) nor a traceback.

Each case runs the real command in a subprocess, as a user would; the two that start Ray stop within seconds of it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from skyrl_glm.usage import RUN_FAILED, root_cause, run_failed

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "recipes/tiny_cpu_grpo.yaml"


def _train(
    tmp_path: Path, model: Path, *overrides: str, timeout: int = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    paths = [f"trainer.{key}={tmp_path / key}" for key in ("export_path", "ckpt_path", "log_path")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}
    cmd = [sys.executable, "-m", "skyrl_glm.cli", "train", RECIPE, f"trainer.policy.model.path={model}", *paths]
    return subprocess.run([*cmd, *overrides], capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)


def test_missing_data_is_refused_before_anything_starts(tmp_path, glm45_dir):
    proc = _train(tmp_path, glm45_dir, f"data.train_data=['{tmp_path}/nothing.parquet']")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"skyrl-glm train: error: data.train_data: {tmp_path}/nothing.parquet: no such file "
        "(skyrl-glm data prepare ... writes it)"
    )
    assert "Traceback" not in proc.stderr and "Ray" not in proc.stderr  # refused before Ray started


def test_a_bad_slot_replay_switch_is_refused_before_the_engines_read_it(tmp_path, glm45_dir):
    """SkyRL starts the engines, whose workers read SKYRL_GLM_SLOT_REPLAY: a typo there would stop a worker with
    its traceback minutes in; the command reads it first."""
    proc = _train(tmp_path, glm45_dir, env={"SKYRL_GLM_SLOT_REPLAY": "off"}, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "skyrl-glm train: error: SKYRL_GLM_SLOT_REPLAY='off': 1 (the slot replay, the default) or 0 (vLLM's own writes)"
    )
    assert "Traceback" not in proc.stderr and not (tmp_path / "log_path").exists()


def test_a_gpu_run_without_a_visible_gpu_is_refused_before_ray_starts(tmp_path, glm45_dir):
    """Without CPU mode the layout needs real GPUs, which this machine has none of: refused before Ray starts (Ray
    would otherwise wait forever for them)."""
    proc = _train(tmp_path, glm45_dir, "skyrl_glm.cpu=false", "trainer.logger=console", timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith("skyrl-glm train: error: skyrl_glm.cpu: false, but no CUDA GPU is visible here")
    ), proc.stderr[-3000:]
    assert not (tmp_path / "log_path").exists()  # no run log: nothing started


@pytest.mark.slow
def test_a_run_that_fails_after_it_started_is_one_line_and_exit_3(tmp_path, glm45_dir):
    """The data file exists but is no dataset: found by SkyRL after Ray and the experiment started."""
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("this is not json\n")
    proc = _train(tmp_path, glm45_dir, f"data.train_data=['{garbage}']", f"data.val_data=['{garbage}']")
    assert proc.returncode == RUN_FAILED, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    failed = [line for line in proc.stderr.splitlines() if line.startswith("skyrl-glm train: failed: ")]
    assert len(failed) == 1 and f"(log: {tmp_path / 'log_path'}/skyrl-glm-train-" in failed[0], proc.stderr[-3000:]
    log = Path(failed[0].rsplit("(log: ", 1)[1].rstrip(")")).read_text()
    assert "Traceback" in log and "the run failed" in log  # the traceback is in the log the line names


def test_the_root_cause_behind_ray_wrappers_is_reported(capsys):
    """Ray hands an actor's exception on wrapped (``RayTaskError.cause``), an actor inside a task twice."""

    class Wrapped(Exception):
        def __init__(self, cause: BaseException) -> None:
            super().__init__(f"ray::task() (pid=1)\nTraceback ...\n{cause}")
            self.cause = cause

    sync = RuntimeError("skyrl-glm LoRA sync of version 3 failed: update rejected: checksum mismatch on 'x'")
    assert root_cause(Wrapped(Wrapped(sync))) is sync
    assert run_failed("skyrl-glm train", Wrapped(Wrapped(sync)), "/logs") == RUN_FAILED
    err = capsys.readouterr().err
    assert err == (
        "skyrl-glm train: failed: RuntimeError: skyrl-glm LoRA sync of version 3 failed: update rejected: "
        "checksum mismatch on 'x' (log: /logs)\n"
    )


def test_a_megatron_run_without_its_stack_names_what_is_missing_before_ray_starts(tmp_path, glm45_dir, monkeypatch):
    """SkyRL's Megatron worker imports Transformer Engine and Megatron-Bridge inside a Ray actor, minutes in: the
    command checks them first. In process, with a module no machine has standing in for a missing package, so the
    test holds on a machine with the Megatron stack too."""
    from skyrl_glm.skyrl.compat import trainer_stack
    from skyrl_glm.skyrl.run.launch import run_command

    monkeypatch.setattr(trainer_stack, "MEGATRON_STACK", (*trainer_stack.MEGATRON_STACK, ("no_such_te", "te-x")))
    paths = [f"trainer.{key}={tmp_path / key}" for key in ("export_path", "ckpt_path", "log_path")]
    code = run_command(["tiny_gpu_megatron", f"trainer.policy.model.path={glm45_dir}", *paths])
    assert code == 2
    assert not (tmp_path / "log_path").exists()  # no run log: nothing started
    problem = trainer_stack.trainer_stack_problem("megatron")
    assert problem is not None and problem.startswith("trainer.strategy: megatron needs ") and "te-x" in problem
    assert trainer_stack.trainer_stack_problem("fsdp") is None


def test_skyrl_megatron_imports_are_found_in_the_installed_bridge_source(tmp_path):
    """SkyRL 0.4.0's Megatron worker imports names no Megatron-Bridge release has (measured on one H200 with
    Bridge 0.6.2: ImportError inside the Ray actor, two minutes in). The check reads SkyRL's import statements and
    finds each name in Bridge's source, before anything starts. Here: a SkyRL module importing two names from a
    Bridge tree that defines one, then both; and SkyRL's real Megatron modules against a Bridge without them."""
    import importlib.util

    from skyrl_glm.skyrl.compat.trainer_stack import SKYRL_MEGATRON, bridge_api_problem

    skyrl = tmp_path / "skyrl"
    worker = skyrl / SKYRL_MEGATRON[0] / "wrapper.py"
    worker.parent.mkdir(parents=True)
    worker.write_text("from megatron.bridge.peft.utils import sync_a, sync_b\n")
    utils = tmp_path / "bridge" / "peft" / "utils.py"
    utils.parent.mkdir(parents=True)
    utils.write_text("def sync_a():\n    pass\n")
    problem = bridge_api_problem(skyrl, tmp_path / "bridge")
    assert problem is not None and "SkyRL's wrapper imports sync_b from megatron.bridge.peft.utils" in problem
    utils.write_text("def sync_a():\n    pass\n\n\nfrom x import sync_b\n")
    assert bridge_api_problem(skyrl, tmp_path / "bridge") is None

    real = next(iter(importlib.util.find_spec("skyrl").submodule_search_locations))
    problem = bridge_api_problem(Path(real), tmp_path / "bridge")
    assert problem is not None and problem.startswith("trainer.strategy: megatron: SkyRL's "), problem
