"""Exact deduplication of an exported adapter: each unique tensor once, with every public name that shows it.

The exporter's stream is ``(public name, tensor)`` pairs; a full GLM-5.3 export has 116,292 names over 1,389 unique
tensors. Work is in bulk per slice of 4,096 pairs: each object's address, shape, dtype and contiguity are read once by
C-level maps while the slice is in the CPU cache, and everything after is numpy (no Python loop per name or per
object on the common paths; with exporter copies every pass over the objects costs a cache miss each):

1. **Objects.** Names are grouped by object: by address first where objects are many (copies), by object id where
   few (shared storage); either way the same grouping.
2. **Views.** Objects showing one storage view (data pointer, shape, strides, dtype) are one tensor; no value is
   compared. Only tensors being sent are remembered by address: a dropped duplicate's memory may come back from
   the exporter's allocator holding another value.
3. **Values**, unless the exporter declares its sharing (``shared_storage``: Megatron-Bridge's
   ``share_expert_adapters`` hands out one storage under every expert name, so distinct storages are distinct
   values). Each new object gets a *print*: its kind (exact shape id, dtype, size) and its checksum's two sums
   (:func:`~skyrl_glm.sync.checksum.sums_at`, one launch per slice over an address table), mixed into one uint64.
   An object whose print an earlier value has is checked against it by kind (numpy: equal sizes, so no read runs
   past a tensor), then proven byte-equal (:func:`~skyrl_glm.sync.compare.equal_at`, one launch per slice). A print
   never decides alone: on a failed proof the object is compared with every value of that print in turn. Equal
   bytes, shape and dtype are one value wherever they occur (the zero-initialised ``lora_B`` of every layer, say);
   duplicates are released after their slice, so sender memory stays near the unique adapter.

Sent tensors are in stream order of first appearance (a value told apart only after a fingerprint collision comes
after its slice's other new values); each sent tensor's names keep stream order, the first is its sent name.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from skyrl_glm.sync.checksum import fingerprints, sums_at, word_aligned
from skyrl_glm.sync.compare import equal_at, equal_pairs

SLICE = 4096  # stream pairs decided together (bounds what the exporter's duplicates hold)

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
    them all costs a cache miss per object, so everything later works on these arrays)."""

    names: list[str]
    of_name: np.ndarray  # per name: its object
    objs: tuple[torch.Tensor, ...]
    ptrs: np.ndarray
    contiguous: np.ndarray
    kind: np.ndarray  # [n, 3] int64: shape id, dtype id, nbytes (equal rows: equal shape, dtype and size)

    @property
    def nbytes(self) -> np.ndarray:
        return self.kind[:, 2]

    @classmethod
    def read(
        cls, pairs: Iterable[tuple[str, torch.Tensor]], shape_ids: dict[torch.Size, int], by_address: bool
    ) -> _Slice:
        """``shape_ids``: every shape seen so far -> its id (grows; exact: a dict compares the shapes it hashes).
        ``by_address``: group names by address first (cheaper when most names are their own object; either way
        the grouping is the same)."""
        chunk = list(pairs)
        names, tensors = zip(*chunk, strict=True) if chunk else ((), ())
        n = len(tensors)
        if by_address:  # many objects (an exporter's copies): each name's address first, ids only where one repeats
            ptrs = np.fromiter(map(torch.Tensor.data_ptr, tensors), np.int64, n)
            _, first, inverse, counts = np.unique(ptrs, return_index=True, return_inverse=True, return_counts=True)
            inverse = inverse.reshape(-1)
            obj = first[inverse]  # each name's object, as the index of the object's first name
            shared = np.flatnonzero(counts[inverse] > 1)
        else:  # few objects under many names (shared storage): object ids first, addresses per object
            ptrs, obj, shared = None, np.zeros(n, dtype=np.int64), np.arange(n)
        if len(shared):
            ids = np.fromiter(map(id, _pick(tensors, shared)), np.uint64, len(shared))
            _, id_first, id_inverse = np.unique(ids, return_index=True, return_inverse=True)
            obj[shared] = shared[id_first][id_inverse.reshape(-1)]
        heads, position = np.unique(obj, return_inverse=True)  # objects in order of first appearance
        objs = _pick(tensors, heads)
        if ptrs is None:
            ptrs = np.zeros(n, dtype=np.int64)
            ptrs[heads] = np.fromiter(map(torch.Tensor.data_ptr, objs), np.int64, len(objs))
        m = len(objs)
        shapes, dtypes = tuple(map(_shape, objs)), tuple(map(_dtype, objs))
        for shape in dict.fromkeys(shapes):
            shape_ids.setdefault(shape, len(shape_ids))
        kind = np.empty((m, 3), dtype=np.int64)
        kind[:, 0] = np.fromiter(map(shape_ids.__getitem__, shapes), np.int64, m)
        kind[:, 1] = np.fromiter(map(id, dtypes), np.int64, m)  # dtypes are singletons
        # sizes from the few distinct (shape, dtype) pairs, not one more call per object
        numel = np.array([math.prod(shape) for shape in shape_ids], dtype=np.int64)
        _, dtype_of = np.unique(kind[:, 1], return_inverse=True)
        first_of_dtype = _pick(dtypes, np.unique(dtype_of.reshape(-1), return_index=True)[1])
        itemsize = np.array([d.itemsize for d in first_of_dtype], dtype=np.int64)
        kind[:, 2] = numel[kind[:, 0]] * itemsize[dtype_of.reshape(-1)]
        contiguous = np.fromiter(map(torch.Tensor.is_contiguous, objs), bool, m)
        return cls(list(names), position.reshape(-1), objs, ptrs[heads], contiguous, kind)


