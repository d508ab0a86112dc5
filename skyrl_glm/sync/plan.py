"""The sender's plan: deduplicate, lay out and pack the stream, fold alpha, checksum, write the manifest.

Input is the adapter as a stream of ``(public name, tensor)`` pairs: a PEFT state dict or Megatron-Bridge's
``export_adapter_weights``. Work is per unique tensor, not per public name:

* **Dedup, exact.** Names showing one storage view are one sent tensor; no value is compared. When the exporter
  declares its sharing (``shared_storage``: Bridge's ``share_expert_adapters`` hands out one tensor under every
  expert name), that is all. Otherwise equality is *proven* within candidate groups (one (layer, A/B): the
  experts' adapters and the fused modules' shared ``lora_A``) in batches: each candidate against its predecessor,
  then the first of each run of equals by fingerprint (exact int64 word sums) and comparison against earlier
  values. A fingerprint never decides alone; each phase costs one host sync for all groups. Duplicates are dropped
  per chunk, so sender memory stays near the unique adapter.
* **Alias runs.** Each sent tensor's public names become :class:`~skyrl_glm.sync.aliases.AliasRun` rules
  (expert-index ranges) plus a few explicit aliases: a ~0.3 MB manifest instead of a 17 MB map.
* **Pack, fold, checksum on the packed stream.** The unique tensors are copied once into the stream buffer (the
  transport's staging memory where it has one), ``lora_B`` last so the B tensors of one dtype form one region;
  SkyRL 0.4's ``fold_lora_alpha_for_vllm`` scales that region in one call (its elementwise float32 arithmetic,
  once per sent tensor however many names alias it); :func:`~skyrl_glm.sync.checksum.span_checks` checksums
  every tensor in one pass. Transports send the buffer as it is.
"""

from __future__ import annotations

import itertools
import operator
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from skyrl.backends.skyrl_train.distributed.megatron.lora_export import (
    LORA_B_SUFFIX,
    fold_lora_alpha_for_vllm,
    mark_alpha_folded,
)

from skyrl_glm.sync.aliases import AliasRun, runs_of
from skyrl_glm.sync.checksum import int32_words, span_checks
from skyrl_glm.sync.compare import equal_pairs
from skyrl_glm.sync.manifest import DTYPES, Manifest, TensorEntry, dtype_name, pack_entries, views
from skyrl_glm.sync.nogc import paused_gc

DEFAULT_BUCKET_BYTES = 512 << 20
_CHUNK = 2048  # pending candidates of one group decided together (bounds what duplicates hold)
_SLICE = 16384  # stream pairs grouped by object at once
_STACK_BYTES = 1 << 30  # at most this much stacked per comparison

Staging = Callable[[int, torch.device], torch.Tensor]


def expert_group(name: str) -> str | None:
    """Candidate group of a per-expert name (the expert index wildcarded); ``None`` for other names."""
    i = name.find(".experts.")
    j = name.find(".", i + 9) if i >= 0 else -1
    if j < 0 or not name[i + 9 : j].isdigit():
        return None
    return f"{name[: i + 9]}*{name[j:]}"


def candidate_group(name: str) -> str | None:
    """Names whose values may be equal: one (layer, A/B). Covers the experts of a layer sharing one adapter and the
    fused ``linear_fc1`` / ``linear_qkv`` ``lora_A`` that Bridge exports under every member (gate and up, q/k/v) even
    when the exporter hands out copies. Per-expert names outside a layer fall back to :func:`expert_group`."""
    i = name.find(".layers.")
    j = name.find(".", i + 8) if i >= 0 else -1
    if j > 0 and name[i + 8 : j].isdigit():
        for ab in (".lora_A.", ".lora_B."):
            if ab in name:
                return name[:j] + ".*" + ab
    return expert_group(name)


def _view_key(t: torch.Tensor) -> tuple:
    # data_ptr() already includes the storage offset.
    return (t.data_ptr(), t.shape, t.stride(), t.dtype)


