"""``glm_math``: a single-turn skyrl_gym math env scored by :func:`skyrl_glm.dapo.reward.score` (GLM extraction,
exact numbers, math-verify under a time cap).

Same data contract as skyrl_gym's ``aime`` env (``extras["reward_model"]["ground_truth"]``), same +1/-1 scale,
so a dataset prepared for one works with the other. Importing :mod:`skyrl_glm.dapo` registers nothing;
:func:`register` does, and skyrl-glm's train entrypoint calls it in the process that builds the generator.
"""

from __future__ import annotations

from typing import Any

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from skyrl_glm.dapo.reward import score

ENV_ID = "glm_math"


class GlmMathEnv(BaseTextEnv):
    """One step: score the response against the ground truth; the episode ends."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None):
        super().__init__()
        extras = extras or {}
        reward_model = extras.get("reward_model")
        if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
            raise ValueError(
                f"{ENV_ID} needs extras['reward_model']['ground_truth'] (prepare data with `skyrl-glm data prepare`)"
            )
        self.ground_truth = str(reward_model["ground_truth"])
        self._correct: bool | None = None

    def step(self, action: str) -> BaseTextEnvStepOutput:
        scored = score(action, self.ground_truth)
        self._correct = scored.correct
        metadata = {"acc": scored.correct, "pred": scored.answer}
        return BaseTextEnvStepOutput(observations=[], reward=scored.reward, done=True, metadata=metadata)

    def get_metrics(self) -> dict[str, Any]:
        """``acc`` per episode; SkyRL averages it into ``environment/glm_math/acc`` (or the eval prefix)."""
        return {} if self._correct is None else {"acc": float(self._correct)}


def register() -> None:
    """Register ``glm_math`` with skyrl_gym once per process (idempotent)."""
    if ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=ENV_ID, entry_point=f"{__name__}:GlmMathEnv")
