"""Publish one LoRA version to SkyRL's vLLM servers through skyrl-glm's sync: plan -> transport -> receiver.

The trainer rank that owns the full adapter builds the deduplicated, checksummed plan and stages its bytes on a
registered transport; every server's workers receive and verify it (``skyrl_glm_receive`` on
:class:`~skyrl_glm.skyrl.vllm_extension.SkyRLGlmWorkerExtension`, over the servers' ``/collective_rpc``) and stage
the rebuilt tensors in memory under ``<lora name>@v<version>``; then SkyRL's ``/skyrl/v1/load_lora_adapter``
swaps the served adapter (same name, ``skyrl-lora``) to that staged version, and older staged versions are
dropped. No file is written. A rejected update leaves the previous version serving.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import torch
from skyrl.backends.skyrl_train.weight_sync.lora_target import in_memory_lora_path

from skyrl_glm.sync.plan import build_plan
from skyrl_glm.sync.transports.base import Transport
from skyrl_glm.sync.update import UpdateResult
from skyrl_glm.sync.vllm.control import signed
from skyrl_glm.sync.vllm.worker import staged_name


def _results(responses: Mapping[str, Any]) -> list[Any]:
    """Per-worker results of a ``/collective_rpc`` fan-out, all servers together."""
    return [r for resp in responses.values() for r in ((resp.get("body") or {}).get("results") or [])]


class ServerPublisher:
    """skyrl-glm's in-memory LoRA handoff to the servers behind a SkyRL ``RemoteInferenceClient``."""

    def __init__(self, client: Any, transport: Transport, bucket_bytes: int, verify: bool = True) -> None:
        self.client = client
        self.transport = transport
        self.bucket_bytes = bucket_bytes
        self.verify = verify

    async def _rpc(self, method: str, *args: Any) -> list[Any]:
        # RemoteInferenceClient has no public collective_rpc; its control-plane fan-out is what SkyRL's own
        # LoRA receive target uses (set_lora_receive_target).
        # Signed with the run's control key: the servers' workers refuse calls that are not the trainer's.
        payload = {"method": method, "args": list(signed(method, args))}
        return _results(await self.client._call_all_servers("/collective_rpc", payload))

    async def publish(
        self, adapter: Mapping[str, torch.Tensor], adapter_config: Mapping[str, Any], lora_name: str, version: int
    ) -> UpdateResult:
        t0 = time.perf_counter()
        plan = await asyncio.to_thread(
            build_plan,
            adapter,
            adapter_config=adapter_config,
            lora_name=lora_name,
            version=version,
            bucket_bytes=self.bucket_bytes,
        )
        t1 = time.perf_counter()
        handle = await asyncio.to_thread(self.transport.prepare, plan)
        t2 = time.perf_counter()
        try:
            receiving = asyncio.ensure_future(
                self._rpc("skyrl_glm_receive", plan.manifest.to_json(), handle, self.transport.name, self.verify)
            )
            await asyncio.to_thread(self.transport.stream, plan)
            answers = await receiving
        finally:
            self.transport.release()
        t3 = time.perf_counter()
        refused = [a for a in answers if not (isinstance(a, dict) and a.get("ok"))]
        if refused or not answers:
            for a in answers:
                if isinstance(a, dict) and a.get("ok"):
                    await self._rpc("skyrl_glm_discard", a["staged"])
            reason = refused[0].get("reason", refused[0]) if refused else "no inference worker answered"
            return UpdateResult(False, None, f"update rejected: {reason}")
        staged = staged_name(lora_name, version)
        await self.client.load_lora_adapter(lora_name, in_memory_lora_path(staged))
        t4 = time.perf_counter()
        await self._rpc("skyrl_glm_commit", version, [staged])
        timings = {
            **plan.timings,
            **{k: float(v) for k, v in answers[0].get("timings", {}).items()},
            "plan_s": t1 - t0,
            "stage_s": t2 - t1,
            "receive_s": t3 - t2,
            "load_s": t4 - t3,
            "total_s": time.perf_counter() - t0,
        }
        return UpdateResult(True, version, timings=timings)
