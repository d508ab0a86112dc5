"""Dedup must not trust a storage address after it dropped the tensor that lived there.

An exporter that hands out copies frees each duplicate once the plan has compared it; the allocator may then
give the same address (same shape, stride, offset, dtype) to the next exported tensor with another value.
Simulated here by writing a new value into a dropped duplicate and yielding it again under another name, in a
later slice of the stream (dedup holds every tensor of the slice it works on, so within one the exporter cannot
free any).
"""

from __future__ import annotations

import torch

from skyrl_glm.sync.plan import _CHUNK, _SLICE, deduplicate


def test_reused_address_of_a_dropped_duplicate_is_not_aliased():
    g = torch.Generator().manual_seed(0)
    shared = torch.randn(4, 8, generator=g)
    copies = [shared.clone() for _ in range(_CHUNK)]  # one chunk: all but the first become aliases

    def stream():
        for e, t in enumerate(copies):
            yield f"model.layers.1.mlp.experts.{e}.gate_proj.lora_A.weight", t
        for i in range(_SLICE - _CHUNK):  # the rest of the slice: distinct tensors outside the candidate group
            yield f"model.embed.{i}.lora_A.weight", torch.zeros(1)
        reused = copies[-1]  # dropped by dedup as a duplicate of expert 0
        reused.copy_(torch.randn(4, 8, generator=g))  # "freed and reallocated" with a new value
        yield "model.layers.1.mlp.experts.999.up_proj.lora_A.weight", reused

    d = deduplicate(stream())
    new = "model.layers.1.mlp.experts.999.up_proj.lora_A.weight"
    assert new in d.unique, "a new value at a reused address was aliased to a dropped tensor"
    assert torch.equal(d.unique[new], copies[-1])
    for e in range(1, _CHUNK - 1):
        assert d.aliases[f"model.layers.1.mlp.experts.{e}.gate_proj.lora_A.weight"] == (
            "model.layers.1.mlp.experts.0.gate_proj.lora_A.weight"
        )


def test_fused_lora_a_copies_dedup_across_projections():
    """Bridge exports fc1's linear_in under gate_proj and up_proj: copies of it are one sent tensor."""
    a = torch.randn(4, 8)
    d = deduplicate(
        [
            ("model.layers.0.mlp.gate_proj.lora_A.weight", a.clone()),
            ("model.layers.0.mlp.up_proj.lora_A.weight", a.clone()),
            ("model.layers.0.mlp.down_proj.lora_A.weight", torch.randn(4, 8)),
        ]
    )
    assert len(d.unique) == 2
    assert d.aliases == {"model.layers.0.mlp.up_proj.lora_A.weight": "model.layers.0.mlp.gate_proj.lora_A.weight"}
