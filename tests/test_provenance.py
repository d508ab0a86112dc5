"""The commit a report records is the project's own: a copy of the project without its git history, inside another
repository, must not record that repository's commit (it records none; the installed version stays in
``versions``), and the copy made its own checkout records its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import skyrl_glm

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env |= {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def _repo_with_a_commit(path: Path) -> str:
    _git(path, "init", "-q")
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "--allow-empty", "-m", "c")
    return _git(path, "rev-parse", "--short", "HEAD")


def _recorded_commit(project: Path) -> str:
    """The commit ``provenance()`` records, from a fresh interpreter that imports the package from ``project``."""
    env = {k: v for k, v in os.environ.items() if k != "SKYRL_GLM_COMMIT" and not k.startswith("GIT_")}
    env["PYTHONPATH"] = str(project)
    code = "from skyrl_glm.provenance import provenance; print(provenance()['commit'])"
    out = subprocess.run([sys.executable, "-c", code], cwd=project, env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


@pytest.fixture
def copy_inside_another_repo(tmp_path: Path) -> tuple[Path, str]:
    outer = tmp_path / "other"
    project = outer / "vendored" / "skyrl-glm"
    package = Path(skyrl_glm.__file__).parent
    shutil.copytree(package, project / "skyrl_glm", ignore=shutil.ignore_patterns("__pycache__"))
    return project, _repo_with_a_commit(outer)


def test_a_copy_inside_another_repository_records_no_commit(copy_inside_another_repo: tuple[Path, str]) -> None:
    project, outer_commit = copy_inside_another_repo
    assert _recorded_commit(project) == "None"


def test_the_copy_as_its_own_checkout_records_its_own_commit(copy_inside_another_repo: tuple[Path, str]) -> None:
    project, outer_commit = copy_inside_another_repo
    own = _repo_with_a_commit(project)
    assert own != outer_commit
    assert _recorded_commit(project) == own
