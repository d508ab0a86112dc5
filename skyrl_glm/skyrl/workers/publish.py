"""SkyRL's vLLM servers as the receiving side of :class:`~skyrl_glm.sync.publisher.InMemoryPublisher`.

Inside SkyRL the publisher is the library's (plan straight into the transport's staging memory -> stage ->
receive -> load -> commit); only the receiving side differs: every routed server's workers receive and verify the
update (``skyrl_glm_receive`` on :class:`~skyrl_glm.skyrl.workers.vllm_extension.SkyRLGlmWorkerExtension`, over that
server's ``/collective_rpc``), each through the transport its route names (:mod:`skyrl_glm.skyrl.workers.routes`; the
publisher's :class:`~skyrl_glm.sync.transports.fanout.FanOut` staged one handle per transport), and stage the
rebuilt tensors in memory under ``<lora name>@v<version>``; then SkyRL's ``/skyrl/v1/load_lora_adapter`` swaps the
served adapter (same name, ``skyrl-lora``) on each of those servers to that staged version, and older staged
versions are dropped. No file is written. A rejected update leaves the previous version serving.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

from skyrl.backends.skyrl_train.weight_sync.lora_target import in_memory_lora_path

from skyrl_glm.skyrl.workers.routes import Route
from skyrl_glm.sync.transports.fanout import HANDLES
from skyrl_glm.sync.update import UpdateResult
from skyrl_glm.sync.vllm.control import signed

log = logging.getLogger(__name__)


def one_server(client: Any, url: str) -> Any:
    """A copy of SkyRL's ``RemoteInferenceClient`` that talks to the server at ``url`` alone (its data plane
    included: requests go to that engine, not through the router)."""
    return dataclasses.replace(
        client,
        proxy_url=url,
        server_urls=[url],
        data_parallel_size=1,
        _generate_client=None,
        _world_size=None,
        _gen_sem=None,
        _detok_sem=None,
        _sem_loop=None,
    )


class SkyRLServers:
    """The routed servers of a SkyRL run, updated as one async sampler (``apply_update``)."""

    def __init__(self, engines: Sequence[tuple[Route, Any]], lora_name: str, verify: bool = True) -> None:
        """``engines``: each routed server's route and a client of that server alone (:func:`one_server`)."""
        self.engines = list(engines)
        self.lora_name = lora_name
        self.verify = verify

    @staticmethod
    async def _rpc(client: Any, method: str, *args: Any) -> list[Any]:
        """Per-worker results of one server's ``/collective_rpc``. RemoteInferenceClient has no public
        collective_rpc; its control-plane call is what SkyRL's own LoRA receive target uses. Signed with the run's
        control key: the servers' workers refuse calls that are not the trainer's."""
        payload = {"method": method, "args": list(signed(method, args))}
        answers = await client._call_all_servers("/collective_rpc", payload)
        return [r for resp in answers.values() for r in ((resp.get("body") or {}).get("results") or [])]

    async def _each(self, method: str, *args: Any) -> list[Any]:
        answers = await asyncio.gather(*(self._rpc(c, method, *args) for _, c in self.engines))
        return [a for per_server in answers for a in per_server]

    def _refusal(self, per_engine: Sequence[list[Any]]) -> str:
        """``by <server>: <reason>`` of the first refusal (the server says which engine, on which node)."""
        for (route, _), answers in zip(self.engines, per_engine, strict=True):
            if not answers:
                return f"by {route.engine}: no inference worker answered"
            for a in answers:
                if not (isinstance(a, dict) and a.get("ok")):
                    return f"by {route.engine}: {a.get('reason', a) if isinstance(a, dict) else a}"
        return "by every server: no inference worker answered"

    async def _discard(self, per_engine: Sequence[list[Any]]) -> None:
        """Drop what each server's workers staged of a refused update: one call per server that staged it, only
        there. Best effort: a server whose other workers refused answers with an error (they hold nothing), and
        what stays staged goes at the next commit; the refusal's own reason is what the caller reports."""
        calls = []
        for (_, client), answers in zip(self.engines, per_engine, strict=True):
            staged = {str(a["staged"]) for a in answers if isinstance(a, dict) and a.get("ok")}
            calls += [self._rpc(client, "skyrl_glm_discard", name) for name in sorted(staged)]
        for outcome in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(outcome, Exception):
                log.warning("skyrl-glm: discarding a refused update's staged copy failed: %s", outcome)

    async def apply_update(self, manifest_json: str, handle: dict[str, Any], transport: str) -> UpdateResult:
        """Every routed server's workers receive (each over its route's transport) and stage; all accepted -> load
        and commit, else discard what was staged."""
        t0 = time.perf_counter()
        handles = handle[HANDLES]
        receiving = (
            self._rpc(c, "skyrl_glm_receive", manifest_json, handles[r.transport], r.transport, self.verify)
            for r, c in self.engines
        )
        per_engine = await asyncio.gather(*receiving)
        answers = [a for per_server in per_engine for a in per_server]
        t1 = time.perf_counter()
        accepted = [a for a in answers if isinstance(a, dict) and a.get("ok")]
        if not answers or len(accepted) < len(answers):
            await self._discard(per_engine)
            return UpdateResult(False, None, f"update rejected {self._refusal(per_engine)}")
        version, staged = int(accepted[0]["version"]), str(accepted[0]["staged"])
        await asyncio.gather(
            *(c.load_lora_adapter(self.lora_name, in_memory_lora_path(staged)) for _, c in self.engines)
        )
        t2 = time.perf_counter()
        await self._each("skyrl_glm_commit", version, [staged])
        timings = {k: float(v) for k, v in accepted[0].get("timings", {}).items()}
        return UpdateResult(True, version, timings={**timings, "receive_s": t1 - t0, "load_s": t2 - t1})
