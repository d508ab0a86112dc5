"""Tiny checkpoints kept between runs, keyed by family and seed, so a check does not remake its model each time.

The key also holds a fingerprint of what decides the bytes (the tiny config, the vocabulary size, the
transformers and torch versions that initialise the weights), so a changed config never serves a stale copy.
A copy is made in a scratch directory beside its final place and renamed into it, so two runs at once and an
interrupted run never leave a half-written checkpoint under the key. The root is ``$SKYRL_GLM_CACHE``, else
``$XDG_CACHE_HOME/skyrl-glm``, else ``~/.cache/skyrl-glm``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from skyrl_glm.checkpoint import read_config
from skyrl_glm.models.base import ModelFamily
from skyrl_glm.usage import UsageError

log = logging.getLogger(__name__)


def cache_root() -> Path:
    if os.environ.get("SKYRL_GLM_CACHE"):
        return Path(os.environ["SKYRL_GLM_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "skyrl-glm"


def fingerprint(family: ModelFamily) -> str:
    import torch
    import transformers

    config = family.tiny_config()
    config.vocab_size = family.tiny_vocab_size
    text = "\n".join((config.to_json_string(use_diff=False), transformers.__version__, torch.__version__))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cached_tiny(family: ModelFamily, seed: int = 0) -> Path | None:
    """The cached tiny checkpoint of ``family`` and ``seed``, made now if missing; None if the cache cannot be
    written (the caller then makes a temporary one)."""
    from skyrl_glm.models.tiny import make_tiny

    final = cache_root() / "tiny" / f"{family.name}-seed{seed}-{fingerprint(family)}"
    if final.is_dir():
        try:
            read_config(final)
            return final
        except UsageError as e:
            log.warning("remaking a damaged cached checkpoint: %s", e)
            shutil.rmtree(final, ignore_errors=True)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    except OSError as e:
        log.warning("tiny-model cache %s not writable (%s): using a temporary checkpoint", final.parent, e)
        return None
    try:
        make_tiny(family, scratch, seed=seed)
        os.rename(scratch, final)
    except OSError:
        if not final.is_dir():  # another run renamed its copy into place first: use that one
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final
