"""Exact deduplication of an exported adapter: each unique tensor once, with every public name that shows it.

The exporter's stream is ``(public name, tensor)`` pairs; a full GLM-5.3 export has 116,292 names over 1,389 unique
tensors. Work is per distinct tensor object, in bulk per slice of the stream (C-level maps and numpy, no Python
loop per name or per object on the common paths):

1. **Objects.** Names of one tensor object are grouped by object id (numpy over ids).
2. **Views.** Objects showing one storage view (data pointer, shape, strides, dtype) are one tensor; no value is
   compared. Only tensors being sent are remembered by address: a dropped duplicate's memory may come back from
   the exporter's allocator holding another value.
3. **Values**, unless the exporter declares its sharing (``shared_storage``: Megatron-Bridge's
   ``share_expert_adapters`` hands out one storage under every expert name, so distinct storages are distinct
   values). Each new object gets a fingerprint (its checksum sums, :func:`~skyrl_glm.sync.checksum.fingerprints`,
   one launch per slice); an object whose (shape, dtype, fingerprint) an earlier value has is *proven* equal to it
   byte for byte (:func:`~skyrl_glm.sync.compare.equal_at`, one launch per slice). A fingerprint never decides
   alone: on a failed proof (a collision) the object is compared with every value of that fingerprint in turn.
   Equal bytes, shape and dtype are one value wherever they occur (the zero-initialised ``lora_B`` of every layer,
   say); duplicates are released after their slice, so sender memory stays near the unique adapter.

Each sent tensor's names keep stream order; its first name is its sent name.
"""

from __future__ import annotations

import itertools
import operator
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from skyrl_glm.sync.checksum import fingerprints, sums_at, word_aligned
from skyrl_glm.sync.compare import equal_at, equal_pairs

SLICE = 16384  # stream pairs decided together (bounds what the exporter's duplicates hold)

@dataclass
class Dedup:
    """Result of deduplication: the tensors to send, each with every public name that shows it."""

    unique: dict[str, torch.Tensor]  # sent name (its first public name) -> tensor
    names: dict[str, list[str]]  # sent name -> its public names (the sent name first)
    public_count: int
    public_bytes: int

    @property
    def aliases(self) -> dict[str, str]:
        """``{public: sent}`` for every alias, expanded (tests, small adapters)."""
        return {p: sent for sent, names in self.names.items() for p in names[1:]}


def _view_key(t: torch.Tensor) -> tuple:
    # data_ptr() already includes the storage offset.
    return (t.data_ptr(), t.shape, t.stride(), t.dtype)


@dataclass
class _Slice:
    """One slice of the stream: its names, its distinct tensor objects and what dedup needs of each, read by C-level
    maps while the slice is in the CPU cache (a full export with copies has 116,292 tensor objects: each pass over
    them all costs a cache miss per object, tens of milliseconds, so everything later works on these arrays)."""

    names: list[str]
    of_name: np.ndarray  # per name: its object
    objs: list[torch.Tensor]
    ptrs: np.ndarray
    nbytes: np.ndarray
    shapes: tuple
    dtypes: tuple
    contiguous: np.ndarray

    @classmethod
    def read(cls, pairs: Iterable[tuple[str, torch.Tensor]]) -> _Slice:
        chunk = list(pairs)
        names, tensors = zip(*chunk, strict=True) if chunk else ((), ())
        n = len(tensors)
        ids = np.fromiter(map(id, tensors), dtype=np.uint64, count=n)
        _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")  # objects in order of first appearance
        position = np.empty_like(order)
        position[order] = np.arange(len(order))
        objs = [tensors[i] for i in first[order].tolist()]
        m = len(objs)
        return cls(
            list(names),
            position[inverse.reshape(-1)],
            objs,
            np.fromiter(map(torch.Tensor.data_ptr, objs), np.int64, m),
            np.fromiter(map(_nbytes, objs), np.int64, m),
            tuple(map(_shape, objs)),
            tuple(map(_dtype, objs)),
            np.fromiter(map(torch.Tensor.is_contiguous, objs), bool, m),
        )


