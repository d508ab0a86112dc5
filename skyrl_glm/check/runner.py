"""Assemble a check from names: model (registered family or checkpoint dir), trainer, sampler, transport, fault.

:func:`run` validates every option before any work starts (a bad option costs no engine start), then sets up
the sides in parallel (the vLLM engine in this thread, the HF trainer in another; both warmed on the probes, so
the timed steps measure the handoff and not first-call costs), then runs the five steps.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyrl_glm.check.algorithm import CheckConfig, CheckReport, StepResult, check_vocabulary, run_check
from skyrl_glm.check.faults import FAULT_TABLE, FAULTS, NO_FAULT, inject
from skyrl_glm.check.probes import Probes, make_probes
from skyrl_glm.check.scorers import _engine_lora_rank, require_vllm, require_vllm_serves
from skyrl_glm.checkpoint import read_config, vocab_size
from skyrl_glm.models.base import ModelFamily
from skyrl_glm.models.vllm_targets import sampler_backend
from skyrl_glm.plugins import VLLM_ENGINE, registry, sampler_kind
from skyrl_glm.sync.expert_layout import (
    PER_EXPERT,
    SHARED_OUTER,
    LayoutError,
    check_layout,
    expert_groups,
)
from skyrl_glm.sync.transports import HOST_LOCAL
from skyrl_glm.usage import UsageError, name_list, positive_int, temp_space_problem

DEFAULT_MODEL = "glm-4.5"
TINY_SEED = 0  # the seed of the tiny checkpoints a check makes (``skyrl-glm tiny make NAME DIR --seed 0``)


def transport_choices() -> list[str]:
    """Registered transports, plus ``disk``: the baseline that writes a PEFT directory vLLM loads."""
    return [*sorted(registry().transports), "disk"]


@dataclass
class CheckOptions:
    model: str | None = None
    trainer: str = "hf"
    sampler: str = "vllm"
    transport: str = HOST_LOCAL
    fault: str = NO_FAULT
    lora_targets: list[str] | None = None
    allow_unsupported_targets: bool = False
    rank: int = 8
    alpha: int = 16
    device: str = "cpu"
    workdir: str | None = None
    config: CheckConfig = field(default_factory=CheckConfig)
    expert_layout: str = PER_EXPERT
    """How the engine takes the routed experts' LoRA (:mod:`skyrl_glm.sync.expert_layout`); ``shared-outer``
    and ``shared-all`` train one adapter per layer for all its experts (the adapter those layouts serve)."""


# What a check writes in the temp dir: measured 2026-12-02 on the CPU machine, a first check (torch's compile cache
# cold) 156 MB, then almost nothing; vLLM's engine died with a bare EngineDeadError when it could not.
TEMP_BYTES = 256 << 20


def temp_problem() -> str | None:
    """Why the temp dir cannot take a check (one line), or None."""
    return temp_space_problem(TEMP_BYTES)


def engine_options(args: argparse.Namespace, **rest: Any) -> CheckOptions:
    """The options of the flags ``check`` and ``check matrix`` share (model, device, sampler, adapter rank and
    targets, expert layout), plus ``rest``: one reading of those flags for both commands. The run's control key
    setting is checked here too: the engine would refuse it only after it started."""
    from skyrl_glm.sync.vllm.control import setting_problem

    if problem := setting_problem() or temp_problem():
        raise UsageError(problem)
    return CheckOptions(
        model=args.model,
        device=args.device,
        sampler=args.sampler,
        rank=args.rank,
        lora_targets=name_list("--lora-targets", args.lora_targets),
        expert_layout=args.expert_layout,
        **rest,
    )


@dataclass(frozen=True)
class CheckPlan:
    """Everything :func:`run` needs, found valid before any work: ``model_dir`` is None for a tiny model."""

    family: ModelFamily
    model_dir: Path | None
    targets: list[str]
    trainer_factory: Callable[..., Any]
    sampler_factory: Callable[..., Any]
    transport_class: Any  # None for the disk baseline
    vocab_size: int


def resolve_model(model: str | None) -> tuple[ModelFamily, Path | None, dict[str, Any] | None]:
    """A registered family name (its tiny checkpoint is used) or a checkpoint directory (validated)."""
    reg = registry()
    name = model or DEFAULT_MODEL
    if name in reg.models:
        return reg.model(name), None, None
    path = Path(name)
    if not path.is_dir():
        raise UsageError(f"--model {name!r} is neither a registered model {sorted(reg.models)} nor a directory")
    config = read_config(path)
    return reg.model_for_type(config["model_type"]), path, config


def check_device(device: str) -> None:
    match = re.fullmatch(r"cpu|cuda(?::(\d+))?", device)
    if match is None:
        raise UsageError(f"unknown device {device!r}: use cpu, cuda or cuda:N")
    from skyrl_glm.sync.vllm.engine_env import environment_problem

    if problem := environment_problem(gpu=device != "cpu"):  # what an engine reads, read before anything starts
        raise UsageError(problem)
    if device == "cpu":
        return
    import torch

    index = int(match.group(1) or 0)
    if index >= torch.cuda.device_count():
        raise UsageError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def prepare(options: CheckOptions) -> CheckPlan:
    """Validate every option (raising :class:`UsageError`); nothing is started or written here."""
    reg = registry()
    if options.fault not in FAULTS:
        raise UsageError(f"unknown fault {options.fault!r}; choose from {FAULTS}")
    transport_class = None if options.transport == "disk" else reg.transport(options.transport)
    if transport_class is not None and transport_class.needs_cuda and options.device == "cpu":
        raise UsageError(f"the {options.transport} transport moves CUDA memory: use --device cuda, or cpu/disk on CPU")
    if transport_class is not None and transport_class.needs_group:
        others = [t for t in transport_choices() if t == "disk" or not reg.transport(t).needs_group]
        raise UsageError(
            f"the {options.transport} transport needs a process group with the engine's workers (SkyRL's "
            f"weight-sync group); with the in-process engine use --transport {'|'.join(others)}"
        )
    trainer_factory = reg.trainer(options.trainer)
    sampler_factory = reg.sampler(options.sampler)
    positive_int("rank", options.rank)
    positive_int("alpha", options.alpha)
    check_device(options.device)
    family, model_dir, config = resolve_model(options.model)
    kind = sampler_kind(sampler_factory)
    on_vllm = kind.engine == VLLM_ENGINE
    if on_vllm:
        require_vllm()
        _engine_lora_rank(options.rank)  # a rank vLLM cannot serve: refused here, not after the engine starts
    if options.device == "cpu" and on_vllm and family.vllm_cpu_dtype is None:
        raise UsageError(
            f"--model {options.model}: {family.name} ({family.hf_model_type}) has no vLLM CPU serving path; "
            "check it on a GPU (--device cuda)"
        )
    if options.device != "cpu" and on_vllm:
        require_vllm_serves(family)
    targets = family.lora.resolve(
        options.lora_targets,
        sampler=sampler_backend(options.device, skyrl_worker=kind.skyrl_worker),
        allow_unsupported=options.allow_unsupported_targets,
    )
    kinds = [family.lora.target(t).kind for t in targets]
    check_expert_layout(options.expert_layout, options.device, kinds)
    groups = expert_groups(options.expert_layout)
    experts = 0
    if groups:  # the model's expert count, read only for a grouped layout
        experts = (family.tiny_config().to_dict() if config is None else config).get("n_routed_experts") or 0
    if groups and experts % groups:
        raise UsageError(
            f"--expert-layout {options.expert_layout}: the model's {experts} experts make no {groups} groups"
        )
    needs = FAULT_TABLE[options.fault].needs if options.fault in FAULT_TABLE else None
    if needs is not None and needs not in kinds:
        raise UsageError(f"--fault {options.fault} needs a {needs} LoRA target; these targets hold none")
    vocab = family.tiny_vocab_size if config is None else vocab_size(config, model_dir)
    return CheckPlan(family, model_dir, targets, trainer_factory, sampler_factory, transport_class, vocab)


def check_expert_layout(layout: str, device: str, kinds: list[str]) -> None:
    """A layout the engine can take for these targets, or one line saying why not."""
    try:
        check_layout(layout)
    except LayoutError as e:
        raise UsageError(str(e)) from None
    if layout == PER_EXPERT:
        return
    if device == "cpu":
        raise UsageError(
            f"--expert-layout {layout}: vLLM's CPU build serves no routed-expert LoRA, so only per-expert runs "
            "here; use --device cuda"
        )
    if "routed_expert" not in kinds:
        raise UsageError(f"--expert-layout {layout} lays out routed-expert LoRA; the targets hold none")


def _warm(side: Any, probes: Probes, generate: bool, name: str) -> Any:
    """One scoring (and generation) on the base model: first-call costs leave the timed steps. Probes the side
    cannot score are refused first (:func:`~skyrl_glm.check.algorithm.check_vocabulary`)."""
    check_vocabulary(probes, (name, side))
    side.score(probes.sequences)
    if generate:
        side.generate(probes.prompts, probes.decode_tokens)
    return side


def build_sides(
    options: CheckOptions, plan: CheckPlan, model_dir: Path, probes: Probes
) -> tuple[Any, Any, list[Callable[[], None]]]:
    """``(trainer, sampler, cleanup)``, set up at once and warmed; ``cleanup`` stops the engine."""

    def trainer() -> Any:
        side = plan.trainer_factory(
            model_dir,
            family=plan.family,
            targets=plan.targets,
            rank=options.rank,
            alpha=options.alpha,
            device=options.device,
            seed=options.config.seed,
            expert_groups=1 if options.expert_layout == SHARED_OUTER else expert_groups(options.expert_layout),
        )
        return _warm(side, probes, generate=False, name="trainer")

    # Both sides import transformers, and through it accelerate, whose modules import each other in a cycle: two
    # threads importing them at once can meet a half-initialised module (ImportError on a cold start, seen in CI).
    # Import that shared stack here, in one thread, before the sides start.
    import accelerate  # noqa: F401
    import transformers.modeling_utils  # noqa: F401

    with ThreadPoolExecutor(1, thread_name_prefix="check-trainer") as pool:
        trainer_side = pool.submit(trainer)
        sampler = plan.sampler_factory(
            model_dir,
            family=plan.family,
            targets=plan.targets,
            rank=options.rank,
            device=options.device,
            allow_unsupported=options.allow_unsupported_targets,
            expert_layout=options.expert_layout,
        )
        cleanup = [close] if (close := getattr(sampler, "close", None)) else []
        try:
            _warm(sampler, probes, generate=options.config.decode, name="sampler")
            trainer_built = trainer_side.result()
        except BaseException:
            for step in cleanup:  # the engine started: stopped before the error leaves
                step()
            raise
    return trainer_built, sampler, cleanup


def build_publisher(
    transport_class: Any, fault: str, sampler: Any, workdir: Path
) -> tuple[Any, Any, list[Callable[[], None]]]:
    """``(publisher, sampler, cleanup)`` for one transport (None: the disk baseline) with ``fault`` applied;
    ``cleanup`` releases the transport's last buffers."""
    from skyrl_glm.sync.publisher import DiskPublisher, InMemoryPublisher

    cleanup: list[Callable[[], None]] = []
    if transport_class is None:
        publisher: Any = DiskPublisher(sampler, root=workdir / "adapters")
    else:
        transport = transport_class()
        publisher = InMemoryPublisher(sampler, transport)
        cleanup.append(transport.release)
    publisher, sampler = inject(fault, publisher, sampler)
    return publisher, sampler, cleanup


