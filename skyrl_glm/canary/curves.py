"""One row of figures per training step, read from run summaries: the table ``skyrl-glm train`` prints at the end
of a run, the PNG of mean reward per step it writes beside the summary, and ``skyrl-glm report --canary`` over
several runs (one curve each, e.g. memory sync, disk sync, a sync that never publishes).

The rows are :meth:`~skyrl_glm.skyrl.run.summary.RunSummary.step_rows` as the summary JSON holds them (``steps``).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from skyrl_glm.strict_json import finite_number
from skyrl_glm.usage import UsageError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SUMMARY_FILE = "skyrl_glm_summary.json"
REWARD_PNG = "skyrl_glm_rewards.png"
# What a summary may hold: bounded so a corrupt or hostile file is refused before it is parsed or drawn.
MAX_SUMMARY_BYTES = 64 << 20
MAX_STEP = 2**31 - 1
# The figures of a step row that the table and the plot read: each a finite number or null.
FIGURES = (
    "reward",
    "step_s",
    "sync_s",
    "plan_s",
    "receive_s",
    "save_s",
    "load_s",
    "first_request_s",
    "agree_prefill_mean",
    "agree_prefill_max",
    "agree_decode_max",
    "agree_mean_tol",
    "agree_max_tol",
    "mismatch_mean",
)


def _judged_mean(row: dict[str, Any], path: str) -> float | None:
    """A step's agree mean on ``path`` as the rule judged it: the trimmed mean, or the mean in older summaries."""
    trimmed = row.get(f"agree_{path}_trimmed_mean")
    return trimmed if trimmed is not None else row.get(f"agree_{path}_mean")


class StepTableError(UsageError):
    """A summary that cannot be read as a run's per-step figures; one line naming the file."""


def _ms(value: Any) -> str:
    return "-" if value is None else f"{1000 * value:.1f}"


def _num(value: Any, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def label(summary: dict[str, Any]) -> str:
    """How a run is named in a table title and a plot legend: its sync mode, a fault (and its step), the check when
    off."""
    run = summary.get("run") or {}
    parts = [f"{summary.get('sync_mode', '?')} sync"]
    if run.get("fault") not in (None, "none"):
        parts.append(str(run["fault"]) + (f" at step {run['fault_at_step']}" if run.get("fault_at_step") else ""))
    if run.get("check") is False:
        parts.append("check off")
    return ", ".join(parts)


def summary_file(path: str | Path) -> Path:
    """The summary file a ``--canary`` argument names: the file itself, or the one in the directory."""
    path = Path(path)
    return path / SUMMARY_FILE if path.is_dir() else path


def read_summary(path: str | Path) -> dict[str, Any]:
    """A run summary: the JSON file, or the directory holding it (``trainer.log_path``); every figure the table and
    the plot read checked here, so a malformed summary is one line naming the file and the field."""
    file = summary_file(path)
    try:
        if file.stat().st_size > MAX_SUMMARY_BYTES:
            raise StepTableError(f"{file}: {file.stat().st_size:,} bytes, past a run summary's {MAX_SUMMARY_BYTES:,}")
        data = json.loads(file.read_text())
    except FileNotFoundError:
        where = f"skyrl-glm train writes <trainer.log_path>/{SUMMARY_FILE}"
        raise StepTableError(f"{file}: no such run summary ({where})") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: a 5,000-digit number too
        raise StepTableError(f"{file}: not a run summary ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    if problem := _summary_problem(data):
        raise StepTableError(f"{file}: {problem}")
    return data


def _summary_problem(data: Any) -> str | None:
    """What makes ``data`` unusable as a run summary, or None."""
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, list) or not all(isinstance(r, dict) and _is_step(r.get("step")) for r in steps):
        return f"no per-step figures ('steps': a list of rows with an integer 'step' in 0..{MAX_STEP})"
    if not isinstance(data.get("run") or {}, dict):
        return f"'run' must be an object, got {data['run']!r:.40}"
    if not isinstance(data.get("sync_mode", ""), str):
        return f"'sync_mode' must be a string, got {data['sync_mode']!r:.40}"
    for r in steps:
        for name in FIGURES:
            value = r.get(name)
            if value is not None and finite_number(value) is None:
                return f"step {r['step']}: {name} {value!r:.40} is not a finite number"
    return None


def _is_step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP


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
        "gen KL",
    )
    for c in columns:
        table.add_column(c, justify="right", overflow="fold")
    for r in summary["steps"]:
        margin = "-"
        if r.get("agree_prefill_mean") is not None:
            # the figures the rule judged: each path's trimmed mean (a summary before it: the mean), the worst path
            means = [_judged_mean(r, path) for path in ("prefill", "decode")]
            probs = [r.get("agree_prefill_prob_max"), r.get("agree_decode_prob_max")]
            worst_mean = max((v for v in means if v is not None), default=None)
            worst = max((v for v in probs if v is not None), default=None)
            margin = f"{_num(worst_mean)}/{_num(worst)}"
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
            _num(r.get("gen_kl")),
        )
    console.print(table)


def first_stop(summary: dict[str, Any]) -> int | None:
    """The step after which the first check failed (0: the handoff check before step 1), None if none did."""
    check = summary.get("check")
    if check is not None and not check.get("passed", True):
        return 0
    return next((a.get("step", 0) for a in summary.get("agree") or [] if not a.get("passed", True)), None)


