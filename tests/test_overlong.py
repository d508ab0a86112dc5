"""DAPO's soft overlong penalty (skyrl_glm.overlong): zero before the buffer, linear inside it, full past the cap."""

from __future__ import annotations

import pytest

from skyrl_glm.skyrl.config.overlong import OverlongPenaltyConfig, apply_overlong_penalty, overlong_penalty

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


def test_apply_to_token_level_rewards_puts_the_penalty_on_the_last_token():
    # SkyRL's agent-loop generator returns per-token rewards with the outcome on the last token.
    cfg = OverlongPenaltyConfig(buffer_len=BUF, penalty_factor=1.0)
    rewards = [[0.0, 0.0, 1.0], [0.0, -1.0], []]
    out = apply_overlong_penalty(rewards, [100, CAP, CAP], CAP, cfg)
    assert out == [[0.0, 0.0, 1.0], [0.0, -2.0], []]
    assert rewards[1] == [0.0, -1.0]  # input untouched


def test_apply_refuses_bad_input():
    cfg = OverlongPenaltyConfig(buffer_len=BUF)
    with pytest.raises(ValueError, match="rewards for"):
        apply_overlong_penalty([1.0], [1, 2], CAP, cfg)
    with pytest.raises(ValueError, match="longer than the response cap"):
        apply_overlong_penalty([1.0], [1], 1024, cfg)
    with pytest.raises(ValueError, match="buffer_len"):
        OverlongPenaltyConfig(buffer_len=-1)


TRAINER_PROBE = """
import json, sys
from skyrl_glm.skyrl.compat import cpu
cpu.install()  # SkyRL's trainer module imports flash_attn: the CPU-mode shim provides it (this process only)
from skyrl_glm.skyrl.config.recipes import load_config
from skyrl_glm.skyrl.run.trainer import GlmPPOTrainer
lengths, outcomes = [3, 6, 8, 8], [1.0, 1.0, 1.0, -1.0]
sequence = outcomes
tokens = [[0.0] * (n - 1) + [r] for n, r in zip(lengths, outcomes)]  # what the agent-loop generator returns
out = []
for buffer_len, rewards in ((4, sequence), (4, tokens), (0, tokens)):
    cfg = load_config("tiny_cpu_grpo", [f"skyrl_glm.overlong.buffer_len={buffer_len}",
                                        "generator.sampling_params.max_generate_length=8"])
    trainer = object.__new__(GlmPPOTrainer)  # no Ray workers: postprocess reads cfg, writes all_metrics
    trainer.cfg, trainer.all_metrics = cfg, {}
    rewards = [list(r) if isinstance(r, list) else r for r in rewards]
    gen = {"response_ids": [[1] * n for n in lengths], "rewards": rewards,
           "loss_masks": [[1] * n for n in lengths], "stop_reasons": ["stop", "stop", "length", "length"]}
    gen, _ = trainer.postprocess_generator_output(gen, ["a", "a", "b", "b"])
    out.append([sum(r) for r in gen["rewards"]])
# eval(): SkyRL's metrics plus accuracy and cap share read from the dump SkyRL just wrote (SkyRL's eval stubbed)
import asyncio
from pathlib import Path
from skyrl.train.trainer import RayPPOTrainer
async def skyrl_eval(self, *args, **kwargs):
    return {"eval/all/avg_score": 0.0}
RayPPOTrainer.eval = skyrl_eval
dump = Path(sys.argv[1]) / "dumped_evals" / "global_step_3_evals"
dump.mkdir(parents=True)
rows = [(1.0, "stop"), (-1.0, "length"), (-1.0, "length"), (-1.0, "stop")]
dump.joinpath("aime2024.jsonl").write_text("".join(
    json.dumps({"input_prompt": "p", "score": s, "stop_reason": r}) + "\\n" for s, r in rows))
cfg.trainer.export_path, trainer.global_step = sys.argv[1], 3
out.append(asyncio.run(trainer.eval()))
print("RESULT " + json.dumps(out))
"""


def test_skyrl_trainer_applies_the_penalty_and_logs_eval_accuracy_and_cap_share(tmp_path):
    # skyrl-glm's trainer override in front of SkyRL's real postprocess (sequence reward -> per-token rewards).
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", TRAINER_PROBE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ.copy(),
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    sequence, tokens, off, eval_metrics = json.loads(lines[-1].removeprefix("RESULT "))
    assert sequence == pytest.approx([1.0, 0.5, 0.0, -2.0])  # cap 8, buffer 4: lengths 3, 6, 8, 8
    assert tokens == pytest.approx([1.0, 0.5, 0.0, -2.0])  # per-token rewards: same totals
    assert off == [1.0, 1.0, 1.0, -1.0]  # buffer_len 0: untouched
    assert eval_metrics == {
        "eval/all/avg_score": 0.0,
        "eval/aime2024/accuracy_mean_at_n": 0.25,
        "eval/aime2024/cap_share": 0.5,
    }
