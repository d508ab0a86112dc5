"""The trainer/sampler mismatch SkyRL measures each step, kept in the run summary and logged in one line.

SkyRL 0.4 computes the numbers itself: ``policy/rollout_train_logprobs_abs_diff_*`` (sampler vs trainer logprobs of
the sampled tokens) and, with ``trainer.algorithm.off_policy_correction`` on, the importance ratios and the shares
it truncated or masked (``policy/loss_metrics/is_ratio_*``, ``tis_*``, ``outlier_*``, ``*_sequence_mask_*``). They go
to the tracker with everything else; this callback also keeps them per step in the skyrl-glm summary, so a
run's mismatch can be read (and tested) without a tracker.

SkyRL gives no KL-type figure, so :func:`generation_kl` adds one from the same tokens and logprobs (the sampled
response tokens, SkyRL's loss mask): ``skyrl_glm/gen_kl``, the k3 estimate of KL(sampler || trainer), the figure
NeMo-RL reports as its generation KL error.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from skyrl.train.utils.callbacks import TrainingCallback

from skyrl_glm.skyrl.run.summary import GEN_KL, RunSummary

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

MISMATCH_PREFIXES = (
    GEN_KL,
    "policy/rollout_train_logprobs_abs_diff_",
    "policy/loss_metrics/is_ratio_",
    "policy/loss_metrics/tis_",
    "policy/loss_metrics/outlier_",
    "policy/loss_metrics/geo_sequence_mask_",
    "policy/loss_metrics/product_sequence_mask_",
)


def generation_kl(rollout: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """KL(sampler || trainer) over the sampled tokens, by the k3 estimator: with d = trainer logprob - sampler
    logprob of each token the sampler drew, the mean of ``exp(d) - 1 - d`` (>= 0 per token, unbiased for the KL of
    the full next-token distributions because the tokens were drawn from the sampler). Exact per token it is not:
    the sampler returns its logprob of the drawn token only. Nothing when no token counts (all masked)."""
    import torch

    keep = mask > 0
    if not bool(keep.any()):
        return {}
    d = trainer[keep].double() - rollout[keep].double()
    return {GEN_KL: float(torch.mean(torch.expm1(d) - d))}


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
                ("gen KL (k3)", GEN_KL),
                ("max", "policy/rollout_train_logprobs_abs_diff_max"),
                ("IS ratio mean", "policy/loss_metrics/is_ratio_mean"),
                ("TIS-capped tokens", "policy/loss_metrics/tis_token_clip_high_ratio"),
                ("masked sequences", "policy/loss_metrics/outlier_seq_masked_ratio"),
            )
            if isinstance(found.get(key), int | float)
        ]
        log.info("step %d trainer/sampler mismatch: %s", callback_input.global_step, ", ".join(shown))
