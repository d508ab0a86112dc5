"""Adapter swaps under vLLM's async engine (AsyncLLM) while generation runs: a request finishes on the version it
started on, never a mix, and that version is removed only once its last request finished.

One AsyncLLM engine (module scope) on the tiny GLM-4.5 proxy, fp32, on its own event-loop thread (AsyncLLM's
output handler lives on one loop). HF+PEFT is the reference for every version.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from skyrl_glm.check.probes import make_probes
from skyrl_glm.sync.publisher import InMemoryPublisher
from skyrl_glm.sync.transports.shm import SharedMemoryTransport
from skyrl_glm.sync.vllm.engine import greedy_params

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = make_probes(512, num=3, prompt_length=12, seed=11).prompts
LONG = 160  # tokens of the request that spans two swaps (prompt 12 + 160 < max_model_len 256)
TOL = 1e-5
SEEDS = {1: 101, 2: 202, 3: 303}  # adapter version -> seed of its LoRA weights


class LoopThread:
    """An asyncio loop on a daemon thread; ``run(coro)`` blocks until the coroutine is done there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 300):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def loop():
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture(scope="module")
def async_sampler(glm45_dir, loop):
    from skyrl_glm.models.vllm_targets import vllm_engine_kwargs
    from skyrl_glm.plugins import registry
    from skyrl_glm.sync.vllm.async_engine import AsyncVllmEngineSampler

    family = registry().model("glm-4.5")
    kwargs = vllm_engine_kwargs(family, glm45_dir, lora_targets=family.lora.resolve(sampler="vllm-cpu"), device="cpu")
    assert kwargs["dtype"] == "float32"

    async def make():  # built on the loop that serves it
        # max_loras=3: the long v1 request, a v2 and a v3 request share batches
        return AsyncVllmEngineSampler({**kwargs, "max_loras": 3, "max_cpu_loras": 4}, max_lora_rank=8)

    sampler = loop.run(make())
    yield sampler
    sampler.shutdown()


def _set_version(trainer, version: int) -> None:
    """Deterministic, non-zero LoRA A and B for ``version`` (calling it again restores that version exactly)."""
    gen = torch.Generator().manual_seed(SEEDS[version])
    with torch.no_grad():
        for name, p in sorted(trainer.model.named_parameters()):
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def _trainer_logprobs(trainer, version: int, prompt: list[int], tokens: list[int]) -> list[float]:
    _set_version(trainer, version)
    return trainer.score([prompt + tokens])[0][len(prompt) - 1 :]


