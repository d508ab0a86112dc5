"""Third-party chatter off the terminal by default; ``-v`` lets vLLM's engine logs through.

One ``skyrl-glm check`` used to print over a hundred lines that were not the check's: vLLM's INFO log (from the
main process, its engine-core process and its worker), transformers' progress bars, skyrl's loguru DEBUG line,
torch's C++ warnings, and library deprecation warnings. These settings are environment variables, so the
processes vLLM starts inherit them; they must be set before those libraries are imported (the CLI does it
before running a command). A variable the user set already wins.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile

from skyrl_glm.usage import CHECK_FAILED, OK

QUIET = {
    "VLLM_LOGGING_LEVEL": "ERROR",
    "LOGURU_LEVEL": "WARNING",  # skyrl logs through loguru, DEBUG by default
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # c10 warnings such as vLLM CPU's NUMA binding notice
    "TORCH_LOGS": "-torch",  # torch's Python loggers at ERROR (its CUDA_HOME notice in every vLLM process)
    # Library deprecations, and the resource tracker's note about vLLM's message-queue segments that vLLM's
    # engine shutdown leaves to it (the check releases its own segments; -v shows the note).
    "PYTHONWARNINGS": ",".join(
        ("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning:multiprocessing.resource_tracker")
    ),
}
VERBOSE = {"VLLM_LOGGING_LEVEL": "INFO"}
ENGINE_LOG_ENV = "SKYRL_GLM_ENGINE_LOG"
"""Where a quiet command's offline vLLM engine writes its output (its engine process's error tracebacks among it):
set by :func:`configure` (``$TMPDIR/skyrl-glm-engine-<pid>.log``), read by the sampler that starts the engine;
unset, the engine writes to the terminal. The command's own file is removed when the command ends with a result
(exit 0 or 1) and kept when it fails, where its error line names it (:func:`finish`)."""
# SkyRL's vLLM patches note at INFO, through SkyRL's own handler, when one is skipped (its GLM-5.3-Flash LoRA
# packing patch needs torchvision, which the stack leaves out): three wrapped lines atop every ``train``.
SKYRL_PATCH_NOTES = "skyrl.backends.skyrl_train.patches"


def configure(verbose: bool) -> str | None:
    """Logging for a ``skyrl-glm`` command: ours at WARNING (DEBUG with ``-v``), third parties as above. Returns
    the engine log this command owns (None with ``-v``, or when the user named one)."""
    for name, value in (VERBOSE if verbose else QUIET).items():
        os.environ.setdefault(name, value)
    engine_log = None
    if verbose:  # the engine log path is ours, not the user's: one a quiet parent set must not swallow -v's output
        os.environ.pop(ENGINE_LOG_ENV, None)
    else:
        engine_log = os.path.join(tempfile.gettempdir(), f"skyrl-glm-engine-{os.getpid()}.log")
        if os.environ.setdefault(ENGINE_LOG_ENV, engine_log) != engine_log:
            engine_log = None
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not verbose:
        # In case they were imported before these settings: vLLM's Triton probe logs before vLLM configures
        # its own logger (through ours), torch's CUDA_HOME notice.
        for name in ("vllm", "transformers", "torch"):
            logging.getLogger(name).setLevel(logging.ERROR)
        logging.getLogger(SKYRL_PATCH_NOTES).setLevel(logging.WARNING)
    return engine_log


def finish(engine_log: str | None, code: int) -> None:
    """The command's engine log removed when the command ended with a result (exit 0 or 1: nothing to look up);
    kept when it failed (its error line names it)."""
    if engine_log and code in (OK, CHECK_FAILED):
        with contextlib.suppress(OSError):
            os.unlink(engine_log)
