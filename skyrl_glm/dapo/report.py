"""``skyrl-glm report RUN``: the eval numbers the DAPO-math reference run reports, over training steps.

Read from what SkyRL 0.4.0 writes when ``trainer.dump_eval_results=true``:
``<trainer.export_path>/dumped_evals/global_step_<N>_evals/`` holds one ``<data_source>.jsonl`` per eval set (a
record per sample: ``input_prompt``, ``output_response``, ``score``, ``stop_reason``, ...) and
``aggregated_results.jsonl`` (the eval metrics dict, with ``eval/all/generate/avg_num_tokens``). ``RUN`` is that
export path, its ``dumped_evals``, or one ``<data_source>.jsonl`` dump. Per step and eval set: mean@n (the share of
all n samples of every prompt that are right, the pass@1 estimate) and pass@n, both by SkyRL's own
``get_metrics_from_generator_output`` over the dumped rewards (mean@n is its ``mean_positive_reward``: with +1/-1
rewards the share of right samples), the mean response length in tokens, and the share of responses that stopped at
the length cap (``stop_reason == "length"``).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from skyrl_glm.strict_json import finite_number
from skyrl_glm.usage import UsageError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"^global_step_(\d+)_evals$")
AGGREGATED = "aggregated_results.jsonl"
LENGTH_KEY = "eval/all/generate/avg_num_tokens"


class ReportError(UsageError):
    """A run without SkyRL eval dumps, or a dump that does not parse (the message names the file and line)."""


@dataclass(frozen=True)
class EvalPoint:
    """One eval set at one step (``step`` None for a lone dump file outside a ``global_step_<N>_evals`` dir)."""

    step: int | None
    data_source: str
    prompts: int
    samples_per_prompt: float
    accuracy: float
    """mean@n: SkyRL's ``mean_positive_reward`` over all samples (the share of right ones with +1/-1 rewards)."""
    pass_at_n: float
    mean_length: float | None
    """Mean response tokens over all eval sets of the step (SkyRL's ``eval/all/generate/avg_num_tokens``)."""
    cap_share: float
    """Share of samples whose generation stopped at the length cap."""


