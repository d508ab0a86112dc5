"""An experiment, not on the product path: multi-rank sync, one update from EP-sharded trainer ranks to TP-sharded
vLLM ranks, each piece sent once per receiver group.

No product path calls it yet: SkyRL runs gather the adapter to one sending rank
(:mod:`skyrl_glm.skyrl.workers.megatron`).
It stays tested (``tests/test_routing.py``, in processes through :mod:`skyrl_glm.bench.routing_run`) until a
multi-rank sender uses it; it keeps the sync core's rule (no engine code, no SkyRL glue).

    plan.py          pure planning (no torch.distributed, no tensors): cross-rank owners, TP placement per
                     target, routes, per-receiver manifests (RoutingPlan)
    transport.py     RoutedTransport: one broadcast per (route, bucket), process groups in the plan's order

The TP sharding style of each target comes from its record (:class:`skyrl_glm.models.base.LoraTarget`).
The process harness that runs it end to end lives outside the product path
(:mod:`skyrl_glm.bench.routing_run`). This ``__init__`` imports nothing.
"""
