"""Activating an adapter version by replaying vLLM's own slot writes, recorded once per adapter structure.

vLLM activates an adapter by walking every LoRA module in Python (``reset_lora`` then ``set_lora``: slicing, a
zero fill and a copy per factor, one kernel launch each): the per-layer part of the load (about 0.85 ms per
full-width GLM-5.3 MoE layer on one H200, ~64 ms at 75 layers) on every update. An RL run loads one adapter
structure again and again (same modules, factor shapes and strides; new values), so the writes are the same each
time but for the source tensors and the slot index.

The first activation of a structure runs vLLM's loop under a :class:`~torch.utils._python_dispatch.TorchDispatchMode`
that records every write: into which LoRA slot tensor, where inside the slot's index block, and from which view of
which of the adapter's factors (or which constant). Later activations of that structure keep vLLM's bookkeeping
(which id sits in which slot) and skip only its per-module writes, replaying the recording instead, at whatever
slot index vLLM chose: zero fills, other constants and factor views in a few batched ``_foreach`` calls, each a run
of writes of one kind (:func:`runs`: torch's one-launch path takes a call only if all of it qualifies), and no zero
fill the copies overwrite whole. On one H200, a 75-layer engine: a one-layer adapter's load 8-12 ms, a 75-layer
one's 16-24 ms, against 22-29 and 50-65 ms with vLLM's loop in the same engines.

A recording is kept only if that replay provably leaves what vLLM's loop leaves: every write is a ``copy_``,
``fill_`` or ``zero_`` into a LoRA slot tensor's block at the activated index; a copied source is a view of a factor
(through view ops only) or a constant (nothing computed from a factor); no two copies overlap, and no constant is
written over an earlier copy (the replay writes constants first), an identical later write replacing an earlier
one. Anything else (a computed source, a write elsewhere, an unknown mutating op) leaves that structure on vLLM's
loop for the engine's life. The replay assumes what vLLM writes depends on the factors' shapes, strides and dtypes,
not their values (true of every ``set_lora`` in vLLM 0.30-0.32). Off with ``SKYRL_GLM_SLOT_REPLAY=0``
(:data:`~skyrl_glm.sync.vllm.engine_env.SLOT_REPLAY_ENV`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from skyrl_glm.sync.vllm.engine_env import SLOT_REPLAY_ENV, slot_replay_on
from skyrl_glm.sync.vllm.load_memo import clone_of, kinds_with_aliasing

log = logging.getLogger(__name__)

_STATE = "_skyrl_glm_slot_replay"  # on a LoRAModelManager: its SlotReplay
_SLOT_STORAGE = "_skyrl_glm_slot_storage"  # the grouped layouts' slot storage (shared_factors._STORAGE)
_WRITES = (torch.ops.aten.copy_.default, torch.ops.aten.fill_.Scalar, torch.ops.aten.fill_.Tensor)
_ZERO = torch.ops.aten.zero_.default


class NotReplayable(Exception):
    """Why a recorded activation cannot be replayed in batches (the structure keeps vLLM's loop)."""


@dataclass(frozen=True)
class Slot:
    """A LoRA slot tensor's storage: its base (any tensor on it), the storage offset of index 0 and the elements
    per index (the stride of its first dimension)."""

    base: torch.Tensor
    offset: int
    per_index: int


@dataclass(frozen=True)
class Place:
    """Where a write lands: ``size``/``stride`` at ``at`` elements into the slot's index block."""

    slot: Slot
    at: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def span(self) -> tuple[int, int]:
        return self.at, self.at + sum((n - 1) * s for n, s in zip(self.size, self.stride, strict=True)) + 1

    @property
    def dense(self) -> bool:
        return dense(self.size, self.stride)

    def view(self, index: int) -> torch.Tensor:
        return self.slot.base.as_strided(
            self.size, self.stride, self.slot.offset + index * self.slot.per_index + self.at
        )


@dataclass
class Recording:
    """One structure's writes, in replay order: constants (``zeros`` and ``constants``), then factor views
    (``copies``: the place, then the factor's position and the view's offset in it, shape and strides; a view that
    is the whole factor has none). ``zero_runs`` and ``copy_runs`` cut ``zeros`` and ``copies`` into slices that
    each take one ``_foreach`` call (:func:`runs`)."""

    zeros: list[Place] = field(default_factory=list)
    constants: list[tuple[Place, torch.Tensor]] = field(default_factory=list)
    copies: list[tuple[Place, int, tuple[int, tuple[int, ...], tuple[int, ...]] | None]] = field(default_factory=list)
    zero_runs: list[slice] = field(default_factory=list)
    copy_runs: list[slice] = field(default_factory=list)
    _places: dict[int, tuple[list[torch.Tensor], ...]] = field(default_factory=dict)

    def places(self, index: int) -> tuple[list[torch.Tensor], ...]:
        """The slot views written at ``index`` (zeros, constants, copies) and the constants' values, made once."""
        if index not in self._places:
            consts = [p.view(index) for p, _ in self.constants]
            self._places[index] = (
                [p.view(index) for p in self.zeros],
                consts,
                [v.expand(c.shape) for (_, v), c in zip(self.constants, consts, strict=True)],
                [p.view(index) for p, _, _ in self.copies],
            )
        return self._places[index]

    def replay(self, index: int, factors: list[torch.Tensor | None]) -> None:
        zeros, consts, values, dsts = self.places(index)
        for run in self.zero_runs:
            torch._foreach_zero_(zeros[run])
        if consts:
            torch._foreach_copy_(consts, values, non_blocking=True)
        if dsts:
            srcs = [
                factors[k]
                if view is None
                else factors[k].as_strided(view[1], view[2], factors[k].storage_offset() + view[0])  # type: ignore[union-attr]
                for _, k, view in self.copies
            ]
            for run in self.copy_runs:
                torch._foreach_copy_(dsts[run], srcs[run], non_blocking=True)


def dense(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether a view of these sizes and strides covers ``numel`` consecutive elements, each once (torch's
    non-overlapping and dense)."""
    expected = 1
    for n, s in sorted(((n, s) for n, s in zip(size, stride, strict=True) if n != 1), key=lambda d: d[1]):
        if s != expected:
            return False
        expected *= n
    return True


def runs(keys: list[Any]) -> tuple[list[int], list[slice]]:
    """An order of the writes with these keys (stable, equal keys together) and its slices of equal keys. torch's
    ``_foreach`` ops take one kernel launch per many tensors only if every tensor of the call is dense, of one
    dtype, and (copies) of its source's sizes and strides; one tensor off that path sends the whole call down the
    path of one launch per tensor. A key says which path a write can take (None: the slow one)."""
    groups: dict[Any, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    order, cuts, lo = [], [], 0
    for members in groups.values():
        order.extend(members)
        cuts.append(slice(lo, lo + len(members)))
        lo += len(members)
    return order, cuts


def _covered(zero: Place, copied: list[tuple[int, int]]) -> bool:
    """Whether a dense zero fill lies inside the union of the dense copies' spans (sorted) into its slot: the copies
    replace every element it zeroes (the replay writes zeros first), so it can go."""
    if not zero.dense:
        return False
    lo, hi = zero.span
    for a, b in copied:
        if a > lo:
            return False
        lo = max(lo, b)
        if lo >= hi:
            return True
    return False


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


class _Recorder(TorchDispatchMode):
    """Watches one activation at slot ``index``: each write's place and source, or why it cannot be replayed."""

    def __init__(self, slots: dict[int, Slot], factors: list[torch.Tensor | None], index: int) -> None:
        super().__init__()
        self.slots, self.index = slots, index
        self.origin: dict[int, int] = {id(f): k for k, f in reversed(list(enumerate(factors))) if f is not None}
        self.factors = factors
        self.keep: list[Any] = []  # tensors whose id() is in origin/tainted stay alive while recording
        self.tainted: set[int] = set()
        self.writes: list[tuple[Place, Any]] = []  # (place, ("const", 0-d value) | ("copy", factor, view or None))
        self.refused: str | None = None

    def place(self, dst: torch.Tensor) -> Place:
        slot = self.slots.get(dst.untyped_storage().data_ptr())
        if slot is None:
            raise NotReplayable(f"a write outside the LoRA slots ({tuple(dst.shape)})")
        at = dst.storage_offset() - slot.offset - self.index * slot.per_index
        place = Place(slot, at, tuple(dst.shape), tuple(dst.stride()))
        lo, hi = place.span
        if dst.numel() and (lo < 0 or hi > slot.per_index):
            raise NotReplayable("a write outside the activated index's block")
        return place

    def source(self, src: Any) -> tuple[Any, ...]:
        if isinstance(src, torch.Tensor) and id(src) in self.origin:
            k = self.origin[id(src)]
            f = self.factors[k]
            assert f is not None
            view = (src.storage_offset() - f.storage_offset(), tuple(src.shape), tuple(src.stride()))
            whole = view == (0, tuple(f.shape), tuple(f.stride()))
            return ("copy", k, None if whole else view)
        if isinstance(src, torch.Tensor) and (
            id(src) in self.tainted or src.numel() != 1 or src.untyped_storage().data_ptr() in self.slots
        ):
            raise NotReplayable("a write from a tensor that is neither a view of a factor nor a constant")
        value = src.detach().clone() if isinstance(src, torch.Tensor) else torch.tensor(src)
        return ("const", value.reshape(()))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.refused is None:
            try:
                if func in _WRITES or func is _ZERO:
                    dst = args[0]
                    source = ("const", torch.tensor(0)) if func is _ZERO else self.source(args[1])
                    self.writes.append((self.place(dst), source))
                elif func._schema.is_mutable:
                    raise NotReplayable(f"{func} writes in place")
            except NotReplayable as e:
                self.refused = str(e)
        out = func(*args, **kwargs)
        inputs = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        outputs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
        if func.is_view and inputs and id(inputs[0]) in self.origin:
            for o in outputs:
                self.origin[id(o)] = self.origin[id(inputs[0])]
            self.keep.extend(outputs)
        elif any(id(a) in self.origin or id(a) in self.tainted for a in inputs):
            self.tainted.update(id(o) for o in outputs)
            self.keep.extend(outputs)
        return out

    def recording(self) -> Recording:
        """The writes in replay order (zeros, constants, copies), or :class:`NotReplayable`."""
        if self.refused is not None:
            raise NotReplayable(self.refused)
        last: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], int] = {}
        for i, (place, _) in enumerate(self.writes):
            last[(place.slot.base.untyped_storage().data_ptr(), place.at, place.size, place.stride)] = i
        written: dict[int, list[tuple[int, tuple[int, int]]]] = {}  # storage -> (phase, span) so far
        out = Recording()
        for place, source in (self.writes[i] for i in sorted(last.values())):
            if 0 in place.size:
                continue
            phase = 2 if source[0] == "copy" else 0 if not bool(source[1]) else 1
            spans = written.setdefault(place.slot.base.untyped_storage().data_ptr(), [])
            # replayed in phase order (zeros, constants, copies), each phase in one unordered batch: an overlap
            # with an earlier write of a later phase, or of the same phase but zeros, would change the result
            if any((p > phase or p == phase > 0) and _overlap(place.span, span) for p, span in spans):
                raise NotReplayable("overlapping writes whose order the batched replay would not keep")
            spans.append((phase, place.span))
            if phase == 2:
                out.copies.append((place, *source[1:]))
            elif phase == 0:
                out.zeros.append(place)
            else:
                out.constants.append((place, source[1].to(place.slot.base.device, place.slot.base.dtype)))
        return self.batched(out)

    def batched(self, out: Recording) -> Recording:
        """``out`` without the zero fills its copies overwrite whole, its zeros and copies ordered into runs that
        each take one ``_foreach`` call."""
        copied: dict[int, list[tuple[int, int]]] = {}
        for place, _, _ in out.copies:
            if place.dense:
                copied.setdefault(id(place.slot), []).append(place.span)
        for spans in copied.values():
            spans.sort()
        out.zeros = [z for z in out.zeros if not _covered(z, copied.get(id(z.slot), []))]
        order, out.zero_runs = runs([(z.slot.base.dtype,) if z.dense else None for z in out.zeros])
        out.zeros = [out.zeros[i] for i in order]
        order, out.copy_runs = runs([self._copy_key(place, k, view) for place, k, view in out.copies])
        out.copies = [out.copies[i] for i in order]
        return out

    def _copy_key(self, place: Place, k: int, view: tuple[int, tuple[int, ...], tuple[int, ...]] | None) -> Any:
        factor = self.factors[k]
        assert factor is not None
        size, stride = (tuple(factor.shape), factor.stride()) if view is None else view[1:]
        fast = place.dense and size == place.size and stride == place.stride
        return (factor.dtype, place.slot.base.dtype) if fast else None


