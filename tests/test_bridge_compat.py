"""The Megatron-Bridge names SkyRL 0.4.0's model wrapper imports and released Bridge lacks, supplied at import.

Megatron-Bridge needs CUDA and Transformer Engine, so on CPU the module they are added to is a stand-in package
on ``sys.path`` named as Bridge's (``megatron.bridge.peft.utils``); on the H200 the real one is patched by the
Megatron loop runs (scripts/gpu-verify meg_*)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from skyrl_glm.skyrl.compat import bridge_compat


@pytest.fixture
def stand_in_bridge(tmp_path, monkeypatch):
    """A ``megatron.bridge.peft.utils`` that defines one function of its own, importable from ``tmp_path``."""
    utils = tmp_path / "megatron" / "bridge" / "peft" / "utils.py"
    utils.parent.mkdir(parents=True)
    for folder in (utils.parent, utils.parent.parent, utils.parent.parent.parent):
        (folder / "__init__.py").write_text("")
    utils.write_text("def finalize_model_grads_with_expert_adapter_sync(model, num_tokens=None):\n    return 'own'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "megatron" or m.startswith("megatron.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [m for m in sys.modules if m == "megatron" or m.startswith("megatron.")]:
        del sys.modules[name]


def test_missing_names_are_supplied_when_bridge_is_imported_and_its_own_win(stand_in_bridge):
    bridge_compat.install()
    assert "megatron.bridge.peft.utils" not in sys.modules  # installing imports nothing
    utils = importlib.import_module("megatron.bridge.peft.utils")
    # SkyRL's import line, as its model wrapper writes it
    from megatron.bridge.peft.utils import (  # noqa: F401
        enable_expert_parallel_grad_sync_in_finalize,
        finalize_model_grads_with_expert_adapter_sync,
    )

    assert (
        utils.enable_expert_parallel_grad_sync_in_finalize is bridge_compat.enable_expert_parallel_grad_sync_in_finalize
    )
    assert utils.finalize_model_grads_with_expert_adapter_sync(None) == "own"  # the installed Bridge's own kept


def test_install_after_bridge_was_imported_patches_it_at_once(stand_in_bridge):
    utils = importlib.import_module("megatron.bridge.peft.utils")
    assert not hasattr(utils, "enable_expert_parallel_grad_sync_in_finalize")
    bridge_compat.install()
    assert (
        utils.enable_expert_parallel_grad_sync_in_finalize is bridge_compat.enable_expert_parallel_grad_sync_in_finalize
    )


def test_the_pre_ray_check_counts_supplied_names_and_still_names_others(tmp_path):
    """SkyRL's real model wrapper against a Bridge whose ``peft/utils.py`` lacks both names (as 0.6.2): accepted;
    a name the compatibility module does not supply is still the one line."""
    from skyrl_glm.skyrl.compat.trainer_stack import SKYRL_MEGATRON, bridge_api_problem

    real = Path(next(iter(importlib.util.find_spec("skyrl").submodule_search_locations)))
    skyrl = tmp_path / "skyrl"
    wrapper = skyrl / SKYRL_MEGATRON[0] / "megatron_model_wrapper.py"
    wrapper.parent.mkdir(parents=True)
    source = (real / SKYRL_MEGATRON[0] / "megatron_model_wrapper.py").read_text()
    bridge_lines = [line for line in source.split("\n\n") if "from megatron.bridge.peft.utils import" in line]
    assert bridge_lines and all(name in bridge_lines[0] for name in bridge_compat.SUPPLIED)
    wrapper.write_text(bridge_lines[0] + "\n")
    utils = tmp_path / "bridge" / "peft" / "utils.py"
    utils.parent.mkdir(parents=True)
    utils.write_text("def create_peft():\n    pass\n")
    assert bridge_api_problem(skyrl, tmp_path / "bridge") is None

    wrapper.write_text(bridge_lines[0] + "\nfrom megatron.bridge.peft.utils import not_supplied\n")
    problem = bridge_api_problem(skyrl, tmp_path / "bridge")
    assert problem is not None and "imports not_supplied from megatron.bridge.peft.utils" in problem
