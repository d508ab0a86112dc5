"""Check reports: a rich table, JSON, and a per-token |dlogp| plot for steps 1, 3 and 5."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from skyrl_glm import strict_json
from skyrl_glm.check.algorithm import CheckReport, Diff


def _diff_json(d: Diff | None) -> dict[str, Any] | None:
    if d is None:
        return None
    own = {"own_prefill": _diff_json(d.own_prefill)} if d.own_prefill is not None else {}
    probs = {"prob_max": d.prob_max, "prob_per_token": d.prob_per_token}
    return {"mean": d.mean, "max": d.max, "per_token": d.per_token, **probs, **own}


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
    console = console or Console()
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
        table.add_column(col)
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


def plot(report: CheckReport, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 4))
    for s in report.steps:
        if s.step in (1, 3, 5) and s.prefill is not None:
            ax.plot(s.prefill.per_token, marker=".", linewidth=0.8, label=f"step {s.step}: {s.name} (prefill)")
        if s.step in (1, 3, 5) and s.decode is not None:
            ax.plot(s.decode.per_token, marker="x", linewidth=0.6, linestyle="--", label=f"step {s.step} (decode)")
    ax.axhline(report.config.mean_tol, color="grey", linestyle=":", label=f"mean tolerance {report.config.mean_tol}")
    ax.set_yscale("symlog", linthresh=1e-4)
    ax.set_xlabel("token")
    ax.set_ylabel("|trainer logp - sampler logp|")
    ax.set_title(f"handoff check: {'PASS' if report.passed else 'FAIL'}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
