"""Pay only for what you use: the pytest plugin, ``skyrl-glm --help``, ``models`` and argument errors never import
torch, skyrl or vLLM (each probe runs in a fresh interpreter, so this test process's own imports do not count)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "skyrl", "vllm", "transformers")

PROBE = """
import json, sys
{body}
print(json.dumps({{m: m in sys.modules for m in {heavy!r}}}))
"""

CLI = """
from skyrl_glm.cli import main
try:
    main({argv!r})
except SystemExit:
    pass
"""


def _loaded(body: str) -> dict[str, bool]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(body=body, heavy=HEAVY)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pytest_plugin_import_is_light():
    assert _loaded("import skyrl_glm.check.pytest_plugin") == dict.fromkeys(HEAVY, False)


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["models"], ["check", "--help"], ["bench", "sync", "--help"], ["check", "--transport", "foo"]],
    ids=["help", "models", "check-help", "bench-help", "bad-argument"],
)
def test_cli_without_work_is_light(argv):
    assert _loaded(CLI.format(argv=argv)) == dict.fromkeys(HEAVY, False)


def test_the_probe_sees_a_heavy_import():
    """The probe itself can fail: a module that needs torch shows up."""
    assert _loaded("import skyrl_glm.sync.plan")["torch"] is True


def test_the_fixture_still_works_in_a_users_suite(tmp_path):
    """The entry-point plugin still gives a user's suite its fixture and marker (heavy imports only inside)."""
    (tmp_path / "test_user.py").write_text(
        "def test_fixture(handoff_check):\n    assert hasattr(handoff_check, 'assert_passes')\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "handoff", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout + out.stderr
