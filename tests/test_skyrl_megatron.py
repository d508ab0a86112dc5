"""The Megatron sync on its real code path as far as imports allow: ``MegatronGlmSync._glm_adapter`` consuming an
export stream, our plan, a transport and the receiver, compared bit for bit with SkyRL 0.4.0's file-path transform
of the same stream (stack, rank-scale fold, alpha fold, fused-MoE rewrite); and rank 0's memory during the sync.

Megatron-Bridge cannot be imported here (it needs Transformer Engine): the export is
:func:`skyrl_glm.lora.bridge.synthetic_bridge_export`, which reproduces the bridge's documented stream (names,
order, dtypes, one adapter under every expert name, shared storage or fresh copies), or a hand-built stream for
the layouts GLM's bridge does not emit (packed experts, reduced-rank experts). The bridge's two adapter-config
helpers (``peft_bridge``) are stood in by a module that builds the PEFT config the way they document.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from skyrl.backends.skyrl_train.distributed.megatron.lora_export import (
    fold_lora_alpha_for_vllm,
    fold_lora_rank_scale_for_vllm,
)
from skyrl.backends.skyrl_train.distributed.megatron.megatron_utils import _convert_moe_experts_lora_to_vllm

from skyrl_glm.bench.synthetic import model_config
from skyrl_glm.lora.bridge import PEFT_PREFIX, synthetic_bridge_export
from skyrl_glm.plugins import registry
from skyrl_glm.skyrl.workers import megatron
from skyrl_glm.skyrl.workers.megatron import MegatronGlmSync
from skyrl_glm.sync.plan import build_plan
from skyrl_glm.sync.publisher import InMemoryPublisher
from skyrl_glm.sync.receiver import AdapterReceiver, rebuild
from skyrl_glm.sync.transports.shm import SharedMemoryTransport
from skyrl_glm.sync.update import UpdateResult

ROOT = Path(__file__).resolve().parents[1]
RANK, ALPHA = 4, 16.0


@pytest.fixture
def peft_bridge(monkeypatch: pytest.MonkeyPatch) -> None:
    """Megatron-Bridge's ``peft_bridge`` config helpers (the package imports Transformer Engine)."""
    module = types.ModuleType("megatron.bridge.models.conversion.peft_bridge")

    def infer_target_modules_from_adapter_weights(names: Any) -> list[str]:
        return sorted({n.rsplit(".lora_", 1)[0].split(".")[-1] for n in names})

    def build_adapter_config_dict(lora: Any, target_modules: list[str], base_model_name_or_path: str) -> dict:
        return {"peft_type": "LORA", "r": lora.dim, "lora_alpha": lora.alpha, "target_modules": target_modules}

    module.infer_target_modules_from_adapter_weights = infer_target_modules_from_adapter_weights  # type: ignore[attr-defined]
    module.build_adapter_config_dict = build_adapter_config_dict  # type: ignore[attr-defined]
    for name in ("megatron.bridge", "megatron.bridge.models", "megatron.bridge.models.conversion"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class ExportingWorker(MegatronGlmSync):
    """The attributes of SkyRL's Megatron worker the sync reads; ``bridge`` hands out the given stream."""

    def __init__(self, stream: list[tuple[str, torch.Tensor]], experts: int | None) -> None:
        self.calls: list[dict[str, Any]] = []

        def export_adapter_weights(module: Any, **kwargs: Any) -> Iterator[tuple[str, torch.Tensor]]:
            self.calls.append(kwargs)
            return iter(stream)

        self.bridge = SimpleNamespace(export_adapter_weights=export_adapter_weights)
        self.actor_module: list[Any] = []
        self.lora_cls = SimpleNamespace(dim=RANK, alpha=ALPHA)
        self.provider = SimpleNamespace(num_moe_experts=experts)
        self.cfg = SimpleNamespace(policy=SimpleNamespace(model=SimpleNamespace(path="tiny")))


def skyrl_file_path(stream: list[tuple[str, torch.Tensor]], experts: int | None) -> dict[str, torch.Tensor]:
    """SkyRL 0.4.0's ``_save_lora_adapters_and_sync`` up to the file: clone and stack per name, rank-scale fold,
    alpha fold, fused-MoE rewrite."""
    lists: dict[str, list[torch.Tensor]] = {}
    for name, t in stream:
        lists.setdefault(PEFT_PREFIX + name, []).append(t.clone())
    state = {n: ts[0] if len(ts) == 1 else torch.stack(ts, dim=0) for n, ts in lists.items()}
    state, _ = fold_lora_rank_scale_for_vllm(state, config_rank=RANK)
    state = fold_lora_alpha_for_vllm(state, config_rank=RANK, alpha=ALPHA)
    return _convert_moe_experts_lora_to_vllm(state, num_moe_experts=experts)


def planned(worker: ExportingWorker) -> Any:
    got = worker._glm_adapter()
    assert got is not None
    dedup, config = got
    assert worker.calls == [{"cpu": False, "show_progress": False}]  # the stream stays on the device
    return build_plan(dedup, adapter_config=config, lora_name="policy", version=1, bucket_bytes=1 << 16)


class Receiving:
    """A sampler that is the receiver alone (what a vLLM worker runs before it loads)."""

    def apply_update(self, manifest_json: str, handle: dict[str, Any], transport: str) -> UpdateResult:
        self.sent = len(json.loads(manifest_json)["layout"]["tensors"])
        self.got = AdapterReceiver("cpu").receive(manifest_json, handle, registry().transport(transport)())
        return UpdateResult(True, self.got.version)


def synced(worker: ExportingWorker) -> tuple[dict[str, torch.Tensor], int]:
    """One sync through the worker's export and the publisher (plan, shared memory, the receiver):
    (rebuilt tensors, sent tensors)."""
    got = worker._glm_adapter()
    assert got is not None and worker.calls == [{"cpu": False, "show_progress": False}]  # stays on the device
    sampler = Receiving()
    result = InMemoryPublisher(sampler, SharedMemoryTransport(), bucket_bytes=1 << 16).publish(*got, version=1)
    assert result.ok, result.reason
    assert sampler.got.adapter_config["lora_alpha"] == sampler.got.adapter_config["r"] == RANK
    return sampler.got.tensors, sampler.sent


def assert_bit_exact(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(expected)
    bad = [n for n, e in expected.items() if got[n].dtype != e.dtype or not torch.equal(got[n], e)]
    assert not bad, bad[:5]


def glm53_export(copies: bool) -> tuple[list[tuple[str, torch.Tensor]], int]:
    family, cfg = model_config("glm-5.3", "tiny", None)
    targets = family.lora.resolve(sampler="vllm")
    stream = list(
        synthetic_bridge_export(cfg, family.lora, rank=RANK, targets=targets, dtype=torch.bfloat16, copies=copies)
    )
    return stream, cfg.n_routed_experts


@pytest.mark.usefixtures("peft_bridge", "one_rank")
@pytest.mark.parametrize("copies", [False, True], ids=["shared-storage", "copies"])
def test_glm53_export_stream_is_rebuilt_as_skyrls_file_path_writes_it(copies: bool) -> None:
    stream, experts = glm53_export(copies)
    got, sent = synced(ExportingWorker(stream, experts))
    expected = skyrl_file_path(stream, experts)
    assert_bit_exact(got, expected)
    assert len(got) == len(stream)
    # every distinct value sent once, however the exporter hands it out
    distinct = {(t.dtype, t.shape, t.contiguous().view(torch.int16).numpy().tobytes()) for t in expected.values()}
    assert sent == len(distinct) < len(stream)


def packed_and_reduced_rank(experts: int) -> list[tuple[str, torch.Tensor]]:
    """Layouts GLM's bridge does not emit, as SkyRL's file sync documents them: experts at a reduced rank
    (``normalize_moe_lora``: rank // top-k), a shared side as ``(1, ...)`` under an expert-agnostic per-expert
    name, and a packed-experts layer whose per-expert side comes as one slice per expert under one name."""
    g = torch.Generator().manual_seed(3)

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    h, inter, r_e = 16, 8, RANK // 2
    q_a, q_b, gate_a, gate_b = rnd(RANK, h), rnd(h, RANK), rnd(r_e, h), rnd(inter, r_e)
    down_b = rnd(1, h, r_e)
    q = "model.layers.0.self_attn.q_proj"
    stream = [(f"{q}.lora_A.weight", q_a), (f"{q}.lora_B.weight", q_b)]
    for e in range(experts):
        stream += [
            (f"model.layers.1.mlp.experts.{e}.gate_proj.lora_A.weight", gate_a),
            (f"model.layers.1.mlp.experts.{e}.gate_proj.lora_B.weight", gate_b),
            (f"model.layers.1.mlp.experts.{e}.down_proj.lora_A.weight", rnd(r_e, inter)),
        ]
    stream.append(("model.layers.1.mlp.experts.down_proj.lora_B.weight", down_b))
    return stream


def packed_layer(experts: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(4)

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    h, inter = 16, 8
    stream = [("model.layers.1.mlp.experts.gate_up_proj.lora_A.weight", rnd(1, RANK, h))]
    experts_of = "model.layers.1.mlp.experts"
    stream += [(f"{experts_of}.gate_up_proj.lora_B.weight", rnd(2 * inter, RANK)) for _ in range(experts)]
    stream += [(f"{experts_of}.down_proj.lora_A.weight", rnd(RANK, inter)) for _ in range(experts)]
    stream.append(("model.layers.1.mlp.experts.down_proj.lora_B.weight", rnd(1, h, RANK)))
    return stream


@pytest.mark.usefixtures("peft_bridge", "one_rank")
@pytest.mark.parametrize("layout", [packed_and_reduced_rank, packed_layer], ids=["per-expert", "packed"])
def test_other_bridge_layouts_are_planned_as_skyrls_file_path_writes_them(layout: Any) -> None:
    """The plan's stream rebuilt by the receiver's own rebuild (these layouts carry ranks other than ``r``: reduced
    experts, vLLM's ``(r * E, in)`` packed layout, which the receiver's structural check refuses today)."""
    stream = layout(4)
    got = plan_rebuilt(planned(ExportingWorker(stream, 4)))
    assert_bit_exact(got, skyrl_file_path(stream, 4))


def plan_rebuilt(plan: Any) -> dict[str, torch.Tensor]:
    return rebuild(plan.manifest, {e.name: t for e, t in zip(plan.manifest.tensors, plan.tensors, strict=True)})


@pytest.mark.usefixtures("peft_bridge", "one_rank")
def test_the_comparison_catches_a_sync_that_skips_the_rank_scale_fold(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = packed_and_reduced_rank(4)
    monkeypatch.setattr(megatron, "fold_rank_scale", lambda state, config_rank: dict(state))
    got = plan_rebuilt(planned(ExportingWorker(stream, 4)))
    with pytest.raises(AssertionError):
        assert_bit_exact(got, skyrl_file_path(stream, 4))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_batched_rank_scale_fold_is_skyrls_bit_for_bit(dtype: torch.dtype) -> None:
    """Ratios exact in every dtype (8) and not (32 / 12, 32 / 24), 2D and fused 3D factors, a lora_B without its
    lora_A: the same keys in the same order, equal bits, and what is not rescaled handed on as the same object."""
    gen = torch.Generator().manual_seed(0)

    def pair(name: str, rank: int, out: int = 24, inp: int = 20, experts: int | None = None) -> dict:
        lead = () if experts is None else (experts,)
        a = torch.randn(*lead, rank, inp, generator=gen).to(dtype)
        b = (torch.randn(*lead, out, rank, generator=gen) * 3.7).to(dtype)
        return {f"{name}.lora_A.weight": a, f"{name}.lora_B.weight": b}

    state = {
        **pair("l0.q_proj", 32),
        **pair("l0.experts.0.fc1", 4),
        **pair("l0.experts.1.fc1", 4),
        **pair("l0.experts.gate_up_proj", 12, experts=3),
        **pair("l1.o_proj", 24),
        "l1.down_proj.lora_B.weight": (torch.randn(16, 12, generator=gen) * 5).to(dtype),
    }
    want, _ = fold_lora_rank_scale_for_vllm(state, config_rank=32)
    got = megatron.fold_rank_scale(state, config_rank=32)
    assert list(got) == list(want)
    for name, t in want.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), name
    assert all((got[n] is state[n]) == (want[n] is state[n]) for n in state)
    assert sum(got[n] is not state[n] for n in state) == 5  # the four rescaled pairs' B and the lone B
    with pytest.raises(ValueError, match="config_rank"):
        megatron.fold_rank_scale(state, config_rank=0)


# ------------------------------------------------------------------------------------- rank 0's memory

MEMORY_PROBE = r"""
import gc, itertools, json, sys, torch
from skyrl_glm.bench.synthetic import model_config
from skyrl_glm.lora.bridge import synthetic_bridge_export
from skyrl_glm.skyrl.workers.megatron import unique_adapter
from skyrl_glm.plugins import registry
from skyrl_glm.sync.plan import build_plan
from skyrl_glm.sync.publisher import InMemoryPublisher

copies, gather = sys.argv[1] == "copies", sys.argv[2] == "gather"
family, cfg = model_config("glm-5.3", "full", 1)
targets = family.lora.resolve(sampler="vllm")
stream = synthetic_bridge_export(cfg, family.lora, rank=64, targets=targets, dtype=torch.bfloat16, copies=copies)
first = next(stream)  # the exporter's live adapter exists before the sync starts
def kib(field):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(field + ":"))
gc.collect()
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
base = kib("VmRSS")
pairs = itertools.chain([first], stream)  # lazily: a copy is made as its name is pulled
if gather:  # SkyRL's file path: every public name gathered to this rank's host
    pairs = iter([(n, t.clone()) for n, t in pairs])
dedup = unique_adapter(pairs, config_rank=64, num_moe_experts=cfg.n_routed_experts, slice_bytes=8 << 20)
del pairs
plan = build_plan(dedup, adapter_config={"r": 64, "lora_alpha": 128}, lora_name="p", version=1)
peak = (kib("VmHWM") - base) * 1024
unique = sum(e.nbytes for e in plan.manifest.tensors)
print(json.dumps({"peak": peak, "unique": unique, "public": plan.public_bytes, "names": plan.public_count}))
"""


def memory(copies: bool, gather: bool = False) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, "copies" if copies else "shared", "gather" if gather else "stream"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("copies", [False, True], ids=["shared-storage", "copies"])
def test_rank0_memory_of_the_sync_follows_the_unique_bytes_not_the_public(copies: bool) -> None:
    """Full GLM-5.3 shapes, one MoE layer, rank 64 (52 MB unique, 860 MB public) on this host. With shared storage
    the sync adds its packed stream only; with copies it also holds the unique copies it keeps, plus one slice of
    the exporter's duplicates (8 MiB here)."""
    m = memory(copies)
    assert m["public"] > 10 * m["unique"]
    bound = 2 * m["unique"] if not copies else 2 * m["unique"] + (8 << 20) + m["unique"] // 2
    assert m["peak"] < bound, m


def test_the_memory_probe_sees_a_full_gather() -> None:
    """The probe is able to fail: SkyRL's file path (a clone of every public name on rank 0) peaks at the public
    adapter."""
    m = memory(copies=False, gather=True)
    assert m["peak"] > 0.9 * m["public"] > 9 * m["unique"], m


@pytest.mark.parametrize("shared_storage", [False, True])
def test_a_name_holding_a_newline_keeps_its_tensor(shared_storage: bool) -> None:
    """Guards the texts the names are joined into (the stream's tests, the alias rules): a name that holds a
    newline reads as two lines there, and must neither shift a later name onto another pair's tensor nor enter a
    run; it is sent under its own PEFT name."""
    g = torch.Generator().manual_seed(0)
    names = ["model.layers.0.odd\nname.lora_A.weight"] + [
        f"model.layers.{i}.mlp.down_proj.lora_A.weight" for i in range(4)
    ]
    tensors = [torch.randn(2, 3, generator=g) for _ in names]
    dedup = megatron.unique_adapter(
        zip(names, tensors, strict=True), config_rank=2, num_moe_experts=None, shared_storage=shared_storage
    )
    assert list(dedup.unique) == [PEFT_PREFIX + n for n in names]
    assert all(torch.equal(dedup.unique[PEFT_PREFIX + n], t) for n, t in zip(names, tensors, strict=True))
