"""The ``skyrl_glm`` config section, the recipe loader and CPU mode's settings and patches (no Ray, no vLLM)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from skyrl_glm.skyrl.compat import cpu
from skyrl_glm.skyrl.config.recipes import load_config, packaged_recipes
from skyrl_glm.skyrl.config.sections import (
    ConfigError,
    GlmTrainConfig,
    SkyRLGlmConfig,
    make_glm_config,
    resolved_transport,
)

ROOT = Path(__file__).resolve().parents[1]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_packaged_recipe_by_name_and_by_path_through_the_symlink() -> None:
    assert "tiny_cpu_grpo" in packaged_recipes()
    by_name = load_config("tiny_cpu_grpo")
    by_path = load_config(ROOT / "recipes" / "tiny_cpu_grpo.yaml")
    assert isinstance(by_name, SkyRLGlmConfig)
    assert by_name.skyrl_glm.sync.mode == by_path.skyrl_glm.sync.mode == "memory"
    assert by_name.trainer.max_training_steps == 2
    assert Path(by_name.data.train_data[0]).is_file()  # ${skyrl_glm_data:...} resolved to the packaged prompts


def test_base_composition_is_recursive_and_overrides_come_last(tmp_path: Path) -> None:
    write(tmp_path / "child.yaml", "base: tiny_cpu_grpo\ntrainer:\n  epochs: 3\n  max_training_steps: 7\n")
    grand = write(tmp_path / "grand.yaml", "base: child.yaml\nskyrl_glm:\n  sync:\n    mode: disk\n")
    cfg = load_config(grand, ["trainer.epochs=5"])
    assert (cfg.trainer.epochs, cfg.trainer.max_training_steps, cfg.skyrl_glm.sync.mode) == (5, 7, "disk")
    assert cfg.trainer.policy.model.lora.rank == 8  # from the packaged base


B = "base: tiny_cpu_grpo\n"


@pytest.mark.parametrize(
    ("recipe_text", "overrides", "where", "what"),
    [
        (B + "trainer:\n  bogus: 1\n", [], "bad.yaml", "trainer.bogus: unknown key"),
        (None, ["trainer.bogus=1"], "command line", "trainer.bogus: unknown key"),
        (None, ["trainer.epochs=abc"], "command line", "trainer.epochs: expected an integer"),
        (None, ["skyrl_glm.sync.mode=fast"], "command line", "skyrl_glm.sync.mode: must be one of memory|disk"),
        (B + "skyrl_glm:\n  check:\n    on_failure: ignore\n", [], "bad.yaml", "skyrl_glm.check.on_failure"),
        (None, ["trainer.policy.model.lora=3"], "command line", "trainer.policy.model.lora: expected a section"),
        (None, ["epochs"], "command line", "overrides are key=value"),
        (None, ["skyrl_glm.check.every_n_syncs=-1"], "command line", "skyrl_glm.check.every_n_syncs: must be >= 0"),
        (B + "trainer: [1, 2]\n", [], "bad.yaml", "trainer: expected a section"),
        ("- a\n- b\n", [], "bad.yaml", "a recipe must be a mapping"),
        ("trainer: {epochs: 1\n", [], "bad.yaml", "unreadable YAML"),
    ],
)
def test_errors_are_one_line_naming_the_file_and_the_key(
    tmp_path: Path, recipe_text: str | None, overrides: list[str], where: str, what: str
) -> None:
    recipe = "tiny_cpu_grpo" if recipe_text is None else write(tmp_path / "bad.yaml", recipe_text)
    with pytest.raises(ConfigError) as err:
        load_config(recipe, overrides)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(str(tmp_path / where) if where.endswith(".yaml") else where), message
    assert what in message, message


def test_circular_and_missing_bases_are_rejected(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "base: b.yaml\n")
    write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError, match="circular composition"):
        load_config(tmp_path / "a.yaml")
    write(tmp_path / "c.yaml", "base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: base: nowhere\.yaml: no such recipe"):
        load_config(tmp_path / "c.yaml")


def test_skyrl_strict_keys_and_make_config_extensions_stay() -> None:
    from dataclasses import dataclass

    from skyrl.train.config import AlgorithmConfig

    @dataclass
    class WithBuffer(AlgorithmConfig):
        overlong_buffer: int = 0

    cls = make_glm_config(algorithm_cls=WithBuffer)
    cfg = load_config("tiny_cpu_grpo", ["trainer.algorithm.overlong_buffer=64"], config_cls=cls)
    assert cfg.trainer.algorithm.overlong_buffer == 64 and cfg.skyrl_glm.cpu is True
    with pytest.raises(ConfigError, match="trainer.algorithm.overlong_buffer: unknown key"):
        load_config("tiny_cpu_grpo", ["trainer.algorithm.overlong_buffer=64"])


def test_cpu_mode_fills_defaults_enforces_requirements_and_is_never_implicit() -> None:
    plain = load_config(None, ["trainer.policy.model.lora.rank=8"])
    assert plain.skyrl_glm.cpu is False
    assert plain.trainer.placement.colocate_all is True  # SkyRL's default, untouched without cpu=true
    assert "worker_cls" not in plain.generator.inference_engine.engine_init_kwargs
    on = load_config(None, ["skyrl_glm.cpu=true", "trainer.policy.model.lora.rank=8"])
    for setting in cpu.REQUIRED:
        assert cpu._get(_as_dict(on), setting.key) == setting.value, setting.key
    assert on.trainer.logger == "console"
    with pytest.raises(ConfigError, match="colocate_all: skyrl_glm.cpu=true needs False"):
        load_config(None, ["skyrl_glm.cpu=true", "trainer.placement.colocate_all=true"])


def _as_dict(cfg: object) -> dict:
    from dataclasses import asdict

    return asdict(cfg)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("overrides", "what"),
    [
        (["trainer.policy.model.lora.rank=0"], "skyrl_glm.sync.mode: memory syncs a LoRA adapter"),
        (["skyrl_glm.sync.mode=disk", "skyrl_glm.sync.fault=no-publish"], "faults are injected into the memory"),
        (["trainer.strategy=megatron"], "skyrl_glm.cpu: SkyRL's Megatron worker needs Transformer Engine"),
    ],
)
def test_impossible_combinations_are_config_errors(overrides: list[str], what: str) -> None:
    with pytest.raises(ConfigError, match=what):
        load_config("tiny_cpu_grpo", overrides)


def _transport(cfg: GlmTrainConfig) -> str:
    return resolved_transport(cfg.skyrl_glm, cfg.trainer.placement)


def test_auto_transport_resolution() -> None:
    base = ["trainer.policy.model.lora.rank=8", "skyrl_glm.sync.mode=disk"]
    assert _transport(load_config("tiny_cpu_grpo")) == "cpu"
    assert _transport(load_config(None, base)) == "ipc"  # SkyRL colocates by default
    one_node = load_config(None, [*base, "trainer.placement.colocate_all=false"])
    assert _transport(one_node) == "cpu"
    # (SkyRL's validate_cfg, run by load_config, wants the colocated reference model on the policy's nodes)
    two_nodes = ["trainer.placement.policy_num_nodes=2", "trainer.placement.ref_num_nodes=2"]
    nodes = load_config(None, [*base, "trainer.placement.colocate_all=false", *two_nodes])
    assert _transport(nodes) == "cpu"  # the engines on the sending node; the others: routes (test_routes)
    # a transport no engine on another node can open, named for a policy spanning nodes: refused
    with pytest.raises(ConfigError, match="reaches only engines on the trainer's sending node"):
        load_config(
            None,
            [
                *base,
                "skyrl_glm.sync.mode=memory",
                "trainer.placement.colocate_all=false",
                *two_nodes,
                "skyrl_glm.sync.transport=cpu",
            ],
        )
    # the collective transport is accepted inside SkyRL (the CPU recipe runs it over gloo: test_skyrl_train)
    assert _transport(load_config("tiny_cpu_grpo", ["skyrl_glm.sync.transport=nccl"])) == "nccl"


def test_cli_bad_input_is_one_line_and_exit_2() -> None:
    for args in (["nope"], ["tiny_cpu_grpo", "skyrl_glm.sync.mode=bogus"], ["tiny_cpu_grpo", "x=1", "extra"]):
        proc = subprocess.run(
            [sys.executable, "-m", "skyrl_glm.cli", "train", *args], capture_output=True, text=True, cwd=ROOT
        )
        assert proc.returncode == 2, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.startswith("skyrl-glm train:")]
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_train_parser_builds_without_the_training_stack() -> None:
    code = (
        "import sys, argparse; from skyrl_glm.skyrl import cli; p = argparse.ArgumentParser();"
        " cli.add_parser(p.add_subparsers());"
        " print(sorted(m for m in ('torch', 'ray', 'skyrl', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "[]"


def test_cpu_patches_apply_only_after_install_in_a_fresh_process() -> None:
    probe = (
        "import torch, torch.distributed.device_mesh as dm, importlib.util;"
        " print(torch.cuda.current_device.__module__ == __name__ or torch.cuda.current_device.__name__,"
        " importlib.util.find_spec('flash_attn') is not None)"
    )
    untouched = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert untouched.split() == ["current_device", "False"]
    patched_code = (
        "from skyrl_glm.skyrl.compat import cpu; cpu.install(); import torch, torch.distributed as dist;"
        " import torch.distributed.device_mesh as dm; from flash_attn.bert_padding import pad_input;"
        " dist.init_process_group(backend='cpu:gloo,cuda:nccl', init_method='tcp://127.0.0.1:29533', rank=0,"
        " world_size=1); mesh = dm.init_device_mesh('cuda', (1,));"
        " print(torch.cuda.current_device(), dist.get_backend(), mesh.device_type, torch.ones(1).cuda().device)"
    )
    patched = subprocess.run([sys.executable, "-c", patched_code], capture_output=True, text=True, check=True).stdout
    assert patched.split()[-4:] == ["cpu", "gloo", "cpu", "cpu"]