def stop_verdict(summary: dict[str, Any]) -> str:
    """What the checks did with this run: a run without a fault must never be stopped (a false stop); a fault from
    the start must be stopped before step 1, a fault at step k by the agree check after the sync that follows k."""
    run = summary.get("run") or {}
    fault, at = run.get("fault") or "none", int(run.get("fault_at_step") or 0)
    stop = first_stop(summary)
    if fault == "none":
        return "no stop" if stop is None else f"FALSE STOP after step {stop}"
    if run.get("check") is False:
        return "check off"
    if stop is None:
        return "MISSED"
    if stop == at:
        return f"caught {'before step 1' if at == 0 else f'after step {at}'}"
    return f"{'LATE' if stop > at else 'EARLY'}: stopped after step {stop}, fault at {at}"


def digest(summary: dict[str, Any]) -> dict[str, Any]:
    """One run in figures: steps trained, the checks' verdict, agree checks passed, reward first -> last and the
    rise (mean of the last four steps minus the first four's), the generation KL over the steps."""
    curve = rewards(summary)
    kl = [r["gen_kl"] for r in summary["steps"] if isinstance(r.get("gen_kl"), int | float)]
    agree = summary.get("agree") or []
    return {
        "run": label(summary),
        "steps": len(summary["steps"]),
        "verdict": stop_verdict(summary),
        "agree_passed": sum(1 for a in agree if a.get("passed")),
        "agree_checks": len(agree),
        "reward_first": curve[0] if curve else None,
        "reward_last": curve[-1] if curve else None,
        "rise": rise(curve, 4) if len(curve) >= 8 else None,
        "gen_kl_median": statistics.median(kl) if kl else None,
        "gen_kl_max": max(kl) if kl else None,
    }


def run_name(path: str | Path) -> str:
    """A run's short name from its summary's path: the directory holding it, or above a ``logs`` directory
    (``scripts/gpu-verify`` keeps each run's under ``runs/<lane>/logs``)."""
    where = Path(path)
    where = where if where.is_dir() else where.parent
    return (where.parent if where.name == "logs" else where).name


def print_runs(summaries: list[dict[str, Any]], console: Console, names: list[str] | None = None) -> None:
    """One row per run (:func:`digest`); ``names``: how each is listed, else its label."""
    table = Table(title="runs", title_justify="left")
    columns = ("run", "steps", "checks", "agree ok", "reward first -> last", "rise (4)", "gen KL median / max")
    for c in columns:
        table.add_column(c, justify="left" if c in ("run", "checks") else "right", overflow="fold")
    for i, s in enumerate(summaries):
        d = digest(s)
        table.add_row(
            names[i] if names else d["run"],
            str(d["steps"]),
            d["verdict"],
            f"{d['agree_passed']}/{d['agree_checks']}",
            f"{_num(d['reward_first'], '.3f')} -> {_num(d['reward_last'], '.3f')}",
            _num(d["rise"], "+.3f"),
            f"{_num(d['gen_kl_median'])} / {_num(d['gen_kl_max'])}",
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


def legend_labels(summaries: list[dict[str, Any]], names: list[str] | None = None) -> list[str]:
    """One legend label per run, all distinct: :func:`label`, with the run's name (its directory) when given, and a
    number where two runs still read the same (two memory-sync runs of one directory name)."""
    labels = [label(s) + (f" ({names[i]})" if names else "") for i, s in enumerate(summaries)]
    repeated = {x for x in labels if labels.count(x) > 1}
    return [f"{x} #{i + 1}" if x in repeated else x for i, x in enumerate(labels)]


def rewards_figure(summaries: list[dict[str, Any]], names: list[str] | None = None) -> Figure:
    """A curve per run: mean reward per step above, the rollouts' trainer/sampler mismatch per step below
    (generation KL, k3, solid; mean |dlogp| on the sampled tokens, dotted), on a log scale; whole-step ticks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax, low) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=(3, 2))
    for s, name in zip(summaries, legend_labels(summaries, names), strict=True):
        rows = sorted(s["steps"], key=lambda r: r["step"])
        rewarded = [r for r in rows if r.get("reward") is not None]
        (line,) = ax.plot([r["step"] for r in rewarded], [r["reward"] for r in rewarded], marker="o", label=name)
        for key, style in (("gen_kl", "-"), ("mismatch_mean", ":")):
            shown = [r for r in rows if isinstance(r.get(key), int | float) and r[key] > 0]
            low.plot([r["step"] for r in shown], [r[key] for r in shown], style, marker=".", color=line.get_color())
    ax.set_ylabel("mean reward")
    ax.grid(alpha=0.3)
    ax.legend()
    low.xaxis.set_major_locator(MaxNLocator(integer=True))
    if any(low.get_lines()):
        low.set_yscale("log")
    low.set_xlabel("training step")
    low.set_ylabel("gen KL (k3) — / |dlogp| ··")
    low.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_rewards(summaries: list[dict[str, Any]], path: Path, names: list[str] | None = None) -> Path:
    """:func:`rewards_figure` as a PNG at ``path``."""
    import matplotlib.pyplot as plt

    fig = rewards_figure(summaries, names)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
