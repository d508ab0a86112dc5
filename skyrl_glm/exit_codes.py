"""What a skyrl-glm command's exit status means: one meaning per code (listed in docs/exit-codes.md).

A run-time failure is reported as one line naming the error and where the full log is; the traceback goes to
the log (``logging``), not to the terminal.
"""

from __future__ import annotations

import logging
import sys

OK = 0
CHECK_FAILED = 1  # the handoff check ran and its verdict is FAIL (the report says which step)
USAGE = 2  # the input cannot run: a bad option, recipe, override, file, or hardware the run needs and lacks
RUN_FAILED = 3  # a run that started failed on the way (a sync refused, an engine or worker died, ...)

log = logging.getLogger("skyrl_glm.train")


def root_cause(error: BaseException) -> BaseException:
    """The original exception behind Ray's wrappers (``RayTaskError.cause``, chained through actors)."""
    seen: set[int] = set()
    while (cause := getattr(error, "cause", None)) is not None and id(cause) not in seen:
        seen.add(id(error))
        error = cause
    return error


def run_failed(command: str, error: BaseException, log_path: str | None) -> int:
    """Report a failure of a started run on one line of stderr (the traceback to the log); returns RUN_FAILED."""
    cause = root_cause(error)
    log.debug("%s failed", command, exc_info=(type(error), error, error.__traceback__))
    text = " ".join(str(cause).split()) or type(cause).__name__
    where = f" (log: {log_path})" if log_path else ""
    print(f"{command}: failed: {type(cause).__name__}: {text[:400]}{where}", file=sys.stderr)
    return RUN_FAILED
