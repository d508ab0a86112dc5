"""The sender's plan: fold alpha, deduplicate, lay out the packed stream, write the manifest.

Input is the adapter as a stream of ``(public name, tensor)`` pairs: a PEFT state dict or Megatron-Bridge's
``export_adapter_weights``. Deduplication is exact: two names share one sent tensor only when they are the
same storage view, or when ``torch.equal``-equal within a candidate group (one (layer, A/B): the experts'
shared adapter and the fused modules' shared ``lora_A``). Equality within a group is decided in batches (one
stacked comparison per chunk of candidates, one host sync per chunk), not one synchronising ``torch.equal`` per
tensor; duplicates are dropped as soon as their chunk is decided, so sender memory stays near the unique adapter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from skyrl.backends.skyrl_train.distributed.megatron.lora_export import (
    fold_lora_alpha_for_vllm,
    mark_alpha_folded,
)

from skyrl_glm.sync.checksum import checksums, int32_words
from skyrl_glm.sync.manifest import Manifest, dtype_name, pack_entries

_EXPERT = re.compile(r"\.experts\.\d+\.")
DEFAULT_BUCKET_BYTES = 512 << 20
_CHUNK = 64  # candidates compared per host sync


_LAYER = re.compile(r"^(?P<layer>.*?\.layers\.\d+\.).*?(?P<ab>lora_[AB])\b")


def expert_group(name: str) -> str | None:
    """Candidate group of a per-expert name (the expert index wildcarded); ``None`` for other names."""
    grouped = _EXPERT.sub(".experts.*.", name, count=1)
    return grouped if grouped != name else None


def candidate_group(name: str) -> str | None:
    """Names whose values may be equal: one (layer, A/B). Covers the experts of a layer sharing one adapter and the
    fused ``linear_fc1`` / ``linear_qkv`` ``lora_A`` that Bridge exports under every member (gate and up, q/k/v) even
    when the exporter hands out copies. Per-expert names outside a layer fall back to :func:`expert_group`."""
    m = _LAYER.match(name)
    if m is not None:
        return f"{m['layer']}*.{m['ab']}"
    return expert_group(name)


def _view_key(t: torch.Tensor) -> tuple:
    # data_ptr() already includes the storage offset.
    return (t.data_ptr(), t.shape, t.stride(), t.dtype)


def _fingerprints(stacked: torch.Tensor) -> list[int]:
    """Per row, the int64 sum of its bytes read as int32 words (exact, order independent: equal rows, equal
    prints). Only a filter that finds candidates: equality itself is always decided by comparing values."""
    words = int32_words(stacked.reshape(stacked.shape[0], -1).view(torch.uint8))
    return words.sum(1, dtype=torch.int64).cpu().tolist()


@dataclass
class _Group:
    values: dict[tuple, list[str]] = field(default_factory=dict)  # (shape, dtype) -> sent names of that meta
    by_print: dict[tuple, str] = field(default_factory=dict)  # (shape, dtype, fingerprint) -> sent name
    printed: set[str] = field(default_factory=set)  # sent names whose fingerprint is in by_print
    pending: list[tuple[str, torch.Tensor]] = field(default_factory=list)


@dataclass
class Dedup:
    """Result of deduplication: the tensors to send and the aliases onto them."""

    unique: dict[str, torch.Tensor]
    aliases: dict[str, str]
    public_count: int
    public_bytes: int


def deduplicate(adapter: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]) -> Dedup:
    pairs = adapter.items() if isinstance(adapter, Mapping) else adapter
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    by_view: dict[tuple, str] = {}
    # Fastest path: the exporter hands out the very same tensor object under many names (kept alive here, so
    # its id cannot be reused while the entry exists).
    by_object: dict[int, tuple[torch.Tensor, str]] = {}
    groups: dict[str, _Group] = {}
    public_count = public_bytes = 0

    def resolve(group: _Group) -> None:
        """Decide a group's pending candidates: fingerprints find candidates, torch.equal semantics decide."""
        by_meta: dict[tuple, list[tuple[str, torch.Tensor]]] = {}
        for n, t in group.pending:
            by_meta.setdefault((tuple(t.shape), t.dtype), []).append((n, t))
        group.pending = []
        for meta, members in by_meta.items():
            known = group.values.setdefault(meta, [])
            if not known and len(members) == 1:  # the first value of its shape: nothing to compare with
                name, t = members[0]
                unique[name] = t
                known.append(name)
                continue
            # Fingerprints only where a comparison is possible; earlier values get theirs lazily, now.
            todo = [n for n in known if n not in group.printed]
            if todo:
                for n, fp in zip(todo, _fingerprints(torch.stack([unique[n] for n in todo])), strict=True):
                    group.by_print.setdefault((meta, fp), n)
                group.printed.update(todo)
            stacked = torch.stack([t for _, t in members])
            prints = _fingerprints(stacked)
            refs: list[tuple[int, str]] = []  # (member index, earlier value with the same fingerprint)
            for i, ((n, t), fp) in enumerate(zip(members, prints, strict=True)):
                ref = group.by_print.get((meta, fp))
                if ref is None:
                    group.by_print[(meta, fp)] = n
                    unique[n] = t
                    known.append(n)
                else:
                    refs.append((i, ref))
                group.printed.add(n)
            if refs:
                equal = (
                    (stacked[[i for i, _ in refs]] == torch.stack([unique[r] for _, r in refs]))
                    .flatten(1)
                    .all(1)
                    .tolist()
                )
                for (i, ref), eq in zip(refs, equal, strict=True):
                    name, t = members[i]
                    if eq:
                        aliases[name] = ref
                        # This tensor is dropped now; once the exporter frees it, its address may come back for
                        # another value. Forget its view key so that value is not taken for this one.
                        key = _view_key(t)
                        if by_view.get(key) == name:
                            del by_view[key]
                        if by_object.get(id(t), (None, None))[1] == name:
                            del by_object[id(t)]
                    else:  # fingerprint collision: a distinct value after all
                        unique[name] = t
                        known.append(name)

    names: set[str] = set()
    for name, t in pairs:
        if name in names:
            raise ValueError(f"adapter stream repeats the name {name!r}")
        names.add(name)
        public_count += 1
        public_bytes += t.nbytes
        same = by_object.get(id(t))
        if same is not None and same[0] is t:
            aliases[name] = same[1]
            continue
        key = _view_key(t)
        seen = by_view.get(key)
        if seen is not None:
            aliases[name] = seen
            continue
        by_view[key] = name
        by_object[id(t)] = (t, name)
        gname = candidate_group(name)
        if gname is None:
            unique[name] = t
            continue
        group = groups.setdefault(gname, _Group())
        group.pending.append((name, t))
        if len(group.pending) >= _CHUNK:
            resolve(group)
    for group in groups.values():
        resolve(group)
    # A view-identical alias may point at a name that was itself aliased: point it at the sent name.
    for public, target in aliases.items():
        while target in aliases:
            target = aliases[target]
        aliases[public] = target
    return Dedup(unique=unique, aliases=aliases, public_count=public_count, public_bytes=public_bytes)


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


