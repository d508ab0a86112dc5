"""The two sides of one benchmarked sync: the trainer's :class:`Sender` and the sampler's :class:`Receiver`,
each able to run SkyRL 0.4.0's path, ours, or the disk baseline; and the receiver's bit-exact verification."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from skyrl_glm.bench.synthetic import BenchOptions, Synthetic, fold_value, is_lora_b
from skyrl_glm.bench.verify import verify_rebuilt
from skyrl_glm.lora.bridge import PEFT_PREFIX, VIEW_PER_EXPERT, adapter_config
from skyrl_glm.sync.dedup import DedupMemo
from skyrl_glm.sync.export_memo import ExportMemo
from skyrl_glm.sync.plan import PlanCache, synchronize
from skyrl_glm.sync.publisher import manifest_text

TIMED_PAIRS = 16  # exporter pairs timed at once


def _reset_peak(device: torch.device) -> int:
    """Start a peak-memory window on ``device``; returns the bytes allocated now (the window's base)."""
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _peak_since(device: torch.device, base: int) -> int | None:
    """Peak GPU bytes allocated above ``base`` since :func:`_reset_peak` (None off the GPU)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def _export_split(export: TimedStream | None, seconds: float) -> dict[str, float]:
    """A streamed dedup's seconds split into the exporter's (``export_s``) and the rest (``dedup_s``)."""
    if export is None:
        return {"dedup_s": seconds}
    return {"export_s": export.seconds, "dedup_s": seconds - export.seconds}


class TimedStream:
    """An exporter's stream, with the seconds spent inside it (CUDA work it queues finishes in the consumer's).
    Timed per :data:`TIMED_PAIRS` pairs taken at once, so the exporter runs at most that far ahead: two clock reads
    and a call per pair cost about what the consumer does with a pair of a shared-storage stream, and would land in
    its stage (measured on the CPU machine: 42 ms over a full GLM-5.3 export, 12 ms so)."""

    def __init__(self, pairs: Iterator[tuple[str, torch.Tensor]]) -> None:
        self.pairs = pairs
        self.seconds = 0.0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        clock = time.perf_counter
        while True:
            t0 = clock()
            taken = list(itertools.islice(self.pairs, TIMED_PAIRS))
            self.seconds += clock() - t0
            if not taken:
                return
            yield from taken


class Sender:
    """The trainer side. ``resident``: holds the public adapter (shared storage or, with ``copies``, one copy per
    name); ``bridge-stream``: holds the model's live adapter (its unique values) and exports it afresh for every
    sync, as Megatron-Bridge's ``export_adapter_weights(cpu=False)`` does (:meth:`export`), a routed expert's gate
    and up ``lora_B`` each a view object of its own (:data:`~skyrl_glm.lora.bridge.VIEW_PER_EXPERT`)."""

    def __init__(self, opts: BenchOptions, syn: Synthetic, transport: Any, bridge: Any = None) -> None:
        self.opts, self.syn, self.transport = opts, syn, transport
        # each path stages in memory of its own where the transport keeps its staging memory between updates (as
        # each sender would): alternating in one buffer of two sizes would take a new one every round
        self.transports = {"ours": transport, "skyrl": type(transport)() if transport.keeps_staging else transport}
        self.device = torch.device(opts.device)
        self.bridge = bridge  # --exporter bridge: the real Megatron-Bridge model (bench/bridge_model.py)
        self.live = {} if bridge is not None else {k: v.to(self.device) for k, v in syn.unique.items()}
        self.public: dict[str, torch.Tensor] | None = None
        if opts.exporter == "resident":
            self.public = {n: (self.live[k].clone() if opts.copies else self.live[k]) for n, k in syn.names.items()}
            self.live = {}
        synchronize(self.device)
        self.public_count = len(syn.names)
        self.public_bytes = sum(syn.unique[k].numel() * syn.unique[k].element_size() for k in syn.names.values())
        self.config = adapter_config(opts.rank, opts.alpha, syn.targets)
        self.plan: Any = None
        self.memo = DedupMemo()  # ours, across the rounds: a sync of the same export is a sync like the last
        self.export_memo = ExportMemo()  # ours, across the rounds: the export read from the live adapter after one
        self.split_per_expert = {n for n in syn.names if VIEW_PER_EXPERT.search(n)}
        self.plan_cache = PlanCache()  # ours, across the rounds: the plan's layout of an unchanged structure
        # ours, as the publisher does: the layout the receiver accepted, named by its digest from then on
        # (publisher.manifest_text)
        self.accepted_layout: str | None = None

    def params(self) -> list[torch.Tensor]:
        """The live adapter's tensors (the model's LoRA parameters): what the export hands out views of."""
        return self.bridge.lora_params() if self.bridge is not None else list(self.live.values())

    def export(self) -> TimedStream:
        """The bridge's stream of this sync: names without the PEFT prefix, in export order, on the device."""
        copies, split = self.opts.copies, self.split_per_expert
        if self.bridge is not None:
            return TimedStream(self.bridge.export())

        def pairs() -> Iterator[tuple[str, torch.Tensor]]:
            for name, key in self.syn.names.items():
                t = self.live[key]
                yield name[len(PEFT_PREFIX) :], t.clone() if copies else t.view(t.shape) if name in split else t

        return TimedStream(pairs())

    def _public_stream(self) -> tuple[Iterator[tuple[str, torch.Tensor]], TimedStream | None]:
        """``(public name, tensor)`` pairs as a path consumes them, and the export timer (bridge-stream only)."""
        if self.public is not None:
            return iter(self.public.items()), None
        export = self.export()
        return ((PEFT_PREFIX + n, t) for n, t in export), export

    def _plan_skyrl(self, version: int) -> tuple[Any, dict[str, float]]:
        from skyrl.backends.skyrl_train.distributed.megatron.lora_export import (
            fold_lora_alpha_for_vllm,
            fold_lora_rank_scale_for_vllm,
            mark_alpha_folded,
        )
        from skyrl.backends.skyrl_train.weight_sync.lora_target import dedupe_shared_expert_adapters

        from skyrl_glm.sync.manifest import Manifest
        from skyrl_glm.sync.plan import SyncPlan, layout, pack_into

        # What SkyRL's Megatron worker passes: one adapter per EP rank's experts (EP = the groups here) when shared.
        span = max(1, self.syn.n_experts // self.opts.expert_groups) if self.opts.share_experts else 1
        t0 = time.perf_counter()
        pairs, export = self._public_stream()
        to_send, aliases = dedupe_shared_expert_adapters(pairs, span)
        synchronize(self.device)
        t1 = time.perf_counter()
        if export is not None:  # LoraAdapterWeightSource.finalize_adapter: the rank-scale fold comes first
            to_send, _ = fold_lora_rank_scale_for_vllm(to_send, config_rank=self.opts.rank)
        folded = fold_lora_alpha_for_vllm(to_send, config_rank=self.opts.rank, alpha=self.opts.alpha)
        synchronize(self.device)
        t2 = time.perf_counter()
        # The sent tensors packed into the transport's buffer (counted as transfer, as SkyRL's transfer engine packs).
        entries, total = layout(folded)
        buffer = self.transport.staging(total, self.device)
        pack_into(buffer, entries, list(folded.values()))
        synchronize(self.device)
        t3 = time.perf_counter()
        manifest = Manifest(
            version=version,
            lora_name="bench",
            adapter_config=mark_alpha_folded(dict(self.config)),
            tensors=entries,
            aliases=aliases,
            total_bytes=total,
            bucket_bytes=self.opts.bucket_mb << 20,
            checksums="",  # SkyRL sends none
        )
        plan = SyncPlan(manifest, self.public_count, self.public_bytes, {}, buffer)
        return plan, {**_export_split(export, t1 - t0), "fold_s": t2 - t1, "pack_s": t3 - t2}

    def _plan_ours(self, version: int) -> tuple[Any, dict[str, float]]:
        from skyrl_glm.skyrl.workers.megatron import unique_adapter
        from skyrl_glm.sync.plan import build_plan

        adapter: Any = iter(self.public.items()) if self.public is not None else None
        split: dict[str, float] = {}
        # the exporter's own declaration, as SkyRL's path gets it (experts_per_shared_adapter)
        shared = self.opts.share_experts and not self.opts.copies
        if adapter is None:  # the Megatron sync's rank 0: dedup as the export streams, rank-scale fold
            t0 = time.perf_counter()
            export = self.export()
            adapter = unique_adapter(
                export,
                config_rank=self.opts.rank,
                num_moe_experts=self.syn.n_experts,
                shared_storage=shared,
                memo=self.memo,
                export_memo=self.export_memo,
                params=self.params(),
            )
            synchronize(self.device)
            split = _export_split(export, time.perf_counter() - t0)
        plan = build_plan(
            adapter,
            adapter_config=self.config,
            lora_name="bench",
            version=version,
            bucket_bytes=self.opts.bucket_mb << 20,
            staging=self.transport.staging,
            shared_storage=shared,
            memo=self.memo,
            cache=self.plan_cache,
            keep_views=self.transport.keeps_staging,
        )
        timings = dict(plan.timings)
        if split:
            timings.update(export_s=split["export_s"], dedup_s=split["dedup_s"] + timings["dedup_s"])
        return plan, timings

    def plan_and_stage(self, path: str, version: int) -> tuple[str, str, dict[str, Any]]:
        base = _reset_peak(self.device)
        self.transport = self.transports[path]
        plan, timings = (self._plan_skyrl if path == "skyrl" else self._plan_ours)(version)
        t0 = time.perf_counter()
        handle = self.transport.prepare(plan)
        synchronize(self.device)
        timings["stage_s"] = time.perf_counter() - t0
        self.plan = plan
        info = {
            "sent_tensors": len(plan.manifest.tensors),
            "sent_bytes": sum(e.nbytes for e in plan.manifest.tensors),
            "aliases": len(plan.manifest.aliases),
            "alias_runs": len(plan.manifest.alias_runs),
            "wire_bytes": plan.manifest.total_bytes,
            "buckets": len(plan.manifest.buckets()),
            "sender_peak_gpu_bytes": _peak_since(self.device, base),
        }
        if path == "ours" and self.public is None:
            info["export_memo"] = dict(self.export_memo.counts)
        accepted = self.accepted_layout if path == "ours" else None
        manifest_json, by_digest = manifest_text(plan.manifest, accepted, self.transport)
        info["manifest_bytes"], info["manifest_by_digest"] = len(manifest_json), by_digest
        return manifest_json, json.dumps(handle), {"timings": timings, **info}

    def accepted(self, path: str) -> None:
        """The receiver took this round's update (a refusal raises there): ours names its layout by digest next."""
        if path == "ours":
            self.accepted_layout = self.plan.manifest.layout_digest

    def stream(self) -> float:
        t0 = time.perf_counter()
        self.transport.stream(self.plan)
        synchronize(self.device)
        return time.perf_counter() - t0

    def release(self) -> None:
        self.transport.release()
        self.plan = None

    def disk_save(self, directory: Path) -> dict[str, Any]:
        from safetensors.torch import save_file
        from skyrl.backends.skyrl_train.distributed.megatron.lora_export import fold_lora_alpha_for_vllm

        t0 = time.perf_counter()
        public, export_s = self.public, None
        if public is None:  # SkyRL's file path: the bridge's export gathered to the writer rank's host (cpu=True)
            export = self.export()
            public = {PEFT_PREFIX + n: t.to("cpu", copy=True) for n, t in export}
            export_s = time.perf_counter() - t0
            t0 = time.perf_counter()
        folded = fold_lora_alpha_for_vllm(public, config_rank=self.opts.rank, alpha=self.opts.alpha)
        synchronize(self.device)
        t1 = time.perf_counter()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "adapter_model.safetensors"
        # safetensors refuses shared storage: private contiguous CPU copies, as a PEFT save makes (the gathered
        # export already is one per name).
        private = folded if export_s is not None else {k: v.detach().to("cpu", copy=True) for k, v in folded.items()}
        save_file({k: v.contiguous() for k, v in private.items()}, str(path))
        (directory / "adapter_config.json").write_text(json.dumps(self.config))
        t2 = time.perf_counter()
        del folded, private, public
        timings = {"export_s": export_s, "fold_s": t1 - t0, "save_s": t2 - t1}
        return {"path": str(path), "file_bytes": path.stat().st_size, "timings": timings}


class Receiver:
    """The sampler side: receives (ours: verified; skyrl: as SkyRL does) and checks the result bit for bit."""

    def __init__(self, opts: BenchOptions, syn: Synthetic, transport: Any) -> None:
        from skyrl_glm.sync.receiver import AdapterReceiver

        self.opts, self.syn, self.transport = opts, syn, transport
        self.device = torch.device(opts.recv_device)
        # One receiver for every round, committing each accepted version, as the vLLM worker does: its first update
        # is validated in full (reported as verify_first_s), later ones with the layout it accepted.
        self.ours = AdapterReceiver(self.device)
        self.verify_first_s: float | None = None
        scale = opts.alpha / opts.rank
        self.expected = {
            k: fold_value(v.to(self.device), scale) if is_lora_b(k) else v.to(self.device)
            for k, v in syn.unique.items()
        }

    def receive(self, path: str, manifest_json: str, handle_json: str) -> dict[str, Any]:
        handle = json.loads(handle_json)
        base = _reset_peak(self.device)
        if path == "ours":
            got = self.ours.receive(manifest_json, handle, self.transport)
            synchronize(self.device)
            self.ours.commit(got.version)
            if self.verify_first_s is None:
                self.verify_first_s = got.timings["verify_s"]
            tensors, timings = got.tensors, {**got.timings, "verify_first_s": self.verify_first_s}
        else:
            tensors, timings = self._receive_skyrl(manifest_json, handle)
        peak = _peak_since(self.device, base)
        verified = verify_rebuilt(tensors, self.syn, self.expected)
        return {"timings": timings, "verified": verified, "receiver_peak_gpu_bytes": peak}

    def _receive_skyrl(self, manifest_json: str, handle: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict]:
        """As SkyRL receives: the control message read as plain JSON (no validation), the bytes, the alias
        expansion."""
        from skyrl.backends.skyrl_train.weight_sync.lora_target import expand_lora_aliases

        from skyrl_glm.sync.manifest import Manifest, TensorEntry, views

        t0 = time.perf_counter()
        d = json.loads(manifest_json)
        lay = d["layout"]
        entries = tuple(TensorEntry(n, dt, tuple(shape), o, nb) for n, dt, shape, o, nb in lay["tensors"])
        manifest = Manifest(
            version=d["version"],
            lora_name=lay["lora_name"],
            adapter_config=lay["adapter_config"],
            tensors=entries,
            aliases=lay["aliases"],
            total_bytes=lay["total_bytes"],
            bucket_bytes=lay["bucket_bytes"],
            checksums=d["checksums"],
        )
        self.transport.incoming_bytes(manifest, handle)
        staging = torch.empty(manifest.total_bytes, dtype=torch.uint8, device=self.device)
        self.transport.receive(manifest, handle, staging)
        synchronize(self.device)
        t1 = time.perf_counter()
        sent = dict(zip((e.name for e in entries), views(staging, entries), strict=True))
        tensors = expand_lora_aliases(sent, manifest.aliases)
        return tensors, {"transfer_s": t1 - t0, "rebuild_s": time.perf_counter() - t1}

    def disk_load(self, path: str) -> dict[str, Any]:
        from safetensors.torch import load_file

        t0 = time.perf_counter()
        tensors = load_file(path, device=str(self.device))
        synchronize(self.device)
        t1 = time.perf_counter()
        return {"timings": {"load_s": t1 - t0}, "verified": verify_rebuilt(tensors, self.syn, self.expected)}