def slot_tensors(modules: Any, indices: int) -> dict[int, Slot]:
    """Every LoRA slot tensor of the manager's modules, by storage: tensors (or tuples of them) among each module's
    attributes, and the grouped layouts' slot storage, with a first dimension of at least ``indices`` (the slots)."""
    slots: dict[int, Slot] = {}
    for module in modules.values():
        values = list(vars(module).values()) + list(getattr(module, _SLOT_STORAGE, {}).values())
        for value in values:
            for t in value if isinstance(value, list | tuple) else (value,):
                if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] >= indices and t.stride(0) > 0:
                    slots.setdefault(t.untyped_storage().data_ptr(), Slot(t, t.storage_offset(), t.stride(0)))
    return slots


def adapter_factors(lora_model: Any) -> tuple[list[torch.Tensor | None], tuple[Any, ...]]:
    """The adapter's factors in one order (module name, A then B, packed entries in order) and its structure: per
    factor its shape, strides, dtype, device and the first position holding the same tensor; for a clone of the
    load memo, the template and flag it was cloned from (which fix all of that: no factor read again)."""
    factors: list[torch.Tensor | None] = []
    names = sorted(lora_model.loras)
    for name in names:
        weights = lora_model.loras[name]
        for side in (weights.lora_a, weights.lora_b):
            factors.extend(side if isinstance(side, list) else [side])
    if (cloned := clone_of(lora_model)) is not None:
        return factors, ("clone", *cloned)
    return factors, (tuple(names), kinds_with_aliasing(factors))