@dataclass(slots=True)
class _Storage:
    """One distinct storage view of the stream and every public name that shows it (stream order)."""

    tensor: torch.Tensor
    names: list[str]
    key: tuple  # its view key


@dataclass
class _Group:
    values: dict[tuple, list[_Storage]] = field(default_factory=dict)  # (shape, dtype) -> its unique values
    prints: dict[tuple, _Storage] = field(default_factory=dict)  # (shape, dtype, fingerprint) -> unique value
    printed: set[int] = field(default_factory=set)  # ids of the unique values whose fingerprint is in ``prints``
    pending: list[_Storage] = field(default_factory=list)
    last: dict[tuple, _Storage] = field(default_factory=dict)  # (shape, dtype) -> the last candidate's value


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


def _fingerprints(stacked: torch.Tensor) -> torch.Tensor:
    """Per row, the int64 sum of its bytes read as int32 words (exact, order independent: equal rows, equal
    prints). Only a filter that finds candidates: equality itself is always decided by comparing values."""
    return int32_words(stacked.reshape(stacked.shape[0], -1).view(torch.uint8)).sum(1, dtype=torch.int64)


def _stacked(tensors: Sequence[torch.Tensor]) -> Iterator[tuple[int, torch.Tensor]]:
    """``(first index, stacked chunk)``, each chunk at most ``_STACK_BYTES``."""
    per = max(1, _STACK_BYTES // max(1, tensors[0].numel() * tensors[0].element_size()))
    for i in range(0, len(tensors), per):
        yield i, torch.stack(list(tensors[i : i + per]))


def _host(flags: list[torch.Tensor]) -> list[bool]:
    return torch.cat([f.to("cpu") for f in flags]).tolist() if flags else []


class _Deduper:
    def __init__(self, declared: bool) -> None:
        self.declared = declared
        self.groups: dict[str, _Group] = {}
        self.sent: list[_Storage] = []
        self.by_view: dict[tuple, _Storage] = {}
        self.by_object: dict[int, _Storage] = {}

    def keep(self, group: _Group, meta: tuple, s: _Storage) -> None:
        group.values.setdefault(meta, []).append(s)
        self.sent.append(s)

    def drop(self, dup: _Storage, ref: _Storage) -> None:
        """``dup`` equals ``ref``: its names show ``ref``. Once the exporter frees ``dup`` its address may come back
        with another value, so its view key and object id are forgotten."""
        ref.names.extend(dup.names)
        if self.by_view.get(dup.key) is dup:
            del self.by_view[dup.key]
        if self.by_object.get(id(dup.tensor)) is dup:
            del self.by_object[id(dup.tensor)]

    def resolve(self, groups: Iterable[_Group]) -> None:
        """Decide the pending candidates of ``groups``, stream order kept per (group, shape, dtype):

        1. each candidate against the one before it (exporter copies come in runs: expert after expert), in stacked
           comparisons; a candidate equal to its predecessor takes its value;
        2. the first candidate of each run of equals (a *head*) by fingerprint against every earlier value;
        3. heads with an equal fingerprint compared with that value: equal, an alias; else a new value.

        One host sync per phase for all groups together."""
        todo: list[tuple[_Group, tuple, list[_Storage]]] = []
        for group in groups:
            by_meta: dict[tuple, list[_Storage]] = {}
            for s in group.pending:
                by_meta.setdefault((tuple(s.tensor.shape), s.tensor.dtype), []).append(s)
            group.pending = []
            todo += [(group, meta, members) for meta, members in by_meta.items()]
        if not todo:
            return
        # (1) each candidate against its predecessor (for the first: the value of the previous batch's last one; never
        # a dropped duplicate, whose memory the exporter may have reused)
        left: list[torch.Tensor] = []
        right: list[torch.Tensor] = []
        for group, meta, members in todo:
            chain = [group.last[meta].tensor] if meta in group.last else []
            chain += [m.tensor for m in members]
            left += chain[1:]
            right += chain[:-1]
        equal = iter(_host([equal_pairs(left, right)]))
        rep: dict[int, _Storage] = {}  # id(candidate) -> the head of its run, or the decided value
        heads: list[tuple[_Group, tuple, _Storage]] = []
        for group, meta, members in todo:
            prev = group.last.get(meta)
            for i, m in enumerate(members):
                if (i > 0 or prev is not None) and next(equal):
                    rep[id(m)] = rep[id(members[i - 1])] if i > 0 else prev
                else:
                    rep[id(m)] = m
                    heads.append((group, meta, m))
        # (2) heads by fingerprint against every earlier value (those without a fingerprint get one now)
        prints, unprinted = [], []
        for group, meta, head in heads:
            new = [v for v in group.values.get(meta, []) if id(v) not in group.printed]
            group.printed.update(id(v) for v in new)
            unprinted.append(new)
            for _, st in _stacked([v.tensor for v in [*new, head]]):
                prints.append(_fingerprints(st))
        fps = iter(torch.cat([p.to("cpu") for p in prints]).tolist() if prints else [])
        pairs: dict[tuple, list[tuple[_Storage, _Storage]]] = {}
        for (group, meta, head), new in zip(heads, unprinted, strict=True):
            for v in new:
                group.prints.setdefault((meta, next(fps)), v)
            ref = group.prints.get((meta, fp := next(fps)))
            if ref is None:
                group.prints[(meta, fp)] = head
                group.printed.add(id(head))
                self.keep(group, meta, head)
            else:
                pairs.setdefault(meta, []).append((head, ref))
        # (3) equal fingerprints: compare the values
        flat = [p for ps in pairs.values() for p in ps]
        equal = iter(_host([equal_pairs([h.tensor for h, _ in flat], [r.tensor for _, r in flat])]))
        value: dict[int, _Storage] = {}  # id(head) -> its value
        for meta, ps in pairs.items():
            for head, ref in ps:
                if next(equal):
                    value[id(head)] = ref
                else:  # a fingerprint collision: a distinct value after all
                    group = next(g for g, m, h in heads if h is head)
                    self.keep(group, meta, head)
        # every candidate now has a value: itself (kept) or an earlier one
        for group, meta, members in todo:
            for m in members:
                r = rep[id(m)]
                v = value.get(id(r), r)
                if v is not m:
                    self.drop(m, v)
            last = rep[id(members[-1])]
            group.last[meta] = value.get(id(last), last)

    def add(self, name_group: list[str], t: torch.Tensor) -> None:
        """Names of one tensor object (stream order): onto its storage, or a new storage (a candidate when the
        exporter declared no sharing)."""
        s = self.by_object.get(id(t))
        if s is not None and s.tensor is t:
            s.names += name_group
            return
        key = _view_key(t)
        s = self.by_view.get(key)
        if s is not None:
            s.names += name_group
            return
        s = self.by_view[key] = self.by_object[id(t)] = _Storage(t, name_group, key)
        gname = None if self.declared else candidate_group(name_group[0])
        if gname is None:
            self.sent.append(s)
            return
        group = self.groups.setdefault(gname, _Group())
        group.pending.append(s)
        if len(group.pending) >= _CHUNK:
            self.resolve([group])

    def run(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> Dedup:
        """Per slice of the stream, names are grouped by tensor object in bulk (numpy over object ids), so the
        Python work is per distinct object, not per public name."""
        count = 0
        stream = iter(pairs)
        while chunk := list(itertools.islice(stream, _SLICE)):
            count += len(chunk)
            names, tensors = zip(*chunk, strict=True)
            ids = np.fromiter(map(id, tensors), dtype=np.uint64, count=len(tensors))
            _, first, inverse, sizes = np.unique(ids, return_index=True, return_inverse=True, return_counts=True)
            by_object = operator.itemgetter(*np.argsort(inverse, kind="stable").tolist())(names)
            if len(chunk) == 1:
                by_object = (by_object,)
            ends = np.cumsum(sizes).tolist()
            starts = [0, *ends[:-1]]
            for k in np.argsort(first, kind="stable").tolist():  # objects in order of first appearance
                self.add(list(by_object[starts[k] : ends[k]]), tensors[first[k]])
        self.resolve(self.groups.values())
        seen = set(itertools.chain.from_iterable(s.names for s in self.sent))
        if len(seen) != count:
            repeated = Counter(itertools.chain.from_iterable(s.names for s in self.sent)).most_common(1)[0][0]
            raise ValueError(f"adapter stream repeats the name {repeated!r}")
        public_bytes = sum(s.tensor.numel() * s.tensor.element_size() * len(s.names) for s in self.sent)
        return Dedup(
            unique={s.names[0]: s.tensor for s in self.sent},
            names={s.names[0]: s.names for s in self.sent},
            public_count=count,
            public_bytes=public_bytes,
        )


def deduplicate(
    adapter: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor], *, shared_storage: bool = False
) -> Dedup:
    """``shared_storage``: the exporter declares that it hands out one storage for all names of one tensor
    (Megatron-Bridge ``share_expert_adapters``), so distinct storages are distinct tensors and no value is
    compared. Without it, equality is proven within candidate groups. Exact either way: a wrong declaration
    only sends a duplicate."""
    return _Deduper(shared_storage).run(adapter.items() if isinstance(adapter, Mapping) else adapter)


def alias_rules(names: Mapping[str, list[str]]) -> tuple[dict[str, str], list[AliasRun]]:
    """Each sent tensor's public names as runs plus explicit ``{public: sent}`` aliases."""
    explicit: dict[str, str] = {}
    runs: list[AliasRun] = []
    for sent, public in names.items():
        if len(public) == 1:
            continue
        r, rest = runs_of(sent, public)
        runs += r
        explicit.update(dict.fromkeys(rest, sent))
    return explicit, runs


def synchronize(device: torch.device | str) -> None:
    """Wait for the work queued on ``device`` (CUDA runs asynchronously; a no-op on CPU), so stage times are honest."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def jsonable_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A PEFT adapter config as plain JSON data (sets become sorted lists, enums their values)."""

    def conv(v: Any) -> Any:
        if isinstance(v, (set, frozenset)):
            return sorted(conv(x) for x in v)
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        if isinstance(v, Mapping):
            return {str(k): conv(x) for k, x in v.items()}
        if hasattr(v, "value") and not isinstance(v, (int, float, str, bool)):
            return v.value
        return v if isinstance(v, (int, float, str, bool, type(None))) else str(v)

    return {str(k): conv(v) for k, v in config.items()}


def zeroed(nbytes: int, device: torch.device) -> torch.Tensor:
    """Default stream buffer: zeros (the padding after each tensor must be zero for its checksum)."""
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)


