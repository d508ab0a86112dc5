"""Where a multi-node run's control key lives: on storage every node reads.

The run's key file is made on the node that starts the run and read by every vLLM worker on its own host
(:mod:`skyrl_glm.sync.vllm.control`), so a run whose trainer or samplers span more than one node refuses every
sync on the other nodes unless the key's directory is shared. Such a run makes its key directory in
``SKYRL_GLM_CONTROL_KEY_DIR`` when set, else in :func:`default_key_dir` (``~/.cache/skyrl-glm/keys``, beside the
tiny-model cache): private to this user (mode 0700, owned by them; one that is not is refused, never loosened or
taken over) and, where the cluster shares home directories, seen by every node at the same path. A one-node run
keeps its key in the temp directory. ``recipes validate``, ``train --dry-run`` and ``train`` check the directory
before anything starts; ``train`` makes the default one.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from skyrl_glm.models.tiny_cache import cache_root
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


def default_key_dir() -> Path:
    """Where a multi-node run's key directory is made when ``SKYRL_GLM_CONTROL_KEY_DIR`` is unset."""
    return cache_root() / "keys"


def private_dir_problem(path: Path) -> str | None:
    """Why ``path`` is no private directory of this user (one line), or None: a real directory (not a link),
    owned by this user, that nobody else may enter or list (no group or other permission bits)."""
    try:
        st = path.lstat()
    except OSError as e:
        return f"{path}: {e.strerror or e}"
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return f"{path}: not a directory (a link or a file)"
    if st.st_uid != os.geteuid():
        return f"{path}: owned by uid {st.st_uid}, not by this user"
    if st.st_mode & 0o077:
        return f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets others in (chmod 700 {path})"
    return None


def make_default_key_dir() -> Path:
    """:func:`default_key_dir`, made with mode 0700 if missing; ``OSError`` or ``PermissionError`` naming the
    problem when it cannot be made or is not private."""
    path = default_key_dir()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    if problem := private_dir_problem(path):
        raise PermissionError(problem)
    return path


def key_dir(trainer: TrainerConfig, engine: InferenceEngineConfig) -> str | None:
    """The directory the run's key directory is made in: ``SKYRL_GLM_CONTROL_KEY_DIR``, or for a multi-node run
    the default, or None (one node: the temp directory)."""
    if os.environ.get(KEY_DIR_ENV):
        return os.environ[KEY_DIR_ENV]
    return str(default_key_dir()) if spans_nodes(trainer, engine) else None


def key_problem(trainer: TrainerConfig, engine: InferenceEngineConfig) -> str | None:
    """Why the run could not use its default key directory (one line), or None. Nothing is made here: a
    missing default is made by ``train``, so only one that exists is checked (ownership and mode)."""
    if os.environ.get(KEY_DIR_ENV) or not spans_nodes(trainer, engine):
        return None
    path = default_key_dir()
    if os.path.lexists(path) and (problem := private_dir_problem(path)):
        return f"control key directory {problem}; or set {KEY_DIR_ENV} to a private directory all nodes mount"
    return None


def use_key_dir(trainer: TrainerConfig, engine: InferenceEngineConfig) -> str | None:
    """Before ``train`` makes its key: a multi-node run without ``SKYRL_GLM_CONTROL_KEY_DIR`` gets the default
    (made if missing, refused if not private) in that variable, where the key is then made; the problem as one
    line, or None."""
    if os.environ.get(KEY_DIR_ENV) or not spans_nodes(trainer, engine):
        return None
    try:
        os.environ[KEY_DIR_ENV] = str(make_default_key_dir())
    except OSError as e:
        detail = str(e) if isinstance(e, PermissionError) and not e.errno else f"{default_key_dir()}: {e.strerror}"
        return f"control key directory {detail}; or set {KEY_DIR_ENV} to a private directory all nodes mount"
    return None


def launch_lines(directory: str) -> list[str]:
    """What a cluster's launch needs of the key: the directory in the driver's environment, on storage each node
    mounts at the same path."""
    return [
        f"# control key: made in {directory} by the head node, read at that path by every node's vLLM workers: "
        f"storage each node mounts (a shared home; on each node `df -P {directory}` names the same network filesystem)",
        f"export {KEY_DIR_ENV}={directory}",
    ]