@dataclass
class SlotReplay:
    """One manager's recordings by adapter structure (None: that structure keeps vLLM's loop) and counts."""

    enabled: bool = True
    recordings: dict[tuple[Any, ...], Recording | None] = field(default_factory=dict)
    slots: dict[int, Slot] | None = None
    held: torch.Tensor | None = None  # the host copy :func:`matches_vllm` compares with, kept between checks
    counts: dict[str, int] = field(default_factory=lambda: {"recorded": 0, "replayed": 0, "refused": 0, "vllm": 0})


def state(manager: Any) -> SlotReplay:
    replay = manager.__dict__.get(_STATE)
    if replay is None:
        replay = manager.__dict__[_STATE] = SlotReplay(enabled=slot_replay_on(os.environ.get(SLOT_REPLAY_ENV)))
    return replay


def _slots(manager: Any, replay: SlotReplay) -> dict[int, Slot]:
    """The manager's slot tensors, read once (vLLM allocates them at start and keeps them)."""
    if replay.slots is None:
        replay.slots = slot_tensors(manager.modules, len(manager.lora_index_to_id))
    return replay.slots


@contextmanager
def _writes_skipped(modules: Any) -> Iterator[None]:
    """Each module's ``set_lora``/``reset_lora`` a no-op for vLLM's loop (instance attributes over its methods)."""
    for module in modules.values():
        module.__dict__["set_lora"] = module.__dict__["reset_lora"] = _skip  # past nn.Module's slow __setattr__
    try:
        yield
    finally:
        for module in modules.values():
            del module.__dict__["set_lora"], module.__dict__["reset_lora"]


