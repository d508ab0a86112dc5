"""Tiny random-weight checkpoints of a registered model family, made locally and deterministically."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from skyrl_glm.models.base import ModelFamily
from skyrl_glm.models.tokenizer import build_tokenizer

log = logging.getLogger(__name__)


def deepened(config: Any, layers: int) -> Any:
    """``config`` with ``layers`` decoder layers: its per-layer lists (layer, MLP and indexer types) are dropped and
    made anew by its class, so the added layers follow the architecture's own pattern."""
    fields = config.to_dict()
    old = fields["num_hidden_layers"]
    fields = {k: v for k, v in fields.items() if not (isinstance(v, list) and len(v) == old)}
    return type(config)(**{**fields, "num_hidden_layers": layers})


def make_tiny(family: ModelFamily, outdir: str | Path, seed: int = 0, layers: int | None = None) -> Path:
    """Write ``config.json``, fp32 ``model.safetensors`` and a tokenizer to ``outdir`` (``layers``: the tiny
    config :func:`deepened` to that many decoder layers).

    Same family and seed -> byte-identical files (the init runs on CPU from ``torch.manual_seed``).
    """
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    config = family.tiny_config() if layers is None else deepened(family.tiny_config(), layers)
    config.vocab_size = family.tiny_vocab_size
    fork_devices: list[int] = []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seed)
        model = family.build_model(config)
    model.save_pretrained(outdir)
    build_tokenizer(family.tiny_vocab_size).save_pretrained(outdir)
    log.info("wrote tiny %s checkpoint to %s", family.name, outdir)
    return outdir
