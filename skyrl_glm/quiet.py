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
QUIET_LOGGERS = ("vllm", "transformers", "torch", "matplotlib")  # at ERROR unless -v
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
        if _loguru_level_ours:  # SkyRL's DEBUG lines, which importing skyrl_glm turned off, back with -v
            os.environ.pop("LOGURU_LEVEL", None)
    else:
        engine_log = os.path.join(tempfile.gettempdir(), f"skyrl-glm-engine-{os.getpid()}.log")
        if os.environ.setdefault(ENGINE_LOG_ENV, engine_log) != engine_log:
            engine_log = None
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not verbose:
        # In case they were imported before these settings: vLLM's Triton probe logs before vLLM configures
        # its own logger (through ours), torch's CUDA_HOME notice; matplotlib's font fallbacks as a plot is drawn
        # (21 lines under a check on a machine whose font cache lacked the STIX fonts).
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        logging.getLogger(SKYRL_PATCH_NOTES).setLevel(logging.WARNING)
    return engine_log


def finish(engine_log: str | None, code: int) -> None:
    """The command's engine log removed when the command ended with a result (exit 0 or 1: nothing to look up);
    kept when it failed (its error line names it)."""
    if engine_log and code in (OK, CHECK_FAILED):
        with contextlib.suppress(OSError):
            os.unlink(engine_log)


# Notes third-party libraries print while skyrl-glm's SkyRL glue is imported (``skyrl_glm.skyrl.run.trainer``: four
# lines on a CPU machine, measured 2026-12-03), dropped by their exact text so that every other message of those
# loggers, warnings and errors included, still shows: vLLM's CPU build on a Triton without a CPU backend, torch's
# CUDA_HOME guess on a machine without CUDA.
IMPORT_NOTES = {
    "vllm.triton_utils.importing": "Triton is installed, but doesn't include CPU backend",
    "torch.utils.cpp_extension": "No CUDA runtime is found",
}


class _DropNote(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.text)


def import_notes_off() -> None:
    """Called when ``skyrl_glm`` is imported: the :data:`IMPORT_NOTES` dropped, and SkyRL's loguru DEBUG/INFO
    lines at import (its vLLM patches announcing themselves) off by ``LOGURU_LEVEL=WARNING`` when loguru is not
    imported yet and the user set no level (loguru reads it once; its warnings and errors still show). Idempotent."""
    import sys

    for name, text in IMPORT_NOTES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNote) for f in logger.filters):
            logger.addFilter(_DropNote(text))
    global _loguru_level_ours
    if "loguru" not in sys.modules and "LOGURU_LEVEL" not in os.environ:
        os.environ["LOGURU_LEVEL"] = "WARNING"
        _loguru_level_ours = True


_loguru_level_ours = False  # LOGURU_LEVEL is import_notes_off's, not the user's: -v takes it back
