"""The sampler side in the trainer's process: an offline ``vllm.LLM`` whose adapter is swapped in memory.

``apply_update`` runs the worker-side receive on every worker, then loads the staged adapter under a new
LoRA id and only then points new requests at it (atomic swap: a request carries its ``LoRARequest``, so it
runs on one version from start to end). The previous version stays loaded until the next swap.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from skyrl.backends.skyrl_train.weight_sync.lora_target import in_memory_lora_path

log = logging.getLogger(__name__)

WORKER_EXTENSION = "skyrl_glm.sync.vllm_worker.LoraSyncWorkerExtension"


@dataclass
class UpdateResult:
    ok: bool
    version: int | None
    reason: str = ""
    timings: dict[str, float] = field(default_factory=dict)


class VllmEngineSampler:
    """Owns a ``vllm.LLM`` with LoRA enabled and the skyrl-glm worker extension."""

    def __init__(self, model_dir: str, *, max_lora_rank: int = 16, max_model_len: int = 256, **engine_kwargs: Any):
        from vllm import LLM
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
        self.llm = LLM(
            model=str(model_dir),
            enable_lora=True,
            max_lora_rank=max_lora_rank,
            max_loras=2,
            max_cpu_loras=3,
            worker_extension_cls=WORKER_EXTENSION,
            **engine_kwargs,
        )
        self.adapter = None  # the LoRARequest new requests use
        self._previous = None
        self._next_lora_id = 1

    # -- adapter updates ---------------------------------------------------------------------------
    def _swap(self, request: Any) -> None:
        """Load ``request`` on every worker, then make it the serving adapter; drop the one before last."""
        self.llm.llm_engine.add_lora(request)
        stale, self._previous, self.adapter = self._previous, self.adapter, request
        if stale is not None:
            self.llm.llm_engine.remove_lora(stale.lora_int_id)
        self.llm.reset_prefix_cache()

    def _new_request(self, lora_name: str, path: str) -> Any:
        from vllm.lora.request import LoRARequest

        lora_id, self._next_lora_id = self._next_lora_id, self._next_lora_id + 1
        return LoRARequest(lora_name=lora_name, lora_int_id=lora_id, lora_path=path)

    def apply_update(self, manifest_json: str, handle: dict[str, Any], transport: str) -> UpdateResult:
        t0 = time.perf_counter()
        answers = self.llm.collective_rpc("skyrl_glm_receive", args=(manifest_json, handle, transport))
        refused = [a for a in answers if not a.get("ok")]
        if refused:
            for a in answers:
                if a.get("ok"):
                    self.llm.collective_rpc("skyrl_glm_discard", args=(a["staged"],))
            return UpdateResult(False, None, refused[0]["reason"])
        staged, version = answers[0]["staged"], int(answers[0]["version"])
        t1 = time.perf_counter()
        request = self._new_request(staged, in_memory_lora_path(staged))
        try:
            self._swap(request)
        except Exception as e:  # noqa: BLE001 - vLLM refused the adapter: keep serving the old one
            self.llm.collective_rpc("skyrl_glm_discard", args=(staged,))
            return UpdateResult(False, None, f"vLLM could not load the adapter: {type(e).__name__}: {e}")
        keep = [r.lora_path.removeprefix("skyrl-memory://") for r in (self.adapter, self._previous) if r is not None]
        self.llm.collective_rpc("skyrl_glm_commit", args=(version, keep))
        timings = dict(answers[0].get("timings", {}))
        timings.update({"receive_rpc_s": t1 - t0, "load_s": time.perf_counter() - t1})
        return UpdateResult(True, version, timings=timings)

    def load_adapter_dir(self, path: str, lora_name: str) -> UpdateResult:
        """The disk baseline: vLLM reads a PEFT directory the standard way."""
        t0 = time.perf_counter()
        try:
            self._swap(self._new_request(lora_name, str(path)))
        except Exception as e:  # noqa: BLE001
            return UpdateResult(False, None, f"vLLM could not load {path}: {type(e).__name__}: {e}")
        return UpdateResult(True, None, timings={"load_s": time.perf_counter() - t0})

    # -- scoring -----------------------------------------------------------------------------------
    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Logprob of each token given its prefix (positions 1..n-1), through vLLM's prefill path."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
        outs = self.llm.generate(
            [{"prompt_token_ids": s} for s in sequences], params, lora_request=self.adapter, use_tqdm=False
        )
        return [
            [o.prompt_logprobs[i][s[i]].logprob for i in range(1, len(s))] for o, s in zip(outs, sequences, strict=True)
        ]

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
        """Greedy continuations and the logprobs vLLM reports for its own tokens (the decode path)."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=0, ignore_eos=True)
        outs = self.llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, lora_request=self.adapter, use_tqdm=False
        )
        result = []
        for o in outs:
            c = o.outputs[0]
            result.append((list(c.token_ids), [lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids, strict=True)]))
        return result
