"""The async sampler: vLLM's ``AsyncLLM`` (what SkyRL serves generation through) with in-memory adapter swaps.

Same update protocol as :class:`~skyrl_glm.sync.vllm.engine.VllmEngineSampler` (shared through
:class:`~skyrl_glm.sync.vllm.versions.LoraVersions`), but swaps happen while requests run. A request binds the
serving ``LoRARequest`` when it starts and keeps it to its last token; the sampler counts requests in flight
per LoRA id and removes a superseded version only once no request that started on it is still running.
Use one event loop for the sampler's whole life (AsyncLLM's output handler lives on it).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from skyrl_glm.sync.update import UpdateResult
from skyrl_glm.sync.vllm.control import signed
from skyrl_glm.sync.vllm.engine import (
    apply_engine_environment,
    completion,
    engine_settings,
    greedy_params,
    prompt_logprobs,
    scoring_params,
)
from skyrl_glm.sync.vllm.versions import LoraVersions, Op, Steps, advance

log = logging.getLogger(__name__)


async def drive_async(steps: Steps, call: Callable[[Op], Awaitable[Any]]) -> Any:
    """:func:`~skyrl_glm.sync.vllm.versions.drive` for an engine whose ``call(op)`` is awaited."""
    done, op = advance(steps, None)
    while not done:
        done, op = advance(steps, await call(op))
    return op


class AsyncVllmEngineSampler(LoraVersions):
    """Owns an ``AsyncLLM`` with LoRA enabled and the skyrl-glm worker extension."""

    def __init__(self, engine: Mapping[str, Any], *, max_lora_rank: int = 16):
        """``engine``: vLLM arguments, ``model`` among them (see :func:`.engine.engine_settings`)."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        settings = engine_settings(engine, max_lora_rank=max_lora_rank)
        super().__init__(settings)
        apply_engine_environment()
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**settings))
        self._updating = asyncio.Lock()  # one RPC sequence (update or deferred removal) at a time
        self._ids = itertools.count()

    def shutdown(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.shutdown()

    # -- engine operations (see ``versions.Op``) --------------------------------------------------
    async def _call(self, op: Op) -> Any:
        try:
            return await getattr(self, f"_{op[0]}")(*op[1:])
        except Exception as e:  # noqa: BLE001 - the outcome goes back to the steps, which decide
            return e

    async def _rpc(self, method: str, args: tuple[Any, ...]) -> Any:
        return await self.engine.collective_rpc(method, args=signed(method, args))

    async def _add_lora(self, request: Any) -> bool:
        return await self.engine.add_lora(request)

    async def _remove_lora(self, lora_id: int) -> bool:
        return await self.engine.remove_lora(lora_id)

    async def _run_steps(self, steps: Steps) -> Any:
        async with self._updating:
            return await drive_async(steps, self._call)

    # -- adapter updates ---------------------------------------------------------------------------
    async def apply_update(self, manifest_json: str, handle: dict[str, Any], transport: str) -> UpdateResult:
        return await self._run_steps(self.update_steps(manifest_json, handle, transport))

    async def load_adapter_dir(self, path: str, lora_name: str) -> UpdateResult:
        """The disk baseline: vLLM reads a PEFT directory the standard way."""
        return await self._run_steps(self.load_dir_steps(path, lora_name))

    async def loaded_lora_ids(self) -> set[int]:
        """LoRA ids the engine has loaded now."""
        return set(await self.engine.list_loras())

    # -- requests ------------------------------------------------------------------------------------
    async def run(self, prompt: list[int], params: Any, on_output: Callable[[Any], None] | None = None) -> Any:
        """One request on the adapter serving when it starts; returns its final ``RequestOutput``.

        ``on_output`` sees every intermediate output (cumulative). The version is held until the request ends
        (finished, failed or cancelled); if it was superseded meanwhile and this was its last request, it is
        removed here."""
        request = self.acquire()
        final = None
        try:
            stream = self.engine.generate(
                {"prompt_token_ids": prompt}, params, f"skyrl-glm-{next(self._ids)}", lora_request=request
            )
            async for final in stream:
                if on_output is not None:
                    on_output(final)
            return final
        finally:
            retired = self.release(request)
            if retired is not None:
                try:
                    await self._run_steps(self.remove_steps(retired))
                except Exception:  # noqa: BLE001 - the request's own outcome stands; the version stays loaded
                    log.exception("could not remove retired LoRA id %d", retired.lora_int_id)

    async def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Logprob of each token given its prefix (positions 1..n-1), through vLLM's prefill path."""
        outs = await asyncio.gather(*(self.run(s, scoring_params()) for s in sequences))
        return [prompt_logprobs(o, s) for o, s in zip(outs, sequences, strict=True)]

    async def generate(self, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
        """Greedy continuations and the logprobs vLLM reports for its own tokens (the decode path)."""
        outs = await asyncio.gather(*(self.run(p, greedy_params(max_tokens)) for p in prompts))
        return [completion(o) for o in outs]
