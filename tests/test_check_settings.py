"""One record of the check's settings: the SkyRL section's defaults are the CLI's and the library's
(``CheckConfig``), and a bound the algorithm refuses is refused when the recipe loads, not mid-training; one
table of faults for the check and the SkyRL section."""

from __future__ import annotations

import dataclasses
import re
import typing

import pytest

from skyrl_glm.check.algorithm import CheckConfig
from skyrl_glm.check.faults import EXPECTED_FAILURE, FAULT_TABLE, FAULTS, NO_FAULT, inject
from skyrl_glm.cli import build_parser
from skyrl_glm.skyrl.config.recipes import load_config
from skyrl_glm.skyrl.config.sections import CHECK_SETTINGS, CheckSection, ConfigError


def test_skyrl_section_cli_and_library_share_the_defaults() -> None:
    section = load_config(None, ["trainer.policy.model.lora.rank=8"]).skyrl_glm.check
    assert section.check_config() == CheckConfig()
    cli = build_parser().parse_args(["check"])
    assert (cli.scale, cli.mean_tol, cli.prob_tol) == (section.scale, section.mean_tol, section.prob_tol)


def test_the_section_builds_the_algorithms_settings_from_its_keys() -> None:
    overrides = ["skyrl_glm.check.mean_tol=0.001", "skyrl_glm.check.scale=0.2", "skyrl_glm.check.decode=false"]
    section = load_config("tiny_cpu_grpo", overrides).skyrl_glm.check
    assert section.check_config() == CheckConfig(mean_tol=0.001, prob_tol=0.01, scale=0.2, decode=False)


def test_every_setting_of_the_check_is_a_recipe_key_and_an_option_alike() -> None:
    # The section's check keys are the record's fields (same names, types and defaults), and `skyrl-glm check`
    # has an option for each (decode as --no-decode); a field added to the record fails here until both have it.
    section_hints, record_hints = typing.get_type_hints(CheckSection), typing.get_type_hints(CheckConfig)
    record = {f.name: f.default for f in dataclasses.fields(CheckConfig)}
    section = {f.name: f.default for f in dataclasses.fields(CheckSection)}
    assert set(CHECK_SETTINGS) == set(record) - {"first_version"}
    for name in CHECK_SETTINGS:
        assert section[name] == record[name] and section_hints[name] == record_hints[name], name
    cli = vars(build_parser().parse_args(["check"]))
    assert {"no_decode" if name == "decode" else name for name in CHECK_SETTINGS} <= set(cli)
    overrides = ["skyrl_glm.check.group_margin=0", "skyrl_glm.check.seed=5"]
    assert load_config("tiny_cpu_grpo", overrides).skyrl_glm.check.check_config() == CheckConfig(
        mean_tol=0.001, prob_tol=0.01, group_margin=0.0, seed=5
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "skyrl_glm.check.mean_tol=-1",
            r"^command line: skyrl_glm\.check\.mean_tol: must be a number in 0\.\.10, got -1",
        ),
        (
            "skyrl_glm.check.repeat_tol=-0.5",
            r"^command line: skyrl_glm\.check\.repeat_tol: must be a number in 0\.\.10, got -0\.5",
        ),
        (
            "skyrl_glm.check.group_margin=11",
            r"^command line: skyrl_glm\.check\.group_margin: must be a number in 0\.\.10, got 11",
        ),
        ("skyrl_glm.check.scale=0", r"^command line: skyrl_glm\.check\.scale: must be a number > 0 and <= 10, got 0"),
    ],
)
def test_a_bound_the_algorithm_refuses_is_refused_at_load(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config("tiny_cpu_grpo", [override])


def test_one_faults_table_drives_the_check_and_the_skyrl_section() -> None:
    publisher, sampler = object(), object()
    for name, record in FAULT_TABLE.items():
        wrapped_publisher, wrapped_sampler = inject(name, publisher, sampler)
        assert (wrapped_publisher is not publisher) == (record.publisher is not None), name
        assert (wrapped_sampler is not sampler) == (record.sampler is not None), name
    assert inject(NO_FAULT, publisher, sampler) == (publisher, sampler)
    assert FAULTS == (NO_FAULT, *FAULT_TABLE) and EXPECTED_FAILURE["drop-aliases"] == 4
    assert load_config("tiny_cpu_grpo", ["skyrl_glm.sync.fault=no-publish"]).skyrl_glm.sync.fault == "no-publish"
    # a fault the SkyRL run cannot inject (a sampler's, or one the disk baseline already breaks) is refused, naming
    # the ones it can: the publisher faults, then the routing faults
    skyrl = "none|no-publish|double-scale|wrong-target|drop-experts|drop-shared-experts|remote-same-host|skip-remote"
    assert all(FAULT_TABLE[f].publisher is not None for f in skyrl.split("|")[1:6])
    for refused in ("prefill-only", "drop-aliases"):
        with pytest.raises(
            ConfigError, match=rf"skyrl_glm.sync.fault: must be one of {re.escape(skyrl)}, got '{refused}'"
        ):
            load_config("tiny_cpu_grpo", [f"skyrl_glm.sync.fault={refused}"])


def test_a_fault_at_step_k_names_its_fault_and_a_step() -> None:
    sync = load_config("canary", ["skyrl_glm.sync.fault=no-publish", "skyrl_glm.sync.fault_at_step=3"]).skyrl_glm.sync
    assert (sync.fault, sync.fault_at_step) == ("no-publish", 3)
    with pytest.raises(ConfigError, match="skyrl_glm.sync.fault_at_step: set skyrl_glm.sync.fault too"):
        load_config("canary", ["skyrl_glm.sync.fault_at_step=3"])
    with pytest.raises(ConfigError, match=r"skyrl_glm.sync.fault_at_step: must be >= 0, got -1"):
        load_config("canary", ["skyrl_glm.sync.fault=no-publish", "skyrl_glm.sync.fault_at_step=-1"])
