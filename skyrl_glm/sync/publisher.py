"""Publishers: how the trainer hands one adapter version to the sampler.

``InMemoryPublisher`` is the product path and the one publisher of the package: plan (deduplicate, fold, checksum,
packed straight into the transport's staging memory) -> stage -> the sampler receives while the transport
streams -> it loads -> it commits. ``publish`` drives a :class:`~skyrl_glm.sync.update.Sampler` (an offline
engine), ``publish_async`` an :class:`~skyrl_glm.sync.update.AsyncSampler` (vLLM's ``AsyncLLM``, or SkyRL's servers
inside SkyRL's training loop), through the same steps; which engine is behind them is the sampler's business.
``DiskPublisher`` is the baseline it is measured against: a PEFT directory written and loaded by vLLM
the standard way. Both take the trainer's adapter as ``{public name: tensor}`` (or a stream of pairs) plus its
PEFT config.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from safetensors.torch import save_file

from skyrl_glm.sync.dedup import DedupMemo
from skyrl_glm.sync.manifest import UNKNOWN_LAYOUT, Manifest
from skyrl_glm.sync.plan import DEFAULT_BUCKET_BYTES, PlanCache, SyncPlan, build_plan, jsonable_config
from skyrl_glm.sync.transports.base import Transport
from skyrl_glm.sync.update import Adapter, AsyncSampler, Sampler, UpdateResult


def manifest_text(manifest: Manifest, accepted_layout: str | None, transport: Transport) -> tuple[str, bool]:
    """The manifest's text, and whether it names its layout by digest: when the sampler accepted this layout last
    (``accepted_layout``), over a transport whose bytes a second attempt can read again (not a collective one: its
    stream happens once)."""
    by_digest = not transport.needs_group and manifest.layout_digest == accepted_layout
    return manifest.to_json(layout=not by_digest), by_digest


class InMemoryPublisher:
    """Deduplicated, checksummed, in-memory handoff through any registered transport."""

    def __init__(
        self,
        sampler: Sampler | AsyncSampler,
        transport: Transport,
        lora_name: str = "policy",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        shared_storage: bool = False,
    ) -> None:
        """``shared_storage``: the exporter hands out one storage per shared tensor (see ``plan.deduplicate``); the
        publisher then remembers each update's layout for the next (``dedup.DedupMemo``). Whatever the exporter, the
        publisher keeps the last plan's layout (``plan.PlanCache``: reused while the adapter's structure holds)."""
        self.sampler = sampler
        self.transport = transport
        self.lora_name = lora_name
        self.bucket_bytes = bucket_bytes
        self.shared_storage = shared_storage
        self.memo = DedupMemo() if shared_storage else None
        self.plan_cache = PlanCache()
        # the digest of the layout the sampler accepted last: a plan of that layout names it instead of sending it
        self.accepted_layout: str | None = None

    def plan(self, adapter: Adapter, adapter_config: Mapping[str, Any], version: int) -> SyncPlan:
        """Plan straight into the transport's staging memory (send it with :meth:`send` before the next plan); a
        plan that fails half-way releases what it staged."""
        try:
            return build_plan(
                adapter,
                adapter_config=adapter_config,
                lora_name=self.lora_name,
                version=version,
                bucket_bytes=self.bucket_bytes,
                staging=self.transport.staging,
                shared_storage=self.shared_storage,
                memo=self.memo,
                cache=self.plan_cache,
                keep_views=self.transport.keeps_staging,
            )
        except BaseException:
            self.transport.release()
            raise

    def forget_staging(self) -> None:
        """Let go of the staging memory the transport keeps between updates, and of the plan layout's views of it
        (before an offload: the colocated sampler wakes into the memory it frees)."""
        self.plan_cache.forget_views()
        self.transport.forget_staging()

    def _stage(self, plan: SyncPlan) -> tuple[float, float, dict[str, Any]]:
        t0 = time.perf_counter()
        handle = self.transport.prepare(plan)
        return t0, time.perf_counter(), handle

    def _timed(self, plan: SyncPlan, result: UpdateResult, t0: float, t1: float) -> UpdateResult:
        result.timings = {**plan.timings, "stage_s": t1 - t0, **result.timings, "total_s": time.perf_counter() - t0}
        return result

    def _manifest(self, plan: SyncPlan) -> tuple[str, bool]:
        return manifest_text(plan.manifest, self.accepted_layout, self.transport)

    def _accepted(self, plan: SyncPlan, result: UpdateResult) -> UpdateResult:
        self.accepted_layout = plan.manifest.layout_digest if result.ok else None
        return result

    def send(self, plan: SyncPlan) -> UpdateResult:
        """Ship a plan: stage it, let the sampler receive while the transport streams, then release (always:
        whatever the sampler or the stream raised, nothing staged outlives the call). A sampler that no longer
        holds the layout the manifest names (restarted, or updated by another publisher since) gets the layout."""
        try:
            t0, t1, handle = self._stage(plan)
            text, by_digest = self._manifest(plan)
            with ThreadPoolExecutor(1) as pool:
                answer = pool.submit(self.sampler.apply_update, text, handle, self.transport.name)
                self.transport.stream(plan)
                result = answer.result()
            if by_digest and UNKNOWN_LAYOUT in result.reason:
                result = self.sampler.apply_update(plan.manifest.to_json(), handle, self.transport.name)
        finally:
            self.transport.release()
        return self._timed(plan, self._accepted(plan, result), t0, t1)

    async def send_async(self, plan: SyncPlan) -> UpdateResult:
        """:meth:`send` for an async sampler: its ``apply_update`` is awaited while a thread streams."""
        try:
            t0, t1, handle = await asyncio.to_thread(self._stage, plan)
            text, by_digest = self._manifest(plan)
            streaming = asyncio.ensure_future(asyncio.to_thread(self.transport.stream, plan))
            try:
                result = await self.sampler.apply_update(text, handle, self.transport.name)
            finally:
                await streaming
            if by_digest and UNKNOWN_LAYOUT in result.reason:
                result = await self.sampler.apply_update(plan.manifest.to_json(), handle, self.transport.name)
        finally:
            self.transport.release()
        return self._timed(plan, self._accepted(plan, result), t0, t1)

    def publish(self, adapter: Adapter, adapter_config: Mapping[str, Any], version: int) -> UpdateResult:
        t0 = time.perf_counter()
        plan = self.plan(adapter, adapter_config, version)
        result = self.send(plan)
        result.timings["total_s"] = time.perf_counter() - t0
        return result

    async def publish_async(self, adapter: Adapter, adapter_config: Mapping[str, Any], version: int) -> UpdateResult:
        """:meth:`publish` for an async sampler; planning runs in a thread so the event loop keeps serving."""
        t0 = time.perf_counter()
        plan = await asyncio.to_thread(self.plan, adapter, adapter_config, version)
        result = await self.send_async(plan)
        result.timings["total_s"] = time.perf_counter() - t0
        return result


class DiskPublisher:
    """Baseline: ``adapter_model.safetensors`` + ``adapter_config.json`` in a fresh directory per version."""

    def __init__(self, sampler: Sampler, root: str | Path | None = None, lora_name: str = "policy"):
        self.sampler = sampler
        self.root = Path(root or tempfile.mkdtemp(prefix="skyrl-glm-disk-"))
        self.lora_name = lora_name

    def publish(self, adapter: Adapter, adapter_config: Mapping[str, Any], version: int) -> UpdateResult:
        t0 = time.perf_counter()
        tensors = dict(adapter.items() if isinstance(adapter, Mapping) else adapter)
        out = self.root / f"{self.lora_name}-v{version}"
        out.mkdir(parents=True, exist_ok=True)
        # safetensors refuses shared storage: write private contiguous copies, as a PEFT save does.
        save_file(
            {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()},
            str(out / "adapter_model.safetensors"),
        )
        (out / "adapter_config.json").write_text(json.dumps(jsonable_config(adapter_config)))
        t1 = time.perf_counter()
        result = self.sampler.load_adapter_dir(str(out), f"{self.lora_name}-v{version}")
        result.version = version if result.ok else None
        result.timings.update({"write_s": t1 - t0, "total_s": time.perf_counter() - t0})
        return result
