"""The sampler side in the trainer's process: a vLLM engine whose adapter is swapped in memory.

``apply_update`` runs the worker-side receive on every worker, then loads the staged adapter under a new
LoRA id and only then points new requests at it (atomic swap: a request carries its ``LoRARequest``, so it
runs on one version from start to end). The previous version stays loaded until the next swap.

The adapter-version bookkeeping (:class:`LoraVersions`) is engine independent: it describes each update as a
sequence of engine operations (``rpc``, ``add_lora``, ``remove_lora``, ``reset_prefix_cache``) which
:func:`drive` runs on the offline ``vllm.LLM`` here and :func:`~skyrl_glm.sync.vllm_async.drive_async` on
``AsyncLLM``, so both samplers share one update protocol.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from skyrl.backends.skyrl_train.weight_sync.lora_target import in_memory_lora_path, lora_name_from_in_memory_path

log = logging.getLogger(__name__)

WORKER_EXTENSION = "skyrl_glm.sync.vllm_worker.LoraSyncWorkerExtension"

# One engine operation: ("rpc", method, args) | ("add_lora", request) | ("remove_lora", lora_id)
# | ("reset_prefix_cache",). An engine runs it through its method ``_<op[0]>(*op[1:])``; an exception
# the operation raises is thrown back into the steps at the ``yield``.
Op = tuple[Any, ...]
Steps = Generator[Op, Any, Any]


@dataclass
class UpdateResult:
    ok: bool
    version: int | None
    reason: str = ""
    timings: dict[str, float] = field(default_factory=dict)


def engine_settings(
    model_dir: str,
    *,
    max_lora_rank: int = 16,
    max_model_len: int = 256,
    max_loras: int = 2,
    max_cpu_loras: int = 3,
    **engine_kwargs: Any,
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` or ``AsyncEngineArgs``: LoRA on, the skyrl-glm worker extension."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        # On CPU "gpu_memory_utilization" reserves host memory; tiny test models need little KV cache.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        engine_kwargs.setdefault("gpu_memory_utilization", 0.2)
    engine_kwargs.setdefault("enforce_eager", True)
    # A prefix-cache hit runs other kernels than a fresh prefill (bf16 MLA on CPU differs by ~4e-3), which
    # would break the check's repeat-score test; the sampler used for checking scores from scratch.
    engine_kwargs.setdefault("enable_prefix_caching", False)
    engine_kwargs.setdefault("max_model_len", max_model_len)
    return dict(
        model=str(model_dir),
        enable_lora=True,
        max_lora_rank=max_lora_rank,
        max_loras=max_loras,
        max_cpu_loras=max_cpu_loras,
        worker_extension_cls=WORKER_EXTENSION,
        **engine_kwargs,
    )


def advance(steps: Steps, outcome: Any) -> tuple[bool, Any]:
    """Feed one operation's outcome (its value, or the exception it raised) into ``steps``:
    ``(False, next op)`` or ``(True, the steps' return value)``."""
    try:
        return False, steps.throw(outcome) if isinstance(outcome, Exception) else steps.send(outcome)
    except StopIteration as stop:
        return True, stop.value


def drive(steps: Steps, call: Callable[[Op], Any]) -> Any:
    """Run ``steps`` on an engine whose ``call(op)`` blocks and returns the outcome (value or exception)."""
    done, op = advance(steps, None)
    while not done:
        done, op = advance(steps, call(op))
    return op


def staged_name_of(request: Any) -> str | None:
    """The worker-side staged name of an in-memory adapter request (None for a directory)."""
    return lora_name_from_in_memory_path(request.lora_path)


class LoraVersions:
    """Which LoRA ids serve, and the update protocol around them (engine independent).

    ``adapter`` is the ``LoRARequest`` new requests use; ``_previous`` the one before, kept loaded until the next
    swap. A request in flight holds its version (:meth:`acquire` / :meth:`release`): a version older than
    ``_previous`` is removed at a swap only if nothing holds it, otherwise it is *retired* and removed (and its
    staged tensors discarded) when its last request finishes. The offline sampler never has requests in flight
    at a swap; the async one does.
    """

    def __init__(self) -> None:
        self.adapter: Any = None
        self._previous: Any = None
        self._next_lora_id = 1
        self._in_flight: Counter[int] = Counter()
        self._retired: dict[int, Any] = {}

    # -- requests in flight ------------------------------------------------------------------------
    def acquire(self) -> Any:
        """The serving adapter for a request about to start; it stays loaded until :meth:`release`."""
        request = self.adapter
        if request is not None:
            self._in_flight[request.lora_int_id] += 1
        return request

    def release(self, request: Any) -> Any:
        """A request on ``request`` finished; returns ``request`` when that version must now be removed."""
        if request is None:
            return None
        lora_id = request.lora_int_id
        self._in_flight[lora_id] -= 1
        if self._in_flight[lora_id] > 0:
            return None
        del self._in_flight[lora_id]
        return self._retired.pop(lora_id, None)

    def in_flight(self) -> dict[int, int]:
        return dict(self._in_flight)

    def retired(self) -> list[int]:
        return sorted(self._retired)

    # -- the update protocol -----------------------------------------------------------------------
    def new_request(self, lora_name: str, path: str) -> Any:
        from vllm.lora.request import LoRARequest

        lora_id, self._next_lora_id = self._next_lora_id, self._next_lora_id + 1
        return LoRARequest(lora_name=lora_name, lora_int_id=lora_id, lora_path=path)

    def keep(self) -> list[str]:
        """Staged names the workers must keep: serving, previous, and retired versions still in flight
        (vLLM rebuilds an LRU-evicted adapter from its staged tensors while a request still uses it)."""
        requests = [self.adapter, self._previous, *self._retired.values()]
        return [name for r in requests if r is not None and (name := staged_name_of(r)) is not None]

    def swap_steps(self, request: Any) -> Generator[Op, Any, str | None]:
        """Load ``request`` on every worker, then make it the serving adapter; drop the one before last
        unless a request still runs on it. Returns None, or why vLLM refused the adapter."""
        try:
            yield ("add_lora", request)
        except Exception as e:  # noqa: BLE001 - vLLM refused the adapter: keep serving the old one
            return f"{type(e).__name__}: {e}"
        stale, self._previous, self.adapter = self._previous, self.adapter, request
        if stale is not None:
            if self._in_flight[stale.lora_int_id] > 0:
                self._retired[stale.lora_int_id] = stale
            else:
                yield ("remove_lora", stale.lora_int_id)
        # Prefix-cache blocks are keyed by adapter name and path (which carry the version), so a stale entry
        # is never hit by another version; the reset frees them. With requests running it may free nothing.
        yield ("reset_prefix_cache",)
        return None

    def remove_steps(self, request: Any) -> Steps:
        """Remove a retired version once its last request finished, and free its staged tensors."""
        yield ("remove_lora", request.lora_int_id)
        name = staged_name_of(request)
        if name is not None:
            yield ("rpc", "skyrl_glm_discard", (name,))

    def update_steps(self, manifest_json: str, handle: dict[str, Any], transport: str) -> Steps:
        """Receive on every worker, load under a new LoRA id, swap, commit the version."""
        t0 = time.perf_counter()
        answers = yield ("rpc", "skyrl_glm_receive", (manifest_json, handle, transport))
        refused = [a for a in answers if not a.get("ok")]
        if refused:
            for a in answers:
                if a.get("ok"):
                    yield ("rpc", "skyrl_glm_discard", (a["staged"],))
            return UpdateResult(False, None, refused[0]["reason"])
        staged, version = answers[0]["staged"], int(answers[0]["version"])
        t1 = time.perf_counter()
        failure = yield from self.swap_steps(self.new_request(staged, in_memory_lora_path(staged)))
        if failure is not None:
            yield ("rpc", "skyrl_glm_discard", (staged,))
            return UpdateResult(False, None, f"vLLM could not load the adapter: {failure}")
        yield ("rpc", "skyrl_glm_commit", (version, self.keep()))
        timings = dict(answers[0].get("timings", {}))
        timings.update({"receive_rpc_s": t1 - t0, "load_s": time.perf_counter() - t1})
        return UpdateResult(True, version, timings=timings)

    def load_dir_steps(self, path: str, lora_name: str) -> Steps:
        """The disk baseline: vLLM reads a PEFT directory the standard way."""
        t0 = time.perf_counter()
        failure = yield from self.swap_steps(self.new_request(lora_name, str(path)))
        if failure is not None:
            return UpdateResult(False, None, f"vLLM could not load {path}: {failure}")
        return UpdateResult(True, None, timings={"load_s": time.perf_counter() - t0})


def prompt_logprobs(output: Any, sequence: list[int]) -> list[float]:
    """Logprob of each token of ``sequence`` given its prefix (positions 1..n-1) from a prefill output."""
    return [output.prompt_logprobs[i][sequence[i]].logprob for i in range(1, len(sequence))]


def completion(output: Any) -> tuple[list[int], list[float]]:
    """The generated tokens and the logprob vLLM reports for each."""
    c = output.outputs[0]
    return list(c.token_ids), [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids, strict=True)]


