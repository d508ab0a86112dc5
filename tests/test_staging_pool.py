"""The receiver's kept staging memory (``sync.staging_pool``): a buffer is handed to a later update of its layout
only when nothing but the pool refers to it, and an update landing in one hands vLLM what a fresh receive does."""

from __future__ import annotations

import pytest
import torch

from skyrl_glm.sync import expert_layout as layouts
from skyrl_glm.sync.receiver import AdapterReceiver
from skyrl_glm.sync.staging_pool import KEPT, StagingPool
from tests.test_sync_caches import export, plan, receive


def _made(nbytes: int = 64) -> tuple[torch.Tensor, dict, dict]:
    staging = torch.zeros(nbytes, dtype=torch.uint8)
    sent = {"a": staging[:16].view(torch.float32), "b": staging[16:32].view(torch.float32)}
    return staging, sent, {"x": sent["a"], "y": sent["b"].unsqueeze(0), "z": sent["a"]}


def test_a_buffer_is_free_only_when_nothing_else_refers_to_it() -> None:
    pool = StagingPool()
    pool.keep(("k",), *_made())
    (kept,) = pool.kept
    assert kept.free()
    held = dict(kept.tensors)  # a staged copy of the mapping
    assert not kept.free() and pool.take(("k",)) is None
    del held
    one = kept.tensors["y"]  # one tensor, held alone
    assert not kept.free()
    del one
    derived = kept.sent["a"][1:]  # a view of its memory made elsewhere
    assert not kept.free()
    del derived
    assert pool.take(("k",)) is kept and pool.counts == {"reused": 1, "made": 1}


def test_only_views_are_kept_at_most_kept_per_layout_of_the_last_two() -> None:
    pool = StagingPool()
    staging, sent, tensors = _made()
    pool.keep(("copy",), staging, sent, {**tensors, "c": sent["a"].clone()})  # a computed tensor: not kept
    assert pool.kept == []
    for _ in range(KEPT + 1):
        pool.keep(("k",), *_made())
    assert len(pool.kept) == KEPT
    assert pool.take(("other",)) is None and len(pool.kept) == KEPT  # the last two layouts keep theirs
    assert pool.take(("third",)) is None and pool.kept == []  # free buffers of an older layout go


@pytest.mark.parametrize(("layout", "groups"), [(layouts.PER_EXPERT, 1), (layouts.SHARED_ALL, 1), ("grouped:2", 2)])
def test_an_update_lands_in_a_free_buffer_and_never_in_one_still_held(layout: str, groups: int) -> None:
    rx = AdapterReceiver(layout=layout)
    first = receive(plan(export(0, groups), 1, None, lora_name="p"), rx)
    name = next(iter(first.tensors))
    address, before = first.tensors[name].data_ptr(), first.tensors[name].clone()
    second = receive(plan(export(1, groups), 2, None, lora_name="p"), rx)  # the first still held: new memory
    assert second.tensors[name].data_ptr() != address
    assert torch.equal(first.tensors[name], before)  # and the first untouched
    del first
    p3 = plan(export(2, groups), 3, None, lora_name="p")
    third = receive(p3, rx)
    assert third.tensors[name].data_ptr() == address  # the first's memory, free now
    want = receive(p3, AdapterReceiver(layout=layout)).tensors
    assert list(third.tensors) == list(want)
    for n, t in want.items():
        got = third.tensors[n]
        assert got.shape == t.shape and got.stride() == t.stride() and torch.equal(got, t), n
    assert rx.pool.counts == {"reused": 1, "made": 2}


def test_a_torch_without_a_storage_use_count_keeps_nothing(monkeypatch) -> None:
    """Reuse is proven by the storage's use count: without it (another torch) nothing is kept, nothing reused."""
    from skyrl_glm.sync import staging_pool

    monkeypatch.setattr(staging_pool, "_STORAGE_USES", None)
    pool = StagingPool()
    pool.keep(("k",), *_made())
    assert pool.kept == [] and pool.take(("k",)) is None
