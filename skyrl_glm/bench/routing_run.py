"""Run a routed multi-rank sync with processes: EP-sharded sender ranks -> TP receiver ranks (gloo on CPU).

World ranks ``0..S-1`` are trainer (sender) ranks holding an EP-sharded synthetic GLM-5.3-shaped Megatron-Bridge
export; ranks ``S..S+R-1`` are the sampler's TP ranks. Control messages are JSON strings in a TCPStore (never
pickle); data moves by :class:`~skyrl_glm.experimental.routing.transport.RoutedTransport` broadcasts. Each receiver
checks its rebuilt tensors, bit for bit, against slices of the full adapter (after SkyRL's alpha fold) regenerated from
the seed; every rank reports what it counted on the wire.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from skyrl_glm.bench.procs import StoreChannel, free_port
from skyrl_glm.bench.verify import compare_exact
from skyrl_glm.lora.bridge import PEFT_PREFIX, adapter_config
from skyrl_glm.sync.manifest import DTYPES

if TYPE_CHECKING:
    from skyrl_glm.experimental.routing.plan import TargetRules

ROUTED_FAMILY = "glm-5.3"  # whose target records name and shape the routed adapter


@dataclass
class RoutingRunOptions:
    senders: int = 4  # EP size of the trainer
    tp: int = 4  # receiver TP size
    expert_parallel: bool = False  # receiver vLLM enable_expert_parallel
    experts: int = 16
    rank: int = 8
    alpha: int = 16
    dtype: str = "float32"
    bucket_bytes: int = 4096
    seed: int = 0
    version: int = 1
    # Filled by resolved() in the parent (children then need no transformers import): the config's fields that
    # the Bridge export reads, and the family's default vLLM targets.
    config: dict[str, Any] | None = None
    targets: list[str] | None = None

    def resolved(self) -> RoutingRunOptions:
        if self.config is not None and self.targets is not None:
            return self
        from skyrl_glm.plugins import registry

        cfg = routing_config(self.experts)
        keys = (
            "hidden_size",
            "num_attention_heads",
            "num_hidden_layers",
            "first_k_dense_replace",
            "mlp_layer_types",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "index_n_heads",
            "index_head_dim",
            "intermediate_size",
            "moe_intermediate_size",
            "n_shared_experts",
            "n_routed_experts",
            "num_key_value_heads",
            "head_dim",
        )
        config = {k: getattr(cfg, k, None) for k in keys}
        tg = registry().model(ROUTED_FAMILY).lora.resolve(sampler="vllm")
        return RoutingRunOptions(**{**asdict(self), "config": config, "targets": tg})

    def model_config(self) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(**self.resolved().config)


def routing_config(experts: int = 16):
    """The tiny GLM-5.3 config widened to a legal TP4 / EP4 shape: 4 heads, ``experts`` routed experts,
    1 dense + 2 MoE layers."""
    from skyrl_glm.models.glm5 import tiny_config

    cfg = tiny_config()
    cfg.num_attention_heads = 4
    cfg.num_key_value_heads = 4
    cfg.n_routed_experts = experts
    return cfg


@functools.cache
def routed_rules() -> TargetRules:
    """The routing rules of the family whose adapter is routed: its target records, handed to the routing plan."""
    from skyrl_glm.experimental.routing.plan import TargetRules
    from skyrl_glm.plugins import registry

    return TargetRules(registry().model(ROUTED_FAMILY).lora)


def _expert_of(name: str) -> int | None:
    from skyrl_glm.experimental.routing.plan import parse_name

    return parse_name(name, routed_rules()).expert


def ep_sharded_exports(opts: RoutingRunOptions, only: int | None = None) -> list[list[tuple[str, torch.Tensor]]]:
    """Per sender (EP) rank, its export stream: every non-expert name (a replica: equal values, its own storage)
    and the routed-expert names of the experts it owns (contiguous blocks), all carrying that rank's one shared
    expert adapter (``share_expert_adapters``: one adapter per EP rank), as one tensor object per (layer, A/B)."""
    from skyrl_glm.lora.bridge import synthetic_bridge_export
    from skyrl_glm.plugins import registry

    opts = opts.resolved()
    cfg, tg, dtype = opts.model_config(), opts.targets, DTYPES[opts.dtype]
    lora = registry().model(ROUTED_FAMILY).lora
    if opts.experts % opts.senders:
        raise ValueError(f"{opts.experts} experts do not split over EP {opts.senders}")
    per = opts.experts // opts.senders
    base = list(synthetic_bridge_export(cfg, lora, rank=opts.rank, targets=tg, dtype=dtype, seed=opts.seed))
    streams = []
    for s in range(opts.senders) if only is None else [only]:
        own = dict(synthetic_bridge_export(cfg, lora, rank=opts.rank, targets=tg, dtype=dtype, seed=opts.seed + 1 + s))
        stream = []
        for name, t in base:
            e = _expert_of(name)
            if e is None:
                stream.append((PEFT_PREFIX + name, t.clone()))
            elif e // per == s:
                stream.append((PEFT_PREFIX + name, own[name]))
        streams.append(stream)
    return streams


def full_reference(opts: RoutingRunOptions) -> dict[str, torch.Tensor]:
    """The whole public adapter (every name once), folded as SkyRL folds a public dict."""
    from skyrl.backends.skyrl_train.distributed.megatron.lora_export import fold_lora_alpha_for_vllm

    full: dict[str, torch.Tensor] = {}
    for stream in ep_sharded_exports(opts):
        for n, t in stream:
            full.setdefault(n, t)
    return fold_lora_alpha_for_vllm(full, config_rank=opts.rank, alpha=opts.alpha)


def layout(opts: RoutingRunOptions):
    from skyrl_glm.experimental.routing.plan import ReceiverLayout

    return ReceiverLayout(opts.tp, opts.expert_parallel, opts.experts)


def _plan_owned(rank: int, opts: RoutingRunOptions, chan: StoreChannel) -> tuple[Any, dict[str, Any]]:
    """A sender: announce the names it holds, plan (dedup + fold) those it owns, publish its manifest."""
    from skyrl_glm.experimental.routing.plan import assign_owners
    from skyrl_glm.sync.plan import build_plan

    stream = ep_sharded_exports(opts, only=rank)[0]
    chan.put(f"names/{rank}", json.dumps([n for n, _ in stream]))
    owned = set(assign_owners([json.loads(chan.get(f"names/{s}")) for s in range(opts.senders)])[rank])
    sp = build_plan(
        ((n, t) for n, t in stream if n in owned),
        adapter_config=adapter_config(opts.rank, opts.alpha, opts.resolved().targets),
        lora_name="policy",
        version=opts.version,
        bucket_bytes=opts.bucket_bytes,
    )
    chan.put(f"manifest/{rank}", sp.manifest.to_json())
    held = {"held": len(stream), "owned": len(owned), "unique": len(sp.tensors)}
    return sp, {**held, "sent_names": [e.name for e in sp.manifest.tensors], "owned_names": sorted(owned)}


def _send(rank: int, plan: Any, sp: Any, transport: Any, chan: StoreChannel) -> dict[str, Any]:
    """A sender: publish its pieces' checksums, broadcast its routes; what it sent (rank 0: the whole plan)."""
    from skyrl_glm.experimental.routing.transport import piece_checksums, route_label

    sums, tensors = piece_checksums(plan, rank, sp)
    chan.put(f"sums/{rank}", json.dumps(sums))
    for route in plan.routes_from(rank):
        transport.send_route(route, tensors[route.key])
    report: dict[str, Any] = {
        "pieces": {
            route_label(r.key): [[p.sent, None if p.slice is None else asdict(p.slice), p.nbytes] for p in r.pieces]
            for r in plan.routes_from(rank)
        }
    }
    if rank == 0:
        routes = [
            {
                "label": route_label(r.key),
                "pieces": len(r.pieces),
                "payload_bytes": r.nbytes,
                "wire_bytes": r.manifest.total_bytes,
                "buckets": len(r.manifest.buckets()),
            }
            for r in plan.routes
        ]
        report["plan"] = {"wire_table": plan.wire_table(), "routes": routes}
    return report


