"""The sender's plan: deduplicate, lay out and pack the stream, fold alpha, checksum, write the manifest.

Input is the adapter as a stream of ``(public name, tensor)`` pairs: a PEFT state dict or Megatron-Bridge's
``export_adapter_weights``. Work is per unique tensor, not per public name:

* **Dedup, exact** (:mod:`skyrl_glm.sync.dedup`): names showing one storage view are one sent tensor; other
  equal values are proven equal byte for byte, unless the exporter declares its sharing (``shared_storage``).
* **Alias runs.** The dedup gives each sent tensor's public names as :class:`~skyrl_glm.sync.aliases.AliasRun`
  rules (expert-index ranges) plus a few explicit aliases: a ~0.3 MB manifest instead of a 17 MB map.
* **Pack, fold, checksum on the packed stream.** The unique tensors are copied once into the stream buffer (the
  transport's staging memory where it has one; on a GPU in one launch, :mod:`~skyrl_glm.sync.copy_table`),
  ``lora_B`` last so the B tensors of one dtype form one region; the alpha fold scales that region in place in one
  pass (SkyRL 0.4's ``fold_lora_alpha_for_vllm`` arithmetic, float32 multiply and one rounding, once per sent
  tensor however many names alias it); :func:`~skyrl_glm.sync.checksum.span_checks` checksums every tensor in one
  pass. Transports send the buffer as it is.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import torch
from skyrl.backends.skyrl_train.distributed.megatron.lora_export import (
    LORA_B_SUFFIX,
    mark_alpha_folded,
)

from skyrl_glm.sync.checksum import span_checks
from skyrl_glm.sync.copy_table import CopyTable
from skyrl_glm.sync.dedup import Dedup, DedupMemo, deduplicate, dtype_of, shape_of
from skyrl_glm.sync.manifest import CHECKSUM_CHARS, DTYPES, Manifest, TensorEntry, dtype_name, pack_entries, views
from skyrl_glm.sync.nogc import paused_gc

DEFAULT_BUCKET_BYTES = 512 << 20
# Devices whose packs run through the copy table (a Triton kernel: CUDA; Triton's interpreter also runs it on host
# memory, which the CPU tests of the table path add here).
TABLE_DEVICES = {"cuda"}

Staging = Callable[[int, torch.device], torch.Tensor]


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
    """What the sender transmits: the manifest and the packed, alpha-folded stream (``tensors``: views of it, made
    when first asked for; the transports send the buffer)."""

    manifest: Manifest
    public_count: int
    public_bytes: int
    timings: dict[str, float]
    buffer: torch.Tensor

    @cached_property
    def tensors(self) -> list[torch.Tensor]:
        """Each sent tensor as a view of the stream, in the manifest's order."""
        return views(self.buffer, self.manifest.tensors)

    def buckets(self) -> Iterator[tuple[int, torch.Tensor]]:
        """``(stream offset, uint8 slice of the stream)`` per bucket of the manifest."""
        for start, end in self.manifest.buckets():
            yield start, self.buffer[start:end]


def _b_regions(entries: Sequence[TensorEntry]) -> list[tuple[str, int, int]]:
    """``(dtype, start, end)`` of each contiguous run of ``lora_B`` tensors of one dtype (the layout puts them last)."""
    regions: list[list[Any]] = []  # [dtype, start, end]
    for e in entries:
        if not e.name.endswith(LORA_B_SUFFIX):
            continue
        if regions and regions[-1][0] == e.dtype:
            regions[-1][2] = e.offset + e.nbytes
        else:
            regions.append([e.dtype, e.offset, e.offset + e.nbytes])
    return [(dtype, start, end) for dtype, start, end in regions]


