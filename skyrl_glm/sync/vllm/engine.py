"""The offline sampler: a ``vllm.LLM`` whose adapter is swapped in memory, plus the engine settings both samplers use.

``apply_update`` runs the worker-side receive on every worker, then loads the staged adapter under a new
LoRA id and only then points new requests at it (atomic swap: a request carries its ``LoRARequest``, so it
runs on one version from start to end). The previous version stays loaded until the next swap. The update
protocol itself is :class:`~skyrl_glm.sync.vllm.versions.LoraVersions`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from skyrl_glm.quiet import ENGINE_LOG_ENV
from skyrl_glm.sync.update import UpdateResult
from skyrl_glm.sync.vllm.control import sender_key, signed
from skyrl_glm.sync.vllm.engine_env import gpu_environment_settings
from skyrl_glm.sync.vllm.versions import LoraVersions, Op, drive

log = logging.getLogger(__name__)

WORKER_EXTENSION = "skyrl_glm.sync.vllm.worker.LoraSyncWorkerExtension"


def engine_environment() -> dict[str, str]:
    """Environment variables vLLM's engine processes read at start that this machine needs (the engine core inherits
    them; vLLM takes no engine argument for them): without flashinfer installed, vLLM's GPU sampler must be told not
    to use it, or every engine dies at its first sampling step (``No module named 'flashinfer'``); on CPU a small KV
    cache (tiny checkpoints need little, and vLLM's CPU default reserves host memory for it)."""
    import importlib.util

    from vllm.platforms import current_platform

    env = {}
    if importlib.util.find_spec("flashinfer") is None:
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    if current_platform.is_cpu():
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    return env


def apply_engine_environment() -> None:
    """What an engine's processes inherit, put in place before one starts: :func:`engine_environment` (a value the
    user set wins) and the run's control key (its file is named in the environment)."""
    for key, value in engine_environment().items():
        os.environ.setdefault(key, value)
    sender_key()


def engine_settings(engine: Mapping[str, Any], *, max_lora_rank: int = 16) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM`` or ``AsyncEngineArgs``: a checkpoint's serving arguments (``model`` and
    what :func:`~skyrl_glm.models.vllm_targets.vllm_engine_kwargs` gives for its family, or any vLLM argument)
    completed with LoRA on, the skyrl-glm worker extension and the sampler's defaults; a key in ``engine`` wins."""
    from vllm.platforms import current_platform

    settings: dict[str, Any] = {
        "enable_lora": True,
        "max_lora_rank": max_lora_rank,
        "max_loras": 2,
        "max_cpu_loras": 3,
        "max_model_len": 256,
        "enforce_eager": True,
        # A prefix-cache hit runs other kernels than a fresh prefill (bf16 MLA on CPU differs by ~4e-3), which
        # would break the check's repeat-score test; the sampler used for checking scores from scratch.
        "enable_prefix_caching": False,
        "worker_extension_cls": WORKER_EXTENSION,
    }
    if current_platform.is_cpu():
        settings["gpu_memory_utilization"] = 0.2  # on CPU it reserves host memory
    else:
        settings.update(gpu_environment_settings())
    return {**settings, **engine}


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


class EngineStartError(RuntimeError):
    """vLLM's engine did not start (its engine process raised during model load or LoRA set-up): the message
    carries that process's own error line and where its full output is."""


@contextlib.contextmanager
def engine_output(path: str | None) -> Iterator[None]:
    """While vLLM starts its engine process, file descriptors 1 and 2 point at ``path`` (appended): the engine and
    worker processes inherit them, so their logs (vLLM logs to stdout) and any traceback go there rather than to the
    terminal, for the engine's whole life. ``None``: left as they are."""
    if not path:
        yield
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError as e:
        log.warning("%s=%s cannot be written (%s): the engine writes to the terminal", ENGINE_LOG_ENV, path, e)
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {target: os.dup(target) for target in (1, 2)}
    try:
        for target in saved:
            os.dup2(fd, target)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for target, old in saved.items():
            os.dup2(old, target)
            os.close(old)
        os.close(fd)


