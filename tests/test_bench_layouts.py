"""``bench load --layouts``: the arithmetic and the report of the layout comparison, and its option checks.

The comparison itself needs vLLM's GPU build (routed-expert LoRA); here the fit, the full-size slot arithmetic, the
end-to-end rows, the table and the plot run on a report built in the test (its numbers are made up, and say so).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from skyrl_glm.bench import load_layouts as L


def test_the_fit_is_exact_on_a_line_and_shows_the_residuals_otherwise() -> None:
    line = L.fit_line([2, 4, 6], [0.03, 0.05, 0.07], 75)
    assert line["slope"] == pytest.approx(0.01) and line["intercept"] == pytest.approx(0.01)
    assert line["value"] == pytest.approx(0.76) and max(map(abs, line["residuals"])) < 1e-12
    bent = L.fit_line([2, 4, 6], [0.03, 0.07, 0.07], 75)
    assert bent["residuals"] == pytest.approx([-2 / 300, 4 / 300, -2 / 300])  # a bend is shown, not hidden


def test_a_falling_fit_is_held_flat_at_the_mean() -> None:
    """A flat stage's jitter must not extrapolate to a negative cost at 75 layers (it did: -6 ms for a ~5 ms load)."""
    flat = L.fit_line([1, 3, 5], [0.0053, 0.0047, 0.0047], 75)
    assert flat["held"] and flat["slope"] == 0.0
    assert flat["value"] == pytest.approx(0.0049) and flat["intercept"] == pytest.approx(0.0049)
    assert not L.fit_line([1, 3, 5], [0.0034, 0.0038, 0.0048], 75)["held"]


def test_the_table_marks_a_fit_held_flat(capsys) -> None:
    report = _made_up_report()
    shared = report["layouts"]["shared-outer"]
    shared["medians_s"]["4"]["load_s"] = 0.001  # falls from 2 to 4 layers: held at the mean
    shared["fit_75"]["load_s"] = L.fit_line([2, 4], [shared["medians_s"][k]["load_s"] for k in ("2", "4")], 75)
    L.print_layout_report(report)
    rows = [line for line in capsys.readouterr().out.splitlines() if "75 (fit)" in line]
    assert [("(flat)" in row) for row in rows] == [False, True] and rows[1].count("(flat)") == 1


def test_slot_bytes_scale_per_part_to_the_full_model() -> None:
    slots = {"routed_experts": 4 * 6 * 100, "other": 2 * 9 * 10, "max_loras": 2}  # 6 MoE layers of 9
    assert L.slots_at_full_size(slots, moe_layers=6, layers=9) == 2 * 100 * 75 + 10 * 78


def _made_up_report() -> dict:
    """A report shaped as run_layout_bench writes it; the numbers are invented for the test."""

    def layout(slope: float, experts_bytes: int) -> dict:
        med = {str(k): {s: slope * k + 0.01 * (i + 1) for i, s in enumerate(L.STAGES)} for k in (2, 4)}
        fit = {s: L.fit_line([2, 4], [med[str(k)][s] for k in (2, 4)], 75) for s in L.STAGES}
        slots = {"routed_experts": experts_bytes, "other": 1 << 28, "max_loras": 2}
        return {
            "started": True,
            "engine_start_s": 40.0,
            "slots": slots,
            "slot_bytes_per_adapter": (experts_bytes + (1 << 28)) / 2,
            "slot_bytes_per_adapter_at_75": L.slots_at_full_size(slots, 4, 7),
            "medians_s": med,
            "fit_75": fit,
            "runs": {},
        }

    return {
        "engine_moe_layers": 4,
        "rank": 32,
        "rounds": 3,
        "max_loras": 2,
        "layouts": {
            "per-expert": layout(0.013, 4 << 30),
            "shared-outer": layout(0.002, 1 << 30),
            "stacked-3d": {"started": False, "reason": "OutOfMemoryError: made up"},
        },
    }


def _sender_runs(*totals: float) -> list[dict]:
    """Timed rounds of a sync whose sender's stages add up to ``totals`` (pack inside the report's transfer)."""
    return [
        {"sender": {"dedup_s": t - 0.01, "pack_s": 0.01, "export_s": None}, "receiver": {"verify_s": 1}} for t in totals
    ]


