"""What the check accepts: NaN never passes, bounds are real numbers, reports are strict JSON, options are
refused before any work, and the model a report names still exists after the run."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import pytest
import torch

from skyrl_glm.check.algorithm import CheckConfig, CheckReport, Diff, StepResult
from skyrl_glm.check.report import write_json
from skyrl_glm.check.runner import CheckOptions, run
from skyrl_glm.usage import UsageError


@pytest.mark.parametrize("field", ["mean_tol", "prob_tol", "repeat_tol"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -0.1, 1e30])
def test_a_bound_that_is_not_a_real_number_or_passes_anything_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        CheckConfig(**{field: value})


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, 0.0, 1e30])
def test_a_scale_that_perturbs_nothing_or_not_at_all_is_refused(value):
    with pytest.raises(ValueError, match="scale"):
        CheckConfig(scale=value)


def test_a_nan_anywhere_fails_agreement():
    # Python's max() keeps the first element when a later one is NaN: max([0.0, nan]) == 0.0.
    for per_token in ([0.0, math.nan], [math.nan, 0.0], [math.inf, 0.0], [math.nan] * 3):
        d = Diff(per_token)
        assert math.isnan(d.max) or math.isinf(d.max)
        assert not d.within(0.05, 0.5)
        assert "non-finite" in d.describe("prefill")
    assert Diff([0.01, 0.02]).within(0.05, 0.5)


def _report_with_nan() -> CheckReport:
    report = CheckReport(CheckConfig())
    nan_diff = Diff([0.0, math.nan, math.inf, math.nan, math.nan, 0.1])
    report.steps.append(StepResult(1, "agree", False, "nan", 0.1, nan_diff, Diff([math.nan]), {"repeat_max": math.nan}))
    return report


def test_json_report_is_strict_json_with_the_reason_for_each_null(tmp_path):
    path = tmp_path / "sub" / "r.json"
    write_json(_report_with_nan(), path)

    def refuse(constant: str) -> None:
        raise AssertionError(f"bare {constant} in the report: not JSON")

    report = json.loads(path.read_text(), parse_constant=refuse)
    step = report["steps"][0]
    assert step["prefill"]["mean"] is None and step["prefill"]["per_token"][1] is None
    assert step["prefill"]["per_token"][5] == 0.1
    reasons = report["non_finite"]
    assert reasons["steps[0].prefill.mean"] == "nan"
    assert reasons["steps[0].prefill.per_token[*]"] == "1 of 6 inf, 3 of 6 nan"
    assert reasons["steps[0].decode.per_token[0]"] == "nan"
    assert reasons["steps[0].extra.repeat_max"] == "nan"


def test_sizes_refuses_a_rank_below_1_and_never_prints_nan():
    from rich.console import Console

    from skyrl_glm.lora.sizes import AdapterSizes, family_sizes, print_sizes_table
    from skyrl_glm.models import glm5

    for rank in (0, -8):
        with pytest.raises(ValueError, match="rank"):
            family_sizes(glm5.FAMILY, full=False, rank=rank)
    empty = AdapterSizes("m", 8, "bfloat16", (), True, 0, 0, 0, 0)
    console = Console(record=True, width=140)
    print_sizes_table([empty], console)
    assert "nan" not in console.export_text()


def test_nccl_is_refused_before_any_work(tmp_path, monkeypatch):
    """Before: refused only when the publisher was built, after the tiny model and the vLLM engine (58 s)."""
    monkeypatch.setenv("SKYRL_GLM_CACHE", str(tmp_path / "cache"))
    phases: list[str] = []
    with pytest.raises(UsageError, match="nccl"):
        run(CheckOptions(transport="nccl", workdir=str(tmp_path)), on_phase=phases.append)
    assert phases == [] and not (tmp_path / "cache").exists()


def test_tiny_models_are_cached_by_family_and_seed(tmp_path, monkeypatch):
    from skyrl_glm.checkpoint import read_config
    from skyrl_glm.models.tiny_cache import cached_tiny
    from skyrl_glm.plugins import registry

    monkeypatch.setenv("SKYRL_GLM_CACHE", str(tmp_path / "cache"))
    family = registry().model("glm-4.5")
    first = cached_tiny(family, seed=0)
    weights = first / "model.safetensors"
    made = weights.stat().st_mtime_ns
    assert cached_tiny(family, seed=0) == first and weights.stat().st_mtime_ns == made  # reused, not remade
    assert first.name.startswith("glm-4.5-seed0-") and read_config(first)["model_type"] == "glm4_moe"
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no scratch copy left behind
    os.truncate(weights, 100)  # a damaged cache entry is remade, not served
    assert cached_tiny(family, seed=0) == first and read_config(first)
    monkeypatch.setenv("SKYRL_GLM_CACHE", "/proc/skyrl-glm-cache")
    assert cached_tiny(family, seed=0) is None  # not writable: the caller makes a temporary one


def test_quiet_by_default_verbose_lets_vllm_talk():
    from skyrl_glm import quiet

    saved_env, names = dict(os.environ), quiet.QUIET_LOGGERS
    saved_levels = {n: logging.getLogger(n).level for n in names}
    try:
        for name in quiet.QUIET:
            os.environ.pop(name, None)
        os.environ["LOGURU_LEVEL"] = "TRACE"  # a user's own setting wins
        quiet.configure(verbose=False)
        assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR" and os.environ["LOGURU_LEVEL"] == "TRACE"
        assert logging.getLogger("vllm").level == logging.ERROR
        assert not logging.getLogger("matplotlib.font_manager").isEnabledFor(logging.WARNING)  # font fallbacks
        del os.environ["VLLM_LOGGING_LEVEL"]
        quiet.configure(verbose=True)
        assert os.environ["VLLM_LOGGING_LEVEL"] == "INFO"
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        for n, level in saved_levels.items():
            logging.getLogger(n).setLevel(level)


def test_the_engine_log_is_kept_only_for_a_failed_command(tmp_path, monkeypatch):
    """A quiet command's own engine log (in the temp dir) goes when the command ends with a result (exit 0 or 1)
    and stays when it failed (exit 2 or 3 name it); a log the user named is never removed."""
    import tempfile

    from skyrl_glm import quiet

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(quiet.ENGINE_LOG_ENV, raising=False)
    for code, kept in ((0, False), (1, False), (2, True), (3, True)):
        path = quiet.configure(verbose=False)
        assert path == os.environ[quiet.ENGINE_LOG_ENV] == str(tmp_path / f"skyrl-glm-engine-{os.getpid()}.log")
        Path(path).write_text("engine output\n")
        quiet.finish(path, code)
        assert Path(path).exists() is kept, code
    mine = tmp_path / "mine.log"
    mine.write_text("")
    monkeypatch.setenv(quiet.ENGINE_LOG_ENV, str(mine))
    assert quiet.configure(verbose=False) is None
    quiet.finish(None, 0)
    assert mine.exists()
    assert quiet.configure(verbose=True) is None and quiet.ENGINE_LOG_ENV not in os.environ


def test_any_rank_up_to_512_gets_an_engine_rank_vllm_accepts():
    """vLLM takes max_lora_rank only from {1, 8, 16, 32, ...}: --rank 4 used to fail inside the engine start."""
    from skyrl_glm.check.scorers import _engine_lora_rank

    assert [_engine_lora_rank(r) for r in (1, 4, 8, 9, 320, 512)] == [1, 8, 8, 16, 320, 512]
    with pytest.raises(UsageError, match="513"):
        _engine_lora_rank(513)


def test_a_sharded_checkpoint_missing_a_shard_is_refused(glm45_dir, tmp_path):
    import shutil

    from skyrl_glm.checkpoint import read_config

    ckpt = shutil.copytree(glm45_dir, tmp_path / "ckpt")
    index = {"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UsageError, match="model-00002-of-00002.safetensors"):
        read_config(ckpt)
    (ckpt / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(UsageError, match="not a JSON object"):
        read_config(ckpt)


def test_restoring_a_lora_b_backup_never_taken_is_a_no_op_not_a_new_error():
    """The check's ``finally`` restores LoRA B; when the check stopped before its perturbation (a bad config, a
    failed first publish), there is no backup, and the restore must not raise over the real error."""
    from skyrl_glm.skyrl.workers.worker_sync import GlmSyncMixin

    class Worker(GlmSyncMixin):
        def __init__(self) -> None:
            self.lora_b = [torch.zeros(4, 2), torch.zeros(3, 2)]

        def _glm_lora_b_params(self):
            return iter(self.lora_b)

    worker = Worker()
    assert worker.skyrl_glm_restore_lora_b() == 0  # nothing was perturbed: nothing to put back
    assert worker.skyrl_glm_perturb_lora_b(0.5) == 2
    assert worker.skyrl_glm_restore_lora_b() == 2
    assert all(float(p.abs().max()) == 0.0 for p in worker.lora_b)
    assert worker.skyrl_glm_restore_lora_b() == 0  # the backup is used once


def test_a_cuda_transport_on_cpu_is_one_line_before_any_engine() -> None:
    from skyrl_glm.check.runner import CheckOptions, prepare

    with pytest.raises(UsageError, match="the ipc transport moves CUDA memory"):
        prepare(CheckOptions(transport="ipc", device="cpu"))


def _key_settings(tmp_path) -> dict[str, dict[str, str]]:
    from skyrl_glm.sync.vllm.control import KEY_DIR_ENV, KEY_ENV

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    shared = tmp_path / "shared.key"
    shared.write_text("ab" * 32)
    shared.chmod(0o644)
    return {
        "dir-in-proc": {KEY_DIR_ENV: "/proc/nope"},
        "dir-a-file": {KEY_DIR_ENV: str(a_file)},
        "key-0644": {KEY_ENV: str(shared)},
        "key-missing": {KEY_ENV: str(tmp_path / "none.key")},
    }


@pytest.mark.parametrize("setting", ["dir-in-proc", "dir-a-file", "key-0644", "key-missing"])
@pytest.mark.parametrize("command", [["check"], ["check-matrix"]])
def test_a_bad_control_key_setting_is_one_line_before_any_engine(tmp_path, monkeypatch, capsys, setting, command):
    """The engine refused such a setting only after it started, as a traceback (the key is read by the check's
    first control call); now it is bad input, found before anything starts."""
    import skyrl_glm.check.matrix as matrix
    import skyrl_glm.check.runner as runner
    from skyrl_glm.cli import main
    from skyrl_glm.sync.vllm import control

    monkeypatch.setattr(control, "_KEY", None)
    for name in (control.KEY_ENV, control.KEY_DIR_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in _key_settings(tmp_path)[setting].items():
        monkeypatch.setenv(name, value)
    # both names, patched and put back: check-matrix holds its own reference to runner.prepare
    for module in (runner, matrix):
        monkeypatch.setattr(module, "prepare", lambda *a, **k: pytest.fail("the check started"))
    assert main(command) == 2
    err = capsys.readouterr().err.strip()
    name = control.KEY_DIR_ENV if setting.startswith("dir") else control.KEY_ENV
    assert len(err.splitlines()) == 1 and f"error: {name}=" in err and "Traceback" not in err, err
    assert not list((tmp_path).glob("skyrl-glm-key-*"))


def test_a_temp_dir_without_room_is_refused_before_the_engine(tmp_path, monkeypatch, capsys):
    """The engine died 114 s into start-up with a bare EngineDeadError when the temp dir was full: the room a
    check needs there is checked first (here: more than this disk's free space)."""
    import shutil

    import skyrl_glm.check.runner as runner
    from skyrl_glm.cli import main

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(runner, "TEMP_BYTES", shutil.disk_usage(tmp_path).free + (1 << 40))
    monkeypatch.setattr(runner, "prepare", lambda *a, **k: pytest.fail("the check started"))
    assert main(["check"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"temp dir {tmp_path} has " in err and "set TMPDIR" in err
    monkeypatch.setenv("TMPDIR", str(tmp_path / "none"))
    assert main(["check"]) == 2
    assert f"temp dir {tmp_path / 'none'} unusable" in capsys.readouterr().err


def test_an_engine_that_dies_mid_run_is_one_line_exit_3_with_the_likely_cause(tmp_path, monkeypatch, capsys):
    """A failure after start-up (here the engine's own EngineDeadError, raised where the run would raise it) is one
    line, exit 3, naming a temp dir that filled up during the run as the likely cause, the traceback kept in the
    named engine log."""
    import shutil

    from vllm.v1.engine.exceptions import EngineDeadError

    import skyrl_glm.check.cli as check_cli
    import skyrl_glm.check.runner as runner
    from skyrl_glm import quiet
    from skyrl_glm.cli import main

    filled: list[bool] = []

    def dies(*args, **kwargs):
        if filled:  # the run used up the room the check found before it started
            monkeypatch.setattr(runner, "TEMP_BYTES", shutil.disk_usage(tmp_path).free + (1 << 40))
        raise EngineDeadError()

    log = tmp_path / "engine.log"
    monkeypatch.setenv(quiet.ENGINE_LOG_ENV, str(log))
    monkeypatch.setattr(check_cli, "run", dies)
    assert main(["check"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("skyrl-glm check: failed: EngineDeadError"), err
    assert "likely cause" not in err and f"(log: {log})" in err and "EngineDeadError" in log.read_text()
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    filled.append(True)
    assert main(["check"]) == 3
    err = capsys.readouterr().err.strip()
    assert f"likely cause: temp dir {tmp_path} has " in err, err


def test_the_agree_rule_lets_one_probe_token_in_32_sit_far_off_and_no_more():
    """A healthy file-sync canary on one H200 stopped on one of 32 decode tokens 2.84 nats off (|dp| 0.025) while the
    other 31 agreed to ~0.002: the rule's mean leaves out the largest token in every 32. Two such tokens in 32, a
    shift of every token, or one token whose probability moved past ``prob_tol`` still fail."""
    from skyrl_glm.check.algorithm import OUTLIER_SHARE

    assert OUTLIER_SHARE == 32
    quiet = [0.002] * 31
    one_off = Diff([*quiet, 2.84], [1e-4] * 31 + [0.025])
    assert one_off.mean > 0.05 and one_off.trimmed_mean == pytest.approx(0.002)
    assert one_off.within(0.05, 0.1)
    assert "without its 1 largest: 0.002" in one_off.describe("decode")
    assert not Diff([*quiet[:30], 2.84, 2.84], [1e-4] * 32).within(0.05, 0.1)
    assert not Diff([0.06] * 32, [1e-3] * 32).within(0.05, 0.1)
    assert not Diff([*quiet, 2.84], [1e-4] * 31 + [0.2]).within(0.05, 0.1)
    prefill = Diff([0.004] * 121 + [9.0] * 3, [1e-4] * 124)  # 124 prefill probes: the largest three are left out
    assert prefill.within(0.05, 0.1) and not Diff([0.004] * 120 + [9.0] * 4, [1e-4] * 124).within(0.05, 0.1)
    assert Diff([0.3] * 8, [1e-3] * 8).trimmed_mean == pytest.approx(0.3)  # fewer than 32 tokens: nothing left out
