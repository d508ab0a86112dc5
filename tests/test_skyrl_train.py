"""SkyRL 0.4's real GRPO loop on CPU (Ray, FSDP2 policy worker, SkyRL's vLLM server + router, skyrl-glm's envs)
with skyrl-glm's sync and check inside it: the canary with the memory sync over the collective transport on gloo
(the reward must rise: the loop learns through the sync), the tiny recipe with SkyRL's disk sync, and the canary
with a broken sync (memory over shared memory), which the check stops before step 1, and the canary whose sync
breaks after step 2, which the agree check after that sync stops (started after the other three have ended).

Each run is a subprocess through one of the two doors (`skyrl-glm train`, or SkyRL's `main_base` with
`trainer.override_entrypoint=skyrl_glm.train`), about 100 s on 2 cores (Ray, the vLLM CPU server and the policy
worker start per run), and writes its summary to `<trainer.log_path>/skyrl_glm_summary.json`. The first three runs start
together when the first test asks for one (each has its own Ray cluster, ports, control key and directories, as
two runs on one host do: docs/skyrl.md), so their start-ups, which mostly keep one core busy with imports, overlap;
each test then judges its own run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from background import Background

from skyrl_glm.quiet import QUIET

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "recipes/tiny_cpu_grpo.yaml"
CANARY = "recipes/canary.yaml"
CANARY_STEPS = 16
# The canary's rise, the mean reward of the last four steps minus the first four's, must exceed this. Measured on
# the 2-core machine (docs/skyrl.md), 16 steps: a sync that never publishes (check off) -0.0015, its step means
# scattered by 0.004 (std), so the rise of such a run has a std of ~0.003; the memory sync with attention LoRA
# alone +0.01-0.02 in most runs (a threshold of 0.01 failed one), with the MLP too (the recipe since 2026-12-02)
# +0.40 (0.038 -> 0.492), so 0.05 is ~15 noise stds and far below what the learning run shows.
MIN_RISE = 0.05
RISE_WINDOW = 4
SECONDS_PER_SYNC: dict[str, list[float]] = {}
FAULT_STEP = 2  # the fault-at-step run's fault starts with the sync after this step
DISK_LORA_WARNING = "saves LoRA adapters to disk"  # SkyRL's warning when trainer and vLLM are not colocated


# The two doors: skyrl-glm's CLI, and SkyRL's own entrypoint handing over to skyrl_glm.train.
CLI = ("-m", "skyrl_glm.cli", "train")
SKYRL_MAIN = ("-m", "skyrl.train.entrypoints.main_base", "trainer.override_entrypoint=skyrl_glm.train")


class Run(Background):
    def result(self) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
        """Waits for the run: its exit, output and summary (None when it wrote none)."""
        # ~100 s alone on a quiet 2-core machine; the three together, or a loaded machine, take longer
        done = self.wait(timeout=1500)
        summary_file = self.tmp / "log_path" / "skyrl_glm_summary.json"
        return done, json.loads(summary_file.read_text()) if summary_file.is_file() else None


def start(tmp: Path, cache: Path, *overrides: str, door: tuple[str, ...] = CLI, recipe: str = RECIPE) -> Run:
    """One run started in the background; its stdout and stderr go to files beside its outputs."""
    paths = [f"trainer.{key}={tmp / key}" for key in ("export_path", "ckpt_path", "log_path")]
    args = [*paths, f"trainer.policy.model.lora.lora_sync_path={tmp / 'lora_sync'}", *overrides]
    # The third-party log settings `skyrl-glm` commands set (a value already set wins, as there): SkyRL's door
    # imports vLLM and SkyRL's patches before skyrl_glm.train can set them. These runs used to inherit them from an
    # in-process `skyrl-glm report` of an earlier test; started together, no such test has run yet.
    env = {**QUIET, **os.environ, "PYTHONPATH": str(ROOT), "SKYRL_GLM_CACHE": str(cache), "VLLM_CPU_KVCACHE_SPACE": "1"}
    return Run.start(tmp, [sys.executable, *door, recipe, *args], cwd=ROOT, env=env)


def tail(proc: subprocess.CompletedProcess[str]) -> str:
    return (proc.stdout + proc.stderr)[-6000:]


def run_log(tmp: Path) -> str:
    """The run's full log (SkyRL's, Ray's and vLLM's lines; the terminal shows progress lines only)."""
    (log,) = (tmp / "log_path").glob("skyrl-glm-train-*.log")
    return log.read_text()


def assert_quiet_with_outputs_named(proc: subprocess.CompletedProcess[str], tmp: Path, steps: int = 2) -> None:
    """At most 20 lines plus two per step (its progress line and its row of the per-step table), and an end that
    says where the summary, rewards PNG, export, log and report are."""
    lines = (proc.stdout + proc.stderr).splitlines()
    assert len(lines) <= 20 + 2 * steps, "\n".join(lines)
    assert any(line.startswith(f"step 1/{steps}: reward ") for line in lines) and any(
        line.startswith(f"step {steps}/{steps}: reward ") and "agree check ok" in line for line in lines
    ), lines
    assert any(line.startswith("per step (") for line in lines), lines  # the per-step table's title
    out = proc.stdout.splitlines()
    end = out[next(i for i, line in enumerate(out) if line.startswith("trained in ")) :]
    assert f"handoff check PASS, agree checks {steps}/{steps} ok" in end[0], end
    assert f"  rewards  {tmp / 'log_path' / 'skyrl_glm_rewards.png'}" in end, end
    (log,) = (tmp / "log_path").glob("skyrl-glm-train-*.log")
    assert f"  summary  {tmp / 'log_path' / 'skyrl_glm_summary.json'}" in end
    assert f"  export   {tmp / 'export_path'}" in end and f"  log      {log}" in end
    assert f"  report   skyrl-glm report {tmp / 'export_path'}" in end
    assert "Finished: 'step'" in log.read_text()  # SkyRL's own lines are all in the log file


def assert_trained_and_checked(summary: dict[str, Any], mode: str, steps: int = 2) -> None:
    assert summary["sync_mode"] == mode
    assert summary["expert_layout"] == "per-expert"  # the recipe's, set as the engines' argument
    assert "q_proj" in summary["run"]["targets"]  # the LoRA targets the run trained, as its recipe gives them
    # one sync before step 1, one after each step
    assert [s["step"] for s in summary["syncs"]] == list(range(steps + 1)), summary["syncs"]
    assert summary["check"]["passed"], summary["check"]
    check_steps = summary["check"]["report"]["steps"]
    assert [s["step"] for s in check_steps] == [1, 2, 3, 4, 5] and all(s["passed"] for s in check_steps)
    assert [a["sync"] for a in summary["agree"]] == list(range(2, steps + 2)), summary["agree"]
    assert all(a["passed"] for a in summary["agree"])
    last = summary["agree"][-1]
    assert last["lora_b_max"] > 0, "LoRA B never left its zero initialisation: nothing trained"
    # after the last sync the sampler's logprobs match the trainer's (tolerances of the recipe's check)
    assert last["prefill_max"] <= 1e-2 and last["decode_max"] <= 1e-2, last
    SECONDS_PER_SYNC[mode] = [s["seconds"] for s in summary["syncs"]]
    assert_step_figures(summary, mode, steps)


def assert_step_figures(summary: dict[str, Any], mode: str, steps: int) -> None:
    """One row per step with its reward, step time, the sync after it by stage, the first request on the new
    version, the agree check's margins with their tolerances, and the mismatch."""
    rows = summary["steps"]
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), rows
    stages = ("plan_s", "receive_s", "load_s") if mode == "memory" else ("save_s", "load_s")
    for r in rows:
        assert r["reward"] is not None and r["step_s"] > 0 and r["generate_s"] > 0, r
        assert r["sync_s"] > 0 and r["first_request_s"] > 0 and all(r[k] > 0 for k in stages), r
        assert r["agree_passed"] and r["agree_prefill_prob_max"] <= r["agree_prob_tol"] == 1e-2, r
        assert r["agree_prefill_mean"] <= r["agree_mean_tol"] == 1e-3, r
        assert r["mismatch_mean"] is not None, r


