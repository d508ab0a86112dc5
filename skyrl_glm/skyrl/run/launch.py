"""One training run with SkyRL 0.4's loop and skyrl-glm's sync and check, from a command line: what
``skyrl-glm train`` and both doors of :mod:`skyrl_glm.train` run.

RECIPE is a YAML file or a packaged recipe name (``skyrl_glm/recipes``); ``key=value`` overrides any key of
SkyRL's config or of the ``skyrl_glm`` section. A model path ``tiny:<family>`` is a tiny random-weight checkpoint
of a registered model family, made locally (deterministic, cached). Exit codes (:mod:`skyrl_glm.usage`):
0 trained, 1 the handoff check failed (its report is printed), 2 the run cannot start as given (one line on
stderr: a bad recipe or override, missing data, GPUs Ray does not have), 3 the run failed after it started (one
line naming the error and the log).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skyrl.train.config import TrainerConfig

    from skyrl_glm.skyrl.config.sections import GlmSection, GlmTrainConfig
    from skyrl_glm.skyrl.run.summary import RunSummary

OVERRIDE_ENTRYPOINT = "trainer.override_entrypoint="
TINY_PREFIX = "tiny:"
MODEL_KEY = "trainer.policy.model.path"


def split_args(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """``(recipe or None, overrides)``; SkyRL's ``trainer.override_entrypoint=...`` (how main_base got here)
    is dropped, it is no config key."""
    from skyrl_glm.skyrl.config.sections import ConfigError

    recipe, overrides = None, []
    for i, arg in enumerate(a for a in args if not a.startswith(OVERRIDE_ENTRYPOINT)):
        if "=" in arg:
            overrides.append(arg)
        elif i == 0:
            recipe = arg
        else:
            raise ConfigError(f"command line: {arg!r}: only the first argument may be a recipe; the rest are key=value")
    return recipe, overrides


def tiny_checkpoint(family_name: str) -> Path:
    """The tiny checkpoint of a registered family (seed 0), from the cache the check shares
    (:func:`skyrl_glm.models.tiny_cache.cached_tiny`)."""
    from skyrl_glm.models.tiny_cache import cached_tiny
    from skyrl_glm.plugins import RegistryError, registry
    from skyrl_glm.skyrl.config.sections import ConfigError

    try:
        family = registry().model(family_name)
    except RegistryError as e:
        raise ConfigError(f"{MODEL_KEY}: {TINY_PREFIX}{family_name}: {e}") from None
    path = cached_tiny(family, seed=0)
    if path is None:
        raise ConfigError(f"{MODEL_KEY}: {TINY_PREFIX}{family_name}: the tiny-model cache is not writable")
    return path


def build_config(args: Sequence[str]) -> GlmTrainConfig:
    """The typed config of a command line (recipe, overrides, a ``tiny:`` model made and pointed at)."""
    from skyrl_glm.skyrl.config.recipes import load_config

    recipe, overrides = split_args(args)
    cfg = load_config(recipe, overrides)
    model = cfg.trainer.policy.model.path
    if isinstance(model, str) and model.startswith(TINY_PREFIX):
        path = tiny_checkpoint(model.removeprefix(TINY_PREFIX))
        cfg = load_config(recipe, [*overrides, f"{MODEL_KEY}={path}"])
    return cfg


def _start_ray(cfg: GlmTrainConfig, run_env: dict[str, str]) -> None:
    """Ray with ``run_env`` (the run's control-key file and vLLM port window) in every worker's environment."""
    import ray
    from skyrl.train.utils.utils import initialize_ray, prepare_runtime_environment

    os.environ.update(run_env)  # the local cluster's workers inherit the driver's environment
    if not cfg.skyrl_glm.cpu:
        initialize_ray(cfg)
        return
    from skyrl.backends.skyrl_train.utils.ppo_utils import sync_registries
    from skyrl.env_vars import SKYRL_DUMP_INFRA_LOG_TO_STDOUT

    from skyrl_glm.skyrl.compat import cpu

    cpu.install()
    env_vars = prepare_runtime_environment(cfg)
    if not SKYRL_DUMP_INFRA_LOG_TO_STDOUT:
        # As SkyRL's initialize_ray (which cannot be given logical GPUs): vLLM's and the workers' logs go to a
        # file, the training progress stays on stdout; SKYRL_DUMP_INFRA_LOG_TO_STDOUT=1 shows everything.
        os.environ["RAY_BACKEND_LOG_LEVEL"] = "fatal"
        log_dir = Path(cfg.trainer.log_path).resolve()
        log_dir.mkdir(parents=True, exist_ok=True)
        env_vars["SKYRL_LOG_FILE"] = os.environ["SKYRL_LOG_FILE"] = str(log_dir / f"infra-{os.getpid()}.log")
    kwargs = cpu.ray_init_kwargs({**env_vars, **run_env})
    address = os.environ.get("RAY_ADDRESS")
    if address:  # a running cluster brings its own (logical) GPUs
        kwargs.pop("num_gpus")
    ray.init(address=address or "local", include_dashboard=False, log_to_driver=True, **kwargs)
    sync_registries()


def _experiment(cfg: GlmTrainConfig) -> RunSummary:
    """Body of the Ray task that runs the experiment (SkyRL keeps the training loop off the driver)."""
    from skyrl_glm.skyrl.run.run_log import log_to_stderr

    log_to_stderr()
    from skyrl_glm.skyrl.compat.flash_attn_stub import provide_bert_padding

    provide_bert_padding()  # before SkyRL's worker modules are imported (where flash-attn is missing)
    from skyrl_glm.skyrl.compat import bridge_compat

    bridge_compat.install()  # SkyRL's setup imports its Megatron worker here, before any skyrl-glm worker module
    from skyrl_glm.skyrl.run.experiment import GlmPPOExp
    from skyrl_glm.skyrl.run.ports import use_run_ports

    use_run_ports()

    return GlmPPOExp(cfg).run()


def report_summary(log_path: str, summary: RunSummary) -> Path:
    """Log the run's syncs and checks, and write them to ``<log_path>/skyrl_glm_summary.json`` (with one
    row of figures per step) and the mean reward per step to ``skyrl_glm_rewards.png`` beside it."""
    import importlib.util
    import json

    from skyrl_glm.canary.curves import REWARD_PNG, SUMMARY_FILE, plot_rewards

    log = logging.getLogger("skyrl_glm.train")
    log.info(
        "%d syncs (mode %s), seconds per sync: %s (mean %.3f)",
        len(summary.syncs),
        summary.sync_mode,
        " ".join(f"{s.seconds:.3f}" for s in summary.syncs),
        summary.mean_sync_seconds(),
    )
    if summary.check is not None:
        log.info("handoff check before step 1: %s", "PASS" if summary.check.passed else "FAIL")
    for a in summary.agree:
        log.info(
            "after sync %d: sampler vs trainer logprobs prefill max %.3g, decode max %s; max|lora_B| %.3g: %s",
            a.sync,
            a.prefill_max,
            "-" if a.decode_max is None else f"{a.decode_max:.3g}",
            a.lora_b_max,
            "agree" if a.passed else "DISAGREE",
        )
    path = Path(log_path) / SUMMARY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    record = summary.to_json()
    path.write_text(json.dumps(record, indent=2))
    if record["steps"] and importlib.util.find_spec("matplotlib") is not None:
        plot_rewards([record], path.parent / REWARD_PNG)
    return path


def opening_lines(t: TrainerConfig, glm: GlmSection, log_file: Path, verbose: bool) -> list[str]:
    """What is about to run, and where its full log goes."""
    from skyrl_glm.skyrl.config.placement import sync_transports

    # SkyRL stops at the cap or at the data's end, whichever comes first (a 2-batch file runs 2 of a cap of 3)
    steps = f"up to {t.max_training_steps} steps" if t.max_training_steps else f"{t.epochs} epoch(s)"
    sync = f"{glm.sync.mode} via {sync_transports(glm, t.placement)}" if glm.sync.mode == "memory" else "disk (SkyRL's)"
    check = "before step 1" if glm.check.before_training else "off"
    if glm.check.every_n_syncs:
        check += f", agree every {glm.check.every_n_syncs} sync(s)"
    shown = "shown here too" if verbose else "-v shows it here"
    return [
        f"training {t.policy.model.path} ({t.strategy}, {steps}); LoRA sync {sync}; handoff check {check}",
        f"full log: {log_file} ({shown})",
        "starting Ray ...",
    ]


def closing_lines(
    trainer: TrainerConfig, summary: RunSummary, summary_file: Path, log_file: Path, seconds: float
) -> list[str]:
    """Where the run's outputs are: the summary JSON, the export directory, the logs, the report command."""
    import shlex

    from skyrl_glm.canary.curves import REWARD_PNG

    verdict = "off" if summary.check is None else ("PASS" if summary.check.passed else "FAIL")
    agreed = sum(a.passed for a in summary.agree)
    export = Path(trainer.export_path).resolve()
    lines = [
        f"trained in {seconds:.0f} s: {len(summary.syncs)} syncs ({summary.sync_mode}, mean "
        f"{summary.mean_sync_seconds():.3f} s), handoff check {verdict}, agree checks {agreed}/"
        f"{len(summary.agree)} ok",
        f"  summary  {summary_file.resolve()}",
        f"  export   {export}",
        f"  log      {log_file}",
    ]
    infra = os.environ.get("SKYRL_LOG_FILE")
    if infra and Path(infra).is_file():
        lines.append(f"  workers  {infra} (vLLM and policy-worker logs)")
    png = summary_file.parent / REWARD_PNG
    if png.is_file():
        lines.append(f"  rewards  {png.resolve()}")
    if trainer.dump_eval_results:
        lines.append(f"  report   skyrl-glm report {shlex.quote(str(export))}")
    else:
        lines.append("  report   (set trainer.dump_eval_results=true to get evals for skyrl-glm report)")
    return lines


