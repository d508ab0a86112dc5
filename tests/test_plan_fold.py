"""The plan's alpha fold, in place on the packed stream, is SkyRL 0.4's ``fold_lora_alpha_for_vllm`` bit for bit."""

from __future__ import annotations

import pytest
import torch
from skyrl.backends.skyrl_train.distributed.megatron.lora_export import fold_lora_alpha_for_vllm

from skyrl_glm.sync.plan import build_plan

R = 8


def b_name(i: int) -> str:
    return f"base_model.model.model.layers.{i}.self_attn.o_proj.lora_B.weight"


def _adapter() -> dict[str, torch.Tensor]:
    """Factors of three dtypes and odd sizes, values spread over many exponents (large and small)."""
    gen = torch.Generator().manual_seed(0)
    out = {}
    for i, (dtype, width) in enumerate(
        [(torch.bfloat16, 37), (torch.float16, 5), (torch.float32, 64), (torch.bfloat16, 3)]
    ):
        scale = torch.logspace(-6, 3, width * R).reshape(width, R)
        out[b_name(i).replace("lora_B", "lora_A")] = torch.randn(R, width, generator=gen).to(dtype)
        out[b_name(i)] = (torch.randn(width, R, generator=gen) * scale).to(dtype)
    return out


@pytest.mark.parametrize("alpha", [16.0, 6.0, 13.6], ids=["x2", "x0.75", "x1.7"])
def test_the_in_place_fold_is_skyrls_bit_for_bit(alpha: float) -> None:
    adapter = _adapter()
    plan = build_plan(adapter, adapter_config={"r": R, "lora_alpha": alpha}, lora_name="a", version=1)
    sent = dict(zip((e.name for e in plan.manifest.tensors), plan.tensors, strict=True))
    want = fold_lora_alpha_for_vllm(adapter, config_rank=R, alpha=alpha)
    assert sent.keys() == want.keys()
    for name, t in want.items():
        assert sent[name].dtype == t.dtype and torch.equal(sent[name].view(torch.uint8), t.view(torch.uint8)), name
    if alpha == 13.6:  # the scale rounded to the tensor's dtype first (one way to get it wrong) is seen here
        b = adapter[b_name(0)]
        assert not torch.equal(b * torch.tensor(alpha / R, dtype=b.dtype), want[b_name(0)])
