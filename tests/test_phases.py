"""What a long command shows while it waits (:mod:`skyrl_glm.phases`): one plain line per phase start and end when
the output is not a terminal, a live line with elapsed time in one; never a silent wait."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from skyrl_glm.phases import Phases


def _console(terminal: bool) -> Console:
    return Console(record=True, force_terminal=terminal, width=100, file=open("/dev/null", "w"))  # noqa: SIM115


def _printed(*texts: str, prefix: str = "") -> list[str]:
    """The lines a command's phases print outside a terminal, ``texts`` given one after another."""
    console = _console(terminal=False)
    with Phases(console, prefix=prefix) as phases:
        for text in texts:
            phases.line(text)
    return console.export_text().splitlines()


def test_not_a_terminal_gets_one_line_per_phase_start_and_end():
    lines = _printed(
        "starting the vLLM engine ...", "vLLM engine ready", "step 1 ok", "stopping the engine ...", prefix="check"
    )
    assert lines[0] == "check: starting the vLLM engine ..."
    assert re.fullmatch(r"check: vLLM engine ready \(\d+ s\)", lines[1]), lines
    assert lines[2] == "check: step 1 ok"  # neither opens nor closes: as it is
    assert lines[3] == "check: stopping the engine ..."
    assert re.fullmatch(r"check: stopping the engine: ended \(\d+ s\)", lines[4]), lines  # closed at exit
    assert len(lines) == 5


def test_a_line_that_opens_while_a_phase_is_open_closes_it_on_the_same_line():
    lines = _printed(
        "starting Ray ...", "Ray ready; starting the workers ...", "starting the engines ...", "engines up"
    )
    assert lines[0] == "starting Ray ..."
    assert re.fullmatch(r"Ray ready \(\d+ s\); starting the workers \.\.\.", lines[1]), lines
    assert re.fullmatch(r"starting the workers: done \(\d+ s\); starting the engines \.\.\.", lines[2]), lines
    assert re.fullmatch(r"engines up \(\d+ s\)", lines[3]) and len(lines) == 4, lines


def test_a_command_stopped_inside_a_phase_says_where():
    console = _console(terminal=False)
    with pytest.raises(RuntimeError), Phases(console, prefix="check") as phases:
        phases.line("starting the vLLM engine ...")
        raise RuntimeError("engine died")
    assert re.search(r"check: stopped while starting the vLLM engine \(\d+ s\)", console.export_text())


def test_a_terminal_gets_a_live_line_with_elapsed_time_then_the_closing_line():
    console = _console(terminal=True)
    with Phases(console, prefix="check") as phases:
        phases.line("starting the vLLM engine ...")
        assert phases._progress is not None  # the live display: spinner, what is running, elapsed time
        columns = [type(c).__name__ for c in phases._progress.columns]
        assert "TimeElapsedColumn" in columns and "SpinnerColumn" in columns
        assert phases.seconds() >= 0
        phases.line("vLLM engine ready")
    text = console.export_text()
    assert re.search(r"check: vLLM engine ready \(\d+ s\)", text), text
    assert "check: starting the vLLM engine ...\n" not in text  # the opening is the live line, not a printed one
