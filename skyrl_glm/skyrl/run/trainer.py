"""SkyRL's ``RayPPOTrainer`` with skyrl-glm's sync settings handed to the workers and the handoff check run
after the weight syncs.

``train()`` syncs before step 1 and after every step through ``dispatch.save_weights_for_sampler``; wrapping that
(from :meth:`GlmPPOTrainer.init_weight_sync_state`, which ``train()`` calls first) catches exactly those syncs
without forking the loop. After the first sync the full five-step check runs; after every N-th later sync an
agree check (step 1 alone) on fresh probes. A failed check aborts the run (:class:`HandoffCheckFailed`, with the
report) or, with ``on_failure=warn``, is logged and training goes on. Numbers go to the log and to SkyRL's
tracker (``skyrl_glm/*`` keys in the step's metrics).
"""

from __future__ import annotations

import asyncio
import io
import logging
import time
from typing import Any

import ray
from rich.console import Console
from skyrl.backends.skyrl_train.inference_servers.utils import resolve_policy_model_name
from skyrl.train.config import PlacementConfig
from skyrl.train.trainer import RayPPOTrainer

from skyrl_glm.check.algorithm import CheckReport, Diff, StepResult, decode_diff, judge_agreement
from skyrl_glm.check.algorithm import run_check as run_five_steps
from skyrl_glm.check.probes import Probes, make_probes
from skyrl_glm.check.report import print_table, to_dict
from skyrl_glm.dapo.report import dumped_eval_metrics
from skyrl_glm.skyrl.config.overlong import shape_rewards
from skyrl_glm.skyrl.config.sections import GlmSection, colocated_gpu
from skyrl_glm.skyrl.run.check_live import HandoffCheckFailed, LivePublisher, LiveSampler, LiveTrainer
from skyrl_glm.skyrl.run.mismatch_log import generation_kl
from skyrl_glm.skyrl.run.run_log import PROGRESS_LOGGER
from skyrl_glm.skyrl.run.summary import AgreeRecord, CheckRecord, RunSummary, SyncRecord
from skyrl_glm.skyrl.workers.publish import one_server
from skyrl_glm.skyrl.workers.worker_sync import WorkerSync

log = logging.getLogger(__name__)
PATH_FIGURES = ("max", "mean", "trimmed_mean", "prob_max")  # what the agree record keeps of each path's Diff
progress = logging.getLogger(PROGRESS_LOGGER)  # one line per sync on the terminal of `skyrl-glm train`

CHECK_TEMPERATURE = 1.0  # vLLM reports raw logprobs; the trainer divides logits by its temperature


def worker_sync(glm: GlmSection, placement: PlacementConfig) -> WorkerSync:
    """The workers' part of ``skyrl_glm.sync`` (rank 0 resolves the transport per engine)."""
    sync = glm.sync
    return WorkerSync(
        sync.mode,
        sync.transport,
        sync.bucket_bytes,
        sync.verify,
        sync.fault,
        fault_at_step=sync.fault_at_step,
        colocated_gpu=colocated_gpu(glm, placement),
    )


def _render(report: CheckReport) -> str:
    out = io.StringIO()
    print_table(report, Console(file=out, width=120, force_terminal=False))
    return out.getvalue()


