"""The final answer a GLM response gives, found in one bounded pass.

GLM chat models end a turn with a role token (``<|user|>``, ``<|observation|>``) or ``<|endoftext|>``, think inside
``<think>...</think>``, and write the final answer as inline or display math (``\\(42\\)``, ``$42$``, ``\\[ 42 \\]``),
in bold (``**Answer:** 42``, ``**Final Answer**`` with the math on the next lines) or only as ``\\boxed{42}``.
The answer is whichever comes last in the final text: the last ``Answer:`` line or the last ``\\boxed{}`` (a box
written after an ``Answer:`` line corrects it). Only the last :data:`WINDOW_CHARS` characters of the final text are
searched, and every step is a linear scan (``str.find``/``rfind``, one brace walk, regexes without nested
repetition), so a degenerate megabyte response costs milliseconds, not seconds, in SkyRL's env thread pool.
"""

from __future__ import annotations

import re

# Tokens that close a GLM assistant turn; text after the first one belongs to another turn.
END_OF_TURN = ("<|user|>", "<|observation|>", "<|endoftext|>", "<|system|>", "<|assistant|>")
# The answer is searched in the tail of the final text: a final answer is written at the end.
WINDOW_CHARS = 4096
# An "answer" longer than this is prose, not an answer (the longest MATH-500 answer has 159 characters).
MAX_ANSWER_CHARS = 400
# Lines of display math collected after a bare ``Answer:`` / ``**Final Answer**`` line.
MAX_DISPLAY_LINES = 8

# ``Answer:`` (also ``**Answer:**``, ``**Answer**:``, ``Final Answer:``) or ``final answer is``. No two adjacent
# repetitions can match the same characters, so matching is linear in the line length.
_MARKER = re.compile(r"(?i)(final[ \t]+)?answer[ \t]*(?:\*\*[ \t]*)?(:|is\b)")
_BOX_OPENERS = ("\\boxed{", "\\fbox{")
_DELIMITERS = (("\\(", "\\)"), ("\\[", "\\]"), ("$$", "$$"), ("$", "$"), ("**", "**"))
_DISPLAY_OPEN = {"\\[": "\\]", "$$": "$$"}
# Words that take an answer back or offer another; what may follow a final math span (no digit, no more math).
_HEDGE = re.compile(r"(?i)\b(?:or|maybe|perhaps|possibly|wait|either|rather|actually|alternatively|no)\b")
_STATES = re.compile(r"[0-9$]|\\[(\[]|\\boxed|\\fbox")


def final_text(response: str) -> str | None:
    """The part of ``response`` that holds the final answer, or None when the model never left its thoughts.

    Cut at the first end-of-turn token, keep what follows the last ``</think>``; an unclosed ``<think>``
    (a response truncated at the length cap mid-thought) has no final answer, even if a thought says "Answer:".
    """
    cut = len(response)
    for token in END_OF_TURN:
        at = response.find(token, 0, cut)
        if at >= 0:
            cut = at
    closed = response.rfind("</think>", 0, cut)
    if closed >= 0:
        return response[closed + len("</think>") : cut]
    if response.find("<think>", 0, cut) >= 0:
        return None
    return response[:cut]


