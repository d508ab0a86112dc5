"""Staging buffers a receiver keeps for later updates of one layout, with the tensors it made of each.

Each update lands in private memory that the engine then loads from: its sent tensors as views of that memory and
the tensors handed to the engine (the expert layout's, or every public name's) made of them. Making those costs a
step per sent tensor (a view each: about 1.6 us) and per handed tensor, each update, and a per-expert update names
116,292 of them at full GLM-5.3. An update's structure is its manifest's layout (``Manifest.layout_key``), the same
every update of a run: the same offsets, views and names. So a buffer whose adapter is gone is kept with its tensors
and the next update of its layout is copied into it, its tensors handed on as they are.

Gone means nothing but this pool refers to its memory: no tensor of anyone else's on its storage (the storage's
use count as when it was made) and no other reference to a tensor made here (each one's reference count as when it
was made). A staged adapter (SkyRL's copy of the mapping), a ``LoRAModel`` vLLM still holds, any view of one: each
keeps the buffer out of reach. A buffer in use is never handed out; the update gets fresh memory instead. The
tensors go out in a mapping of the caller's own (a copy of the pool's), so that whoever holds it counts.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

KEPT = 4  # buffers kept per layout: serving, previous and the one arriving, and one retired with a request on it
LAYOUTS = 2  # layouts kept: a run's, and one it alternates with (the check's B == 0 version is a layout of its own)


# the storage's use count (torch 2.13 has it; a torch without it keeps nothing: every update gets fresh memory)
_STORAGE_USES = getattr(torch._C, "_storage_Use_Count", None)


def _use_count(t: torch.Tensor) -> int:
    return _STORAGE_USES(t.untyped_storage()._cdata)


@dataclass(eq=False)
class Kept:
    """One buffer and the tensors made of it: ``sent`` (sent name -> view) and ``tensors`` (what the engine
    loads; ``made``: each of both once), with the counts taken when only this pool held them (:meth:`free`)."""

    key: tuple
    staging: torch.Tensor
    sent: dict[str, torch.Tensor]
    tensors: dict[str, torch.Tensor]
    made: list[torch.Tensor]  # each tensor of sent and tensors once
    _uses: int = 0
    _refs: list[int] = field(default_factory=list)

    def seal(self) -> Kept:
        """Take the counts, with this pool's own references only."""
        self._uses, self._refs = _use_count(self.staging), _ref_counts(self.made)
        return self

    def free(self) -> bool:
        """Whether nothing but this pool refers to the buffer's memory or to a tensor made of it."""
        return _use_count(self.staging) == self._uses and _ref_counts(self.made) == self._refs


def _ref_counts(tensors: list[torch.Tensor]) -> list[int]:
    return [sys.getrefcount(t) for t in tensors]


class StagingPool:
    """Kept buffers by layout (``key``: the manifest's layout identity, the engine layout and the stream's bytes);
    at most :data:`KEPT` per layout, of the :data:`LAYOUTS` last asked for."""

    def __init__(self) -> None:
        self.kept: list[Kept] = []
        self.recent: list[tuple] = []  # the layouts last asked for, newest first
        self.counts = {"reused": 0, "made": 0}

    def take(self, key: tuple) -> Kept | None:
        """A kept buffer of ``key`` that nothing else refers to, or None; buffers of layouts older than the last
        :data:`LAYOUTS` asked for that nothing refers to are let go."""
        self._asked(key)
        self.kept = [k for k in self.kept if k.key in self.recent or not k.free()]
        found = next((k for k in self.kept if k.key == key and k.free()), None)
        self.counts["reused" if found else "made"] += 1
        return found

    def _asked(self, key: tuple) -> None:
        self.recent = [key, *(k for k in self.recent if k != key)][:LAYOUTS]

    def keep(
        self,
        key: tuple,
        staging: torch.Tensor,
        sent: dict[str, torch.Tensor],
        tensors: dict[str, torch.Tensor],
    ) -> None:
        """Keep ``staging`` with the tensors made of it, if every one is a view of it (a tensor computed from the
        values, as stacked-3d's or a stack's copy, would not follow the next update's bytes) and its layout has
        fewer than :data:`KEPT`."""
        self._asked(key)
        if _STORAGE_USES is None:
            return
        made = list({id(t): t for t in (*sent.values(), *tensors.values())}.values())  # 1,389 of 116,292 names
        memory = staging.untyped_storage().data_ptr()
        if sum(k.key == key for k in self.kept) < KEPT and all(t.untyped_storage().data_ptr() == memory for t in made):
            self.kept.append(Kept(key, staging, sent, tensors, made).seal())
