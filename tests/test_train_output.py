"""What `skyrl-glm train` prints: the run log (everything to a file, progress lines to the terminal), the short
`--dry-run`, and `recipes list`'s whole first sentences. The real training run's output is checked in
tests/test_skyrl_train.py (one SkyRL run serves both)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from skyrl_glm.cli import main
from skyrl_glm.skyrl.config.recipes import resolve_recipe
from skyrl_glm.skyrl.recipes_cli import summary_sentence
from skyrl_glm.skyrl.run.run_log import PROGRESS_MARK, progress_text

ROOT = Path(__file__).resolve().parents[1]

# One process writing the ways a training run's driver gets output: Python's stdout and stderr, the raw file
# descriptor (Ray's C++ logs), a child process (Ray's raylet), a Ray-prefixed progress line, our progress logger.
WRITER = textwrap.dedent(
    """
    import logging, os, subprocess, sys
    from pathlib import Path
    from skyrl_glm.skyrl.run.run_log import PROGRESS_LOGGER, PROGRESS_MARK, RunLog, log_to_stderr

    log_to_stderr()
    with RunLog(Path(sys.argv[1]), verbose=sys.argv[2] == "1") as run:
        logging.getLogger(PROGRESS_LOGGER).info("starting Ray ...")
        print("library line on stdout")
        print("library line on stderr", file=sys.stderr)
        os.write(2, b"C++ line on fd 2\\n")
        subprocess.run(["sh", "-c", "echo child process line"], check=True)
        logging.getLogger(PROGRESS_LOGGER).info("Ray ready")
        print("\\x1b[36m(_experiment pid=7)\\x1b[0m " + PROGRESS_MARK + "step 1/2: reward -1.000", flush=True)
        logging.getLogger(PROGRESS_LOGGER).info("driver progress")
    print("after the run")
    """
)
ALL_LINES = ["library line on stdout", "library line on stderr", "C++ line on fd 2", "child process line"]


def _write_run(tmp_path: Path, verbose: bool) -> tuple[subprocess.CompletedProcess[str], str]:
    log = tmp_path / "logs" / "run.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", WRITER, str(log), "1" if verbose else "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc, log.read_text()


def test_quiet_run_log_shows_progress_lines_only_and_keeps_everything_in_the_file(tmp_path: Path) -> None:
    proc, log = _write_run(tmp_path, verbose=False)
    lines = proc.stdout.splitlines()
    # Output not a terminal: a phase is one line when it starts and one with its seconds when it ends.
    assert lines[0] == "starting Ray ..." and re.fullmatch(r"Ray ready \(\d+ s\)", lines[1]), lines
    assert lines[2:] == ["step 1/2: reward -1.000", "driver progress", "after the run"]
    assert proc.stderr == ""
    for line in [*ALL_LINES, PROGRESS_MARK + "step 1/2", PROGRESS_MARK + "driver progress"]:
        assert line in log, line


def test_verbose_run_log_shows_every_line(tmp_path: Path) -> None:
    proc, log = _write_run(tmp_path, verbose=True)
    shown = proc.stdout
    assert all(line in shown for line in ALL_LINES), shown
    assert all(line in log for line in ALL_LINES)
    assert shown.splitlines()[-1] == "after the run"


def test_progress_text_drops_rays_prefix() -> None:
    assert progress_text(f"\x1b[36m(_experiment pid=11137)\x1b[0m {PROGRESS_MARK}step 2/2: sync 0.035 s") == (
        "step 2/2: sync 0.035 s"
    )
    assert progress_text("[skyrl-glm] skyrl-glm sync 2 (mode memory): 0.035 s") is None


def test_recipes_list_shows_whole_first_sentences(capsys: pytest.CaptureFixture[str]) -> None:
    tiny = summary_sentence(resolve_recipe("tiny_cpu_grpo"))
    assert tiny.startswith("Two GRPO steps") and tiny.endswith("handoff check inside the loop."), tiny
    flash = summary_sentence(resolve_recipe("glm53_flash_dapo_math_2node"))
    assert flash.endswith("AIME 2024 eval."), flash  # the first sentence spans two comment lines
    assert main(["recipes", "list"]) == 0
    table = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "handoff check inside the loop." in table and "8,192-token cap, AIME 2024 eval." in table


def test_summary_sentence_stops_at_a_blank_or_indented_comment(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("# One recipe on SkyRL 0.4, with a version number\n# and no period\n#\n# More.\ntrainer: {}\n")
    assert summary_sentence(recipe) == "One recipe on SkyRL 0.4, with a version number and no period"
    recipe.write_text("# Runs like this:\n#   skyrl-glm train r.yaml\n")
    assert summary_sentence(recipe) == "Runs like this:"


SKIPPED_PATCH_NOTE = """
import sys
from skyrl_glm import quiet
quiet.configure(sys.argv[1] == "-v")
import skyrl.utils.log  # SkyRL's handler on its "skyrl" logger, set up as SkyRL's modules import
from skyrl.backends.skyrl_train.patches.vllm import patch_glm5next_lora_packing as patch
patch.logger.info("Skipping GLM-5.3-Flash LoRA packing patch: No module named 'torchvision'")
"""


def test_v_sends_the_engine_output_to_the_terminal_even_when_a_quiet_parent_set_its_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A quiet command in this process (a test's in-process ``train``) leaves its engine-log path in the environment
    that a ``-v`` child inherits; the child's engine must still write to the terminal."""
    from skyrl_glm import quiet

    env = {**os.environ, quiet.ENGINE_LOG_ENV: "/tmp/a-quiet-parents-engine.log"}
    monkeypatch.setattr(os, "environ", env)  # what configure sets stays out of this process's environment
    monkeypatch.setattr(quiet.logging, "basicConfig", lambda **_: None)  # and its logging as it is
    quiet.configure(verbose=True)
    assert quiet.ENGINE_LOG_ENV not in env


@pytest.mark.parametrize("verbose", [False, True])
def test_skyrl_notes_on_skipped_patches_show_with_v_only(verbose: bool) -> None:
    # The note the real patch logs when it skips (on the logger it uses), in a fresh interpreter: without -v
    # every ``train`` opened with it (three wrapped lines).
    argv = [sys.executable, "-c", SKIPPED_PATCH_NOTE, "-v" if verbose else "-q"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    shown = " ".join((out.stdout + out.stderr).split())  # SkyRL's rich handler wraps it at 80 columns
    assert ("Skipping GLM-5.3-Flash LoRA packing patch" in shown) is verbose, shown


def test_dry_run_is_short_and_the_full_config_is_asked_for(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SKYRL_GLM_CONTROL_KEY_DIR", str(tmp_path))  # four nodes: the key on storage all mount
    assert main(["train", "glm53_dapo_math", "--dry-run"]) == 0
    short = capsys.readouterr().out
    per_node = [line for line in short.splitlines() if line.startswith("#   node ")]
    assert len(per_node) == 4 and len(short.splitlines()) <= 20 + 1 + len(per_node), short  # a line per node more
    assert "trainer:" not in short and "# model: zai-org/GLM-5.3 (megatron)" in short
    assert "# export: " in short and "--show-config" in short
    assert main(["train", "glm53_dapo_math", "--dry-run", "--show-config"]) == 0
    full = capsys.readouterr().out
    assert "trainer:" in full and full.endswith(short.replace(" (--show-config or -v: the full resolved config)", ""))
