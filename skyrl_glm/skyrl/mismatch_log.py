"""The trainer/sampler mismatch SkyRL measures each step, kept in the run summary and logged in one line.

SkyRL 0.4 computes the numbers itself: ``policy/rollout_train_logprobs_abs_diff_*`` (sampler vs trainer logprobs of
the sampled tokens) and, with ``trainer.algorithm.off_policy_correction`` on, the importance ratios and the shares
it truncated or masked (``policy/loss_metrics/is_ratio_*``, ``tis_*``, ``outlier_*``, ``*_sequence_mask_*``). They go
to the tracker with everything else; this callback also keeps them per step in the skyrl-glm summary, so a
run's mismatch can be read (and tested) without a tracker.
"""

from __future__ import annotations

import logging
from typing import Any

from skyrl.train.utils.callbacks import TrainingCallback

from skyrl_glm.skyrl.summary import RunSummary

log = logging.getLogger(__name__)

MISMATCH_PREFIXES = (
    "policy/rollout_train_logprobs_abs_diff_",
    "policy/loss_metrics/is_ratio_",
    "policy/loss_metrics/tis_",
    "policy/loss_metrics/outlier_",
    "policy/loss_metrics/geo_sequence_mask_",
    "policy/loss_metrics/product_sequence_mask_",
)


class MismatchMetrics(TrainingCallback):
    """On every tracker commit, the mismatch numbers of the step into ``trainer.summary.mismatch``."""

    def on_log(self, trainer: Any, callback_input: Any, control: Any) -> None:
        found = {k: v for k, v in (callback_input.logs or {}).items() if k.startswith(MISMATCH_PREFIXES)}
        if not found:
            return
        summary = getattr(trainer, "summary", None)
        if isinstance(summary, RunSummary):
            summary.mismatch.append({"step": callback_input.global_step, **found})
        shown = [
            f"{name} {found[key]:.3g}"
            for name, key in (
                ("|dlogp| mean", "policy/rollout_train_logprobs_abs_diff_mean"),
                ("max", "policy/rollout_train_logprobs_abs_diff_max"),
                ("IS ratio mean", "policy/loss_metrics/is_ratio_mean"),
                ("TIS-capped tokens", "policy/loss_metrics/tis_token_clip_high_ratio"),
                ("masked sequences", "policy/loss_metrics/outlier_seq_masked_ratio"),
            )
            if isinstance(found.get(key), int | float)
        ]
        log.info("step %d trainer/sampler mismatch: %s", callback_input.global_step, ", ".join(shown))
