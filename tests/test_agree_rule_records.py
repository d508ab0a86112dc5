"""The agree rule judged again on what the GPU recorded: every check of the H200 check matrices and the 20-seed
drop-experts runs keeps its per-token |dlogp| and |dp|. Under the rule as it stands (:meth:`Diff.within`), every
healthy agree step (step 1 of every check, step 5 of a check without a fault) still passes and every injected fault
still fails step 5: a rule loose enough to let a fault through, or tight enough to stop the healthy checks, fails
here on real engine numbers. Records made before the per-token probability was kept are judged on the mean alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skyrl_glm.check.algorithm import CheckConfig, Diff

BENCH = Path(__file__).resolve().parent.parent / "docs" / "bench"
RECORDS = [
    "h200_vllm030_drop_experts_glm45.json",
    "h200_vllm030_drop_experts_glm53.json",
    "h200_vllm030_check_matrix_glm45.json",
    "h200_vllm030_check_matrix_glm53.json",
    "h200_vllm030_check_skyrl_engine_glm45.json",
    "h200_vllm030_check_skyrl_engine_glm53.json",
]


def _agree_steps(record: dict) -> list[tuple[str, int, bool]]:
    """``(fault, step, passes under the rule)`` for steps 1 and 5 of every check in a record."""
    cfg = CheckConfig()
    checks = record.get("checks") or [{"fault": "none", "report": record}]
    out = []
    for check in checks:
        if check.get("report") is None:  # a pair the matrix does not run (n/a)
            continue
        for step in check["report"]["steps"]:
            if step["step"] not in (1, 5):
                continue
            paths = [step[p] for p in ("prefill", "decode") if step.get(p)]
            diffs = [Diff(p["per_token"], p.get("prob_per_token", [])) for p in paths]
            out.append(
                (check.get("fault", "none"), step["step"], all(d.within(cfg.mean_tol, cfg.prob_tol) for d in diffs))
            )
    return out


@pytest.mark.parametrize("name", RECORDS)
def test_the_rule_passes_every_healthy_agree_step_and_fails_every_fault_recorded_on_the_gpu(name: str) -> None:
    steps = _agree_steps(json.loads((BENCH / name).read_text()))
    healthy = [ok for fault, step, ok in steps if step == 1 or fault == "none"]
    faulted = [ok for fault, step, ok in steps if step == 5 and fault != "none"]
    assert healthy and all(healthy), f"{name}: {healthy.count(False)} healthy agree steps stopped"
    assert not any(faulted), f"{name}: {faulted.count(True)} faults passed step 5"