_shape = operator.attrgetter("shape")
_dtype = operator.attrgetter("dtype")


def _mix(columns: np.ndarray) -> np.ndarray:
    """One uint64 per row of int64 ``columns`` (FNV-style; rows that collide are told apart by the exact checks)."""
    out = np.full(len(columns), 0xCBF29CE484222325, dtype=np.uint64)
    for c in columns.T.view(np.uint64):
        out = (out ^ c) * np.uint64(0x100000001B3)
    return out


def _pick(items: Sequence, index: np.ndarray) -> tuple:
    """``items`` at ``index`` (C-level)."""
    if len(index) == 0:
        return ()
    got = operator.itemgetter(*index.tolist())(items)
    return got if len(index) > 1 else (got,)


def _take(stream: Iterator[tuple[str, torch.Tensor]], max_bytes: int | None) -> Iterable[tuple[str, torch.Tensor]]:
    """The next slice of the stream: :data:`SLICE` pairs, fewer once its distinct tensors hold ``max_bytes``."""
    if max_bytes is None:
        return itertools.islice(stream, SLICE)
    pairs: list[tuple[str, torch.Tensor]] = []
    seen: set[int] = set()
    held = 0
    for pair in itertools.islice(stream, SLICE):
        pairs.append(pair)
        if id(pair[1]) not in seen:
            seen.add(id(pair[1]))
            held += pair[1].numel() * pair[1].element_size()
            if held >= max_bytes:
                break
    return pairs


