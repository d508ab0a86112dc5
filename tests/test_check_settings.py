"""One record of the check's settings: the SkyRL section's defaults are the CLI's and the library's
(``CheckConfig``), and a bound the algorithm refuses is refused when the recipe loads, not mid-training."""

from __future__ import annotations

import pytest

from skyrl_glm.check.algorithm import CheckConfig
from skyrl_glm.cli import build_parser
from skyrl_glm.skyrl.config import ConfigError, load_config


def test_skyrl_section_cli_and_library_share_the_defaults() -> None:
    section = load_config(None, ["trainer.policy.model.lora.rank=8"]).skyrl_glm.check
    assert section.check_config() == CheckConfig()
    cli = build_parser().parse_args(["check"])
    assert (cli.scale, cli.mean_tol, cli.max_tol) == (section.scale, section.mean_tol, section.max_tol)


def test_the_section_builds_the_algorithms_settings_from_its_keys() -> None:
    overrides = ["skyrl_glm.check.mean_tol=0.001", "skyrl_glm.check.scale=0.2", "skyrl_glm.check.decode=false"]
    section = load_config("tiny_cpu_grpo", overrides).skyrl_glm.check
    assert section.check_config() == CheckConfig(mean_tol=0.001, max_tol=0.01, scale=0.2, decode=False)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("skyrl_glm.check.mean_tol=-1", "skyrl_glm.check.mean_tol must be a finite number >= 0, got -1"),
        ("skyrl_glm.check.repeat_tol=-0.5", "skyrl_glm.check.repeat_tol must be a finite number >= 0, got -0.5"),
    ],
)
def test_a_bound_the_algorithm_refuses_is_refused_at_load(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_config("tiny_cpu_grpo", [override])