def _fold_regions(buffer: torch.Tensor, regions: Sequence[tuple[str, int, int]], r: int, alpha: float) -> None:
    """SkyRL's ``fold_lora_alpha_for_vllm`` over each ``lora_B`` region (:func:`_b_regions`), in place: each value
    times ``alpha / r`` in float32 and rounded back once, as SkyRL's upcast, multiply and cast do (bit for bit), in
    one pass over the region and with no float32 temporary (SkyRL's four passes took 3.4 ms of a 20-layer
    ``grouped:64`` sync on one H200, measured 2026-12-04)."""
    if r <= 0 or alpha <= 0:
        raise ValueError(f"r and lora_alpha must be positive, got {r} and {alpha}")
    for dtype, start, end in regions:
        buffer[start:end].view(DTYPES[dtype]).mul_(alpha / r)


@dataclass
class _Layout:
    """What a plan derives from the adapter's structure alone: the packing order, the entries, the ``lora_B``
    regions and the validated manifest (with its checksum spans) (its per-update fields aside); and the typed views of
    the last stream buffer it was packed into (:meth:`views_of`)."""

    order: list[int]  # the dedup's sent tensors, in packing order
    by_dtype: list[list[int]]  # positions in packing order, per dtype (one fused copy each)
    entries: list[TensorEntry]
    total: int
    regions: list[tuple[str, int, int]]
    manifest: Manifest  # its spans: what the checksums read
    _views: tuple[Any, list[list[torch.Tensor]]] | None = field(default=None, repr=False)
    copies: CopyTable = field(default_factory=CopyTable, repr=False)  # the pack's table on the GPU (see _pack)

    @cached_property
    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The packing order, each entry's stream offset (the checksum spans' own column) and its bytes, as arrays
        (the copy table's columns)."""
        nbytes = np.fromiter((e.nbytes for e in self.entries), np.int64, len(self.entries))
        return np.asarray(self.order, dtype=np.int64), self.manifest.spans.columns[0], nbytes

    def views_of(self, buffer: torch.Tensor, keep: bool) -> list[list[torch.Tensor]]:
        """Per dtype, the typed views of ``buffer`` its fused copy writes. ``keep``: the buffer is the transport's
        own staging memory, the same every update (``Transport.keeps_staging``): its views are kept and reused while
        it is, not made again (one ``as_strided`` per sent tensor: 2,514 at full GLM-5.3 in ``grouped:4``); they hold
        that memory, which the transport keeps anyway."""
        where = (buffer.untyped_storage().data_ptr(), buffer.storage_offset(), buffer.numel(), buffer.device)
        if self._views is not None and self._views[0] == where:
            return self._views[1]
        packed = views(buffer, self.entries)
        made = (where, [[packed[i] for i in group] for group in self.by_dtype])
        self._views = made if keep else None
        return made[1]


class PlanCache:
    """The last plan's :class:`_Layout`, held by a sender across the updates of a run: an adapter's structure is the
    same every update (only the values change), so an update of the same structure skips the sort, the layout, the
    manifest's validation and its JSON layout text, and pays only the per-update work (pack, fold, checksums).

    Key (every part must be equal for a hit, else the layout is made anew and remembered): the sent names in order,
    each sent tensor's dtype and shape, the alias runs, the explicit aliases, the adapter config as folded (its
    JSON text: ``1`` and ``1.0`` differ), ``lora_name`` and ``bucket_bytes``. Per sent tensor and per alias rule,
    never per public name; a renamed, added, dropped, reshaped or retyped tensor, or sharing that changed, misses.
    A deduplication whose structure is vouched for by a token (``Dedup.structure``: the export memo's, for what it
    learned and recalls) is keyed by the token instead of its names, rules, dtypes and shapes (at ``grouped:64``
    that reading took 1.8-2.7 ms at 20 layers on the 2-core CPU machine, measured 2026-12-04)."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.layout: _Layout | None = None
        self.hits = 0

    @staticmethod
    def key_of(dedup: Dedup, config_json: str, lora_name: str, bucket_bytes: int) -> tuple:
        if dedup.structure is not None:
            return (dedup.structure, config_json, lora_name, bucket_bytes)
        tensors = dedup.unique.values()
        return (
            list(dedup.unique),
            list(map(dtype_of, tensors)),
            list(map(shape_of, tensors)),
            list(dedup.runs),
            dict(dedup.explicit),
            config_json,
            lora_name,
            bucket_bytes,
        )

    def get(self, key: tuple) -> _Layout | None:
        if self.layout is None or key != self.key:
            return None
        self.hits += 1
        return self.layout

    def put(self, key: tuple, layout: _Layout) -> None:
        self.key, self.layout = key, layout

    def forget_views(self) -> None:
        """Drop the kept layout's views of the staging memory (they hold it): with :meth:`Transport.forget_staging`."""
        if self.layout is not None:
            self.layout._views = None


def _new_layout(dedup: Dedup, config: dict[str, Any], lora_name: str, bucket_bytes: int) -> _Layout:
    """Sort (``lora_B`` last, grouped by dtype: one contiguous region per dtype to fold; within a region equal
    shapes together, in stream order: back to back at one stride, which the checksums off the GPU read as one view
    per run and the receiver stacks a factor's groups from without a copy), lay out, and write and validate the
    manifest's layout (with placeholder checksums)."""
    tensors = list(dedup.unique.values())

    def place(i: int) -> tuple[bool, str, tuple[int, ...]]:
        return sent[i].endswith(LORA_B_SUFFIX), dtype_name(tensors[i].dtype), tuple(tensors[i].shape)

    sent = list(dedup.unique)
    order = sorted(range(len(sent)), key=place)
    entries, total = layout({sent[i]: tensors[i] for i in order})
    manifest = Manifest(
        version=0,
        lora_name=lora_name,
        adapter_config=config,
        tensors=tuple(entries),
        aliases=dedup.explicit,
        total_bytes=total,
        bucket_bytes=bucket_bytes,
        checksums="0" * CHECKSUM_CHARS * len(entries),
        alias_runs=tuple(dedup.runs),
    )
    manifest.validate()
    manifest.layout_digest  # noqa: B018 - its text and digest, made once per layout (each update's manifest shares them)
    by_dtype: dict[str, list[int]] = {}
    for i, e in enumerate(entries):
        by_dtype.setdefault(e.dtype, []).append(i)
    return _Layout(order, list(by_dtype.values()), entries, total, _b_regions(entries), manifest)


def _pack(laid: _Layout, dedup: Dedup, work: torch.Tensor, keep: bool) -> None:
    """Copy the sent tensors into their places in ``work``: on a GPU, where every one is contiguous and on
    ``work``'s device, through the layout's copy table in one launch (the addresses vouched for by the export
    memo, ``Dedup.addresses``, or read here); else one fused copy per dtype into typed views of ``work``."""
    tensors = list(dedup.unique.values())
    order, offsets, nbytes = laid.columns
    if work.device.type in TABLE_DEVICES and tensors:
        addresses = dedup.addresses if dedup.addresses is not None and len(dedup.addresses) == len(tensors) else None
        if (
            addresses is None
            and all(t.device == work.device for t in tensors)
            and all(map(torch.Tensor.is_contiguous, tensors))
        ):
            addresses = np.fromiter(map(torch.Tensor.data_ptr, tensors), np.int64, len(tensors))
        if addresses is not None and tensors[0].device == work.device:
            laid.copies.run(work.device, addresses[order], offsets + work.data_ptr(), nbytes)
            return
    # Typed views of the buffer, each its tensor's shape and dtype (the layout's key holds both): one fused copy per
    # dtype into them (a fused kernel takes one dtype).
    targets = laid.views_of(work, keep=keep)
    ordered = [tensors[i] for i in laid.order]
    for group, dst in zip(laid.by_dtype, targets, strict=True):
        torch._foreach_copy_(dst, [ordered[i] for i in group])


def build_plan(
    adapter: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor] | Dedup,
    *,
    adapter_config: Mapping[str, Any],
    lora_name: str,
    version: int,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    staging: Staging = zeroed,
    shared_storage: bool = False,
    memo: DedupMemo | None = None,
    cache: PlanCache | None = None,
    keep_views: bool = False,
) -> SyncPlan:
    """Deduplicate, pack, fold ``lora_alpha / r`` into the unique ``lora_B`` tensors, checksum, write the manifest.
    ``staging(nbytes, device)`` gives the zeroed stream buffer (a transport's shared memory, say);
    ``shared_storage``, ``memo``: see :func:`deduplicate`. A :class:`~skyrl_glm.sync.dedup.Dedup` is an adapter already
    deduplicated as its stream arrived (the Megatron sync), planned as it is. ``cache``: the sender's
    :class:`PlanCache`, kept across updates (an update of the last one's structure reuses its layout); with
    ``keep_views``, ``staging`` hands out the same memory every update (``Transport.keeps_staging``) and the kept
    layout keeps its views too."""
    with paused_gc():
        return _build_plan(
            adapter, adapter_config, lora_name, version, bucket_bytes, staging, shared_storage, memo, cache, keep_views
        )