def _max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_requests_in_flight_finish_on_their_version(glm45_trainer, async_sampler, loop):
    sampler, trainer = async_sampler, glm45_trainer
    publisher = InMemoryPublisher(sampler, SharedMemoryTransport())

    async def publish(version: int):
        _set_version(trainer, version)
        result = await publisher.publish_async(trainer.adapter(), trainer.lora_config, version)
        assert result.ok, result.reason
        return sampler.adapter.lora_int_id

    async def staged() -> list[str]:
        return (await sampler._rpc("skyrl_glm_staged", ()))[0]

    async def scenario() -> dict:
        ev: dict = {"id1": await publish(1)}
        progress: list[tuple[float, int]] = []  # (time, tokens so far) of the long request
        long_run = asyncio.create_task(
            sampler.run(
                PROMPTS[0],
                greedy_params(LONG),
                lambda o: progress.append((time.perf_counter(), len(o.outputs[0].token_ids))),
            )
        )
        while not progress:
            await asyncio.sleep(0.002)
        ev["tokens_before_v2"] = progress[-1][1]
        ev["id2"] = await publish(2)
        ev["tokens_after_v2"] = progress[-1][1]
        mid_run = asyncio.create_task(sampler.run(PROMPTS[1], greedy_params(48)))  # starts on v2
        ev["id3"] = await publish(3)  # v1 is now older than previous: removal must wait for the long request
        ev["tokens_after_v3"] = progress[-1][1]
        ev["long_done_at_v3"] = long_run.done()
        ev["loaded_at_v3"] = await sampler.loaded_lora_ids()
        ev["retired_at_v3"] = sampler.retired()
        ev["in_flight_at_v3"] = sampler.in_flight()
        ev["staged_at_v3"] = await staged()
        late_run = asyncio.create_task(sampler.run(PROMPTS[2], greedy_params(24)))  # starts on v3
        ev["long"] = await long_run  # its release removed v1 (inside run(), before it returned)
        ev["loaded_after_long"] = await sampler.loaded_lora_ids()
        ev["retired_after_long"] = sampler.retired()
        ev["staged_after_long"] = await staged()
        ev["mid"], ev["late"] = await mid_run, await late_run
        ev["in_flight_end"] = sampler.in_flight()
        ev["progress"] = progress
        return ev

    ev = loop.run(scenario())
    id1, id2, id3 = ev["id1"], ev["id2"], ev["id3"]
    print(
        f"long request tokens: {ev['tokens_before_v2']} at v2 start, {ev['tokens_after_v2']} after v2, "
        f"{ev['tokens_after_v3']} after v3 (of {LONG}); loaded at v3 {sorted(ev['loaded_at_v3'])}, "
        f"after long {sorted(ev['loaded_after_long'])}; staged at v3 {ev['staged_at_v3']}, "
        f"after {ev['staged_after_long']}"
    )

    # true overlap: the long request produced tokens before the first swap and after the second
    assert ev["tokens_before_v2"] >= 1
    assert ev["tokens_after_v3"] < LONG and not ev["long_done_at_v3"]
    # every request ran on the adapter serving when it started
    assert ev["long"].lora_request.lora_int_id == id1
    assert ev["mid"].lora_request.lora_int_id == id2
    assert ev["late"].lora_request.lora_int_id == id3

    # deferred removal: at v3, v1 (older than previous) stayed loaded and staged because the long request ran on it
    assert {id1, id2, id3} <= ev["loaded_at_v3"]
    assert ev["retired_at_v3"] == [id1] and ev["in_flight_at_v3"].get(id1) == 1
    assert "policy@v1" in ev["staged_at_v3"]
    # ... and went as soon as that request finished
    assert id1 not in ev["loaded_after_long"] and {id2, id3} <= ev["loaded_after_long"]
    assert ev["retired_after_long"] == [] and "policy@v1" not in ev["staged_after_long"]
    assert ev["in_flight_end"] == {}

    # every token of each request matches HF+PEFT at the version it started on, and not at the others
    results = {}
    for label, out, prompt, own in (
        ("long", ev["long"], PROMPTS[0], 1),
        ("mid", ev["mid"], PROMPTS[1], 2),
        ("late", ev["late"], PROMPTS[2], 3),
    ):
        c = out.outputs[0]
        tokens = list(c.token_ids)
        got = [lp[t].logprob for lp, t in zip(c.logprobs, tokens, strict=True)]
        diffs = {v: _max_diff(got, _trainer_logprobs(trainer, v, prompt, tokens)) for v in SEEDS}
        results[label] = diffs
        print(
            f"{label} ({len(tokens)} tokens, started on v{own}): max |d| vs HF+PEFT "
            + ", ".join(f"v{v} {d:.3g}" for v, d in diffs.items())
        )
        assert diffs[own] <= TOL, (label, diffs)
        for v, d in diffs.items():
            if v != own:
                assert d > 1e-3, (label, diffs)  # the versions are distinguishable on these tokens


def test_rejected_update_keeps_serving_async(glm45_trainer, async_sampler, loop):
    """A bad update (a module the model lacks) is refused by vLLM; the async sampler keeps its adapter."""
    sampler, trainer = async_sampler, glm45_trainer
    publisher = InMemoryPublisher(sampler, SharedMemoryTransport())

    async def scenario():
        serving = sampler.adapter
        before = await sampler.score(PROMPTS)
        _set_version(trainer, 1)
        adapter = trainer.adapter()
        extra = {k.replace("q_proj", "bogus_proj"): v for k, v in adapter.items() if "layers.0.self_attn.q_proj" in k}
        result = await publisher.publish_async({**adapter, **extra}, trainer.lora_config, 1000)
        after = await sampler.score(PROMPTS)
        return serving, result, before, after

    serving, result, before, after = loop.run(scenario())
    assert not result.ok and "could not load" in result.reason, result.reason
    assert sampler.adapter is serving
    assert max(_max_diff(a, b) for a, b in zip(before, after, strict=True)) == 0.0
