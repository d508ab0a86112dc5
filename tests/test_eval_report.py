"""``skyrl-glm report``: accuracy (mean@n), pass@n, response length and cap share over steps, read from eval dumps
written by SkyRL 0.4's own ``dump_per_dataset_eval_results`` (the function its ``evaluate`` calls)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from skyrl.train.generators.utils import get_rollout_metrics
from skyrl.train.utils.trainer_utils import dump_per_dataset_eval_results

from skyrl_glm.cli import main
from skyrl_glm.dapo.report import ReportError, collect, dumped_eval_metrics
from skyrl_glm.models.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(512)


def _dump(export: Path, step: int, tokenizer, per_prompt: list[list[tuple[float, int, str]]]) -> None:
    """One eval round as SkyRL writes it: per prompt, n samples of (reward, response tokens, stop reason)."""
    prompts, responses, rewards, stops, extras = [], [], [], [], []
    for p, samples in enumerate(per_prompt):
        for reward, length, stop in samples:
            prompts.append(tokenizer.encode(f"problem {p}"))
            responses.append([5] * length)
            rewards.append(reward)
            stops.append(stop)
            extras.append({"reward_model": {"ground_truth": str(p)}, "data_source": "aime2024"})
    output = {"prompt_token_ids": prompts, "response_ids": responses, "rewards": rewards, "stop_reasons": stops}
    metrics = {f"eval/all/{k}": v for k, v in get_rollout_metrics(responses, rewards).items()}
    out_dir = export / "dumped_evals" / f"global_step_{step}_evals"
    out_dir.mkdir(parents=True)
    dump_per_dataset_eval_results(
        out_dir, tokenizer, output, ["aime2024"] * len(rewards), ["glm_math"] * len(rewards), extras, metrics
    )


def test_report_over_steps(tmp_path, tokenizer, capsys):
    # step 0: 2 prompts x 4 samples, 2/8 right, 4/8 at the 100-token cap; step 5: 6/8 right, 1/8 at the cap.
    _dump(
        tmp_path,
        0,
        tokenizer,
        [
            [(1.0, 60, "stop"), (-1.0, 100, "length"), (-1.0, 100, "length"), (-1.0, 80, "stop")],
            [(1.0, 40, "stop"), (-1.0, 100, "length"), (-1.0, 100, "length"), (-1.0, 20, "stop")],
        ],
    )
    _dump(
        tmp_path,
        5,
        tokenizer,
        [
            [(1.0, 30, "stop"), (1.0, 30, "stop"), (1.0, 30, "stop"), (-1.0, 100, "length")],
            [(1.0, 30, "stop"), (1.0, 30, "stop"), (1.0, 30, "stop"), (-1.0, 20, "stop")],
        ],
    )
    points = collect(tmp_path)
    assert [(p.step, p.data_source, p.prompts, p.samples_per_prompt) for p in points] == [
        (0, "aime2024", 2, 4),
        (5, "aime2024", 2, 4),
    ]
    assert [p.accuracy for p in points] == [0.25, 0.75]
    assert [p.pass_at_n for p in points] == [1.0, 1.0]
    assert [p.cap_share for p in points] == [0.5, 0.125]
    assert [p.mean_length for p in points] == [75.0, 37.5]

    # what the trainer adds to SkyRL's eval metrics at each eval
    assert dumped_eval_metrics(tmp_path, 5) == {
        "eval/aime2024/accuracy_mean_at_n": 0.75,
        "eval/aime2024/cap_share": 0.125,
    }
    assert dumped_eval_metrics(tmp_path, 9) == {}

    png, js = tmp_path / "r.png", tmp_path / "r.json"
    assert main(["report", str(tmp_path), "--png", str(png), "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "25.0%" in out and "75.0%" in out and "12.5%" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert json.loads(js.read_text())[1]["accuracy"] == 0.75


def test_report_bad_run_dirs(tmp_path, capsys, caplog):
    with pytest.raises(ReportError, match="no SkyRL eval dumps"):
        collect(tmp_path)
    broken = tmp_path / "dumped_evals" / "global_step_1_evals"
    broken.mkdir(parents=True)
    (broken / "aime2024.jsonl").write_text('{"score": 1.0, "input_prompt": "p"}\nnot json\n')
    with pytest.raises(ReportError, match=r"aime2024.jsonl:2: not JSON"):
        collect(tmp_path)
    assert dumped_eval_metrics(tmp_path, 1) == {}  # the trainer's eval hook logs a warning, training goes on
    assert "not logged" in caplog.text and "aime2024.jsonl:2" in caplog.text
    capsys.readouterr()
    for run_dir in (tmp_path, tmp_path / "missing"):
        assert main(["report", str(run_dir)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("skyrl-glm: error:") and len(err.splitlines()) == 1, err
