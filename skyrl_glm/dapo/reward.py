"""The DAPO-math reward of a GLM response: +1 if its final answer is the ground truth, else -1.

Two modes. ``math_verify`` (the default, what ``glm_math`` trains on): the GLM extraction of
:mod:`skyrl_glm.dapo.answer`, then :func:`skyrl_glm.dapo.verify.equivalent` (exact numbers, math-verify for the
rest, time-capped). ``dapo_strict``: DAPO's own string reward exactly as the reference computes it (skyrl_gym's
``aime`` reward: the last ``Answer:`` in the last 300 characters, DAPO's normalisation, string equality), for
comparing a run with the reference or with skyrl_gym's ``aime`` env.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from skyrl_gym.envs.aime import utils as dapo_math

from skyrl_glm.dapo.answer import extract_answer
from skyrl_glm.dapo.verify import TIME_CAP_S, equivalent

Mode = Literal["math_verify", "dapo_strict"]
MODES: tuple[Mode, ...] = ("math_verify", "dapo_strict")


@dataclass(frozen=True)
class Scored:
    """One response scored: the reward (+1/-1), whether it was right, the answer compared, what decided it."""

    reward: float
    correct: bool
    answer: str | None
    path: str


def score(response: str, ground_truth: str, mode: Mode = "math_verify", time_cap_s: float = TIME_CAP_S) -> Scored:
    """The reward of ``response`` against ``ground_truth`` in ``mode`` (see the module docstring)."""
    if mode == "dapo_strict":
        result = dapo_math.compute_score(response, ground_truth)
        return Scored(float(result["score"]), bool(result["acc"]), result["pred"], "dapo string")
    if mode != "math_verify":
        raise ValueError(f"unknown reward mode {mode!r}; known: {', '.join(MODES)}")
    answer = extract_answer(response)
    if answer is None:
        return Scored(-1.0, False, None, "no answer")
    verdict = equivalent(answer, ground_truth, time_cap_s)
    return Scored(1.0 if verdict.equal else -1.0, verdict.equal, answer, verdict.path)
