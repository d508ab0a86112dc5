"""Several checks on one trainer and one engine: every (transport, fault) pair for a model, one table, one JSON.

A check's setup (an engine start: 30-50 s on a GPU, ~40 s on 2 CPU cores) dwarfs its five steps (seconds), so the
pairs share the sides: before each check the trainer's lora_B is zeroed again (step 2 needs B == 0) and the adapter
versions move on (each check publishes two, each newer than any the sampler saw). The verdict is the matrix's own:
with ``fault none`` a check must PASS, with a fault it must FAIL at the step the fault names
(:data:`~skyrl_glm.check.faults.EXPECTED_FAILURE`); exit 0 only if every pair did what it must.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.table import Table

from skyrl_glm import terminal
from skyrl_glm.check.algorithm import run_check
from skyrl_glm.check.faults import EXPECTED_FAILURE, FAULTS, FaultNotApplicable
from skyrl_glm.check.probes import make_probes
from skyrl_glm.check.report import to_dict
from skyrl_glm.check.runner import (
    CheckOptions,
    CheckPlan,
    build_publisher,
    build_sides,
    engine_options,
    prepare,
    tiny_model_dir,
)
from skyrl_glm.provenance import provenance
from skyrl_glm.sync.expert_layout import LAYOUTS, PER_EXPERT
from skyrl_glm.sync.transports import HOST_LOCAL
from skyrl_glm.usage import UsageError, run_failed

MAX_SEEDS = 256  # checks per (transport, fault): a few seconds each on one engine

console = terminal.console()


def expected(fault: str) -> str:
    return "PASS" if fault == "none" else f"FAIL at step {EXPECTED_FAILURE[fault]}"


def outcome(report: Any) -> str:
    failure = report.first_failure
    return "PASS" if report.passed else f"FAIL at step {failure.step if failure else len(report.steps) + 1}"


def run_matrix(
    options: CheckOptions, transports: list[str], faults: list[str], seeds: list[int] | None = None
) -> dict[str, Any]:
    """Validate every pair first (no engine starts for a bad one), then run them on shared sides, once per seed
    (the seed draws the probes, the trainer's LoRA A and its perturbation)."""
    for fault in faults:
        if fault not in FAULTS:
            raise UsageError(f"unknown fault {fault!r}; choose from {FAULTS}")
    plans = {t: prepare(replace(options, transport=t)) for t in transports}
    plan = plans[transports[0]]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="skyrl-glm-matrix-") as tmp:
        workdir = Path(options.workdir or tmp)
        model_dir = plan.model_dir or tiny_model_dir(plan.family, workdir)[0]
        seeds = seeds or [options.config.seed]
        trainer, sampler, stop = build_sides(options, plan, model_dir, make_probes(plan.vocab_size, seed=seeds[0]))
        setup_s = time.perf_counter() - t0
        try:
            results = run_pairs(trainer, sampler, plans, faults, options, workdir, seeds)
        finally:
            for step in stop:
                step()
    return {
        "model": plan.family.name,
        "model_dir": str(plan.model_dir) if plan.model_dir else None,
        "device": options.device,
        "sampler": options.sampler,
        "lora_targets": sorted(trainer.lora_config.get("target_modules") or []),
        "expert_layout": options.expert_layout,
        "seeds": seeds,
        "setup_s": setup_s,
        "total_s": time.perf_counter() - t0,
        "all_as_expected": all(r["as_expected"] for r in results),
        "checks": results,
        **provenance(),
    }


