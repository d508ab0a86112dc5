"""Is an extracted answer the ground truth? Exact arithmetic for numbers, math-verify for everything else.

DAPO's reward compares strings after its own normalisation, so ``033`` vs ``33``, ``33.0``, ``0.5`` vs
``\\frac{1}{2}``, ``\\dfrac``, ``50\\%`` or ``90^\\circ`` are wrong there. Here a number on both sides (integers
with or without thousands separators, decimals, fractions, a sign, a trailing ``%`` / degree / ``\\text{unit}``,
``x = ...``) is compared as an exact rational in pure Python: AIME and DAPO-Math ground truths are integers, so this
path decides almost every sample in microseconds, and two different numbers never score as equal through float
rounding. Anything else goes to math-verify (HF's maintained parser and verifier, latex2sympy backend), which
runs in a helper process: sympy can take unbounded time on hostile input (``10^{10^{10^{10}}}``), math-verify's own
timeout needs ``signal.alarm`` (main thread only) while SkyRL scores in a thread pool, and a killed process is the
only cap that holds. One helper per process, started on first use, replaced after a timeout.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

log = logging.getLogger(__name__)

# The per-response cap on the math-verify path (seconds of wall time, waiting for the helper included).
TIME_CAP_S = 3.0
# What is handed to the helper at most; longer strings are not math answers and are refused unparsed.
MAX_VERIFY_CHARS = 400

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


def _serve() -> None:
    """The helper process: one JSON ``[answer, truth]`` per stdin line, one JSON ``[status, value]`` per stdout line."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever a library prints goes to stderr, never into the protocol
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # its "timeout disabled" notice: we cap here
    import math_verify  # noqa: F401  (imported before "ready": a request then costs no import)

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
    """One math-verify helper process, shared by the threads of this process (one request at a time). A plain
    subprocess, not multiprocessing: nothing of the caller's (its main module, its threads) is re-run or forked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._owner = os.getpid()  # a forked child must not share its parent's helper (one pipe, two writers)

    def _reply(self, timeout_s: float) -> list | None:
        proc = self._proc
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline() if ready else ""
        return json.loads(line) if line else None

    def _start(self) -> None:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the helper imports this module from where it was loaded
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            encoding="utf-8",
            env=env,
        )
        if self._reply(120) != ["ready", None]:
            self._stop()
            raise RuntimeError(
                f"the math-verify helper did not start (try: {sys.executable} -m {__name__} < /dev/null)"
            )

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def verify(self, answer: str, truth: str, time_cap_s: float) -> Verdict:
        with self._lock:  # the cap is per response: time spent waiting for another thread's turn is not charged
            if self._owner != os.getpid():
                self._proc, self._owner = None, os.getpid()
            if self._proc is None or self._proc.poll() is not None:
                self._start()  # nor is start-up (imports)
            try:
                self._proc.stdin.write(json.dumps([answer, truth]) + "\n")
                self._proc.stdin.flush()
                reply = self._reply(time_cap_s)
            except (OSError, ValueError) as e:  # the helper died under us (killed, out of memory)
                log.warning("math-verify helper lost (%s); scored as wrong, a new one starts next time", e)
                self._stop()
                return Verdict(False, "error")
            if reply is None:
                log.warning("math-verify took over %.1f s on %r vs %r; scored as wrong", time_cap_s, answer, truth)
                self._stop()
                return Verdict(False, "timeout")
            status, value = reply
            if status != "ok":
                log.debug("math-verify failed on %r vs %r: %s", answer, truth, value)
                return Verdict(False, "error")
            return Verdict(bool(value), "math-verify")


_HELPER = _Helper()

if __name__ == "__main__":
    _serve()