def build(
    options: CheckOptions, plan: CheckPlan, model_dir: Path, probes: Probes
) -> tuple[Any, Any, Any, list[Callable[[], None]]]:
    """``(trainer, sampler, publisher, cleanup)`` for these options (fault applied), trainer and sampler set up
    at once. ``cleanup`` releases the transport's last buffers and stops the engine, when the steps are done."""
    trainer, sampler, stop = build_sides(options, plan, model_dir, probes)
    workdir = Path(options.workdir or tempfile.mkdtemp())
    publisher, sampler, release = build_publisher(plan.transport_class, options.fault, sampler, workdir)
    return trainer, sampler, publisher, release + stop


def run(
    options: CheckOptions,
    on_step: Callable[[StepResult], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> CheckReport:
    """The five-step check with these options. ``on_step`` gets each step's result as it ends; ``on_phase`` gets
    the setup's progress lines, a line ending in ``" ..."`` opening a phase and the next closing it
    (:class:`skyrl_glm.phases.Phases` prints them with their seconds)."""
    phase = on_phase or (lambda _msg: None)
    t0 = time.perf_counter()
    plan = prepare(options)
    with tempfile.TemporaryDirectory(prefix="skyrl-glm-check-") as tmp:
        options.workdir = options.workdir or tmp
        model_dir, kept = plan.model_dir, True
        if model_dir is None:
            phase(f"preparing the tiny {plan.family.name} model ...")
            model_dir, kept = tiny_model_dir(plan.family, Path(options.workdir))
            phase(f"tiny {plan.family.name} model ready")
        phase(f"starting the trainer ({options.trainer}) and the sampler ({options.sampler}), warming both ...")
        probes = make_probes(plan.vocab_size, seed=options.config.seed)
        trainer, sampler, publisher, cleanup = build(options, plan, model_dir, probes)
        t1 = time.perf_counter()
        phase("trainer and sampler ready; running the five steps ...")
        try:
            report = run_check(trainer, sampler, publisher, probes, options.config, on_step=on_step)
            phase("five steps done")
        finally:
            t2 = time.perf_counter()
            phase(f"stopping the sampler ({options.sampler}) ...")
            for step in cleanup:
                step()
            phase("sampler stopped")
    report.info.update(
        {
            "model": plan.family.name,
            # A directory that still exists after the run (the user's, or the cached tiny one), else None.
            "model_dir": str(model_dir) if kept else None,
            # How to make the same tiny checkpoint again (None for a user's checkpoint).
            "tiny_model": None if plan.model_dir else {"family": plan.family.name, "seed": TINY_SEED},
            "trainer": options.trainer,
            "sampler": options.sampler,
            "transport": options.transport,
            "fault": options.fault,
            "device": options.device,
            "lora_targets": sorted(trainer.lora_config.get("target_modules") or []),
            "expert_layout": options.expert_layout,
            "setup_s": t1 - t0,
            "steps_s": t2 - t1,
        }
    )
    return report


def tiny_model_dir(family: ModelFamily, workdir: Path) -> tuple[Path, bool]:
    """The cached tiny checkpoint, or (cache not writable) a temporary one: ``(dir, kept after the run)``."""
    from skyrl_glm.models.tiny import make_tiny
    from skyrl_glm.models.tiny_cache import cached_tiny

    cached = cached_tiny(family, seed=TINY_SEED)
    if cached is not None:
        return cached, True
    return make_tiny(family, workdir / f"tiny-{family.name}", seed=TINY_SEED), False
