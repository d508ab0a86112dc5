"""GLM answer extraction in front of skyrl_gym's DAPO math reward.

GLM chat models end a turn with a role token (``<|user|>``, ``<|observation|>``) or ``<|endoftext|>``, think inside
``<think>...</think>``, and write the final answer as inline math (``\\(42\\)``, ``$42$``), in bold
(``**Answer:** 42``) or only as ``\\boxed{42}``. The DAPO verifier (``skyrl_gym.envs.aime.utils``) reads the last
``Answer:`` line and compares it after its own normalisation, so ``Answer: \\(42\\)`` or a bare ``\\boxed{42}`` score
-1 though they are right. This module finds the final answer the way a GLM writes it, then hands
``Answer: <answer>`` to the DAPO reward unchanged, so the comparison rules stay the reference ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from skyrl_gym.envs.aime import utils as dapo_math

# Tokens that close a GLM assistant turn; text after the first one belongs to another turn.
END_OF_TURN = ("<|user|>", "<|observation|>", "<|endoftext|>", "<|system|>", "<|assistant|>")

# ``Answer:`` as GLM writes it, also in bold (``**Answer:** x``, ``**Answer: x**``); the answer is the rest of
# the line, or the next non-empty line when the colon ends the line (as in the DAPO pattern).
_ANSWER_LINE = re.compile(r"(?i)\**\s*answer\s*\**\s*:\s*\**[ \t]*\n*[ \t]*([^\n]+)")
_INLINE_MATH = (("\\(", "\\)"), ("\\[", "\\]"), ("$$", "$$"), ("$", "$"))


@dataclass(frozen=True)
class Scored:
    """One response scored: reward as the DAPO reward gives it (+1/-1), whether it was right, what was compared."""

    reward: float
    correct: bool
    answer: str | None


def final_text(response: str) -> str | None:
    """The part of ``response`` that holds the final answer, or None when the model never left its thoughts.

    Cut at the first end-of-turn token, keep what follows the last ``</think>``; an unclosed ``<think>``
    (a response truncated at the length cap mid-thought) has no final answer, even if a thought says "Answer:".
    """
    cut = len(response)
    for token in END_OF_TURN:
        at = response.find(token)
        if at >= 0:
            cut = min(cut, at)
    text = response[:cut]
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    if "<think>" in text:
        return None
    return text


def _strip_math(answer: str) -> str:
    answer = answer.strip().strip("*").strip()
    changed = True
    while changed:
        changed = False
        for left, right in _INLINE_MATH:
            if len(answer) > len(left) + len(right) and answer.startswith(left) and answer.endswith(right):
                answer = answer[len(left) : -len(right)].strip()
                changed = True
    return answer.rstrip(".").strip()


def _boxed(text: str) -> str | None:
    boxed = dapo_math.last_boxed_only_string(text)
    return dapo_math.remove_boxed(boxed) if boxed is not None else None


def extract_answer(response: str) -> str | None:
    """The final answer a GLM response gives: the last ``Answer:`` line (its ``\\boxed{}`` if it has one), else
    the last ``\\boxed{}``; inline-math delimiters, bold markers and a final period removed. None if there is none."""
    text = final_text(response)
    if text is None:
        return None
    lines = _ANSWER_LINE.findall(text)
    if lines:
        line = lines[-1]
        inner = _boxed(line)
        answer = inner if inner is not None else line
    else:
        answer = _boxed(text)
        if answer is None:
            return None
    answer = _strip_math(answer)
    inner = _boxed(answer)
    return _strip_math(inner) if inner is not None else (answer or None)


def score(response: str, ground_truth: str) -> Scored:
    """The DAPO math reward of a GLM response: +1 if the extracted answer matches ``ground_truth``, else -1."""
    answer = extract_answer(response)
    if answer is None:
        return Scored(reward=-1.0, correct=False, answer=None)
    result = dapo_math.compute_score(f"Answer: {answer}", ground_truth)
    return Scored(reward=float(result["score"]), correct=bool(result["acc"]), answer=answer)