def find_eval_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, dir) of every dumped eval under ``run_dir`` (the export path, or its ``dumped_evals``), by step."""
    root = run_dir / "dumped_evals" if (run_dir / "dumped_evals").is_dir() else run_dir
    if not root.is_dir():
        raise ReportError(f"{run_dir}: no such directory or eval dump file")
    found = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and child.is_dir():
            found.append((int(m.group(1)), child))
    if not found:
        raise ReportError(
            f"{run_dir}: no SkyRL eval dumps (dumped_evals/global_step_<N>_evals/); "
            "run with trainer.dump_eval_results=true and an eval interval"
        )
    return sorted(found)


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise ReportError(f"{path}: not a file (an eval dump is a .jsonl file)")
    records = []
    try:
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ReportError(f"{path}:{lineno}: not JSON ({e.msg})") from None
                except (ValueError, RecursionError) as e:  # a 5,000-digit number; nesting past Python's stack
                    raise ReportError(f"{path}:{lineno}: not usable JSON ({type(e).__name__}: {e})") from None
                if not isinstance(record, dict):
                    raise ReportError(f"{path}:{lineno}: expected a JSON object")
                records.append((lineno, record))
    except UnicodeDecodeError as e:
        raise ReportError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise ReportError(f"{path}: cannot read ({e.strerror or e})") from None
    return records


def _reward(value: object) -> float | list[float] | None:
    """A dumped ``score``: a finite number (sequence reward) or a non-empty list of them (token rewards)."""
    if (number := finite_number(value)) is not None:
        return number
    if isinstance(value, list) and value:
        numbers = [finite_number(v) for v in value]
        return None if None in numbers else numbers
    return None


def summarise(step: int | None, path: Path, records: list, mean_length: float | None) -> EvalPoint:
    """mean@n, pass@n (SkyRL's functions) and cap share of one eval set's dumped samples."""
    from skyrl.train.generators.utils import get_metrics_from_generator_output

    rewards, uids, capped = [], [], 0
    for lineno, record in records:
        if "input_prompt" not in record or "score" not in record:
            raise ReportError(f"{path}:{lineno}: a record needs input_prompt and score")
        reward = _reward(record["score"])
        if reward is None:
            raise ReportError(f"{path}:{lineno}: score {record['score']!r:.40} is not a number or a list of numbers")
        if rewards and isinstance(reward, list) != isinstance(rewards[0], list):
            raise ReportError(f"{path}:{lineno}: score mixes sequence rewards and token-reward lists")
        rewards.append(reward)
        uids.append(str(record["input_prompt"]))
        capped += record.get("stop_reason") == "length"
    metrics = get_metrics_from_generator_output({"rewards": rewards}, uids)
    prompts = len(set(uids))
    return EvalPoint(
        step=step,
        data_source=path.stem,
        prompts=prompts,
        samples_per_prompt=len(rewards) / prompts,
        accuracy=float(metrics["mean_positive_reward"]),
        pass_at_n=float(metrics["pass_at_n"]),
        mean_length=mean_length,
        cap_share=capped / len(rewards),
    )


def _mean_length(eval_dir: Path) -> float | None:
    aggregated = eval_dir / AGGREGATED
    if not aggregated.is_file():
        return None
    metrics = _read_jsonl(aggregated)
    return finite_number(metrics[0][1].get(LENGTH_KEY)) if metrics else None


def _dump_points(step: int | None, eval_dir: Path, files: list[Path]) -> list[EvalPoint]:
    mean_length = _mean_length(eval_dir)
    points = []
    for path in files:
        records = _read_jsonl(path)
        if records:
            points.append(summarise(step, path, records, mean_length))
    return points


def collect(run: Path) -> list[EvalPoint]:
    """Every (step, eval set) point of a run directory, by step then eval set; or the one point of a dump file."""
    if run.suffix == ".jsonl" and not run.is_dir():
        if not run.exists():
            raise ReportError(f"{run}: no such eval dump file")
        m = _STEP_DIR.match(run.parent.name)
        points = _dump_points(int(m.group(1)) if m else None, run.parent, [run])
    else:
        points = []
        for step, eval_dir in find_eval_dirs(run):
            files = sorted(p for p in eval_dir.glob("*.jsonl") if p.name != AGGREGATED)
            points += _dump_points(step, eval_dir, files)
    if not points:
        raise ReportError(f"{run}: eval dumps hold no samples")
    return points


def dump_files(run: Path) -> list[Path]:
    """The files a report of ``run`` reads (those there now), which its outputs must not overwrite."""
    if run.is_file():
        return [run, run.parent / AGGREGATED]
    root = run / "dumped_evals" if (run / "dumped_evals").is_dir() else run
    return sorted(root.glob("global_step_*_evals/*.jsonl")) if root.is_dir() else []


def default_png(run: Path) -> Path:
    """Where the plot goes without ``--png``: beside the dumps (``RUN/eval_report.png``, ``<dump>.png``)."""
    return run.with_suffix(".png") if run.suffix == ".jsonl" and not run.is_dir() else run / "eval_report.png"


def print_table(points: list[EvalPoint], console) -> None:
    from rich.table import Table

    table = Table(title="eval over training steps (mean@n = pass@1 estimate)")
    for col in ("step", "eval set", "prompts", "n", "mean@n", "pass@n", "mean length (tokens)", "at cap"):
        table.add_column(col, justify="left" if col == "eval set" else "right", overflow="fold")
    for p in points:
        table.add_row(
            "-" if p.step is None else str(p.step),
            p.data_source,
            str(p.prompts),
            f"{p.samples_per_prompt:g}",
            f"{p.accuracy:.1%}",
            f"{p.pass_at_n:.1%}",
            "-" if p.mean_length is None else f"{p.mean_length:,.0f}",
            f"{p.cap_share:.1%}",
        )
    console.print(table)


def figure(points: list[EvalPoint]) -> Figure:
    """mean@n, pass@n, mean response length and cap share over steps, one line per eval set: shares on a 0-100 %
    axis, lengths from 0, whole-step ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    panels = (
        ("mean@n (solid) and pass@n (dashed)", lambda p: 100 * p.accuracy, "%"),
        ("mean response length", lambda p: p.mean_length, "tokens"),
        ("responses at the cap", lambda p: 100 * p.cap_share, "%"),
    )
    sources = sorted({p.data_source for p in points})
    for ax, (title, value, unit) in zip(axes, panels, strict=True):
        for source in sources:
            mine = [p for p in points if p.data_source == source]
            series = [(p.step or 0, value(p)) for p in mine if value(p) is not None]
            if series:
                xs, ys = zip(*series, strict=True)
                (line,) = ax.plot(xs, ys, marker="o", label=source, clip_on=False)
                if ax is axes[0]:
                    pass_at_n = [100 * p.pass_at_n for p in mine]
                    ax.plot(xs, pass_at_n, ls="--", marker=".", color=line.get_color(), clip_on=False)
        if unit == "%":
            ax.set_ylim(0, 100)  # a share: never past 0-100 %, whatever the margins
        else:
            ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    return fig


def plot(points: list[EvalPoint], path: Path) -> Path:
    """:func:`figure` as a PNG at ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(points)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def to_json(points: list[EvalPoint]) -> list[dict]:
    return [asdict(p) for p in points]


def dumped_eval_metrics(export_path: str | Path, step: int) -> dict[str, float]:
    """Tracker metrics of the eval SkyRL just dumped at ``step``: per eval set ``eval/<set>/accuracy_mean_at_n`` and
    ``eval/<set>/cap_share`` (SkyRL's own eval metrics have neither). Empty when nothing (readable) was dumped:
    a metrics add-on never stops a training run."""
    eval_dir = Path(export_path) / "dumped_evals" / f"global_step_{step}_evals"
    if not eval_dir.is_dir():
        return {}
    try:
        files = sorted(p for p in eval_dir.glob("*.jsonl") if p.name != AGGREGATED)
        points = _dump_points(step, eval_dir, files)
    except ReportError as e:
        log.warning("eval accuracy / cap share not logged: %s", e)
        return {}
    metrics = {}
    for point in points:
        metrics[f"eval/{point.data_source}/accuracy_mean_at_n"] = point.accuracy
        metrics[f"eval/{point.data_source}/cap_share"] = point.cap_share
    return metrics
