"""vLLM's LoRA name parser kept per name (``skyrl_glm.sync.vllm.lora_names``): the same answers as vLLM's own, for
every kind of name, a refused name refused every time, a weights mapper passed through, and vLLM's loader building
the same adapter with it installed."""

from __future__ import annotations

import pytest
import torch
from vllm.lora import lora_model, utils
from vllm.lora.peft_helper import PEFTHelper
from vllm.model_executor.models.utils import WeightsMapper

from skyrl_glm.sync.vllm import lora_names

NAMES = [
    "base_model.model.model.layers.3.mlp.experts.17.gate_proj.lora_A.weight",
    "base_model.model.model.layers.3.mlp.experts.17.gate_proj.lora_B.weight",
    "base_model.model.model.layers.0.self_attn.q_b_proj.lora_A.weight",
    "model.layers.0.self_attn.o_proj.lora_B.weight",
    "base_model.model.model.embed_tokens.lora_embedding_A",
    "base_model.model.classifier.weight",
]
REFUSED = ["base_model.model.model.layers.0.self_attn.q_b_proj.weight", "no_dots"]


@pytest.fixture
def vllm_parse(monkeypatch):
    """vLLM's own parser, put back in both modules after the test (install() replaces it process-wide)."""
    import inspect

    original = inspect.unwrap(utils.parse_fine_tuned_lora_name)  # an engine in this process may have installed it
    monkeypatch.setattr(utils, "parse_fine_tuned_lora_name", original)
    monkeypatch.setattr(lora_model, "parse_fine_tuned_lora_name", original)
    return original


def test_kept_answers_are_vllms_and_refusals_are_never_kept(vllm_parse) -> None:
    parse = lora_names.kept(vllm_parse)
    for _ in range(2):  # first call parses, second reads what was kept
        assert [parse(n) for n in NAMES] == [vllm_parse(n) for n in NAMES]
        for name in REFUSED:
            with pytest.raises(ValueError, match="unsupported LoRA weight"):
                parse(name)
    assert set(getattr(parse, lora_names._ON)) == set(NAMES)


def test_a_weights_mapper_is_passed_through_and_nothing_is_kept(vllm_parse) -> None:
    parse = lora_names.kept(vllm_parse)
    mapper = WeightsMapper(orig_to_new_prefix={"model.": "language_model.model."})
    assert parse(NAMES[2], mapper) == vllm_parse(NAMES[2], mapper) != vllm_parse(NAMES[2])
    assert not getattr(parse, lora_names._ON)


def test_the_kept_names_are_bounded(vllm_parse, monkeypatch) -> None:
    monkeypatch.setattr(lora_names, "MAX_KEPT", 3)
    parse = lora_names.kept(vllm_parse)
    assert [parse(n) for n in NAMES[:4]] == [vllm_parse(n) for n in NAMES[:4]]
    assert len(getattr(parse, lora_names._ON)) == 1  # cleared when full, then the fourth kept


def test_vllms_loader_builds_the_same_adapter_with_the_kept_parser(vllm_parse) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for e in range(4):
        for proj, shape_a, shape_b in (("gate_proj", (2, 8), (6, 2)), ("down_proj", (2, 6), (8, 2))):
            stem = f"base_model.model.model.layers.1.mlp.experts.{e}.{proj}"
            tensors[f"{stem}.lora_A.weight"] = torch.randn(shape_a, generator=g)
            tensors[f"{stem}.lora_B.weight"] = torch.randn(shape_b, generator=g)
    helper = PEFTHelper.from_dict({"r": 2, "lora_alpha": 2, "target_modules": ["gate_proj", "down_proj"]})

    def load():
        return lora_model.LoRAModel.from_lora_tensors(1, tensors, helper, device="cpu", dtype=torch.float32)

    want = load()
    lora_names.install()
    assert utils.parse_fine_tuned_lora_name is lora_model.parse_fine_tuned_lora_name is not vllm_parse
    for _ in range(2):
        got = load()
        assert list(got.loras) == list(want.loras)
        for name, w in want.loras.items():
            assert torch.equal(got.loras[name].lora_a, w.lora_a) and torch.equal(got.loras[name].lora_b, w.lora_b)
    assert len(getattr(utils.parse_fine_tuned_lora_name, lora_names._ON)) == len(tensors)
