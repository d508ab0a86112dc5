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


def test_the_experiment_process_has_the_names_before_skyrl_sets_up_its_trainer(tmp_path):
    """SkyRL's ``_setup_trainer`` imports its Megatron worker (and so the model wrapper's Bridge import) in the
    experiment's Ray task, before any skyrl-glm worker module (measured on one H200: ImportError there while the
    workers' own install was in place). The experiment body, run in a fresh process with the stand-in Bridge and an
    experiment whose ``run`` makes SkyRL's import, finds both names."""
    import subprocess
    import textwrap

    utils = tmp_path / "megatron" / "bridge" / "peft" / "utils.py"
    utils.parent.mkdir(parents=True)
    for folder in (utils.parent, utils.parent.parent, utils.parent.parent.parent):
        (folder / "__init__.py").write_text("")
    utils.write_text("")
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from skyrl_glm.skyrl.run import experiment, launch

        class SkyRLSetup:
            def __init__(self, cfg):
                pass

            def run(self):
                from megatron.bridge.peft.utils import (
                    enable_expert_parallel_grad_sync_in_finalize,
                    finalize_model_grads_with_expert_adapter_sync,
                )
                return enable_expert_parallel_grad_sync_in_finalize.__module__

        experiment.GlmPPOExp = SkyRLSetup
        print(launch._experiment(None))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == bridge_compat.__name__


def _globals_in_load_order(data: bytes) -> list[tuple[str, str]]:
    """The ``(module, name)`` pairs a pickle imports, in the order unpickling imports them."""
    import pickletools

    strings: list[str | None] = []
    memo: dict[int, str | None] = {}
    found = []
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif op.name == "MEMOIZE":
            memo[len(memo)] = strings[-1] if strings else None
        elif op.name in ("BINGET", "LONG_BINGET"):
            strings.append(memo.get(arg))
        elif op.name == "STACK_GLOBAL":
            found.append((strings[-2], strings[-1]))
    return found


def test_each_megatron_actor_imports_the_compatibility_module_before_skyrls_worker(monkeypatch):
    """In a Ray actor the worker class is unpickled: the module its first base comes from is imported first, and
    that module installs the names before SkyRL's worker module (whose wrapper imports them) is imported. Read from
    the pickle Ray makes of each actor class (Ray's cloudpickle), with SkyRL's Megatron worker module stood in (it
    imports Transformer Engine, which needs CUDA)."""
    import types

    from ray import cloudpickle

    worker = "skyrl.backends.skyrl_train.workers.megatron.megatron_worker"
    stand_in = types.ModuleType(worker)
    for name in ("MegatronPolicyWorkerBase", "MegatronRefWorkerBase", "MegatronCriticWorkerBase"):
        setattr(stand_in, name, type(name, (), {"__module__": worker}))
    monkeypatch.setitem(sys.modules, worker, stand_in)
    monkeypatch.setattr(importlib.import_module(worker.rpartition(".")[0]), "megatron_worker", stand_in, raising=False)
    from skyrl_glm.skyrl.workers import megatron

    for actor in megatron.megatron_workers():
        modules = [m for m, _ in _globals_in_load_order(cloudpickle.dumps(actor.__ray_metadata__.modified_class))]
        assert megatron.__name__ in modules and worker in modules
        assert modules.index(megatron.__name__) < modules.index(worker)
