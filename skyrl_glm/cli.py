"""``skyrl-glm`` command line: only the wiring. Each domain's commands live beside the code they run (models,
the handoff check, benchmarks, SkyRL training and recipes, DAPO data and reports); this module builds the one
parser from them and prints a bad input as one line."""

from __future__ import annotations

import argparse

# Exit order: vLLM stops its engine processes from weakref.finalize callbacks, and multiprocessing's atexit hook
# joins child processes. atexit runs the last-registered hook first, so multiprocessing's must be registered before
# the first finalize (a tempfile.TemporaryDirectory, vLLM) or exit waits forever on the engine. Importing torch did
# this as a side effect; the parser no longer imports torch, so do it here (10 ms).
import multiprocessing.util  # noqa: F401
import sys
from collections.abc import Sequence

from skyrl_glm import quiet
from skyrl_glm.usage import PROG, UsageError, print_error

DESCRIPTION = "skyrl-glm command line: models, tiny checkpoints, the handoff check, benchmarks, training."


class _Parser(argparse.ArgumentParser):
    """Argument errors as one line (argparse prints the whole usage first); subcommand parsers inherit this."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(print_error(self.prog, f"{message} (see --help)"))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=DESCRIPTION)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    for module in _command_modules():
        module.add_parser(sub)
    return parser


# Subcommands that live beside the code they run (each module has ``add_parser(subparsers)``).
def _command_modules() -> list:
    from skyrl_glm.bench import cli as bench_cli
    from skyrl_glm.check import cli as check_cli
    from skyrl_glm.check import matrix as check_matrix
    from skyrl_glm.dapo import cli as dapo_cli
    from skyrl_glm.models import cli as models_cli
    from skyrl_glm.skyrl import cli as train_cli
    from skyrl_glm.skyrl import recipes_cli

    return [models_cli, check_cli, check_matrix, bench_cli, train_cli, recipes_cli, dapo_cli]


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with a command's ``key=value`` overrides taken wherever they stand among its flags
    (argparse ends a positional list at the first flag: ``train R --dry-run k=v`` would refuse ``k=v``)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(a.startswith("-") or "=" not in a for a in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    engine_log = quiet.configure(args.verbose)
    try:
        code = int(args.func(args) or 0)
    except UsageError as e:
        code = print_error(PROG, e)
    quiet.finish(engine_log, code)
    return code


if __name__ == "__main__":
    sys.exit(main())
