"""The ``skyrl_glm`` section of a SkyRL training config: what skyrl-glm adds, as typed dataclasses.

The typed config of a run is SkyRL's ``SkyRLTrainConfig`` (built with SkyRL's ``make_config``, so its strict key
checks stay) plus a top-level ``skyrl_glm`` section (:class:`GlmSection`: ``sync``, ``check``, ``overlong``,
``hardware``, ``cpu``). Each section checks its own values as it is built; a component takes the section it
needs (torchtitan's habit), and :class:`GlmTrainConfig` names the whole config where a check crosses sections.
Recipes are read by :mod:`skyrl_glm.skyrl.config.recipes`, and checked as a whole by
:mod:`skyrl_glm.skyrl.config.validation`.

No ``from __future__ import annotations`` here: SkyRL's ``build_nested_dataclass`` reads ``field.type`` to find
nested dataclasses, which must therefore be real classes, not strings.
"""

import dataclasses
import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from skyrl.train.config import (
    AlgorithmConfig,
    DataConfig,
    GeneratorConfig,
    PlacementConfig,
    SkyRLTrainConfig,
    TrainerConfig,
    make_config,
)

from skyrl_glm.check.algorithm import CheckConfig
from skyrl_glm.check.faults import NO_FAULT, SKYRL_FAULTS
from skyrl_glm.check.probes import DECODE_TOKENS, NUM_PROBES, PROBE_LENGTH, PROMPT_LENGTH
from skyrl_glm.plugins import registry
from skyrl_glm.skyrl.config.hardware import HardwareConfig
from skyrl_glm.skyrl.config.overlong import OverlongPenaltyConfig
from skyrl_glm.skyrl.workers.routes import AUTO, ROUTE_FAULTS, local_transport
from skyrl_glm.sync.expert_layout import LAYOUTS, PER_EXPERT, LayoutError, check_layout
from skyrl_glm.sync.plan import DEFAULT_BUCKET_BYTES
from skyrl_glm.usage import UsageError

AUTO_TRANSPORT = AUTO
MAX_BUCKET_MB = 1 << 16  # 64 GiB: far above any adapter's unique bytes (full GLM-5.3 r32: 0.62 GB)
# The check's probes run through the trainer and the sampler before step 1: bounded so that a typo cannot turn
# the seconds-long check into a long run of its own.
MAX_PROBES = 256
MAX_PROBE_LENGTH = 8192
MAX_DECODE_TOKENS = 1024


# The check's settings a run states, in its recipe as on ``skyrl-glm check``'s command line: every field of the
# check's record except the adapter version it starts at, which each run sets from its own syncs.
CHECK_SETTINGS = tuple(f.name for f in dataclasses.fields(CheckConfig) if f.name != "first_version")


class ConfigError(UsageError):
    """A recipe or an override is unusable; the message is one line naming the file and the key."""


def _choice(key: str, value: Any, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}: must be one of {'|'.join(map(str, allowed))}, got {value!r}")


def _bounded(key: str, value: float, low: float, high: float | None) -> None:
    """``low <= value <= high`` (``high`` None: no upper bound), and finite."""
    if not math.isfinite(value) or value < low or (high is not None and value > high):
        where = f">= {low}" if high is None else f"in {low}..{high}"
        raise ConfigError(f"{key}: must be {where}, got {value}")


def _literal_values(cls: type, name: str) -> tuple[Any, ...]:
    return typing.get_args(typing.get_type_hints(cls)[name])


