"""Who may drive the receiver: every skyrl-glm control call carries an HMAC of itself under a per-run key.

The vLLM workers' ``skyrl_glm_*`` methods are reachable by anyone who can reach ``collective_rpc`` (SkyRL's servers
expose it over HTTP as ``/collective_rpc``, outside vLLM's API key). The process that starts the run makes a random
key (:func:`sender_key`) in a file only its user can read (mode 0600 in a 0700 directory) and names the file in
``SKYRL_GLM_CONTROL_KEY_FILE``; the engines and workers it starts inherit the name and read the key
(:func:`receiver_key`). The key itself is never on a command line, in an environment variable or in a log.

A call's first argument is ``HMAC-SHA256(key, method and args)`` (:func:`signed`, framed by :func:`_mac`); the
worker recomputes it over what it received and compares with :func:`hmac.compare_digest` (:func:`verify`). A MAC
rather than the key as a password: a call seen on the wire cannot be altered, and the receiver's own state (versions
only grow, only names it staged can be committed or dropped) makes a replayed one a no-op.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Sequence
from typing import Any

KEY_ENV = "SKYRL_GLM_CONTROL_KEY_FILE"
KEY_DIR_ENV = "SKYRL_GLM_CONTROL_KEY_DIR"  # where a run's key directory is made (default: the temp dir)
KEY_BYTES = 32
KEY_CHARS = 2 * KEY_BYTES
_HEX = re.compile(rb"[0-9a-f]+")
MAC_CHARS = 2 * hashlib.sha256().digest_size


class ControlRefused(PermissionError):
    """A control call that is not the trainer's, or not well-formed; the receiver's state is unchanged."""


def _read_key(path: str) -> bytes:
    """The key in ``path``: a regular file of this user with one link, readable by nobody else, holding exactly the
    key as lowercase hex (nothing before or after it, not all zeros)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ControlRefused(f"control key file unreadable ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise ControlRefused("control key file is not a private file of this user (owner only, mode 0600)")
        if st.st_nlink != 1:
            raise ControlRefused(f"control key file has {st.st_nlink} links (another name can reach it)")
        text = os.read(fd, KEY_CHARS + 1)
    finally:
        os.close(fd)
    if len(text) != KEY_CHARS or _HEX.fullmatch(text) is None or not text.strip(b"0"):
        raise ControlRefused(f"control key file does not hold a key ({KEY_CHARS} lowercase hex digits, not all zero)")
    return bytes.fromhex(text.decode("ascii"))


_KEY: bytes | None = None


def _make_key_file() -> str:
    """A fresh key in a new private directory (under ``$SKYRL_GLM_CONTROL_KEY_DIR`` when set: storage every node of
    a multi-node run reads), removed when this process exits."""
    directory = tempfile.mkdtemp(prefix="skyrl-glm-key-", dir=os.environ.get(KEY_DIR_ENV) or None)  # mode 0700
    atexit.register(shutil.rmtree, directory, True)
    path = os.path.join(directory, "control.key")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(KEY_BYTES))
    return path


def setting_problem(*, makes_its_own: bool = False) -> str | None:
    """Why this process could not read or make its run's key (one line naming the setting), or None: checked by a
    command before anything starts. ``makes_its_own``: the command makes a fresh key (``train``), so only the
    directory it is made in matters."""
    path = None if makes_its_own else os.environ.get(KEY_ENV)
    if path:
        try:
            _read_key(path)
        except ControlRefused as e:
            return f"{KEY_ENV}={path}: {e}"
        return None
    directory = os.environ.get(KEY_DIR_ENV)
    if directory:
        try:
            os.rmdir(tempfile.mkdtemp(prefix="skyrl-glm-key-", dir=directory))
        except OSError as e:
            return f"{KEY_DIR_ENV}={directory}: the run's key directory cannot be made there ({e.strerror or e})"
    return None


