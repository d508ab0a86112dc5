"""DAPO's soft overlong penalty, which SkyRL 0.4.0's core config does not have.

DAPO (Yu et al. 2025, eq. 13): a response of length ``L`` under a cap ``L_max`` with a buffer ``L_buf`` gets
0 while ``L <= L_max - L_buf``, ``(L_max - L_buf - L) / L_buf`` inside the buffer (linear down to -1 at the cap),
and -1 past the cap; scaled here by ``penalty_factor`` and added to the task reward. SkyRL's hard counterpart,
``generator.apply_overlong_filtering`` (mask truncated responses out of the loss), stays available beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class OverlongPenaltyConfig:
    """``skyrl_glm.overlong`` in a recipe: the soft length penalty before the response cap (off when buffer_len=0)."""

    buffer_len: int = 0
    """Tokens before ``generator.sampling_params.max_generate_length`` where the penalty ramps up (DAPO: 4,096)."""
    penalty_factor: float = 1.0
    """Penalty at and past the cap; the ramp is linear from 0 at ``cap - buffer_len``."""

    def __post_init__(self) -> None:
        if self.buffer_len < 0:
            raise ValueError(f"skyrl_glm.overlong.buffer_len: must be >= 0, got {self.buffer_len}")
        if self.penalty_factor < 0:
            raise ValueError(f"skyrl_glm.overlong.penalty_factor: must be >= 0, got {self.penalty_factor}")


def overlong_penalty(length: int, cap: int, buffer_len: int, penalty_factor: float) -> float:
    """The (non-positive) reward added to a response of ``length`` tokens."""
    if buffer_len <= 0 or length <= cap - buffer_len:
        return 0.0
    if length >= cap:
        return -penalty_factor
    return -penalty_factor * (length - (cap - buffer_len)) / buffer_len


def apply_overlong_penalty(
    rewards: list, response_lengths: Sequence[int], cap: int, cfg: OverlongPenaltyConfig
) -> list:
    """Rewards with the penalty added (a new list; the input is untouched).

    A sequence reward (float) gets it added; a per-token reward list (what SkyRL's agent-loop generator returns,
    the outcome on the last token) gets it on its last token, where SkyRL puts a sequence reward too."""
    if len(rewards) != len(response_lengths):
        raise ValueError(f"{len(rewards)} rewards for {len(response_lengths)} responses")
    if cfg.buffer_len > cap:
        raise ValueError(f"skyrl_glm.overlong.buffer_len {cfg.buffer_len} is longer than the response cap {cap}")
    out: list = []
    for reward, length in zip(rewards, response_lengths, strict=True):
        penalty = overlong_penalty(length, cap, cfg.buffer_len, cfg.penalty_factor)
        if isinstance(reward, list):
            shaped = [float(r) for r in reward]
            if shaped:
                shaped[-1] += penalty
            out.append(shaped)
        else:
            out.append(float(reward) + penalty)
    return out


def shape_rewards(generator_output: dict, overlong: OverlongPenaltyConfig, cap: int) -> None:
    """Apply ``skyrl_glm.overlong`` to a SkyRL ``GeneratorOutput``'s sequence rewards (a no-op when off); ``cap``
    is the response cap, ``generator.sampling_params.max_generate_length``.

    Called from the trainer's ``postprocess_generator_output``, i.e. after SkyRL's dynamic-sampling filter, which
    (as in DAPO) keeps or drops groups on the task reward alone."""
    if overlong.buffer_len <= 0:
        return
    lengths = [len(response) for response in generator_output["response_ids"]]
    generator_output["rewards"] = apply_overlong_penalty(generator_output["rewards"], lengths, cap, overlong)
