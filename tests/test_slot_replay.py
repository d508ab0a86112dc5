"""The slot-write replay (:mod:`skyrl_glm.sync.vllm.slot_replay`): vLLM's own activation recorded once per adapter
structure, replayed after; on a real engine it leaves vLLM's exact slot contents, the check passes through it, and a
replay broken on purpose is caught by the check and by the comparison with vLLM's writes.

The first tests drive the recorder on bare tensors standing in for one LoRA module's slots (what vLLM's
``set_lora`` does to them is a few tensor ops, written out here); the last runs vLLM's CPU build."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from skyrl_glm.sync.vllm.slot_replay import (
    NotReplayable,
    Recording,
    SlotReplay,
    _held,
    _Recorder,
    dense,
    same_bytes,
    slot_tensors,
)


def _record(index: int, factors: list[torch.Tensor], writes, slots: torch.Tensor, **more: torch.Tensor) -> Recording:
    recorder = _Recorder(slot_tensors({"m": SimpleNamespace(lora_a_stacked=(slots,), **more)}, 2), factors, index)
    with recorder:
        writes()
    return recorder.recording()


def test_a_recorded_activation_replays_at_any_index_on_new_factors():
    slots, enabled = torch.full((3, 2, 6), 7.0), torch.zeros(4, dtype=torch.int)
    a = torch.randn(2, 4)

    def set_lora():  # vLLM's shape of it: reset the index, mark it off, copy the factor into its corner, mark it on
        slots[1] = 0
        enabled[1] = 0
        slots[1, :, :4].copy_(a, non_blocking=True)
        enabled[1] = 1

    recording = _record(1, [a], set_lora, slots, adapter_enabled=enabled)
    assert (len(recording.zeros), len(recording.constants), len(recording.copies)) == (1, 1, 1)  # "off" superseded
    assert torch.equal(slots[1, :, :4], a)
    b = torch.randn(2, 4)
    recording.replay(2, [b])
    expected = torch.zeros(2, 6)
    expected[:, :4] = b
    assert torch.equal(slots[2], expected) and enabled.tolist() == [0, 1, 1, 0]
    assert torch.equal(slots[0], torch.full((2, 6), 7.0))  # other indices untouched


def test_a_transposed_view_of_a_factor_is_replayed_as_that_view():
    slots = torch.zeros(2, 4, 2)
    a = torch.randn(2, 4)
    recording = _record(0, [a], lambda: slots[0].copy_(a.T), slots)
    b = torch.randn(2, 4)
    recording.replay(1, [b])
    assert torch.equal(slots[1], b.T)


def test_a_zero_fill_its_copies_overwrite_whole_is_dropped_and_the_replay_still_matches():
    slots = torch.full((2, 4, 6), 7.0)
    a, b = torch.randn(2, 6), torch.randn(2, 6)

    def set_lora():  # the block zeroed, then both of its halves copied over it: nothing of the zero fill is left
        slots[0] = 0
        slots[0, :2].copy_(a)
        slots[0, 2:].copy_(b)

    recording = _record(0, [a, b], set_lora, slots)
    assert (len(recording.zeros), len(recording.copies)) == (0, 2)
    c, d = torch.randn(2, 6), torch.randn(2, 6)
    recording.replay(1, [c, d])
    assert torch.equal(slots[1], torch.cat([c, d]))

    f = torch.randn(4, 3)

    def half_covered():  # a copy over part of the block (a strided one): the zero fill stays
        slots[0] = 0
        slots[0, :, :3].copy_(f)

    assert len(_record(0, [f], half_covered, slots).zeros) == 1


def test_copies_are_cut_into_runs_each_one_foreach_call_of_one_kind():
    slots, other = torch.zeros(2, 3, 4), torch.zeros(2, 4, 2)
    a, t, h = torch.randn(3, 4), torch.randn(2, 4), torch.randn(3, 4).half()

    def set_lora():  # dense from dense, then transposed (torch's slow path)
        slots[0].copy_(a)
        other[0].copy_(t.T)

    recorder = _Recorder(slot_tensors({"m": SimpleNamespace(a=(slots,), b=(other,))}, 2), [a, t, h], 0)
    with recorder:
        set_lora()
        slots[0].copy_(h)  # the same place from an fp16 factor: replaces the first write
    recording = recorder.recording()
    # one run per kind, in the order of the writes: the transposed copy, then the fp16 one
    assert [(r.start, r.stop) for r in recording.copy_runs] == [(0, 1), (1, 2)]
    assert [factor for _, factor, _ in recording.copies] == [1, 2]
    a2, t2, h2 = torch.randn(3, 4), torch.randn(2, 4), torch.randn(3, 4).half()
    recording.replay(1, [a2, t2, h2])
    assert torch.equal(slots[1], h2.float()) and torch.equal(other[1], t2.T)


@pytest.mark.parametrize(
    ("size", "stride", "expected"),
    [((3, 4), (4, 1), True), ((4, 3), (1, 4), True), ((1, 3), (99, 1), True), ((3, 4), (8, 1), False),
     ((3, 4), (0, 1), False), ((2, 2), (1, 1), False)],
)  # fmt: skip
def test_dense_is_torchs_non_overlapping_and_dense(size, stride, expected):
    assert dense(size, stride) is expected
    probe = torch.empty(64).as_strided(size, stride)
    assert torch._prims_common.is_non_overlapping_and_dense_or_false(probe) is expected


@pytest.mark.parametrize(
    ("writes", "why"),
    [
        (lambda s, a, o: s[0, :, :4].copy_(a * 2), "neither a view of a factor nor a constant"),
        (lambda s, a, o: o.copy_(a), "outside the LoRA slots"),
        (lambda s, a, o: s[1, :, :4].copy_(a), "outside the activated index's block"),
        (lambda s, a, o: (s[0, :, :4].copy_(a), s[0, 0, :4].copy_(a[1])), "overlapping writes"),
        (lambda s, a, o: (s[0, :, :4].copy_(a), s[0].fill_(0)), "overlapping writes"),
        (lambda s, a, o: s[0].add_(1), "writes in place"),
    ],
)
def test_writes_a_batched_replay_could_not_repeat_are_refused(writes, why):
    slots, a, other = torch.zeros(2, 2, 6), torch.randn(2, 4), torch.zeros(2, 4)
    with pytest.raises(NotReplayable, match=why):
        _record(0, [a], lambda: writes(slots, a, other), slots)


def test_the_check_holds_the_blocks_in_one_kept_host_buffer_and_compares_them_a_piece_at_a_time():
    """``matches_vllm``'s two halves: the blocks' bytes held in host memory the replay state keeps from one check to
    the next, and compared with the rewritten blocks in pieces smaller than a block, a byte off anywhere caught."""
    g = torch.Generator().manual_seed(0)
    blocks = [torch.randn(100, generator=g).to(torch.bfloat16), torch.randn(37, generator=g)]
    replay = SlotReplay()
    held = _held(replay, blocks)
    memory = replay.held
    assert same_bytes(held, blocks, piece=64) and same_bytes(held, blocks)
    assert _held(replay, blocks[:1])[0].data_ptr() == memory.data_ptr() and replay.held is memory
    held = _held(replay, blocks)
    for block, at in ((0, 0), (0, 199), (1, 147)):  # first byte, last byte of a block, a byte in a later piece
        raw = blocks[block].view(torch.uint8)
        raw[at] ^= 1
        assert not same_bytes(held, blocks, piece=64), (block, at)
        raw[at] ^= 1
    assert same_bytes(held, blocks, piece=64)
    assert not same_bytes(held, [blocks[0], blocks[1][:36]])  # a block of another size


def test_on_vllm_the_replay_matches_its_own_writes_and_the_check_catches_a_broken_one():
    """Four five-step checks on one tiny GLM-4.5 engine (vLLM's CPU build, in a process of its own so its replay can be
    broken there): the first records its two adapter structures (B == 0, then B perturbed), the second replays both
    (their models cloned from the first check's: load_memo) and passes, so does the third (its versions received into
    the first's staging memory), the fourth replays zeros where the factors go from its step 4 on (a replay that only
    skipped the copies would leave the slot index's earlier contents: a version perturbed like this one, so the check
    could not tell): the check fails at step 5, and the serving slots differ from what vLLM's own loop writes. The
    layout bench's switch clock runs on the same worker (a request's steps timed)."""
    run = Path(__file__).with_name("slot_replay_run.py")
    done = subprocess.run([sys.executable, str(run)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["first_passed"] and out["after_first"]["matches_vllm"]
    assert (out["after_first"]["recorded"], out["after_first"]["replayed"]) == (2, 0)
    assert out["replayed_passed"] and out["after_replayed"]["matches_vllm"]
    assert (out["after_replayed"]["recorded"], out["after_replayed"]["replayed"]) == (2, 2)
    assert out["after_replayed"]["refused"] == 0
    loads = {k: out["after_replayed"][k] for k in ("loaded", "cloned")}
    assert loads == {"loaded": 2, "cloned": 2}  # the second check's versions' LoRAModels cloned from the first's
    # every load of a staged update keyed by the receiver's word on its structure, none by reading its tensors
    assert out["after_replayed"]["vouched"] == 4
    # the receiver's staging memory: the first two checks' four versions each made theirs; the third's two land in
    # the first's (gone by then: sync.staging_pool), and it passes
    assert (out["after_replayed"]["pool_made"], out["after_replayed"]["pool_reused"]) == (4, 0)
    assert out["pooled_passed"] and (out["after_pooled"]["pool_made"], out["after_pooled"]["pool_reused"]) == (4, 2)
    assert out["after_pooled"]["matches_vllm"]
    assert not out["broken_passed"] and out["broken_failed_at"] == 5
    assert out["after_broken"]["replayed"] == 6 and not out["after_broken"]["matches_vllm"]
    # the layout bench's switch clock on vLLM's own worker: the request's steps timed, nothing without one
    # (and the manager's add_adapter, which the switch calls for each adapter of the step: here the serving one)
    switch = out["switch_times"]
    for method in ("set_active_adapters", "add_adapter"):
        assert len(switch["after_request"][method]) >= 1 and all(0 < t < 5 for t in switch["after_request"][method])
    assert switch["after_none"] == {"set_active_adapters": [], "add_adapter": []}
    assert switch["stopped"] == {"set_active_adapters": [], "add_adapter": []}
    assert 0 < out["rpc_round_trip_s"] < 5  # the bench's no-op worker call went through, signed
    # the layout bench's worker profile: written by the worker, holding the step's LoRA switch; a second stop writes
    # nothing
    profiled = out["profiled"]
    assert (profiled["started"], profiled["written"], profiled["again"]) == (True, True, False)
    assert "set_active_adapters" in profiled["functions"]
    # the layout bench's decode kernel profile: it ran and stopped on the worker (no GPU: no kernel time); a stop
    # without a start reads None
    kernels = out["kernels"]
    assert kernels["started"] is None and kernels["again"] is None
    assert kernels["stopped"] == {"gpu_s": 0, "kernel_calls": 0, "top": []}
