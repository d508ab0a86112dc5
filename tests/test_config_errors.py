"""Every bad recipe, override or value is refused by ``recipes validate`` and ``train --dry-run`` (the same checks
``train`` runs before anything starts): one line naming the key, exit 2, no traceback.

Each value here used to pass validation and fail only after Ray, the models and vLLM had started (or escaped as a
traceback). In process (``skyrl_glm.cli.main``): an exception escaping would fail the test as a traceback would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from skyrl_glm.cli import main
from skyrl_glm.skyrl.config.recipes import MAX_BASE_DEPTH

TINY = "tiny_cpu_grpo"


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], says: str) -> None:
    """Exit 2, one error line naming the problem, no traceback. (Lines other than the command's own may reach the
    captured streams from engines that earlier tests in this process left running; the error line is counted.)"""
    code = main(argv)
    out, err = capsys.readouterr()
    errors = [line for line in (out + err).splitlines() if "error: " in line]
    assert code == 2, out + err
    assert "Traceback" not in out + err, out + err
    assert len(errors) == 1, out + err
    assert says in errors[0], errors[0]


def _recipe(tmp_path: Path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("int-key.yaml", f"base: {TINY}\n1: 2\n", "1: a key must be a name, got int"),
        ("bool-key.yaml", f"base: {TINY}\ntrue: 2\n", "True: a key must be a name, got bool"),
        ("nested-int-key.yaml", f"base: {TINY}\ntrainer:\n  3: x\n", "trainer.3: a key must be a name"),
        ("null-section.yaml", f"base: {TINY}\nskyrl_glm: null\n", "skyrl_glm: expected a section (mapping), got null"),
        ("nan.yaml", f"base: {TINY}\nskyrl_glm:\n  check:\n    mean_tol: .nan\n", "mean_tol: expected a finite"),
        ("inf.yaml", f"base: {TINY}\ntrainer:\n  policy:\n    optimizer_config:\n      lr: .inf\n", "lr: expected"),
        ("not-utf8.yaml", b"# \xff\xfe\nbase: tiny_cpu_grpo\n", "unreadable YAML"),
    ],
)
def test_a_bad_recipe_file_is_one_line(capsys, tmp_path, name, text, says):
    _refused(capsys, ["recipes", "validate", _recipe(tmp_path, name, text)], says)


def test_a_long_chain_of_bases_is_refused_before_python_recursion(capsys, tmp_path):
    for i in range(1500):
        _recipe(tmp_path, f"b{i}.yaml", f"base: b{i + 1}.yaml\n" if i < 1499 else f"base: {TINY}\n")
    _refused(capsys, ["recipes", "validate", str(tmp_path / "b0.yaml")], f"more than {MAX_BASE_DEPTH} recipes composed")


def test_recipes_show_of_a_non_utf8_file_is_one_line(capsys, tmp_path):
    _refused(capsys, ["recipes", "show", _recipe(tmp_path, "x.yaml", b"\xff\xfe\n")], "unreadable recipe")


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("trainer.epochs=[1", "cannot read the overrides"),
        ("skyrl_glm.check.mean_tol=.nan", "skyrl_glm.check.mean_tol: expected a finite number, got nan"),
        ("skyrl_glm.check.prob_tol=-.inf", "skyrl_glm.check.prob_tol: expected a finite number"),
        ("skyrl_glm.sync.bucket_mb=17592186044416", "skyrl_glm.sync.bucket_mb: must be in 1..65536"),
        ("skyrl_glm.sync.transport=ipc", "skyrl_glm.sync.transport: ipc moves CUDA memory"),
        ("skyrl_glm.check.scale=0", "skyrl_glm.check.scale: must be a number > 0 and <= 10"),
        ("skyrl_glm.check.scale=-1", "skyrl_glm.check.scale: must be a number > 0 and <= 10"),
        ("skyrl_glm.check.mean_tol=-1", "skyrl_glm.check.mean_tol: must be a number in 0..10"),
        # a bound that passes anything
        ("skyrl_glm.check.mean_tol=1e30", "skyrl_glm.check.mean_tol: must be a number in 0..10"),
        ("skyrl_glm.check.prob_tol=1.5", "skyrl_glm.check.prob_tol: must be a number in 0..1"),  # |dp| <= 1 always
        ("skyrl_glm.check.num_probes=100000", "skyrl_glm.check.num_probes: must be in 1..256"),
        ("skyrl_glm.check.probe_length=1000000", "skyrl_glm.check.probe_length: must be in 2..8192"),
        ("skyrl_glm.check.decode_tokens=100000", "skyrl_glm.check.decode_tokens: must be in 1..1024"),
        ("trainer.epochs=-3", "trainer.epochs: must be an integer in 1..2147483647, got -3"),
        ("trainer.train_batch_size=0", "trainer.train_batch_size: must be an integer in 1..2147483647, got 0"),
        ("trainer.epochs=100000000000000000000000", "trainer.epochs: must be an integer in 1..2147483647"),
        ("generator.sampling_params.max_generate_length=0", "max_generate_length: must be an integer in 1..2147483647"),
        ("generator.inference_engine.max_num_seqs=0", "inference_engine.max_num_seqs: must be an integer in 1.."),
        ("generator.inference_engine.max_num_batched_tokens=-1", "max_num_batched_tokens: must be an integer in 1.."),
        ("generator.inference_engine.engine_init_kwargs.max_model_len=.nan", "engine_init_kwargs.max_model_len: must"),
        ("generator.inference_engine.engine_init_kwargs.max_model_len=.inf", "engine_init_kwargs.max_model_len: must"),
        ("generator.inference_engine.engine_init_kwargs.max_model_len=abc", "engine_init_kwargs.max_model_len: must"),
        ("generator.inference_engine.engine_init_kwargs.max_model_len=0", "engine_init_kwargs.max_model_len: must"),
        ("generator.inference_engine.engine_init_kwargs.max_num_seqs=-1", "engine_init_kwargs.max_num_seqs: must"),
        ("generator.inference_engine.engine_init_kwargs.max_num_batched_tokens=-1", "max_num_batched_tokens: must"),
        ("generator.sampling_params.temperature=-1", "sampling_params.temperature: must be a finite number >= 0"),
        ("generator.sampling_params.logprobs=-1", "sampling_params.logprobs: must be null or in 0..20"),
        ("generator.sampling_params.top_p=0", "sampling_params.top_p: must be a number in (0, 1]"),
        ("trainer.sequence_parallel_backend=ring", "SkyRL's validate_cfg refused the config: only ulysses"),
        ("trainer.policy.model.lora.rank=100000000000000000000", "lora.rank: must be an integer in 0..512"),
        ("trainer.policy.model.lora.rank=-8", "lora.rank: must be an integer in 0..512"),
        ("trainer.policy.model.lora.target_modules=[1,2]", "lora.target_modules: must be a module name (all-linear)"),
        ("trainer.policy.model.lora.target_modules=[]", "lora.target_modules: must be a module name"),
        ("trainer.policy.model.lora.alpha=0", "lora.alpha: must be a finite number > 0, got 0"),
        ("trainer.policy.model.lora.dropout=1", "lora.dropout: must be a number in [0, 1)"),
        (
            "generator.inference_engine.engine_init_kwargs.enable_mixed_moe_lora_format=true "
            "generator.inference_engine.engine_init_kwargs.enable_moe_shared_loras=true",
            "enable_mixed_moe_lora_format and enable_moe_shared_loras are exclusive",
        ),
        (
            "generator.inference_engine.engine_init_kwargs.enable_moe_shared_loras=true",
            "enable_moe_shared_loras=True contradicts skyrl_glm.sync.expert_layout=per-expert",
        ),
    ],
)
@pytest.mark.parametrize("command", [["recipes", "validate", TINY], ["train", TINY, "--dry-run"]])
def test_a_value_that_would_fail_after_start_is_refused_before(capsys, command, override, says):
    items = override.split()  # one or more key=value
    argv = [*command[:-1], *items, command[-1]] if command[-1] == "--dry-run" else [*command, *items]
    _refused(capsys, argv, says)


def test_the_tiny_recipe_itself_passes(capsys):
    assert main(["recipes", "validate", TINY]) == 0
    assert "ok tiny_cpu_grpo" in capsys.readouterr().out


def test_train_with_a_key_directory_it_cannot_use_is_one_line(capsys, monkeypatch):
    """``train`` makes the run's key in ``SKYRL_GLM_CONTROL_KEY_DIR``: one it cannot use is refused before Ray."""
    from skyrl_glm.sync.vllm.control import KEY_DIR_ENV

    monkeypatch.setenv(KEY_DIR_ENV, "/proc/nope")
    _refused(capsys, ["train", TINY], f"{KEY_DIR_ENV}=/proc/nope: the run's key directory cannot be made there")
