"""The run's control key file: read only when it is exactly a key in a private, singly linked file, removed when the
process that made it exits (normally or with an error) or when ``run_key`` ends; a MAC of the wrong form is refused
as unsigned, never a TypeError."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from skyrl_glm.sync.vllm import control
from skyrl_glm.sync.vllm.control import ControlRefused

KEY = "ab" * control.KEY_BYTES


def _key_file(tmp_path: Path, text: bytes, mode: int = 0o600) -> str:
    path = tmp_path / "control.key"
    path.write_bytes(text)
    path.chmod(mode)
    return str(path)


def test_a_private_file_holding_exactly_a_key_is_read(tmp_path):
    assert control._read_key(_key_file(tmp_path, KEY.encode())) == bytes.fromhex(KEY)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (KEY.encode() + b"\n", "does not hold a key"),  # trailing bytes
        (KEY.encode() + b"00", "does not hold a key"),
        (b"0" * control.KEY_CHARS, "does not hold a key"),  # all zeros
        (KEY.upper().encode(), "does not hold a key"),
        (KEY[:-2].encode(), "does not hold a key"),
        (b"", "does not hold a key"),
        (("\u00e9" * 32).encode(), "does not hold a key"),
    ],
)
def test_a_file_that_is_not_exactly_a_key_is_refused(tmp_path, text, says):
    with pytest.raises(ControlRefused, match=says):
        control._read_key(_key_file(tmp_path, text))


def test_a_key_file_with_a_second_link_or_open_mode_is_refused(tmp_path):
    path = _key_file(tmp_path, KEY.encode())
    os.link(path, tmp_path / "other-name")  # another name (in a directory someone else may read) reaches it
    with pytest.raises(ControlRefused, match="has 2 links"):
        control._read_key(path)
    (tmp_path / "other-name").unlink()
    Path(path).chmod(0o640)
    with pytest.raises(ControlRefused, match="mode 0600"):
        control._read_key(path)
    os.symlink(path, tmp_path / "link")
    with pytest.raises(ControlRefused, match="unreadable"):
        control._read_key(str(tmp_path / "link"))


@pytest.mark.parametrize("mac", ["\u00e9" * control.MAC_CHARS, b"0" * control.MAC_CHARS, 7, None, "0" * 63])
def test_a_mac_of_the_wrong_form_is_unsigned_not_a_type_error(mac):
    control.sender_key()
    with pytest.raises(ControlRefused, match="not signed with the run's control key"):
        control.verify("skyrl_glm_staged", (mac,), {}, (0, 0))


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("m", ("ab", "c")), ("m", ("a", "bc"))),  # where one string ends and the next begins
        (("m", ("x",)), ("mx", ())),  # the method and its arguments
        (("m", ("1",)), ("m", (1,))),  # a string and the JSON value it spells
        (("m", ('{"a":1}',)), ("m", ({"a": 1},))),
        (("m", ("\ud800",)), ("m", ("?",))),  # a lone surrogate is its own code point, not a replacement
        (("m", ("é",)), ("m", ("e\u0301",))),  # no normalisation
    ],
)
def test_the_mac_tells_apart_every_two_distinct_calls(one, other):
    """Strings are framed by kind and length and hashed as their own bytes (a manifest of megabytes is not
    re-encoded as JSON): the framing must stay injective, or one signed call would also sign another."""
    key = bytes(range(control.KEY_BYTES))
    assert control._mac(key, *one) != control._mac(key, *other)
    assert control._mac(key, *one) == control._mac(key, *one)


@pytest.mark.parametrize("ending", ["pass", "raise SystemExit(1)", "raise RuntimeError('failed run')"])
def test_the_key_a_process_made_is_gone_when_it_exits(ending):
    script = (
        "import os\n"
        "from skyrl_glm.sync.vllm import control\n"
        "control.sender_key()\n"
        "print(os.environ[control.KEY_ENV], flush=True)\n"
        f"{ending}\n"
    )
    env = {k: v for k, v in os.environ.items() if k != control.KEY_ENV}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    made = Path(proc.stdout.strip())
    assert made.name == "control.key" and made.parent.name.startswith("skyrl-glm-key-"), proc.stdout + proc.stderr
    assert not made.parent.exists(), f"{made.parent} left behind ({ending})"


def test_run_key_removes_its_file_when_the_run_fails():
    with pytest.raises(RuntimeError), control.run_key() as path:
        assert control._read_key(path) == control.sender_key()
        raise RuntimeError("the run failed")
    assert not os.path.exists(os.path.dirname(path))
