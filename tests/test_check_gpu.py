"""The check on vLLM's GPU build (real kernels): routed-expert LoRA published per expert, in memory (CUDA IPC) and
from disk, for GLM-5.3 (DSA sparse attention, DeepGEMM indexer) and GLM-4.5; every fault must fail where it should.

GPU only (skipped on CPU CI). ``SKYRL_GLM_GPU_RESULTS=DIR`` keeps each matrix's JSON report there.
"""

from __future__ import annotations

import pytest
from gpu_vllm import MARKS, keep_result, require_cuda_vllm

pytestmark = MARKS
require_cuda_vllm()

FAULTS = ["none", "no-publish", "double-scale", "drop-aliases"]


@pytest.mark.parametrize("model", ["glm-4.5", "glm-5.3"])
def test_default_targets_pass_and_faults_fail_on_gpu(model: str) -> None:
    from skyrl_glm.check.matrix import run_matrix
    from skyrl_glm.check.runner import CheckOptions

    result = run_matrix(CheckOptions(model=model, device="cuda"), ["ipc", "disk"], FAULTS)
    keep_result(f"check_matrix_{model}.json", result)
    targets = result["lora_targets"]
    assert {"gate_proj", "up_proj", "down_proj"} <= set(targets)  # routed experts published per expert
    rows = {(r["transport"], r["fault"]): r for r in result["checks"]}
    assert rows[("ipc", "none")]["outcome"] == "PASS"
    assert rows[("disk", "none")]["outcome"] == "PASS"
    for fault in FAULTS[1:]:
        assert rows[("ipc", fault)]["as_expected"], rows[("ipc", fault)]["outcome"]
        assert rows[("ipc", fault)]["outcome"] != "n/a", fault  # routed experts give aliases to drop
    assert result["all_as_expected"], [(k, r["outcome"]) for k, r in rows.items() if not r["as_expected"]]