class GlmPPOTrainer(RayPPOTrainer):
    """The PPO trainer of a skyrl-glm run; ``worker_classes`` are the ``(policy, critic, ref)`` Ray actor classes
    the experiment picked from the plugin registry."""

    def __init__(self, *args: Any, worker_classes: tuple[Any, Any, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.worker_classes = worker_classes

    def build_models(self, PolicyWorker: Any, CriticWorker: Any, RefWorker: Any) -> None:  # noqa: N803 - SkyRL's names
        # SkyRL's _setup_trainer passes its own hard-coded classes; the experiment's registry choice replaces them.
        super().build_models(*self.worker_classes)

    def postprocess_generator_output(self, generator_output: Any, uids: Any, *args: Any, **kwargs: Any) -> Any:
        cap = self.cfg.generator.sampling_params.max_generate_length
        shape_rewards(generator_output, self.cfg.skyrl_glm.overlong, cap)  # DAPO soft overlong penalty
        return super().postprocess_generator_output(generator_output, uids, *args, **kwargs)

    def fwd_logprobs_values_reward(self, training_input: Any) -> Any:
        """SkyRL's forward passes, then the generation KL of the step's rollouts (:func:`generation_kl`) beside
        SkyRL's own |dlogp| figures, from the same tensors."""
        out = super().fwd_logprobs_values_reward(training_input)
        rollout, trained = out.get("rollout_logprobs"), out.get("action_log_probs")
        if rollout is not None and trained is not None:
            self.all_metrics.update(generation_kl(rollout, trained, out["loss_mask"]))
        return out

    async def eval(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        metrics = await super().eval(*args, **kwargs)
        if self.cfg.trainer.dump_eval_results:  # accuracy (mean@n) and cap share per eval set, from the dump
            metrics.update(dumped_eval_metrics(self.cfg.trainer.export_path, self.global_step))
        return metrics

    def init_weight_sync_state(self) -> None:
        settings = worker_sync(self.cfg.skyrl_glm, self.cfg.trainer.placement)
        ray.get(self.policy_model.async_run_ray_method("pass_through", "skyrl_glm_configure", settings.to_dict()))
        super().init_weight_sync_state()
        self._glm_sync = self.dispatch.save_weights_for_sampler
        self._glm_syncs = 0
        client = self.inference_engine_client
        self._glm_engines = [one_server(client, url) for url in client.server_urls]  # the check asks each engine
        routes = ray.get(self.policy_model.async_run_ray_method("pass_through", "skyrl_glm_routes"))[0]
        rank_nodes = ray.get(self.policy_model.async_run_ray_method("pass_through", "skyrl_glm_node"))
        for r in routes:
            log.info(
                "skyrl-glm route: engine %s on %s takes %s from %s", r["engine"], r["node"], r["transport"], r["sender"]
            )
        glm = self.cfg.skyrl_glm
        checked = glm.check.before_training or glm.check.every_n_syncs > 0
        targets = self.cfg.trainer.policy.model.lora.target_modules  # a list, or one of PEFT's names ("all-linear")
        self.summary = RunSummary(
            glm.sync.mode,
            glm.sync.expert_layout,
            run={
                "fault": glm.sync.fault,
                "fault_at_step": glm.sync.fault_at_step,
                "check": checked,
                "targets": targets if isinstance(targets, str) else list(targets),
                "strategy": self.cfg.trainer.strategy,
                # what SkyRL's own sync does where skyrl-glm's is off (mode=disk): its files, or its memory mode
                "skyrl_lora_sync_mode": self.cfg.trainer.policy.model.lora.sync_mode,
                "routes": routes,
                "policy_nodes": rank_nodes,
            },
        )
        self.dispatch.save_weights_for_sampler = self._sync_then_check  # the instance attribute shadows the method
        check = " and the handoff check" if self.cfg.skyrl_glm.check.before_training else ""
        progress.info("policy workers and vLLM up; first sync%s ...", check)

    # -- the wrapped sync ------------------------------------------------------------------------------
    async def _sync_then_check(self, model_id: str | None = None) -> None:
        self._arm_fault()
        t0 = time.perf_counter()
        await self._glm_sync(model_id)
        seconds = time.perf_counter() - t0
        self._glm_syncs += 1
        mode = self.cfg.skyrl_glm.sync.mode
        detail = ray.get(self.policy_model.async_run_ray_method("pass_through", "skyrl_glm_last_sync"))[0]
        first_request = await self._first_request_seconds()
        self.summary.syncs.append(SyncRecord(seconds, detail or {}, self.global_step, first_request))
        log.info(
            "skyrl-glm sync %d (mode %s): %.3f s%s",
            self._glm_syncs,
            mode,
            seconds,
            f" {_short(detail)}" if detail else "",
        )
        self.all_metrics.update({"skyrl_glm/sync_s": seconds, "skyrl_glm/syncs": self._glm_syncs})
        self.all_metrics["skyrl_glm/first_request_s"] = first_request
        check = self.cfg.skyrl_glm.check
        verdict = "no check"
        if self._glm_syncs == 1:
            if check.before_training:
                await self.handoff_check()
                assert self.summary.check is not None
                passed, took = self.summary.check.passed, self.summary.check.seconds
                verdict = f"handoff check {'PASS' if passed else 'FAIL'} ({took:.1f} s)"
        elif check.every_n_syncs and (self._glm_syncs - 1) % check.every_n_syncs == 0:
            agreed = (await self.agree_check()).passed
            verdict = f"agree check {'ok' if agreed else 'FAIL'}"
        if self._glm_syncs == 1:
            progress.info("before step 1: sync %.3f s, %s", seconds, verdict)
        else:
            reward = self.all_metrics.get("reward/avg_raw_reward")
            progress.info(
                "step %d/%d: reward %s, sync %.3f s, %s",
                self.global_step,
                self.total_training_steps,
                "-" if reward is None else f"{reward:.3f}",
                seconds,
                verdict,
            )

    def _arm_fault(self) -> None:
        """``skyrl_glm.sync.fault_at_step`` k: before the sync that follows step k the workers' publisher takes the
        fault, for this sync and every later one."""
        sync = self.cfg.skyrl_glm.sync
        if not sync.fault_at_step or self.global_step < sync.fault_at_step or self.summary.run.get("fault_armed_at"):
            return
        ray.get(self.policy_model.async_run_ray_method("pass_through", "skyrl_glm_arm_fault"))
        self.summary.run["fault_armed_at"] = self.global_step
        log.warning("skyrl-glm fault %s armed: the syncs from step %d on are broken", sync.fault, self.global_step)

    async def _first_request_seconds(self) -> float:
        """Wall time of one one-token request on the served adapter right after a sync: what the first request on
        the new version costs (vLLM activates a newly loaded LoRA on first use)."""
        _, sampler, _ = self._live()
        prompt = self._probes(self.cfg.skyrl_glm.check.seed).sequences[0][: self.cfg.skyrl_glm.check.prompt_length]
        t0 = time.perf_counter()
        await sampler.first_token(prompt)
        return time.perf_counter() - t0

    # -- the check -------------------------------------------------------------------------------------
    def _probes(self, seed: int) -> Probes:
        c = self.cfg.skyrl_glm.check
        return make_probes(
            len(self.tokenizer),
            num=c.num_probes,
            length=c.probe_length,
            prompt_length=c.prompt_length,
            decode_tokens=c.decode_tokens,
            seed=seed,
        )

    def _live(self) -> tuple[LiveTrainer, LiveSampler, asyncio.AbstractEventLoop]:
        loop = asyncio.get_running_loop()
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        trainer = LiveTrainer(self.dispatch, self.policy_model, pad)
        sampler = LiveSampler(self._glm_engines, resolve_policy_model_name(self.cfg), loop)
        return trainer, sampler, loop

    def _at_check_temperature(self, on: bool) -> None:
        run_temperature = self.cfg.trainer.algorithm.temperature
        if run_temperature != CHECK_TEMPERATURE:
            value = CHECK_TEMPERATURE if on else run_temperature
            self.dispatch.set_algorithm_config("policy", temperature=value)

    async def handoff_check(self) -> CheckReport:
        """The five steps on the live trainer and sampler; the trainer's adapter is restored and re-synced after."""
        trainer, sampler, loop = self._live()
        publisher = LivePublisher(self._glm_sync, loop)
        t0 = time.perf_counter()
        self._at_check_temperature(True)
        try:
            report = await asyncio.to_thread(
                run_five_steps,
                trainer,
                sampler,
                publisher,
                self._probes(self.cfg.skyrl_glm.check.seed),
                self.cfg.skyrl_glm.check.check_config(),
            )
        finally:
            restored = await asyncio.to_thread(trainer.restore_lora_b)
            if restored:
                await self._glm_sync()
            self._at_check_temperature(False)
        seconds = time.perf_counter() - t0
        log.info("skyrl-glm handoff check before step 1 (%.1f s):\n%s", seconds, _render(report))
        metrics: dict[str, float] = {"skyrl_glm/check_passed": float(report.passed), "skyrl_glm/check_s": seconds}
        for s in report.steps:
            for path, d in (("prefill", s.prefill), ("decode", s.decode)):
                if d is not None:
                    metrics[f"skyrl_glm/check_step{s.step}_{path}_max"] = d.max
                    metrics[f"skyrl_glm/check_step{s.step}_{path}_mean"] = d.mean
        self.all_metrics.update(metrics)
        self.summary.check = CheckRecord(report.passed, seconds, to_dict(report))
        if not report.passed:
            self._failed(f"handoff check FAILED before step 1:\n{_render(report)}")
        return report

    async def agree_check(self) -> StepResult:
        """Step 1 alone on fresh probes: does the sampler serve what the trainer holds after this sync?"""
        trainer, sampler, _ = self._live()
        probes = self._probes(self.cfg.skyrl_glm.check.seed + self._glm_syncs)
        config = self.cfg.skyrl_glm.check.check_config()

        def agree() -> StepResult:
            t0 = time.perf_counter()
            prefill = Diff.between(trainer.score(probes.sequences), sampler.score(probes.sequences))
            decode = decode_diff(trainer, sampler, probes) if config.decode else None
            return judge_agreement(1, "agree", prefill, decode, config, time.perf_counter() - t0)

        self._at_check_temperature(True)
        try:
            result = await asyncio.to_thread(agree)
            lora_b = await asyncio.to_thread(trainer.lora_b_max)
        finally:
            self._at_check_temperature(False)
        record = AgreeRecord(
            sync=self._glm_syncs,
            passed=result.passed,
            lora_b_max=lora_b,
            step=self.global_step,
            mean_tol=config.mean_tol,
            prob_tol=config.prob_tol,
            **path_figures("prefill", result.prefill),
            **path_figures("decode", result.decode),
            failed_tokens=None if result.passed else failed_tokens(prefill=result.prefill, decode=result.decode),
        )
        self.summary.agree.append(record)
        measured = ("prefill", "decode") if result.decode else ("prefill",)
        log.info(
            "skyrl-glm agree check after sync %d: %s: %s; trainer max|lora_B| %.3g (%s)",
            self._glm_syncs,
            "ok" if result.passed else "FAIL",
            ", ".join(f"{p} mean {_nan(record, p, 'mean'):.3g} max {_nan(record, p, 'max'):.3g}" for p in measured),
            lora_b,
            result.detail,
        )
        self.all_metrics.update(
            {
                "skyrl_glm/agree_passed": float(result.passed),
                "skyrl_glm/agree_prefill_max": _nan(record, "prefill", "max"),
                "skyrl_glm/agree_decode_max": _nan(record, "decode", "max"),
                "skyrl_glm/lora_b_max": lora_b,
            }
        )
        if not result.passed:
            self._failed(f"agree check FAILED after sync {self._glm_syncs}: {result.detail}")
        return result

    def _failed(self, report: str) -> None:
        if self.cfg.skyrl_glm.check.on_failure == "abort":
            raise HandoffCheckFailed(report, self.summary)
        log.warning("skyrl-glm %s (on_failure=warn: training goes on)", report)


def path_figures(path: str, diff: Diff | None) -> dict[str, float | None]:
    """One path's figures under the agree record's names (``prefill_max``, ``prefill_mean``, ``prefill_prob_max``);
    each None where the path was not measured (no diff)."""
    return {f"{path}_{figure}": getattr(diff, figure, None) for figure in PATH_FIGURES}


def failed_tokens(**diffs: Diff | None) -> dict[str, dict[str, list[float]]]:
    """Each measured path's per-token |dlogp| and |dp| (4 significant digits), for a failed check's record."""
    return {
        path: {"dlogp": [float(f"{x:.4g}") for x in d.per_token], "dp": [float(f"{x:.4g}") for x in d.prob_per_token]}
        for path, d in diffs.items()
        if d is not None
    }


def _nan(record: AgreeRecord, path: str, figure: str) -> float:
    """A figure of the record for a metric or a log line: NaN where the path was not measured."""
    value = getattr(record, f"{path}_{figure}")
    return float("nan") if value is None else value


def _short(timings: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in timings.items())
