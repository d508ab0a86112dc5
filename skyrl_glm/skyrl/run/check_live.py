"""The five-step check's trainer, sampler and publisher on a live SkyRL run (the protocols of
:mod:`skyrl_glm.check.algorithm`).

- trainer: the policy workers' own forward through SkyRL's ``WorkerDispatch.forward`` (the live PEFT model, its
  LoRA included); LoRA B perturbed and restored by worker methods
  (:class:`~skyrl_glm.skyrl.workers.worker_sync.GlmSyncMixin`);
- sampler: SkyRL's inference client against the served adapter, one per engine so that each engine answers a
  share of the probes: ``sample()`` for prefill (prompt logprobs), ``generate()`` (the rollouts' path) for decode
  (greedy tokens and their logprobs);
- publisher: the run's real weight sync (``save_weights_for_sampler``), whatever ``skyrl_glm.sync.mode`` is.

The algorithm is synchronous and runs in a thread; the sampler and publisher hand their coroutines to the
trainer's event loop (where SkyRL's HTTP client lives), which stays free while the check thread waits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import ray
import torch

from skyrl_glm.sync.update import UpdateResult


class HandoffCheckFailed(RuntimeError):
    """The handoff check failed with ``skyrl_glm.check.on_failure=abort``; the message is the report, ``summary`` the
    run's summary so far (its check record holds every step's per-token figures: a stopped run is written too)."""

    def __init__(self, report: str, summary: Any = None) -> None:
        super().__init__(report)
        self.summary = summary  # an attribute: Ray's re-raised subclass carries the cause's attributes


def _on_loop[T](loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


class LiveTrainer:
    """Scores token sequences with the policy workers' forward pass, at the workers' current temperature."""

    def __init__(self, dispatch: Any, policy_group: Any, pad_token_id: int) -> None:
        self.dispatch = dispatch
        self.policy_group = policy_group
        self.pad_token_id = pad_token_id

    @property
    def lora_config(self) -> dict[str, Any]:
        return {}  # the live publisher reads the adapter and its config from the workers themselves

    def adapter(self) -> dict[str, torch.Tensor]:
        return {}

    def _workers(self, method: str, *args: Any) -> list[Any]:
        return ray.get(self.policy_group.async_run_ray_method("pass_through", method, *args))

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Logprob of tokens 1..n-1 of each sequence (SkyRL returns the last ``response_length`` of each
        left-padded row, so a shorter row's slice is taken from the end)."""
        from skyrl.backends.skyrl_train.training_batch import TrainingInputBatch

        width = max(len(s) for s in sequences)
        rows = list(sequences) + [sequences[0]] * (-len(sequences) % self.dispatch.get_lcm_dp_size())
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, s in enumerate(rows):
            ids[i, width - len(s) :] = torch.tensor(s)
            mask[i, width - len(s) :] = 1
        batch = TrainingInputBatch({"sequences": ids, "attention_mask": mask})
        batch.metadata = {"response_length": width - 1}
        out = self.dispatch.forward("policy", batch)
        return [list(o["logprobs"][-(len(s) - 1) :]) for o, s in zip(out.loss_fn_outputs, sequences, strict=False)]

    def perturb_lora_b(self, scale: float, seed: int = 0) -> int:
        """Add ``scale`` to every element of LoRA B on every worker (a constant: the same under any sharding)."""
        return int(self._workers("skyrl_glm_perturb_lora_b", scale)[0])

    def restore_lora_b(self) -> int:
        return int(self._workers("skyrl_glm_restore_lora_b")[0])

    def lora_b_max(self) -> float:
        return max(float(x) for x in self._workers("skyrl_glm_lora_b_max"))


class LiveSampler:
    """Scores and generates on the served LoRA (``model``) through one SkyRL client per engine (each talking to its
    server alone), so every engine is checked: probe ``i`` goes to engine ``i mod engines``."""

    def __init__(self, clients: Sequence[Any], model: str, loop: asyncio.AbstractEventLoop) -> None:
        self.clients = list(clients)
        self.model = model
        self.loop = loop

    def _engine(self, i: int) -> Any:
        return self.clients[i % len(self.clients)]

    async def _sample(self, client: Any, prompt: list[int], prompt_logprobs: bool) -> dict[str, Any]:
        """One token after ``prompt`` (greedy), with the prompt's logprobs when asked."""
        return await client.sample(
            {
                "json": {
                    "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt}]},
                    "num_samples": 1,
                    "model": self.model,
                    "include_prompt_logprobs": prompt_logprobs,
                    "sampling_params": {"temperature": 0.0, "max_tokens": 1},
                }
            }
        )

    async def first_token(self, prompt: list[int]) -> list[list[int]]:
        """One greedy token after ``prompt`` on every engine at once (on the event loop): the cheapest request on
        the served adapter."""
        answers = await asyncio.gather(*(self._sample(c, prompt, False) for c in self.clients))
        return [list(a["sequences"][0]["tokens"]) for a in answers]

    def _all[T](self, calls: list[Awaitable[T]]) -> list[T]:
        async def gather() -> list[T]:
            return list(await asyncio.gather(*calls))

        return _on_loop(self.loop, gather())

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        answers = self._all([self._sample(self._engine(i), s, True) for i, s in enumerate(sequences)])
        return [list(a["prompt_logprobs"][1:]) for a in answers]

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
        """Greedy continuations through each engine's ``generate``, the path SkyRL's rollouts take, with vLLM's own
        sampling parameters: ``max_tokens`` tokens each, past any end-of-sequence token (as the offline sampler),
        so the decode figures always average over every prompt's tokens."""
        params = {"temperature": 0.0, "max_tokens": max_tokens, "logprobs": 0, "ignore_eos": True}
        shares = [list(range(e, len(prompts), len(self.clients))) for e in range(len(self.clients))]
        outs = self._all(
            [
                c.generate(
                    {"prompt_token_ids": [prompts[i] for i in share], "sampling_params": params}, model=self.model
                )
                for c, share in zip(self.clients, shares, strict=True)
                if share
            ]
        )
        result: list[tuple[list[int], list[float]]] = [([], [])] * len(prompts)
        for share, out in zip([s for s in shares if s], outs, strict=True):
            for i, t, lp in zip(share, out["response_ids"], out["response_logprobs"], strict=True):
                result[i] = (list(t), list(lp))
        return result


class LivePublisher:
    """The run's own weight sync, awaited on the trainer's loop; the adapter arguments are not used (the workers
    publish what they hold)."""

    def __init__(self, sync: Callable[[], Coroutine[Any, Any, None]], loop: asyncio.AbstractEventLoop) -> None:
        self.sync = sync
        self.loop = loop
        self.seconds: list[float] = []

    def publish(self, adapter: Any, adapter_config: Any, version: int) -> UpdateResult:
        t0 = time.perf_counter()
        try:
            _on_loop(self.loop, self.sync())
        except Exception as e:  # noqa: BLE001 - a failed sync is the check's finding, reported in its step
            return UpdateResult(False, None, f"{type(e).__name__}: {e}")
        self.seconds.append(time.perf_counter() - t0)
        return UpdateResult(True, version, timings={"sync_s": self.seconds[-1]})