def run_pairs(
    trainer: Any,
    sampler: Any,
    plans: dict[str, CheckPlan],
    faults: list[str],
    options: CheckOptions,
    workdir: Path,
    seeds: list[int],
    first_version: int = 1,
) -> list[dict[str, Any]]:
    """Every (seed, transport of ``plans``, fault) check on sides already set up, one row each: the seed draws the
    probes, the trainer's LoRA A and its perturbation; the versions start at ``first_version`` and each check
    publishes two."""
    plan = next(iter(plans.values()))
    results: list[dict[str, Any]] = []
    version = first_version
    for seed, transport, fault in itertools.product(seeds, plans, faults):
        probes = make_probes(plan.vocab_size, seed=seed)
        trainer.reset_lora_b()
        if hasattr(trainer, "seed_lora_a"):
            trainer.seed_lora_a(seed)
        publisher, faulty, release = build_publisher(
            plans[transport].transport_class, fault, sampler, workdir / f"{transport}-{fault}"
        )
        config = replace(options.config, first_version=version, seed=seed)
        row: dict[str, Any] = {"transport": transport, "fault": fault, "seed": seed, "expected": expected(fault)}
        try:
            report = run_check(trainer, faulty, publisher, probes, config)
        except FaultNotApplicable as e:  # e.g. no shared tensors to drop: not a verdict either way
            row.update(outcome="n/a", note=str(e), as_expected=True, report=None)
        else:
            row["outcome"] = outcome(report)
            row.update(as_expected=row["outcome"] == row["expected"], report=to_dict(report))
        finally:
            for step in release:
                step()
        version += 2
        results.append(row)
        console.log(
            f"{transport} / {fault} / seed {seed}: {row['outcome']} (expected {row['expected']}) {row.get('note', '')}"
        )
    return results


def print_matrix(result: dict[str, Any]) -> None:
    table = Table(title=f"handoff checks: {result['model']} on {result['device']}")
    columns = ("transport", "fault", "seed", "expected", "outcome", "weakest group left out", "step 5 prefill mean")
    for col in (*columns, "publish s", "verdict"):
        table.add_column(col, overflow="fold")
    for r in result["checks"]:
        steps = {s["step"]: s for s in (r["report"]["steps"] if r["report"] else [])}
        five, four, three = steps.get(5), steps.get(4), steps.get(3)
        mean = f"{five['prefill']['mean']:.4g}" if five and five.get("prefill") else "-"
        secs = f"{four['seconds']:.3f}" if four else "-"
        left_out = {k: v for k, v in (three or {}).get("extra", {}).items() if k.startswith("without[")}
        weakest = min(left_out, key=left_out.__getitem__, default=None)
        shown = f"{weakest[len('without[') : -1]} {left_out[weakest]:.3g}" if weakest else "-"
        verdict = "ok" if r["as_expected"] else "WRONG"
        table.add_row(
            r["transport"], r["fault"], str(r["seed"]), r["expected"], r["outcome"], shown, mean, secs, verdict
        )
    console.print(table)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check-matrix",
        help="every (transport, fault) check of one model on one trainer and one engine; exit 0 iff all as expected",
    )
    p.add_argument("--model", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--sampler", default="vllm")
    p.add_argument("--transports", default=HOST_LOCAL, help="comma-separated: registered transports and disk")
    p.add_argument("--faults", default="none,no-publish,double-scale,drop-aliases", help="comma-separated")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--seeds", default="0", help="comma-separated seeds or a range a-b: every check once per seed")
    p.add_argument("--lora-targets", default=None, help="LoRA targets, comma-separated (as for check)")
    p.add_argument(
        "--expert-layout", default=PER_EXPERT, help=f"the engine's routed-expert layout: {', '.join(LAYOUTS)}"
    )
    p.add_argument("--json", default=None)
    p.set_defaults(func=main)


def seed_list(text: str) -> list[int]:
    """``0,3,7`` or ``0-19`` (both ends included), or one line saying what is wrong."""
    try:
        if re.fullmatch(r"\d+-\d+", text):
            first, last = map(int, text.split("-"))
            seeds = list(range(first, last + 1))
        else:
            seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--seeds {text!r}: give comma-separated integers or a range like 0-19") from None
    if not seeds or len(seeds) > MAX_SEEDS or min(seeds) < 0:
        raise UsageError(f"--seeds {text!r}: give 1 to {MAX_SEEDS} seeds >= 0")
    return seeds


def main(args: argparse.Namespace) -> int:
    from skyrl_glm.sync.vllm.engine import EngineStartError  # imports torch: not at parser build
    from skyrl_glm.usage import writable_file

    if args.json:
        writable_file("--json", args.json)
    options = engine_options(args)
    transports = [t for t in args.transports.split(",") if t]
    faults = [f for f in args.faults.split(",") if f]
    if not transports or not faults:
        raise UsageError("--transports and --faults each need at least one name")
    try:
        result = run_matrix(options, transports, faults, seed_list(args.seeds))
    except EngineStartError as e:
        return run_failed("skyrl-glm check-matrix", e, None)
    print_matrix(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if result["all_as_expected"] else 1
