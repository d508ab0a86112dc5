"""The five-step handoff check, independent of which trainer, sampler and publisher are plugged in.

(1) trainer and sampler agree; (2) perturb only the trainer's adapter (B only, B == 0 before);
(3) the stale sampler must now disagree: proof the perturbation is detectable; (4) publish through the real
sync path; (5) agreement returns. Agreement is judged on prefill logprobs of fixed tokens and, with
``decode`` on, on the sampler's own greedy tokens (its decode path) re-scored by the trainer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from skyrl_glm.check.probes import Probes
from skyrl_glm.sync.update import Publisher

if TYPE_CHECKING:
    import torch


class TrainerScorer(Protocol):
    lora_config: dict[str, Any]

    def adapter(self) -> Mapping[str, torch.Tensor]: ...
    def score(self, sequences: list[list[int]]) -> list[list[float]]: ...
    def perturb_lora_b(self, scale: float, seed: int = 0) -> int: ...


class SamplerScorer(Protocol):
    def score(self, sequences: list[list[int]]) -> list[list[float]]: ...
    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]: ...


@dataclass(frozen=True)
class CheckConfig:
    mean_tol: float = 0.05
    max_tol: float = 0.5
    repeat_tol: float = 1e-6
    scale: float = 0.1
    seed: int = 0
    decode: bool = True
    first_version: int = 1  # adapter versions used: first_version, first_version + 1 (must exceed the sampler's)


@dataclass
class Diff:
    """|dlogp| per token between two scorings of the same tokens."""

    per_token: list[float]

    @classmethod
    def between(cls, a: list[list[float]], b: list[list[float]]) -> Diff:
        return cls([abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)])

    @property
    def mean(self) -> float:
        return sum(self.per_token) / max(len(self.per_token), 1)

    @property
    def max(self) -> float:
        return max(self.per_token, default=0.0)


@dataclass
class StepResult:
    step: int
    name: str
    passed: bool
    detail: str
    seconds: float
    prefill: Diff | None = None
    decode: Diff | None = None
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class CheckReport:
    config: CheckConfig
    steps: list[StepResult] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return len(self.steps) == 5 and all(s.passed for s in self.steps)

    @property
    def first_failure(self) -> StepResult | None:
        return next((s for s in self.steps if not s.passed), None)


def _minus(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    """Per-token change between two scorings of the same tokens."""
    return [[x - y for x, y in zip(ra, rb, strict=True)] for ra, rb in zip(a, b, strict=True)]


def _decode_diff(trainer: TrainerScorer, sampler: SamplerScorer, probes: Probes) -> Diff:
    """Sampler's logprobs of its own greedy tokens vs the trainer's logprobs of the same tokens."""
    gens = sampler.generate(probes.prompts, probes.decode_tokens)
    full = [p + toks for p, (toks, _) in zip(probes.prompts, gens, strict=True)]
    trainer_lp = [lp[-len(toks) :] for lp, (toks, _) in zip(trainer.score(full), gens, strict=True)]
    return Diff.between(trainer_lp, [lps for _, lps in gens])


def run_check(
    trainer: TrainerScorer,
    sampler: SamplerScorer,
    publisher: Publisher,
    probes: Probes,
    config: CheckConfig = CheckConfig(),
    on_step: Callable[[StepResult], None] | None = None,
) -> CheckReport:
    report = CheckReport(config)
    cfg = config

    def agree(step: int, name: str, t0: float, trainer_lp: list[list[float]], sampler_lp: list[list[float]]) -> None:
        pre = Diff.between(trainer_lp, sampler_lp)
        dec = _decode_diff(trainer, sampler, probes) if cfg.decode else None
        ok = [(d, label) for d, label in ((pre, "prefill"), (dec, "decode")) if d is not None]
        bad = [
            f"{lbl} mean {d.mean:.4g} max {d.max:.4g}" for d, lbl in ok if d.mean > cfg.mean_tol or d.max > cfg.max_tol
        ]
        detail = "; ".join(bad) if bad else f"within mean<={cfg.mean_tol}, max<={cfg.max_tol}"
        record(StepResult(step, name, not bad, detail, time.perf_counter() - t0, pre, dec))

    def record(result: StepResult) -> None:
        report.steps.append(result)
        if on_step is not None:
            on_step(result)

    # Step 1: the sampler serves the initial (B == 0) adapter and agrees with the trainer.
    t0 = time.perf_counter()
    first = publisher.publish(trainer.adapter(), trainer.lora_config, cfg.first_version)
    if not getattr(first, "ok", False):
        record(StepResult(1, "agree", False, f"initial publish failed: {getattr(first, 'reason', first)}", 0.0))
        return report
    trainer_before = trainer.score(probes.sequences)
    sampler_before = sampler.score(probes.sequences)
    repeat = Diff.between(sampler_before, sampler.score(probes.sequences))
    agree(1, "agree", t0, trainer_before, sampler_before)
    report.steps[-1].extra["repeat_max"] = repeat.max
    if repeat.max > cfg.repeat_tol:
        report.steps[-1].passed = False
        report.steps[-1].detail += f"; sampler repeat differs by {repeat.max:.3g} > {cfg.repeat_tol}"

    # Step 2: perturb only the trainer.
    t0 = time.perf_counter()
    changed = trainer.perturb_lora_b(cfg.scale, cfg.seed)
    trainer_after = trainer.score(probes.sequences)
    moved = Diff.between(trainer_before, trainer_after)
    record(
        StepResult(
            2,
            "perturb trainer",
            changed > 0 and moved.mean > 0,
            f"{changed} lora_B tensors perturbed (scale {cfg.scale}); trainer moved mean {moved.mean:.4g}",
            time.perf_counter() - t0,
            moved,
        )
    )

    # Step 3: the stale sampler must disagree, or the check cannot see a missing handoff.
    t0 = time.perf_counter()
    stale = Diff.between(trainer_after, sampler.score(probes.sequences))
    detectable = stale.mean > cfg.mean_tol
    detail = (
        f"stale sampler disagrees: mean {stale.mean:.4g} > {cfg.mean_tol}"
        if detectable
        else f"perturbation NOT detectable: mean {stale.mean:.4g} <= {cfg.mean_tol} (raise the scale)"
    )
    dec = _decode_diff(trainer, sampler, probes) if cfg.decode else None
    record(StepResult(3, "stale must disagree", detectable, detail, time.perf_counter() - t0, stale, dec))

    # Step 4: publish through the real sync path.
    t0 = time.perf_counter()
    result = publisher.publish(trainer.adapter(), trainer.lora_config, cfg.first_version + 1)
    ok = bool(getattr(result, "ok", False))
    timings = {k: float(v) for k, v in getattr(result, "timings", {}).items()}
    record(
        StepResult(
            4,
            "publish",
            ok,
            f"published version {cfg.first_version + 1}" if ok else f"publish failed: {result.reason}",
            time.perf_counter() - t0,
            extra=timings,
        )
    )

    # Step 5: agreement returns; the sampler's change should match the trainer's.
    t0 = time.perf_counter()
    sampler_after = sampler.score(probes.sequences)
    agree(5, "agree again", t0, trainer_after, sampler_after)
    delta_mismatch = Diff.between(_minus(trainer_after, trainer_before), _minus(sampler_after, sampler_before))
    report.steps[-1].extra["delta_mismatch_mean"] = delta_mismatch.mean
    return report