def scoring_params() -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)


def greedy_params(max_tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=0, ignore_eos=True)


class VllmEngineSampler(LoraVersions):
    """Owns a ``vllm.LLM`` with LoRA enabled and the skyrl-glm worker extension."""

    def __init__(self, model_dir: str, *, max_lora_rank: int = 16, max_model_len: int = 256, **engine_kwargs: Any):
        from vllm import LLM

        super().__init__()
        settings = engine_settings(model_dir, max_lora_rank=max_lora_rank, max_model_len=max_model_len, **engine_kwargs)
        self.llm = LLM(**settings)

    def close(self, timeout: float = 1.0) -> None:
        """Stop the engine now. Left to interpreter exit, vLLM waits 5 s for its engine process (whose CPU
        worker does not exit in that time) and then kills it anyway, ~10 s at the end of a short run."""
        self.llm.llm_engine.engine_core.shutdown(timeout=timeout)

    # -- engine operations (see ``Op``) -------------------------------------------------------------
    def _call(self, op: Op) -> Any:
        try:
            return getattr(self, f"_{op[0]}")(*op[1:])
        except Exception as e:  # noqa: BLE001 - the outcome goes back to the steps, which decide
            return e

    def _rpc(self, method: str, args: tuple[Any, ...]) -> Any:
        return self.llm.collective_rpc(method, args=args)

    def _add_lora(self, request: Any) -> bool:
        return self.llm.llm_engine.add_lora(request)

    def _remove_lora(self, lora_id: int) -> bool:
        return self.llm.llm_engine.remove_lora(lora_id)

    def _reset_prefix_cache(self) -> bool:
        return self.llm.reset_prefix_cache()

    # -- adapter updates ---------------------------------------------------------------------------
    def apply_update(self, manifest_json: str, handle: dict[str, Any], transport: str) -> UpdateResult:
        return drive(self.update_steps(manifest_json, handle, transport), self._call)

    def load_adapter_dir(self, path: str, lora_name: str) -> UpdateResult:
        """The disk baseline: vLLM reads a PEFT directory the standard way."""
        return drive(self.load_dir_steps(path, lora_name), self._call)

    # -- scoring -----------------------------------------------------------------------------------
    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Logprob of each token given its prefix (positions 1..n-1), through vLLM's prefill path."""
        outs = self.llm.generate(
            [{"prompt_token_ids": s} for s in sequences], scoring_params(), lora_request=self.adapter, use_tqdm=False
        )
        return [prompt_logprobs(o, s) for o, s in zip(outs, sequences, strict=True)]

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
        """Greedy continuations and the logprobs vLLM reports for its own tokens (the decode path)."""
        params = greedy_params(max_tokens)
        outs = self.llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, lora_request=self.adapter, use_tqdm=False
        )
        return [completion(o) for o in outs]