SYNC = {
    "command": "skyrl-glm bench sync",
    "paths": {
        "ours": {
            "total_s": 0.2,
            "stages_s": {"dedup": 0.1, "transfer": 0.01, "verify": 0.005, "rebuild": 0.015},
            "runs": _sender_runs(0.18, 0.16, 0.17),
        },
        "skyrl": {"total_s": 0.4, "stages_s": {"dedup": 0.3, "transfer": 0.05}},
    },
}


def activation(layout: dict) -> float:
    return statistics.median(m["activation_s"] for m in layout["medians_s"].values())


def test_end_to_end_rows_add_the_sync_to_the_fitted_load_and_the_measured_activation() -> None:
    """The request itself is not in the handoff (its fit on a few-layer engine is noise, measured): the activation (the
    first request's time in vLLM's adapter switch, timed in the worker) is, as measured (no per-layer part: vLLM's slot
    copies are in the load), never read off a fit."""
    report = _made_up_report()
    rows = L.end_to_end(report, [SYNC])["rows"]
    shared = report["layouts"]["shared-outer"]
    fit = shared["fit_75"]
    # the sync's own receiver stages (per-expert names in its process) give way to the layout's engine-side receive
    # the sender's own stages, the median of its rounds: its pack counted (the report's transfer stage holds it)
    want = 0.17 + fit["receive_s"]["value"] + fit["load_s"]["value"] + activation(shared)
    assert rows["skyrl-glm, shared-outer"]["total_s"] == pytest.approx(want)
    assert activation(shared) != pytest.approx(fit["activation_s"]["value"])  # the made-up activation has a slope
    per_expert = report["layouts"]["per-expert"]
    skyrl = rows["SkyRL 0.4.0 memory path, per-expert"]
    assert skyrl["total_s"] == pytest.approx(0.4 + per_expert["fit_75"]["load_s"]["value"] + activation(per_expert))
    assert not any("stacked-3d" in k for k in rows)  # its engine did not start: no row


def test_a_grouped_layout_takes_the_sender_of_its_own_grouping_or_no_row() -> None:
    """grouped:G serves an adapter of G groups per layer, whose sender sends G times the expert tensors: the
    one-per-layer adapter's sync would understate it, so its row needs the sync of ``--expert-groups G``."""
    report = _made_up_report()
    report["layouts"]["grouped:4"] = {**report["layouts"]["shared-outer"], "expert_groups": 4}
    alone = L.end_to_end(report, [SYNC])
    assert "skyrl-glm, grouped:4" not in alone["rows"] and alone["no_sync"] == ["grouped:4"]
    grouped = {**SYNC, "options": {"expert_groups": 4}, "paths": {"ours": {"runs": _sender_runs(0.5)}}}
    both = L.end_to_end(report, [SYNC, grouped])
    row, shared = both["rows"]["skyrl-glm, grouped:4"], both["rows"]["skyrl-glm, shared-outer"]
    assert row["sync_sender_s"] == pytest.approx(0.5) and row["sync_expert_groups"] == 4
    assert shared["sync_sender_s"] == pytest.approx(0.17) and shared["sync_expert_groups"] == 1
    assert both["no_sync"] == [] and [s["expert_groups"] for s in both["syncs"]] == [1, 4]


def test_an_engine_that_served_75_layers_gives_the_handoff_as_measured_there() -> None:
    """With the experts narrowed the engine holds all 75 MoE layers: the handoff then takes the medians measured at
    75 (a fit of 1..75 would smooth a measurement into a line), and says so per row."""
    report = _made_up_report()
    shared = report["layouts"]["shared-outer"]
    shared["medians_s"]["75"] = {s: 0.5 + i for i, s in enumerate(L.STAGES)}  # far off the made-up line
    row = L.end_to_end(report, [SYNC])["rows"]["skyrl-glm, shared-outer"]
    assert row["engine_at_75"] == "measured" and row["receive_s"] == 0.5
    at_75 = shared["medians_s"]["75"]
    assert row["load_and_activation_s"] == pytest.approx(at_75["load_s"] + at_75["activation_s"])
    assert L.end_to_end(report, [SYNC])["rows"]["skyrl-glm, per-expert"]["engine_at_75"] == "fit"


def test_the_activation_at_75_is_the_measured_one_and_otherwise_the_median_never_a_fit() -> None:
    report = _made_up_report()
    shared = report["layouts"]["shared-outer"]
    for k, m in shared["medians_s"].items():
        m["activation_s"] = 0.001 * int(k)  # a slope a fit would multiply out to 75 layers
    row = L.end_to_end(report, [SYNC])["rows"]["skyrl-glm, shared-outer"]
    assert row["load_and_activation_s"] == pytest.approx(shared["fit_75"]["load_s"]["value"] + 0.003)
    shared["medians_s"]["75"] = {s: 0.5 for s in L.STAGES}
    shared["medians_s"]["75"]["activation_s"] = 0.0007
    row = L.end_to_end(report, [SYNC])["rows"]["skyrl-glm, shared-outer"]
    assert row["load_and_activation_s"] == pytest.approx(0.5 + 0.0007)


