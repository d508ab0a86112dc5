"""What a training run prints: everything to one log file, progress lines to the terminal.

SkyRL's loop streams every Ray worker's output (its loguru lines, vLLM's, Ray's own) to the driver, hundreds of
lines for two tiny steps. :class:`RunLog` points the driver's stdout and stderr (file descriptors, so Ray's
C++ logs and child processes follow) at ``<trainer.log_path>/skyrl-glm-train-<time>.log`` and follows that file:
the terminal gets the lines marked as progress (:data:`PROGRESS_MARK`, written by the ``skyrl_glm.progress``
logger in whichever process the trainer runs) as phases with their seconds (:class:`skyrl_glm.phases.Phases`),
or every line with ``verbose``. Progress goes through the log
because the trainer runs in a Ray task, possibly on another node: Ray's log stream is the one channel back.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import TextIO

from rich.console import Console

from skyrl_glm.phases import Phases

PROGRESS_LOGGER = "skyrl_glm.progress"
PROGRESS_MARK = "[skyrl-glm progress] "
FOLLOW_INTERVAL_S = 0.2


def log_to_stderr() -> None:
    """In this process: skyrl-glm's INFO lines on stderr as ``[skyrl-glm] ...`` and progress lines with
    :data:`PROGRESS_MARK` (other libraries keep their levels). Idempotent."""
    for name, prefix in (("skyrl_glm", "[skyrl-glm] "), (PROGRESS_LOGGER, PROGRESS_MARK)):
        logger = logging.getLogger(name)
        if not logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter(f"{prefix}%(message)s"))
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False


def progress_text(line: str) -> str | None:
    """The progress message a log line carries (Ray's ``(task pid=N)`` prefix dropped), or None."""
    at = line.find(PROGRESS_MARK)
    return None if at < 0 else line[at + len(PROGRESS_MARK) :]


class RunLog:
    """Context manager: this process's stdout and stderr go to ``path``; a thread follows the file and writes
    progress lines (every line with ``verbose``) to the terminal the process started with (:attr:`terminal`)."""

    def __init__(self, path: Path, verbose: bool = False) -> None:
        self.path = path
        self.verbose = verbose
        self.terminal: TextIO = sys.stdout
        self._saved: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None

    def __enter__(self) -> RunLog:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = (os.dup(1), os.dup(2))
        self.terminal = os.fdopen(os.dup(self._saved[0]), "w", buffering=1, encoding="utf-8", errors="replace")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True)  # type: ignore[attr-defined]
        self._phases = Phases(Console(file=self.terminal, soft_wrap=True))
        self._follower = threading.Thread(target=self._follow, name="skyrl-glm-run-log", daemon=True)
        self._follower.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self._stop.set()
        if self._follower is not None:
            self._follower.join(timeout=5)
        self._phases.__exit__(*exc)  # type: ignore[arg-type]
        self.terminal.close()
        if self._saved is not None:
            os.dup2(self._saved[0], 1)
            os.dup2(self._saved[1], 2)
            for fd in self._saved:
                os.close(fd)
            self._saved = None

    def _follow(self) -> None:
        with open(self.path, encoding="utf-8", errors="replace", newline="") as log:
            pending = ""
            while True:
                stopping = self._stop.is_set()  # read once more after the stop: the last lines are not lost
                chunk = log.read()
                pending += chunk
                *lines, pending = pending.split("\n")
                for line in lines:
                    self._show(line.rstrip("\r"))
                if stopping:
                    if pending:
                        self._show(pending)
                    return
                if not chunk:
                    time.sleep(FOLLOW_INTERVAL_S)

    def _show(self, line: str) -> None:
        if self.verbose:
            self.terminal.write(line + "\n")
        elif (text := progress_text(line)) is not None:
            self._phases.line(text)
