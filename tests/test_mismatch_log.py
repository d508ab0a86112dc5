"""The mismatch callback keeps SkyRL's per-step trainer/sampler numbers in the run summary (the real SkyRL run in
tests/test_skyrl_train.py checks them end to end; this checks the selection on SkyRL's own callback types)."""

from __future__ import annotations

from types import SimpleNamespace

from skyrl.train.utils.callbacks import CallbackHandler, CallbackInput, TrainingControl

from skyrl_glm.skyrl.mismatch_log import MismatchMetrics
from skyrl_glm.skyrl.summary import RunSummary


def _log(handler: CallbackHandler, trainer, step: int, logs: dict) -> None:
    handler.on_log(
        trainer,
        CallbackInput(global_step=step, epoch=0, total_steps=2, steps_per_epoch=2, logs=logs),
        TrainingControl(),
    )


def test_mismatch_numbers_of_each_step_kept_others_not():
    trainer = SimpleNamespace(summary=RunSummary("memory", "per-expert"))
    handler = CallbackHandler([MismatchMetrics()])
    _log(handler, trainer, 0, {"eval/all/avg_score": -1.0})  # the eval before training: nothing to keep
    _log(
        handler,
        trainer,
        1,
        {
            "policy/rollout_train_logprobs_abs_diff_mean": 0.02,
            "policy/loss_metrics/is_ratio_mean": 1.01,
            "policy/loss_metrics/tis_token_clip_high_ratio": 0.003,
            "policy/loss_metrics/outlier_seq_masked_ratio": 0.0,
            "policy/policy_loss": 0.5,
            "timing/step": 3.0,
        },
    )
    assert trainer.summary.mismatch == [
        {
            "step": 1,
            "policy/rollout_train_logprobs_abs_diff_mean": 0.02,
            "policy/loss_metrics/is_ratio_mean": 1.01,
            "policy/loss_metrics/tis_token_clip_high_ratio": 0.003,
            "policy/loss_metrics/outlier_seq_masked_ratio": 0.0,
        }
    ]
    # a trainer without a summary (plain SkyRL) is left alone
    _log(handler, SimpleNamespace(), 2, {"policy/loss_metrics/is_ratio_mean": 1.0})
