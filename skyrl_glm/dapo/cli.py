"""``skyrl-glm data prepare`` and ``skyrl-glm report``: the DAPO-math data and eval commands.

Parser building imports nothing heavy; ``datasets``, pyarrow and matplotlib are imported inside the commands.
Bad input raises :class:`~skyrl_glm.usage.UsageError` (``DataError``, ``ReportError``): one line, exit 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

from skyrl_glm import terminal
from skyrl_glm.usage import UsageError, writable_file

console = terminal.console(soft_wrap=True)


def _cmd_data_prepare(args: argparse.Namespace) -> int:
    from skyrl_glm.dapo.data import DataError, prepare

    if not args.verbose:  # `datasets` logs a load failure itself; the one error line says it
        from datasets.utils import logging as datasets_logging

        datasets_logging.set_verbosity(logging.CRITICAL)
    try:
        out = prepare(args.dataset, args.input, Path(args.output), limit=args.limit)
    except DataError:
        raise
    except FileNotFoundError as e:
        raise DataError(str(e)) from None
    except Exception as e:  # a datasets id that cannot be fetched, a corrupt parquet: one line, not a traceback
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{args.input}: cannot load ({type(e).__name__}: {first})") from None
    kept = out.unique_prompts - out.conflicts_dropped
    limited = f", the first {out.rows_out} kept (--limit)" if out.rows_out < kept else ""
    console.print(
        f"{out.rows_in} rows in, {out.unique_prompts} unique prompts, {out.conflicts_dropped} dropped for "
        f"conflicting answers{limited}: wrote {out.rows_out} prompts to {out.path}",
        highlight=False,
    )
    return 0


def _png_file(path: str | Path, inputs: list[Path]) -> Path:
    """Where a plot goes: a writable ``.png`` that is none of the inputs (matplotlib picks the format by suffix)."""
    png = writable_file("--png", path, inputs)
    if png.suffix.lower() != ".png":
        raise UsageError(f"--png {path}: the plot is a PNG; give a path ending in .png")
    return png


def _canary_report(args: argparse.Namespace) -> int:
    """Per-step tables of several runs, one row per run (steps, the checks' verdict, agree checks passed, reward
    first -> last, generation KL), and their curves in one PNG (e.g. memory, disk, no-publish)."""
    from skyrl_glm.canary.curves import (
        plot_rewards,
        print_runs,
        print_step_table,
        read_summary,
        run_name,
        summary_file,
    )

    if args.run is not None:
        raise UsageError("report: give either RUN (eval dumps) or --canary RUN_SUMMARY ..., not both")
    if not args.png:
        raise UsageError("report --canary: --png PATH is required (where the curves go)")
    inputs = [summary_file(path) for path in args.canary]
    json_path = writable_file("--json", args.json, inputs) if args.json else None
    png = _png_file(args.png, inputs)
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("the PNG needs matplotlib: pip install 'skyrl-glm[plot]'")
    summaries = [read_summary(path) for path in args.canary]
    for summary in summaries:
        print_step_table(summary, console)
    names = [run_name(path) for path in args.canary]
    print_runs(summaries, console, names)
    if json_path is not None:
        json_path.write_text(json.dumps([s["steps"] for s in summaries], indent=2))
        console.print(f"wrote {json_path}", highlight=False)
    console.print(f"wrote {plot_rewards(summaries, png, names)}", highlight=False)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from skyrl_glm.dapo.report import collect, default_png, dump_files, plot, print_table, to_json

    if args.canary:
        return _canary_report(args)
    if args.run is None:
        raise UsageError("report: give RUN (the run's trainer.export_path) or --canary RUN_SUMMARY ...")
    run = Path(args.run)
    # both outputs are checked before anything is read or printed: a report is never cut short after its table
    inputs = dump_files(run)
    json_path = writable_file("--json", args.json, inputs) if args.json else None
    png = _png_file(args.png or default_png(run), inputs)
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("the PNG needs matplotlib: pip install 'skyrl-glm[plot]'")
    points = collect(run)
    print_table(points, console)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)  # writable_file checked that it can be made
        json_path.write_text(json.dumps(to_json(points), indent=2))
        console.print(f"wrote {json_path}", highlight=False)
    console.print(f"wrote {plot(points, png)}", highlight=False)
    return 0


def add_parser(sub: Any) -> None:
    data = sub.add_parser("data", help="datasets").add_subparsers(dest="data_cmd", required=True)
    prep = data.add_parser("prepare", help="DAPO-Math-17k / AIME 2024 into SkyRL's prompt parquet (env glm_math)")
    prep.add_argument("dataset", choices=("dapo-math", "aime2024"))
    prep.add_argument("--input", required=True, help="a .parquet / .jsonl file, or a datasets id (name[:split])")
    prep.add_argument("--output", required=True, help="output directory")
    prep.add_argument("--limit", type=int, default=None, help="keep the first N prompts")
    prep.set_defaults(func=_cmd_data_prepare)

    report = sub.add_parser("report", help="eval mean@n, pass@n, response length, cap share over steps")
    report.add_argument(
        "run", nargs="?", help="trainer.export_path of the run (holds dumped_evals/), or one eval dump .jsonl"
    )
    report.add_argument(
        "--canary",
        nargs="+",
        metavar="SUMMARY",
        help="instead: per-step tables of these runs (skyrl_glm_summary.json or its trainer.log_path) and their "
        "reward curves in one PNG",
    )
    report.add_argument("--png", help="where to write the plot (default: beside the run's dumps)")
    report.add_argument("--json", help="also write the numbers as JSON")
    report.set_defaults(func=_cmd_report)
