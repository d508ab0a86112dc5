"""A command started in the background with its stdout and stderr in files of its own directory: the slow CLI runs
of a test module start together (each mostly one core importing), and each test then waits for its own."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Background:
    tmp: Path
    cmd: list[str]
    proc: subprocess.Popen[str]

    @classmethod
    def start(cls, tmp: Path, cmd: list[str], **popen: Any) -> Background:
        with (tmp / "stdout.txt").open("w") as out, (tmp / "stderr.txt").open("w") as err:
            return cls(tmp, cmd, subprocess.Popen(cmd, stdout=out, stderr=err, text=True, **popen))

    def wait(self, timeout: float) -> subprocess.CompletedProcess[str]:
        """Its exit and output; past ``timeout`` seconds it is killed and the timeout raised."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        out, err = ((self.tmp / name).read_text() for name in ("stdout.txt", "stderr.txt"))
        return subprocess.CompletedProcess(self.cmd, code, out, err)
