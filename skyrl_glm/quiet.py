"""Third-party chatter off the terminal by default; ``-v`` lets vLLM's engine logs through.

One ``skyrl-glm check`` used to print over a hundred lines that were not the check's: vLLM's INFO log (from the
main process, its engine-core process and its worker), transformers' progress bars, skyrl's loguru DEBUG line,
torch's C++ warnings, and library deprecation warnings. These settings are environment variables, so the
processes vLLM starts inherit them; they must be set before those libraries are imported (the CLI does it
before running a command). A variable the user set already wins.
"""

from __future__ import annotations

import logging
import os
import tempfile

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
set by :func:`configure`, read by the sampler that starts the engine; unset, the engine writes to the terminal."""
# SkyRL's vLLM patches note at INFO, through SkyRL's own handler, when one is skipped (its GLM-5.3-Flash LoRA
# packing patch needs torchvision, which the stack leaves out): three wrapped lines atop every ``train``.
SKYRL_PATCH_NOTES = "skyrl.backends.skyrl_train.patches"


def configure(verbose: bool) -> None:
    """Logging for a ``skyrl-glm`` command: ours at WARNING (DEBUG with ``-v``), third parties as above."""
    for name, value in (VERBOSE if verbose else QUIET).items():
        os.environ.setdefault(name, value)
    if verbose:  # the engine log path is ours, not the user's: one a quiet parent set must not swallow -v's output
        os.environ.pop(ENGINE_LOG_ENV, None)
    else:
        engine_log = os.path.join(tempfile.gettempdir(), f"skyrl-glm-engine-{os.getpid()}.log")
        os.environ.setdefault(ENGINE_LOG_ENV, engine_log)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not verbose:
        # In case they were imported before these settings: vLLM's Triton probe logs before vLLM configures
        # its own logger (through ours), torch's CUDA_HOME notice.
        for name in ("vllm", "transformers", "torch"):
            logging.getLogger(name).setLevel(logging.ERROR)
        logging.getLogger(SKYRL_PATCH_NOTES).setLevel(logging.WARNING)