def _receive(receiver: int, opts: RoutingRunOptions, plan: Any, transport: Any, chan: StoreChannel) -> dict[str, Any]:
    """A receiver: its manifest from the plan and the senders' checksums, the real receive, a bit-exact compare
    with its slices of the full reference adapter."""
    from skyrl_glm.experimental.routing.plan import expected_slices
    from skyrl_glm.sync.receiver import AdapterReceiver

    sums: dict[str, str] = {}
    for s in range(opts.senders):
        sums.update(json.loads(chan.get(f"sums/{s}")))
    manifest, handle = plan.receiver_update(receiver, sums)
    got = AdapterReceiver("cpu").receive(manifest.to_json(), handle, transport)
    full = full_reference(opts)
    return {
        **compare_exact(got.tensors, expected_slices(full, plan.layout, receiver, routed_rules())),
        "staged_bytes": manifest.total_bytes,
        "sent_tensors": len(manifest.tensors),
        "aliases": len(manifest.aliases),
        "sliced_names": sum(1 for n, t in got.tensors.items() if t.shape != full[n].shape),
    }


def _proc(rank: int, opts_d: dict[str, Any], port: int, out_dir: str) -> None:
    """One world rank: join the gloo group, plan, send or receive, write its report."""
    import torch.distributed as dist

    from skyrl_glm.experimental.routing.plan import plan_routes
    from skyrl_glm.experimental.routing.transport import RoutedTransport, make_groups
    from skyrl_glm.sync.manifest import Manifest

    start = time.time()
    torch.set_num_threads(1)
    opts = RoutingRunOptions(**opts_d)
    S, world = opts.senders, opts.senders + opts.tp
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=_dt.timedelta(minutes=5))
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=world)
    chan = StoreChannel(dist.PrefixStore("ctl", store))
    report: dict[str, Any] = {"rank": rank}
    try:
        t0 = time.perf_counter()
        if rank < S:
            sp, owned = _plan_owned(rank, opts, chan)
            report.update(owned)
        manifests = [Manifest.from_json(chan.get(f"manifest/{s}")) for s in range(S)]
        plan = plan_routes(manifests, layout(opts), routed_rules(), bucket_bytes=opts.bucket_bytes)
        t_plan = time.perf_counter()
        transport = RoutedTransport(make_groups(plan, lambda s: s, lambda r: S + r), lambda s: s)
        t1 = time.perf_counter()
        report.update(
            _send(rank, plan, sp, transport, chan) if rank < S else _receive(rank - S, opts, plan, transport, chan)
        )
        report["stats"] = transport.stats
        report["times"] = {
            "plan_s": t_plan - t0,
            "groups_s": t1 - t_plan,
            "total_s": time.perf_counter() - t0,
            "start_unix": start,
        }
        dist.barrier()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def run_routed_sync(opts: RoutingRunOptions) -> dict[str, Any]:
    """Spawn ``senders + tp`` processes, run one routed sync, return every rank's report."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        opts = opts.resolved()
        t0, t_spawn = time.perf_counter(), time.time()
        mp.spawn(_proc, args=(asdict(opts), free_port(), tmp), nprocs=opts.senders + opts.tp, join=True)
        wall = time.perf_counter() - t0
        reports = [json.loads(Path(tmp, f"rank{i}.json").read_text()) for i in range(opts.senders + opts.tp)]
    return {
        "senders": reports[: opts.senders],
        "receivers": reports[opts.senders :],
        "wall_s": wall,
        "t_spawn": t_spawn,
        "options": asdict(opts),
    }


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(json.dumps(run_routed_sync(RoutingRunOptions()), indent=1)[:4000])
