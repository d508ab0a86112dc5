"""The per-step figures: the summary's rows joined from syncs, agree checks and mismatch, the step-log callback on
SkyRL's log payload, the canary's reward, and `skyrl-glm report --canary` over run summaries (no SkyRL run here:
tests/test_skyrl_train.py checks the rows of real runs)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from skyrl_glm.canary.curves import rise
from skyrl_glm.canary.env import CanaryEnv, canary_reward
from skyrl_glm.cli import main
from skyrl_glm.skyrl.run.step_log import StepMetrics
from skyrl_glm.skyrl.run.summary import AgreeRecord, RunSummary, SyncRecord


def _summary(fault: str = "none", rewards: tuple[float, ...] = (0.04, 0.05, 0.2, 0.3)) -> RunSummary:
    s = RunSummary("memory", "per-expert", run={"fault": fault, "check": fault == "none"})
    for step in range(len(rewards) + 1):
        stages = {"dedup_s": 0.001 * (step + 1), "pack_s": 0.001, "receive_s": 0.002, "load_s": 0.003}
        s.syncs.append(SyncRecord(0.01 * (step + 1), stages, step, 0.05))
    s.agree = [AgreeRecord(k + 1, True, 0.002, 0.0005, 0.003, 0.001, 0.4, k, 1e-3, 1e-2, 1e-4, 2e-4) for k in (1, 3)]
    s.mismatch = [{"step": 2, "policy/rollout_train_logprobs_abs_diff_mean": 3e-7, "skyrl_glm/gen_kl": 2e-9}]
    callback = StepMetrics()
    trainer = SimpleNamespace(summary=s)
    callback.on_log(trainer, SimpleNamespace(logs={"eval/x": 1.0}, global_step=0), None)  # the eval: no timing/step
    for step, reward in enumerate(rewards, start=1):
        logs = {"reward/avg_raw_reward": reward, "timing/step": 2.0, "timing/generate": 0.5, "timing/other": 9.0}
        callback.on_log(trainer, SimpleNamespace(logs=logs, global_step=step), None)
    return s


def test_step_rows_join_each_steps_sync_agree_check_and_mismatch() -> None:
    rows = _summary().step_rows()
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["reward"] for r in rows] == [0.04, 0.05, 0.2, 0.3]
    assert rows[0]["step_s"] == 2.0 and rows[0]["generate_s"] == 0.5 and "other_s" not in rows[0]
    assert rows[1]["sync_s"] == 0.03 and rows[1]["first_request_s"] == 0.05
    assert rows[1]["plan_s"] == pytest.approx(0.004)  # the plan's parts, summed
    assert rows[0]["agree_prefill_max"] == 0.002 and rows[0]["agree_prob_tol"] == 1e-2  # agree after step 1
    assert rows[1]["agree_passed"] is None  # no agree check after step 2
    assert rows[1]["mismatch_mean"] == 3e-7 and rows[0]["mismatch_mean"] is None
    assert rows[1]["gen_kl"] == 2e-9 and rows[0]["gen_kl"] is None


def test_canary_reward_is_the_digit_share() -> None:
    assert canary_reward("") == 0.0 and canary_reward("abc") == 0.0
    assert canary_reward("a1b2") == 0.5 and canary_reward("42") == 1.0
    env = CanaryEnv()
    out = env.step("x9")
    assert out["reward"] == 0.5 and out["done"] and env.get_metrics() == {"share": 0.5}


def test_rise_compares_the_last_and_first_steps() -> None:
    assert rise([0.04, 0.05, 0.2, 0.3]) == pytest.approx(0.205)
    assert rise([0.1, 0.1, 0.1]) == 0.0  # too few steps to tell


def _write(tmp_path: Path, name: str, summary: RunSummary) -> Path:
    path = tmp_path / name / "skyrl_glm_summary.json"
    path.parent.mkdir()
    path.write_text(json.dumps(summary.to_json()))
    return path


def test_report_canary_prints_each_runs_table_and_plots_the_curves(tmp_path, capsys) -> None:
    learned = _write(tmp_path, "memory", _summary())
    stale = _write(tmp_path, "stale", _summary("no-publish", (0.04, 0.05, 0.04, 0.05)))
    png = tmp_path / "canary.png"
    assert (
        main(
            [
                "report",
                "--canary",
                str(learned),
                str(stale.parent),
                "--png",
                str(png),
                "--json",
                str(tmp_path / "c.json"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "per step (memory sync)" in out and "per step (memory sync, no-publish, check off)" in out, out
    rows = {
        line.split()[1]: line for line in out.splitlines() if line.startswith("│ memory") or line.startswith("│ stale")
    }
    assert "no stop" in rows["memory"] and "0.040 -> 0.300" in rows["memory"], out  # one row per run, by its dir
    assert "check off" in rows["stale"], out
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert [len(run) for run in json.loads((tmp_path / "c.json").read_text())] == [4, 4]


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "no such run summary"),
        ("{not json", "not a run summary"),
        ('{"sync_mode": "memory"}', "no per-step figures"),
        ('{"steps": [{"step": 1, "reward": "high"}]}', "step 1: reward 'high' is not a finite number"),
    ],
)
def test_report_canary_bad_summary_is_one_line_exit_2(tmp_path, capsys, content, message) -> None:
    path = tmp_path / "skyrl_glm_summary.json"
    if content is not None:
        path.write_text(content)
    assert main(["report", "--canary", str(path), "--png", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err, err


def _step(**figures: object) -> str:
    return json.dumps({"steps": [{"step": 1, **figures}]})


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"run": 5}', "no per-step figures"),
        ('{"run": 5, "steps": []}', "'run' must be an object, got 5"),
        ('{"sync_mode": [], "steps": []}', "'sync_mode' must be a string"),
        (_step(step_s="slow"), "step 1: step_s 'slow' is not a finite number"),
        (_step(sync_s=[1]), "step 1: sync_s [1] is not a finite number"),
        (_step(agree_prefill_mean=True), "step 1: agree_prefill_mean True is not a finite number"),
        (_step(mismatch_mean={"a": 1}), "step 1: mismatch_mean {'a': 1} is not a finite number"),
        ('{"steps": [{"step": 1, "reward": ' + "9" * 400 + "}]}", "step 1: reward 999"),  # past float's range
        ('{"steps": [{"step": 1, "reward": ' + "9" * 5000 + "}]}", "not a run summary (ValueError"),
        ('{"steps": [{"step": ' + "9" * 400 + "}]}", "no per-step figures"),
        ('{"steps": [{"step": true}]}', "no per-step figures"),
        ("[" * 100_000 + "]" * 100_000, "not a run summary (RecursionError"),
    ],
    ids=[
        "run-a-number",
        "run-not-an-object",
        "sync-mode-a-list",
        "step-s-a-string",
        "sync-s-a-list",
        "agree-a-bool",
        "mismatch-an-object",
        "reward-past-float",
        "reward-5000-digits",
        "step-past-int32",
        "step-a-bool",
        "nested-100000-deep",
    ],
)
def test_report_canary_malformed_summary_is_one_line_exit_2(tmp_path, capsys, content, message) -> None:
    path = tmp_path / "skyrl_glm_summary.json"
    path.write_text(content)
    assert main(["report", "--canary", str(path), "--png", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "x.png").exists()


def test_report_canary_agree_without_its_maxima_is_drawn(tmp_path, capsys) -> None:
    path = tmp_path / "skyrl_glm_summary.json"
    path.write_text(_step(reward=0.5, agree_prefill_mean=1e-4))
    assert main(["report", "--canary", str(path), "--png", str(tmp_path / "x.png")]) == 0
    assert "0.0001/-" in capsys.readouterr().out


def test_report_canary_outputs_never_overwrite_an_input(tmp_path, capsys) -> None:
    summary = _write(tmp_path, "memory", _summary())
    before = summary.read_bytes()
    for option, out in (("--json", summary), ("--png", tmp_path / "x.png")):
        argv = ["report", "--canary", str(summary.parent), "--png", str(tmp_path / "x.png"), option, str(out)]
        if option == "--png":
            argv = ["report", "--canary", str(summary), "--png", str(tmp_path / "x.jsonl")]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert summary.read_bytes() == before and not list(tmp_path.glob("x.*"))


def _stopped_after(step: int | None, fault: str = "none", at: int = 0) -> dict:
    """A run summary (as JSON) whose agree check after ``step`` failed (None: none failed; 0: the check before
    step 1 failed), with ``fault`` started at step ``at``."""
    s = _summary(fault)
    s.run = {"fault": fault, "fault_at_step": at, "check": True}
    s.agree = [AgreeRecord(k + 1, k != step, 0.1, 0.01, 0.1, 0.01, 0.4, k, 0.05, 0.1) for k in range(1, 5)]
    out = s.to_json()
    if step == 0:
        out["check"] = {"passed": False}
    return out


@pytest.mark.parametrize(
    ("stopped", "fault", "at", "verdict"),
    [
        (None, "none", 0, "no stop"),
        (3, "none", 0, "FALSE STOP after step 3"),
        (0, "no-publish", 0, "caught before step 1"),
        (3, "drop-experts", 3, "caught after step 3"),
        (4, "drop-experts", 3, "LATE: stopped after step 4, fault at 3"),
        (2, "drop-experts", 3, "EARLY: stopped after step 2, fault at 3"),
        (None, "wrong-target", 2, "MISSED"),
    ],
)
def test_a_runs_verdict_names_false_stops_and_faults_caught_within_one_sync(stopped, fault, at, verdict) -> None:
    from skyrl_glm.canary.curves import digest

    d = digest(_stopped_after(stopped, fault, at))
    assert d["verdict"] == verdict
    assert (d["steps"], d["agree_checks"], d["agree_passed"]) == (4, 4, 4 if stopped in (None, 0) else 3)
    assert (d["reward_first"], d["reward_last"], d["rise"]) == (0.04, 0.3, None)  # a rise needs 8 steps
    assert d["gen_kl_max"] == d["gen_kl_median"] == 2e-9
