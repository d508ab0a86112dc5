"""How wide the commands' tables and lines are: the terminal's real width in a terminal (a fixed 140 wrapped
every line of a narrower one), 140 columns elsewhere (rich's 80 for a pipe or a log squeezed the tables). Every
table folds a cell that still does not fit onto the next line: a number is never cut short with an ellipsis."""

from __future__ import annotations

from typing import Any

from rich.console import Console

PIPE_WIDTH = 140


def console(**kwargs: Any) -> Console:
    """A rich console at the real width (see the module); ``kwargs`` as :class:`rich.console.Console`'s."""
    probe = Console(**kwargs)
    if probe.is_terminal or "width" in kwargs:
        return probe
    return Console(width=PIPE_WIDTH, **kwargs)
