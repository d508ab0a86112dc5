"""The vLLM worker extension SkyRL's servers load in skyrl-glm runs: SkyRL's own plus skyrl-glm's receiver.

SkyRL's ``VLLMServerActor`` takes one ``worker_extension_cls``; its ``NewInferenceWorkerWrap`` carries the weight
sync and sleep RPCs SkyRL's loop needs, so this class keeps all of it and adds the ``skyrl_glm_*`` methods of
:class:`~skyrl_glm.sync.vllm.worker.LoraSyncWorkerExtension`, reached through the servers' ``/collective_rpc``.
Set as ``generator.inference_engine.engine_init_kwargs.worker_extension_cls`` by the experiment.
"""

from __future__ import annotations

from skyrl.backends.skyrl_train.inference_servers.new_inference_worker_wrap import NewInferenceWorkerWrap

from skyrl_glm.sync.vllm.worker import LoraSyncWorkerExtension

WORKER_EXTENSION = f"{__name__}.SkyRLGlmWorkerExtension"


class SkyRLGlmWorkerExtension(NewInferenceWorkerWrap, LoraSyncWorkerExtension):
    """SkyRL's worker RPCs and skyrl-glm's verified in-memory LoRA receive, in one vLLM worker."""
