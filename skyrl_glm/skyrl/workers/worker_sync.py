"""The strategy-independent half of a policy worker whose LoRA sync goes through skyrl-glm (plan -> transport ->
receiver), and what the check needs from a worker.

Mixed in before SkyRL's FSDP (:mod:`skyrl_glm.skyrl.workers.fsdp`) or Megatron
(:mod:`skyrl_glm.skyrl.workers.megatron`) policy worker. ``skyrl_glm.sync.mode=disk`` keeps SkyRL's own file sync.
The trainer hands each worker its ``skyrl_glm.sync`` settings (:meth:`GlmSyncMixin.skyrl_glm_configure`) before the
weight-sync setup, because a worker only sees ``cfg.trainer``. Nothing here imports
SkyRL's worker modules (they need CUDA-only packages).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from skyrl_glm.check.faults import NO_FAULT, inject_in_skyrl
from skyrl_glm.skyrl.workers import signed_client
from skyrl_glm.skyrl.workers.publish import SkyRLServers, one_server
from skyrl_glm.skyrl.workers.routes import ROUTE_FAULTS, Route, plan_routes
from skyrl_glm.sync.dedup import Dedup
from skyrl_glm.sync.publisher import InMemoryPublisher
from skyrl_glm.sync.transports import needs_group, open_transport
from skyrl_glm.sync.transports.base import Transport
from skyrl_glm.sync.transports.fanout import FanOut
from skyrl_glm.sync.update import UpdateResult

if TYPE_CHECKING:
    from skyrl.train.config import InferenceEngineConfig


@dataclass(frozen=True)
class WorkerSync:
    """The part of ``skyrl_glm.sync`` a policy worker acts on. ``transport`` as configured (``auto`` included):
    rank 0 resolves it per engine once it knows where each engine runs (:mod:`skyrl_glm.skyrl.workers.routes`);
    ``colocated_gpu``: trainer and sampler share GPUs (CUDA IPC on the sender's node under ``auto``)."""

    mode: str
    transport: str
    bucket_bytes: int
    verify: bool = True
    fault: str = "none"
    fault_at_step: int = 0  # 0: from the start; k: from the sync after step k, once the trainer arms it
    colocated_gpu: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class GlmSyncMixin:
    """The strategy-independent half: settings, the rank-0 publish, the fault, and LoRA B access for the check.

    A strategy subclass provides :meth:`_glm_adapter` (the adapter on rank 0: every public name, or already
    deduplicated as the export streamed) and :meth:`_glm_lora_b_params` (its trainable LoRA B parameters)."""

    _glm_sync: WorkerSync | None = None
    _glm_publisher: InMemoryPublisher | None = None
    _glm_sender: Any = None  # the publisher, with the configured fault (skyrl_glm.sync.fault) applied once it applies
    _glm_fault_armed = False  # skyrl_glm.sync.fault_at_step: the trainer arms the fault before the sync after step k
    _glm_group: Any = None  # rank 0, collective transport: the group with the vLLM workers it reaches
    _glm_routes: list[Route] = []  # rank 0: each engine's route (replaced, never mutated)
    _glm_version = 0
    _glm_last: dict[str, Any] | None = None
    _glm_backup: list[torch.Tensor] | None = None
    _glm_export_info: dict[str, Any] = {}  # what the last export measured (replaced, never mutated)

    def skyrl_glm_configure(self, sync: dict[str, Any]) -> None:
        self._glm_sync = WorkerSync(**sync)

    def _glm_memory_sync(self) -> bool:
        return bool(getattr(self, "_is_lora", False)) and self._glm_sync is not None and self._glm_sync.mode == "memory"

    def _glm_skips_transfer_engine(self) -> bool:
        """Whether SkyRL's weight-transfer engine (an NCCL rendezvous with vLLM) goes unused, so is not built."""
        return self._glm_memory_sync()

    def _glm_adapter(self) -> tuple[dict[str, torch.Tensor] | Dedup, dict[str, Any]] | None:
        """``(public name -> tensor or its dedup, PEFT config)`` on rank 0, None elsewhere (a collective: call on
        all ranks). What the export itself measured goes in ``_glm_export_info``."""
        raise NotImplementedError

    async def init_weight_sync_state(
        self, inference_engine_client: Any, inference_engine_cfg: InferenceEngineConfig
    ) -> None:
        signed_client.install()  # this worker's control calls carry the run's signature (the servers' route guard)
        if not self._glm_skips_transfer_engine():
            return await super().init_weight_sync_state(inference_engine_client, inference_engine_cfg)  # type: ignore[misc]
        self._weight_sync_inference_client = inference_engine_client
        self._weight_sync_engine = None
        if self._glm_memory_sync() and torch.distributed.get_rank() == 0:
            await self._glm_open_routes(inference_engine_client)
        torch.distributed.barrier()

    async def _glm_open_routes(self, client: Any) -> None:
        """Rank 0: each engine's route from where it runs, and the collective group with the engines it reaches."""
        from skyrl_glm.skyrl.workers.sync_group import engine_nodes, node_address, open_group

        s = self._glm_sync
        assert s is not None
        engines = await engine_nodes(client)
        self._glm_routes = plan_routes(s.transport, s.colocated_gpu, node_address(), engines, s.fault)
        reached = [r.engine for r in self._glm_routes if needs_group(r.transport)]
        if reached:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            self._glm_group = await open_group(client, backend, reached)

    def skyrl_glm_node(self) -> str:
        """The node this policy rank runs on (the run's record of where its ranks ran)."""
        from skyrl_glm.skyrl.workers.sync_group import node_address

        return node_address()

    def skyrl_glm_routes(self) -> list[dict[str, Any]]:
        """Each engine's route (rank 0; empty elsewhere)."""
        return [r.to_dict() for r in self._glm_routes]

    def offload_to_cpu(self, *args: Any, **kwargs: Any) -> Any:
        """SkyRL's offload, after the publisher lets go of the staging memory its transport keeps between syncs
        (CUDA IPC: one stream's bytes on the GPU, which the colocated sampler wakes into once freed)."""
        if self._glm_publisher is not None:
            self._glm_publisher.forget_staging()
        return super().offload_to_cpu(*args, **kwargs)  # type: ignore[misc]

    def _glm_transport(self) -> Transport:
        """The sending end: every routed transport behind one fan-out, the node-local one first (the plan packs
        into its memory); the collective one over the group with the vLLM workers it reaches."""
        names = sorted({r.transport for r in self._glm_routes}, key=needs_group)
        if self._glm_group is None and any(needs_group(n) for n in names):
            raise RuntimeError("the collective transport's group with the vLLM workers was not opened")
        return FanOut([open_transport(name, self._glm_group) for name in names])

    async def broadcast_to_inference_engines(
        self, inference_engine_client: Any, inference_engine_cfg: InferenceEngineConfig, model_id: str | None = None
    ) -> None:
        if not self._glm_memory_sync():
            return await self._skyrl_sync(inference_engine_client, inference_engine_cfg, model_id)
        client = inference_engine_client or self._weight_sync_inference_client
        cache_reset = self._reset_prefix_cache_task(client, inference_engine_cfg)  # type: ignore[attr-defined]
        lora_name, _ = self._resolve_lora_sync_target(model_id)  # type: ignore[attr-defined]
        await self._glm_publish(client, lora_name)
        if cache_reset is not None:
            await cache_reset
        torch.distributed.barrier()

    def _glm_lora_b_params(self) -> Iterator[torch.Tensor]:
        raise NotImplementedError

    async def _skyrl_sync(self, client: Any, inference_engine_cfg: InferenceEngineConfig, model_id: str | None) -> None:
        """SkyRL's own sync (``skyrl_glm.sync.mode=disk``: its file sync, or its ``lora.sync_mode=memory``), timed
        on rank 0 where the strategy does not time its stages itself, so both syncs have per-step figures."""
        before, t0 = self._glm_version, time.perf_counter()
        await super().broadcast_to_inference_engines(client, inference_engine_cfg, model_id)  # type: ignore[misc]
        if torch.distributed.get_rank() == 0 and self._glm_version == before:
            self._glm_version += 1
            self._glm_last = {
                "ok": True,
                "version": self._glm_version,
                "transport": f"skyrl-{self.cfg.policy.model.lora.sync_mode}",  # type: ignore[attr-defined]
                "total_s": time.perf_counter() - t0,
            }

    async def _glm_publish(self, client: Any, lora_name: str) -> None:
        """One in-memory sync of the live adapter (all ranks; rank 0 publishes). A failure is raised only after
        the barrier, so the other ranks are not left waiting in it."""
        assert self._glm_sync is not None
        adapter = self._glm_adapter()
        result = None
        if torch.distributed.get_rank() == 0 and adapter is not None:
            self._glm_version += 1
            result = await self._glm_send(client, lora_name, *adapter)
            self._glm_last = {
                "ok": result.ok,
                "version": result.version,
                "reason": result.reason,
                "transport": "+".join(sorted({r.transport for r in self._glm_routes})),
                **self._glm_export_info,
                **result.timings,
            }
        torch.distributed.barrier()
        if result is not None and not result.ok:
            raise RuntimeError(f"skyrl-glm LoRA sync of version {self._glm_version} failed: {result.reason}")

    async def _glm_send(
        self, client: Any, lora_name: str, tensors: dict[str, torch.Tensor] | Dedup, config: dict[str, Any]
    ) -> UpdateResult:
        assert self._glm_sync is not None
        try:
            if self._glm_publisher is None or self._glm_publisher.lora_name != lora_name:
                self._glm_publisher = self._glm_new_publisher(client, lora_name)
                self._glm_sender = self._glm_faulty(self._glm_publisher)
            return await self._glm_sender.publish_async(tensors, config, self._glm_version)
        except Exception as e:  # noqa: BLE001 - reported after the barrier, with its reason
            return UpdateResult(False, None, f"{type(e).__name__}: {e}")

    def _glm_faulty(self, publisher: InMemoryPublisher) -> Any:
        """``publisher`` with the configured fault as it stands now: from the start (the first update spared, so
        the check before step 1 sees it), armed (every update broken), or not yet armed (none)."""
        assert self._glm_sync is not None
        fault = NO_FAULT if self._glm_sync.fault in ROUTE_FAULTS else self._glm_sync.fault  # the routes took it
        if self._glm_sync.fault_at_step == 0:
            return inject_in_skyrl(fault, publisher)
        if self._glm_fault_armed:
            return inject_in_skyrl(fault, publisher, spare_first=False)
        return publisher

    def skyrl_glm_arm_fault(self) -> None:
        """Every update from now on goes through the configured fault (``skyrl_glm.sync.fault_at_step``: the
        trainer calls this before the sync after step k)."""
        self._glm_fault_armed = True
        if self._glm_publisher is not None:
            self._glm_sender = self._glm_faulty(self._glm_publisher)

    def _glm_new_publisher(self, client: Any, lora_name: str) -> InMemoryPublisher:
        """The in-memory publisher to the SkyRL servers of ``lora_name`` over the configured transport."""
        assert self._glm_sync is not None
        engines = [(r, one_server(client, r.engine)) for r in self._glm_routes]
        servers = SkyRLServers(engines, lora_name, self._glm_sync.verify)
        return InMemoryPublisher(servers, self._glm_transport(), lora_name, self._glm_sync.bucket_bytes)

    def skyrl_glm_last_sync(self) -> dict[str, Any] | None:
        """What the last in-memory sync reported (rank 0; None elsewhere or before the first)."""
        return self._glm_last

    # -- the check's access to the trainer's adapter -----------------------------------------------------
    @staticmethod
    def _local(p: torch.Tensor) -> torch.Tensor:
        return p.to_local() if hasattr(p, "to_local") else p

    @torch.no_grad()
    def skyrl_glm_perturb_lora_b(self, scale: float) -> int:
        """Back up every LoRA B shard, then add ``scale`` to every element (same result however it is sharded)."""
        params = [self._local(p) for p in self._glm_lora_b_params()]
        self._glm_backup = [p.detach().clone() for p in params]
        for p in params:
            p.add_(scale)
        return len(params)

    @torch.no_grad()
    def skyrl_glm_restore_lora_b(self) -> int:
        """Put back what :meth:`skyrl_glm_perturb_lora_b` saved (bit-exact); the optimizer state is untouched.
        Nothing to put back (0) when no backup was taken: the check stopped before its perturbation, and the
        reason it stopped must not be masked here."""
        backup, self._glm_backup = self._glm_backup, None
        if backup is None:
            return 0
        params = [self._local(p) for p in self._glm_lora_b_params()]
        for p, saved in zip(params, backup, strict=True):
            p.copy_(saved)
        return len(backup)

    @torch.no_grad()
    def skyrl_glm_lora_b_max(self) -> float:
        """max |B| over this rank's LoRA B shards (0.0 while the adapter is still at its initialisation)."""
        return max((float(self._local(p).abs().max()) for p in self._glm_lora_b_params()), default=0.0)
