"""``glm_canary``: a single-turn skyrl_gym env whose reward is the share of the response's characters that are
ASCII digits (``0``-``9``).

Why this reward: it is verifiable from the text alone (skyrl_gym hands an env the decoded response); a tiny
random-weight model emits a digit now and then (~4 % of the characters of 16-token responses on the tiny
byte-level BPE), so most GRPO groups have reward variance from step 1 and the advantages are real; and the few
tokens that carry digits give the policy gradient one consistent direction, so the reward rises within a few
steps (a broad set, lowercase letters at ~60 %, gave a gradient too noisy to learn from in as many steps). The
reward rises only if the sampler runs what the trainer learned. An empty response scores 0.
"""

from __future__ import annotations

import string
from typing import Any

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

ENV_ID = "glm_canary"
REWARDED = frozenset(string.digits)


def canary_reward(response: str) -> float:
    """Share of ``response``'s characters in :data:`REWARDED` (0.0 for an empty response)."""
    if not response:
        return 0.0
    return sum(ch in REWARDED for ch in response) / len(response)


class CanaryEnv(BaseTextEnv):
    """One step: score the response; the episode ends. Prompts carry no ground truth."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None):
        super().__init__()
        self._reward: float | None = None

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self._reward = canary_reward(action)
        return BaseTextEnvStepOutput(observations=[], reward=self._reward, done=True, metadata={})

    def get_metrics(self) -> dict[str, Any]:
        """``share`` per episode; SkyRL averages it into ``environment/glm_canary/share``."""
        return {} if self._reward is None else {"share": self._reward}


def register() -> None:
    """Register ``glm_canary`` with skyrl_gym once per process (idempotent)."""
    if ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=ENV_ID, entry_point=f"{__name__}:CanaryEnv")
