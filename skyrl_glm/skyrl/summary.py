"""The record of one training run that skyrl-glm keeps: each sync, the handoff check, the agree checks and SkyRL's
per-step trainer/sampler mismatch. The trainer fills it, the driver prints it and writes it as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class SyncRecord:
    """One weight sync: its wall time and what the policy worker reported (version, transport, timings)."""

    seconds: float
    worker: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"seconds": self.seconds, **self.worker}


@dataclass(frozen=True)
class CheckRecord:
    """The five-step handoff check before step 1."""

    passed: bool
    seconds: float
    report: dict[str, Any]


@dataclass(frozen=True)
class AgreeRecord:
    """An agree check (step 1 alone) after a later sync; None where that path was not measured."""

    sync: int
    passed: bool
    prefill_max: float | None
    prefill_mean: float | None
    decode_max: float | None
    decode_mean: float | None
    lora_b_max: float


@dataclass
class RunSummary:
    sync_mode: str
    expert_layout: str  # how vLLM took the routed experts' LoRA (engine argument, fixed at engine start)
    syncs: list[SyncRecord] = field(default_factory=list)
    check: CheckRecord | None = None
    agree: list[AgreeRecord] = field(default_factory=list)
    mismatch: list[dict[str, Any]] = field(default_factory=list)  # per step: SkyRL's metric name -> value

    def mean_sync_seconds(self) -> float:
        return sum(s.seconds for s in self.syncs) / max(len(self.syncs), 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "sync_mode": self.sync_mode,
            "expert_layout": self.expert_layout,
            "syncs": [s.to_json() for s in self.syncs],
            "check": None if self.check is None else asdict(self.check),
            "agree": [asdict(a) for a in self.agree],
            "mismatch": self.mismatch,
        }
