"""Foundation: entry-point plugin host (third-party plugin too), CLI, deterministic tiny checkpoints."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from skyrl_glm.plugins import build_registry, plugin_manager, registry


def test_builtin_support_arrives_through_the_entry_point():
    eps = {ep.name: ep.value for ep in entry_points(group="skyrl_glm")}
    assert eps["glm"] == "skyrl_glm.models.builtin"
    reg = registry()
    assert {"glm-5.3", "glm-5.3-flash", "glm-4.5"} <= set(reg.models)
    assert reg.model_for_type("glm_moe_dsa").name == "glm-5.3"
    assert {"cpu", "nccl", "ipc"} <= set(reg.transports)
    assert "hf" in reg.trainers and "vllm" in reg.samplers
    from skyrl_glm.sync.transports.shm import SharedMemoryTransport

    assert reg.transport("cpu") is SharedMemoryTransport  # registered by reference, imported on first use


def test_a_misspelled_hook_is_an_error():
    from skyrl_glm.plugins import RegistryError, hookimpl

    class Typo:
        @hookimpl
        def skyrl_glm_transport(self):  # the hook is skyrl_glm_transports
            return []

    with pytest.raises(RegistryError, match="skyrl_glm_transport"):
        plugin_manager([Typo()])


def test_a_third_party_package_adds_a_model_family(tmp_path, monkeypatch):
    """A tiny installed distribution (dist-info with entry_points.txt) registers a family the same way."""
    (tmp_path / "acme_glm.py").write_text(
        textwrap.dedent("""
        from skyrl_glm.models.base import LoraPolicy, ModelFamily
        from skyrl_glm.models.glm4 import tiny_config
        from skyrl_glm.models.targets import gqa_attention
        from skyrl_glm.plugins import hookimpl

        @hookimpl
        def skyrl_glm_model_families():
            return [ModelFamily(name="acme-glm", hf_model_type="acme", summary="third party", facts={},
                                lora=LoraPolicy(targets=tuple(gqa_attention())), tiny_config=tiny_config)]
    """)
    )
    dist = tmp_path / "acme_glm-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-glm\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[skyrl_glm]\nacme = acme_glm\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = build_registry(plugin_manager())
    assert reg.model("acme-glm").summary == "third party"
    assert "glm-5.3" in reg.models  # the built-ins are still there
    with pytest.raises(LookupError, match="acme-glm"):
        registry().model("acme-glm")  # the cached process registry predates the install


ACME = """
from toy_lora import ToySampler, ToyTrainer

from skyrl_glm.models.base import LoraPolicy, ModelFamily
from skyrl_glm.models.glm4 import tiny_config
from skyrl_glm.models.targets import gqa_attention, moe_mlp
from skyrl_glm.plugins import hookimpl

MODULE = "0.self_attn.q_proj"


@hookimpl
def skyrl_glm_model_families():
    return [ModelFamily(name="acme-glm", hf_model_type="acme_moe", summary="third party", facts={},
                        lora=LoraPolicy(targets=tuple(gqa_attention() + moe_mlp())), tiny_config=tiny_config,
                        full_config=tiny_config, vllm_cpu_dtype="float32")]


@hookimpl
def skyrl_glm_trainers():
    return [("acme-toy", lambda model_dir, **kw: ToyTrainer(MODULE))]


@hookimpl
def skyrl_glm_samplers():
    return [("acme-toy", lambda model_dir, **kw: ToySampler(MODULE))]