@dataclass
class SyncPlan:
    """What the sender transmits: the manifest and the unique, alpha-folded tensors in wire order."""

    manifest: Manifest
    tensors: list[torch.Tensor]
    public_count: int
    public_bytes: int
    timings: dict[str, float]

    def buckets(self) -> Iterator[tuple[int, torch.Tensor]]:
        """``(stream offset, packed uint8 bucket)``. One buffer is reused: consume each before the next."""
        if not self.tensors:
            return
        ranges = self.manifest.buckets()
        device = self.tensors[0].device
        buf = torch.zeros(max(e - s for s, e in ranges), dtype=torch.uint8, device=device)
        it = iter(zip(self.manifest.tensors, self.tensors, strict=True))
        pending = next(it, None)
        for start, end in ranges:
            view = buf[: end - start]
            while pending is not None and pending[0].offset < end:
                entry, t = pending
                view[entry.offset - start : entry.offset - start + entry.nbytes].copy_(t.reshape(-1).view(torch.uint8))
                pending = next(it, None)
            yield start, view


def build_plan(
    adapter: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor],
    *,
    adapter_config: Mapping[str, Any],
    lora_name: str,
    version: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> SyncPlan:
    """Deduplicate, fold ``lora_alpha / r`` into the unique ``lora_B`` tensors, checksum, lay out."""
    import time

    t0 = time.perf_counter()
    dedup = deduplicate(adapter)
    device = next(iter(dedup.unique.values())).device if dedup.unique else torch.device("cpu")
    synchronize(device)
    t1 = time.perf_counter()
    config = jsonable_config(adapter_config)
    r, alpha = config["r"], config.get("lora_alpha", config["r"])
    # SkyRL 0.4's fold, applied once per unique tensor (so aliased B tensors are scaled exactly once).
    folded = fold_lora_alpha_for_vllm(dedup.unique, config_rank=r, alpha=alpha)
    tensors = [t.contiguous() for t in folded.values()]
    synchronize(device)  # CUDA work is asynchronous: without this the fold's time lands in the checksum stage
    t2 = time.perf_counter()
    sums = checksums(tensors)
    t3 = time.perf_counter()
    entries, total_bytes = pack_entries(
        (name, dtype_name(t.dtype), tuple(t.shape), t.numel() * t.element_size(), cs)
        for name, t, cs in zip(folded, tensors, sums, strict=True)
    )
    manifest = Manifest(
        version=version,
        lora_name=lora_name,
        adapter_config=mark_alpha_folded(config),
        tensors=entries,
        aliases=dedup.aliases,
        total_bytes=total_bytes,
        bucket_bytes=bucket_bytes,
    )
    manifest.validate()
    timings = {"dedup_s": t1 - t0, "fold_s": t2 - t1, "checksum_s": t3 - t2}
    return SyncPlan(manifest, tensors, dedup.public_count, dedup.public_bytes, timings)
