"""DAPO's soft overlong penalty (skyrl_glm.overlong): zero before the buffer, linear inside it, full past the cap."""

from __future__ import annotations

import pytest

from skyrl_glm.skyrl.overlong import OverlongPenaltyConfig, apply_overlong_penalty, overlong_penalty

CAP, BUF = 8192, 4096


@pytest.mark.parametrize(
    "length,expected",
    [
        (100, 0.0),
        (CAP - BUF, 0.0),  # the last length without penalty
        (CAP - BUF + 1, -1 / BUF),
        (CAP - BUF // 2, -0.5),  # halfway through the buffer
        (CAP - 1, -(BUF - 1) / BUF),
        (CAP, -1.0),  # hit the cap
        (CAP + 500, -1.0),  # past it (multi-turn can exceed the per-turn cap)
    ],
)
def test_penalty_inside_and_past_the_buffer(length, expected):
    assert overlong_penalty(length, CAP, BUF, 1.0) == pytest.approx(expected)


def test_penalty_factor_scales_and_zero_buffer_disables():
    assert overlong_penalty(CAP - BUF // 2, CAP, BUF, 0.5) == pytest.approx(-0.25)
    assert overlong_penalty(CAP, CAP, 0, 1.0) == 0.0


def test_apply_adds_to_sequence_rewards():
    cfg = OverlongPenaltyConfig(buffer_len=BUF, penalty_factor=1.0)
    rewards = [1.0, 1.0, -1.0, 1.0]
    lengths = [2000, CAP - 3 * BUF // 4, CAP, CAP]  # 1,024 tokens into the buffer: -0.25
    out = apply_overlong_penalty(rewards, lengths, CAP, cfg)
    assert out == pytest.approx([1.0, 0.75, -2.0, 0.0])
    assert rewards == [1.0, 1.0, -1.0, 1.0]  # input untouched


def test_apply_refuses_bad_input():
    cfg = OverlongPenaltyConfig(buffer_len=BUF)
    with pytest.raises(ValueError, match="rewards for"):
        apply_overlong_penalty([1.0], [1, 2], CAP, cfg)
    with pytest.raises(TypeError, match="token-level"):
        apply_overlong_penalty([[0.0, 1.0]], [2], CAP, cfg)
    with pytest.raises(ValueError, match="longer than the response cap"):
        apply_overlong_penalty([1.0], [1], 1024, cfg)
    with pytest.raises(ValueError, match="buffer_len"):
        OverlongPenaltyConfig(buffer_len=-1)
