"""Exact deduplication of an exported adapter: each unique tensor once, with every public name that shows it.

The exporter's stream is ``(public name, tensor)`` pairs; a full GLM-5.3 export has 116,292 names over 1,389 unique
tensors. The stream is read in parts at C level (:class:`StreamReader`; a stream that renames on the way, like the
Megatron sync's, is a reader of its own), and work is in bulk per slice of 4,096 pairs: each object's address,
shape, strides, dtype and contiguity are read once by C-level maps while the slice is in the CPU cache, and
everything after is numpy (no Python step per name, and none per object on the common paths; with exporter copies
every pass over the objects costs a cache miss each):

1. **Objects.** Names are grouped by object: by address first where objects are many (copies), by object identity
   where few (shared storage); either way the same grouping.
2. **Views.** Objects showing one storage view (data pointer, shape, strides, dtype: one ``np.unique`` over their
   ids) are one tensor; no value is compared. Only tensors being sent are remembered by address: a dropped
   duplicate's memory may come back from the exporter's allocator holding another value.
3. **Values**, unless the exporter declares its sharing (``shared_storage``: Megatron-Bridge's
   ``share_expert_adapters`` hands out one storage under every expert name, so distinct storages are distinct
   values: a slice's fresh objects are sent in one bulk step, and as every storage is sent the reader counts no
   bytes and reads a slice in one part). Each new object gets a *print*: its kind (exact shape id, dtype, size)
   and its checksum's two sums (:func:`~skyrl_glm.sync.checksum.sums_at`, one launch per slice over an address
   table), mixed into one uint64.
   An object whose print an earlier value has is checked against it by kind (numpy: equal sizes, so no read runs
   past a tensor), then proven byte-equal (:func:`~skyrl_glm.sync.compare.equal_at`, one launch per slice). A print
   never decides alone: on a failed proof the object is compared with every value of that print in turn. Equal
   bytes, shape and dtype are one value wherever they occur (the zero-initialised ``lora_B`` of every layer, say);
   duplicates are released after their slice, so sender memory stays near the unique adapter.
4. **Rules.** The names, grouped per sent tensor by one stable sort, become the manifest's alias rules in one pass
   over their joined text (:func:`~skyrl_glm.sync.aliases.cover`: expert-index runs, the rest explicit), and no
   name may repeat, checked on the rules (a run's names differ by construction): runs that overlap or a name left
   out of the runs that a run names too. Only a suspicion walks every name, for the first repeat.

5. **Memo**, with declared sharing and a :class:`DedupMemo` kept across the updates of a run: an export's names, and
   which name shows which tensor, are the same every update (only the values change), so an update whose names
   equal the last one's and whose tensors repeat its identity pattern is deduplicated by checking exactly that at C
   speed (one list comparison, one address read and one numpy comparison over the names) and per sent tensor (its
   shape, dtype and strides); no sort, no alias-rule pass. An exporter that hands out a new view object per name
   (Megatron-Bridge's gate/up split per expert) repeats the pattern by storage view instead, read per distinct
   object. Anything else is deduplicated in full and remembered.

Sent tensors are in stream order of first appearance (a value told apart only after a fingerprint collision comes
after its slice's other new values); each sent tensor's names keep stream order, the first is its sent name.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import math
import operator
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from skyrl_glm.sync.aliases import AliasError, AliasRun, NameIndex, cover
from skyrl_glm.sync.checksum import fingerprints, sums_at, word_aligned
from skyrl_glm.sync.compare import equal_at, equal_pairs

SLICE = 4096  # stream pairs decided together (bounds what the exporter's duplicates hold)
PART = 256  # pairs read at once while a slice's bytes are counted


@dataclass
class Dedup:
    """Result of deduplication: the tensors to send, each with every public name that shows it, and those names as
    alias rules (:func:`~skyrl_glm.sync.aliases.cover`, made here in one pass: the names are already grouped)."""

    unique: dict[str, torch.Tensor]  # sent name (its first public name) -> tensor
    grouped: Sequence[str]  # every sent tensor's public names (stream order, the sent name first), one after another
    ends: list[int]  # where each sent tensor's names end in ``grouped``
    runs: list[AliasRun]  # the aliases in expert-index runs ...
    explicit: dict[str, str]  # ... and the others, ``{public: sent}``
    public_count: int
    public_bytes: int
    prefix: str = ""  # every name of ``grouped`` shows under ``prefix + name`` (added per rule, not per name)
    # A token for a structure known unchanged (names, rules, each sent tensor's dtype and shape), which the export
    # memo gives what it learned and recalls: the plan's cache then keys on it instead of reading every tensor.
    structure: object | None = field(default=None, compare=False)
    # Each sent tensor's data address (``unique``'s order), where the export memo vouches that every one is
    # contiguous and lies there: the pack's copy table reads it instead of asking each tensor.
    addresses: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def names(self) -> dict[str, list[str]]:
        """Sent name -> its public names, the sent name first (tests, small adapters)."""
        grouped = [self.prefix + n for n in self.grouped]
        return {grouped[s]: grouped[s:e] for s, e in zip([0, *self.ends], self.ends, strict=False)}

    def prefixed(self, prefix: str) -> Dedup:
        """This result with every public name under ``prefix`` (a stream's renaming, done on the few rules, not on
        every name): a run's names prefixed are the prefixed run's, and equal names stay equal, distinct ones
        distinct."""
        rename = prefix.__add__
        return Dedup(
            unique=dict(zip(map(rename, self.unique), self.unique.values(), strict=True)),
            grouped=self.grouped,
            ends=self.ends,
            runs=[AliasRun(prefix + r.head, r.start, r.stop, r.tail, prefix + r.sent) for r in self.runs],
            explicit={prefix + p: prefix + sent for p, sent in self.explicit.items()},
            public_count=self.public_count,
            public_bytes=self.public_bytes,
            prefix=prefix + self.prefix,
        )

    @property
    def aliases(self) -> dict[str, str]:
        """``{public: sent}`` for every alias, expanded (tests, small adapters)."""
        return {p: sent for sent, names in self.names.items() for p in names[1:]}


def _addresses(objs: Sequence[object]) -> np.ndarray:
    """Each object's address (its identity: the table holds them all alive), read at once: an object array holds a
    ``PyObject *`` per element. No Python call per object: ``id`` calls every audit hook (one Python hook, which
    filelock 4.3 installs at import, makes each call ~0.7 us), ``object.__hash__`` is still ~0.2 us a call."""
    table = np.fromiter(objs, object, len(objs))
    words = (ctypes.c_ssize_t * len(objs)).from_address(table.__array_interface__["data"][0])
    return np.frombuffer(words, np.intp).astype(np.int64)  # a copy: the table goes


class _Kinds:
    """Every shape, stride and dtype seen so far -> a small id (exact: a dict compares what it hashes). Per object
    its *kind* ``[shape id, dtype id, nbytes]`` (equal rows: equal shape, dtype and size) and its *view*
    ``[data_ptr, shape id, stride id, dtype id]`` (equal rows: one storage view; ``data_ptr`` includes the offset)."""

    def __init__(self) -> None:
        self.shapes: dict[torch.Size, int] = {}
        self.strides: dict[tuple[int, ...], int] = {}
        self.dtypes: dict[torch.dtype, int] = {}

    @staticmethod
    def _ids(table: dict, items: tuple) -> np.ndarray:
        for item in dict.fromkeys(items):
            table.setdefault(item, len(table))
        return np.fromiter(map(table.__getitem__, items), np.int64, len(items))

    def rows(self, objs: Sequence[torch.Tensor], ptrs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(kinds, views)`` of ``objs`` (at ``ptrs``)."""
        m = len(objs)
        shapes = self._ids(self.shapes, tuple(map(shape_of, objs)))
        dtypes = self._ids(self.dtypes, tuple(map(dtype_of, objs)))
        # sizes from the few distinct shapes and dtypes, not one more call per object
        numel = np.array([math.prod(shape) for shape in self.shapes], dtype=np.int64)
        itemsize = np.array([dtype.itemsize for dtype in self.dtypes], dtype=np.int64)
        kind = np.stack([shapes, dtypes, numel[shapes] * itemsize[dtypes]], axis=1) if m else np.zeros((0, 3), np.int64)
        strides = self._ids(self.strides, tuple(map(torch.Tensor.stride, objs)))
        views = np.stack([ptrs, shapes, strides, dtypes], axis=1) if m else np.zeros((0, 4), np.int64)
        return kind, views


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
    kind: np.ndarray  # [n, 3] int64, see :class:`_Kinds`
    views: np.ndarray  # [n, 4] int64, see :class:`_Kinds`

    @property
    def nbytes(self) -> np.ndarray:
        return self.kind[:, 2]

    @classmethod
    def read(cls, names: list[str], tensors: Sequence[torch.Tensor], kinds: _Kinds, by_address: bool) -> _Slice:
        """``by_address``: group names by address first (cheaper when most names are their own object; either way
        the grouping is the same)."""
        n = len(tensors)
        if by_address:  # many objects (an exporter's copies): addresses first, identities only where one repeats
            ptrs = np.fromiter(map(torch.Tensor.data_ptr, tensors), np.int64, n)
            _, first, inverse, counts = np.unique(ptrs, return_index=True, return_inverse=True, return_counts=True)
            inverse = inverse.reshape(-1)
            obj = first[inverse]  # each name's object, as the index of the object's first name
            shared = np.flatnonzero(counts[inverse] > 1)
        else:  # few objects under many names (shared storage): identities first, addresses per object
            ptrs, obj, shared = None, np.zeros(n, dtype=np.int64), np.arange(n)
        if len(shared):
            keys = _addresses(tensors if len(shared) == n else _pick(tensors, shared))
            _, key_first, key_inverse = np.unique(keys, return_index=True, return_inverse=True)
            obj[shared] = shared[key_first][key_inverse.reshape(-1)]
        heads, position = np.unique(obj, return_inverse=True)  # objects in order of first appearance
        objs = _pick(tensors, heads)
        if ptrs is None:
            ptrs = np.zeros(n, dtype=np.int64)
            ptrs[heads] = np.fromiter(map(torch.Tensor.data_ptr, objs), np.int64, len(objs))
        contiguous = np.fromiter(map(torch.Tensor.is_contiguous, objs), bool, len(objs))
        return cls(names, position.reshape(-1), objs, ptrs[heads], contiguous, *kinds.rows(objs, ptrs[heads]))


