"""``skyrl-glm report RUN_DIR``: the eval numbers the DAPO-math reference run reports, over training steps.

Read from what SkyRL 0.4.0 writes when ``trainer.dump_eval_results=true``:
``<trainer.export_path>/dumped_evals/global_step_<N>_evals/`` holds one ``<data_source>.jsonl`` per eval set (a
record per sample: ``output_response``, ``score``, ``stop_reason``, ``input_prompt``, ...) and
``aggregated_results.jsonl`` (the eval metrics dict, with ``eval/all/generate/avg_num_tokens``). Per step and eval set:
accuracy as the mean over all n samples of every prompt (mean@n, the pass@1 estimate), pass@n, the mean response
length in tokens, and the share of responses that stopped at the length cap (``stop_reason == "length"``).
"""

from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)
_STEP_DIR = re.compile(r"^global_step_(\d+)_evals$")
AGGREGATED = "aggregated_results.jsonl"


class ReportError(ValueError):
    """A run directory without SkyRL eval dumps, or a dump that does not parse (the message names the file)."""


@dataclass(frozen=True)
class EvalPoint:
    """One eval set at one step."""

    step: int
    data_source: str
    prompts: int
    samples_per_prompt: float
    accuracy: float
    """Mean over all samples of score > 0 (mean@n; the pass@1 estimate)."""
    pass_at_n: float
    mean_length: float | None
    """Mean response tokens over all eval sets of the step (SkyRL's ``eval/all/generate/avg_num_tokens``)."""
    cap_share: float
    """Share of samples whose generation stopped at the length cap."""


def find_eval_dirs(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, dir) of every dumped eval under ``run_dir`` (the export path, or its ``dumped_evals``), by step."""
    root = run_dir / "dumped_evals" if (run_dir / "dumped_evals").is_dir() else run_dir
    if not root.is_dir():
        raise ReportError(f"{run_dir}: not a directory")
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
    records = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ReportError(f"{path}:{lineno}: not JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise ReportError(f"{path}:{lineno}: expected a JSON object")
            records.append(record)
    return records


def summarise(step: int, data_source: str, records: list[dict], mean_length: float | None) -> EvalPoint:
    """Accuracy, pass@n and cap share of one eval set's dumped samples."""
    by_prompt: dict[str, list[bool]] = defaultdict(list)
    capped = 0
    for i, record in enumerate(records):
        if "score" not in record or "input_prompt" not in record:
            raise ReportError(f"{data_source} at step {step}: record {i} lacks score/input_prompt")
        score = record["score"]
        score = sum(score) if isinstance(score, list) else score
        by_prompt[str(record["input_prompt"])].append(float(score) > 0)
        capped += record.get("stop_reason") == "length"
    samples = [ok for oks in by_prompt.values() for ok in oks]
    return EvalPoint(
        step=step,
        data_source=data_source,
        prompts=len(by_prompt),
        samples_per_prompt=len(samples) / len(by_prompt),
        accuracy=sum(samples) / len(samples),
        pass_at_n=sum(any(oks) for oks in by_prompt.values()) / len(by_prompt),
        mean_length=mean_length,
        cap_share=capped / len(samples),
    )


def collect(run_dir: Path) -> list[EvalPoint]:
    """Every (step, eval set) point of a run, by step then eval set."""
    points = []
    for step, eval_dir in find_eval_dirs(run_dir):
        mean_length = None
        aggregated = eval_dir / AGGREGATED
        if aggregated.is_file():
            metrics = _read_jsonl(aggregated)
            if metrics:
                value = metrics[0].get("eval/all/generate/avg_num_tokens")
                mean_length = float(value) if isinstance(value, int | float) else None
        for path in sorted(eval_dir.glob("*.jsonl")):
            if path.name == AGGREGATED:
                continue
            records = _read_jsonl(path)
            if records:
                points.append(summarise(step, path.stem, records, mean_length))
    if not points:
        raise ReportError(f"{run_dir}: eval dumps hold no samples")
    return points


def print_table(points: list[EvalPoint], console) -> None:
    from rich.table import Table

    table = Table(title="eval over training steps (mean@n accuracy = pass@1 estimate)")
    for col in ("step", "eval set", "prompts", "n", "accuracy", "pass@n", "mean length (tokens)", "at cap"):
        table.add_column(col, justify="left" if col == "eval set" else "right")
    for p in points:
        length = "-" if p.mean_length is None else f"{p.mean_length:,.0f}"
        table.add_row(
            str(p.step),
            p.data_source,
            str(p.prompts),
            f"{p.samples_per_prompt:g}",
            f"{p.accuracy:.1%}",
            f"{p.pass_at_n:.1%}",
            length,
            f"{p.cap_share:.1%}",
        )
    console.print(table)


def plot(points: list[EvalPoint], path: Path) -> Path:
    """Accuracy, mean response length and cap share over steps, one line per eval set, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    panels = (
        ("accuracy (mean@n)", lambda p: 100 * p.accuracy, "%"),
        ("mean response length", lambda p: p.mean_length, "tokens"),
        ("responses at the cap", lambda p: 100 * p.cap_share, "%"),
    )
    sources = sorted({p.data_source for p in points})
    for ax, (title, value, unit) in zip(axes, panels, strict=True):
        for source in sources:
            series = [(p.step, value(p)) for p in points if p.data_source == source and value(p) is not None]
            if series:
                xs, ys = zip(*series, strict=True)
                ax.plot(xs, ys, marker="o", label=source)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
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
    metrics = {}
    try:
        for path in sorted(eval_dir.glob("*.jsonl")):
            if path.name == AGGREGATED:
                continue
            records = _read_jsonl(path)
            if records:
                point = summarise(step, path.stem, records, None)
                metrics[f"eval/{point.data_source}/accuracy_mean_at_n"] = point.accuracy
                metrics[f"eval/{point.data_source}/cap_share"] = point.cap_share
    except ReportError as e:
        log.warning("eval accuracy / cap share not logged: %s", e)
        return {}
    return metrics
