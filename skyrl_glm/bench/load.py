"""``skyrl-glm bench load``: the vLLM load stage, in memory vs from disk, where vLLM runs here.

``bench sync`` moves a synthetic full-size adapter that no engine can load; this command measures what comes after
the bytes arrive, with a real engine: vLLM's build on this machine (its CPU build in CI), a registered family's tiny
checkpoint (a few layers, small widths) and an HF + PEFT trainer on it with the family's LoRA targets for that
device (the check's trainer and sampler). One engine; updates alternate between

* ``memory`` (ours): plan -> the ``cpu`` transport -> the worker's verified receive -> ``add_lora`` of the staged
  ``skyrl-memory://`` adapter -> atomic swap (``receive_s`` is the worker RPC: transfer, verify, rebuild);
* ``disk``: SkyRL's file path, a PEFT directory written (``write_s``) and read by vLLM the standard way.

``load`` is the engine's part in both (``load_s``: ``add_lora`` and the swap). The first ``--warmup`` updates of each
path are dropped; the table reports medians.

``--config full --layers N`` (vLLM's GPU build) loads a full-width GLM-5.3 adapter instead: the Megatron-Bridge
export of a rank-``--rank`` adapter over N full-size MoE layers (hidden 6144, 256 experts, one adapter shared by a
layer's experts), served by an engine whose weights vLLM fills itself (``load_format="dummy"``: the load stage
depends on shapes, not values). In memory the update goes over CUDA IPC (each shared tensor sent once, the
per-expert names rebuilt as views); the disk path writes every public name. Each update is timed to the first
request served on the new version (``first_request_s``), and every stage is extrapolated linearly to GLM-5.3's 75
MoE layers (fixed costs included, so an over-estimate).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from skyrl_glm import strict_json
from skyrl_glm.bench.full_width import NO_ADAPTER, full_width_model, publish_to_first_request
from skyrl_glm.check.runner import check_device
from skyrl_glm.plugins import registry
from skyrl_glm.provenance import provenance
from skyrl_glm.sync.transports import GPU_LOCAL, HOST_LOCAL, open_transport
from skyrl_glm.usage import PROG, UsageError, positive_int, print_error, writable_dir, writable_file

TINY_MAX_LAYERS = 128  # a deepened tiny checkpoint (a few MB a layer on the CPU)
STAGES = {"memory": ("plan_s", "receive_s", "load_s", "total_s"), "disk": ("write_s", "load_s", "total_s")}


def _memory_row(t: dict[str, float]) -> dict[str, float]:
    plan = sum(t.get(k, 0.0) for k in ("dedup_s", "pack_s", "fold_s", "checksum_s", "manifest_s"))
    return {"plan_s": plan, "receive_s": t["receive_rpc_s"], "load_s": t["load_s"], "total_s": t["total_s"]}


def run_load_bench(
    model: str, rounds: int, warmup: int, rank: int, device: str = "cpu", layers: int | None = None
) -> dict[str, Any]:
    """Alternate in-memory and disk updates on one engine; every update must be accepted. ``layers``: the tiny
    checkpoint deepened to that many decoder layers (what grows with the engine's LoRA modules shows)."""
    from skyrl_glm.check.probes import make_probes
    from skyrl_glm.check.runner import TINY_SEED, CheckOptions, build, prepare, tiny_model_dir
    from skyrl_glm.models.tiny import make_tiny
    from skyrl_glm.sync.publisher import DiskPublisher

    transport = HOST_LOCAL if device == "cpu" else GPU_LOCAL
    options = CheckOptions(model=model, transport=transport, rank=rank, alpha=2 * rank, device=device)
    plan = prepare(options)
    runs: dict[str, list[dict[str, float]]] = {"memory": [], "disk": []}
    with tempfile.TemporaryDirectory(prefix="skyrl-glm-bench-load-") as tmp:
        options.workdir = tmp
        if layers is not None:
            model_dir, kept = make_tiny(plan.family, Path(tmp) / "deep", seed=TINY_SEED, layers=layers), False
        else:
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
        "command": f"skyrl-glm bench load --model {model} --device {device} --rank {rank}"
        + (f" --layers {layers}" if layers is not None else ""),
        **provenance(),
        "model": plan.family.name,
        "layers": layers,  # None: the tiny checkpoint's own
        "device": device,
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


def run_full_load_bench(layers: int, rounds: int, warmup: int, rank: int) -> dict[str, Any]:
    """In-memory (CUDA IPC) vs disk updates of a full-width GLM-5.3 adapter on one GPU engine, each timed to the
    first request served on it."""
    from skyrl_glm.bench.synthetic import BenchOptions, synthetic_adapter
    from skyrl_glm.check.scorers import _engine_lora_rank
    from skyrl_glm.lora.bridge import adapter_config
    from skyrl_glm.sync.publisher import DiskPublisher, InMemoryPublisher
    from skyrl_glm.sync.vllm.engine import VllmEngineSampler

    family = registry().model("glm-5.3")
    syn = synthetic_adapter(BenchOptions(model="glm-5.3", config="full", layers=layers, rank=rank), device="cuda")
    unique = syn.unique
    adapter = {name: unique[key] for name, key in syn.names.items()}
    config = adapter_config(rank, 2 * rank, syn.targets)
    runs: dict[str, list[dict[str, float]]] = {"memory": [], "disk": []}
    with tempfile.TemporaryDirectory(prefix="skyrl-glm-bench-load-") as tmp:
        model_dir = full_width_model(Path(tmp) / "model", layers)
        t0 = time.perf_counter()
        engine = {
            "model": str(model_dir),
            "load_format": "dummy",
            "skip_tokenizer_init": True,
            "dtype": "bfloat16",
            "lora_target_modules": family.lora.vllm_modules(syn.targets),
            "gpu_memory_utilization": 0.85,
        }
        sampler = VllmEngineSampler(engine, max_lora_rank=_engine_lora_rank(rank))
        engine_s = time.perf_counter() - t0
        transport = open_transport(GPU_LOCAL)
        publishers = {
            "memory": InMemoryPublisher(sampler, transport, shared_storage=True),
            "disk": DiskPublisher(sampler, root=Path(tmp) / "adapters"),
        }
        try:
            version = 0
            for _ in range(warmup + rounds):
                for path, publisher in publishers.items():
                    version += 1
                    served = publish_to_first_request(sampler, publisher, adapter, config, version, repeat=False)
                    t = served.result.timings
                    row = _memory_row(t) if path == "memory" else {k: t[k] for k in STAGES["disk"]}
                    row["first_request_s"] = served.first_s
                    runs[path].append(row)
        finally:
            transport.release()
            sampler.close()
    timed = {path: rows[warmup:] for path, rows in runs.items()}
    medians = {p: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for p, rows in timed.items()}
    moe_layers = int(family.facts["num_hidden_layers"]) - int(family.facts["first_k_dense_replace"])
    return {
        "command": f"skyrl-glm bench load --device cuda --config full --layers {layers} --rank {rank}",
        "model": "glm-5.3",
        "config": "full",
        "moe_layers": layers,
        "targets": syn.targets,
        "rank": rank,
        "public_tensors": len(adapter),
        "unique_tensors": len(unique),
        "public_bytes": sum(t.numel() * t.element_size() for t in adapter.values()),
        "unique_bytes": sum(t.numel() * t.element_size() for t in unique.values()),
        "engine_start_s": engine_s,
        "rounds": rounds,
        "warmup": warmup,
        "medians_s": medians,
        "extrapolated_s": {p: {k: v / layers * moe_layers for k, v in m.items()} for p, m in medians.items()},
        "extrapolated_to_moe_layers": moe_layers,
        **provenance(),
        "runs": runs,
    }


def print_load_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    med = report["medians_s"]
    full = report.get("config") == "full"
    size = f"{report['moe_layers']} full-size MoE layers" if full else "tiny"
    table = Table(
        title=f"vLLM load stage: {report['model']} ({size}), rank {report['rank']}, "
        f"{report['public_tensors']} public tensors; median of {report['rounds']}"
    )
    table.add_column("stage")
    table.add_column("memory (skyrl-glm)", justify="right")
    table.add_column("disk (PEFT dir)", justify="right")
    if full:
        n = report["extrapolated_to_moe_layers"]
        table.add_column(f"memory, x{n} layers", justify="right")
        table.add_column(f"disk, x{n} layers", justify="right")
    stages = ("plan_s", "receive_s", "write_s", "load_s", "total_s", "first_request_s")
    for stage in stages:
        if not any(stage in med[p] for p in med):
            continue
        cells = [f"{med[p][stage] * 1e3:.1f} ms" if stage in med[p] else "-" for p in ("memory", "disk")]
        if full:
            ext = report["extrapolated_s"]
            cells += [f"{ext[p][stage]:.2f} s" if stage in ext[p] else "-" for p in ("memory", "disk")]
        table.add_row(stage.removesuffix("_s"), *cells)
    Console().print(table)


def _layer_counts(text: str) -> list[int]:
    """``--layers``: one count, or several comma-separated (``2,4,6``), each >= 1."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--layers {text!r}: give MoE layer counts, comma-separated (2,4,6)") from None
    if not counts:
        raise UsageError("--layers needs at least one MoE layer count")
    for count in counts:
        positive_int("--layers", count)
    return counts


def _layouts(text: str | None) -> list[str] | None:
    from skyrl_glm.sync.expert_layout import LAYOUTS, LayoutError, check_layout

    if text is None:
        return None
    chosen = [x for x in text.split(",") if x]
    try:
        if not chosen or len(set(chosen)) < len(chosen):
            raise LayoutError("none, or one twice")
        return [x if x == NO_ADAPTER else check_layout(x) for x in chosen]
    except LayoutError:
        raise UsageError(
            f"--layouts {text!r}: each once, from {','.join(LAYOUTS)} (G: groups per layer; {NO_ADAPTER}: an engine "
            "without LoRA, for --decode)"
        ) from None


def _batches(text: str | None) -> list[int] | None:
    """``--decode`` batch sizes: comma-separated positive integers, at most 1024 each."""
    if text is None:
        return None
    try:
        batches = [int(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"--decode {text!r}: give comma-separated batch sizes, e.g. 1,32,256") from None
    if not batches or not all(0 < b <= 1024 for b in batches):
        raise UsageError(f"--decode {text!r}: every batch size in 1..1024")
    return batches


def _sync_reports(text: str | None) -> list[dict[str, Any]] | None:
    """The ``--sync-json`` files, each read now (a bad one is refused before any engine starts): ``bench sync``
    reports with our path's stages, at most one per expert grouping."""
    if text is None:
        return None
    from skyrl_glm.bench.load_layouts import sync_groups

    reports, seen = [], {}
    for path in text.split(","):
        try:
            report = json.loads(Path(path).read_text())
            ours = report["paths"]["ours"]
            float(ours["total_s"]), dict(ours["stages_s"])
            groups = sync_groups(report)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise UsageError(f"--sync-json {path}: not a bench sync --json report ({type(e).__name__}: {e})") from None
        if groups in seen:
            raise UsageError(f"--sync-json: {seen[groups]} and {path} both send {groups} expert group(s) per layer")
        seen[groups] = path
        reports.append(report)
    return reports


def _cmd_bench_load(args: argparse.Namespace) -> int:
    try:
        positive_int("--rounds", args.rounds)
        positive_int("--rank", args.rank)
        layers = _layer_counts(args.layers or "2")
        layouts = _layouts(args.layouts)
        if args.config == "tiny" and args.layers is not None and max(layers) > TINY_MAX_LAYERS:
            raise UsageError(f"--layers with the tiny checkpoint: decoder layers in 1..{TINY_MAX_LAYERS}")
        decode = _batches(args.decode)
        if not 1 <= args.max_loras <= 16:
            raise UsageError(f"--max-loras must be in 1..16, got {args.max_loras}")
        syncs = _sync_reports(args.sync_json)
        if (decode or args.max_loras != 2) and layouts is None:
            raise UsageError("--decode and --max-loras are measured per layout: add --layouts")
        if layouts is not None and NO_ADAPTER in layouts and not decode:
            raise UsageError("--layouts none (an engine without LoRA) is the --decode baseline: add --decode")
        if args.expert_width is not None and layouts is None:
            raise UsageError("--expert-width narrows the engine of a layout comparison: add --layouts")
        profile_dir = None
        if args.profile_dir is not None:
            if layouts is None:
                raise UsageError("--profile-dir profiles the engines of a layout comparison: add --layouts")
            profile_dir = writable_dir("--profile-dir", args.profile_dir).resolve()
        if args.config == "full":
            from skyrl_glm.bench.synthetic import model_config

            model_config("glm-5.3", "full", max(layers), args.expert_width)  # the layer counts and the width
        check_device(args.device)
        if args.config == "full" and (args.device == "cpu" or args.model not in (None, "glm-5.3")):
            raise UsageError("--config full is a full-width GLM-5.3 on vLLM's GPU build: use --device cuda")
        if args.warmup < 0:
            raise UsageError(f"--warmup must be >= 0, got {args.warmup}")
        if (layouts is not None or args.sync_json or args.plot) and args.config != "full":
            raise UsageError("--layouts, --sync-json and --plot compare layouts at full width: add --config full")
        if layouts is None and len(layers) > 1:
            raise UsageError("several --layers counts are measured per layout: add --layouts")
        for option, path in (("--json", args.json), ("--plot", args.plot)):
            if path:
                writable_file(option, path)
    except UsageError as e:
        return print_error(f"{PROG} bench load", e)
    if layouts is not None:
        from rich.console import Console

        from skyrl_glm.bench.load_layouts import plot_layout_report, print_layout_report, run_layout_bench
        from skyrl_glm.phases import Phases

        def keep(so_far: dict[str, Any]) -> None:  # what is measured stays on disk if the run is stopped midway
            if args.json:
                strict_json.write(so_far, args.json, indent=1)

        if profile_dir is not None:
            profile_dir.mkdir(parents=True, exist_ok=True)
        with Phases(Console(stderr=True), prefix="bench load") as phases:
            report = run_layout_bench(
                layers, layouts, args.rounds, args.warmup, args.rank, syncs, args.max_loras, decode,
                progress=phases.line, after_layout=keep, expert_width=args.expert_width,
                profile_dir=profile_dir,
            )  # fmt: skip
        print_layout_report(report)
        if args.plot:
            plot_layout_report(report, args.plot)
        if args.json:
            strict_json.write(report, args.json, indent=1)
        return 0
    if args.config == "full":
        report = run_full_load_bench(layers[0], args.rounds, args.warmup, args.rank)
    else:
        tiny_layers = layers[0] if args.layers is not None else None
        report = run_load_bench(args.model or "glm-4.5", args.rounds, args.warmup, args.rank, args.device, tiny_layers)
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
    p.add_argument(
        "--model", default=None, choices=sorted(registry().models), help="registered model family (default glm-4.5)"
    )
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (the engine's and the trainer's device)")
    p.add_argument("--config", default="tiny", choices=("tiny", "full"), help="full: full-width GLM-5.3 (GPU)")
    p.add_argument(
        "--layers",
        default=None,
        help="MoE layers of the full-width model (default 2; with --layouts several: 2,4,6); with the tiny "
        "checkpoint its decoder layers (e.g. 78: GLM-5.3's depth, to see what grows with the engine's LoRA modules)",
    )
    p.add_argument(
        "--layouts",
        default=None,
        help="full width: compare routed-expert layouts, one engine each (e.g. per-expert,shared-all,grouped:4,"
        "grouped:64; none: an engine without LoRA, the --decode baseline)",
    )
    p.add_argument("--max-loras", type=int, default=2, help="with --layouts: resident adapter versions per engine")
    p.add_argument(
        "--decode",
        default=None,
        help="with --layouts: decode tokens/s at these batch sizes (e.g. 1,32,256), adapter on and off, CUDA graphs",
    )
    p.add_argument(
        "--sync-json",
        default=None,
        help="bench sync --json reports, comma-separated, one per --expert-groups: adds the end-to-end handoff rows",
    )
    p.add_argument(
        "--expert-width",
        type=int,
        default=None,
        help="with --layouts: the routed experts' intermediate size narrowed (e.g. 64), so that all 75 MoE layers "
        "fit on one GPU and the engine side is measured at 75 (names, modules and other widths as GLM-5.3's)",
    )
    p.add_argument("--plot", default=None, help="with --layouts: write the fit and slot-memory PNG here")
    p.add_argument(
        "--profile-dir",
        default=None,
        help="with --layouts: each engine's worker writes a cProfile of its updates here (<layout>.prof); with "
        "--decode also the GPU kernels of one more decode round per batch (in the report's decode_kernels)",
    )
    p.add_argument("--rounds", type=int, default=5, help="timed updates per path (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed updates per path first")
    p.add_argument("--json", default=None, help="write the report as JSON")
    p.set_defaults(func=_cmd_bench_load)