def _box_at(text: str, start: int, opener: str) -> tuple[int, str] | None:
    """(end, content) of the box opened at ``start``, or None if it never closes (truncated mid-answer)."""
    depth = 0
    for i in range(start + len(opener) - 1, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1, text[start + len(opener) : i]
    return None


def _last_box(text: str) -> tuple[int, str | None] | None:
    """(start, content) of the last ``\\boxed{`` / ``\\fbox{`` (content None if it never closes), or None if there
    is none: one walk over its braces."""
    start, opener = max((text.rfind(o), o) for o in _BOX_OPENERS)
    if start < 0:
        return None
    box = _box_at(text, start, opener)
    return start, None if box is None else box[1]


def _unbox(answer: str) -> str:
    """The content of a box that spans all of ``answer``, else ``answer``."""
    for opener in _BOX_OPENERS:
        if answer.startswith(opener):
            box = _box_at(answer, 0, opener)
            if box is not None and box[0] == len(answer):
                return box[1]
    return answer


def _last_marker(text: str) -> tuple[int, str | None] | None:
    """(position, answer text) of the last answer marker: the rest of its line, or the display math / first
    non-empty line that follows when the marker ends its line; the text is None when the line hedges."""
    lines = text.split("\n")
    offset = len(text)
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        offset -= len(line) + (1 if index < len(lines) - 1 else 0)
        found = None
        for m in _MARKER.finditer(line):
            if m.group(2) == ":" or m.group(1):
                found = m
        if found is None:
            continue
        rest = line[found.end() :].strip().strip("*").strip()
        if rest:
            return offset + found.start(), _leading_math(rest)
        following = [ln.strip() for ln in lines[index + 1 : index + 1 + MAX_DISPLAY_LINES]]
        following = [ln for ln in following if ln]
        if not following:
            return None
        close = _DISPLAY_OPEN.get(following[0])
        if close is None:
            return offset + found.start(), following[0]
        body = []
        for ln in following[1:]:
            if ln == close:
                return offset + found.start(), " ".join(body)
            body.append(ln)
        return None  # display math never closed
    return None


def _leading_math(rest: str) -> str | None:
    """The math span ``rest`` starts with, if it does and what follows it states nothing (``$28\\%$. I hope it is
    correct.`` -> ``$28\\%$``); None when what follows is another answer or a hedge (``$41$ or maybe $42$``,
    ``$41$, no wait, 42``): a hedged answer is no answer."""
    for left, right in _DELIMITERS[:4]:
        if rest.startswith(left):
            end = rest.find(right, len(left))
            if end > len(left):
                tail = rest[end + len(right) :]
                return None if _STATES.search(tail) or _HEDGE.search(tail) else rest[: end + len(right)]
    return rest


def _hedged_box(text: str, start: int) -> bool:
    """Whether the final box at ``start`` sits on a line that hedges between it and another answer (``\\boxed{41}
    or \\boxed{42}``, ``Answer: 41, or maybe \\boxed{42}``)."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", start)
    line = text[line_start : len(text) if line_end < 0 else line_end]
    if _HEDGE.search(line) is None:
        return False
    boxes = sum(line.count(opener) for opener in _BOX_OPENERS)
    return boxes > 1 or any(m.group(2) == ":" or m.group(1) for m in _MARKER.finditer(line, 0, start - line_start))


def clean(answer: str) -> str:
    """``answer`` without what only decorates it: surrounding math delimiters, bold, a box around all of it,
    and final periods, in any order and nesting (``\\(42\\).``, ``$$42$$.``, ``**\\boxed{42}**``)."""
    previous = None
    while answer != previous:
        previous = answer
        answer = answer.strip().rstrip(".").strip()
        for left, right in _DELIMITERS:
            if len(answer) >= len(left) + len(right) + 1 and answer.startswith(left) and answer.endswith(right):
                answer = answer[len(left) : -len(right)]
                break
        else:
            answer = _unbox(answer)
    return answer


def extract_answer(response: str) -> str | None:
    """The final answer of a GLM response, cleaned (:func:`clean`); None if it gives none."""
    text = final_text(response)
    if text is None:
        return None
    window = text[-WINDOW_CHARS:]
    box = _last_box(window)
    marker = _last_marker(window)
    if box is not None and (marker is None or box[0] > marker[0]):
        if box[1] is None:  # the final box was cut off by the length cap: no answer, not an earlier one
            return None
        if _hedged_box(window, box[0]):
            return None
        answer = box[1]
    elif marker is not None and marker[1] is not None:
        answer = marker[1]
    else:  # no answer, or the last one hedged (an earlier box it replaced does not count either)
        return None
    if len(answer) > 4 * MAX_ANSWER_CHARS:  # prose, not an answer; also keeps clean() short
        return None
    answer = clean(answer)
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return None
    return answer
