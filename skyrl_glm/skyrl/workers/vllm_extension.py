"""The vLLM worker extension SkyRL's servers load in skyrl-glm runs: SkyRL's own plus skyrl-glm's receiver.

SkyRL's ``VLLMServerActor`` takes one ``worker_extension_cls``; its ``NewInferenceWorkerWrap`` carries the weight
sync and sleep RPCs SkyRL's loop needs, so this class keeps the sleep and wake RPCs and adds the ``skyrl_glm_*``
methods of :class:`~skyrl_glm.sync.vllm.worker.LoraSyncWorkerExtension`, reached through the servers'
``/collective_rpc``, and the worker's end of the collective transport's group
(:mod:`skyrl_glm.skyrl.workers.sync_group`).
This class is set (as ``generator.inference_engine.engine_init_kwargs.worker_extension_cls``) only where skyrl-glm's
in-memory sync brings the adapter, so SkyRL's own adapter and weight receive RPCs are refused here, and SkyRL's
discard never drops a name skyrl-glm staged (the serving adapter among them).
"""

from __future__ import annotations

from typing import Any

from skyrl.backends.skyrl_train.inference_servers.new_inference_worker_wrap import NewInferenceWorkerWrap

from skyrl_glm.skyrl.workers import sync_group
from skyrl_glm.sync.vllm.control import ControlRefused, verify
from skyrl_glm.sync.vllm.worker import LoraSyncWorkerExtension, receiver_state

WORKER_EXTENSION = f"{__name__}.SkyRLGlmWorkerExtension"
# SkyRL's RPCs this class keeps as they are (its loop calls them; the servers' route guard admits only the run).
SKYRL_KEPT = ("skyrl_sleep_for_weight_sync", "skyrl_wake_for_weight_sync")
# SkyRL's RPCs this class refuses or narrows (see the methods).
SKYRL_NARROWED = ("fetch_weights", "skyrl_set_lora_receive_target", "skyrl_discard_in_memory_lora")
BACKENDS = ("nccl", "gloo")
MAX_WORLD = 1 << 16


def _is_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


class SkyRLGlmWorkerExtension(NewInferenceWorkerWrap, LoraSyncWorkerExtension):
    """SkyRL's worker RPCs and skyrl-glm's verified in-memory LoRA receive, in one vLLM worker."""

    skyrl_glm_group_required = True  # never vLLM's own world group: the trainer is not in it
    skyrl_glm_loads_3d = False  # SkyRL's load_lora_adapter sends no is_3d_lora_weight: per-expert names under its
    # enable_mixed_moe_lora_format

    def skyrl_glm_join_group(self, *args: Any, **kwargs: Any) -> int:
        """Join the trainer's sync group (blocks until every rank joined, at most ``sync_group.TIMEOUT``); once per
        worker, signed like every control call. Returns this worker's rank in the group."""
        host, port, rank_offset, world_size, backend = verify("skyrl_glm_join_group", args, kwargs, (5, 5))
        if not isinstance(host, str) or not _is_int(port, 1, 65535) or backend not in BACKENDS:
            raise ControlRefused("skyrl_glm_join_group: host a string, port in 1..65535, backend nccl or gloo")
        if not _is_int(world_size, 2, MAX_WORLD) or not _is_int(rank_offset, 1, world_size - 1):
            raise ControlRefused(f"skyrl_glm_join_group: world size in 2..{MAX_WORLD}, rank offset in 1..world - 1")
        state = receiver_state(self)
        if state.joined:
            raise ControlRefused("skyrl_glm_join_group: this worker already joined a sync group in this run")
        rank = sync_group.worker_rank(self.parallel_config, rank_offset)
        if rank >= world_size:
            raise ControlRefused(f"skyrl_glm_join_group: this worker's rank {rank} is outside the world {world_size}")
        state.joined = True  # before it blocks: a replayed join is refused, not a second wait
        state.group = sync_group.join(host, port, rank, world_size, backend)
        return rank

    def skyrl_glm_node(self, *args: Any, **kwargs: Any) -> str:
        """The node this worker runs on: the trainer routes each engine's update by where its workers are
        (:mod:`skyrl_glm.skyrl.workers.routes`). Signed like every control call."""
        verify("skyrl_glm_node", args, kwargs, (0, 0))
        return sync_group.node_address()

    def fetch_weights(self, *args: Any, **kwargs: Any) -> Any:
        raise ControlRefused("fetch_weights: skyrl-glm syncs the LoRA adapter in memory; base weights are not fetched")

    def skyrl_set_lora_receive_target(self, *args: Any, **kwargs: Any) -> None:
        raise ControlRefused("skyrl_set_lora_receive_target: skyrl-glm's receiver brings the adapter (skyrl_glm_*)")

    def skyrl_discard_in_memory_lora(self, *args: Any, **kwargs: Any) -> bool:
        """SkyRL's discard (its client's unload calls it with the adapter's plain name), except for the names
        skyrl-glm staged: those go only through ``skyrl_glm_commit`` / ``skyrl_glm_discard``."""
        given = [*args, *kwargs.values()]
        if len(given) != 1 or set(kwargs) - {"lora_name"}:
            raise ControlRefused("skyrl_discard_in_memory_lora: takes one lora_name")
        name = given[0]
        if not isinstance(name, str) or name in receiver_state(self).staged:
            raise ControlRefused(f"skyrl_discard_in_memory_lora: {name!r:.80} is skyrl-glm's to drop")
        return super().skyrl_discard_in_memory_lora(name)
