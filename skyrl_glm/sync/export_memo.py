"""A sync like the last without the trainer's export: its unique tensors read straight from the LoRA parameters.

Megatron-Bridge's ``export_adapter_weights`` walks every adapter module and hands out one name per public tensor
(116,292 for full GLM-5.3; its export alone took 24-29 ms per full-width MoE layer on one H200, about 2 s a sync
at 75 layers if it grows linearly), and the deduplication then reads every name again. Yet from one sync to the
next only values change, and where every unique tensor the export handed out is a view of a LoRA parameter (at
tensor, pipeline and expert parallelism 1, with ``share_expert_adapters``), the next sync's tensors are those same
views of the parameters as they are then.

:meth:`ExportMemo.learn` takes one full export's deduplication (before any fold) and the model's LoRA parameters,
and records per unique tensor which parameter it views and where (offset from the parameter's own first element,
shape, strides). :meth:`ExportMemo.recall`, handed the parameters as they are then, gives the next sync's
deduplication with no export: the same names and alias rules, each tensor that view of its parameter now (read where
the parameter is now: an offload and reload that moves a parameter's memory moves the read with it; parameters of
another count, shape or dtype recall nothing). Work per unique tensor, none per name; and where no parameter moved
since the last recall (the same addresses: the memo's views hold the old memory alive, so an address seen again is
the same memory) not even that: the last recall's views are handed out again, as they read the values of now, and
the parameters' shapes, strides and dtypes are not read again (20 of 28 ms of a recall at 25,000 parameters,
``grouped:64`` at 75 layers, on the 2-core CPU machine, measured 2026-12-04): a parameter reshaped or retyped in
place on the same memory is not a thing a trainer does between syncs, and the full export every ``verify_every``-th
sync would find it. Where every unique tensor is contiguous, a recall also gives their addresses
(``Dedup.addresses``, from the parameters' own), which the pack's copy table reads.

It learns nothing when any unique tensor is not a view of one parameter (a gathered copy, a stacked tensor): such
an export keeps running whole. And it trusts no memory for long: every ``verify_every``-th sync recalls nothing, so
the export runs whole, and :meth:`learn` compares that export with what the memo would have given (the same names,
rules and bit-equal tensors); any difference drops the memo (logged) before it learns again.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from skyrl.backends.skyrl_train.distributed.megatron.lora_export import LORA_A_SUFFIX, LORA_B_SUFFIX

from skyrl_glm.sync.dedup import Dedup, dtype_of, shape_of

log = logging.getLogger(__name__)

VERIFY_EVERY = 16  # syncs per full export (the memo's own check) once it has learned
_stride, _device = torch.Tensor.stride, torch.Tensor.get_device
_address = torch.Tensor.data_ptr


@dataclass(frozen=True)
class _Source:
    """Where a unique tensor lies: ``param``'s position, the view's offset from the parameter's first element;
    ``whole``: the view is the whole parameter as it lies (a recall hands out the parameter itself)."""

    param: int
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    whole: bool


def _sources(unique: dict[str, torch.Tensor], params: Sequence[torch.Tensor]) -> list[_Source] | None:
    """Each unique tensor as a view of one parameter, or None if any is not (a copy, or it spans several)."""
    by_storage: dict[int, list[tuple[int, int, int]]] = {}  # storage -> (first, end, param), sorted
    for i, p in enumerate(params):
        by_storage.setdefault(p.untyped_storage().data_ptr(), []).append(
            (p.storage_offset(), p.storage_offset() + p.numel(), i)
        )
    for spans in by_storage.values():
        spans.sort()
    out = []
    for t in unique.values():
        spans = by_storage.get(t.untyped_storage().data_ptr())
        if not spans or t.numel() == 0:
            return None
        first = t.storage_offset()
        last = first + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
        k = bisect.bisect_right(spans, (first, float("inf"), 0)) - 1
        if k < 0 or not (first < spans[k][1] and last < spans[k][1]) or params[spans[k][2]].dtype != t.dtype:
            return None
        start, _, owner = spans[k]
        shape, strides, p = tuple(t.shape), t.stride(), params[owner]
        whole = first == start and shape == tuple(p.shape) and strides == p.stride()
        out.append(_Source(owner, first - start, shape, strides, whole))
    return out


class ExportMemo:
    """One run's memo of its export (held by the sender across syncs); see the module's doc."""

    def __init__(self, verify_every: int = VERIFY_EVERY) -> None:
        self.verify_every = verify_every
        self.last: Dedup | None = None  # the learned deduplication, with no tensors
        self.sources: list[_Source] = []
        self.kinds: list[tuple[Any, ...]] = []  # the learned parameters' shape, strides, dtype, device
        self.recalls = 0  # syncs served since the last full export
        # the last recall: the parameters' addresses, the unique tensors, and their addresses where all are contiguous
        self.views: tuple[list[int], dict[str, torch.Tensor], np.ndarray | None] | None = None
        self.reach: tuple[np.ndarray, np.ndarray] | None = None  # per unique tensor: its parameter, bytes into it
        self.rescaled: list[str] = []  # what SkyRL's rank-scale fold changed in the learned export, with its lora_A
        self.counts = {"learned": 0, "recalled": 0, "refused": 0, "dropped": 0}

    def recall(self, params: Sequence[torch.Tensor]) -> Dedup | None:
        """This sync's deduplication read from ``params`` (the model's LoRA parameters now, in the order learned),
        or None: nothing learned, a full export due, or parameters unlike the learned ones (count, shape, dtype)."""
        if self.last is None or self.recalls + 1 >= self.verify_every or len(params) != len(self.kinds):
            return None
        addresses = list(map(_address, params))
        if self.views is None or self.views[0] != addresses:
            if self._kinds(params) != self.kinds:
                return None
            self.views = addresses, self._rebuilt(params).unique, self._located(addresses)
        self.recalls += 1
        self.counts["recalled"] += 1
        return dataclasses.replace(self.last, unique=dict(self.views[1]), addresses=self.views[2])

    def _located(self, addresses: list[int]) -> np.ndarray | None:
        """Each unique tensor's data address, read from its parameter's (None unless every one is contiguous)."""
        if self.reach is None:
            return None
        param, into = self.reach
        return np.asarray(addresses, dtype=np.int64)[param] + into

    def note_rescaled(self, todo: Mapping[str, torch.Tensor], folded: Mapping[str, torch.Tensor]) -> None:
        """What SkyRL's rank-scale fold changed in a full export (``todo`` in, ``folded`` out: a changed ``lora_B``
        is a new tensor), each with its ``lora_A``: a recall of that export hands these to the fold again."""
        changed = [n for n, t in folded.items() if t is not todo[n]]
        pairs = (m for n in changed for m in (n.removesuffix(LORA_B_SUFFIX) + LORA_A_SUFFIX, n))
        self.rescaled = [m for m in pairs if m in todo]

    def forget_views(self) -> None:
        """Drop the last recall's views: they hold the parameters' memory, which an offload must be able to free
        (the next recall makes them again where the parameters are then)."""
        self.views = None

    @staticmethod
    def _kinds(params: Sequence[torch.Tensor]) -> list[tuple[Any, ...]]:
        """Each parameter's shape, strides, dtype and device index, read by C-level maps (no Python step per
        parameter: 25,000 of them at ``grouped:64``)."""
        kinds = zip(
            map(shape_of, params), map(_stride, params), map(dtype_of, params), map(_device, params), strict=True
        )
        return list(kinds)

    def _rebuilt(self, params: Sequence[torch.Tensor]) -> Dedup:
        """Each unique tensor read from ``params``: a whole parameter is handed out as it is, anything else as a view
        (an ``as_strided`` per tensor took 32 of a recall's 37 ms at 6,700 parameters of 20 ``grouped:64`` layers on
        the 2-core CPU machine, measured 2026-12-04, and the parameters are those tensors there)."""
        assert self.last is not None
        tensors = [
            p if s.whole else p.as_strided(s.shape, s.strides, p.storage_offset() + s.offset)
            for p, s in zip((params[s.param] for s in self.sources), self.sources, strict=True)
        ]
        return dataclasses.replace(self.last, unique=dict(zip(self.last.unique, tensors, strict=True)))

    def learn(self, dedup: Dedup, params: Sequence[torch.Tensor]) -> bool:
        """Remember a full export's deduplication (``dedup``, before any fold) as views of ``params``; first, if
        one was learned, check it would have recalled this export exactly (else it is dropped). Returns whether
        the next sync can be recalled; if so ``dedup`` and every recall of it carry one structure token
        (``Dedup.structure``), kept while full exports agree with what was learned."""
        structure = None if self.last is None else self.last.structure
        if self.last is not None and not self._agrees(dedup, params):
            self.counts["dropped"] += 1
            log.warning("export memo dropped: a full export differs from what the memo recalls; learning again")
            structure = None
        sources = _sources(dedup.unique, params)
        self.recalls, self.views = 0, None
        if sources is None:
            self.last, self.sources, self.kinds, self.reach = None, [], [], None
            self.counts["refused"] += 1
            return False
        dedup.structure = object() if structure is None else structure
        self.last = dataclasses.replace(dedup, unique=dict.fromkeys(dedup.unique))  # type: ignore[arg-type]
        self.sources, self.kinds = sources, self._kinds(params)
        self.reach = None
        if all(map(torch.Tensor.is_contiguous, dedup.unique.values())):
            itemsize = [t.element_size() for t in dedup.unique.values()]
            self.reach = (
                np.array([s.param for s in sources], dtype=np.int64),
                np.array([s.offset * n for s, n in zip(sources, itemsize, strict=True)], dtype=np.int64),
            )
        self.counts["learned"] += 1
        return True

    def _agrees(self, dedup: Dedup, params: Sequence[torch.Tensor]) -> bool:
        assert self.last is not None
        same = dataclasses.replace(dedup, unique={}) == dataclasses.replace(self.last, unique={})
        if not same or list(dedup.unique) != list(self.last.unique) or self._kinds(params) != self.kinds:
            return False
        recalled = self._rebuilt(params).unique.values()
        return all(
            a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
            for a, b in zip(dedup.unique.values(), recalled, strict=True)
        )
