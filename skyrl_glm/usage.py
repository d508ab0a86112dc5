"""How a command ends: what each exit status means (listed in docs/exit-codes.md), bad input from a user and the
checks that find it before any work starts, and a started run that failed.

Every error a user can fix (an unknown name, a bad number, a path that cannot be written) is a
:class:`UsageError`; ``skyrl-glm`` prints its message on one line and exits 2, never with a traceback. A run-time
failure is reported as one line naming the error and where the full log is; the traceback goes to the log
(``logging``), not to the terminal. Kept free of heavy imports: the CLI's argument checks use it before torch or
vLLM load.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

PROG = "skyrl-glm"

OK = 0
CHECK_FAILED = 1  # the handoff check ran and its verdict is FAIL (the report says which step)
USAGE = 2  # the input cannot run: a bad option, recipe, override, file, or hardware the run needs and lacks
RUN_FAILED = 3  # a run that started failed on the way (a sync refused, an engine or worker died, ...)

log = logging.getLogger("skyrl_glm.train")


class UsageError(ValueError):
    """Input the user must change; the message names the option or file and what is wrong with it."""


def one_line(message: object) -> str:
    """The message with its line breaks and runs of spaces folded: an error is reported on one line."""
    return " ".join(str(message).split())


def print_error(prog: str, message: object) -> int:
    """The one way a command reports bad input: ``<prog>: error: <message>`` on one line of stderr. Returns 2,
    the exit code of bad input."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
    return USAGE


def root_cause(error: BaseException) -> BaseException:
    """The original exception behind Ray's wrappers (``RayTaskError.cause``, chained through actors)."""
    seen: set[int] = set()
    while (cause := getattr(error, "cause", None)) is not None and id(cause) not in seen:
        seen.add(id(error))
        error = cause
    return error


def run_failed(command: str, error: BaseException, log_path: str | None, likely: str | None = None) -> int:
    """Report a failure of a started run on one line of stderr (the traceback to the log); returns RUN_FAILED.
    ``likely``: a cause found on the machine (a full temp dir) that the error itself does not name."""
    cause = root_cause(error)
    log.debug("%s failed", command, exc_info=(type(error), error, error.__traceback__))
    text = one_line(cause) or type(cause).__name__
    where = f" (log: {log_path})" if log_path else ""
    because = f"; likely cause: {likely}" if likely else ""
    print(f"{command}: failed: {type(cause).__name__}: {text[:400]}{because}{where}", file=sys.stderr)
    return RUN_FAILED


def temp_space_problem(needed: int) -> str | None:
    """Why the temp dir cannot take ``needed`` more bytes (one line naming it and ``TMPDIR``), or None. The dir is
    ``$TMPDIR`` or ``/tmp`` as set, not :func:`tempfile.gettempdir`, which passes over a full one silently (and some
    libraries write to ``/tmp`` regardless)."""
    directory = os.environ.get("TMPDIR") or "/tmp"
    try:
        free = shutil.disk_usage(directory).free
    except OSError as e:
        return f"temp dir {directory} unusable ({e.strerror or e}); set TMPDIR to a directory with room"
    if free >= needed:
        return None
    have, want = free / 2**20, needed / 2**20
    return f"temp dir {directory} has {have:.0f} MiB free, a run needs {want:.0f} MiB; free space or set TMPDIR"


def positive_int(option: str, value: int) -> int:
    if value < 1:
        raise UsageError(f"{option} must be a positive integer, got {value}")
    return value


def tolerance(option: str, value: float, high: float = math.inf) -> float:
    """A comparison bound: finite and in ``0..high`` (a NaN bound would make every comparison with it false, a
    huge one every comparison true)."""
    if not math.isfinite(value) or not 0 <= value <= high:
        raise UsageError(f"{option} must be a number in 0..{high:g}, got {value}")
    return value


def name_list(option: str, text: str | None) -> list[str] | None:
    """A comma-separated list of names (``None`` when the option was not given); given but empty is an error."""
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError(f"{option} names no targets (got {text!r}); leave it out for the default targets")
    return names


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _can_create_in(directory: Path) -> str | None:
    """Why a file cannot be created in ``directory`` (None if it can): tried, since permission bits lie to root."""
    if not directory.is_dir():
        return f"{directory} is not a directory"
    try:
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as e:
        return f"cannot write in {directory} ({e.strerror or e})"
    return None


def writable_file(option: str, path: str | Path, inputs: Iterable[str | Path] = ()) -> Path:
    """``path`` can be created or overwritten as a file (checked before a run, so a finished run is not lost), and
    is none of the command's ``inputs`` (which writing it would destroy)."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a directory, not a file")
    for source in inputs:
        if path.exists() and Path(source).exists() and path.samefile(source):
            raise UsageError(f"{option} {path}: is an input of this command (writing it would destroy {source})")
    if path.exists():
        try:
            path.open("ab").close()
        except OSError as e:
            raise UsageError(f"{option} {path}: cannot write ({e.strerror or e})") from None
        return path
    why = _can_create_in(_nearest_existing(path.parent))
    if why:
        raise UsageError(f"{option} {path}: {why}")
    return path


def writable_dir(option: str, path: str | Path) -> Path:
    """``path`` is a directory, or can be created as one, and files can be written in it."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path}: exists and is not a directory")
    why = _can_create_in(_nearest_existing(path))
    if why:
        raise UsageError(f"{option} {path}: {why}")
    return path
