"""The vLLM worker extension SkyRL's servers load in skyrl-glm runs: SkyRL's own plus skyrl-glm's receiver.

SkyRL's ``VLLMServerActor`` takes one ``worker_extension_cls``; its ``NewInferenceWorkerWrap`` carries the weight
sync and sleep RPCs SkyRL's loop needs, so this class keeps all of it and adds the ``skyrl_glm_*`` methods of
:class:`~skyrl_glm.sync.vllm.worker.LoraSyncWorkerExtension`, reached through the servers' ``/collective_rpc``,
and the worker's end of the collective transport's group (:mod:`skyrl_glm.skyrl.sync_group`).
Set as ``generator.inference_engine.engine_init_kwargs.worker_extension_cls`` by the experiment.
"""

from __future__ import annotations

from skyrl.backends.skyrl_train.inference_servers.new_inference_worker_wrap import NewInferenceWorkerWrap

from skyrl_glm.skyrl import sync_group
from skyrl_glm.sync.transports.base import Transport, TransportError
from skyrl_glm.sync.transports.collective import CollectiveTransport
from skyrl_glm.sync.vllm.worker import LoraSyncWorkerExtension

WORKER_EXTENSION = f"{__name__}.SkyRLGlmWorkerExtension"


class SkyRLGlmWorkerExtension(NewInferenceWorkerWrap, LoraSyncWorkerExtension):
    """SkyRL's worker RPCs and skyrl-glm's verified in-memory LoRA receive, in one vLLM worker."""

    def skyrl_glm_join_group(self, host: str, port: int, rank_offset: int, world_size: int, backend: str) -> int:
        """Join the trainer's sync group (blocks until every rank joined); returns this worker's rank in it."""
        rank = sync_group.worker_rank(self.parallel_config, int(rank_offset))
        self._skyrl_glm_group = sync_group.join(str(host), int(port), rank, int(world_size), str(backend))
        return rank

    def _skyrl_glm_transport(self, name: str) -> Transport:
        if name != CollectiveTransport.name:
            return super()._skyrl_glm_transport(name)
        group = getattr(self, "_skyrl_glm_group", None)
        if group is None:  # never vLLM's own world group: the trainer is not in it
            raise TransportError("this worker has not joined the trainer's sync group (skyrl_glm_join_group)")
        return CollectiveTransport(group=group, src=0)
