"""``skyrl-glm report``: accuracy (mean@n), pass@n, response length and cap share over steps, read from eval dumps
written by SkyRL 0.4's own ``dump_per_dataset_eval_results`` (the function its ``evaluate`` calls)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from skyrl.train.generators.utils import get_rollout_metrics
from skyrl.train.utils.trainer_utils import calculate_per_dataset_metrics, dump_per_dataset_eval_results

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


def test_mean_and_pass_at_n_as_skyrl_computes_them(tmp_path, tokenizer):
    # 3 prompts x 4 samples: 4/4, 1/4 and 0/4 right -> mean@4 5/12, pass@4 2/3; SkyRL's own metrics agree.
    samples = [[(1.0, 10, "stop")] * 4, [(1.0, 10, "stop")] + [(-1.0, 10, "length")] * 3, [(-1.0, 10, "stop")] * 4]
    _dump(tmp_path, 3, tokenizer, samples)
    (point,) = collect(tmp_path)
    assert point.accuracy == pytest.approx(5 / 12) and point.pass_at_n == pytest.approx(2 / 3)
    assert point.cap_share == 0.25
    # what SkyRL's evaluate logs for the same samples (its per-data-source eval metrics)
    rewards = [r for prompt in samples for r, _, _ in prompt]
    uids = [str(p) for p, prompt in enumerate(samples) for _ in prompt]
    skyrl = calculate_per_dataset_metrics({"rewards": rewards}, uids, ["aime2024"] * len(uids), 4)
    assert skyrl["eval/aime2024/pass_at_4"] == pytest.approx(point.pass_at_n)
    assert skyrl["eval/aime2024/mean_positive_reward"] == pytest.approx(point.accuracy)


def test_report_from_one_dump_file(tmp_path, tokenizer, capsys):
    _dump(tmp_path, 7, tokenizer, [[(1.0, 12, "stop"), (-1.0, 100, "length")]])
    dump = tmp_path / "dumped_evals" / "global_step_7_evals" / "aime2024.jsonl"
    (point,) = collect(dump)
    assert (point.step, point.data_source, point.accuracy, point.pass_at_n, point.cap_share) == (
        7,
        "aime2024",
        0.5,
        1.0,
        0.5,
    )
    assert main(["report", str(dump)]) == 0
    assert "50.0%" in capsys.readouterr().out
    assert dump.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def _one_line_exit_2(argv, capsys) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("skyrl-glm: error:") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "eval over training steps" not in captured.out  # refused before any table
    return err


@pytest.mark.parametrize(
    "lines,message",
    [
        (['{"score": "1.0", "input_prompt": "p"}'], "aime2024.jsonl:1: score '1.0' is not a number"),
        (['{"score": null, "input_prompt": "p"}'], "aime2024.jsonl:1: score None is not a number"),
        (
            ['{"score": 1.0, "input_prompt": "p"}', '{"score": [0.0, 1.0], "input_prompt": "p"}'],
            "aime2024.jsonl:2: score mixes sequence rewards and token-reward lists",
        ),
        (['{"score": [1.0, "x"], "input_prompt": "p"}'], "aime2024.jsonl:1: score [1.0, 'x'] is not a number"),
        (['{"score": NaN, "input_prompt": "p"}'], "aime2024.jsonl:1: score nan is not a number"),
        (['{"score": true, "input_prompt": "p"}'], "aime2024.jsonl:1: score True is not a number"),
        (['{"input_prompt": "p"}'], "aime2024.jsonl:1: a record needs input_prompt and score"),
        (['{"score": ' + "9" * 5000 + ', "input_prompt": "p"}'], "aime2024.jsonl:1: not usable JSON (ValueError"),
        (['{"score": ' + "9" * 400 + ', "input_prompt": "p"}'], "aime2024.jsonl:1: score 999"),  # past float
        (['{"score": 1e400, "input_prompt": "p"}'], "aime2024.jsonl:1: score inf is not a number"),
        (["[" * 100_000 + "]" * 100_000], "aime2024.jsonl:1: not usable JSON (RecursionError"),
    ],
)
def test_report_bad_scores_one_line(tmp_path, capsys, lines, message):
    eval_dir = tmp_path / "dumped_evals" / "global_step_1_evals"
    eval_dir.mkdir(parents=True)
    (eval_dir / "aime2024.jsonl").write_text("\n".join(lines) + "\n")
    assert message in _one_line_exit_2(["report", str(tmp_path)], capsys)
    assert main(["report", str(eval_dir / "aime2024.jsonl")]) == 2  # the same through the dump-file door
    capsys.readouterr()


def test_report_unreadable_dumps_one_line(tmp_path, capsys):
    eval_dir = tmp_path / "dumped_evals" / "global_step_1_evals"
    eval_dir.mkdir(parents=True)
    (eval_dir / "aime2024.jsonl").write_bytes(b'{"score": 1.0, "input_prompt": "\xff\xfe"}\n')
    assert "aime2024.jsonl: not UTF-8 text" in _one_line_exit_2(["report", str(tmp_path)], capsys)
    (eval_dir / "aime2024.jsonl").unlink()
    (eval_dir / "math.jsonl").mkdir()  # a directory named like a dump
    assert "math.jsonl: not a file" in _one_line_exit_2(["report", str(tmp_path)], capsys)
    # given as the run itself, it is a directory without eval dumps
    assert "math.jsonl: no SkyRL eval dumps" in _one_line_exit_2(["report", str(eval_dir / "math.jsonl")], capsys)


def test_report_outputs_checked_before_the_table(tmp_path, tokenizer, capsys):
    _dump(tmp_path, 0, tokenizer, [[(1.0, 10, "stop")]])
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    for option in ("--json", "--png"):
        err = _one_line_exit_2(["report", str(tmp_path), option, str(blocker / "out")], capsys)
        assert err.startswith(f"skyrl-glm: error: {option} {blocker / 'out'}:"), err
        err = _one_line_exit_2(["report", str(tmp_path), option, str(tmp_path)], capsys)
        assert "is a directory" in err


def test_report_writes_into_a_directory_it_makes(tmp_path, tokenizer, capsys):
    _dump(tmp_path, 0, tokenizer, [[(1.0, 10, "stop")]])
    out = tmp_path / "not" / "yet"
    assert main(["report", str(tmp_path), "--json", str(out / "r.json"), "--png", str(out / "r.png")]) == 0
    assert json.loads((out / "r.json").read_text())[0]["accuracy"] == 1.0 and (out / "r.png").is_file()
    capsys.readouterr()


def test_report_outputs_never_overwrite_an_input(tmp_path, tokenizer, capsys):
    """``--json`` or ``--png`` naming a dump the report reads (the dump given, or one inside the run) is refused;
    a ``--png`` that is not a .png is refused before matplotlib picks a format by its suffix."""
    _dump(tmp_path, 0, tokenizer, [[(1.0, 10, "stop")]])
    dump = tmp_path / "dumped_evals" / "global_step_0_evals" / "aime2024.jsonl"
    before = dump.read_bytes()
    for run in (dump, tmp_path):
        for option in ("--json", "--png"):
            err = _one_line_exit_2(["report", str(run), option, str(dump)], capsys)
            assert "is an input of this command" in err or "ending in .png" in err, err
        err = _one_line_exit_2(["report", str(run), "--json", str(dump), "--png", str(tmp_path / "r.png")], capsys)
        assert "is an input of this command" in err, err
    err = _one_line_exit_2(["report", str(tmp_path), "--png", str(tmp_path / "plot.jsonl")], capsys)
    assert "--png" in err and "ending in .png" in err
    assert dump.read_bytes() == before and not (tmp_path / "plot.jsonl").exists()
