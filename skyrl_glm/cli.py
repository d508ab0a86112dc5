"""``skyrl-glm`` command line: models, tiny checkpoints, the handoff check, benchmarks, training."""

from __future__ import annotations

import argparse

# Exit order: vLLM stops its engine processes from weakref.finalize callbacks, and multiprocessing's atexit hook
# joins child processes. atexit runs the last-registered hook first, so multiprocessing's must be registered before
# the first finalize (a tempfile.TemporaryDirectory, vLLM) or exit waits forever on the engine. Importing torch did
# this as a side effect; the parser no longer imports torch, so do it here (10 ms).
import multiprocessing.util  # noqa: F401
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from skyrl_glm import quiet
from skyrl_glm.plugins import registry
from skyrl_glm.usage import PROG, UsageError, name_list, print_error, writable_dir

console = Console(width=140)


def _cmd_models(args: argparse.Namespace) -> int:
    table = Table(title="registered model adapters")
    for col in ("name", "model_type", "summary", "key facts", "default LoRA targets (vllm)"):
        table.add_column(col)
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


class _Parser(argparse.ArgumentParser):
    """Argument errors as one line (argparse prints the whole usage first); subcommand parsers inherit this."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(print_error(self.prog, f"{message} (see --help)"))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

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

    for module in _command_modules():
        module.add_parser(sub)
    return parser


# Subcommands that live beside the code they run (each module has ``add_parser(subparsers)``).
def _command_modules() -> list:
    from skyrl_glm import recipes_cli
    from skyrl_glm.bench import cli as bench_cli
    from skyrl_glm.check import cli as check_cli
    from skyrl_glm.check import matrix as check_matrix
    from skyrl_glm.dapo import cli as dapo_cli
    from skyrl_glm.skyrl import cli as train_cli

    return [check_cli, check_matrix, bench_cli, train_cli, recipes_cli, dapo_cli]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet.configure(args.verbose)
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        return print_error(PROG, e)


if __name__ == "__main__":
    sys.exit(main())
