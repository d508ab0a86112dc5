"""SkyRL's vLLM servers as the receiving side of :class:`~skyrl_glm.sync.publisher.InMemoryPublisher`.

Inside SkyRL the publisher is the library's (plan straight into the transport's staging memory -> stage ->
receive -> load -> commit); only the receiving side differs: every server's workers receive and verify the update
(``skyrl_glm_receive`` on :class:`~skyrl_glm.skyrl.vllm_extension.SkyRLGlmWorkerExtension`, over the servers'
``/collective_rpc``) and stage the rebuilt tensors in memory under ``<lora name>@v<version>``; then SkyRL's
``/skyrl/v1/load_lora_adapter`` swaps the served adapter (same name, ``skyrl-lora``) to that staged version, and
older staged versions are dropped. No file is written. A rejected update leaves the previous version serving.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from skyrl.backends.skyrl_train.weight_sync.lora_target import in_memory_lora_path

from skyrl_glm.sync.update import UpdateResult
from skyrl_glm.sync.vllm.control import signed


def _results(responses: Mapping[str, Any]) -> list[Any]:
    """Per-worker results of a ``/collective_rpc`` fan-out, all servers together."""
    return [r for resp in responses.values() for r in ((resp.get("body") or {}).get("results") or [])]


class SkyRLServers:
    """The servers behind a SkyRL ``RemoteInferenceClient``, updated as one async sampler (``apply_update``)."""

    def __init__(self, client: Any, lora_name: str, verify: bool = True) -> None:
        self.client = client
        self.lora_name = lora_name
        self.verify = verify

    async def _rpc(self, method: str, *args: Any) -> list[Any]:
        # RemoteInferenceClient has no public collective_rpc; its control-plane fan-out is what SkyRL's own
        # LoRA receive target uses (set_lora_receive_target).
        # Signed with the run's control key: the servers' workers refuse calls that are not the trainer's.
        payload = {"method": method, "args": list(signed(method, args))}
        return _results(await self.client._call_all_servers("/collective_rpc", payload))

    async def apply_update(self, manifest_json: str, handle: dict[str, Any], transport: str) -> UpdateResult:
        """Every worker receives and stages; all accepted -> load and commit, else discard what was staged."""
        t0 = time.perf_counter()
        answers = await self._rpc("skyrl_glm_receive", manifest_json, handle, transport, self.verify)
        t1 = time.perf_counter()
        accepted = [a for a in answers if isinstance(a, dict) and a.get("ok")]
        if not answers or len(accepted) < len(answers):
            for a in accepted:
                await self._rpc("skyrl_glm_discard", a["staged"])
            refused = next((a for a in answers if a not in accepted), "no inference worker answered")
            reason = refused.get("reason", refused) if isinstance(refused, dict) else refused
            return UpdateResult(False, None, f"update rejected: {reason}")
        version, staged = int(accepted[0]["version"]), str(accepted[0]["staged"])
        await self.client.load_lora_adapter(self.lora_name, in_memory_lora_path(staged))
        t2 = time.perf_counter()
        await self._rpc("skyrl_glm_commit", version, [staged])
        timings = {k: float(v) for k, v in accepted[0].get("timings", {}).items()}
        return UpdateResult(True, version, timings={**timings, "receive_s": t1 - t0, "load_s": t2 - t1})
