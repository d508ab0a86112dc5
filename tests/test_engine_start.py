"""vLLM's engine refusing to start is one line naming its own error, never a traceback.

vLLM's exception in the calling process says only "Engine core initialization failed. See root cause above": the
root cause is a log line of the engine or worker process. A quiet command points those processes' output at a log
file and reports the first error line there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from skyrl_glm.sync.vllm.engine import engine_output, start_failure

# The line shapes vLLM's processes write (from a CPU run with forced routed-expert targets).
ENGINE_LOG = """\
(Worker pid=9510) ERROR 12-02 00:37:03 [multiproc_executor.py:953] WorkerProc failed to start.
(Worker pid=9510) ERROR 12-02 00:37:03 [multiproc_executor.py:953] Traceback (most recent call last):
(Worker pid=9510) ERROR 12-02 00:37:03 [multiproc_executor.py:953] AssertionError: CPUUnquantizedExperts does not \
support LoRA.
(EngineCore pid=8779) ERROR 12-02 00:34:52 [core.py:1510] Exception: WorkerProc initialization failed due to an \
exception in a background process. See stack trace for root cause.
"""


def test_the_first_error_line_of_the_engine_log_is_the_reason(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text(ENGINE_LOG)
    wrapper = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    message = str(start_failure(wrapper, str(log)))
    assert message == (
        f"vLLM's engine did not start: AssertionError: CPUUnquantizedExperts does not support LoRA. (log: {log})"
    )
    assert str(start_failure(wrapper, None)).endswith("RuntimeError: " + str(wrapper))  # no log: vLLM's own words


def test_engine_processes_write_to_the_log_and_the_terminal_comes_back(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    child = "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"
    with engine_output(str(log)):
        subprocess.run([sys.executable, "-c", child], check=True)  # inherits fds 1 and 2, as vLLM's engine does
    assert log.read_text().split() == ["to", "stdout", "to", "stderr"]
    done = subprocess.run(
        [sys.executable, "-c", "import os; os.write(1, b'back')"], capture_output=True, check=True, text=True
    )
    assert done.stdout == "back"


@pytest.mark.vllm
def test_a_forced_target_vllm_cannot_wrap_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Routed-expert LoRA forced onto vLLM's CPU build (which has no fused-MoE LoRA kernels): its worker refuses
    at model load; the user sees that refusal on one line, exit 2 (the targets were forced past the policy)."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("SKYRL_GLM_ENGINE_LOG", None)
    targets = "mlp.experts.gate_up_proj,mlp.experts.down_proj"
    done = subprocess.run(
        [sys.executable, "-m", "skyrl_glm.cli", "check", "--model", "glm-4.5", "--lora-targets", targets]
        + ["--allow-unsupported-targets"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stdout + done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("skyrl-glm: error:")]
    assert len(error) == 1, done.stderr[-2000:]
    assert "vLLM's engine did not start: AssertionError: CPUUnquantizedExperts does not support LoRA" in error[0]
    assert "--allow-unsupported-targets" in error[0]
    (log,) = tmp_path.glob("skyrl-glm-engine-*.log")  # kept: the error line names it
    assert f"(log: {log})" in error[0]


def test_an_earlier_engine_of_the_same_command_is_not_the_reason(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("(Worker pid=1) ERROR 12-02 00:00:00 [x.py:1] ValueError: an earlier engine's error\n")
    offset = log.stat().st_size
    with log.open("a") as f:
        f.write(ENGINE_LOG)
    message = str(start_failure(RuntimeError("wrapper"), str(log), offset))
    assert "AssertionError: CPUUnquantizedExperts" in message and "an earlier engine's error" not in message


def test_an_unwritable_engine_log_leaves_the_terminal_as_it_is(caplog: pytest.LogCaptureFixture) -> None:
    with engine_output("/proc/skyrl-glm-no-such-dir/engine.log"):
        os.write(1, b"")  # fds 1 and 2 untouched and open
    assert "cannot be written" in caplog.text and caplog.text.count("\n") == 1