def _build_plan(
    adapter: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor] | Dedup,
    adapter_config: Mapping[str, Any],
    lora_name: str,
    version: int,
    bucket_bytes: int,
    staging: Staging,
    shared_storage: bool,
    memo: DedupMemo | None,
    cache: PlanCache | None,
    keep_views: bool,
) -> SyncPlan:
    t0 = time.perf_counter()
    dedup = adapter if isinstance(adapter, Dedup) else deduplicate(adapter, shared_storage=shared_storage, memo=memo)
    device = next(iter(dedup.unique.values())).device if dedup.unique else torch.device("cpu")
    synchronize(device)
    t1 = time.perf_counter()
    plain = jsonable_config(adapter_config)
    r, alpha = plain["r"], plain.get("lora_alpha", plain["r"])
    config = mark_alpha_folded(plain)
    key = PlanCache.key_of(dedup, json.dumps(config), lora_name, bucket_bytes) if cache is not None else ()
    laid = cache.get(key) if cache is not None else None
    if laid is None:
        laid = _new_layout(dedup, config, lora_name, bucket_bytes)
        if cache is not None:
            cache.put(key, laid)
    t2 = time.perf_counter()
    buffer = staging(laid.total, device)
    # A GPU adapter staged in host memory is packed and folded on its GPU first, then copied over once: the fold's
    # arithmetic on host bf16 took about a second for a 2-layer slice on one H200's host (measured 2026-12-03).
    work = buffer
    if alpha != r and device.type == "cuda" and buffer.device != device:
        work = torch.empty(laid.total, dtype=torch.uint8, device=device)
    _pack(laid, dedup, work, keep_views and work is buffer)
    synchronize(work.device)
    t3 = time.perf_counter()
    if alpha != r:
        _fold_regions(work, laid.regions, r, alpha)
    synchronize(work.device)  # CUDA work is asynchronous: without this the fold's time lands in the checksum stage
    t4 = time.perf_counter()
    if work is not buffer:
        buffer.copy_(work)
        del work
    t5 = time.perf_counter()
    sums, _ = span_checks(buffer, laid.manifest.spans, finite=False)
    t6 = time.perf_counter()
    manifest = laid.manifest.with_update(version, sums)
    timings = {
        "dedup_s": t1 - t0,
        "pack_s": t3 - t2 + t5 - t4,
        "fold_s": t4 - t3,
        "checksum_s": t6 - t5,
        "manifest_s": t2 - t1 + time.perf_counter() - t6,
    }
    return SyncPlan(manifest, dedup.public_count, dedup.public_bytes, timings, buffer)
