"""``skyrl-glm bench load``: the vLLM load stage, in memory vs from disk, where vLLM runs here.

``bench sync`` moves a synthetic full-size adapter that no engine can load; this command measures what comes after
the bytes arrive, with a real engine: vLLM's build on this machine (its CPU build in CI), a registered family's tiny
checkpoint (a few layers, small widths) and an HF + PEFT trainer on it with the family's LoRA targets for that
device (the check's trainer and sampler). One engine; updates alternate between

* ``memory`` (ours): plan -> the ``cpu`` transport -> the worker's verified receive -> ``add_lora`` of the staged
  ``skyrl-memory://`` adapter -> atomic swap (``receive_s`` is the worker RPC: transfer, verify, rebuild);
* ``disk``: SkyRL's file path, a PEFT directory written (``write_s``) and read by vLLM the standard way.

``load`` is the engine's part in both (``load_s``: ``add_lora`` and the swap). The first ``--warmup`` updates of each
path are dropped; the table reports medians. Full-size GLM-5.3 loads need vLLM's GPU build.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from skyrl_glm import strict_json
from skyrl_glm.plugins import registry
from skyrl_glm.usage import PROG, UsageError, positive_int, print_error, writable_file

STAGES = {"memory": ("plan_s", "receive_s", "load_s", "total_s"), "disk": ("write_s", "load_s", "total_s")}


def _memory_row(t: dict[str, float]) -> dict[str, float]:
    plan = sum(t.get(k, 0.0) for k in ("dedup_s", "alias_s", "pack_s", "fold_s", "checksum_s", "manifest_s"))
    return {"plan_s": plan, "receive_s": t["receive_rpc_s"], "load_s": t["load_s"], "total_s": t["total_s"]}


def run_load_bench(model: str, rounds: int, warmup: int, rank: int) -> dict[str, Any]:
    """Alternate in-memory and disk updates on one engine; every update must be accepted."""
    from skyrl_glm.check.probes import make_probes
    from skyrl_glm.check.runner import CheckOptions, build, prepare, tiny_model_dir
    from skyrl_glm.sync.publisher import DiskPublisher

    options = CheckOptions(model=model, transport="cpu", rank=rank, alpha=2 * rank)
    plan = prepare(options)
    runs: dict[str, list[dict[str, float]]] = {"memory": [], "disk": []}
    with tempfile.TemporaryDirectory(prefix="skyrl-glm-bench-load-") as tmp:
        options.workdir = tmp
        model_dir, kept = (plan.model_dir, True) if plan.model_dir else tiny_model_dir(plan.family, Path(tmp))
        probes = make_probes(plan.vocab_size, seed=options.config.seed)
        trainer, sampler, memory, cleanup = build(options, plan, model_dir, probes)
        disk = DiskPublisher(sampler, root=Path(tmp) / "adapters")
        adapter = trainer.adapter()
        try:
            version = 0
            for _ in range(warmup + rounds):
                for path, publisher in (("memory", memory), ("disk", disk)):
                    version += 1
                    result = publisher.publish(adapter, trainer.lora_config, version)
                    if not result.ok:
                        raise RuntimeError(f"{path} update {version} was rejected: {result.reason}")
                    t = result.timings
                    runs[path].append(_memory_row(t) if path == "memory" else {k: t[k] for k in STAGES["disk"]})
        finally:
            for step in cleanup:
                step()
    timed = {path: rows[warmup:] for path, rows in runs.items()}
    return {
        "command": "skyrl-glm bench load",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": plan.family.name,
        "model_dir": str(model_dir) if kept else None,  # a temporary tiny model is gone after the run
        "targets": plan.targets,
        "rank": rank,
        "public_tensors": len(adapter),
        "public_bytes": sum(t.numel() * t.element_size() for t in adapter.values()),
        "rounds": rounds,
        "warmup": warmup,
        "medians_s": {p: {k: statistics.median(r[k] for r in rows) for k in STAGES[p]} for p, rows in timed.items()},
        "runs": runs,
    }


def print_load_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    med = report["medians_s"]
    table = Table(
        title=f"vLLM load stage: {report['model']} (tiny), rank {report['rank']}, "
        f"{report['public_tensors']} public tensors; median of {report['rounds']}"
    )
    table.add_column("stage")
    table.add_column("memory (skyrl-glm)", justify="right")
    table.add_column("disk (PEFT dir)", justify="right")
    for stage in ("plan_s", "receive_s", "write_s", "load_s", "total_s"):
        cells = [f"{med[p][stage] * 1e3:.1f} ms" if stage in med[p] else "-" for p in ("memory", "disk")]
        table.add_row(stage.removesuffix("_s"), *cells)
    Console().print(table)


def _cmd_bench_load(args: argparse.Namespace) -> int:
    try:
        positive_int("--rounds", args.rounds)
        positive_int("--rank", args.rank)
        if args.warmup < 0:
            raise UsageError(f"--warmup must be >= 0, got {args.warmup}")
        if args.json:
            writable_file("--json", args.json)
    except UsageError as e:
        return print_error(f"{PROG} bench load", e)
    report = run_load_bench(args.model, args.rounds, args.warmup, args.rank)
    print_load_report(report)
    if args.json:
        strict_json.write(report, args.json, indent=1)
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "load",
        help="vLLM load stage: in-memory update vs PEFT directory, real engine, tiny model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="glm-4.5", choices=sorted(registry().models), help="registered model family")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5, help="timed updates per path (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed updates per path first")
    p.add_argument("--json", default=None, help="write the report as JSON")
    p.set_defaults(func=_cmd_bench_load)