def layout(tensors: Mapping[str, torch.Tensor]) -> tuple[list[TensorEntry], int]:
    """``(entries, total_bytes)``: entries at 64-byte aligned offsets, in the order given."""
    entries, total = pack_entries(
        (name, dtype_name(t.dtype), tuple(t.shape), t.numel() * t.element_size()) for name, t in tensors.items()
    )
    return list(entries), total


def pack_into(buffer: torch.Tensor, entries: Sequence[TensorEntry], tensors: Sequence[torch.Tensor]) -> None:
    """Copy each tensor's bytes to its entry's offset (one fused multi-tensor copy where the device has one)."""
    dst = [buffer[e.offset : e.offset + e.nbytes] for e in entries]
    src = [t.reshape(-1).view(torch.uint8) for t in tensors]
    if dst:
        torch._foreach_copy_(dst, src)


@dataclass
class SyncPlan:
    """What the sender transmits: the manifest and the packed, alpha-folded stream (``tensors`` are views of it)."""

    manifest: Manifest
    tensors: list[torch.Tensor]
    public_count: int
    public_bytes: int
    timings: dict[str, float]
    buffer: torch.Tensor

    def buckets(self) -> Iterator[tuple[int, torch.Tensor]]:
        """``(stream offset, uint8 slice of the stream)`` per bucket of the manifest."""
        for start, end in self.manifest.buckets():
            yield start, self.buffer[start:end]