def test_the_switch_clock_times_each_call_of_the_managers_switch_and_load_and_reads_once() -> None:
    """The clock wraps the worker's LoRA manager (a stand-in here: vLLM's GPU worker is not on this machine): each
    ``set_active_adapters`` and ``add_adapter`` call is timed apart and passed through, and a read hands the times
    over and clears them."""
    import time
    from types import SimpleNamespace

    calls: list[tuple] = []

    class Manager:
        def set_active_adapters(self, requests, mapping):
            calls.append((requests, mapping))
            time.sleep(0.01)
            return "switched"

        def add_adapter(self, request):
            calls.append((request,))
            time.sleep(0.02)
            return True

    worker = SimpleNamespace(model_runner=SimpleNamespace(lora_manager=Manager()))
    read = L.SlotReport.skyrl_glm_bench_switch_times
    assert read(worker) == {"set_active_adapters": [], "add_adapter": []}  # starts the clock
    manager = worker.model_runner.lora_manager
    assert manager.set_active_adapters({"a"}, 1) == "switched" and manager.set_active_adapters(set(), 2) == "switched"
    assert manager.add_adapter("r") is True
    times = read(worker)
    assert calls == [({"a"}, 1), (set(), 2), ("r",)]
    assert len(times["set_active_adapters"]) == 2 and all(0.01 <= t < 1.0 for t in times["set_active_adapters"])
    assert len(times["add_adapter"]) == 1 and 0.02 <= times["add_adapter"][0] < 1.0
    assert read(worker) == {"set_active_adapters": [], "add_adapter": []}  # read once
    manager.set_active_adapters(set(), 3)
    assert len(read(worker)["set_active_adapters"]) == 1 and len(calls) == 4  # one clock, not one per read
    manager.add_adapter("s")
    assert len(read(worker, keep=False)["add_adapter"]) == 1  # stopped: the last times, then vLLM's own methods
    for method in ("set_active_adapters", "add_adapter"):
        assert method not in vars(manager)
        assert getattr(manager, method).__func__ is getattr(Manager, method)


def test_narrowed_experts_keep_every_name_and_shrink_only_the_expert_width() -> None:
    from skyrl_glm.bench.synthetic import BenchOptions, model_config, synthetic_adapter

    full = synthetic_adapter(BenchOptions(model="glm-5.3", config="full", layers=1, rank=4))
    narrow = synthetic_adapter(BenchOptions(model="glm-5.3", config="full", layers=1, rank=4), expert_width=64)
    assert narrow.names == full.names and narrow.unique.keys() == full.unique.keys()
    changed = {k for k in full.unique if full.unique[k].shape != narrow.unique[k].shape}
    assert changed and all("experts" in k for k in changed)  # attention and the dense layers as GLM-5.3's
    assert {2048} == {d for k in changed for d in full.unique[k].shape if d not in narrow.unique[k].shape}
    assert model_config("glm-5.3", "full", 75, 64)[1].moe_intermediate_size == 64


def test_the_decode_table_shows_each_layout_against_the_engine_without_lora(tmp_path, capsys) -> None:
    report = _made_up_report()
    report.update(decode_batches=[1, 256], decode_new_tokens=L.DECODE_TOKENS)
    report["layouts"]["none"] = {
        "started": True,
        "kv_cache_tokens": 1000,
        "decode_tokens_per_s": {"base": {"1": 100.0, "256": 8000.0}},
    }
    report["layouts"]["per-expert"].update(
        kv_cache_tokens=900,
        decode_tokens_per_s={"adapter": {"1": 50.0, "256": 7600.0}, "base": {"1": 99.0, "256": 8000.0}},
    )
    L.print_layout_report(report)
    out = capsys.readouterr().out
    assert "batch 256" in out and "7,600 (95%)" in out and "50 (50%)" in out and "1000" in out
    L.plot_layout_report(report, str(tmp_path / "layouts.png"))  # the baseline engine has no load to plot
    assert L.end_to_end(report, [SYNC])["rows"].keys() == L.end_to_end(_made_up_report(), [SYNC])["rows"].keys()