def _skip(*_args: Any) -> None:
    return None


def activate(original: Any, manager: Any, lora_id: int) -> bool:
    """vLLM's ``activate_adapter``, its per-module writes recorded on a structure's first activation and replayed
    on later ones."""
    replay = state(manager)
    if lora_id in manager._active_adapters:  # vLLM returns at once
        return original(manager, lora_id)
    if not replay.enabled:
        replay.counts["vllm"] += 1
        return original(manager, lora_id)
    factors, structure = adapter_factors(manager._registered_adapters[lora_id])
    if structure in replay.recordings:
        recording = replay.recordings[structure]
        if recording is None:
            replay.counts["vllm"] += 1
            return original(manager, lora_id)
        with _writes_skipped(manager.modules):
            result = original(manager, lora_id)
        recording.replay(manager.lora_index_to_id.index(lora_id), factors)
        replay.counts["replayed"] += 1
        return result
    index = next((i for i, held in enumerate(manager.lora_index_to_id) if held is None), 0)
    recorder = _Recorder(_slots(manager, replay), factors, index)
    with recorder:
        result = original(manager, lora_id)
    if manager.lora_index_to_id.index(lora_id) != index:
        recorder.refused = "vLLM chose another slot index than the first free one"
    try:
        recording = replay.recordings[structure] = recorder.recording()
        replay.counts["recorded"] += 1
        log.info(
            "LoRA slot writes recorded: %d zero fills in %d calls, %d constants, %d copies in %d calls (%d writes)",
            len(recording.zeros), len(recording.zero_runs), len(recording.constants), len(recording.copies),
            len(recording.copy_runs), len(recorder.writes),
        )  # fmt: skip
    except NotReplayable as e:
        replay.recordings[structure] = None
        replay.counts["refused"] += 1
        log.info("LoRA slot writes of this adapter structure stay vLLM's: %s", e)
    return result


