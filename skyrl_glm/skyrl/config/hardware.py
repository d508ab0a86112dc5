"""``skyrl_glm.hardware``: the machines a recipe assumes, and the GPUs its parallel layout actually asks for.

SkyRL's config says how many GPUs each role uses but not which GPU or how many nodes the author sized the
memory for; a recipe states it here so ``recipes validate`` can refuse a layout that needs more GPUs than
the stated hardware has, and ``train --dry-run`` can print what to reserve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skyrl.train.config import InferenceEngineConfig, TrainerConfig


@dataclass
class HardwareConfig:
    """What the recipe was sized for (0 / empty: not stated, nothing checked)."""

    gpu: str = ""
    """GPU model, e.g. ``H200``."""
    gpu_memory_gb: int = 0
    """Memory per GPU in GB (10^9 bytes) as the vendor states it (H200: 141)."""
    nodes: int = 0
    gpus_per_node: int = 0
    host_memory_gb: int = 0
    """Host RAM per node the layout needs (colocated runs park the sleeping side's weights there)."""

    def __post_init__(self) -> None:
        for name in ("gpu_memory_gb", "nodes", "gpus_per_node", "host_memory_gb"):
            if getattr(self, name) < 0:
                raise ValueError(f"skyrl_glm.hardware.{name}: must be >= 0, got {getattr(self, name)}")

    @property
    def stated(self) -> bool:
        return self.nodes > 0 and self.gpus_per_node > 0


@dataclass(frozen=True)
class GpuNeeds:
    """GPUs a SkyRL config's placement asks Ray for."""

    trainer: int
    sampler: int
    colocated: bool

    @property
    def total(self) -> int:
        return self.trainer if self.colocated else self.trainer + self.sampler


def gpu_needs(trainer: TrainerConfig, engine: InferenceEngineConfig) -> GpuNeeds:
    """Trainer GPUs (policy, plus a separate reference model when one is used) and sampler GPUs."""
    placement = trainer.placement
    algorithm = trainer.algorithm
    trainer_gpus = placement.policy_num_nodes * placement.policy_num_gpus_per_node
    uses_ref = algorithm.use_kl_loss or algorithm.use_kl_in_reward
    if uses_ref and not placement.colocate_policy_ref and not placement.colocate_all:
        trainer_gpus += placement.ref_num_nodes * placement.ref_num_gpus_per_node
    sampler_gpus = engine.num_engines * engine.tensor_parallel_size * engine.pipeline_parallel_size
    sampler_gpus *= engine.data_parallel_size
    return GpuNeeds(trainer=trainer_gpus, sampler=sampler_gpus, colocated=placement.colocate_all)


def layout_problem(hw: HardwareConfig, needs: GpuNeeds, policy_gpus_per_node: int) -> str | None:
    """Why the placement (``needs``, and the trainer's GPUs per node) does not fit the stated hardware (one line),
    or None."""
    if not hw.stated:
        return None
    have = hw.nodes * hw.gpus_per_node
    if needs.total > have:
        how = "colocated" if needs.colocated else f"{needs.trainer} trainer + {needs.sampler} sampler"
        return (
            f"skyrl_glm.hardware: the layout needs {needs.total} GPUs ({how}) but the recipe states "
            f"{hw.nodes} x {hw.gpus_per_node} = {have}"
        )
    if policy_gpus_per_node > hw.gpus_per_node:
        return (
            f"trainer.placement.policy_num_gpus_per_node: {policy_gpus_per_node} "
            f"exceeds skyrl_glm.hardware.gpus_per_node={hw.gpus_per_node}"
        )
    return None


def ray_shortfall(needs: GpuNeeds, resources: dict[str, float]) -> str | None:
    """Why the Ray cluster the run got (``ray.cluster_resources()``) cannot place the layout, or None. Checked
    before any actor is asked for: Ray would otherwise wait forever for GPUs that are not there."""
    have = resources.get("GPU", 0.0)
    if needs.total > have:
        how = "colocated" if needs.colocated else f"{needs.trainer} trainer + {needs.sampler} sampler"
        return (
            f"the layout needs {needs.total} GPUs ({how}) but Ray sees {have:g}; run where the recipe's hardware is "
            "(skyrl-glm train RECIPE --dry-run prints it) or scale the layout down"
        )
    return None


def local_gpu_problem(
    trainer: TrainerConfig, engine: InferenceEngineConfig, *, cpu: bool, cuda_available: bool, device_count: int
) -> str | None:
    """Why a run on this machine's own Ray (no ``RAY_ADDRESS``) cannot place the layout on the GPUs visible here
    (one line), or None. Checked before Ray starts; CPU mode (``cpu``) uses logical GPUs and is never refused here."""
    if cpu:
        return None
    if not cuda_available or device_count == 0:
        return (
            "skyrl_glm.cpu: false, but no CUDA GPU is visible here (torch.cuda.is_available() is False); run on a "
            "GPU machine, point RAY_ADDRESS at a GPU cluster, or set skyrl_glm.cpu=true"
        )
    needs = gpu_needs(trainer, engine)
    single_node = trainer.placement.policy_num_nodes == 1
    if single_node and needs.total > device_count:
        how = "colocated" if needs.colocated else f"{needs.trainer} trainer + {needs.sampler} sampler"
        return (
            f"the layout needs {needs.total} GPUs ({how}) but {device_count} are visible here "
            "(CUDA_VISIBLE_DEVICES); scale the layout down or run where the GPUs are"
        )
    return None


def visible_gpu_problem(trainer: TrainerConfig, engine: InferenceEngineConfig, *, cpu: bool) -> str | None:
    """:func:`local_gpu_problem` for the GPUs torch sees in this process."""
    if cpu:
        return None
    import torch

    available = torch.cuda.is_available()
    count = torch.cuda.device_count() if available else 0
    return local_gpu_problem(trainer, engine, cpu=cpu, cuda_available=available, device_count=count)