def assert_reward_rises(summary: dict[str, Any]) -> None:
    """The canary learned: its mean reward rose by more than run-to-run noise can explain."""
    from skyrl_glm.canary.curves import rewards, rise

    curve = rewards(summary)
    assert len(curve) == CANARY_STEPS, curve
    assert rise(curve, RISE_WINDOW) > MIN_RISE, f"reward did not rise: {' '.join(f'{r:.3f}' for r in curve)}"


# Evals of the tiny math set before step 1 and after the last, so `skyrl-glm report` is exercised on this run too.
CANARY_EVALS = (
    f"data.val_data=[{ROOT / 'skyrl_glm' / 'data' / 'tiny_math.jsonl'}]",
    f"trainer.eval_interval={CANARY_STEPS}",
    "trainer.eval_before_train=true",
    "trainer.dump_eval_results=true",
    "generator.eval_n_samples_per_prompt=2",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    """The module's first three runs, started together (see the module's docstring); any still running at the end is
    stopped."""
    cache = tmp_path_factory.mktemp("tiny-models")
    started = {
        # The collective transport (NCCL between separate GPUs) over gloo: a group of the trainer's sending rank
        # and the vLLM worker, the buckets broadcast over it, the manifest over the servers' control plane. The
        # shared-memory transport (what `auto` picks on one node) runs in the broken-sync run.
        "canary": ("skyrl_glm.sync.transport=nccl", *CANARY_EVALS, {"recipe": CANARY}),
        # Sampling at T=0.7 as well: SkyRL's trainer divides logits by it and vLLM's logprobs are raw, so the
        # check must score at T=1.0 to agree at the recipe's 1e-2 tolerance (at T=0.7 the gap was 0.68-0.90).
        # Through SkyRL's own entrypoint: `main_base trainer.override_entrypoint=skyrl_glm.train`.
        "disk": ("skyrl_glm.sync.mode=disk", "generator.sampling_params.temperature=0.7", {"door": SKYRL_MAIN}),
        "no-publish": ("skyrl_glm.sync.fault=no-publish", {"recipe": CANARY}),
    }
    out = {}
    for name, (*overrides, options) in started.items():
        out[name] = start(tmp_path_factory.mktemp(name), cache, *overrides, **options)
    yield out
    for run in out.values():
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()


def test_memory_sync_canary_learns_without_writing_an_adapter(runs: dict[str, Run]) -> None:
    tmp_path = runs["canary"].tmp
    proc, summary = runs["canary"].result()
    assert proc.returncode == 0, tail(proc)
    assert summary is not None
    assert_trained_and_checked(summary, "memory", CANARY_STEPS)
    assert_reward_rises(summary)
    assert_quiet_with_outputs_named(proc, tmp_path, CANARY_STEPS)
    # SkyRL's warning that LoRA adapters are saved to disk is false here (the disk run below shows it is true there)
    assert DISK_LORA_WARNING not in run_log(tmp_path)
    # every sync went through skyrl-glm's publisher (versions count up, plan and receive timed) ...
    assert [s["version"] for s in summary["syncs"]] == sorted(s["version"] for s in summary["syncs"])
    assert all(s["ok"] and s["receive_s"] > 0 and s["transport"] == "nccl" for s in summary["syncs"])
    # ... and no adapter file was written: SkyRL's LoRA sync directory stays empty
    sync_dir = tmp_path / "lora_sync"
    assert not sync_dir.exists() or not any(sync_dir.iterdir()), list(sync_dir.iterdir())
    # the GLM reward scored the evals SkyRL dumped, and `skyrl-glm report` renders them (table + PNG)
    report_run_dir(tmp_path / "export_path", (0, CANARY_STEPS))
    assert_mismatch_logged(summary, CANARY_STEPS)


def assert_mismatch_logged(summary: dict[str, Any], steps: int = 2) -> None:
    """The recipe's off-policy correction ran (its TIS and outlier-mask metrics exist only when it is on) and each
    step's trainer/sampler mismatch is in the summary."""
    mismatch = summary["mismatch"]
    assert [m["step"] for m in mismatch] == list(range(1, steps + 1)), mismatch
    for m in mismatch:
        gap = m["policy/rollout_train_logprobs_abs_diff_mean"]
        assert 0 <= gap < 0.05, m  # fp32 on both sides: the sampled tokens' logprobs agree closely
        assert m["policy/rollout_train_logprobs_abs_diff_max"] >= gap
        assert 0.5 < m["policy/loss_metrics/is_ratio_mean"] < 2.0, m
        assert 0 <= m["policy/loss_metrics/tis_token_clip_high_ratio"] <= 1, m
        assert 0 <= m["policy/loss_metrics/outlier_seq_masked_ratio"] <= 1, m


def report_run_dir(export: Path, steps: tuple[int, ...]) -> None:
    from skyrl_glm.cli import main
    from skyrl_glm.dapo.report import collect

    points = collect(export)  # eval before step 1 and after the last step; 8 prompts x 2 samples
    assert [(p.step, p.data_source, p.prompts, p.samples_per_prompt) for p in points] == [
        (s, "tiny_math", 8, 2) for s in steps
    ]
    assert all(p.cap_share > 0.5 for p in points)  # a random model rarely stops inside 16 tokens
    last = export / "dumped_evals" / f"global_step_{steps[-1]}_evals" / "tiny_math.jsonl"
    records = last.read_text().splitlines()
    assert all(json.loads(r)["env_class"] == "glm_math" for r in records)
    assert main(["report", str(export), "--png", str(export / "report.png")]) == 0
    assert (export / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_disk_sync_runs_the_same_recipe(runs: dict[str, Run], capsys: pytest.CaptureFixture[str]) -> None:
    tmp_path = runs["disk"].tmp
    proc, summary = runs["disk"].result()
    assert proc.returncode == 0, tail(proc)
    assert summary is not None
    assert_trained_and_checked(summary, "disk")
    assert (tmp_path / "lora_sync" / "adapter_model.safetensors").is_file()  # SkyRL's own file sync ran
    assert_quiet_with_outputs_named(proc, tmp_path)  # SkyRL's door is as quiet
    assert DISK_LORA_WARNING in run_log(tmp_path)  # true with SkyRL's file sync, so not filtered
    with capsys.disabled():
        for mode, seconds in SECONDS_PER_SYNC.items():
            print(f"\n[skyrl-glm] {mode} sync, seconds per sync: {' '.join(f'{s:.3f}' for s in seconds)}")


def test_a_broken_sync_aborts_at_the_first_check_with_the_report(runs: dict[str, Run]) -> None:
    tmp_path = runs["no-publish"].tmp
    proc, summary = runs["no-publish"].result()
    assert proc.returncode == 1, tail(proc)
    assert summary is not None  # the stopped run's summary: what the check measured, every step's tokens
    assert summary["steps"] == [] and not summary["check"]["passed"], summary
    failed = summary["check"]["report"]["steps"][4]
    assert failed["step"] == 5 and not failed["passed"] and failed["prefill"]["per_token"], failed
    assert "stopped by the handoff check" in proc.stderr, tail(proc)
    report = proc.stderr[proc.stderr.index("stopped by the handoff check") :]
    assert "five-step handoff check" in report and "FAIL at step 5 (agree again)" in report, report
    assert "Finished: 'step'" not in run_log(tmp_path)  # no training step ran
    assert proc.stderr.splitlines()[-2].startswith("summary: "), tail(proc)
    assert proc.stderr.splitlines()[-1].startswith("full log: "), tail(proc)


@pytest.fixture(scope="module")
def fault_at_step(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """A fault that starts mid-run: the shared expert's LoRA dropped from every sync after step 2 (the CPU analogue
    of drop-experts). Started when its test asks, the module's last, once the three runs above have ended: a fourth
    run beside them ran a shared 24 GB machine out of memory (Ray killed the experiment and its retry hung). Four
    steps at most, so a missed fault ends the run (exit 0) instead of training on."""
    overrides = (
        "skyrl_glm.sync.fault=drop-shared-experts",
        f"skyrl_glm.sync.fault_at_step={FAULT_STEP}",
        "trainer.max_training_steps=4",
    )
    run = start(
        tmp_path_factory.mktemp("fault-at-step"), tmp_path_factory.mktemp("tiny-models"), *overrides, recipe=CANARY
    )
    yield run
    if run.proc.poll() is None:
        run.proc.kill()
        run.proc.wait()


def test_a_fault_started_at_step_k_is_stopped_by_the_agree_check_after_the_next_sync(fault_at_step: Run) -> None:
    """The syncs before and after step 1 are intact (the check before step 1 and the agree check after step 1 pass);
    the sync after step 2 sends the adapter without the shared expert's LoRA and the agree check after it stops the
    run: within one sync of the fault, with the report."""
    from skyrl_glm.canary.curves import stop_verdict

    tmp_path = fault_at_step.tmp
    proc, summary = fault_at_step.result()
    assert proc.returncode == 1, tail(proc)
    assert summary is not None
    assert summary["check"]["passed"], summary["check"]  # the fault had not started before step 1
    assert summary["run"]["fault_armed_at"] == FAULT_STEP
    assert [(a["step"], a["passed"]) for a in summary["agree"]] == [(1, True), (FAULT_STEP, False)], summary["agree"]
    # step 2's figures are logged after its sync, which the check stopped: the summary holds step 1's row
    assert [r["step"] for r in summary["steps"]] == [1]
    assert summary["steps"][0]["gen_kl"] < 1e-6, summary["steps"]  # fp32 both sides: the rollouts agree
    assert stop_verdict(summary) == f"caught after step {FAULT_STEP}"
    failed = summary["agree"][-1]
    assert failed["prefill_mean"] > failed["mean_tol"], failed  # the trained shared expert is missing on the sampler
    assert "stopped by the handoff check" in proc.stderr and "agree check FAILED after sync 3" in proc.stderr, tail(
        proc
    )
    assert "Finished: 'step'" in run_log(tmp_path)  # step 1 ran to its end
