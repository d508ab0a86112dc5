"""Several checks on one trainer and one engine: every (transport, fault) pair for a model, one table, one JSON.

A check's setup (an engine start: 30-50 s on a GPU, ~40 s on 2 CPU cores) dwarfs its five steps (seconds), so the
pairs share the sides: before each check the trainer's lora_B is zeroed again (step 2 needs B == 0) and the adapter
versions move on (each check publishes two, each newer than any the sampler saw). The verdict is the matrix's own:
with ``fault none`` a check must PASS, with a fault it must FAIL at the step the fault names
(:data:`~skyrl_glm.check.faults.EXPECTED_FAILURE`); exit 0 only if every pair did what it must.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from skyrl_glm.check.algorithm import run_check
from skyrl_glm.check.faults import EXPECTED_FAILURE, FAULTS, FaultNotApplicable
from skyrl_glm.check.probes import Probes, make_probes
from skyrl_glm.check.report import to_dict
from skyrl_glm.check.runner import CheckOptions, CheckPlan, build_publisher, build_sides, prepare, tiny_model_dir
from skyrl_glm.provenance import provenance
from skyrl_glm.usage import UsageError

console = Console()


def expected(fault: str) -> str:
    return "PASS" if fault == "none" else f"FAIL at step {EXPECTED_FAILURE[fault]}"


def outcome(report: Any) -> str:
    failure = report.first_failure
    return "PASS" if report.passed else f"FAIL at step {failure.step if failure else len(report.steps) + 1}"


def run_matrix(options: CheckOptions, transports: list[str], faults: list[str]) -> dict[str, Any]:
    """Validate every pair first (no engine starts for a bad one), then run them on shared sides."""
    for fault in faults:
        if fault not in FAULTS:
            raise UsageError(f"unknown fault {fault!r}; choose from {FAULTS}")
    plans = {t: prepare(replace(options, transport=t)) for t in transports}
    plan = plans[transports[0]]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="skyrl-glm-matrix-") as tmp:
        workdir = Path(options.workdir or tmp)
        model_dir = plan.model_dir or tiny_model_dir(plan.family, workdir)[0]
        probes = make_probes(plan.vocab_size, seed=options.config.seed)
        trainer, sampler, stop = build_sides(options, plan, model_dir, probes)
        setup_s = time.perf_counter() - t0
        try:
            results = run_pairs(trainer, sampler, plans, faults, probes, options, workdir)
        finally:
            for step in stop:
                step()
    return {
        "model": plan.family.name,
        "model_dir": str(plan.model_dir) if plan.model_dir else None,
        "device": options.device,
        "sampler": options.sampler,
        "lora_targets": sorted(trainer.lora_config.get("target_modules") or []),
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
    probes: Probes,
    options: CheckOptions,
    workdir: Path,
    first_version: int = 1,
) -> list[dict[str, Any]]:
    """Every (transport of ``plans``, fault) check on sides already set up, one row each; the versions start at
    ``first_version`` and each check publishes two."""
    results: list[dict[str, Any]] = []
    version = first_version
    for transport, plan in plans.items():
        for fault in faults:
            trainer.reset_lora_b()
            publisher, faulty, release = build_publisher(
                plan.transport_class, fault, sampler, workdir / f"{transport}-{fault}"
            )
            config = replace(options.config, first_version=version)
            row: dict[str, Any] = {"transport": transport, "fault": fault, "expected": expected(fault)}
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
            console.log(f"{transport} / {fault}: {row['outcome']} (expected {row['expected']}) {row.get('note', '')}")
    return results


def print_matrix(result: dict[str, Any]) -> None:
    table = Table(title=f"handoff checks: {result['model']} on {result['device']}")
    for col in ("transport", "fault", "expected", "outcome", "step 5 prefill mean", "publish s", "verdict"):
        table.add_column(col)
    for r in result["checks"]:
        steps = r["report"]["steps"] if r["report"] else []
        five = next((s for s in steps if s["step"] == 5), None)
        four = next((s for s in steps if s["step"] == 4), None)
        mean = f"{five['prefill']['mean']:.4g}" if five and five.get("prefill") else "-"
        secs = f"{four['seconds']:.3f}" if four else "-"
        verdict = "ok" if r["as_expected"] else "WRONG"
        table.add_row(r["transport"], r["fault"], r["expected"], r["outcome"], mean, secs, verdict)
    console.print(table)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check-matrix",
        help="every (transport, fault) check of one model on one trainer and one engine; exit 0 iff all as expected",
    )
    p.add_argument("--model", default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--sampler", default="vllm")
    p.add_argument("--transports", default="cpu", help="comma-separated: registered transports and disk")
    p.add_argument("--faults", default="none,no-publish,double-scale,drop-aliases", help="comma-separated")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--json", default=None)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from skyrl_glm.usage import writable_file

    if args.json:
        writable_file("--json", args.json)
    options = CheckOptions(model=args.model, device=args.device, sampler=args.sampler, rank=args.rank)
    transports = [t for t in args.transports.split(",") if t]
    faults = [f for f in args.faults.split(",") if f]
    if not transports or not faults:
        raise UsageError("--transports and --faults each need at least one name")
    result = run_matrix(options, transports, faults)
    print_matrix(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if result["all_as_expected"] else 1
