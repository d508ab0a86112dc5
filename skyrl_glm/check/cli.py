"""``skyrl-glm check``: the five-step handoff check from the command line (exit 0 PASS, 1 FAIL, 2 error)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import traceback

from skyrl_glm import terminal
from skyrl_glm.check.algorithm import CheckConfig, StepResult
from skyrl_glm.check.faults import FAULTS, NO_FAULT
from skyrl_glm.check.report import plot, print_table, write_json
from skyrl_glm.check.runner import CheckOptions, engine_options, run, temp_problem, transport_choices
from skyrl_glm.phases import Phases
from skyrl_glm.plugins import registry
from skyrl_glm.sync.expert_layout import LAYOUTS, PER_EXPERT
from skyrl_glm.sync.transports import HOST_LOCAL
from skyrl_glm.usage import UsageError, run_failed, writable_file

log = logging.getLogger(__name__)
console = terminal.console()


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="five-step trainer/sampler handoff check (default: tiny GLM on CPU)")
    p.add_argument("--model", help="registered model name (tiny made on the fly) or checkpoint dir; default glm-4.5")
    p.add_argument("--trainer", default="hf", choices=sorted(registry().trainers))
    p.add_argument("--sampler", default="vllm", choices=sorted(registry().samplers))
    p.add_argument("--transport", default=HOST_LOCAL, choices=transport_choices())
    p.add_argument("--fault", default=NO_FAULT, choices=FAULTS, help="replace the handoff with a broken one")
    p.add_argument(
        "--lora-targets",
        help="LoRA targets, comma-separated: qualified, PEFT short (q_a_proj) or Megatron (linear_fc1)",
    )
    p.add_argument(
        "--allow-unsupported-targets",
        action="store_true",
        help="train targets the sampler does not apply (to prove the check catches it)",
    )
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=int, default=16)
    p.add_argument("--device", default="cpu")
    p.add_argument("--scale", type=float, default=CheckConfig.scale, help="lora_B perturbation scale")
    p.add_argument("--mean-tol", type=float, default=CheckConfig.mean_tol)
    p.add_argument(
        "--prob-tol",
        type=float,
        default=CheckConfig.prob_tol,
        help="the most one probe token's probability may move in an agree step (|exp(lp_t) - exp(lp_s)|)",
    )
    p.add_argument(
        "--repeat-tol",
        type=float,
        default=CheckConfig.repeat_tol,
        help="sampler repeat-score tolerance (the same sequence scored twice, alone: exact on vLLM CPU and GPU)",
    )
    p.add_argument(
        "--group-margin",
        type=float,
        default=CheckConfig.group_margin,
        help="each target group alone must move the stale sampler by > this x mean-tol (0: one scale for all)",
    )
    p.add_argument(
        "--expert-layout",
        default=PER_EXPERT,
        help=f"how the engine takes routed-expert LoRA: {', '.join(LAYOUTS)} (shared-outer, shared-all: one adapter "
        "per layer; grouped:G: one per group of E/G consecutive experts)",
    )
    p.add_argument("--no-decode", action="store_true", help="score the prefill path only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the report as JSON here")
    p.add_argument("--plot", help="write a PNG of per-token |dlogp| (steps 1, 3, 5) here")
    p.set_defaults(func=main)


def options_from_args(args: argparse.Namespace) -> CheckOptions:
    """The run's options; a bad value raises :class:`~skyrl_glm.usage.UsageError` (exit 2) before any work."""
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None:
            writable_file(option, path)
    return engine_options(
        args,
        trainer=args.trainer,
        transport=args.transport,
        fault=args.fault,
        allow_unsupported_targets=args.allow_unsupported_targets,
        alpha=args.alpha,
        config=CheckConfig(
            repeat_tol=args.repeat_tol,
            mean_tol=args.mean_tol,
            prob_tol=args.prob_tol,
            scale=args.scale,
            seed=args.seed,
            decode=not args.no_decode,
            group_margin=args.group_margin,
        ),
    )


def failed(error: Exception) -> int:
    """A started check that failed: one line with its root cause (a full temp dir, which the engine's own error
    does not name), the traceback appended to the engine log, which is kept and named."""
    from skyrl_glm.quiet import ENGINE_LOG_ENV

    engine_log = os.environ.get(ENGINE_LOG_ENV)
    if engine_log:
        with contextlib.suppress(OSError), open(engine_log, "a") as f:
            traceback.print_exception(error, file=f)
    return run_failed("skyrl-glm check", error, engine_log, temp_problem())


def main(args: argparse.Namespace) -> int:
    from skyrl_glm.sync.vllm.engine import EngineStartError  # imports torch: not at parser build

    def on_step(s: StepResult) -> None:
        console.print(f"check: step {s.step} {s.name}: {'ok' if s.passed else 'FAIL'} ({s.seconds:.2f} s) {s.detail}")

    options = options_from_args(args)
    try:
        with Phases(console, prefix="check") as phases:
            report = run(options, on_step=on_step, on_phase=phases.line)
    except EngineStartError as e:
        if options.allow_unsupported_targets:  # the targets forced past the family's policy are the likely cause
            raise UsageError(f"{e}; the engine was started with --allow-unsupported-targets") from e
        return run_failed("skyrl-glm check", e, None, temp_problem())
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - an engine that died mid-run (EngineDeadError): one line, exit 3
        return failed(e)
    print_table(report, console)
    info = report.info
    tiny = info["tiny_model"]
    made = f"tiny {tiny['family']} seed {tiny['seed']}" if tiny else "checkpoint"
    console.print(f"model: {made} at {info['model_dir'] or '(a temporary directory, removed)'}")
    console.print(f"setup {info['setup_s']:.1f} s (model + engines, warmed), five steps {info['steps_s']:.1f} s")
    if args.json:
        write_json(report, args.json)
    if args.plot:
        plot(report, args.plot)
    return 0 if report.passed else 1
