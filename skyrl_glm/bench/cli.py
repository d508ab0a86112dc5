"""``skyrl-glm bench sync``: SkyRL 0.4.0's LoRA sync, ours, and the disk baseline, side by side in one run.

A synthetic adapter in Megatron-Bridge's export shape (:func:`skyrl_glm.lora.bridge.bridge_export_specs`: every
routed expert name carries the layer's shared adapter, fused ``linear_fc1`` A under both gate and up) is built for a
registered model's full or tiny config, then moved three ways:

* ``skyrl``: SkyRL 0.4.0's in-memory path, in the order of its ``LoraAdapterSource.prepare`` (dedupe the export
  stream with ``dedupe_shared_expert_adapters``, then ``fold_lora_alpha_for_vllm`` over what is sent), the sent
  tensors over the same packed transport as ours (SkyRL hands them to vLLM's transfer engine, which this benchmark
  does not have), ``expand_lora_aliases`` on the receiver. No checksums, no verification.
* ``ours``: :func:`~skyrl_glm.sync.plan.build_plan` + a transport + :class:`~skyrl_glm.sync.receiver.AdapterReceiver`;
  after the first update the manifest names the accepted layout by its digest, as the publisher does.
* ``disk``: SkyRL's file path: fold over the public dict, ``safetensors`` save of every public name, load back onto
  the receiver's device.

``--exporter bridge-stream`` starts each sync one step earlier, from the model's live adapter: every path pulls
the bridge's export afresh (:meth:`~skyrl_glm.bench.sides.Sender.export`, the stream ``export_adapter_weights(...,
cpu=False)`` yields, on the sender's device, ``--copies`` for a gather per name), and the ``export`` stage is the
time spent inside the exporter. ``ours`` is then the Megatron sync's rank 0
(:func:`~skyrl_glm.skyrl.workers.megatron.unique_adapter`: dedup as the stream arrives), ``skyrl`` SkyRL 0.4.0's memory
path (``dedupe_shared_expert_adapters`` over the same stream, then its rank-scale and alpha folds), ``disk`` its
file path (the export gathered to the host, ``cpu=True``).

The receiver side checks, outside the timed stages, that every public name came back bit-exactly equal to the
sender's tensor after the alpha fold (it regenerates the synthetic values from the seed). The cpu transport runs
sender and receiver in one process; nccl and ipc use two processes (``torch.multiprocessing.spawn``) with a
``TCPStore`` as the JSON control channel. vLLM loading is not part of this command (there is no base model for a
synthetic adapter): the ``load`` stage is reported as skipped with the reason; ``skyrl-glm bench load`` measures it
with a real engine and a tiny checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any

from skyrl_glm import strict_json
from skyrl_glm.bench import load as load_bench
from skyrl_glm.plugins import registry
from skyrl_glm.sync.transports import HOST_LOCAL
from skyrl_glm.usage import PROG, UsageError, print_error, writable_dir, writable_file

DTYPE_CHOICES = ("bf16", "bfloat16", "fp16", "fp32")
EXPORTERS = ("resident", "bridge-stream", "bridge")
# Upper bounds: past them a typo allocates for hours. vLLM's largest max_lora_rank is 512; torch seeds are 64-bit.
MAX_RANK = 512
MAX_ROUNDS = 1000
MAX_BUCKET_MB = 1 << 16
MAX_SEED = 2**63 - 1


def argument_error(args: argparse.Namespace) -> str | None:
    """The first problem with the arguments, found before any work (or None); imports nothing heavy."""
    for flag, value, least, most in (
        ("--rank", args.rank, 1, MAX_RANK),
        ("--repeat", args.repeat, 1, MAX_ROUNDS),
        ("--warmup", args.warmup, 0, MAX_ROUNDS),
        ("--bucket-mb", args.bucket_mb, 0, MAX_BUCKET_MB),
        ("--seed", args.seed, 0, MAX_SEED),
    ):
        if value < least:
            return f"{flag} must be >= {least}, got {value}"
        if value > most:
            return f"{flag} must be <= {most}, got {value}"
    if args.alpha is not None and not (math.isfinite(args.alpha) and args.alpha > 0):
        return f"--alpha must be a finite number > 0, got {args.alpha}"
    if not 1 <= args.expert_groups <= 1 << 16:
        return f"--expert-groups must be in 1..65536, got {args.expert_groups}"
    if args.expert_groups > 1 and not args.share_experts:
        return "--expert-groups: groups share adapters; drop --no-share-experts"
    if args.layers is not None and args.layers < 1:
        return f"--layers must be >= 1, got {args.layers}"
    if args.exporter == "bridge":
        from skyrl_glm.bench.bridge_model import exporter_problem

        if problem := exporter_problem(args):
            return problem
    if args.exporter == "bridge-stream" and not args.share_experts:
        return "--exporter bridge-stream: the bridge shares one adapter across experts here (drop --no-share-experts)"
    family = registry().model(args.model)
    if args.config == "full" and family.full_config is None:
        return f"--config full: model family {args.model!r} has no full config (use --config tiny)"
    if args.expert_groups > 1:  # the config's expert count (transformers, only when asked)
        from skyrl_glm.lora.bridge import text_config

        experts = getattr(text_config(family.config(args.config)), "n_routed_experts", 0) or 0
        if experts % args.expert_groups:
            return f"--expert-groups {args.expert_groups}: the model's {experts} routed experts make no equal groups"
    try:
        for flag, path in (("--json", args.json), ("--plot", args.plot)):
            if path:
                writable_file(flag, path)
        if args.disk_dir:
            writable_dir("--disk-dir", args.disk_dir)
    except UsageError as e:
        return str(e)
    return None


def _cmd_bench_sync(args: argparse.Namespace) -> int:
    error = argument_error(args)
    if error is not None:
        return print_error(f"{PROG} bench sync", error)
    from skyrl_glm.bench.report import plot_report, print_report
    from skyrl_glm.bench.run import run_sync_bench
    from skyrl_glm.bench.synthetic import BenchOptions, model_config

    opts = BenchOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(BenchOptions)})
    try:  # the devices and the layer count, still before any work
        opts = opts.resolved()
        model_config(opts.model, opts.config, opts.layers)
    except UsageError as e:
        return print_error(f"{PROG} bench sync", e)
    report = run_sync_bench(opts)
    print_report(report)
    if args.json:
        strict_json.write(report, args.json, indent=1)
    if args.plot:
        plot_report(report, args.plot)
    return 0 if all(p["bit_exact"] for p in report["paths"].values()) else 1


def add_parser(subparsers: Any) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks")
    sub = bench.add_subparsers(dest="bench_cmd", required=True)
    p = sub.add_parser(
        "sync",
        help="LoRA sync: SkyRL 0.4.0's path vs skyrl-glm's vs disk, one run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="glm-5.3", choices=sorted(registry().models), help="registered model family")
    p.add_argument("--config", choices=("tiny", "full"), default="tiny")
    p.add_argument("--layers", type=int, default=None, help="keep only the first N MoE layers (fits a CPU)")
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--alpha", type=float, default=None, help="lora_alpha (default 2 * rank)")
    p.add_argument("--dtype", default="bf16", choices=DTYPE_CHOICES)
    p.add_argument(
        "--share-experts",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="one adapter for all routed experts of a layer (Bridge share_expert_adapters)",
    )
    p.add_argument(
        "--expert-groups",
        type=int,
        default=1,
        help="with --share-experts: one adapter per group of E/G consecutive experts (Bridge under EP G)",
    )
    p.add_argument("--copies", action="store_true", help="exporter hands out a separate copy under every name")
    p.add_argument(
        "--exporter",
        choices=EXPORTERS,
        default="resident",
        help="resident: the public adapter already on the device; bridge-stream: exported afresh per sync as "
        "Megatron-Bridge's export_adapter_weights(cpu=False) streams it, export timed (a stand-in from the config's "
        "shapes); bridge: Megatron-Bridge's own export of a model it builds on the GPU (--transport cpu)",
    )
    p.add_argument("--transport", choices=sorted(registry().transports), default=HOST_LOCAL)
    p.add_argument("--device", default=None, help="sender device (default cuda:0 for nccl/ipc when present, else cpu)")
    p.add_argument("--recv-device", default=None, help="receiver device (nccl: cuda:1; ipc/cpu: the sender's)")
    p.add_argument("--bucket-mb", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1, help="timed rounds per in-memory path (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--disk", action=argparse.BooleanOptionalAction, default=True, help="run the disk baseline")
    p.add_argument("--disk-dir", default=None, help="where the disk baseline writes (default a temp dir)")
    p.add_argument("--json", default=None, help="write the report as JSON")
    p.add_argument("--plot", default=None, help="write a PNG of the stage times (needs matplotlib)")
    p.set_defaults(func=_cmd_bench_sync)
    load_bench.add_parser(sub)


def main(argv: list[str] | None = None) -> int:
    """``python -m skyrl_glm.bench.cli sync ...`` (the same command as ``skyrl-glm bench sync``)."""
    parser = argparse.ArgumentParser(prog="skyrl-glm bench")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["bench", *(argv if argv is not None else __import__("sys").argv[1:])])
    return int(args.func(args) or 0)
