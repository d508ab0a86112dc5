"""The GLM-5.3 / Flash DAPO-math recipes build SkyRL 0.4's real config (strict keys) and pass SkyRL's own
validation; bad keys, wrong types and broken promises are one line naming the file and the key."""

from __future__ import annotations

import os
import stat

import pytest
import ray
import yaml
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.utils.utils import validate_cfg

from skyrl_glm.cli import main
from skyrl_glm.plugins import registry
from skyrl_glm.skyrl.config.recipes import load_config, packaged_recipes
from skyrl_glm.skyrl.config.sections import ConfigError, resolved_transport
from skyrl_glm.skyrl.recipes_cli import dry_run
from skyrl_glm.sync.vllm.control import KEY_DIR_ENV

GLM_RECIPES = {"glm53_dapo_math": "glm-5.3", "glm53_flash_dapo_math_2node": "glm-5.3-flash"}


@pytest.fixture(scope="module", autouse=True)
def shared_key_dir(tmp_path_factory):
    """The two-node recipe needs its control key on storage every node reads (a shared home): named here."""
    patch = pytest.MonkeyPatch()
    patch.setenv(KEY_DIR_ENV, str(tmp_path_factory.mktemp("shared-home")))
    yield
    patch.undo()


@pytest.fixture
def default_keys(monkeypatch, tmp_path):
    """No key directory named: the default one, under a cache root of this test's own."""
    monkeypatch.setenv(KEY_DIR_ENV, "set")  # recorded, so what use_key_dir sets is undone after the test
    monkeypatch.delenv(KEY_DIR_ENV)
    monkeypatch.setenv("SKYRL_GLM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "keys"


def test_a_multi_node_recipe_validates_and_dry_runs_as_documented(default_keys, capsys):
    """``recipes validate`` and ``train --dry-run`` work as docs/install.md writes them, no variable set; the
    launch lines name the key directory every node must see."""
    for name in GLM_RECIPES:  # 4 and 2 nodes
        assert main(["recipes", "validate", name]) == 0, capsys.readouterr().err
        assert main(["train", name, "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert f"export {KEY_DIR_ENV}={default_keys}\n" in out
        assert "read at that path by every node's vLLM workers" in out
    assert not default_keys.exists()  # a dry run makes nothing


def test_a_dry_run_names_the_key_directory_that_is_set(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(KEY_DIR_ENV, str(tmp_path / "shared"))
    assert main(["train", "glm53_dapo_math", "--dry-run"]) == 0
    assert f"export {KEY_DIR_ENV}={tmp_path / 'shared'}\n" in capsys.readouterr().out


def test_train_makes_the_default_key_directory_private_and_uses_it(default_keys):
    from skyrl_glm.skyrl.config.key_placement import use_key_dir

    cfg = load_config("glm53_dapo_math")
    assert use_key_dir(cfg.trainer, cfg.generator.inference_engine) is None
    assert os.environ[KEY_DIR_ENV] == str(default_keys)
    assert stat.S_IMODE(default_keys.stat().st_mode) == 0o700 and default_keys.stat().st_uid == os.geteuid()
    assert use_key_dir(cfg.trainer, cfg.generator.inference_engine) is None  # set now: used as it is


def test_a_one_node_run_keeps_its_key_in_the_temp_dir(default_keys):
    from skyrl_glm.skyrl.config.key_placement import key_dir, use_key_dir

    cfg = load_config("tiny_cpu_grpo")
    assert key_dir(cfg.trainer, cfg.generator.inference_engine) is None
    assert use_key_dir(cfg.trainer, cfg.generator.inference_engine) is None and KEY_DIR_ENV not in os.environ
    assert not default_keys.exists()


@pytest.mark.parametrize("kind", ["group-readable", "world-writable", "a link", "a file"])
def test_a_default_key_directory_that_is_not_private_is_refused(default_keys, kind, tmp_path, capsys):
    from skyrl_glm.skyrl.config.key_placement import use_key_dir

    default_keys.parent.mkdir(parents=True)
    if kind == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        default_keys.symlink_to(tmp_path / "elsewhere")
    elif kind == "a file":
        default_keys.write_text("")
    else:
        default_keys.mkdir()
        default_keys.chmod(0o750 if kind == "group-readable" else 0o777)
    assert main(["recipes", "validate", "glm53_dapo_math"]) == 2
    err = capsys.readouterr().err
    assert f"control key directory {default_keys}: " in err and len(err.strip().splitlines()) == 1, err
    cfg = load_config("glm53_dapo_math")
    problem = use_key_dir(cfg.trainer, cfg.generator.inference_engine)
    assert problem is not None and problem.startswith(f"control key directory {default_keys}: ")
    assert KEY_DIR_ENV not in os.environ  # refused, never loosened or used
    if kind != "a file" and kind != "a link":
        assert stat.S_IMODE(default_keys.stat().st_mode) != 0o700  # left as the user made it


@pytest.fixture(scope="module", params=sorted(GLM_RECIPES))
def recipe(request):
    return request.param, load_config(request.param)


def test_packaged(recipe):
    assert {"dapo_math_base", *GLM_RECIPES} <= set(packaged_recipes())


def test_recipe_passes_skyrl_validation(recipe):
    _, cfg = recipe
    validate_cfg(cfg)  # SkyRL 0.4's own checks: batch sizes vs DP, colocation GPU counts, megatron, LoRA, engines


def test_recipe_promises(recipe):
    name, cfg = recipe
    t, g, glm = cfg.trainer, cfg.generator, cfg.skyrl_glm
    assert g.sampling_params.max_generate_length == 8192
    assert t.max_training_steps == 20
    assert cfg.environment.env_class == "glm_math"
    assert t.eval_interval > 0 and t.eval_before_train and t.dump_eval_results
    assert g.eval_n_samples_per_prompt > 1 and "aime-2024" in cfg.data.val_data[0]
    assert (t.algorithm.eps_clip_high, t.algorithm.loss_reduction, t.algorithm.use_kl_loss) == (
        0.28,
        "token_mean",
        False,
    )
    assert t.algorithm.dynamic_sampling.type == "filter"
    assert glm.overlong.buffer_len == 4096 and glm.overlong.buffer_len < g.sampling_params.max_generate_length
    assert glm.sync.mode == "memory" and glm.check.before_training and glm.check.on_failure == "abort"
    assert t.placement.colocate_all and resolved_transport(glm, t.placement) == "ipc"  # in-memory sync over CUDA IPC
    assert glm.hardware.stated and glm.hardware.gpu == "H200"
    lora = t.policy.model.lora
    assert lora.rank == 32 and lora.share_expert_adapters and not t.policy.megatron_config.lora_config.merge_lora
    # Sampler-safe targets: exactly the model adapter's default policy on the Megatron side, never kv_b_proj, for the
    # sampler the recipe's rollouts run on: SkyRL's vLLM servers, whose worker wrap maps Flash's fused projections
    # (stock vLLM 0.30 refuses q_a/kv_a and gate/up LoRAs on Flash; docs/models.md).
    family = registry().model(GLM_RECIPES[name])
    assert list(lora.target_modules) == family.lora.megatron_targets(family.lora.resolve(sampler="vllm+skyrl"))
    assert "linear_kv_up_proj" not in lora.target_modules


# The loss and advantage settings a recipe must state itself (SkyRL's defaults for some change in its next release).
EXPLICIT_ALGORITHM = (
    "advantage_estimator",
    "grpo_norm_by_std",
    "advantage_batch_normalize",
    "zero_variance_filter",
    "policy_loss_type",
    "eps_clip_low",
    "eps_clip_high",
    "loss_reduction",
    "temperature",
    "use_kl_loss",
    "kl_loss_coef",
    "use_kl_in_reward",
    "use_entropy_loss",
    "enable_sample_support_replay",
    "dynamic_sampling",
    "off_policy_correction",
)


def _recipe_yaml(name: str) -> dict:
    """The recipe's own YAML merged over its bases' (what the files state, before SkyRL's defaults)."""
    from omegaconf import OmegaConf

    from skyrl_glm.skyrl.config.recipes import resolve_recipe

    path = resolve_recipe(name)
    own = yaml.safe_load(path.read_text())
    base = own.pop("base", None)
    merged = OmegaConf.merge(_recipe_yaml(base) if base else {}, own)
    return OmegaConf.to_container(merged)


@pytest.mark.parametrize("name", [*GLM_RECIPES, "tiny_cpu_grpo"])
def test_every_loss_and_advantage_setting_stated_and_off_policy_correction_on(name):
    stated = _recipe_yaml(name)["trainer"]["algorithm"]
    assert [k for k in EXPLICIT_ALGORITHM if k not in stated] == []
    cfg = load_config(name)
    opc = cfg.trainer.algorithm.off_policy_correction
    assert (opc.tis_ratio_type, opc.token_tis_ratio_clip_high) == ("token", 2.0)
    assert (opc.outlier_token_is_threshold_low, opc.outlier_token_is_threshold_high) == (1e-4, 100.0)
    assert cfg.generator.sampling_params.logprobs == 1  # the sampler's logprobs feed the correction
    validate_cfg(cfg)


def test_routing_replay_per_model_and_why():
    glm53, flash = load_config("glm53_dapo_math"), load_config("glm53_flash_dapo_math_2node")
    assert not glm53.trainer.policy.megatron_config.moe_enable_routing_replay
    assert not glm53.generator.inference_engine.enable_return_routed_experts
    assert flash.trainer.policy.megatron_config.moe_enable_routing_replay
    assert flash.generator.inference_engine.enable_return_routed_experts
    assert flash.generator.inference_engine.distributed_executor_backend == "mp"
    # The reason GLM-5.3 leaves it off, from SkyRL's own validation: replay needs vLLM's mp executor, and a
    # GLM-5.3 engine (TP 8 x PP 2) spans two nodes, which takes the ray executor.
    replay = [
        "trainer.policy.megatron_config.moe_enable_routing_replay=true",
        "generator.inference_engine.enable_return_routed_experts=true",
    ]
    # load_config runs SkyRL's validate_cfg itself (its refusal becomes a ConfigError naming the recipe)
    with pytest.raises(ConfigError, match="use the vLLM mp backend"):
        load_config("glm53_dapo_math", replay)
    with pytest.raises(ConfigError, match="use the vLLM mp backend"):
        load_config("glm53_flash_dapo_math_2node", ["generator.inference_engine.distributed_executor_backend=ray"])


def _write(tmp_path, text: str):
    path = tmp_path / "my_recipe.yaml"
    path.write_text(text)
    return str(path)


def test_misspelled_key_names_file_and_nearest_key(tmp_path):
    path = _write(tmp_path, "base: glm53_dapo_math\ntrainer:\n  algorithm:\n    eps_clip_hihg: 0.3\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: trainer.algorithm.eps_clip_hihg: unknown key")
    assert "did you mean trainer.algorithm.eps_clip_high?" in msg
    assert "\n" not in msg


def test_wrong_type_names_file_and_key(tmp_path):
    path = _write(
        tmp_path, "base: glm53_flash_dapo_math_2node\ngenerator:\n  sampling_params:\n    max_generate_length: long\n"
    )
    with pytest.raises(
        ConfigError, match=r"my_recipe.yaml: generator.sampling_params.max_generate_length: expected an integer"
    ):
        load_config(path)
    with pytest.raises(ConfigError, match=r"^command line: skyrl_glm.overlong.buffer_len: expected an integer"):
        load_config("glm53_dapo_math", ["skyrl_glm.overlong.buffer_len=[1]"])


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["skyrl_glm.hardware.nodes=2"], "needs 32 GPUs (colocated) but the recipe states 2 x 8 = 16"),
        (
            ["trainer.policy.model.lora.target_modules=[linear_proj,linear_kv_up_proj]"],
            "the sampler ignores linear_kv_up_proj (self_attn.kv_b_proj)",
        ),
        (["skyrl_glm.overlong.buffer_len=9000"], "skyrl_glm.overlong.buffer_len: 9000 is longer than the response cap"),
    ],
)
def test_broken_promises_refused(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config("glm53_dapo_math", overrides)
    assert message in str(e.value)


def test_dry_run_output_is_accepted_by_skyrl_parser(capsys):
    assert dry_run("glm53_flash_dapo_math_2node", ["trainer.seed=7"], show_config=True) == 0
    out = capsys.readouterr().out
    config_text, _, tail = out.partition("# hardware:")
    resolved = yaml.safe_load(config_text)
    glm = resolved.pop("skyrl_glm")
    assert glm["overlong"]["buffer_len"] == 4096 and glm["hardware"]["nodes"] == 2
    # SkyRL's own parser (strict keys) and validation take the SkyRL part unchanged.
    flat = {}

    def walk(node, prefix=""):
        for k, v in node.items():
            if isinstance(v, dict) and v:
                walk(v, f"{prefix}{k}.")
            else:
                flat[f"{prefix}{k}"] = v

    walk(resolved)
    cfg = SkyRLTrainConfig.from_cli_overrides(flat)
    validate_cfg(cfg)
    assert cfg.trainer.seed == 7 and cfg.generator.sampling_params.max_generate_length == 8192
    assert "ray start --head --port=6379 --num-gpus=8" in tail
    assert "ray start --address=<head-ip>:6379 --num-gpus=8" in tail
    assert "skyrl-glm train glm53_flash_dapo_math_2node trainer.seed=7" in tail
    assert "nothing was started" in tail
    assert not ray.is_initialized()


def test_cli_train_dry_run(capsys):
    assert main(["train", "glm53_dapo_math", "trainer.seed=3", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "skyrl-glm train glm53_dapo_math trainer.seed=3" in out and "nothing was started" in out
    assert "4 node(s) x 8 H200" in out
    assert not ray.is_initialized()
    assert main(["train", "glm53_dapo_math", "trainer.sed=3", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "skyrl-glm: error: command line: trainer.sed: unknown key (did you mean trainer.seed?)"


def test_overrides_after_a_flag_count_as_overrides(capsys):
    # As a new user types it: the flag first, then the overrides (argparse alone refused them).
    argv = ["train", "glm53_dapo_math", "trainer.seed=3", "--dry-run", "trainer.export_path=/exports/x"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "skyrl-glm train glm53_dapo_math trainer.seed=3 trainer.export_path=/exports/x" in out
    with pytest.raises(SystemExit) as e:
        main(["train", "glm53_dapo_math", "--dry-run", "--no-such-flag"])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("skyrl-glm: error: unrecognized arguments: --no-such-flag")
    with pytest.raises(SystemExit):
        main(["models", "extra=1"])  # a command without overrides takes none
    assert "unrecognized arguments: extra=1" in capsys.readouterr().err


def test_cli_validate_show_list(tmp_path, capsys):
    assert main(["recipes", "validate", "glm53_dapo_math"]) == 0
    assert "ok glm53_dapo_math" in capsys.readouterr().out
    own = _write(tmp_path, "base: glm53_dapo_math\ntrainer:\n  policy:\n    model:\n      path: /models/GLM-5.3\n")
    assert main(["recipes", "validate", own]) == 0
    assert "/models/GLM-5.3" in capsys.readouterr().out
    assert main(["recipes", "show", "glm53_flash_dapo_math_2node"]) == 0
    assert "base: dapo_math_base" in capsys.readouterr().out
    assert main(["recipes", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in GLM_RECIPES)


@pytest.mark.parametrize(
    "argv",
    [
        ["recipes", "validate", "no_such_recipe"],
        ["recipes", "show", "no_such_recipe"],
        ["recipes", "validate", "glm53_dapo_math", "trainer.algoritm.eps_clip_high=0.3"],
        ["recipes", "validate", "glm53_dapo_math", "generator.n_samples_per_prompt=many"],
        ["recipes", "validate", "glm53_dapo_math", "not-a-key-value"],
    ],
)
def test_cli_bad_input_one_line_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("skyrl-glm: error:") and len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_train_refuses_a_target_the_sampler_ignores_before_starting_anything(capsys):
    from skyrl_glm.skyrl.run.launch import run_command

    bad = "trainer.policy.model.lora.target_modules=[linear_proj,linear_kv_up_proj]"
    assert run_command(["glm53_flash_dapo_math_2node", bad]) == 2
    err = capsys.readouterr().err
    assert "command line: trainer.policy.model.lora.target_modules: the sampler ignores linear_kv_up_proj" in err
    assert not ray.is_initialized()


def test_a_context_longer_than_the_models_positions_is_refused_before_the_run(tmp_path):
    """vLLM refuses it inside the engine, minutes into the run (measured on one H200: the GLM-5.3 recipe's
    10,240-token context on a 512-position tiny model); the config says so first, naming the key."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "glm_moe_dsa", "max_position_embeddings": 512}')
    refusal = r"max_model_len: 10240 is longer than the model's max_position_embeddings 512"
    with pytest.raises(ConfigError, match=refusal):
        load_config("glm53_dapo_math", [f"trainer.policy.model.path={model}"])
    short = "generator.inference_engine.engine_init_kwargs.max_model_len=512"
    assert load_config("glm53_dapo_math", [f"trainer.policy.model.path={model}", short])
    # a multimodal checkpoint (GLM-5.3-Flash) keeps its positions in its text config
    (model / "config.json").write_text('{"model_type": "glm5_next", "text_config": {"max_position_embeddings": 512}}')
    with pytest.raises(ConfigError, match=refusal):
        load_config("glm53_dapo_math", [f"trainer.policy.model.path={model}"])
