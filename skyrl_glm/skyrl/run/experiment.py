"""The SkyRL experiment of a skyrl-glm run: SkyRL's ``BasePPOExp`` with skyrl-glm's trainer, worker classes from
the plugin registry, and (for the memory sync) skyrl-glm's vLLM worker extension on the servers."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from skyrl.train.dataset import PromptDataset
from skyrl.train.entrypoints.main_base import BasePPOExp

from skyrl_glm.canary.env import register as register_canary
from skyrl_glm.dapo.env import register as register_glm_math
from skyrl_glm.plugins import registry
from skyrl_glm.skyrl.run.mismatch_log import MismatchMetrics
from skyrl_glm.skyrl.run.step_log import StepMetrics
from skyrl_glm.skyrl.run.summary import RunSummary
from skyrl_glm.skyrl.run.trainer import GlmPPOTrainer
from skyrl_glm.skyrl.workers import signed_client
from skyrl_glm.skyrl.workers.vllm_extension import WORKER_EXTENSION
from skyrl_glm.sync.expert_layout import engine_arguments

if TYPE_CHECKING:
    from skyrl_glm.skyrl.config.sections import GlmTrainConfig


def _router_args_compat() -> None:
    """vllm-router 0.1.17 (newest on PyPI) has no ``RouterArgs.pd_disaggregation``, which SkyRL 0.4 reads after
    the router is up (vllm_router.py:128): default it to False, as older routers had it."""
    try:
        from vllm_router.router_args import RouterArgs
    except ImportError:
        return
    if not hasattr(RouterArgs, "pd_disaggregation"):
        RouterArgs.pd_disaggregation = False


DISK_LORA_WARNING = "saves LoRA adapters to disk"
_SKYRL_SERVER_ARGS_LOGGER = "skyrl.backends.skyrl_train.inference_servers.utils"


class _NoDiskLoraWarning(logging.Filter):
    """SkyRL warns that LoRA adapters are saved to disk (a shared filesystem needed) whenever trainer and vLLM are
    not colocated and its own ``lora.sync_mode`` is not ``memory``; with skyrl-glm's memory sync no file is written,
    so the warning is false."""

    def filter(self, record: logging.LogRecord) -> bool:
        return DISK_LORA_WARNING not in record.getMessage()


class GlmPPOExp(BasePPOExp):
    def __init__(self, cfg: GlmTrainConfig) -> None:
        if cfg.skyrl_glm.sync.mode == "memory":
            engine = cfg.generator.inference_engine.engine_init_kwargs
            engine.setdefault("worker_extension_cls", WORKER_EXTENSION)
            for key, value in engine_arguments(cfg.skyrl_glm.sync.expert_layout, engine).items():  # at engine start
                if key == "additional_config":
                    engine[key] = value  # the user's entries merged in
                else:
                    engine.setdefault(key, value)
            logging.getLogger(_SKYRL_SERVER_ARGS_LOGGER).addFilter(_NoDiskLoraWarning())
        _router_args_compat()
        signed_client.install()  # the trainer's control calls carry the run's signature (the servers' route guard)
        register_glm_math()  # the `glm_math` reward env, in the process that builds the generator
        register_canary()  # and the canary's
        super().__init__(cfg)

    def run(self) -> RunSummary:
        """Train; returns the run's skyrl-glm summary (syncs with their seconds, the checks' numbers)."""
        super().run()
        return self.trainer.summary

    def _prompts(self, files: list[str]) -> PromptDataset:
        # SkyRL hard-codes 8 filtering processes (main_base.py:82); honour data.dataloader.num_workers instead.
        return PromptDataset(
            datasets=files,
            tokenizer=self.tokenizer,
            max_prompt_length=self.cfg.trainer.max_prompt_length,
            num_workers=max(1, self.cfg.data.dataloader.num_workers),
        )

    def get_train_dataset(self) -> PromptDataset:
        dataset = self._prompts(self.cfg.data.train_data)
        if len(dataset) < self.cfg.trainer.train_batch_size:
            raise ValueError(
                f"the training set has {len(dataset)} prompts, fewer than trainer.train_batch_size="
                f"{self.cfg.trainer.train_batch_size}"
            )
        return dataset

    def get_eval_dataset(self) -> PromptDataset | None:
        if self.cfg.trainer.eval_interval > 0 and self.cfg.data.val_data:
            return self._prompts(self.cfg.data.val_data)
        return None

    def get_trainer(
        self,
        cfg: GlmTrainConfig,
        tracker: Any,
        tokenizer: Any,
        train_dataset: Any,
        eval_dataset: Any,
        inference_engine_client: Any,
        generator: Any,
        colocate_pg: Any,
    ) -> GlmPPOTrainer:
        return GlmPPOTrainer(
            cfg=cfg,
            tracker=tracker,
            tokenizer=tokenizer,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            inference_engine_client=inference_engine_client,
            generator=generator,
            colocate_pg=colocate_pg,
            worker_classes=registry().skyrl_worker_classes(cfg.trainer.strategy),
            callbacks=[MismatchMetrics(), StepMetrics()],
        )