_nbytes = operator.attrgetter("nbytes")
_shape = operator.attrgetter("shape")
_dtype = operator.attrgetter("dtype")


class _Deduper:
    def __init__(self, declared: bool) -> None:
        self.declared = declared
        self.sent: list[torch.Tensor] = []
        self.words: list[torch.Tensor] = []  # per sent tensor, its bytes readable as int32 words (itself, mostly)
        self.addrs: list[int] = []  # ... and their address
        self.at: dict[int, list[tuple[tuple, int]]] = {}  # data_ptr -> [(view key, sent index)] of sent tensors
        self.prints: dict[tuple, int] = {}  # (shape, dtype, plain, weighted) -> the first sent value with that print
        self.collided: dict[tuple, list[int]] = {}  # print -> further sent values with it (fingerprint collisions)
        self.seen: set[str] = set()
        self.refs: list[np.ndarray] = []  # per slice: the sent index of each of its names
        self.names: list[list[str]] = []  # per slice: its names

    def _new(self, t: torch.Tensor, words: torch.Tensor | None = None) -> int:
        i = len(self.sent)
        words = t if words is None else words
        self.sent.append(t)
        self.words.append(words)
        self.addrs.append(words.data_ptr())
        self.at.setdefault(t.data_ptr(), []).append((_view_key(t), i))
        return i

    def _by_view(self, sl: _Slice) -> tuple[np.ndarray, np.ndarray]:
        """``(ref, link)``: per object the sent index of the sent tensor whose view it shows (-1: none), and the
        first object of this slice showing its view (itself: none earlier). Python work only for objects whose
        address repeats in the slice or is a sent tensor's."""
        n = len(sl.objs)
        ref = np.full(n, -1, dtype=np.int64)
        link = np.arange(n)
        _, inverse, counts = np.unique(sl.ptrs, return_inverse=True, return_counts=True)
        check = counts[inverse.reshape(-1)] > 1
        if self.at:
            check |= np.fromiter(map(self.at.__contains__, sl.ptrs.tolist()), bool, n)
        local: dict[tuple, int] = {}
        for i in np.flatnonzero(check).tolist():
            key = _view_key(sl.objs[i])
            hit = next((s for k, s in self.at.get(key[0], ()) if k == key), None)
            if hit is not None:
                ref[i] = hit
            else:
                link[i] = local.setdefault(key, i)
        return ref, link

    def _by_value(self, sl: _Slice, fresh: np.ndarray) -> np.ndarray:
        """Sent index of each ``fresh`` object (all showing distinct views): an earlier value proven equal, or new."""
        n = len(fresh)
        objs = [sl.objs[i] for i in fresh.tolist()]
        in_place = sl.contiguous[fresh] & (sl.ptrs[fresh] % 4 == 0) & (sl.nbytes[fresh] % 4 == 0)
        words = [t if ok else word_aligned(t) for t, ok in zip(objs, in_place.tolist(), strict=True)]
        addrs = sl.ptrs[fresh].copy()
        for i in np.flatnonzero(~in_place).tolist():
            addrs[i] = words[i].data_ptr()
        counts = (sl.nbytes[fresh] + 3) // 4
        cuda = bool(objs) and objs[0].is_cuda
        sums = sums_at(objs[0].device, addrs, counts) if cuda else fingerprints(words)
        shapes = [sl.shapes[i] for i in fresh.tolist()]
        dtypes = [sl.dtypes[i] for i in fresh.tolist()]
        keys = list(zip(shapes, dtypes, *sums.T.tolist(), strict=True))
        earlier = np.fromiter(map(self.prints.get, keys, itertools.repeat(-1)), np.int64, n)
        first = dict(zip(reversed(keys), range(n - 1, -1, -1), strict=True))  # print -> its first object here
        lead = np.fromiter(map(first.__getitem__, keys), np.int64, n)
        ref = np.full(n, -1, dtype=np.int64)
        for i in np.flatnonzero((earlier < 0) & (lead == np.arange(n))).tolist():  # a new print: a new value
            ref[i] = self.prints[keys[i]] = self._new(objs[i], words[i])
        rest = np.flatnonzero(ref < 0)  # an earlier value has the print: prove equality
        cand = np.where(earlier[rest] >= 0, earlier[rest], ref[lead[rest]])
        if cuda:
            right = np.array(self.addrs, dtype=np.int64)[cand]
            equal = equal_at(objs[0].device, addrs[rest], right, counts[rest], words=True).cpu().numpy()
        else:
            equal = equal_pairs([words[i] for i in rest.tolist()], [self.words[c] for c in cand.tolist()]).numpy()
        ref[rest[equal]] = cand[equal]
        for i in rest[~equal].tolist():  # fingerprint collisions (rare): every value of the print in turn
            values = [self.prints[keys[i]], *self.collided.get(keys[i], ())]
            ref[i] = next((v for v in values if equal_pairs([words[i]], [self.words[v]]).item()), -1)
            if ref[i] < 0:
                ref[i] = self._new(objs[i], words[i])
                self.collided.setdefault(keys[i], []).append(int(ref[i]))
        return ref

    def slice(self, sl: _Slice) -> None:
        new = set(sl.names)
        if len(new) != len(sl.names) or not self.seen.isdisjoint(new):
            raise ValueError(f"adapter stream repeats the name {_first_repeat(sl.names, self.seen)!r}")
        self.seen |= new
        ref, link = self._by_view(sl)
        fresh = np.flatnonzero((ref < 0) & (link == np.arange(len(sl.objs))))
        if self.declared:
            ref[fresh] = [self._new(sl.objs[i]) for i in fresh.tolist()]
        else:
            ref[fresh] = self._by_value(sl, fresh)
        ref = ref[link]  # views of an object of this slice: its value
        self.refs.append(ref[sl.of_name])
        self.names.append(sl.names)

    def run(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> Dedup:
        stream = iter(pairs)
        while (sl := _Slice.read(itertools.islice(stream, SLICE))).names:
            self.slice(sl)
            del sl  # the slice's duplicates can go
        refs = np.concatenate(self.refs) if self.refs else np.zeros(0, dtype=np.int64)
        names = list(itertools.chain.from_iterable(self.names))
        order = np.argsort(refs, kind="stable").tolist()
        ends = np.cumsum(np.bincount(refs, minlength=len(self.sent))).tolist()
        grouped = [names[i] for i in order]
        by_sent = [grouped[s:e] for s, e in zip([0, *ends[:-1]], ends, strict=True)]
        counts = np.diff([0, *ends])
        nbytes = np.fromiter(map(_nbytes, self.sent), np.int64, len(self.sent))
        return Dedup(
            unique={ns[0]: t for ns, t in zip(by_sent, self.sent, strict=True)},
            names={ns[0]: ns for ns in by_sent},
            public_count=len(names),
            public_bytes=int((nbytes * counts).sum()),
        )


def _first_repeat(names: list[str], seen: set[str]) -> str:
    """The first name of ``names`` that an earlier slice had or that this one has twice."""
    counts = Counter(names)
    return next(n for n in names if counts[n] > 1 or n in seen)


def deduplicate(
    adapter: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor], *, shared_storage: bool = False
) -> Dedup:
    """``shared_storage``: the exporter declares that it hands out one storage for all names of one tensor
    (Megatron-Bridge ``share_expert_adapters``), so distinct storages are distinct tensors and no value is
    compared. Without it, equality is proven. Exact either way: a wrong declaration only sends a duplicate."""
    return _Deduper(shared_storage).run(adapter.items() if isinstance(adapter, Mapping) else adapter)
