"""Where a config's trainer ranks and vLLM engines land, node by node, as SkyRL 0.4 places them, and each engine's
route: what ``skyrl-glm train RECIPE --dry-run`` prints before anything starts.

Colocated (``trainer.placement.colocate_all``): one placement group of ``policy_num_nodes`` x
``policy_num_gpus_per_node`` GPUs; trainer rank ``r`` on bundle ``r`` and engine ``i`` on bundles ``i*k .. i*k+k-1``
(``k`` = its TP x PP GPUs; ``inference_servers/setup.py``), so both follow the node order of the bundles. Not
colocated: the trainer packs the same way, the engines' own group is packed by Ray wherever GPUs are free, so
their nodes (and so their routes) are known only once the run starts (it logs them and records them in its
summary).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from skyrl_glm.skyrl.workers.routes import Route, plan_routes

if TYPE_CHECKING:
    from skyrl.train.config import InferenceEngineConfig, PlacementConfig, TrainerConfig

    from skyrl_glm.skyrl.config.sections import GlmSection


@dataclass
class NodePlan:
    """One node: the trainer ranks on it, and its engines' routes."""

    node: int
    ranks: list[int] = field(default_factory=list)
    engines: list[tuple[int, Route]] = field(default_factory=list)


def _span(ranks: list[int]) -> str:
    if not ranks:
        return "none"
    return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"


def node_plans(trainer: TrainerConfig, engine: InferenceEngineConfig, glm: GlmSection) -> list[NodePlan] | None:
    """Per node, rank 0's node first; None when the engines' nodes are Ray's choice at start (not colocated)."""
    from skyrl_glm.skyrl.config.sections import colocated_gpu

    p = trainer.placement
    if not p.colocate_all:
        return None
    per_node = max(p.policy_num_gpus_per_node, 1)
    plans = [NodePlan(n) for n in range(max(p.policy_num_nodes, 1))]
    for r in range(p.policy_num_nodes * p.policy_num_gpus_per_node):
        plans[r // per_node].ranks.append(r)
    k = engine.tensor_parallel_size * engine.pipeline_parallel_size
    engines = []
    for i in range(engine.num_engines * engine.data_parallel_size):
        nodes = sorted({gpu // per_node for gpu in range(i * k, (i + 1) * k)})
        engines.append((f"engine {i}", "+".join(f"node {n}" for n in nodes)))  # spanning: on no node alone
    routes = plan_routes(glm.sync.transport, colocated_gpu(glm, p), "node 0", engines)
    for i, route in enumerate(routes):
        plans[int(route.node.split("+")[0].removeprefix("node "))].engines.append((i, route))
    return plans


def _where(engine: int, k: int, per_node: int) -> str:
    """``on GPUs a-b`` of its node, or ``on nodes m-n (k GPUs)`` when its ``k`` GPUs span nodes."""
    first, last = engine * k, (engine + 1) * k - 1
    gpus = f"GPUs {first % per_node}-{first % per_node + k - 1}" if k > 1 else f"GPU {first % per_node}"
    if first // per_node == last // per_node:
        return f"on {gpus}"
    return f"on nodes {first // per_node}-{last // per_node} ({k} GPUs)"


def placement_lines(trainer: TrainerConfig, engine: InferenceEngineConfig, glm: GlmSection) -> list[str]:
    """The dry run's lines: per node, its trainer ranks, its engines (their GPUs), each engine's transport and
    sender."""
    plans = node_plans(trainer, engine, glm)
    k = engine.tensor_parallel_size * engine.pipeline_parallel_size
    if plans is None:
        ranks = trainer.placement.policy_num_nodes * trainer.placement.policy_num_gpus_per_node
        return [
            f"trainer ranks 0-{ranks - 1} on {trainer.placement.policy_num_nodes} node(s); the engines' nodes are "
            "Ray's choice at start (not colocated): each engine's route is logged and recorded when the run starts"
        ]
    per_node = max(trainer.placement.policy_num_gpus_per_node, 1)
    lines = []
    for plan in plans:
        engines = "; ".join(
            f"engine {i} {_where(i, k, per_node)}: {r.transport} from {r.sender}" for i, r in plan.engines
        )
        lines.append(f"node {plan.node}: trainer ranks {_span(plan.ranks)}; {engines or 'no engine'}")
    return lines


def sync_transports(glm: GlmSection, placement: PlacementConfig) -> str:
    """The sync's transport in one phrase: per engine under ``auto`` when the policy spans nodes."""
    from skyrl_glm.skyrl.config.sections import resolved_transport
    from skyrl_glm.skyrl.workers.routes import AUTO, COLLECTIVE

    local = resolved_transport(glm, placement)
    if glm.sync.transport != AUTO or placement.policy_num_nodes == 1:
        return local
    return f"{local} to engines on the trainer's sending node, {COLLECTIVE} to the others"
