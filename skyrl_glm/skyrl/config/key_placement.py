"""Where a multi-node run's control key must live: on storage every node reads.

The run's key file is made on the node that starts the run and read by every vLLM worker on its own host
(:mod:`skyrl_glm.sync.vllm.control`), so a run whose trainer or samplers span more than one node refuses every
sync on the other nodes unless the key's directory is shared. ``recipes validate``, ``train --dry-run`` and
``train`` say so before anything starts: such a run must name a directory every node mounts (a shared home) in
``SKYRL_GLM_CONTROL_KEY_DIR``, where the run's key directory is then made.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from skyrl_glm.skyrl.config.hardware import gpu_needs
from skyrl_glm.sync.vllm.control import KEY_DIR_ENV

if TYPE_CHECKING:
    from skyrl.train.config import InferenceEngineConfig, TrainerConfig


def spans_nodes(trainer: TrainerConfig, engine: InferenceEngineConfig) -> bool:
    """Whether the run's trainer or samplers need more than one node."""
    placement = trainer.placement
    needs = gpu_needs(trainer, engine)
    per_node = max(placement.policy_num_gpus_per_node, 1)
    return placement.policy_num_nodes > 1 or (not needs.colocated and needs.sampler > per_node)


def key_problem(trainer: TrainerConfig, engine: InferenceEngineConfig) -> str | None:
    """Why the run's workers could not all read its key (one line), or None."""
    if not spans_nodes(trainer, engine) or os.environ.get(KEY_DIR_ENV):
        return None
    return (
        f"trainer.placement.policy_num_nodes: a run on more than one node needs its control key on every node; "
        f"set {KEY_DIR_ENV} to a directory all nodes mount (a shared home), or every sync is refused off the first"
    )