@dataclass
class SyncSection:
    """How the trainer's LoRA reaches vLLM inside SkyRL's loop."""

    mode: Literal["memory", "disk"] = "memory"
    """``memory``: skyrl-glm's plan -> transport -> receiver, no file written; ``disk``: SkyRL's own PEFT-file sync."""
    transport: str = AUTO_TRANSPORT
    """A registered transport (built-in: ``cpu``, ``ipc``, ``nccl``; plugins add theirs) for every engine, or
    ``auto``, chosen per engine from where it runs: on the trainer's sending node ``ipc`` when colocated on GPUs,
    else ``cpu`` (shared memory); on another node ``nccl`` (gloo on CPU)."""
    verify: bool = True
    """Receiver checks checksums and finiteness of every tensor (structure is always checked)."""
    bucket_mb: int = DEFAULT_BUCKET_BYTES >> 20
    """Packed bucket size on the transport, MiB."""
    fault: str = NO_FAULT
    """Deliberately break the sync (for tests of the check), one of the fault table's ``in_skyrl`` entries
    (``no-publish``, ``double-scale``, ``wrong-target``, ``drop-experts``, ``drop-shared-experts``): from the start,
    every sync after the first is broken (the check before step 1 must stop the run); or one of the routing faults
    (``remote-same-host``, ``skip-remote``: :data:`skyrl_glm.skyrl.workers.routes.ROUTE_FAULTS`)."""
    fault_at_step: int = 0
    """Start ``fault`` at training step k instead (0: from the start): the syncs after step k, k+1, ... are
    broken, the earlier ones intact, so the agree check after the sync that follows step k must stop the run."""
    expert_layout: str = PER_EXPERT
    """How vLLM takes the routed experts' LoRA, fixed when its engines start (:mod:`skyrl_glm.sync.expert_layout`):
    ``per-expert`` (every expert name; any adapter), ``shared-outer`` (vLLM's ``enable_moe_shared_loras``: one
    gate/up lora_A and one down lora_B per layer, for Megatron with ``share_expert_adapters``), ``shared-all``
    (every factor once per layer, the same adapters; at GLM-5.3's shapes 0.4 % of the per-expert slot bytes),
    ``grouped:G`` (every factor once per group of E/G consecutive experts: Megatron's ``share_expert_adapters``
    under expert parallelism trains one adapter per EP rank, so G = EP or a multiple of it)."""

    def __post_init__(self) -> None:
        _choice("skyrl_glm.sync.mode", self.mode, _literal_values(SyncSection, "mode"))
        try:
            check_layout(self.expert_layout)
        except LayoutError:
            raise ConfigError(
                f"skyrl_glm.sync.expert_layout: must be one of {'|'.join(LAYOUTS)}, got {self.expert_layout!r}"
            ) from None
        _choice("skyrl_glm.sync.fault", self.fault, [*SKYRL_FAULTS, *ROUTE_FAULTS])
        _bounded("skyrl_glm.sync.fault_at_step", self.fault_at_step, 0, None)
        if self.fault_at_step and self.fault == NO_FAULT:
            raise ConfigError("skyrl_glm.sync.fault_at_step: set skyrl_glm.sync.fault too (which fault starts then)")
        _choice("skyrl_glm.sync.transport", self.transport, [AUTO_TRANSPORT, *sorted(registry().transports)])
        _bounded("skyrl_glm.sync.bucket_mb", self.bucket_mb, 1, MAX_BUCKET_MB)

    @property
    def bucket_bytes(self) -> int:
        return self.bucket_mb << 20


@dataclass
class CheckSection:
    """The five-step handoff check on the live trainer and sampler.

    Logprobs are compared at temperature 1.0 whatever the run samples at: vLLM reports raw (pre-temperature)
    logprobs and SkyRL's trainer divides logits by ``trainer.algorithm.temperature``, so the check sets the
    trainer's temperature to 1.0 while it scores and restores it afterwards.
    """

    before_training: bool = True
    """Run the full five-step check after the initial sync, before step 1."""
    every_n_syncs: int = 1
    """After every N-th training sync, an agree check (steps 1 and 5 only) on fresh probes; 0 turns it off."""
    on_failure: Literal["abort", "warn"] = "abort"
    """``abort``: stop training with the report and a non-zero exit; ``warn``: log the report and go on."""
    num_probes: int = NUM_PROBES
    probe_length: int = PROBE_LENGTH
    prompt_length: int = PROMPT_LENGTH
    decode_tokens: int = DECODE_TOKENS
    # The check's own settings (CHECK_SETTINGS), with the defaults of the one record the CLI and the library use
    # (CheckConfig, which also bounds them); tests/test_check_settings.py holds these fields to it.
    seed: int = CheckConfig.seed
    mean_tol: float = CheckConfig.mean_tol
    prob_tol: float = CheckConfig.prob_tol
    """The most one probe token's probability may move in an agree check (the rule: :class:`CheckConfig`)."""
    repeat_tol: float = CheckConfig.repeat_tol
    scale: float = CheckConfig.scale
    """Perturbation of the trainer's LoRA B in step 2 (added to every element)."""
    decode: bool = CheckConfig.decode
    group_margin: float = CheckConfig.group_margin
    """Leaving out any one target group must move the trainer by more than this times ``mean_tol`` (0: off)."""

    def __post_init__(self) -> None:
        _choice("skyrl_glm.check.on_failure", self.on_failure, _literal_values(CheckSection, "on_failure"))
        _bounded("skyrl_glm.check.every_n_syncs", self.every_n_syncs, 0, None)
        _bounded("skyrl_glm.check.num_probes", self.num_probes, 1, MAX_PROBES)
        _bounded("skyrl_glm.check.probe_length", self.probe_length, 2, MAX_PROBE_LENGTH)
        _bounded("skyrl_glm.check.prompt_length", self.prompt_length, 1, MAX_PROBE_LENGTH)
        _bounded("skyrl_glm.check.decode_tokens", self.decode_tokens, 1, MAX_DECODE_TOKENS)
        if self.prompt_length >= self.probe_length:
            raise ConfigError(
                f"skyrl_glm.check.prompt_length: must be < probe_length ({self.probe_length}), got {self.prompt_length}"
            )
        try:  # the check's bounds, checked once, by the check's own record
            self.check_config()
        except UsageError as e:  # "<field> must be ...", named with the section's key
            name, _, problem = str(e).partition(" ")
            raise ConfigError(f"skyrl_glm.check.{name}: {problem}") from None

    def check_config(self) -> CheckConfig:
        """The algorithm's settings from this section: every field of :data:`CHECK_SETTINGS`."""
        return CheckConfig(**{name: getattr(self, name) for name in CHECK_SETTINGS})


