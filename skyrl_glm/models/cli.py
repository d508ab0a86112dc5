"""``skyrl-glm models``, ``tiny make`` and ``sizes``: the registered model families, their tiny checkpoints and
their adapters' public vs unique size. Parser building reads the registry only (no torch)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from skyrl_glm import terminal
from skyrl_glm.plugins import registry
from skyrl_glm.usage import name_list, writable_dir

console = terminal.console()


def _cmd_models(args: argparse.Namespace) -> int:
    table = Table(title="registered model adapters")
    for col in ("name", "model_type", "summary", "key facts", "default LoRA targets (vllm)"):
        table.add_column(col, overflow="fold")
    for fam in registry().models.values():
        table.add_row(fam.name, fam.hf_model_type, fam.summary, fam.key_facts(), ", ".join(fam.lora.resolve()))
    console.print(table)
    return 0


def _cmd_tiny_make(args: argparse.Namespace) -> int:
    from skyrl_glm.models.tiny import make_tiny

    family = registry().model(args.model)
    out = make_tiny(family, writable_dir("tiny make", args.outdir), seed=args.seed)
    console.print(f"wrote tiny [bold]{args.model}[/] checkpoint to {out}")
    return 0


def _cmd_sizes(args: argparse.Namespace) -> int:
    from skyrl_glm.lora.sizes import family_sizes, print_sizes_table

    family = registry().model(args.model)
    targets = name_list("--lora-targets", args.lora_targets)
    rows = [family_sizes(family, full=not args.tiny, rank=args.rank, targets=targets)]
    print_sizes_table(rows, console)
    return 0


def add_parser(sub: Any) -> None:
    sub.add_parser("models", help="list registered model adapters").set_defaults(func=_cmd_models)

    tiny = sub.add_parser("tiny", help="tiny random-weight checkpoints").add_subparsers(dest="tiny_cmd", required=True)
    make = tiny.add_parser("make", help="write a tiny checkpoint + tokenizer for a registered model family")
    make.add_argument("model", choices=sorted(registry().models))
    make.add_argument("outdir")
    make.add_argument("--seed", type=int, default=0)
    make.set_defaults(func=_cmd_tiny_make)

    sizes = sub.add_parser("sizes", help="public vs unique adapter tensors and bytes, from config shapes only")
    sizes.add_argument("model", nargs="?", default="glm-5.3", choices=sorted(registry().models))
    sizes.add_argument("--rank", type=int, default=32)
    sizes.add_argument("--tiny", action="store_true", help="the tiny config instead of the full one")
    sizes.add_argument(
        "--lora-targets",
        help="LoRA targets, comma-separated: qualified, PEFT short (q_a_proj) or Megatron (linear_fc1)",
    )
    sizes.set_defaults(func=_cmd_sizes)
