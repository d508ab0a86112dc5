"""The five-step handoff check, independent of which trainer, sampler and publisher are plugged in.

(1) trainer and sampler agree; (2) perturb only the trainer's adapter (B only, B == 0 before);
(3) the stale sampler must now disagree: proof the perturbation is detectable; (4) publish through the real
sync path; (5) agreement returns. Agreement is judged on prefill logprobs of fixed tokens and, with
``decode`` on, on the sampler's own greedy tokens (its decode path) re-scored by the trainer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from skyrl_glm.check.probes import Probes, check_probe_ids
from skyrl_glm.sync.update import Publisher
from skyrl_glm.usage import UsageError, tolerance

if TYPE_CHECKING:
    import torch


class TrainerScorer(Protocol):
    """The trainer side of the check: what :func:`run_check` calls on it, in order.

    - ``lora_config``: the adapter's PEFT config as a dict (``r``, ``lora_alpha``, ``target_modules``, ...), handed
      to the publisher with the tensors.
    - ``score(sequences)``: for each token-id sequence, the logprob of every token after the first under the
      current policy (base + adapter), as floats: ``len(seq) - 1`` values per sequence. Steps 1, 3 and 5, and
      the decode path (the sampler's greedy tokens re-scored).
    - ``adapter()``: the adapter's tensors ``{PEFT name: tensor}`` as they stand now (step 1 publishes version
      ``first_version`` of it, step 4 the perturbed one).
    - ``perturb_lora_b(scale, seed)``: add seeded noise to every lora_B (one scale for all, or a scale per target
      group; groups left out stay) and return how many tensors changed; every lora_B is zero before step 2.
    - optional ``lora_groups()`` and ``reset_lora_b()``: the target groups (attention, dense MLP, shared expert,
      routed experts) and putting lora_B back to zero; with both, step 2 scales each group from its measured
      effects, alone and left out (:attr:`CheckConfig.group_margin`).
    - optional ``vocab_size``: the number of token ids the model scores; declared, the check refuses probes with
      an id at or past it before anything is scored (:func:`~skyrl_glm.check.probes.check_probe_ids`).
    """

    lora_config: dict[str, Any]

    def adapter(self) -> Mapping[str, torch.Tensor]: ...
    def score(self, sequences: list[list[int]]) -> list[list[float]]: ...
    def perturb_lora_b(self, scale: float | Mapping[str, float], seed: int = 0) -> int: ...


class SamplerScorer(Protocol):
    """The sampler side of the check (the serving engine, as the publisher updates it).

    - ``score(sequences)``: as :meth:`TrainerScorer.score`, through the engine's prefill path (prompt logprobs)
      with the adapter it serves now; steps 1, 2 (the same sequences twice: the engine's own repeatability),
      3 and 5.
    - ``generate(prompts, max_tokens)``: greedy continuations, ``(token ids, their logprobs)`` per prompt, through
      the decode path (with ``CheckConfig.decode``).
    - the publisher's side too: the check never updates the sampler itself; the publisher does
      (:class:`~skyrl_glm.sync.update.Sampler`: ``apply_update`` in memory, ``load_adapter_dir`` for the disk
      baseline).
    - optional ``vocab_size``: as the trainer's.
    - optional ``close()``: stops the engine; :func:`run_check` never calls it, its caller does when done.
    """

    def score(self, sequences: list[list[int]]) -> list[list[float]]: ...
    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[tuple[list[int], list[float]]]: ...


def check_vocabulary(probes: Probes, *sides: tuple[str, Any]) -> None:
    """Every probe id within each ``(name, side)``'s declared ``vocab_size`` (a side that declares none is not
    checked): :class:`~skyrl_glm.check.probes.ProbeVocabularyError` before anything is scored."""
    for name, side in sides:
        declared = getattr(side, "vocab_size", None)
        check_probe_ids(probes, declared if isinstance(declared, int) else None, name)


# |dlogp| bounds and the step-2 perturbation, at most: per-token logprob gaps between unrelated policies are a few
# nats, so a bound above this lets any pair of samplers agree (a check that cannot fail), and a perturbation this
# large already saturates every softmax.
MAX_TOLERANCE = 10.0
MAX_SCALE = 10.0
MAX_PROB_TOL = 1.0  # no token's probability can move by more: at 1 the per-token bound is off, the mean alone judges
# The agree rule bounds the mean over all probe tokens but one in this many (the largest): measured on one H200,
# healthy checks of tiny GLM-4.5 (routed experts, B = 0) had single tokens 0.32-0.40 nats off among neighbours under
# 0.04, and a healthy file-sync canary stopped on one decode token 2.84 nats off (docs/check.md).
OUTLIER_SHARE = 32
# Rounds of each calibration: trainer scorings per target group to find its scale alone, then rounds of one
# leave-one-out scoring per group plus one of all groups (tiny models: milliseconds each).
CALIBRATION_ROUNDS = 4
BALANCE_STEP = 2.0  # the most one leave-one-out round moves a group's scale, up or down


@dataclass(frozen=True)
class CheckConfig:
    """The check's tolerances, perturbation, seed and decode path: the one record the CLI, the library and a SkyRL
    run's ``skyrl_glm.check`` section read.

    An agree step (1 and 5, and the agree checks after every sync of a SkyRL run) passes when, on each measured path,
    every logprob is finite, the mean |dlogp| over the probe tokens (all but the largest one in
    :data:`OUTLIER_SHARE`: :attr:`Diff.trimmed_mean`) is at most ``mean_tol`` and no probe token's
    probability moved by more than ``prob_tol`` (``|exp(lp_trainer) - exp(lp_sampler)|``). The mean carries the
    power of the steps that must disagree (``group_margin`` is counted in it); the per-token bound is in probability,
    not log-probability, because a bf16 sampler's logprob error grows as a token's probability falls (its logit is
    rounded relative to its size, and a sharpening policy pushes the random probe tokens far down), while the
    probability such a token can move stays below its own, tiny, probability (docs/check.md)."""

    mean_tol: float = 0.05
    prob_tol: float = 0.1
    repeat_tol: float = 1e-6
    scale: float = 0.1
    seed: int = 0
    decode: bool = True
    first_version: int = 1  # adapter versions used: first_version, first_version + 1 (must exceed the sampler's)
    group_margin: float = 2.0
    """Leaving out any one target group of the trainer's perturbation must move the trainer by more than
    ``group_margin * mean_tol`` (a sampler that drops one group then fails step 5): step 2 scales each group's
    perturbation from its measured effects (aiming at 1.5 times that), step 3 checks it. 0: one ``scale`` for every
    lora_B."""

    def __post_init__(self) -> None:
        """Bounds are finite and in ``0..MAX_TOLERANCE``: every comparison with a NaN bound is false, so it would pass
        anything, and so would a huge one. The perturbation is ``> 0`` (step 3 needs one the stale sampler misses)."""
        for name in ("mean_tol", "repeat_tol", "group_margin"):
            tolerance(name, getattr(self, name), MAX_TOLERANCE)
        tolerance("prob_tol", self.prob_tol, MAX_PROB_TOL)
        if not (math.isfinite(self.scale) and 0 < self.scale <= MAX_SCALE):
            raise UsageError(f"scale must be a number > 0 and <= {MAX_SCALE:g}, got {self.scale}")

    @property
    def group_bound(self) -> float:
        """What leaving out one target group must move the trainer by (mean |dlogp|)."""
        return self.group_margin * self.mean_tol


def _prob_gap(x: float, y: float) -> float:
    """|exp(x) - exp(y)| for two logprobs; NaN where either is not finite (so the step fails, as for |dlogp|)."""
    if not (math.isfinite(x) and math.isfinite(y)):
        return math.nan
    return abs(math.exp(min(x, 0.0)) - math.exp(min(y, 0.0)))


@dataclass
class Diff:
    """|dlogp| per token between two scorings of the same tokens, and how far each token's probability moved
    (``prob_per_token``). ``own_prefill``, on a decode diff: the sampler's decode logprobs against its own prefill of
    the same tokens (where the decode path disagrees and this does not, the trainer is off on those tokens; where
    this is large too, the sampler's decode path is)."""

    per_token: list[float]
    prob_per_token: list[float] = field(default_factory=list)
    own_prefill: Diff | None = None

    @classmethod
    def between(cls, a: list[list[float]], b: list[list[float]]) -> Diff:
        pairs = [(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
        return cls([abs(x - y) for x, y in pairs], [_prob_gap(x, y) for x, y in pairs])

    @property
    def mean(self) -> float:
        return sum(self.per_token) / max(len(self.per_token), 1)

    @property
    def trimmed_mean(self) -> float:
        """The mean without its largest ``len // OUTLIER_SHARE`` tokens: the figure the agree rule bounds. One token
        in that many may sit far off in log space (its probability is still bounded by ``prob_tol``): a token whose
        routed experts differ between the bf16 sampler and the fp32 trainer is nats off while its neighbours agree."""
        kept = sorted(self.per_token)[: len(self.per_token) - len(self.per_token) // OUTLIER_SHARE]
        return sum(kept) / max(len(kept), 1)

    @property
    def max(self) -> float:
        # Python's max() skips a NaN that is not first; a NaN anywhere makes the max NaN.
        return math.nan if self.nonfinite else max(self.per_token, default=0.0)

    @property
    def prob_max(self) -> float:
        """The most any one token's probability moved (NaN where a logprob was not finite)."""
        return math.nan if self.nonfinite else max(self.prob_per_token, default=0.0)

    @property
    def nonfinite(self) -> int:
        """Tokens where either side's logprob was NaN or infinite: such a score fails its step."""
        return sum(1 for x in self.per_token if not math.isfinite(x))

    def within(self, mean_tol: float, prob_tol: float) -> bool:
        """The agree rule (:class:`CheckConfig`), written so that a NaN fails it: ``nan <= tol`` is false."""
        return self.nonfinite == 0 and self.trimmed_mean <= mean_tol and self.prob_max <= prob_tol

    def describe(self, label: str) -> str:
        if self.nonfinite:
            return f"{label}: {self.nonfinite} of {len(self.per_token)} tokens have a non-finite logprob"
        own = self.own_prefill
        mine = f" (the sampler's decode vs its own prefill: mean {own.mean:.4g} max {own.max:.4g})" if own else ""
        trimmed = (
            f" (without its {n} largest: {self.trimmed_mean:.4g})"
            if (n := len(self.per_token) // OUTLIER_SHARE)
            else ""
        )
        return f"{label} mean {self.mean:.4g}{trimmed} max {self.max:.4g} max|dp| {self.prob_max:.4g}{mine}"


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


def decode_diff(trainer: TrainerScorer, sampler: SamplerScorer, probes: Probes) -> Diff:
    """Sampler's logprobs of its own greedy tokens vs the trainer's logprobs of the same tokens; the sampler's
    prefill of those sequences too (:attr:`Diff.own_prefill`: which side a decode mismatch is on)."""
    gens = sampler.generate(probes.prompts, probes.decode_tokens)
    full = [p + toks for p, (toks, _) in zip(probes.prompts, gens, strict=True)]
    decoded = [lps for _, lps in gens]

    def tails(scores: list[list[float]]) -> list[list[float]]:
        return [lp[-len(toks) :] for lp, (toks, _) in zip(scores, gens, strict=True)]

    diff = Diff.between(tails(trainer.score(full)), decoded)
    diff.own_prefill = Diff.between(tails(sampler.score(full)), decoded)
    return diff


def judge_agreement(
    step: int, name: str, prefill: Diff, decode: Diff | None, config: CheckConfig, seconds: float
) -> StepResult:
    """An agree step's verdict: every measured path within the mean |dlogp| and per-token |dp| tolerances."""
    measured = [(d, label) for d, label in ((prefill, "prefill"), (decode, "decode")) if d is not None]
    bad = [d.describe(lbl) for d, lbl in measured if not d.within(config.mean_tol, config.prob_tol)]
    detail = "; ".join(bad) if bad else f"within mean<={config.mean_tol}, max|dp|<={config.prob_tol}"
    return StepResult(step, name, not bad, detail, seconds, prefill, decode)


@dataclass
class _FiveSteps:
    """One run of the check: the parts under check, what a step measured for later ones, the report so far."""

    trainer: TrainerScorer
    sampler: SamplerScorer
    publisher: Publisher
    probes: Probes
    cfg: CheckConfig
    on_step: Callable[[StepResult], None] | None
    report: CheckReport = field(init=False)
    trainer_before: list[list[float]] = field(default_factory=list)
    sampler_before: list[list[float]] = field(default_factory=list)
    trainer_after: list[list[float]] = field(default_factory=list)
    left_out: dict[str, float] = field(default_factory=dict)  # each group's leave-one-out effect, for step 3
    calibration_scorings: int = 0

    def __post_init__(self) -> None:
        self.report = CheckReport(self.cfg)

    def record(self, result: StepResult) -> None:
        self.report.steps.append(result)
        if self.on_step is not None:
            self.on_step(result)

    def agreement(
        self, step: int, name: str, t0: float, trainer_lp: list[list[float]], sampler_lp: list[list[float]]
    ) -> StepResult:
        pre = Diff.between(trainer_lp, sampler_lp)
        dec = decode_diff(self.trainer, self.sampler, self.probes) if self.cfg.decode else None
        return judge_agreement(step, name, pre, dec, self.cfg, time.perf_counter() - t0)

    def agree(self) -> bool:
        """Step 1: the sampler serves the initial (B == 0) adapter, agrees with the trainer and repeats itself.
        False when the initial publish failed: nothing after it could be judged."""
        t0 = time.perf_counter()
        first = self.publisher.publish(self.trainer.adapter(), self.trainer.lora_config, self.cfg.first_version)
        if not getattr(first, "ok", False):
            reason = getattr(first, "reason", first)
            self.record(StepResult(1, "agree", False, f"initial publish failed: {reason}", 0.0))
            return False
        self.trainer_before = self.trainer.score(self.probes.sequences)
        self.sampler_before = self.sampler.score(self.probes.sequences)
        repeat = Diff.between(self.sampler_before, self.sampler.score(self.probes.sequences))
        result = self.agreement(1, "agree", t0, self.trainer_before, self.sampler_before)
        result.extra["repeat_max"] = repeat.max
        if not repeat.max <= self.cfg.repeat_tol:
            result.passed = False
            result.detail += f"; sampler repeat differs by {repeat.max:.3g} > {self.cfg.repeat_tol}"
        self.record(result)
        return True

    def scored(self, scales: Mapping[str, float]) -> list[list[float]]:
        """The trainer's scores with only these groups perturbed, at these scales (none: its step-1 scores); its B
        is zero again afterwards."""
        if not scales:
            return self.trainer_before
        self.trainer.perturb_lora_b(dict(scales), self.cfg.seed)
        self.calibration_scorings += 1
        try:
            return self.trainer.score(self.probes.sequences)
        finally:
            self.trainer.reset_lora_b()  # type: ignore[attr-defined]  # groups come with reset (see TrainerScorer)

    def effect_alone(self, group: str, scale: float) -> float:
        """How far the stale sampler is from the trainer with only ``group`` perturbed (the sampler still serves
        the initial adapter, so its step-1 scores stand for it)."""
        return Diff.between(self.scored({group: scale}), self.sampler_before).mean

    def effects_left_out(self, scales: Mapping[str, float]) -> dict[str, float]:
        """Each group's leave-one-out effect: how far the trainer with every group perturbed is from the trainer
        with every group but that one perturbed, what a sampler that drops that group shows at step 5 (less the
        sampler's own rounding). One trainer scoring of all groups, then one per group."""
        everything = self.scored(scales)
        return {
            group: Diff.between(everything, self.scored({g: s for g, s in scales.items() if g != group})).mean
            for group in scales
        }

    def group_scales(self) -> dict[str, float]:
        """A scale per target group: first each from the group's effect alone, then balanced until leaving out any
        one group moves the trainer past the group bound (:meth:`balance_left_out`)."""
        return self.balance_left_out(self.alone_scales())

    def alone_scales(self) -> dict[str, float]:
        """A scale per target group from the group's effect alone: effects grow about linearly with the scale, so
        each round rescales towards 1.5 times the group bound (past it, and no larger than needed: a larger
        perturbation widens the bf16 sampler's gap in step 5)."""
        target = 1.5 * self.cfg.group_bound
        scales = {}
        for group in self.trainer.lora_groups():  # type: ignore[attr-defined]
            scale = self.cfg.scale
            for attempt in range(CALIBRATION_ROUNDS):
                effect = self.effect_alone(group, scale)
                if effect == 0 or not math.isfinite(effect) or self.cfg.group_bound < effect <= 2 * target:
                    break
                if attempt < CALIBRATION_ROUNDS - 1:
                    scale *= target / effect
            scales[group] = scale
        return scales

    def balance_left_out(self, scales: dict[str, float]) -> dict[str, float]:
        """``scales`` moved until every group's leave-one-out effect is past the group bound, for at most
        ``CALIBRATION_ROUNDS`` rounds; the last effects measured are kept for step 3.

        A sampler that drops a group shows that group's leave-one-out effect, not its effect alone, and effects do
        not add up: on tiny GLM-5.3 (default targets) each group alone moves the trainer by 0.15-0.19, all four
        together by about as much, and leaving out the routed experts by as little as 0.03 (such checks passed
        with the routed experts dropped). They compete, too: raising one group's scale lowers the others'
        leave-one-out effects, while its own grows faster than linearly (raised by the linear estimate, the routed
        experts took the shared expert's from 0.16 to 0.004). So each round that finds a group at or under the
        bound moves every group's scale by the square root of 1.5 times the bound over its leave-one-out effect,
        at most ``BALANCE_STEP`` either way (and ``MAX_SCALE`` at most): the weak ones grow, the others shrink a
        little, and the perturbation stays no larger than it needs to be."""
        target = 1.5 * self.cfg.group_bound
        for attempt in range(CALIBRATION_ROUNDS):
            self.left_out = self.effects_left_out(scales)
            if all(e > self.cfg.group_bound for e in self.left_out.values()) or attempt == CALIBRATION_ROUNDS - 1:
                break
            for group, effect in self.left_out.items():
                if effect > 0 and math.isfinite(effect):
                    step = min(max(math.sqrt(target / effect), 1 / BALANCE_STEP), BALANCE_STEP)
                    scales[group] = min(scales[group] * step, MAX_SCALE)
        return scales

    def perturb(self) -> None:
        """Step 2: perturb only the trainer (a scale per target group when the trainer names its groups)."""
        t0 = time.perf_counter()
        per_group = self.cfg.group_margin > 0 and hasattr(self.trainer, "lora_groups")
        scales: float | dict[str, float] = self.group_scales() if per_group else self.cfg.scale
        changed = self.trainer.perturb_lora_b(scales, self.cfg.seed)
        self.trainer_after = self.trainer.score(self.probes.sequences)
        moved = Diff.between(self.trainer_before, self.trainer_after)
        passed = changed > 0 and moved.nonfinite == 0 and moved.mean > 0
        shown = ", ".join(f"{g} {s:.3g}" for g, s in scales.items()) if isinstance(scales, dict) else f"{scales}"
        detail = f"{changed} lora_B tensors perturbed (scale {shown}); {moved.describe('trainer moved')}"
        extra = {f"scale[{g}]": s for g, s in scales.items()} if isinstance(scales, dict) else {}
        if per_group:
            extra["calibration_scorings"] = self.calibration_scorings
        self.record(StepResult(2, "perturb trainer", passed, detail, time.perf_counter() - t0, moved, extra=extra))

    def stale(self) -> None:
        """Step 3: the stale sampler must disagree, or the check cannot see a missing handoff."""
        t0 = time.perf_counter()
        stale = Diff.between(self.trainer_after, self.sampler.score(self.probes.sequences))
        bound = self.cfg.group_bound
        weak = {g: e for g, e in self.left_out.items() if not e > bound}
        detectable = stale.nonfinite == 0 and stale.mean > self.cfg.mean_tol and not weak
        if stale.nonfinite:
            detail = stale.describe("stale sampler")
        elif weak:
            shown = ", ".join(f"{g} {e:.4g}" for g, e in weak.items())
            detail = (
                f"a dropped group would NOT be detectable: left out, {shown} <= {bound:.4g} "
                "(no balance of the groups' scales got past it)"
            )
        elif detectable:
            detail = f"stale sampler disagrees: mean {stale.mean:.4g} > {self.cfg.mean_tol}"
            if self.left_out:
                shown = ", ".join(f"{g} {e:.3g}" for g, e in self.left_out.items())
                detail += f"; each group left out > {bound:.3g} ({shown})"
        else:
            detail = f"perturbation NOT detectable: mean {stale.mean:.4g} <= {self.cfg.mean_tol} (raise the scale)"
        dec = decode_diff(self.trainer, self.sampler, self.probes) if self.cfg.decode else None
        extra = {f"without[{g}]": e for g, e in self.left_out.items()}
        self.record(
            StepResult(3, "stale must disagree", detectable, detail, time.perf_counter() - t0, stale, dec, extra)
        )

    def publish(self) -> None:
        """Step 4: publish through the real sync path."""
        t0 = time.perf_counter()
        version = self.cfg.first_version + 1
        result = self.publisher.publish(self.trainer.adapter(), self.trainer.lora_config, version)
        ok = bool(getattr(result, "ok", False))
        timings = {k: float(v) for k, v in getattr(result, "timings", {}).items()}
        detail = f"published version {version}" if ok else f"publish failed: {result.reason}"
        self.record(StepResult(4, "publish", ok, detail, time.perf_counter() - t0, extra=timings))

    def agree_again(self) -> None:
        """Step 5: agreement returns; the sampler's change should match the trainer's."""
        t0 = time.perf_counter()
        sampler_after = self.sampler.score(self.probes.sequences)
        result = self.agreement(5, "agree again", t0, self.trainer_after, sampler_after)
        trainer_delta = _minus(self.trainer_after, self.trainer_before)
        sampler_delta = _minus(sampler_after, self.sampler_before)
        result.extra["delta_mismatch_mean"] = Diff.between(trainer_delta, sampler_delta).mean
        self.record(result)


def run_check(
    trainer: TrainerScorer,
    sampler: SamplerScorer,
    publisher: Publisher,
    probes: Probes,
    config: CheckConfig = CheckConfig(),
    on_step: Callable[[StepResult], None] | None = None,
) -> CheckReport:
    """The five steps in order (see the module doc); ``on_step`` sees each step's result once it is final.
    Probes a side cannot score raise :class:`~skyrl_glm.check.probes.ProbeVocabularyError` before step 1."""
    check_vocabulary(probes, ("trainer", trainer), ("sampler", sampler))
    run = _FiveSteps(trainer, sampler, publisher, probes, config, on_step)
    if run.agree():
        run.perturb()
        run.stale()
        run.publish()
        run.agree_again()
    return run.report
