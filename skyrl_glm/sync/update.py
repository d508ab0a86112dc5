"""What a sampler answers to one adapter update, the sampler interface publishers drive, and the publisher
interface the check drives.

Engine independent: the publishers, the check and the vLLM glue all import these, so the sync core never
imports engine code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

# The trainer's adapter: ``{public name: tensor}`` or a stream of ``(public name, tensor)``.
Adapter = Mapping[str, "torch.Tensor"] | Iterable[tuple[str, "torch.Tensor"]]


@dataclass
class UpdateResult:
    """``ok``: the new version serves (``version`` says which); otherwise ``reason`` says why it was refused and
    the previous adapter keeps serving. ``timings`` are stage seconds (``*_s`` keys)."""

    ok: bool
    version: int | None
    reason: str = ""
    timings: dict[str, float] = field(default_factory=dict)


class Sampler(Protocol):
    """A sampler a publisher can update (:class:`~skyrl_glm.sync.vllm.engine.VllmEngineSampler`)."""

    def apply_update(self, manifest_json: str, handle: dict[str, Any], transport: str) -> UpdateResult:
        """Receive, verify and swap in one in-memory update; never raises for a bad update."""
        ...

    def load_adapter_dir(self, path: str, lora_name: str) -> UpdateResult:
        """Load a PEFT adapter directory the engine's standard way (the disk baseline)."""
        ...


class AsyncSampler(Protocol):
    """A sampler updated from an event loop (vLLM's ``AsyncLLM``; SkyRL's servers inside its training loop):
    :meth:`~skyrl_glm.sync.publisher.InMemoryPublisher.publish_async` awaits its update while the transport
    streams."""

    async def apply_update(self, manifest_json: str, handle: dict[str, Any], transport: str) -> UpdateResult:
        """Receive, verify and swap in one in-memory update on every engine behind it; never raises for a bad
        update."""
        ...


class Publisher(Protocol):
    """Hands one adapter version from the trainer to the sampler
    (:class:`~skyrl_glm.sync.publisher.InMemoryPublisher`, :class:`~skyrl_glm.sync.publisher.DiskPublisher`).

    The check calls ``publish`` at its steps 1 and 4 with the trainer's ``adapter()``, its ``lora_config`` and a
    version above the sampler's; the sampler must serve that version afterwards when the answer is ``ok``
    (docs/api.md, "The check's contract")."""

    def publish(self, adapter: Adapter, adapter_config: Mapping[str, Any], version: int) -> UpdateResult: ...


def describe_error(error: BaseException) -> str:
    """One line for a failure report: type and message, and where it was raised when the message is empty (a bare
    ``assert`` inside vLLM's loader says nothing else), then the chain of causes."""
    import traceback

    parts = []
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        frames = traceback.extract_tb(e.__traceback__)
        if not str(e) and frames:
            text += f" at {frames[-1].filename.rsplit('/site-packages/', 1)[-1]}:{frames[-1].lineno}"
        parts.append(text)
        e = e.__cause__ or e.__context__
    return " <- ".join(parts)
