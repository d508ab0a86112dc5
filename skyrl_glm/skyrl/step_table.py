"""One row of figures per training step, read from run summaries: the table ``skyrl-glm train`` prints at the end
of a run, the PNG of mean reward per step it writes beside the summary, and ``skyrl-glm report --canary`` over
several runs (one curve each, e.g. memory sync, disk sync, a sync that never publishes).

The rows are :meth:`~skyrl_glm.skyrl.summary.RunSummary.step_rows` as the summary JSON holds them (``steps``).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from skyrl_glm.usage import UsageError

SUMMARY_FILE = "skyrl_glm_summary.json"
REWARD_PNG = "skyrl_glm_rewards.png"


class StepTableError(UsageError):
    """A summary that cannot be read as a run's per-step figures; one line naming the file."""


def _ms(value: Any) -> str:
    return "-" if value is None else f"{1000 * value:.1f}"


def _num(value: Any, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def label(summary: dict[str, Any]) -> str:
    """How a run is named in a table title and a plot legend: its sync mode, a fault, the check when off."""
    run = summary.get("run") or {}
    parts = [f"{summary.get('sync_mode', '?')} sync"]
    if run.get("fault") not in (None, "none"):
        parts.append(str(run["fault"]))
    if run.get("check") is False:
        parts.append("check off")
    return ", ".join(parts)


def read_summary(path: str | Path) -> dict[str, Any]:
    """A run summary: the JSON file, or the directory holding it (``trainer.log_path``)."""
    path = Path(path)
    file = path / SUMMARY_FILE if path.is_dir() else path
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        where = f"skyrl-glm train writes <trainer.log_path>/{SUMMARY_FILE}"
        raise StepTableError(f"{file}: no such run summary ({where})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StepTableError(f"{file}: not a run summary ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, list) or not all(isinstance(r, dict) and isinstance(r.get("step"), int) for r in steps):
        raise StepTableError(f"{file}: no per-step figures ('steps': a list of rows with an integer 'step')")
    for r in steps:
        reward = r.get("reward")
        if reward is not None and not (isinstance(reward, int | float) and math.isfinite(reward)):
            raise StepTableError(f"{file}: step {r['step']}: reward {reward!r} is not a finite number")
    return data


def print_step_table(summary: dict[str, Any], console: Console) -> None:
    """Reward, step time, the sync after the step by stage, the first request, the agree check's margins against
    its tolerances and the trainer/sampler mismatch, per step (times in ms)."""
    table = Table(title=f"per step ({label(summary)})", title_justify="left")
    columns = (
        "step",
        "reward",
        "step s",
        "sync ms",
        "plan",
        "receive",
        "save",
        "load",
        "1st req",
        "agree mean/|dp|",
        "tol",
        "|dlogp| mean",
    )
    for c in columns:
        table.add_column(c, justify="right")
    for r in summary["steps"]:
        margin = "-"
        if r.get("agree_prefill_mean") is not None:
            probs = [r.get("agree_prefill_prob_max"), r.get("agree_decode_prob_max")]
            worst = max((v for v in probs if v is not None), default=None)
            margin = f"{_num(r['agree_prefill_mean'])}/{_num(worst)}"
        tol = "-" if r.get("agree_mean_tol") is None else f"{_num(r['agree_mean_tol'])}/{_num(r.get('agree_prob_tol'))}"
        table.add_row(
            str(r["step"]),
            _num(r.get("reward"), ".3f"),
            _num(r.get("step_s"), ".1f"),
            _ms(r.get("sync_s")),
            _ms(r.get("plan_s")),
            _ms(r.get("receive_s")),
            _ms(r.get("save_s")),
            _ms(r.get("load_s")),
            _ms(r.get("first_request_s")),
            margin,
            tol,
            _num(r.get("mismatch_mean")),
        )
    console.print(table)


def rewards(summary: dict[str, Any]) -> list[float]:
    """The mean reward of each step that logged one, in step order."""
    rows = sorted(summary["steps"], key=lambda r: r["step"])
    return [float(r["reward"]) for r in rows if r.get("reward") is not None]


def rise(values: list[float], window: int = 2) -> float:
    """Mean of the last ``window`` values minus the mean of the first ``window`` (0.0 with too few values)."""
    if len(values) < 2 * window:
        return 0.0
    return statistics.fmean(values[-window:]) - statistics.fmean(values[:window])


def plot_rewards(summaries: list[dict[str, Any]], path: Path) -> Path:
    """One curve of mean reward per step for each run, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for s in summaries:
        rows = sorted((r for r in s["steps"] if r.get("reward") is not None), key=lambda r: r["step"])
        ax.plot([r["step"] for r in rows], [r["reward"] for r in rows], marker="o", label=label(s))
    ax.set_xlabel("training step")
    ax.set_ylabel("mean reward")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
