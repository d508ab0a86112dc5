"""Check reports: a rich table, JSON, and a per-token |dlogp| plot for steps 1, 3 and 5."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from skyrl_glm import strict_json, terminal
from skyrl_glm.check.algorithm import CheckReport, Diff

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _diff_json(d: Diff | None) -> dict[str, Any] | None:
    if d is None:
        return None
    own = {"own_prefill": _diff_json(d.own_prefill)} if d.own_prefill is not None else {}
    probs = {"prob_max": d.prob_max, "prob_per_token": d.prob_per_token}
    return {"mean": d.mean, "trimmed_mean": d.trimmed_mean, "max": d.max, "per_token": d.per_token, **probs, **own}


def to_dict(report: CheckReport) -> dict[str, Any]:
    fail = report.first_failure
    return {
        "verdict": "PASS" if report.passed else "FAIL",
        "failed_step": fail.step if fail else None,
        "config": dataclasses.asdict(report.config),
        "info": report.info,
        "steps": [
            {
                "step": s.step,
                "name": s.name,
                "passed": s.passed,
                "detail": s.detail,
                "seconds": s.seconds,
                "prefill": _diff_json(s.prefill),
                "decode": _diff_json(s.decode),
                "extra": s.extra,
            }
            for s in report.steps
        ],
    }


def write_json(report: CheckReport, path: str | Path) -> None:
    strict_json.write(to_dict(report), path, indent=2)


def _fmt(d: Diff | None) -> tuple[str, str]:
    return ("-", "-") if d is None else (f"{d.mean:.4g}", f"{d.max:.4g} / {d.prob_max:.2g}")


def print_table(report: CheckReport, console: Console | None = None) -> None:
    console = console or terminal.console()
    cfg = report.config
    table = Table(title="five-step handoff check")
    for col in (
        "step",
        "what",
        "prefill mean",
        "prefill max / |dp|",
        "decode mean",
        "decode max / |dp|",
        "threshold",
        "s",
        "verdict",
    ):
        table.add_column(col, overflow="fold")
    thresholds = {
        1: f"mean <= {cfg.mean_tol}, |dp| <= {cfg.prob_tol}",
        3: f"mean > {cfg.mean_tol}",
        5: f"mean <= {cfg.mean_tol}, |dp| <= {cfg.prob_tol}",
    }
    for s in report.steps:
        verdict = "[green]ok[/]" if s.passed else "[red]FAIL[/]"
        table.add_row(
            str(s.step),
            s.name,
            *_fmt(s.prefill),
            *_fmt(s.decode),
            thresholds.get(s.step, "-"),
            f"{s.seconds:.2f}",
            verdict,
        )
    console.print(table)
    for s in report.steps:
        console.print(f"  step {s.step} ({s.name}): {s.detail}")
    fail = report.first_failure
    if report.passed:
        console.print(
            "[bold green]PASS[/]: trainer and sampler run the same policy, and the update reached the sampler"
        )
    else:
        where = f"step {fail.step} ({fail.name}): {fail.detail}" if fail else "check incomplete"
        console.print(f"[bold red]FAIL[/] at {where}")


# Steps 1, 3 and 5 on the plot: each its own marker and a small x offset, so no step's points hide under another's.
PLOTTED = {1: ("o", -0.2), 3: ("s", 0.0), 5: ("^", 0.2)}


def _floor(report: CheckReport) -> float:
    """Where an exact zero is drawn on the log axis: a decade under the smallest nonzero |dlogp| (1e-9 when none)."""
    values = [
        v
        for s in report.steps
        if s.step in PLOTTED
        for d in (s.prefill, s.decode)
        if d is not None
        for v in d.per_token
        if math.isfinite(v) and v > 0
    ]
    return min([*values, 1e-8]) / 10


def figure(report: CheckReport) -> Figure:
    """Per-token |dlogp| of steps 1, 3 and 5 on a log axis (exact zeros at a floor, said on the axis), each step
    with its own marker and offset, its largest value in its legend entry, a failing step drawn on top in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    floor = _floor(report)
    fig, ax = plt.subplots(figsize=(9, 4))
    for s in report.steps:
        if s.step not in PLOTTED:
            continue
        marker, offset = PLOTTED[s.step]
        verdict = "ok" if s.passed else "FAIL"
        style = {"zorder": 2} if s.passed else {"zorder": 5, "color": "red", "markersize": 7}
        for path, diff, line in (("prefill", s.prefill, "-"), ("decode", s.decode, "--")):
            if diff is None:
                continue
            xs = [i + offset for i in range(len(diff.per_token))]
            ys = [max(v, floor) if math.isfinite(v) else math.nan for v in diff.per_token]
            fill = "full" if path == "prefill" else "none"
            label = f"step {s.step} {s.name} ({path}): {verdict}, max {diff.max:.2g}"
            ax.plot(xs, ys, marker=marker, fillstyle=fill, linestyle=line, linewidth=0.7, label=label, **style)
    ax.axhline(report.config.mean_tol, color="grey", linestyle=":", label=f"mean tolerance {report.config.mean_tol}")
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor / 2)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("token")
    ax.set_ylabel(f"|trainer logp - sampler logp|\n(0 drawn at {floor:.0e})")
    ax.set_title(f"handoff check: {'PASS' if report.passed else 'FAIL'}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot(report: CheckReport, path: str | Path) -> None:
    import matplotlib.pyplot as plt

    fig = figure(report)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
