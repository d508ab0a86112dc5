"""Tiny random-weight checkpoints of a registered model family, made locally and deterministically."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from skyrl_glm.models.base import ModelFamily
from skyrl_glm.models.tokenizer import build_tokenizer

log = logging.getLogger(__name__)


def make_tiny(family: ModelFamily, outdir: str | Path, seed: int = 0) -> Path:
    """Write ``config.json``, fp32 ``model.safetensors`` and a tokenizer to ``outdir``.

    Same family and seed -> byte-identical files (the init runs on CPU from ``torch.manual_seed``).
    """
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    config = family.tiny_config()
    config.vocab_size = family.tiny_vocab_size
    fork_devices: list[int] = []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seed)
        model = family.build_model(config)
    model.save_pretrained(outdir)
    build_tokenizer(family.tiny_vocab_size).save_pretrained(outdir)
    log.info("wrote tiny %s checkpoint to %s", family.name, outdir)
    return outdir