@dataclass
class GlmSection:
    """Everything skyrl-glm adds to a SkyRL config: ``skyrl_glm.sync``, ``skyrl_glm.check``, ``skyrl_glm.cpu``."""

    sync: SyncSection = field(default_factory=SyncSection)
    check: CheckSection = field(default_factory=CheckSection)
    overlong: OverlongPenaltyConfig = field(default_factory=OverlongPenaltyConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    cpu: bool = False
    """Run SkyRL's loop on CPU (logical Ray GPUs, CUDA assumptions lifted: skyrl_glm.skyrl.compat.cpu).
    Never implicit."""


def make_glm_config(
    algorithm_cls: type[AlgorithmConfig] | None = None,
    trainer_cls: type[TrainerConfig] | None = None,
    generator_cls: type[GeneratorConfig] | None = None,
) -> type[SkyRLTrainConfig]:
    """SkyRL's ``make_config`` (custom algorithm/trainer/generator sections) plus the ``skyrl_glm`` section."""
    base = make_config(algorithm_cls=algorithm_cls, trainer_cls=trainer_cls, generator_cls=generator_cls)
    namespace = {"__annotations__": {"skyrl_glm": GlmSection}, "skyrl_glm": field(default_factory=GlmSection)}
    return dataclass(type("SkyRLGlmConfig", (base,), namespace))


SkyRLGlmConfig = make_glm_config()


class GlmTrainConfig(Protocol):
    """The whole config of a skyrl-glm run (what :func:`make_glm_config` builds), for the few places that read
    SkyRL's sections and skyrl-glm's together: the run, its experiment and the checks across sections."""

    data: DataConfig
    trainer: TrainerConfig
    generator: GeneratorConfig
    skyrl_glm: GlmSection


def colocated_gpu(glm: GlmSection, placement: PlacementConfig) -> bool:
    """Trainer and sampler take turns on the same GPUs."""
    return placement.colocate_all and not glm.cpu


def resolved_transport(glm: GlmSection, placement: PlacementConfig) -> str:
    """``skyrl_glm.sync.transport`` for the engines on the trainer's sending node, ``auto`` resolved: CUDA IPC when
    colocated on GPUs, shared memory otherwise (CPU mode included). Engines on other nodes take the collective
    transport under ``auto`` (:mod:`skyrl_glm.skyrl.workers.routes`, per engine once the run knows where each runs)."""
    return local_transport(glm.sync.transport, colocated_gpu(glm, placement))


__all__ = [
    "AUTO_TRANSPORT",
    "CheckSection",
    "ConfigError",
    "GlmSection",
    "GlmTrainConfig",
    "SkyRLGlmConfig",
    "SyncSection",
    "colocated_gpu",
    "make_glm_config",
    "resolved_transport",
]
