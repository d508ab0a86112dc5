"""Output paths a command will write, checked before the command does any work (a run must not end in a traceback
because its report cannot be written)."""

from __future__ import annotations

import os
from pathlib import Path


def output_path_error(flag: str, path: str | None) -> str | None:
    """Why ``path`` (given as ``flag``) cannot be written as a file, or None when it can (or was not given).
    Missing parent directories are fine if the nearest existing one is writable: they are created on write."""
    if not path:
        return None
    p = Path(path)
    if p.is_dir():
        return f"{flag} {path}: is a directory"
    if p.exists():
        return None if os.access(p, os.W_OK) else f"{flag} {path}: not writable"
    parent = p.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{flag} {path}: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{flag} {path}: directory {parent} is not writable"
    return None
