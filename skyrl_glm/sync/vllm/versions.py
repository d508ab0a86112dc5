"""Adapter-version bookkeeping shared by both vLLM samplers, written as engine operations.

:class:`LoraVersions` knows which LoRA ids serve and describes each update as a sequence of engine operations
(``rpc``, ``add_lora``, ``remove_lora``). :func:`drive` runs such a sequence on a
blocking engine (the offline ``vllm.LLM`` in :mod:`skyrl_glm.sync.vllm.engine`),
:func:`~skyrl_glm.sync.vllm.async_engine.drive_async` on ``AsyncLLM``, so both samplers share one update protocol.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Generator, Mapping
from typing import Any

from skyrl.backends.skyrl_train.weight_sync.lora_target import in_memory_lora_path, lora_name_from_in_memory_path

from skyrl_glm.sync.expert_layout import layout_of, request_fields
from skyrl_glm.sync.update import UpdateResult, describe_error

# One engine operation: ("rpc", method, args) | ("add_lora", request) | ("remove_lora", lora_id).
# An engine runs it through its method ``_<op[0]>(*op[1:])``; an exception
# the operation raises is thrown back into the steps at the ``yield``.
Op = tuple[Any, ...]
Steps = Generator[Op, Any, Any]


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

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        """``settings``: the engine's arguments; its expert layout decides the ``LoRARequest`` fields every adapter
        loads with (:func:`~skyrl_glm.sync.expert_layout.request_fields`)."""
        self.request_fields = request_fields(layout_of(settings or {}))
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
        return LoRARequest(lora_name=lora_name, lora_int_id=lora_id, lora_path=path, **self.request_fields)

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
            return describe_error(e)
        stale, self._previous, self.adapter = self._previous, self.adapter, request
        if stale is not None:
            if self._in_flight[stale.lora_int_id] > 0:
                self._retired[stale.lora_int_id] = stale
            else:
                yield ("remove_lora", stale.lora_int_id)
        # No prefix-cache reset: vLLM keys a cached block by the adapter's name and path, which carry the version,
        # so no other version ever hits a stale block, and vLLM evicts it like any unused one. A reset walks every
        # KV block in Python (vLLM's BlockPool.reset_prefix_cache), a cost that grows with the cache, not the update.
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
