"""Assemble a check from names: model (registered family or checkpoint dir), trainer, sampler, transport, fault."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyrl_glm.check.algorithm import CheckConfig, CheckReport, StepResult, run_check
from skyrl_glm.check.faults import inject
from skyrl_glm.check.probes import make_probes
from skyrl_glm.models.base import ModelFamily
from skyrl_glm.models.vllm_targets import sampler_backend
from skyrl_glm.plugins import registry

DEFAULT_MODEL = "glm-4.5"


def transport_choices() -> list[str]:
    """Registered transports, plus ``disk``: the baseline that writes a PEFT directory vLLM loads."""
    return [*sorted(registry().transports), "disk"]


@dataclass
class CheckOptions:
    model: str | None = None
    trainer: str = "hf"
    sampler: str = "vllm"
    transport: str = "cpu"
    fault: str = "none"
    lora_targets: list[str] | None = None
    allow_unsupported_targets: bool = False
    rank: int = 8
    alpha: int = 16
    device: str = "cpu"
    workdir: str | None = None
    config: CheckConfig = field(default_factory=CheckConfig)


def resolve_model(model: str | None, workdir: str | Path) -> tuple[ModelFamily, Path]:
    """A registered family name (a tiny checkpoint is made on the fly) or a checkpoint directory."""
    reg = registry()
    name = model or DEFAULT_MODEL
    if name in reg.models:
        from skyrl_glm.models.tiny import make_tiny

        family = reg.model(name)
        return family, make_tiny(family, Path(workdir) / f"tiny-{family.name}")
    path = Path(name)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{name!r} is neither a registered model ({sorted(reg.models)}) nor a checkpoint dir")
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    return reg.model_for_type(model_type), path


def build(options: CheckOptions, family: ModelFamily, model_dir: Path) -> tuple[Any, Any, Any]:
    """``(trainer, sampler, publisher)`` for these options (fault applied)."""
    from skyrl_glm.sync.publisher import DiskPublisher, InMemoryPublisher

    reg = registry()
    targets = family.lora.resolve(
        options.lora_targets,
        sampler=sampler_backend(options.device),
        allow_unsupported=options.allow_unsupported_targets,
    )
    trainer = reg.trainer(options.trainer)(
        model_dir, family=family, targets=targets, rank=options.rank, alpha=options.alpha, device=options.device
    )
    sampler = reg.sampler(options.sampler)(
        model_dir,
        family=family,
        targets=targets,
        rank=options.rank,
        device=options.device,
        allow_unsupported=options.allow_unsupported_targets,
    )
    if options.transport == "disk":
        publisher: Any = DiskPublisher(sampler, root=Path(options.workdir or tempfile.mkdtemp()) / "adapters")
    elif options.transport == "nccl":
        raise ValueError(
            "the nccl transport needs a trainer<->engine process group (SkyRL's weight-sync group); "
            "with the in-process engine use --transport cpu, ipc or disk"
        )
    else:
        publisher = InMemoryPublisher(sampler, reg.transport(options.transport)())
    publisher, sampler = inject(options.fault, publisher, sampler)
    return trainer, sampler, publisher


def run(
    options: CheckOptions,
    on_step: Callable[[StepResult], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> CheckReport:
    phase = on_phase or (lambda _msg: None)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="skyrl-glm-check-") as tmp:
        options.workdir = options.workdir or tmp
        phase("preparing the model")
        family, model_dir = resolve_model(options.model, options.workdir)
        phase(f"starting trainer ({options.trainer}) and sampler ({options.sampler})")
        trainer, sampler, publisher = build(options, family, model_dir)
        t1 = time.perf_counter()
        phase("running the five steps")
        probes = make_probes(_vocab_size(model_dir), seed=options.config.seed)
        report = run_check(trainer, sampler, publisher, probes, options.config, on_step=on_step)
        t2 = time.perf_counter()
    report.info.update(
        {
            "model": family.name,
            "model_dir": str(model_dir),
            "trainer": options.trainer,
            "sampler": options.sampler,
            "transport": options.transport,
            "fault": options.fault,
            "device": options.device,
            "lora_targets": sorted(trainer.lora_config.get("target_modules") or []),
            "setup_s": t1 - t0,
            "steps_s": t2 - t1,
        }
    )
    return report


def _vocab_size(model_dir: Path) -> int:
    cfg = json.loads((model_dir / "config.json").read_text())
    return int(cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size"))