def sender_key() -> bytes:
    """This run's key, made on first use when the environment names none (then the engines this process starts
    next inherit its file name)."""
    global _KEY
    if _KEY is None:
        path = os.environ.get(KEY_ENV)
        if not path:
            path = os.environ[KEY_ENV] = _make_key_file()
        _KEY = _read_key(path)
    return _KEY


_RECEIVER_KEY: bytes | None = None


def receiver_key() -> bytes:
    """The key of the run that started this worker (read once; a worker never makes one)."""
    global _RECEIVER_KEY
    if _RECEIVER_KEY is None:
        path = os.environ.get(KEY_ENV)
        if not path:
            raise ControlRefused(f"no control key: {KEY_ENV} is not set in this engine's environment")
        _RECEIVER_KEY = _read_key(path)
    return _RECEIVER_KEY


def current_key() -> bytes | None:
    """The key this process signs with, None when its environment names none (not a skyrl-glm run); never makes one."""
    return sender_key() if _KEY is not None or os.environ.get(KEY_ENV) else None


@contextlib.contextmanager
def run_key() -> Any:
    """A key for one run (``skyrl-glm train``): made before anything starts, its file removed when the run ends."""
    global _KEY
    saved, saved_key = os.environ.get(KEY_ENV), _KEY
    path = _make_key_file()
    os.environ[KEY_ENV], _KEY = path, None
    try:
        yield path
    finally:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        _KEY = saved_key
        if saved is None:
            os.environ.pop(KEY_ENV, None)
        else:
            os.environ[KEY_ENV] = saved


def is_mac(value: Any) -> bool:
    """Whether ``value`` has a MAC's form (what :func:`hmac.compare_digest` may then compare): 64 ASCII characters."""
    return isinstance(value, str) and len(value) == MAC_CHARS and value.isascii()


def _mac(key: bytes, method: str, args: Sequence[Any]) -> str:
    """HMAC-SHA256 of the call: the method and each argument framed by a kind and its length (an injective
    encoding), a string as its own UTF-8 bytes (lone surrogates passed through), anything else as canonical JSON. A
    manifest is a string of up to megabytes: re-encoding it as JSON took 17 ms at 7.7 MB on this CPU, per side."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for kind, arg in (("m", method), *(("a", a) for a in args)):
        if isinstance(arg, str):
            data, tag = arg.encode("utf-8", "surrogatepass"), kind + "s"
        else:
            data = json.dumps(arg, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
            tag = kind + "j"
        mac.update(tag.encode() + len(data).to_bytes(8, "big"))
        mac.update(data)
    return mac.hexdigest()


def signed(method: str, args: Sequence[Any]) -> tuple[Any, ...]:
    """``args`` with this run's MAC of the call in front: what a ``skyrl_glm_*`` method is called with."""
    return (_mac(sender_key(), method, args), *args)


def verify(method: str, args: Sequence[Any], kwargs: dict[str, Any], arity: tuple[int, int]) -> tuple[Any, ...]:
    """The call's arguments after its MAC, if the MAC is this run's for exactly this call; else
    :class:`ControlRefused`. ``arity``: the least and most arguments the method takes after the MAC."""
    if kwargs:
        raise ControlRefused(f"{method}: keyword arguments are not accepted")
    if not args or not is_mac(args[0]):
        raise ControlRefused(f"{method}: not signed with the run's control key")
    rest = tuple(args[1:])
    if not arity[0] <= len(rest) <= arity[1]:
        raise ControlRefused(f"{method}: takes {arity[0]}..{arity[1]} arguments, got {len(rest)}")
    try:
        want = _mac(receiver_key(), method, rest)
    except (TypeError, ValueError, RecursionError):
        raise ControlRefused(f"{method}: arguments are not plain JSON data") from None
    if not hmac.compare_digest(want, args[0]):
        raise ControlRefused(f"{method}: not signed with the run's control key")
    return rest