def _fold_regions(buffer: torch.Tensor, entries: Sequence[TensorEntry], r: int, alpha: float) -> None:
    """SkyRL's fold over each contiguous run of ``lora_B`` tensors of one dtype (the layout puts them last)."""
    regions: list[list[Any]] = []  # [dtype, start, end]
    for e in entries:
        if not e.name.endswith(LORA_B_SUFFIX):
            continue
        if regions and regions[-1][0] == e.dtype:
            regions[-1][2] = e.offset + e.nbytes
        else:
            regions.append([e.dtype, e.offset, e.offset + e.nbytes])
    key = "region" + LORA_B_SUFFIX
    for dtype, start, end in regions:
        region = buffer[start:end].view(DTYPES[dtype])
        region.copy_(fold_lora_alpha_for_vllm({key: region}, config_rank=r, alpha=alpha)[key])


def build_plan(
    adapter: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
    *,
    adapter_config: Mapping[str, Any],
    lora_name: str,
    version: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    staging: Staging = zeroed,
    shared_storage: bool = False,
) -> SyncPlan:
    """Deduplicate, pack, fold ``lora_alpha / r`` into the unique ``lora_B`` tensors, checksum, write the manifest.
    ``staging(nbytes, device)`` gives the zeroed stream buffer (a transport's shared memory, say);
    ``shared_storage``: see :func:`deduplicate`."""
    with paused_gc():
        return _build_plan(adapter, adapter_config, lora_name, version, bucket_bytes, staging, shared_storage)


