"""Is an extracted answer the ground truth? Exact arithmetic for numbers, math-verify for everything else.

DAPO's reward compares strings after its own normalisation, so ``033`` vs ``33``, ``33.0``, ``0.5`` vs
``\\frac{1}{2}``, ``\\dfrac``, ``50\\%`` or ``90^\\circ`` are wrong there. Here a number on both sides (integers
with or without thousands separators, decimals, fractions, a sign, a trailing ``%`` / degree / ``\\text{unit}``,
``x = ...``) is compared as an exact rational in pure Python: AIME and DAPO-Math ground truths are integers, so this
path decides almost every sample in microseconds, and two different numbers never score as equal through float
rounding. Anything else goes to math-verify (HF's maintained parser and verifier, latex2sympy backend), which
runs in a helper process: sympy can take unbounded time on hostile input (``10^{10^{10^{10}}}``), math-verify's own
timeout needs ``signal.alarm`` (main thread only) while SkyRL scores in a thread pool, and a killed process is the
only cap that holds. Helpers are started on first use (one per scoring thread, up to :data:`MAX_HELPERS`),
replaced after a timeout, and end by themselves when the process that started them is gone.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

log = logging.getLogger(__name__)

# The per-response cap on the math-verify path (seconds of wall time, waiting for the helper included).
TIME_CAP_S = 3.0
# What is handed to the helper at most; longer strings are not math answers and are refused unparsed.
MAX_VERIFY_CHARS = 400
# Helper processes at most (each one scores one response at a time); a pair past its cap, remembered.
MAX_HELPERS = max(2, min(8, os.cpu_count() or 2))
MAX_REMEMBERED = 4096
# The parent's pid, handed to the helper; prctl's "signal me when my parent ends".
PARENT_ENV = "SKYRL_GLM_VERIFY_PARENT"
PR_SET_PDEATHSIG = 1

_INT = r"(?:[1-9]\d{0,2}(?:(?:,|\{,\}|\\,)\d{3})+|\d+)"
_DECIMAL = rf"(?:{_INT}\.\d*|\.\d+)"
_FRAC = r"\\[dtc]?frac(?:\{(?P<fn>[+-]?\d+)\}\{(?P<fd>\d+)\}|(?P<sn>\d)(?P<sd>\d))"
_NUMBER = re.compile(
    rf"(?P<sign>[+-]?)\s*(?:\\\$)?\s*(?:{_FRAC}|(?P<pn>\d+)\s*/\s*(?P<pd>\d+)|(?P<dec>{_DECIMAL})|(?P<int>{_INT}))"
)
# What may follow a number without changing it: a percent sign, a degree mark, a unit in \text{} / \mbox{}.
_UNIT = re.compile(r"\s*(?:\\?%|\^\s*\\circ|\^\s*\{\\circ\}|°|\\(?:text|mbox|mathrm)\{\s*[A-Za-z ]*\})?\s*")
_STYLE = re.compile(r"\\[,;:! ]|\\left|\\right")


@dataclass(frozen=True)
class Verdict:
    """Whether the answer equals the ground truth, and which path decided it (``number``, ``math-verify``,
    ``timeout``, ``too long``, ``error``)."""

    equal: bool
    path: str


def as_number(text: str) -> Fraction | None:
    """The exact value of ``text`` if it is one number (see the module docstring), else None."""
    text = _STYLE.sub("", text).strip()
    text = text.rsplit("=", 1)[-1].strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    m = _NUMBER.match(text)
    if m is None or _UNIT.fullmatch(text, m.end()) is None:
        return None
    sign = -1 if m["sign"] == "-" else 1
    if m["fn"] is not None:
        value = Fraction(int(m["fn"]), int(m["fd"])) if int(m["fd"]) else None
    elif m["sn"] is not None:
        value = Fraction(int(m["sn"]), int(m["sd"])) if int(m["sd"]) else None
    elif m["pn"] is not None:
        value = Fraction(int(m["pn"]), int(m["pd"])) if int(m["pd"]) else None
    else:
        digits = (m["dec"] or m["int"]).replace("{,}", "").replace(",", "").replace("\\", "")
        value = Fraction(digits if not digits.endswith(".") else digits[:-1])
    return None if value is None else sign * value


def equivalent(answer: str, truth: str, time_cap_s: float = TIME_CAP_S) -> Verdict:
    """Whether ``answer`` states ``truth``: exactly for numbers, else by math-verify within ``time_cap_s``."""
    a, t = as_number(answer), as_number(truth)
    if a is not None and t is not None:
        return Verdict(a == t, "number")
    if len(answer) > MAX_VERIFY_CHARS or len(truth) > MAX_VERIFY_CHARS:
        return Verdict(False, "too long")
    return _HELPER.verify(answer, truth, time_cap_s)


def _math_verify(answer: str, truth: str) -> bool:
    """math-verify's verdict on two answer strings (each parsed as LaTeX math, then as a plain expression)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    def parsed(text: str) -> list:
        return parse(f"${text}$", configs, parsing_timeout=None) or parse(text, configs, parsing_timeout=None)

    gold, pred = parsed(truth), parsed(answer)
    return bool(gold and pred and verify(gold, pred, timeout_seconds=None))


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this helper when the thread that started it ends (its process killed included): a
    blocked stdin read ends at EOF, but sympy ignores EOF while it computes, and a power tower holds the GIL for
    hours, so no thread of the helper's own could act. Linux only (elsewhere the helper ends at stdin EOF)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent was gone before the request was in place
        os._exit(0)