def run(cfg: GlmTrainConfig, verbose: bool = False) -> int:
    """Run one training; an exit code of :mod:`skyrl_glm.usage` (0 finished, 1 stopped by the handoff check,
    2 Ray lacks the GPUs the layout needs, 3 failed on the way). Everything the run prints goes to a log file; the
    terminal gets progress lines (everything with ``verbose``) and where the outputs are."""
    from skyrl_glm.skyrl.run.ports import run_ports
    from skyrl_glm.sync.vllm.control import KEY_ENV, run_key

    # the run's control key (the trainer and the vLLM workers it starts hold it) and its ports, held while it runs
    with run_key() as key_file, run_ports(cfg.generator.inference_engine) as port_env:
        return _run(cfg, {KEY_ENV: key_file, **port_env}, verbose)


def _run(cfg: GlmTrainConfig, env: dict[str, str], verbose: bool) -> int:
    import time

    import ray

    from skyrl_glm import usage
    from skyrl_glm.skyrl.config.hardware import gpu_needs, ray_shortfall
    from skyrl_glm.skyrl.run.check_live import HandoffCheckFailed
    from skyrl_glm.skyrl.run.run_log import PROGRESS_LOGGER, RunLog

    log = logging.getLogger("skyrl_glm.train")
    progress = logging.getLogger(PROGRESS_LOGGER)
    stamp = time.strftime("%y%m%d_%H%M%S")
    log_file = Path(cfg.trainer.log_path).resolve() / f"skyrl-glm-train-{stamp}-{os.getpid()}.log"
    summary_file: Path | None = None
    shortfall: str | None = None
    stopped: str | None = None
    t0 = time.perf_counter()
    try:
        # Inside RunLog this process's stdout and stderr go to the log file: what the terminal must see is
        # printed after it.
        with RunLog(log_file, verbose):
            for line in opening_lines(cfg.trainer, cfg.skyrl_glm, log_file, verbose):
                progress.info(line)
            _start_ray(cfg, env)
            t1 = time.perf_counter()
            progress.info("Ray ready; starting the policy workers and the vLLM server(s) ...")
            try:
                needs = gpu_needs(cfg.trainer, cfg.generator.inference_engine)
                if (shortfall := ray_shortfall(needs, ray.cluster_resources())) is None:
                    summary = ray.get(ray.remote(num_cpus=1)(_experiment).remote(cfg))
                    summary_file = report_summary(cfg.trainer.log_path, summary)
            except HandoffCheckFailed as e:  # Ray re-raises the task's exception as a subclass of it
                stopped = e.args[0] if e.args else str(e)
                if getattr(e, "summary", None) is not None:  # what the check measured, kept for the stopped run
                    summary_file = report_summary(cfg.trainer.log_path, e.summary)
            except Exception:
                log.exception("the run failed")  # the traceback, into the log file
                raise
            finally:
                t2 = time.perf_counter()
                ray.shutdown()
                ends = (t1 - t0, t2 - t1, time.perf_counter() - t2)
                log.info("Ray start %.1f s, experiment %.1f s, Ray shutdown %.1f s", *ends)
    except Exception as e:  # noqa: BLE001 - one line and the log's path; the traceback is in the log
        return usage.run_failed("skyrl-glm train", e, str(log_file))
    if shortfall is not None:
        print(f"skyrl-glm train: {shortfall}", file=sys.stderr)
        return usage.USAGE
    if stopped is not None or summary_file is None:
        print(f"skyrl-glm train: stopped by the handoff check:\n{stopped}", file=sys.stderr)
        if summary_file is not None:
            print(f"summary: {summary_file.resolve()}", file=sys.stderr)
        print(f"full log: {log_file}", file=sys.stderr)
        return usage.CHECK_FAILED
    if summary.steps:
        from skyrl_glm import terminal
        from skyrl_glm.canary.curves import print_step_table

        print_step_table(summary.to_json(), terminal.console(soft_wrap=True))
    for line in closing_lines(cfg.trainer, summary, summary_file, log_file, time.perf_counter() - t0):
        print(line)
    return 0


