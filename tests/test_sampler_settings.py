"""What the sampler needs to serve a GLM checkpoint on vLLM's GPU build, decided on CPU: router fields, engine
environment, one-line errors for a missing vLLM and for an engine failure without a message."""

from __future__ import annotations

import importlib.util
import json

import pytest

from skyrl_glm.models.glm5 import CHECKPOINT_DEFAULTS
from skyrl_glm.models.tiny import make_tiny
from skyrl_glm.plugins import registry
from skyrl_glm.usage import UsageError

GLM5 = registry().model("glm-5.3")


def test_tiny_glm5_is_served_with_glm_routing_and_a_deepgemm_indexer(tmp_path) -> None:
    config = json.loads((make_tiny(GLM5, tmp_path / "m") / "config.json").read_text())
    assert {k: config[k] for k in CHECKPOINT_DEFAULTS} == CHECKPOINT_DEFAULTS
    # vLLM 0.30's DeepGEMM indexer asserts 32 or 64 heads at the engine's first forward (16 passed on 0.26)
    assert config["index_n_heads"] in (32, 64)


def test_router_fields_supplied_on_gpu_only_where_missing(tmp_path) -> None:
    model = make_tiny(GLM5, tmp_path / "m")
    assert GLM5.sampler_overrides(model, device="cuda", max_model_len=None) == {}
    path = model / "config.json"
    config = json.loads(path.read_text())
    del config["topk_method"]
    del config["indexer_rope_interleave"]  # HF ropes the indexer interleaved; vLLM's default is the half split
    config["scoring_func"] = "softmax"  # HF routes with sigmoid whatever the file says: vLLM must too
    path.write_text(json.dumps(config))
    assert GLM5.sampler_overrides(model, device="cuda", max_model_len=None) == {"hf_overrides": CHECKPOINT_DEFAULTS}


def test_a_checkpoint_without_the_indexer_rope_field_reads_the_modeling_value(tmp_path) -> None:
    """Megatron-Bridge's GLM-5 bridge reads ``indexer_rope_interleave`` bare: a checkpoint saved by transformers
    lacks it. Supplied, it reads True (what HF's modeling does); a checkpoint's own value still wins."""
    from transformers import CONFIG_MAPPING, AutoConfig

    config_class = CONFIG_MAPPING[GLM5.hf_model_type]
    shipped = set(vars(config_class))
    model = make_tiny(GLM5, tmp_path / "m")
    path = model / "config.json"
    config = json.loads(path.read_text())
    del config["indexer_rope_interleave"]
    path.write_text(json.dumps(config))
    assert not hasattr(AutoConfig.from_pretrained(model), "indexer_rope_interleave")
    try:
        GLM5.supply_defaults()
        assert AutoConfig.from_pretrained(model).indexer_rope_interleave is True
        config["indexer_rope_interleave"] = False
        path.write_text(json.dumps(config))
        assert AutoConfig.from_pretrained(model).indexer_rope_interleave is False
    finally:  # the class as transformers ships it, for the tests after this one
        for name in set(vars(config_class)) - shipped:
            delattr(config_class, name)


def test_flashinfer_absent_turns_off_its_sampler(monkeypatch) -> None:
    from skyrl_glm.sync.vllm.engine import apply_engine_environment, engine_environment

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flashinfer" else real(name, *a))
    assert engine_environment()["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "1")
    apply_engine_environment()
    import os

    assert os.environ["VLLM_USE_FLASHINFER_SAMPLER"] == "1"  # a value the user set wins
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flashinfer" else None)
    assert "VLLM_USE_FLASHINFER_SAMPLER" not in engine_environment()


def test_missing_vllm_is_one_line_before_any_work(monkeypatch) -> None:
    from skyrl_glm.check.runner import CheckOptions, prepare

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(UsageError, match="vLLM is not installed"):
        prepare(CheckOptions())


def test_an_error_without_a_message_says_where_it_was_raised() -> None:
    from skyrl_glm.sync.update import describe_error

    def loader() -> None:
        raise AssertionError  # as a bare assert in vLLM's set_lora does (pytest would rewrite a real one)

    try:
        try:
            loader()
        except AssertionError as inner:
            raise RuntimeError("vLLM could not load the adapter") from inner
    except RuntimeError as e:
        text = describe_error(e)
    assert text.startswith("RuntimeError: vLLM could not load the adapter <- AssertionError at ")
    assert "test_sampler_settings.py:" in text


def test_gpu_share_takes_a_share_and_refuses_the_rest() -> None:
    from skyrl_glm.sync.vllm.engine_env import gpu_share

    assert gpu_share("0.25") == 0.25
    for bad in ("0", "-0.1", "1.5", "nan", "inf", "half"):
        with pytest.raises(ValueError, match="SKYRL_GLM_GPU_MEMORY_UTILIZATION"):
            gpu_share(bad)


def test_kv_cache_size_takes_gib_and_refuses_the_rest() -> None:
    from skyrl_glm.sync.vllm.engine_env import kv_cache_bytes

    assert kv_cache_bytes("2") == 2 * 2**30
    assert kv_cache_bytes("0.5") == 2**29
    for bad in ("0", "-1", "2000", "nan", "two"):
        with pytest.raises(ValueError, match="SKYRL_GLM_KV_CACHE_GIB"):
            kv_cache_bytes(bad)


def test_the_slot_replay_switch_takes_1_or_0_and_a_check_refuses_the_rest_in_one_line(monkeypatch) -> None:
    from skyrl_glm.check.runner import check_device
    from skyrl_glm.sync.vllm.engine_env import slot_replay_on

    assert slot_replay_on(None) and slot_replay_on("1") and not slot_replay_on("0")
    for bad in ("off", "false", "2", " 0"):
        with pytest.raises(ValueError, match="SKYRL_GLM_SLOT_REPLAY"):
            slot_replay_on(bad)
    monkeypatch.setenv("SKYRL_GLM_SLOT_REPLAY", "off")
    with pytest.raises(UsageError, match=r"^SKYRL_GLM_SLOT_REPLAY='off': 1 \(the slot replay, the default\) or 0"):
        check_device("cpu")  # before any engine starts


def test_a_megatron_worker_supplies_the_defaults_before_bridge_reads_the_config(tmp_path) -> None:
    """The mixin SkyRL's Megatron workers get runs before the worker's own ``init_model`` (where Bridge reads the
    config), and reads no path itself (a hub id has no config.json on the host yet)."""
    from transformers import CONFIG_MAPPING, AutoConfig

    from skyrl_glm.skyrl.workers.megatron import CheckpointDefaults

    class Worker:  # stands in for SkyRL's worker: what Bridge's GLM-5 bridge reads
        def init_model(self, model_path, *args, **kwargs):
            return AutoConfig.from_pretrained(model_path).indexer_rope_interleave

    config_class = CONFIG_MAPPING[GLM5.hf_model_type]
    shipped = set(vars(config_class))
    model = make_tiny(GLM5, tmp_path / "m")
    path = model / "config.json"
    config = json.loads(path.read_text())
    del config["indexer_rope_interleave"]
    path.write_text(json.dumps(config))
    try:
        assert type("W", (CheckpointDefaults, Worker), {})().init_model(str(model)) is True
    finally:  # the class as transformers ships it, for the tests after this one
        for name in set(vars(config_class)) - shipped:
            delattr(config_class, name)