"""


def test_an_entry_point_plugin_reaches_sizes_bench_and_the_check(tmp_path):
    """Installed like any third-party package, a family (plus a toy trainer and sampler, standing in for engines
    too slow to start here) is usable by name in every command: the check runs its five steps through the real
    plan -> shared-memory transport -> receiver path on that family's tiny checkpoint."""
    (tmp_path / "acme_glm.py").write_text(ACME)
    dist = tmp_path / "acme_glm-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-glm\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[skyrl_glm]\nacme = acme_glm\n")
    import json
    import os

    here = str(Path(__file__).parent)  # the plugin's toy trainer and sampler: tests/toy_lora.py
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), here, os.environ.get("PYTHONPATH", "")])}

    def run(*args: str, expect: int = 0) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "skyrl_glm.cli", *args], capture_output=True, text=True, env=env, cwd=tmp_path
        )
        assert out.returncode == expect, out.stdout + out.stderr
        return out.stdout

    assert "acme-glm" in run("models")
    assert "acme-glm (full)" in run("sizes", "acme-glm", "--rank", "4")
    report = tmp_path / "bench.json"
    run("bench", "sync", "--model", "acme-glm", "--rank", "4", "--warmup", "0", "--no-disk", "--json", str(report))
    bench = json.loads(report.read_text())
    assert bench["adapter"]["model"] == "acme-glm" and bench["paths"]["ours"]["bit_exact"]
    check = tmp_path / "check.json"
    toy = ["check", "--model", "acme-glm", "--trainer", "acme-toy", "--sampler", "acme-toy"]
    run(*toy, "--json", str(check))
    steps = json.loads(check.read_text())
    assert steps["verdict"] == "PASS" and steps["info"]["model"] == "acme-glm", steps
    run(*toy, "--fault", "no-publish", "--json", str(check), expect=1)  # fails when the handoff is skipped
    failed = [st["step"] for st in json.loads(check.read_text())["steps"] if not st["passed"]]
    assert failed == [5], failed


def test_duplicate_names_are_refused():

    pm = plugin_manager()
    from skyrl_glm.models import glm5
    from skyrl_glm.plugins import hookimpl

    class Clash:
        @hookimpl
        def skyrl_glm_model_families(self):
            import dataclasses

            return [dataclasses.replace(glm5.FAMILY, summary="impostor")]

    pm.register(Clash())
    with pytest.raises(LookupError, match="two plugins register the model family 'glm-5.3'"):
        build_registry(pm)


def test_cli_models_lists_the_glm_families():
    out = subprocess.run(
        [sys.executable, "-m", "skyrl_glm.cli", "models"],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "250", "PATH": ""},
    ).stdout
    assert "glm-5.3 " in out and "glm-5.3-flash" in out and "glm_moe_dsa" in out and "glm5_next" in out


def _digest(path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("model", ["glm-5.3", "glm-5.3-flash", "glm-4.5"])
def test_tiny_make_is_deterministic_and_loads(model, tmp_path):
    # three separate processes (seed 3 twice, seed 4 once), run side by side: each is mostly its imports
    makes = [
        subprocess.Popen(
            [sys.executable, "-m", "skyrl_glm.cli", "tiny", "make", model, str(tmp_path / d), "--seed", seed],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for d, seed in (("a", "3"), ("b", "3"), ("c", "4"))
    ]
    for make in makes:
        out, _ = make.communicate(timeout=600)
        assert make.returncode == 0, out.decode()[-3000:]
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    other = tmp_path / "c"
    assert _digest(other)["model.safetensors"] != _digest(tmp_path / "a")["model.safetensors"]

    import torch
    from transformers import AutoConfig, AutoTokenizer

    family = registry().model(model)
    config = AutoConfig.from_pretrained(tmp_path / "a")
    assert config.model_type == family.hf_model_type
    tok = AutoTokenizer.from_pretrained(tmp_path / "a")
    ids = tok.apply_chat_template([{"role": "user", "content": "Find x."}], add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tok.decode(ids).startswith("[gMASK]<sop><|user|>")
    model_obj = type(family.build_model(config)).from_pretrained(tmp_path / "a")
    with torch.no_grad():
        out = model_obj(torch.tensor([ids[:8]]))
    assert torch.isfinite(out.logits).all()


def test_cli_sizes_reports_the_full_glm5_adapter():
    out = subprocess.run(
        [sys.executable, "-m", "skyrl_glm.cli", "sizes", "glm-5.3"], capture_output=True, text=True, check=True
    ).stdout
    assert "116,292" in out and "1,389" in out  # public vs unique tensors at rank 32 (Bridge export, shared experts)
