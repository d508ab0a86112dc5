"""What a long command is doing, and for how long: no phase of a command waits in silence.

A phase is opened by a line ending in ``" ..."`` (``"starting the vLLM engine ..."``) and closed by the next line
(``"vLLM engine ready"``), which gets the phase's seconds. In a terminal the open phase is a spinner line with its
elapsed time, replaced by the closing line; elsewhere (a log file, a pipe, CI) each opening and each closing is
one plain line, so a reader of the log sees what was waited on and for how long::

    check: starting the trainer (hf) and the sampler (vllm) ...
    check: trainer and sampler ready (84 s)

A line that neither opens nor closes a phase is printed as it is; ``"Ray ready; starting the workers ..."`` closes
one phase and opens the next on one line (``Ray ready (17 s); starting the workers ...``).
"""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

OPENS = " ..."


class Phases:
    """Prints a command's phase lines on ``console`` (see the module); a context manager that closes the live
    display (and leaves an open phase's line, with its seconds so far, when the command stops inside it)."""

    def __init__(self, console: Console, prefix: str = "") -> None:
        self.console = console
        self.prefix = f"{prefix}: " if prefix else ""
        self.live = console.is_terminal
        self._doing: str | None = None
        self._since = 0.0
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> Phases:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._doing is not None:  # nothing closed it: the command stopped inside it (an error, or a refusal)
            self._print(self._close(f"stopped while {self._doing}" if kind is not None else f"{self._doing}: ended"))
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def line(self, text: str) -> None:
        """One line of the command's progress: opens a phase (ends in ``" ..."``), closes the open one, or is
        printed as it is. ``"DONE; DOING ..."`` closes the open phase and opens the next on one line."""
        if self._doing is None:
            if text.endswith(OPENS):
                self._open(text.removesuffix(OPENS))
            else:
                self._print(text)
            return
        if not text.endswith(OPENS):
            self._print(self._close(text))
            return
        done, sep, doing = text.partition("; ")
        if not sep:
            done, doing = f"{self._doing}: done", text
        self._open(doing.removesuffix(OPENS), after=self._close(done))

    def seconds(self) -> float:
        """How long the open phase has run (0.0 when none is open)."""
        return 0.0 if self._doing is None else time.perf_counter() - self._since

    def _open(self, doing: str, after: str | None = None) -> None:
        """Opens ``doing``; ``after``: the closing line of the phase before, printed on the same line."""
        self._doing, self._since = doing, time.perf_counter()
        if not self.live:
            self._print(f"{after}; {doing}{OPENS}" if after else f"{doing}{OPENS}")
            return
        if after:
            self._print(after)
        if self._progress is None:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self._progress.start()
        self._task = self._progress.add_task(f"{self.prefix}{doing}", total=None)

    def _close(self, done: str) -> str:
        """Ends the open phase; its closing line, ``done`` with the phase's seconds."""
        took = self.seconds()
        if self._progress is not None and self._task is not None:
            self._progress.remove_task(self._task)
            self._task = None
        self._doing = None
        return f"{done} ({took:.0f} s)"

    def _print(self, text: str) -> None:
        self.console.print(f"{self.prefix}{text}", highlight=False, markup=False)
