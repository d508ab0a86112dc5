"""Each PNG the project writes, read back from the matplotlib figure it drew: the check's |dlogp| plot, the
training reward curves, the eval report and ``report --canary``. A plot must tell its story at a glance: no axis
below 0 for an absolute value, no value flattened to an unlabelled 0, no step hidden under another, whole-step
ticks, shares within 0-100 %, one legend label per run."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from skyrl_glm.canary.curves import SUMMARY_FILE, rewards_figure  # noqa: E402
from skyrl_glm.check.algorithm import CheckConfig, CheckReport, Diff, StepResult  # noqa: E402
from skyrl_glm.check.report import figure as check_figure  # noqa: E402
from skyrl_glm.cli import main  # noqa: E402
from skyrl_glm.dapo.report import EvalPoint  # noqa: E402
from skyrl_glm.dapo.report import figure as eval_figure  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _ticks_are_whole(ax) -> bool:
    ax.figure.canvas.draw()
    lo, hi = ax.get_xlim()
    shown = [t for t in ax.get_xticks() if lo <= t <= hi]
    return bool(shown) and all(float(t).is_integer() for t in shown)


def _check_report(step5_passes: bool) -> CheckReport:
    """Steps 1 and 5 agree to 1e-7 and exactly 0 (what flattened to "0" on the old axis), step 3 moves by ~0.3."""
    tiny = Diff([0.0, 1e-7, 3e-8, 0.0, 2e-7])
    moved = Diff([0.3, 0.25, 0.4, 0.2, 0.35])
    late = tiny if step5_passes else Diff([0.0, 0.3, 0.2, 0.0, 0.5])
    steps = [
        StepResult(1, "agree-before", True, "", 0.1, tiny, Diff([0.0, 0.0, 1e-7])),
        StepResult(2, "repeat", True, "", 0.1),
        StepResult(3, "detect-stale", True, "", 0.1, moved),
        StepResult(4, "publish", True, "", 0.1),
        StepResult(5, "agree-after", step5_passes, "", 0.1, late),
    ]
    return CheckReport(CheckConfig(), steps)


@pytest.mark.parametrize("step5_passes", [True, False])
def test_check_plot_shows_small_and_zero_values_above_its_floor_and_a_fail_on_top(step5_passes):
    fig = check_figure(_check_report(step5_passes))
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"  # 1e-7 and 0.3 both readable
    bottom, _ = ax.get_ylim()
    assert bottom > 0  # an absolute value: never a negative axis
    data = [line for line in ax.get_lines() if line.get_label().startswith("step ")]
    for line in data:
        assert min(line.get_ydata()) >= bottom, line.get_label()  # exact zeros drawn at the floor, not off the axis
    assert "0 drawn at" in ax.get_ylabel()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(labels) == len(set(labels))
    assert all(" max " in label for label in labels if label.startswith("step "))  # each step's value, written
    markers = {line.get_label().split()[1]: line.get_marker() for line in data}
    assert len(set(markers.values())) == 3  # steps 1, 3, 5: one marker each
    offsets = {line.get_label().split()[1]: line.get_xdata()[0] for line in data}
    assert len(set(offsets.values())) == 3  # and side by side, not on top of each other
    step5 = [line for line in data if line.get_label().startswith("step 5")]
    others = [line for line in data if not line.get_label().startswith("step 5")]
    if step5_passes:
        assert "ok" in step5[0].get_label()
    else:
        assert "FAIL" in step5[0].get_label() and step5[0].get_color() == "red"
        assert min(line.get_zorder() for line in step5) > max(line.get_zorder() for line in others)
    assert _ticks_are_whole(ax)


def _summary_dir(root: Path, name: str, rewards: list[float]) -> Path:
    run = root / name / "logs"
    run.mkdir(parents=True)
    steps = [{"step": i + 1, "reward": r, "gen_kl": 1e-9 * (i + 1)} for i, r in enumerate(rewards)]
    (run / SUMMARY_FILE).write_text(json.dumps({"sync_mode": "memory", "run": {"fault": "none"}, "steps": steps}))
    return run


def test_reward_plot_has_whole_step_ticks():
    steps = [{"step": i, "reward": 0.1 * i, "gen_kl": 1e-9} for i in (1, 2, 3)]  # three steps: ticks were 1.0, 1.5, ...
    fig = rewards_figure([{"sync_mode": "memory", "steps": steps}])
    assert all(_ticks_are_whole(ax) for ax in fig.axes)


def test_report_canary_labels_two_runs_of_one_sync_mode_apart(tmp_path, monkeypatch, capsys):
    """Two memory-sync runs (seeds 0 and 1): each legend entry names its run directory."""
    drawn: list[Figure] = []
    savefig = Figure.savefig

    def keep(self: Figure, *args, **kwargs):  # the real save, the figure kept to be read back
        drawn.append(self)
        return savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    a = _summary_dir(tmp_path, "seed0", [0.1, 0.2, 0.3])
    b = _summary_dir(tmp_path, "seed1", [0.1, 0.15, 0.35])
    png = tmp_path / "canary.png"
    assert main(["report", "--canary", str(a), str(b), "--png", str(png)]) == 0, capsys.readouterr().err
    (fig,) = drawn
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["memory sync (seed0)", "memory sync (seed1)"]
    assert all(_ticks_are_whole(ax) for ax in fig.axes)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_runs_that_still_read_the_same_are_numbered():
    from skyrl_glm.canary.curves import legend_labels

    same = {"sync_mode": "memory", "steps": []}
    assert legend_labels([same, same], ["run", "run"]) == ["memory sync (run) #1", "memory sync (run) #2"]
    assert legend_labels([same, {**same, "sync_mode": "disk"}]) == ["memory sync", "disk sync"]


def test_eval_report_shares_stay_within_0_to_100_percent_and_steps_are_whole():
    points = [
        EvalPoint(step, "aime", 30, 4, accuracy, min(1.0, accuracy * 2), 900.0 + step, cap)
        for step, accuracy, cap in ((0, 0.0, 1.0), (1, 0.5, 0.4), (2, 1.0, 0.0))
    ]
    fig = eval_figure(points)
    accuracy, length, cap = fig.axes
    assert accuracy.get_ylim() == (0, 100) and cap.get_ylim() == (0, 100)  # 0 % and 100 % points: not past them
    assert length.get_ylim()[0] == 0
    assert all(_ticks_are_whole(ax) for ax in fig.axes)
