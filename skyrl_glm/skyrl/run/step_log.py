"""Each training step's mean reward and SkyRL's step timers, kept in the run summary from SkyRL's own log payload.

SkyRL logs one payload per step (``reward/avg_raw_reward``, ``timing/step``, ``timing/generate``, ...) to its
tracker; this callback keeps the figures the per-step table needs in ``trainer.summary.steps``, so a run's curve
can be read (and tested) without a tracker. The eval before step 1 logs no ``timing/step`` and is skipped.
"""

from __future__ import annotations

from typing import Any

from skyrl.train.utils.callbacks import TrainingCallback

from skyrl_glm.skyrl.run.summary import STEP_TIMERS, RunSummary, StepRecord

REWARD_KEY = "reward/avg_raw_reward"


class StepMetrics(TrainingCallback):
    """On every tracker commit of a training step, its reward and timers into ``trainer.summary.steps``."""

    def on_log(self, trainer: Any, callback_input: Any, control: Any) -> None:
        logs = callback_input.logs or {}
        summary = getattr(trainer, "summary", None)
        if "timing/step" not in logs or not isinstance(summary, RunSummary):
            return
        timings = {name: float(logs[f"timing/{name}"]) for name in STEP_TIMERS if f"timing/{name}" in logs}
        reward = logs.get(REWARD_KEY)
        summary.steps.append(StepRecord(callback_input.global_step, None if reward is None else float(reward), timings))
