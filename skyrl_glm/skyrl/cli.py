"""``skyrl-glm train RECIPE [key=value ...]``: SkyRL's training loop with skyrl-glm's sync and check.

Only argparse here: the training stack (torch, Ray, SkyRL, vLLM) is imported when the command runs.
"""

from __future__ import annotations

import argparse
from typing import Any


def _cmd_train(args: argparse.Namespace) -> int:
    if args.dry_run:
        from skyrl_glm.skyrl.recipes_cli import dry_run

        return dry_run(args.recipe, args.overrides, show_config=args.show_config or args.verbose)
    from skyrl_glm.skyrl.run.launch import run_command

    return run_command([args.recipe, *args.overrides], verbose=args.verbose)


def add_parser(sub: Any) -> None:
    train = sub.add_parser(
        "train",
        help="train with SkyRL's loop, skyrl-glm's LoRA sync and the handoff check (recipe + key=value overrides)",
        description=(
            "RECIPE is a YAML file or a packaged recipe name (e.g. tiny_cpu_grpo); key=value overrides any key of "
            "SkyRL's config or the skyrl_glm section. Prints one line per step and where the outputs are; the full "
            "log goes to a file in trainer.log_path. Exit 0: trained; 1: stopped by the handoff check; 2: cannot "
            "start as given (bad input, missing data, GPUs Ray lacks); 3: failed after it started "
            "(docs/exit-codes.md)."
        ),
    )
    train.add_argument("recipe", metavar="RECIPE")
    train.add_argument("overrides", nargs="*", metavar="key=value")
    train.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would run (hardware, layout, data, launch lines); start nothing",
    )
    train.add_argument("--show-config", action="store_true", help="with --dry-run: the full resolved config too")
    # SUPPRESS: an unset -v here keeps the top-level `skyrl-glm -v train ...` instead of overwriting it
    train.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="SkyRL's, Ray's and vLLM's log lines on the terminal too (they always go to the run's log file)",
    )
    train.set_defaults(func=_cmd_train)