def install() -> None:
    """Wrap vLLM's ``LoRAModelManager.activate_adapter`` (once per process; the vLLM plugin calls it)."""
    from vllm.lora.model_manager import LoRAModelManager

    original = LoRAModelManager.activate_adapter
    if original.__module__ == __name__:
        return

    def activate_adapter(self: Any, lora_id: int) -> bool:
        return activate(original, self, lora_id)

    LoRAModelManager.activate_adapter = activate_adapter


def _blocks(slots: dict[int, Slot], index: int) -> list[torch.Tensor]:
    return [s.base.as_strided((s.per_index,), (1,), s.offset + index * s.per_index) for s in slots.values()]


def matches_vllm(manager: Any, lora_id: int) -> bool:
    """Whether the slots of active adapter ``lora_id`` hold exactly what vLLM's own loop writes for it: its slot
    blocks are read, the adapter deactivated and activated again with the replay off (vLLM writes it, at the first
    free index), and the two read back compared bit for bit. For benchmarks and tests: the adapter is rewritten. The
    blocks read first wait in host memory (a per-expert slot block of 75 narrowed GLM-5.3 layers is ~15 GB, more
    than an engine at 0.82 of one H200 leaves free), page-locked off a GPU and kept for the next check; the
    comparison brings them back a piece at a time (:func:`same_bytes`)."""
    replay = state(manager)
    slots = _slots(manager, replay)
    blocks = _blocks(slots, manager.lora_index_to_id.index(lora_id))
    before = _held(replay, blocks)
    manager.deactivate_adapter(lora_id)
    enabled, replay.enabled = replay.enabled, False
    try:
        manager.activate_adapter(lora_id)
    finally:
        replay.enabled = enabled
    return same_bytes(before, _blocks(slots, manager.lora_index_to_id.index(lora_id)))


def _held(replay: SlotReplay, blocks: list[torch.Tensor]) -> list[torch.Tensor]:
    """A host copy of each block's bytes, in one buffer the replay state keeps (page-locked for a GPU's blocks:
    a copy at the bus's speed, and the same memory every check instead of fresh pages each time)."""
    nbytes = [b.numel() * b.element_size() for b in blocks]
    pinned = bool(blocks) and blocks[0].is_cuda
    if replay.held is None or replay.held.numel() < sum(nbytes):
        replay.held = None  # the old buffer goes before the new one is asked for
        replay.held = torch.empty(sum(nbytes), dtype=torch.uint8, pin_memory=pinned)
    out, at = [], 0
    for block, n in zip(blocks, nbytes, strict=True):
        out.append(replay.held[at : at + n])
        out[-1].copy_(block.view(torch.uint8), non_blocking=pinned)
        at += n
    if pinned:
        torch.cuda.synchronize(blocks[0].device)
    return out


def same_bytes(held: list[torch.Tensor], blocks: list[torch.Tensor], piece: int = 256 << 20) -> bool:
    """Whether each of ``held`` (host ``uint8``) holds ``blocks``' bytes, compared on the blocks' device ``piece``
    bytes at a time (one scratch buffer there, not a second copy of every block)."""
    if not blocks:
        return not held
    got = [b.view(torch.uint8) for b in blocks]
    scratch = torch.empty(min(piece, max(g.numel() for g in got)), dtype=torch.uint8, device=got[0].device)
    for want, have in zip(held, got, strict=True):
        if want.numel() != have.numel():
            return False
        for lo in range(0, have.numel(), piece):
            here = scratch[: min(piece, have.numel() - lo)]
            here.copy_(want[lo : lo + piece], non_blocking=True)
            if not torch.equal(here, have[lo : lo + piece]):
                return False
    return True
