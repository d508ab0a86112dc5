"""Which routed-expert layout an engine runs: chosen once, from the recipe or the command line, refused with one
line where it cannot serve the adapter, and nothing changes for a user who sets nothing."""

from __future__ import annotations

import re

import pytest

from skyrl_glm.cli import main
from skyrl_glm.models.vllm_targets import vllm_engine_kwargs
from skyrl_glm.plugins import registry
from skyrl_glm.skyrl.config.recipes import load_config
from skyrl_glm.skyrl.run.summary import RunSummary
from skyrl_glm.sync import expert_layout as layouts

TINY = "tiny_cpu_grpo"
GLM53 = "glm53_dapo_math"


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str], says: str) -> None:
    code = main(argv)
    out, err = capsys.readouterr()
    errors = [line for line in (out + err).splitlines() if "error: " in line]
    assert code == 2 and "Traceback" not in out + err, out + err
    assert len(errors) == 1 and says in errors[0], out + err


def test_nothing_changes_for_a_user_who_sets_nothing() -> None:
    family = registry().model("glm-4.5")
    kwargs = vllm_engine_kwargs(family, "/m", lora_targets=family.lora.resolve(sampler="vllm"), device="cuda")
    assert {flag: kwargs[flag] for flag in layouts.ENGINE_FLAGS.values()} == dict.fromkeys(
        layouts.ENGINE_FLAGS.values(), False
    )
    for recipe in (TINY, GLM53):
        assert load_config(recipe).skyrl_glm.sync.expert_layout == layouts.PER_EXPERT


def test_the_recipes_say_which_layout_they_get() -> None:
    from skyrl_glm.skyrl.config.recipes import packaged_recipes, resolve_recipe

    def states_layout(name: str) -> bool:  # in the recipe itself or in the recipe it is based on
        text = resolve_recipe(name).read_text()
        base = re.search(r"^base:\s*(\S+)", text, re.M)
        return "expert_layout:" in text or (base is not None and states_layout(base.group(1)))

    for name in packaged_recipes():
        assert states_layout(name), name


@pytest.mark.parametrize("layout", [layouts.STACKED_3D, layouts.SHARED_OUTER, layouts.SHARED_ALL])
def test_a_layout_sets_its_engine_argument(layout: str) -> None:
    family = registry().model("glm-4.5")
    targets = family.lora.resolve(sampler="vllm")
    kwargs = vllm_engine_kwargs(family, "/m", lora_targets=targets, device="cuda", expert_layout=layout)
    assert layouts.layout_of(kwargs) == layout


@pytest.mark.parametrize(
    ("layout", "ep"),
    [(layouts.SHARED_OUTER, 1), (layouts.SHARED_ALL, 1), ("grouped:16", 16), ("grouped:32", 16), ("grouped:1", 1)],
)
def test_a_shared_or_grouped_layout_is_accepted_for_megatron_with_its_expert_adapters(layout: str, ep: int) -> None:
    """share_expert_adapters trains one adapter per EP rank: a layout of G groups serves it where EP divides G."""
    ep_key = "trainer.policy.megatron_config.expert_model_parallel_size"
    cfg = load_config(GLM53, [f"skyrl_glm.sync.expert_layout={layout}", f"{ep_key}={ep}"])
    from skyrl_glm.skyrl.config.validation import check_consistency

    check_consistency(cfg.skyrl_glm, cfg.trainer)  # raises ConfigError when refused
    assert RunSummary("memory", cfg.skyrl_glm.sync.expert_layout).to_json()["expert_layout"] == layout


@pytest.mark.parametrize(
    ("recipe", "override", "says"),
    [
        (GLM53, "skyrl_glm.sync.expert_layout=stacked", "skyrl_glm.sync.expert_layout: must be one of"),
        (GLM53, "skyrl_glm.sync.expert_layout=stacked-3d", "SkyRL 0.4.0's servers do not send"),
        (TINY, "skyrl_glm.sync.expert_layout=shared-outer", "only Megatron with"),
        (TINY, "skyrl_glm.sync.expert_layout=shared-all", "only Megatron with"),
        (TINY, "skyrl_glm.sync.expert_layout=grouped:4", "only Megatron with"),
        (GLM53, "skyrl_glm.sync.expert_layout=shared-all", "expert_model_parallel_size=16 gives 16 groups"),
        (GLM53, "skyrl_glm.sync.expert_layout=grouped:4", "use grouped:16"),
        (GLM53, "skyrl_glm.sync.expert_layout=grouped:x", "skyrl_glm.sync.expert_layout: must be one of"),
        (
            GLM53,
            "skyrl_glm.sync.expert_layout=grouped:16 generator.inference_engine.engine_init_kwargs.additional_config=5",
            "engine_init_kwargs: additional_config must be a mapping",
        ),
        (
            GLM53,
            "skyrl_glm.sync.expert_layout=shared-outer trainer.policy.model.lora.share_expert_adapters=false",
            "share_expert_adapters=true trains such an adapter",
        ),
    ],
)
def test_a_layout_the_run_cannot_serve_is_one_line(capsys, recipe: str, override: str, says: str) -> None:
    _refused(capsys, ["recipes", "validate", recipe, *override.split()], says)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["check", "--expert-layout", "shared-outer"], "vLLM's CPU build serves no routed-expert LoRA"),
        (["check", "--expert-layout", "shared-all"], "vLLM's CPU build serves no routed-expert LoRA"),
        (["check", "--expert-layout", "grouped:2"], "vLLM's CPU build serves no routed-expert LoRA"),
        (["check", "--expert-layout", "grouped:two"], "unknown expert layout 'grouped:two'"),
        (["bench", "load", "--config", "full", "--layouts", "grouped:0"], "--layouts 'grouped:0': each once, from"),
        (["bench", "load", "--config", "full", "--layouts", "none,grouped:4"], "is the --decode baseline"),
        (["bench", "load", "--config", "full", "--layouts", "grouped:4", "--decode", "0"], "every batch size in 1"),
        (["bench", "load", "--decode", "1,32"], "--decode and --max-loras are measured per layout"),
        (["check-matrix", "--expert-layout", "stacked-3d"], "vLLM's CPU build serves no routed-expert LoRA"),
        (["check-matrix", "--seeds", "3-x"], "--seeds '3-x': give comma-separated integers"),
        (["check", "--group-margin", "nan"], "group_margin"),
        (["check", "--fault", "drop-experts"], "--fault drop-experts needs a routed_expert LoRA target"),
    ],
)
def test_a_layout_is_refused_before_any_engine(capsys, argv: list[str], says: str) -> None:
    _refused(capsys, argv, says)