class _Deduper:
    def __init__(self, declared: bool, slice_bytes: int | None = None) -> None:
        self.declared = declared
        self.slice_bytes = slice_bytes
        self.sent: list[torch.Tensor] = []
        self.kinds = np.zeros((0, 3), dtype=np.int64)  # per sent tensor, its kind (see ``_Slice.kind``); capacity grows
        self.shape_ids: dict[torch.Size, int] = {}
        self.words: list[torch.Tensor] = []  # per sent tensor, its bytes readable as int32 words (itself, mostly)
        self.addrs: list[int] = []  # ... and their address
        self.at: dict[int, list[tuple[tuple, int]]] = {}  # data_ptr -> [(view key, sent index)] of sent tensors
        self.prints: dict[int, int] = {}  # print (kind and fingerprint, mixed) -> the first sent value with it
        self.collided: dict[int, list[int]] = {}  # print -> further sent values with it (rare)
        self.refs: list[np.ndarray] = []  # per slice: the sent index of each of its names
        self.names: list[list[str]] = []  # per slice: its names

    def _new(self, t: torch.Tensor, kind: np.ndarray, words: torch.Tensor | None = None) -> int:
        i = len(self.sent)
        words = t if words is None else words
        self.sent.append(t)
        if i == len(self.kinds):
            self.kinds = np.concatenate([self.kinds, np.zeros((max(i, 64), 3), dtype=np.int64)])
        self.kinds[i] = kind
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
        check = (counts[inverse.reshape(-1)] > 1) | np.isin(sl.ptrs, np.fromiter(self.at, np.int64, len(self.at)))
        local: dict[tuple, int] = {}
        for i in np.flatnonzero(check).tolist():
            key = _view_key(sl.objs[i])
            hit = next((s for k, s in self.at.get(key[0], ()) if k == key), None)
            if hit is not None:
                ref[i] = hit
            else:
                link[i] = local.setdefault(key, i)
        return ref, link

    def _same(self, words: torch.Tensor, kind: np.ndarray, v: int) -> bool:
        return bool((kind == self.kinds[v]).all()) and bool(equal_pairs([words], [self.words[v]]))

    def _by_value(self, sl: _Slice, fresh: np.ndarray) -> np.ndarray:
        """Sent index of each ``fresh`` object (all showing distinct views): an earlier value proven equal, or new."""
        n = len(fresh)
        objs, kinds = _pick(sl.objs, fresh), sl.kind[fresh]
        ptrs, counts = sl.ptrs[fresh], (sl.nbytes[fresh] + 3) // 4
        words = list(objs)
        for i in np.flatnonzero(~(sl.contiguous[fresh] & (ptrs % 4 == 0) & (sl.nbytes[fresh] % 4 == 0))).tolist():
            words[i] = word_aligned(objs[i])  # a zero-padded copy, read in its place
            ptrs[i] = words[i].data_ptr()
        cuda = n > 0 and objs[0].is_cuda
        sums = sums_at(objs[0].device, ptrs, counts) if cuda else fingerprints(words)
        keys = _mix(np.concatenate([kinds, sums], axis=1))
        # per distinct print of the slice: its first object here, and an earlier value with it
        uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        uniq_keys = uniq.tolist()
        earlier = np.fromiter(map(self.prints.get, uniq_keys, itertools.repeat(-1)), np.int64, len(uniq_keys))
        inverse = inverse.reshape(-1)
        ref = np.full(n, -1, dtype=np.int64)
        new = np.flatnonzero(earlier < 0)
        for u in new[np.argsort(first[new])].tolist():  # a new print: a new value (in stream order)
            i = int(first[u])
            ref[i] = self.prints[uniq_keys[u]] = self._new(objs[i], kinds[i], words[i])
        rest = np.flatnonzero(ref < 0)  # a value with the print exists: the same kind, then the same bytes
        cand = np.where(earlier[inverse[rest]] >= 0, earlier[inverse[rest]], ref[first[inverse[rest]]])
        equal = (kinds[rest] == self.kinds[cand]).all(axis=1)
        same_kind = np.flatnonzero(equal)  # only these are compared: equal sizes, so no read runs past a tensor
        if cuda:
            right = np.array(self.addrs, dtype=np.int64)[cand[same_kind]]
            a = ptrs[rest[same_kind]]
            equal[same_kind] = equal_at(objs[0].device, a, right, counts[rest[same_kind]], True).cpu().numpy()
        else:
            left, right = _pick(words, rest[same_kind]), _pick(self.words, cand[same_kind])
            equal[same_kind] = equal_pairs(left, right).numpy()
        ref[rest[equal]] = cand[equal]
        for i in rest[~equal].tolist():  # a print shared by unequal values (rare): every value of it in turn
            key = int(keys[i])
            values = [self.prints[key], *self.collided.get(key, ())]
            hit = next((v for v in values if self._same(words[i], kinds[i], v)), -1)
            ref[i] = hit if hit >= 0 else self._new(objs[i], kinds[i], words[i])
            if hit < 0:
                self.collided.setdefault(key, []).append(int(ref[i]))
        return ref

    def slice(self, sl: _Slice) -> None:
        ref, link = self._by_view(sl)
        fresh = np.flatnonzero((ref < 0) & (link == np.arange(len(sl.objs))))
        if self.declared:
            ref[fresh] = [self._new(sl.objs[i], sl.kind[i]) for i in fresh.tolist()]
        else:
            ref[fresh] = self._by_value(sl, fresh)
        ref = ref[link]  # views of an object of this slice: its value
        self.refs.append(ref[sl.of_name])
        self.names.append(sl.names)

    def run(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> Dedup:
        stream = iter(pairs)
        by_address = True
        while (sl := _Slice.read(_take(stream, self.slice_bytes), self.shape_ids, by_address)).names:
            self.slice(sl)
            by_address = len(sl.objs) > len(sl.names) // 4
            del sl  # the slice's duplicates can go
        refs = np.concatenate(self.refs) if self.refs else np.zeros(0, dtype=np.int64)
        names = list(itertools.chain.from_iterable(self.names))
        if len(set(names)) != len(names):
            raise ValueError(f"adapter stream repeats the name {_first_repeat(names)!r}")
        order = np.argsort(refs, kind="stable")
        ends = np.cumsum(np.bincount(refs, minlength=len(self.sent))).tolist()
        grouped = _pick(names, order)
        by_sent = [list(grouped[s:e]) for s, e in zip([0, *ends[:-1]], ends, strict=True)]
        counts = np.diff([0, *ends])
        nbytes = self.kinds[: len(self.sent), 2]
        return Dedup(
            unique={ns[0]: t for ns, t in zip(by_sent, self.sent, strict=True)},
            names={ns[0]: ns for ns in by_sent},
            public_count=len(names),
            public_bytes=int((nbytes * counts).sum()),
        )


def _first_repeat(names: list[str]) -> str:
    """The first name of ``names`` that occurs again later."""
    counts = Counter(names)
    return next(n for n in names if counts[n] > 1)


def deduplicate(
    adapter: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
    *,
    shared_storage: bool = False,
    slice_bytes: int | None = None,
) -> Dedup:
    """``shared_storage``: the exporter declares that it hands out one storage for all names of one tensor
    (Megatron-Bridge ``share_expert_adapters``), so distinct storages are distinct tensors and no value is
    compared. Without it, equality is proven. Exact either way: a wrong declaration only sends a duplicate.
    ``slice_bytes``: a slice also ends once its distinct tensors hold this many bytes, bounding the exporter's
    duplicates held at once (an exporter of copies materialises every name: ~1 GB per 4,096 names on GLM-5.3)."""
    return _Deduper(shared_storage, slice_bytes).run(adapter.items() if isinstance(adapter, Mapping) else adapter)
