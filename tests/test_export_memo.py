"""The export memo (:mod:`skyrl_glm.sync.export_memo`) on the Megatron sync's rank-0 path
(:func:`~skyrl_glm.skyrl.workers.megatron.unique_adapter`): after one full export it reads the unique tensors from
the LoRA parameters with no export, follows their values and their memory, checks itself on every full export,
and learns nothing from an export that hands out copies.

The export is a stand-in for Megatron-Bridge's (which needs Transformer Engine and a GPU): per expert name a view of
the layer's one shared parameter, as Bridge hands out with ``share_expert_adapters``, and the gate and up halves of
one fused ``linear_fc1`` parameter (a recall hands out a whole parameter as itself, a part of one as a view)."""

from __future__ import annotations

import torch

from skyrl_glm.lora.bridge import PEFT_PREFIX
from skyrl_glm.skyrl.workers.megatron import unique_adapter
from skyrl_glm.sync.export_memo import ExportMemo

EXPERTS = 4


def _params(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = ((2, 6), (5, 2), (2, 5), (6, 2))
    return [torch.randn(*shape, generator=g) for shape in shapes]


def _export(params: list[torch.Tensor], copies: bool = False):
    """Dense ``o_proj`` A and B, every expert's ``down_proj`` A (one parameter, a view per name) and every expert's
    ``gate_proj`` and ``up_proj`` B (the halves of one fused parameter)."""
    a, b, down, fc1 = params
    yield "model.layers.0.self_attn.o_proj.lora_A.weight", a.clone() if copies else a
    yield "model.layers.0.self_attn.o_proj.lora_B.weight", b
    for e in range(EXPERTS):
        yield f"model.layers.1.mlp.experts.{e}.down_proj.lora_A.weight", down.view(down.shape)
        yield f"model.layers.1.mlp.experts.{e}.gate_proj.lora_B.weight", fc1[:3]
        yield f"model.layers.1.mlp.experts.{e}.up_proj.lora_B.weight", fc1[3:]


def _sync(params, memo, copies: bool = False, exported: list | None = None):
    def export():
        if exported is not None:
            exported.append(True)
        yield from _export(params, copies)

    return unique_adapter(
        export(), config_rank=2, num_moe_experts=EXPERTS, shared_storage=True, export_memo=memo, params=params
    )


def _same(a, b) -> bool:
    return (a.names, a.runs, a.explicit) == (b.names, b.runs, b.explicit) and all(
        torch.equal(x, y) for x, y in zip(a.unique.values(), b.unique.values(), strict=True)
    )


def test_a_learned_export_is_recalled_from_the_parameters_with_their_new_values():
    params, memo = _params(), ExportMemo(verify_every=4)
    first = _sync(params, memo)
    assert memo.counts["learned"] == 1 and len(first.unique) == 5
    with torch.no_grad():
        for p in params:
            p.mul_(3.0).add_(1.0)  # a training step
    exported: list = []
    recalled = _sync(params, memo, exported=exported)
    assert exported == [] and memo.counts["recalled"] == 1  # the export never ran
    assert _same(recalled, _sync(params, None))  # what a full export gives now, names, rules and values


def test_a_parameter_whose_memory_moved_is_read_where_it_is_now():
    """An offload and reload hands a parameter new memory (``param.data`` replaced): the memo follows it."""
    params, memo = [torch.nn.Parameter(p, requires_grad=False) for p in _params()], ExportMemo()
    _sync(params, memo)
    for p in params:
        p.data = p.data.clone() + 1.0
    recalled = _sync(params, memo)
    assert memo.counts["recalled"] == 1
    assert _same(recalled, _sync(params, None))
    assert {t.untyped_storage().data_ptr() for t in recalled.unique.values()} <= {
        p.untyped_storage().data_ptr() for p in params
    }


def test_an_export_of_copies_teaches_nothing_and_keeps_running_whole():
    params, memo = _params(), ExportMemo()
    _sync(params, memo, copies=True)
    assert memo.counts["refused"] == 1
    exported: list = []
    _sync(params, memo, copies=True, exported=exported)
    assert exported == [True] and memo.counts["recalled"] == 0


def test_every_nth_sync_exports_whole_and_a_difference_drops_the_memo():
    params, memo = _params(), ExportMemo(verify_every=3)
    _sync(params, memo)
    runs: list = []
    for _ in range(3):
        _sync(params, memo, exported=runs)
    assert runs == [True] and memo.counts == {"learned": 2, "recalled": 2, "refused": 0, "dropped": 0}

    # the exporter now hands out the dense A as a copy of other values: the memo would recall stale ones
    def changed():
        for name, t in _export(params):
            yield name, t + 1.0 if name.endswith("o_proj.lora_A.weight") else t

    memo.recalls = memo.verify_every  # a full export is due
    unique_adapter(changed(), config_rank=2, num_moe_experts=EXPERTS, shared_storage=True, export_memo=memo,
                   params=params)  # fmt: skip
    assert memo.counts["dropped"] == 1 and memo.counts["refused"] == 1  # and a copy teaches nothing
    assert memo.recall(params) is None


def test_parameters_unlike_the_learned_ones_recall_nothing():
    params, memo = _params(), ExportMemo()
    _sync(params, memo)
    assert memo.recall(params[:3]) is None  # one missing
    assert memo.recall([*params[:3], params[3].to(torch.float64)]) is None  # another dtype
    assert memo.recall(params) is not None


def test_parameters_that_did_not_move_hand_out_the_last_views_reading_the_values_of_now():
    """A recall with every parameter where it was reuses the last recall's views (no view made per tensor); they
    read the parameters' values as they are, and a parameter that moves in between is read where it is now."""
    params, memo = [torch.nn.Parameter(p, requires_grad=False) for p in _params()], ExportMemo()
    _sync(params, memo)
    first = _sync(params, memo)
    with torch.no_grad():
        params[2].add_(5.0)  # a training step, in place
    second = _sync(params, memo)
    assert [id(t) for t in first.unique.values()] == [id(t) for t in second.unique.values()]
    assert first.unique is not second.unique  # the caller's dict is its own (the fold updates it)
    assert _same(second, _sync(params, None))
    assert sum(t is p for t in second.unique.values() for p in params) == 3  # the whole parameters, as they are
    params[3].data = params[3].data.clone() - 1.0  # moved: the fused one, read in halves (views)
    third = _sync(params, memo)
    assert _same(third, _sync(params, None)) and not _same(third, second)  # the old views read the old memory


def _rank_one_expert_export(params: list[torch.Tensor]):
    """The dense ``o_proj`` at rank 2 and an expert adapter at rank 1 (Bridge's ``normalize_moe_lora``: the
    experts at a lower rank, which SkyRL's fold rescales by config rank / rank)."""
    a, b, ea, eb = params
    yield "model.layers.0.self_attn.o_proj.lora_A.weight", a
    yield "model.layers.0.self_attn.o_proj.lora_B.weight", b
    for e in range(EXPERTS):
        yield f"model.layers.1.mlp.experts.{e}.down_proj.lora_A.weight", ea.view(ea.shape)
        yield f"model.layers.1.mlp.experts.{e}.down_proj.lora_B.weight", eb.view(eb.shape)


def test_a_recalled_sync_rescales_what_the_full_export_rescaled_and_nothing_else():
    g = torch.Generator().manual_seed(1)
    params = [torch.randn(*s, generator=g) for s in ((2, 6), (5, 2), (1, 5), (7, 1))]
    memo = ExportMemo()

    def sync(memo):
        return unique_adapter(
            _rank_one_expert_export(params), config_rank=2, num_moe_experts=EXPERTS, shared_storage=True,
            export_memo=memo, params=params,
        )  # fmt: skip

    full = sync(memo)
    eb = PEFT_PREFIX + "model.layers.1.mlp.experts.0.down_proj.lora_B.weight"
    assert memo.rescaled == [eb.replace("lora_B", "lora_A"), eb] and torch.equal(full.unique[eb], 2 * params[3])
    with torch.no_grad():
        for p in params:
            p.add_(1.0)
    recalled = sync(memo)
    assert memo.counts["recalled"] == 1 and _same(recalled, sync(None))
    assert recalled.unique[eb].data_ptr() != params[3].data_ptr()  # rescaled: a new tensor, never the parameter
    assert recalled.addresses is None  # the memo's addresses are the parameters': the pack reads the tensors' own
    again = sync(memo)
    assert again.addresses is None and memo.views[2] is not None  # the memo's own array is kept as it was


def test_forgotten_views_free_the_parameters_memory_and_are_made_again():
    """The Megatron worker's offload drops the memo's views first: they would keep the LoRA parameters' memory
    alive while the trainer is offloaded (the colocated sampler wakes into that memory)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    from skyrl_glm.skyrl.workers.megatron import MegatronGlmSync

    params, memo = [torch.nn.Parameter(p, requires_grad=False) for p in _params()], ExportMemo()
    _sync(params, memo)
    _sync(params, memo)
    old = params[3].data  # the fused one, read in halves: views of its memory
    params[3].data = old.clone()  # offloaded and back, elsewhere
    memory = StorageWeakRef(old.untyped_storage())
    del old
    assert not memory.expired()  # the memo's views still hold it

    class Offloaded:
        def offload_to_cpu(self, **kwargs):
            return kwargs

    class Worker(MegatronGlmSync, Offloaded):
        _glm_export_memo = memo

    assert Worker().offload_to_cpu(offload_model=True) == {"offload_model": True}  # SkyRL's offload, after
    assert memo.views is None and memory.expired()  # nothing holds the old memory now
    assert _same(_sync(params, memo), _sync(params, None)) and memo.views is not None


def test_what_the_memo_learned_and_recalls_carries_one_structure_token_the_plan_cache_keys_on():
    """A recall's structure is the learned one: the plan's cache keys on the memo's token (no read of every sent
    tensor's dtype and shape) and lays it out as a plan made afresh does; a full export that agrees keeps the token,
    one of another structure gets a new one."""
    from skyrl_glm.sync.plan import PlanCache, build_plan

    params, memo, cache = _params(), ExportMemo(verify_every=2), PlanCache()
    config = {"r": 2, "lora_alpha": 4.0}

    def plan(dedup, version, cache=cache):
        return build_plan(dedup, adapter_config=config, lora_name="a", version=version, cache=cache)

    full = _sync(params, memo)
    recalled = _sync(params, memo)
    assert full.structure is not None and recalled.structure is full.structure
    assert PlanCache.key_of(recalled, "{}", "a", 1) == (full.structure, "{}", "a", 1)  # no tensor read
    plan(full, 1)
    second = plan(recalled, 2)
    fresh = plan(_sync(params, None), 2, cache=None)
    assert cache.hits == 1 and _sync(params, None).structure is None  # no memo, no token
    assert second.manifest.to_json() == fresh.manifest.to_json()
    assert all(torch.equal(a, b) for a, b in zip(second.tensors, fresh.tensors, strict=True))
    again = _sync(params, memo)  # the third sync runs the export whole: it agrees
    assert memo.counts == {"learned": 2, "recalled": 1, "refused": 0, "dropped": 0}
    assert again.structure is full.structure
    narrower = [p.to(torch.float16) for p in params]  # another structure: the memo recalls nothing, learns anew
    other = _sync(narrower, memo)
    assert memo.counts["learned"] == 3 and other.structure not in (None, full.structure)
    plan(other, 3)
    assert cache.hits == 1  # the new token misses


def test_a_recall_of_contiguous_tensors_carries_their_addresses_and_reads_no_kinds_where_nothing_moved(monkeypatch):
    """Each unique tensor's data address (``Dedup.addresses``, for the pack's copy table) comes from its parameter's:
    equal to the tensor's own, following a parameter that moved. Where no parameter moved, the parameters' shapes,
    strides and dtypes are not read again; where one did, they are (and a dtype changed there recalls nothing). An
    export with a strided part gives no addresses."""
    params, memo = [torch.nn.Parameter(p, requires_grad=False) for p in _params()], ExportMemo()
    assert _sync(params, memo).addresses is None  # a full export: nothing vouched

    def addresses_hold(dedup) -> bool:
        return dedup.addresses.tolist() == [t.data_ptr() for t in dedup.unique.values()]

    read: list = []
    kinds = ExportMemo._kinds
    monkeypatch.setattr(ExportMemo, "_kinds", staticmethod(lambda ps: read.append(1) or kinds(ps)))
    first = _sync(params, memo)
    assert addresses_hold(first) and len(read) == 1
    assert addresses_hold(_sync(params, memo)) and len(read) == 1  # nothing moved: no kinds read
    params[3].data = params[3].data.clone()  # the fused one moved: its halves' addresses with it
    moved = _sync(params, memo)
    assert addresses_hold(moved) and len(read) == 2 and moved.addresses.tolist() != first.addresses.tolist()
    params[0].data = params[0].data.double()  # moved and of another dtype
    assert memo.recall(params) is None and len(read) == 3

    strided, memo = _params(), ExportMemo()

    def export():
        yield "model.layers.0.self_attn.o_proj.lora_A.weight", strided[3].t()  # (2, 6): a view, not contiguous
        yield "model.layers.0.self_attn.o_proj.lora_B.weight", strided[1]

    unique_adapter(export(), config_rank=2, num_moe_experts=EXPERTS, export_memo=memo, params=strided)
    recalled = memo.recall(strided)
    assert recalled is not None and recalled.addresses is None