def _serve() -> None:
    """The helper process: one JSON ``[answer, truth]`` per stdin line, one JSON ``[status, value]`` per stdout line."""
    _die_with_parent(int(os.environ.get(PARENT_ENV) or os.getppid()))
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever a library prints goes to stderr, never into the protocol
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # its "timeout disabled" notice: we cap here
    _math_verify("\\frac{1}{2}", "0.5")  # imports and first-parse set-up before "ready": not charged to a request

    protocol.write('["ready", null]\n')
    protocol.flush()
    for line in sys.stdin:
        try:
            answer, truth = json.loads(line)
            reply = ["ok", _math_verify(answer, truth)]
        except Exception as e:  # a parser bug on odd input is a wrong answer, not a dead helper
            reply = ["error", f"{type(e).__name__}: {e}"]
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()


class _Helper:
    """One math-verify helper process, one request at a time. A plain subprocess, not multiprocessing: nothing of the
    caller's (its main module, its threads) is re-run or forked."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def _reply(self, timeout_s: float) -> list | None:
        proc = self._proc
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline() if ready else ""
        return json.loads(line) if line else None

    def _start(self, spawner: ThreadPoolExecutor) -> None:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the helper imports this module from where it was loaded
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        env[PARENT_ENV] = str(os.getpid())
        self._proc = spawner.submit(
            subprocess.Popen,
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            encoding="utf-8",
            env=env,
        ).result()
        if self._reply(120) != ["ready", None]:
            self.stop()
            raise RuntimeError(
                f"the math-verify helper did not start (try: {sys.executable} -m {__name__} < /dev/null)"
            )

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def verify(self, answer: str, truth: str, time_cap_s: float, spawner: ThreadPoolExecutor) -> Verdict:
        if self._proc is None or self._proc.poll() is not None:
            self._start(spawner)  # start-up (imports) is not charged to the cap
        try:
            self._proc.stdin.write(json.dumps([answer, truth]) + "\n")
            self._proc.stdin.flush()
            reply = self._reply(time_cap_s)
        except (OSError, ValueError) as e:  # the helper died under us (killed, out of memory)
            log.warning("math-verify helper lost (%s); scored as wrong, a new one starts next time", e)
            self.stop()
            return Verdict(False, "error")
        if reply is None:
            log.warning("math-verify took over %.1f s on %r vs %r; scored as wrong", time_cap_s, answer, truth)
            self.stop()
            return Verdict(False, "timeout")
        status, value = reply
        if status != "ok":
            log.debug("math-verify failed on %r vs %r: %s", answer, truth, value)
            return Verdict(False, "error")
        return Verdict(bool(value), "math-verify")


class _Helpers:
    """Up to :data:`MAX_HELPERS` helpers shared by the threads of this process, each serving one thread at a time,
    so one capped response holds up only its own thread (SkyRL scores a batch in a thread pool). A pair that ran
    past its cap is remembered and scored wrong at once the next time, at that cap or a shorter one."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._cond = threading.Condition()
        self._idle: list[_Helper] = []
        self._started = 0
        self._timed_out: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._owner = os.getpid()  # a forked child must not share its parent's helpers (one pipe, two writers)
        # Helpers are started from this one thread, which lives as long as the process: the kernel kills a helper
        # when the thread that started it ends (_die_with_parent), not only when the process does.
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="math-verify-spawner")

    def _take(self) -> _Helper:
        with self._cond:
            if self._owner != os.getpid():
                self._idle, self._started, self._owner = [], 0, os.getpid()
                self._spawner = ThreadPoolExecutor(1, thread_name_prefix="math-verify-spawner")
            while not self._idle and self._started >= self._size:
                self._cond.wait()
            if self._idle:
                return self._idle.pop()
            self._started += 1
            return _Helper()

    def _give(self, helper: _Helper) -> None:
        with self._cond:
            self._idle.append(helper)
            self._cond.notify()

    def verify(self, answer: str, truth: str, time_cap_s: float) -> Verdict:
        key = (answer, truth)
        with self._cond:
            if self._timed_out.get(key, -1.0) >= time_cap_s:
                return Verdict(False, "timeout")
        helper = self._take()  # waiting for a free helper is not charged to the cap
        try:
            verdict = helper.verify(answer, truth, time_cap_s, self._spawner)
        finally:
            self._give(helper)
        if verdict.path == "timeout":
            with self._cond:
                self._timed_out[key] = max(time_cap_s, self._timed_out.pop(key, 0.0))
                while len(self._timed_out) > MAX_REMEMBERED:
                    self._timed_out.popitem(last=False)
        return verdict

    def pids(self) -> list[int]:
        """The helper processes alive now (idle ones)."""
        with self._cond:
            return [h.pid for h in self._idle if h.pid is not None]


_HELPER = _Helpers(MAX_HELPERS)

if __name__ == "__main__":
    _serve()