LOG_PREFIX = re.compile(r"^\((?:EngineCore|Worker)[^)]*\)\s+(?:[A-Z]+ [\d-]+ [\d:]+ \[[^\]]*\]\s+)?")
ERROR_LINE = re.compile(r"^(?:\w+\.)*\w*(?:Error|Exception): .+")


def start_failure(error: BaseException, log: str | None, offset: int = 0) -> EngineStartError:
    """The engine's start failure as one message: the first ``SomethingError: ...`` line its processes wrote to
    ``log`` past ``offset`` (where this engine's start began: an earlier engine of the same command wrote before it)
    that is not a wrapper pointing elsewhere (vLLM's own exception says only "see root cause above"), else vLLM's
    exception."""
    lines = []
    if log and Path(log).is_file():
        with open(log, "rb") as f:
            f.seek(offset)
            lines = f.read().decode(errors="replace").splitlines()
    causes = [
        line
        for line in (LOG_PREFIX.sub("", raw) for raw in lines)
        if ERROR_LINE.match(line) and "root cause" not in line
    ]
    cause = causes[0] if causes else f"{type(error).__name__}: {error}"
    return EngineStartError(f"vLLM's engine did not start: {cause}" + (f" (log: {log})" if log else ""))


class VllmEngineSampler(LoraVersions):
    """Owns a ``vllm.LLM`` with LoRA enabled and the skyrl-glm worker extension."""

    def __init__(self, engine: Mapping[str, Any], *, max_lora_rank: int = 16):
        """``engine``: vLLM arguments, ``model`` among them (see :func:`engine_settings`)."""
        from vllm import LLM

        settings = engine_settings(engine, max_lora_rank=max_lora_rank)
        super().__init__(settings)
        apply_engine_environment()
        log = os.environ.get(ENGINE_LOG_ENV)
        offset = os.path.getsize(log) if log and os.path.isfile(log) else 0
        try:
            with engine_output(log):
                self.llm = LLM(**settings)
        except RuntimeError as e:
            raise start_failure(e, log, offset) from e

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
        return self.llm.collective_rpc(method, args=signed(method, args))

    def _add_lora(self, request: Any) -> bool:
        return self.llm.llm_engine.add_lora(request)

    def _remove_lora(self, lora_id: int) -> bool:
        return self.llm.llm_engine.remove_lora(lora_id)

    # -- adapter updates ---------------------------------------------------------------------------
    def apply_update(self, manifest_json: str, handle: dict[str, Any], transport: str) -> UpdateResult:
        return drive(self.update_steps(manifest_json, handle, transport), self._call)

    def load_adapter_dir(self, path: str, lora_name: str) -> UpdateResult:
        """The disk baseline: vLLM reads a PEFT directory the standard way."""
        return drive(self.load_dir_steps(path, lora_name), self._call)

    # -- scoring -----------------------------------------------------------------------------------
    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Logprob of each token given its prefix (positions 1..n-1), through vLLM's prefill path.

        One sequence per engine step: which requests share a step depends on when they reach the engine core
        (it may step before a batch has fully arrived), and batched bf16 kernels round differently by batch size
        (measured on the tiny GLM-5.3 on vLLM CPU: 3.8e-3 between batched and single, 2.9e-3 between two batched
        scorings of the same tokens; 0.0 over 20 single scorings). Alone, a sequence scores the same every time,
        so the check's repeat test compares like with like."""
        params = scoring_params()
        return [
            prompt_logprobs(
                self.llm.generate([{"prompt_token_ids": s}], params, lora_request=self.adapter, use_tqdm=False)[0], s
            )
            for s in sequences
        ]

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]:
        """Greedy continuations and the logprobs vLLM reports for its own tokens (the decode path)."""
        params = greedy_params(max_tokens)
        outs = self.llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, lora_request=self.adapter, use_tqdm=False
        )
        return [completion(o) for o in outs]
