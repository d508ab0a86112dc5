"""The agree record is built from each path's Diff by name: every per-path figure of the record comes from the
check's own Diff, and an unmeasured path leaves its figures None (the summary and the step table read them)."""

from __future__ import annotations

from dataclasses import fields

from skyrl_glm.check.algorithm import Diff
from skyrl_glm.skyrl.run.summary import AgreeRecord
from skyrl_glm.skyrl.run.trainer import PATH_FIGURES, path_figures


def test_each_path_figure_of_the_record_is_a_figure_of_the_diff():
    per_path = {f.name for f in fields(AgreeRecord) if f.name.startswith(("prefill_", "decode_"))}
    assert per_path == {f"{p}_{figure}" for p in ("prefill", "decode") for figure in PATH_FIGURES}


def test_a_measured_path_and_an_unmeasured_one():
    diff = Diff([0.1, 0.3], [0.02, 0.04])
    record = AgreeRecord(
        sync=2, passed=True, lora_b_max=0.5, **path_figures("prefill", diff), **path_figures("decode", None)
    )
    assert (record.prefill_max, record.prefill_prob_max) == (0.3, 0.04)
    assert record.prefill_mean == diff.mean
    assert (record.decode_max, record.decode_mean, record.decode_prob_max) == (None, None, None)


def test_a_failed_check_keeps_its_tokens_and_the_summary_writes_them():
    """A stop is judged later from the record alone: one unlikely token far off (noise-like), or many moved."""
    import json

    from skyrl_glm.skyrl.run.summary import RunSummary
    from skyrl_glm.skyrl.run.trainer import failed_tokens

    decode = Diff([0.001, 2.838123, 0.002], [1e-5, 0.0248596, 2e-5])
    tokens = failed_tokens(prefill=Diff([0.01], [0.001]), decode=decode)
    assert tokens["decode"] == {"dlogp": [0.001, 2.838, 0.002], "dp": [1e-5, 0.02486, 2e-5]}
    assert failed_tokens(prefill=Diff([0.01], [0.001]), decode=None).keys() == {"prefill"}
    record = AgreeRecord(
        sync=4,
        passed=False,
        lora_b_max=0.58,
        failed_tokens=tokens,
        **path_figures("decode", decode),
        **path_figures("prefill", None),
    )
    summary = RunSummary(sync_mode="memory", expert_layout="per-expert")
    summary.agree.append(record)
    written = json.loads(json.dumps(summary.to_json()))
    assert written["agree"][0]["failed_tokens"]["decode"]["dlogp"][1] == 2.838