def _build_plan(
    adapter: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
    adapter_config: Mapping[str, Any],
    lora_name: str,
    version: int,
    bucket_bytes: int,
    staging: Staging,
    shared_storage: bool,
) -> SyncPlan:
    t0 = time.perf_counter()
    dedup = deduplicate(adapter, shared_storage=shared_storage)
    device = next(iter(dedup.unique.values())).device if dedup.unique else torch.device("cpu")
    synchronize(device)
    t1 = time.perf_counter()
    explicit, runs = alias_rules(dedup.names)
    t2 = time.perf_counter()
    config = jsonable_config(adapter_config)
    r, alpha = config["r"], config.get("lora_alpha", config["r"])

    # lora_B last, grouped by dtype: one contiguous region per dtype to fold.
    def place(name: str) -> tuple[bool, str]:
        is_b = name.endswith(LORA_B_SUFFIX)
        return is_b, dtype_name(dedup.unique[name].dtype) if is_b else ""

    ordered = {n: dedup.unique[n] for n in sorted(dedup.unique, key=place)}
    entries, total = layout(ordered)
    buffer = staging(total, device)
    pack_into(buffer, entries, list(ordered.values()))
    synchronize(buffer.device)
    t3 = time.perf_counter()
    if alpha != r:
        _fold_regions(buffer, entries, r, alpha)
    synchronize(buffer.device)  # CUDA work is asynchronous: without this the fold's time lands in the checksum stage
    t4 = time.perf_counter()
    sums, _ = span_checks(buffer, [(e.offset, e.nbytes, e.dtype) for e in entries])
    t5 = time.perf_counter()
    manifest = Manifest(
        version=version,
        lora_name=lora_name,
        adapter_config=mark_alpha_folded(config),
        tensors=tuple(entries),
        aliases=explicit,
        total_bytes=total,
        bucket_bytes=bucket_bytes,
        checksums="".join(sums),
        alias_runs=tuple(runs),
    )
    manifest.validate()
    timings = {
        "dedup_s": t1 - t0,
        "alias_s": t2 - t1,
        "pack_s": t3 - t2,
        "fold_s": t4 - t3,
        "checksum_s": t5 - t4,
        "manifest_s": time.perf_counter() - t5,
    }
    return SyncPlan(manifest, views(buffer, entries), dedup.public_count, dedup.public_bytes, timings, buffer)