# per-tensor getters for C-level maps over many tensors (the plan's and the export memo's too)
shape_of = operator.attrgetter("shape")
dtype_of = operator.attrgetter("dtype")
_nbytes = operator.attrgetter("nbytes")


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


@dataclass
class Part:
    """A few pairs of the stream, and its tensors by address (empty when the reader counts no bytes): what the
    part holds, views of one memory counted once."""

    names: Sequence[str]
    tensors: Sequence[torch.Tensor]
    by_address: dict[int, torch.Tensor]

    @classmethod
    def of(cls, names: Sequence[str], tensors: Sequence[torch.Tensor]) -> Part:
        """Per address, the last name's tensor (as a dict over every name keeps). A long part (shared storage: few
        objects under many names) asks each object once, in order of its last name: the same tensor per address."""
        objs = tensors
        if len(tensors) > 32:
            _, last = np.unique(_addresses(tensors)[::-1], return_index=True)
            objs = _pick(tensors, np.sort(len(tensors) - 1 - last))
        return cls(names, tensors, dict(zip(map(torch.Tensor.data_ptr, objs), objs, strict=True)))


class StreamReader:
    """A ``(name, tensor)`` stream read in parts at C level (a Python step per pair costs more than the dedup of a
    stream with shared storage). With ``slice_bytes``, a part grows, doubling from one pair up to :data:`PART`, while
    the memory of the last one's tensors held at most a sixteenth of it, and halves when they held more: an
    exporter handing out a copy per name is read a few pairs at a time, about an eighth of a slice ahead at most.
    Without ``slice_bytes`` (declared sharing) a part is as long as asked.
    A stream that renames or holds back pairs on the way (the Megatron sync's) subclasses :meth:`part`, so its
    pairs are read once."""

    def __init__(self, stream: Iterable[tuple[str, torch.Tensor]], slice_bytes: int | None) -> None:
        self.stream = iter(stream)
        self.slice_bytes = slice_bytes
        self.size = 1

    def part(self, at_most: int = PART) -> Part | None:
        """The next part, of at most ``at_most`` pairs; None at the end."""
        counted = self.slice_bytes is not None
        pairs = list(itertools.islice(self.stream, min(self.size, at_most) if counted else at_most))
        if not pairs:
            return None
        names, tensors = zip(*pairs, strict=True)
        if not counted:
            return Part(names, tensors, {})
        part = Part.of(names, tensors)
        held = sum(map(_nbytes, part.by_address.values()))
        self.size = min(PART, 2 * self.size) if 16 * held <= self.slice_bytes else max(1, self.size // 2)
        return part


def _take(reader: StreamReader, max_bytes: int | None) -> tuple[list[str], list[torch.Tensor]]:
    """The next slice of the stream as ``(names, tensors)``: :data:`SLICE` pairs, fewer once its tensors' memory
    holds ``max_bytes``."""
    names: list[str] = []
    tensors: list[torch.Tensor] = []
    held, seen = 0, set()
    while len(names) < SLICE and (max_bytes is None or held < max_bytes):
        part = reader.part(SLICE - len(names))
        if part is None:
            break
        names += part.names
        tensors += part.tensors
        if max_bytes is not None:
            held += sum(map(_nbytes, map(part.by_address.__getitem__, part.by_address.keys() - seen)))
            seen.update(part.by_address)
    return names, tensors


class _Deduper:
    def __init__(self, declared: bool, slice_bytes: int | None = None) -> None:
        self.declared = declared
        # declared sharing sends every storage the stream shows: what a slice holds is kept anyway, nothing to bound
        self.slice_bytes = None if declared else slice_bytes
        self.sent: list[torch.Tensor] = []
        self.kinds = np.zeros((0, 3), dtype=np.int64)  # per sent tensor, its kind (see ``_Slice.kind``); capacity grows
        self.kinds_seen = _Kinds()
        self.words: list[torch.Tensor] = []  # per sent tensor, its bytes readable as int32 words (itself, mostly)
        self.addrs: list[int] = []  # ... and their address
        self.at: dict[tuple[int, ...], int] = {}  # view (see ``_Kinds``) -> the sent tensor showing it
        self.sent_ptrs: set[int] = set()  # the sent tensors' addresses
        self.prints: dict[int, int] = {}  # print (kind and fingerprint, mixed) -> the first sent value with it
        self.collided: dict[int, list[int]] = {}  # print -> further sent values with it (rare)
        self.refs: list[np.ndarray] = []  # per slice: the sent index of each of its names
        self.names: list[list[str]] = []  # per slice: its names
        self.name_refs = np.zeros(0, dtype=np.int64)  # after run: per name of the stream, its sent index

    def _new(self, t: torch.Tensor, kind: np.ndarray, view: np.ndarray, words: torch.Tensor | None = None) -> int:
        return int(self._add((t,), kind[None], view[None], (t if words is None else words,))[0])

    def _add(
        self, objs: Sequence[torch.Tensor], kinds: np.ndarray, views: np.ndarray, words: Sequence[torch.Tensor]
    ) -> np.ndarray:
        """Send ``objs`` (``words``: their bytes as int32 words); returns their sent indices. In bulk: declared
        sharing sends every fresh object of a slice at once."""
        i, n = len(self.sent), len(objs)
        self.sent += objs
        if i + n > len(self.kinds):
            self.kinds = np.concatenate([self.kinds, np.zeros((max(i, 64, n), 3), dtype=np.int64)])
        self.kinds[i : i + n] = kinds
        self.words += words
        self.addrs += map(torch.Tensor.data_ptr, words)
        for at, view in enumerate(map(tuple, views.tolist()), i):
            self.at.setdefault(view, at)
        self.sent_ptrs.update(views[:, 0].tolist())
        return np.arange(i, i + n)

    def _by_view(self, sl: _Slice) -> tuple[np.ndarray, np.ndarray]:
        """``(ref, link)``: per object the sent index of the sent tensor whose view it shows (-1: none), and the
        first object of this slice showing its view (itself: none earlier). Only objects whose address repeats in
        the slice or is a sent tensor's are looked at, and Python works per distinct view among them."""
        n = len(sl.objs)
        ref = np.full(n, -1, dtype=np.int64)
        link = np.arange(n)
        _, inverse, counts = np.unique(sl.ptrs, return_inverse=True, return_counts=True)
        at_sent = np.fromiter(map(self.sent_ptrs.__contains__, sl.ptrs.tolist()), bool, n)
        check = np.flatnonzero((counts[inverse.reshape(-1)] > 1) | at_sent)
        if len(check):
            views, first, of_view = np.unique(sl.views[check], axis=0, return_index=True, return_inverse=True)
            of_view = of_view.reshape(-1)
            link[check] = check[first][of_view]
            hits = map(self.at.get, map(tuple, views.tolist()), itertools.repeat(-1))
            ref[check] = np.fromiter(hits, np.int64, len(views))[of_view]
        return ref, link

    def _same(self, words: torch.Tensor, kind: np.ndarray, v: int) -> bool:
        return bool((kind == self.kinds[v]).all()) and bool(equal_pairs([words], [self.words[v]]))

    def _by_value(self, sl: _Slice, fresh: np.ndarray) -> np.ndarray:
        """Sent index of each ``fresh`` object (all showing distinct views): an earlier value proven equal, or new."""
        n = len(fresh)
        objs, kinds, views = _pick(sl.objs, fresh), sl.kind[fresh], sl.views[fresh]
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
            ref[i] = self.prints[uniq_keys[u]] = self._new(objs[i], kinds[i], views[i], words[i])
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
            ref[i] = hit if hit >= 0 else self._new(objs[i], kinds[i], views[i], words[i])
            if hit < 0:
                self.collided.setdefault(key, []).append(int(ref[i]))
        return ref

    def slice(self, sl: _Slice) -> None:
        ref, link = self._by_view(sl)
        fresh = np.flatnonzero((ref < 0) & (link == np.arange(len(sl.objs))))
        if self.declared:
            objs = _pick(sl.objs, fresh)
            ref[fresh] = self._add(objs, sl.kind[fresh], sl.views[fresh], objs)
        else:
            ref[fresh] = self._by_value(sl, fresh)
        ref = ref[link]  # views of an object of this slice: its value
        self.refs.append(ref[sl.of_name])
        self.names.append(sl.names)

    def run(self, pairs: Iterable[tuple[str, torch.Tensor]] | StreamReader) -> Dedup:
        reader = pairs if isinstance(pairs, StreamReader) else StreamReader(pairs, self.slice_bytes)
        by_address = True
        while (taken := _take(reader, self.slice_bytes))[0]:
            sl = _Slice.read(*taken, self.kinds_seen, by_address)
            self.slice(sl)
            by_address = len(sl.objs) > len(sl.names) // 4
            del sl, taken  # the slice's duplicates can go
        refs = np.concatenate(self.refs) if self.refs else np.zeros(0, dtype=np.int64)
        self.name_refs = refs
        names = list(itertools.chain.from_iterable(self.names))
        counts = np.bincount(refs, minlength=len(self.sent))
        ends = np.cumsum(counts).tolist()
        grouped = _pick(names, np.argsort(refs, kind="stable"))
        sents = _pick(grouped, np.array([0, *ends[:-1]], dtype=np.int64)[: len(ends)])
        runs, lone = cover(grouped, ends, sents)
        _check_distinct(names, runs, [n for n, _ in lone])
        nbytes = self.kinds[: len(self.sent), 2]
        return Dedup(
            unique=dict(zip(sents, self.sent, strict=True)),
            grouped=grouped,
            ends=ends,
            runs=runs,
            explicit={n: sent for n, sent in lone if n != sent},
            public_count=len(names),
            public_bytes=int((nbytes * counts).sum()),
        )


def _check_distinct(names: list[str], runs: list[AliasRun], lone: list[str]) -> None:
    """No public name twice, checked on the rules rather than on every name: the names of one run differ by
    construction, so a repeat is two runs naming one name, a name left out of the runs that a run names too, or
    two such names. Only a suspicion walks every name, for the first repeat (rules that could name one name twice
    but do not are the manifest's to refuse)."""
    try:
        NameIndex(dict.fromkeys(lone, ""), runs)  # "" is no sent name: any of them in a run is refused
        suspect = len(set(lone)) != len(lone)
    except AliasError:
        suspect = True
    if suspect:
        counts = Counter(names)
        repeat = next((n for n in names if counts[n] > 1), None)
        if repeat is not None:
            raise ValueError(f"adapter stream repeats the name {repeat!r}")


_strides = operator.methodcaller("stride")


def _view_kinds(tensors: Sequence[torch.Tensor]) -> list[tuple]:
    """``(shape, dtype, strides)`` per tensor: what the manifest and the packing read of a sent tensor."""
    return list(zip(map(shape_of, tensors), map(dtype_of, tensors), map(_strides, tensors), strict=True))


def _view_rows(tensors: Sequence[torch.Tensor], ids: np.ndarray) -> np.ndarray:
    """Per tensor, the storage view it shows (a row of data pointer, shape, strides and dtype; see :class:`_Kinds`),
    read once per distinct object: an exporter may hand out a new view object per name of one tensor
    (Megatron-Bridge splits a fused ``linear_out`` into gate and up anew for every expert)."""
    _, first, of_obj = np.unique(ids, return_index=True, return_inverse=True)
    objs = _pick(tensors, first)
    ptrs = np.fromiter(map(torch.Tensor.data_ptr, objs), np.int64, len(objs))
    _, views = _Kinds().rows(objs, ptrs)
    return views[of_obj.reshape(-1)]


class DedupMemo:
    """The last declared-sharing result of a run's export (see step 5 of the module's doc), held by the sender
    across updates. Holds names and indices only: no tensor of an update outlives it here."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.refs = np.zeros(0, dtype=np.int64)  # per name: its sent tensor
        self.heads = np.zeros(0, dtype=np.int64)  # per sent tensor: the position of its first name
        self.kinds: list[tuple] = []  # per sent tensor: see _view_kinds
        self.result: Dedup | None = None  # with no tensors (``unique`` empty); its sent names in ``sent``
        self.sent: list[str] = []
        self.hits = 0

    def match(self, names: list[str], tensors: list[torch.Tensor]) -> Dedup | None:
        """This update deduplicated as the remembered one was, if its names are equal and each name shows the
        object (or else the storage view) its sent tensor's first name shows, those distinct and viewed alike;
        else None."""
        if self.result is None or names != self.names:
            return None
        ids = _addresses(tensors)
        if not self._repeats(ids) and not self._repeats(_view_rows(tensors, ids)):
            return None
        sent = _pick(tensors, self.heads)
        if _view_kinds(sent) != self.kinds:
            return None
        self.hits += 1
        return dataclasses.replace(self.result, unique=dict(zip(self.sent, sent, strict=True)))

    def _repeats(self, keys: np.ndarray) -> bool:
        """Each name's key (an address, or a view's row) is its sent tensor's first name's, and the sent tensors'
        keys are distinct."""
        heads = keys[self.heads]
        return np.array_equal(keys, heads[self.refs]) and len(np.unique(heads, axis=0)) == len(heads)

    def remember(self, names: list[str], result: Dedup, refs: np.ndarray) -> None:
        _, heads = np.unique(refs, return_index=True)  # sent indices are 0..n-1 in order
        self.names, self.refs, self.heads = names, refs, heads
        self.sent = list(result.unique)
        self.kinds = _view_kinds(list(result.unique.values()))
        self.result = dataclasses.replace(result, unique={})


def _read_all(pairs: Iterable[tuple[str, torch.Tensor]] | StreamReader) -> tuple[list[str], list[torch.Tensor]]:
    """Every pair of the stream as ``(names, tensors)``, read at C level (a :class:`StreamReader` through its
    parts, so a renaming stream renames as it does for the dedup)."""
    if not isinstance(pairs, StreamReader):
        listed = list(pairs)
        return [n for n, _ in listed], [t for _, t in listed]
    names: list[str] = []
    tensors: list[torch.Tensor] = []
    while (part := pairs.part(SLICE)) is not None:
        names += part.names
        tensors += part.tensors
    return names, tensors


def deduplicate(
    adapter: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor] | StreamReader,
    *,
    shared_storage: bool = False,
    slice_bytes: int | None = None,
    memo: DedupMemo | None = None,
) -> Dedup:
    """``shared_storage``: the exporter declares that it hands out one storage for all names of one tensor
    (Megatron-Bridge ``share_expert_adapters``), so distinct storages are distinct tensors and no value is
    compared. Without it, equality is proven. Exact either way: a wrong declaration only sends a duplicate.
    ``slice_bytes``: a slice also ends once its tensors' memory holds this many bytes, bounding the exporter's
    duplicates held at once (an exporter of copies materialises every name: ~1 GB per 4,096 names on GLM-5.3);
    ignored with ``shared_storage``, where every storage is sent (no byte is counted then).
    A :class:`StreamReader` is read as it is (its own ``slice_bytes`` sizes its parts). ``memo``: with
    ``shared_storage``, the run's :class:`DedupMemo` (an update like the last one costs a check per name at C speed
    and work per sent tensor)."""
    pairs = adapter.items() if isinstance(adapter, Mapping) else adapter
    deduper = _Deduper(shared_storage, slice_bytes)
    if memo is None or not shared_storage:
        return deduper.run(pairs)
    names, tensors = _read_all(pairs)
    hit = memo.match(names, tensors)
    if hit is not None:
        return hit
    result = deduper.run(zip(names, tensors, strict=True))
    memo.remember(names, result, deduper.name_refs)
    return result