def run_command(args: Sequence[str], verbose: bool = False) -> int:
    """Config from a command line, then :func:`run`; the exit code."""
    from skyrl_glm.skyrl.compat.trainer_stack import trainer_stack_problem
    from skyrl_glm.skyrl.config.hardware import visible_gpu_problem
    from skyrl_glm.skyrl.config.key_placement import use_key_dir
    from skyrl_glm.skyrl.config.sections import ConfigError
    from skyrl_glm.skyrl.config.validation import missing_data
    from skyrl_glm.skyrl.run.run_log import log_to_stderr
    from skyrl_glm.sync.vllm.control import setting_problem
    from skyrl_glm.sync.vllm.engine_env import environment_problem
    from skyrl_glm.usage import PROG, print_error

    log_to_stderr()
    try:
        cfg = build_config(args)  # skyrl-glm's checks and SkyRL's validate_cfg on a copy (config.validate)
        from skyrl.train.utils import validate_cfg

        validate_cfg(cfg)
        if problem := trainer_stack_problem(cfg.trainer.strategy):
            raise ConfigError(problem)
        engine = cfg.generator.inference_engine
        if problem := missing_data(cfg.data) or use_key_dir(cfg.trainer, engine) or setting_problem(makes_its_own=True):
            raise ConfigError(problem)
        if problem := environment_problem(gpu=False):  # the slot replay: SkyRL's engines read it in their workers
            raise ConfigError(problem)
        if not os.environ.get("RAY_ADDRESS") and (
            problem := visible_gpu_problem(cfg.trainer, engine, cpu=cfg.skyrl_glm.cpu)
        ):
            raise ConfigError(problem)  # before Ray starts: it would wait forever for GPUs that are not here
    except (ConfigError, ValueError, AssertionError) as e:
        return print_error(f"{PROG} train", str(e).splitlines()[0] if str(e) else type(e).__name__)
    return run(cfg, verbose)
