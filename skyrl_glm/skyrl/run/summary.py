"""The record of one training run that skyrl-glm keeps: each sync, the handoff check, the agree checks, SkyRL's
per-step trainer/sampler mismatch and each step's reward and timings. The trainer fills it, the driver prints it
and writes it as JSON; :meth:`RunSummary.step_rows` joins it into one row of figures per step."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# The sync's stages as the worker reports them: memory (skyrl-glm's publisher: the plan's parts, staging, the
# transport's stream, the receiving workers' receive, SkyRL's load request) and disk (SkyRL's file sync, timed
# around its save and its load request).
PLAN_PARTS = ("dedup_s", "fold_s", "pack_s", "checksum_s", "manifest_s")
SYNC_STAGES = ("stage_s", "transfer_s", "receive_s", "load_s", "save_s")
# SkyRL's step timers (``timing/<name>``) kept per step.
STEP_TIMERS = ("step", "generate", "train_critic_and_policy", "sync_weights")
MISMATCH_MEAN = "policy/rollout_train_logprobs_abs_diff_mean"
MISMATCH_MAX = "policy/rollout_train_logprobs_abs_diff_max"
IS_RATIO_MEAN = "policy/loss_metrics/is_ratio_mean"
GEN_KL = "skyrl_glm/gen_kl"  # the k3 generation KL of the step's rollouts (skyrl/run/mismatch_log.py computes it)
# An agree check's figures in a step's row (``agree_<name>``).
AGREE_FIGURES = (
    "prefill_mean",
    "prefill_trimmed_mean",
    "prefill_max",
    "prefill_prob_max",
    "decode_mean",
    "decode_trimmed_mean",
    "decode_max",
    "decode_prob_max",
    "mean_tol",
    "prob_tol",
)


@dataclass(frozen=True)
class SyncRecord:
    """One weight sync: the step it followed (0: before step 1), its wall time, what the policy worker reported
    (version, transport, stage timings) and the first request served on the new version."""

    seconds: float
    worker: dict[str, Any] = field(default_factory=dict)
    step: int = 0
    first_request_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "step": self.step, "first_request_s": self.first_request_s, **self.worker}


@dataclass(frozen=True)
class CheckRecord:
    """The five-step handoff check before step 1."""

    passed: bool
    seconds: float
    report: dict[str, Any]


@dataclass(frozen=True)
class AgreeRecord:
    """An agree check (step 1 alone) after a later sync, with the tolerances it was judged by (mean |dlogp| and
    per-token |dp|: :class:`~skyrl_glm.check.algorithm.CheckConfig`); None where that path was not measured."""

    sync: int
    passed: bool
    prefill_max: float | None
    prefill_mean: float | None
    decode_max: float | None
    decode_mean: float | None
    lora_b_max: float
    step: int = 0
    mean_tol: float | None = None
    prob_tol: float | None = None
    prefill_prob_max: float | None = None
    decode_prob_max: float | None = None
    prefill_trimmed_mean: float | None = None  # the mean the rule bounds (all but the largest 1 in 32 tokens)
    decode_trimmed_mean: float | None = None
    # a failed check's probe tokens per measured path: {"decode": {"dlogp": [...], "dp": [...]}}, so a stop can be
    # told apart from noise on the record alone (one far-off unlikely token, or many tokens moved)
    failed_tokens: dict[str, dict[str, list[float]]] | None = None


@dataclass(frozen=True)
class StepRecord:
    """One training step as SkyRL logged it: mean reward and its step timers (seconds)."""

    step: int
    reward: float | None
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class RunSummary:
    sync_mode: str
    expert_layout: str  # how vLLM took the routed experts' LoRA (engine argument, fixed at engine start)
    syncs: list[SyncRecord] = field(default_factory=list)
    check: CheckRecord | None = None
    agree: list[AgreeRecord] = field(default_factory=list)
    mismatch: list[dict[str, Any]] = field(default_factory=list)  # per step: SkyRL's metric name -> value
    steps: list[StepRecord] = field(default_factory=list)
    run: dict[str, Any] = field(default_factory=dict)  # what the run was asked for: fault, check on or off, targets

    def mean_sync_seconds(self) -> float:
        return sum(s.seconds for s in self.syncs) / max(len(self.syncs), 1)

    def step_rows(self) -> list[dict[str, Any]]:
        """One row per step: reward, step and generate times, the sync after the step with its stages and first
        request, the agree check's margins against its tolerances, the trainer/sampler mismatch."""
        syncs = {s.step: s for s in self.syncs}
        agree = {a.step: a for a in self.agree}
        mismatch = {m.get("step"): m for m in self.mismatch}
        rows = []
        for s in self.steps:
            row: dict[str, Any] = {"step": s.step, "reward": s.reward}
            row.update({f"{name}_s": s.timings.get(name) for name in STEP_TIMERS})
            sync = syncs.get(s.step)
            row["sync_s"] = None if sync is None else sync.seconds
            parts = [sync.worker[p] for p in PLAN_PARTS if sync is not None and p in sync.worker]
            row["plan_s"] = sum(parts) if parts else None
            row.update({stage: None if sync is None else sync.worker.get(stage) for stage in SYNC_STAGES})
            row["first_request_s"] = None if sync is None else sync.first_request_s
            a = agree.get(s.step)
            for key in AGREE_FIGURES:
                row[f"agree_{key}"] = None if a is None else getattr(a, key)
            row["agree_passed"] = None if a is None else a.passed
            m = mismatch.get(s.step, {})
            row.update({"mismatch_mean": m.get(MISMATCH_MEAN), "mismatch_max": m.get(MISMATCH_MAX)})
            row["gen_kl"] = m.get(GEN_KL)
            row["is_ratio_mean"] = m.get(IS_RATIO_MEAN)
            rows.append(row)
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "sync_mode": self.sync_mode,
            "expert_layout": self.expert_layout,
            "run": self.run,
            "syncs": [s.to_json() for s in self.syncs],
            "check": None if self.check is None else asdict(self.check),
            "agree": [asdict(a) for a in self.agree],
            "mismatch": self.mismatch,
            "steps": self.step_rows(),
        }
