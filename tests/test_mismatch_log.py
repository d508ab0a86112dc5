"""The mismatch callback keeps SkyRL's per-step trainer/sampler numbers in the run summary (the real SkyRL run in
tests/test_skyrl_train.py checks them end to end; this checks the selection on SkyRL's own callback types)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from skyrl.train.utils.callbacks import CallbackHandler, CallbackInput, TrainingControl

from skyrl_glm.skyrl.run.mismatch_log import MismatchMetrics
from skyrl_glm.skyrl.run.summary import RunSummary


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


def test_generation_kl_is_k3_over_the_sampled_tokens_and_zero_only_when_the_sides_agree():
    """k3 per token is exp(d) - 1 - d with d = trainer - sampler logprob: 0 where they agree, > 0 either way; padded
    (masked) tokens do not count; its mean over tokens drawn from the sampler estimates KL(sampler || trainer)."""
    import math

    import torch

    from skyrl_glm.skyrl.run.mismatch_log import generation_kl
    from skyrl_glm.skyrl.run.summary import GEN_KL

    sampler = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert generation_kl(sampler, sampler.clone(), mask) == {GEN_KL: 0.0}
    trainer = sampler + torch.tensor([[0.1, -0.1, 0.0], [0.0, 0.0, 50.0]])  # the masked token's gap is ignored
    expected = (math.expm1(0.1) - 0.1 + math.expm1(-0.1) + 0.1) / 5
    assert generation_kl(sampler, trainer, mask)[GEN_KL] == pytest.approx(expected, rel=1e-5)  # fp32 inputs
    assert generation_kl(sampler, trainer, torch.zeros_like(mask)) == {}  # nothing sampled: no figure

    # exact on a known pair: the sampler's categorical q, the trainer's p; tokens drawn from q
    q, p = torch.tensor([0.7, 0.2, 0.1]), torch.tensor([0.5, 0.3, 0.2])
    draws = torch.multinomial(q, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    kl = generation_kl(q.log()[draws][None], p.log()[draws][None], torch.ones(1, len(draws)))[GEN_KL]
    assert kl == pytest.approx(float((q * (q / p).log()).sum()), rel=0.05)