def test_the_table_and_the_plot_are_written(tmp_path, capsys) -> None:
    report = _made_up_report()
    report["end_to_end_75"] = L.end_to_end(report, [SYNC])
    report["layouts"]["shared-outer"]["rpc_round_trip_s"] = 0.00123
    L.print_layout_report(report)
    out = capsys.readouterr().out
    assert "75 (fit)" in out and "engine did not start" in out and "SkyRL 0.4.0 memory path" in out
    assert "inside the worker" in out and "shared-outer 1.23 ms" in " ".join(out.split())
    assert all(f", {st} " in out for st in L.RECEIVER_STAGES)  # the receive's own stages, from the worker
    for med in report["layouts"]["shared-outer"]["medians_s"].values():  # a report from before they were kept
        for st in L.RECEIVER_STAGES:
            del med[f"{st}_worker_s"]
    L.print_layout_report(report)
    assert "shared-outer at 2: receive" in " ".join(capsys.readouterr().out.split())
    L.plot_layout_report(report, str(tmp_path / "layouts.png"))
    assert (tmp_path / "layouts.png").read_bytes()[:4] == b"\x89PNG"


def test_narrowed_experts_give_no_slot_memory_at_75(tmp_path, capsys) -> None:
    """Narrowed experts have narrowed slots: the table and the plot show the engine's own, never a GLM-5.3 figure."""
    report = _made_up_report()
    report["expert_width"] = 64
    for r in report["layouts"].values():
        if "slots" in r:
            r["slot_bytes_per_adapter_at_75"] = None
    L.print_layout_report(report)
    out = capsys.readouterr().out
    memory_rows = [line for line in out.splitlines() if "GiB" in line]
    assert "experts 64 wide" in out and len(memory_rows) == 2
    assert all(line.rstrip().endswith("- │") for line in memory_rows)
    L.plot_layout_report(report, str(tmp_path / "narrow.png"))
    assert (tmp_path / "narrow.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", "full", "--device", "cuda", "--layouts", "stacked"], "--layouts 'stacked': each once, from"),
        (["--layouts", "per-expert"], "compare layouts at full width: add --config full"),
        (["--layers", "2,x"], "--layers '2,x': give MoE layer counts"),
        (["--layers", "2,4"], "several --layers counts are measured per layout: add --layouts"),
        (["--config", "full", "--layouts", "grouped:4,grouped:4"], "--layouts 'grouped:4,grouped:4': each once"),
        (["--config", "full", "--layouts", "grouped:4", "--decode", "1,x"], "give comma-separated batch sizes"),
        (["--config", "full", "--layouts", "grouped:4", "--max-loras", "0"], "--max-loras must be in 1..16"),
        (["--config", "full", "--layouts", "grouped:4", "--sync-json", "{missing}"], "not a bench sync --json report"),
        (["--config", "full", "--layouts", "grouped:4", "--sync-json", "{bad}"], "bad.json: not a bench sync --json"),
        (["--config", "full", "--layouts", "grouped:4", "--sync-json", "{good},{good}"], "both send 1 expert group"),
        (["--config", "full", "--layouts", "grouped:4", "--layers", "1,76"], "--layers must be in 1..75"),
        (["--layers", "200"], "--layers with the tiny checkpoint: decoder layers in 1..128"),
        (["--config", "full", "--layouts", "grouped:4", "--expert-width", "100"], "a multiple of 64 in 64..2048"),
        (["--config", "full", "--expert-width", "64"], "--expert-width narrows the engine of a layout comparison"),
        (["--config", "full", "--profile-dir", "{missing}"], "--profile-dir profiles the engines of a layout"),
        (["--config", "full", "--layouts", "grouped:4", "--profile-dir", "{bad}"], "exists and is not a directory"),
    ],
)
def test_bad_layout_options_are_one_line(args: list[str], message: str, tmp_path) -> None:
    files = {"missing": tmp_path / "missing.json", "bad": tmp_path / "bad.json", "good": tmp_path / "good.json"}
    files["bad"].write_text('{"paths": {"ours": {"total_s": "x"}}}')
    files["good"].write_text(json.dumps(SYNC))
    args = [a.format(**files) for a in args]
    got = subprocess.run(
        [sys.executable, "-m", "skyrl_glm.cli", "bench", "load", *args], capture_output=True, text=True, timeout=120
    )
    assert got.returncode == 2, got.stderr
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], got.stderr
