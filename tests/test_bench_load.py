"""``skyrl-glm bench load``: a real vLLM (CPU build) engine takes every in-memory and disk update; the report has
the load stage of both paths. Bad options: one line, exit 2, before any engine starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "skyrl_glm.cli", "bench", "load", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--rounds", "0"], "--rounds must be a positive integer"), (["--warmup", "-1"], "--warmup must be >= 0")],
)
def test_bad_options_are_one_line(args, message):
    got = _cli(*args, timeout=60)
    assert got.returncode == 2
    assert got.stderr.strip().splitlines() == [f"skyrl-glm bench load: error: {message}, got {args[1]}"]


@pytest.mark.vllm
@pytest.mark.slow
def test_load_stage_of_both_paths_on_a_real_engine(tmp_path):
    """On the tiny checkpoint deepened by one layer (``--layers``): the engine serves the deeper model."""
    out = tmp_path / "load.json"
    got = _cli("--model", "glm-4.5", "--layers", "3", "--rounds", "2", "--warmup", "1", "--json", str(out))
    assert got.returncode == 0, got.stderr[-2000:]
    report = json.loads(out.read_text())
    assert len(report["runs"]["memory"]) == len(report["runs"]["disk"]) == 3
    med = report["medians_s"]
    for path in ("memory", "disk"):
        assert 0 < med[path]["load_s"] < med[path]["total_s"]
    assert 0 < med["memory"]["receive_s"] and 0 < med["disk"]["write_s"]
    assert report["public_tensors"] > 0 and "vLLM load stage" in got.stdout
    assert report["layers"] == 3 and report["command"].endswith("--layers 3")


@pytest.mark.parametrize("model", ["glm-4.5", "glm-5.3"])
def test_a_deepened_tiny_config_keeps_the_architecture_s_per_layer_pattern(model):
    from skyrl_glm.models.tiny import deepened
    from skyrl_glm.plugins import registry

    family = registry().model(model)
    tiny, deep = family.tiny_config(), deepened(family.tiny_config(), 7)
    assert deep.num_hidden_layers == 7 and deep.first_k_dense_replace == tiny.first_k_dense_replace
    for name in ("mlp_layer_types", "layer_types", "indexer_types"):
        if isinstance(getattr(tiny, name, None), list):  # GLM-5.3's: remade for 7 layers, the first ones as before
            assert len(getattr(deep, name)) == 7 and getattr(deep, name)[:2] == getattr(tiny, name)[:2]
    assert deep.hidden_size == tiny.hidden_size and deep.n_routed_experts == tiny.n_routed_experts
