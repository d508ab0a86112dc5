"""The Megatron policy worker with skyrl-glm's in-memory LoRA sync (adapter-only: ``merge_lora=false``).

SkyRL's Megatron worker module imports Megatron-Bridge, whose LoRA layers need Transformer Engine (CUDA), and
patches Megatron-Bridge's source at import: so this module holds the Megatron half of the sync as a mixin and
:func:`megatron_workers` (called by the plugin registry only for ``trainer.strategy=megatron``) imports SkyRL's
worker and builds the class.

The export is consumed as SkyRL 0.4.0's memory path consumes it (``weight_sync/sources.py``:
``MegatronLoraAdapterSource``): ``export_adapter_weights(..., cpu=False)`` on every rank (a collective), a stream on
the GPU that rank 0 deduplicates as it arrives, so only unique tensors are ever retained and nothing is gathered to
any host. The dedup is skyrl-glm's exact one (:func:`~skyrl_glm.sync.dedup.deduplicate`: by view, then proven equal
in bulk) instead of SkyRL's ``dedupe_shared_expert_adapters`` (a ``torch.equal`` per expert name, a hint of
``experts_per_shared_adapter``); ``bench sync --exporter bridge-stream`` measures both over the same stream. The
per-module rank-scale fold is SkyRL's arithmetic batched (:func:`fold_rank_scale`) and the fused-MoE layout vLLM
accepts SkyRL's function, both run on the unique tensors only; the plan then folds ``alpha / r``, checksums and
sends.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from skyrl.backends.skyrl_train.distributed.megatron.lora_export import (
    LORA_A_SUFFIX,
    LORA_B_SUFFIX,
    lora_rank_from_tensors,
)

from skyrl_glm.lora.bridge import PEFT_PREFIX
from skyrl_glm.skyrl.compat import bridge_compat
from skyrl_glm.skyrl.workers.worker_sync import GlmSyncMixin
from skyrl_glm.sync.dedup import PART, Dedup, DedupMemo, Part, StreamReader, deduplicate
from skyrl_glm.sync.export_memo import ExportMemo
from skyrl_glm.sync.nogc import paused_gc

# Before SkyRL's Megatron worker is imported: in a Ray actor, unpickling the worker class imports this module (its
# first base) before SkyRL's, whose model wrapper imports the names the compatibility module supplies.
bridge_compat.install()

# The exporter's duplicates held at once while the stream is deduplicated (a gather per name hands out copies).
EXPORT_SLICE_BYTES = 256 << 20
# Expert LoRA names without an expert index: a packed-experts checkpoint's fused experts (their per-expert side comes
# as one slice per expert under the one name) or, on a per-expert checkpoint, a ``(1, ...)`` shared side.
_UNINDEXED_EXPERTS = re.compile(r"\.mlp\.experts\.(?P<tail>[a-z_]+\.lora_[AB]\.weight)$", re.MULTILINE)
_INDEXED_EXPERTS = re.compile(r"\.mlp\.experts\.\d+\.")


class VllmNamedStream(StreamReader):
    """The bridge's export as the pairs vLLM loads, lazily: one pass, and nothing retained but the expert tensors
    without an expert index, which SkyRL's file sync stacks per name in emission order. The names stay the bridge's:
    their PEFT prefix is added to the dedup's result (:meth:`~skyrl_glm.sync.dedup.Dedup.prefixed`, per rule).

    Per-expert names pass through as they come. The unindexed ones follow at the end, rank-scale folded: on a
    per-expert checkpoint a ``(1, ...)`` shared side is shown under every expert's name as one view (SkyRL's
    converter clones it per expert); on a packed one ``_convert_moe_experts_lora_to_vllm`` rewrites the stacks.
    Read in parts (:class:`~skyrl_glm.sync.dedup.StreamReader`, ``slice_bytes`` the dedup's, None with declared
    sharing), each part's names tested as one text. ``prefolded``: the names whose rank scale is already folded."""

    def __init__(
        self,
        export: Iterable[tuple[str, torch.Tensor]],
        *,
        config_rank: int,
        num_moe_experts: int | None,
        slice_bytes: int | None = EXPORT_SLICE_BYTES,
    ):
        super().__init__(export, slice_bytes)
        self.config_rank = config_rank
        self.num_moe_experts = num_moe_experts
        self.prefolded: set[str] = set()
        self.held: dict[str, list[torch.Tensor]] = {}
        self.indexed = False
        self.tail: StreamReader | None = None  # the unindexed ones, once the export has ended

    def part(self, at_most: int = PART) -> Part | None:
        while self.tail is None and (raw := super().part(at_most)) is not None:
            text = "\n".join(raw.names)  # tested as one text
            self.indexed = self.indexed or _INDEXED_EXPERTS.search(text) is not None
            if _UNINDEXED_EXPERTS.search(text) is None:
                return raw
            kept = []
            for name, tensor in zip(raw.names, raw.tensors, strict=True):
                if _UNINDEXED_EXPERTS.search(name):
                    self.held.setdefault(name, []).append(tensor)
                else:
                    kept.append((name, tensor))
            if kept:
                return Part.of(*zip(*kept, strict=True))
        if self.tail is None:
            unindexed = self._unindexed(self.held, self.indexed) if self.held else iter(())
            self.tail = StreamReader(unindexed, self.slice_bytes)
            self.held = {}
        return self.tail.part(at_most)

    def _unindexed(self, held: dict[str, list[torch.Tensor]], indexed: bool) -> Iterator[tuple[str, torch.Tensor]]:
        from skyrl.backends.skyrl_train.distributed.megatron.megatron_utils import _convert_moe_experts_lora_to_vllm

        stacked = {n: ts[0] if len(ts) == 1 else torch.stack(ts, dim=0) for n, ts in held.items()}
        stacked = fold_rank_scale(stacked, config_rank=self.config_rank)
        if not indexed:
            converted = _convert_moe_experts_lora_to_vllm(stacked, num_moe_experts=self.num_moe_experts)
            self.prefolded.update(converted)
            yield from converted.items()
            return
        for name, tensor in stacked.items():
            if not (tensor.ndim == 3 and tensor.shape[0] == 1):
                raise ValueError(f"{name}: an expert tensor without an expert index is not a (1, ...) shared side")
            if not self.num_moe_experts:
                raise ValueError(f"{name}: a shared expert adapter, but the model's expert count is unknown")
            unindexed = _UNINDEXED_EXPERTS.search(name)
            assert unindexed is not None  # held only when it matched
            head, tail = name[: unindexed.start()], unindexed["tail"]
            one = tensor[0]
            for e in range(self.num_moe_experts):
                public = f"{head}.mlp.experts.{e}.{tail}"
                self.prefolded.add(public)
                yield public, one


def unique_adapter(
    export: Iterable[tuple[str, torch.Tensor]],
    *,
    config_rank: int,
    num_moe_experts: int | None,
    shared_storage: bool = False,
    slice_bytes: int = EXPORT_SLICE_BYTES,
    memo: DedupMemo | None = None,
    export_memo: ExportMemo | None = None,
    params: Sequence[torch.Tensor] = (),
) -> Dedup:
    """Rank 0's half of one Megatron sync: the export deduplicated as it streams, then SkyRL's rank-scale fold
    (batched: :func:`fold_rank_scale`) on the unique tensors (a fold of a shared tensor once, however many expert
    names show it). ``shared_storage``:
    the bridge's LoRA shares one adapter across a layer's experts (``share_expert_adapters``), so the export shows
    one storage under every expert name, as SkyRL's ``experts_per_shared_adapter`` hint assumes (exact either way:
    a wrong declaration only sends a duplicate). ``memo``: the worker's, kept across syncs (with ``shared_storage``, a
    sync like the last costs work per unique tensor and a C-speed check per name: ``dedup.DedupMemo``).
    ``export_memo`` with ``params`` (the model's LoRA parameters): a sync it recalls reads the unique tensors from
    the parameters and never iterates ``export`` (so make it lazily); a full one teaches it
    (:mod:`skyrl_glm.sync.export_memo`)."""
    recalled = export_memo.recall(params) if export_memo is not None else None
    prefolded: set[str] = set()
    if recalled is not None:  # the fold rescales what it rescaled in the learned export (ranks are read from shapes)
        assert export_memo is not None
        dedup = recalled
        todo = {n: dedup.unique[n] for n in export_memo.rescaled}
    else:
        bound = None if shared_storage else slice_bytes  # declared sharing sends every storage: no bytes to count
        stream = VllmNamedStream(export, config_rank=config_rank, num_moe_experts=num_moe_experts, slice_bytes=bound)
        with paused_gc():  # the stream's pairs are short-lived: a collection would only walk what the slices hold
            found = deduplicate(stream, shared_storage=shared_storage, slice_bytes=slice_bytes, memo=memo)
        # the names vLLM loads, made once per full export: the memo hands them on (a rule per group of experts:
        # 25,000 rules at grouped:64, whose renaming cost more than the rest of a recalled sync)
        dedup = found.prefixed(PEFT_PREFIX)
        prefolded = {PEFT_PREFIX + n for n in stream.prefolded}
        if export_memo is not None:  # a tensor the stream converted is a view of no parameter: nothing to learn
            export_memo.learn(dedup, () if prefolded else params)
        todo = {n: t for n, t in dedup.unique.items() if n not in prefolded}
    folded = fold_rank_scale(todo, config_rank=config_rank)
    if export_memo is not None and recalled is None:  # a full export: what a recall of it folds
        export_memo.note_rescaled(todo, folded)
    if any(t is not todo[n] for n, t in folded.items()):
        dedup.addresses = None  # a rescaled lora_B is a new tensor: the addresses the memo gave are the parameters'
    dedup.unique.update(folded)
    return dedup


def fold_rank_scale(adapter: Mapping[str, torch.Tensor], *, config_rank: int) -> dict[str, torch.Tensor]:
    """SkyRL 0.4.0's ``fold_lora_rank_scale_for_vllm`` (each ``lora_B`` of a rank other than ``config_rank`` times
    ``config_rank / rank``, in float32 and cast back; the rest passed through as the same objects), bit for bit, with
    the multiplies of one ratio, dtype and device in one ``torch._foreach_mul``: SkyRL's loop takes three kernels per
    tensor, and under Bridge's ``normalize_moe_lora`` grouped experts rescale one ``lora_B`` per group and factor
    (9,600 at 64 groups and 75 layers)."""
    if config_rank <= 0:
        raise ValueError(f"config_rank must be positive, got {config_rank}")
    batches: dict[tuple[float, torch.dtype, torch.device], list[str]] = {}
    for name, tensor in adapter.items():
        if name.endswith(LORA_B_SUFFIX):
            rank = lora_rank_from_tensors(adapter.get(name.removesuffix(LORA_B_SUFFIX) + LORA_A_SUFFIX), tensor)
            if rank != config_rank:
                batches.setdefault((config_rank / rank, tensor.dtype, tensor.device), []).append(name)
    folded = dict(adapter)
    for (ratio, _, _), names in batches.items():
        # a float scalar is applied in float32 to a bf16/fp16 tensor and rounded once, as SkyRL's upcast does
        folded.update(zip(names, torch._foreach_mul([adapter[n] for n in names], ratio), strict=True))
    return folded


def _peak_bytes(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)


class CheckpointDefaults:
    """Mixed in before each SkyRL Megatron worker: the model families' config defaults are supplied in the worker's
    process before Megatron-Bridge reads the checkpoint's config (a GLM-5.3 checkpoint saved by transformers lacks
    ``indexer_rope_interleave``, which Bridge's GLM-5 bridge reads bare: :meth:`ModelFamily.supply_defaults`)."""

    def init_model(self, model_path: str, *args: Any, **kwargs: Any) -> Any:
        from skyrl_glm.plugins import registry

        # Every family's, whatever the checkpoint: class-level values touch only configs that lack the field, and
        # the path may be a hub id with no config.json on this host yet.
        for family in registry().models.values():
            family.supply_defaults()
        return super().init_model(model_path, *args, **kwargs)  # type: ignore[misc]


class MegatronGlmSync(GlmSyncMixin):
    """The Megatron half of the sync, mixed in before SkyRL's ``MegatronPolicyWorkerBase``."""

    def _glm_memory_sync(self) -> bool:
        return super()._glm_memory_sync() and not self.cfg.policy.megatron_config.lora_config.merge_lora

    def offload_to_cpu(self, *args: Any, **kwargs: Any) -> Any:
        """SkyRL's offload, after the export memo lets go of its views of the LoRA parameters (they would keep the
        parameters' GPU memory alive through the offload, where the colocated sampler wakes into it)."""
        if (export_memo := getattr(self, "_glm_export_memo", None)) is not None:
            export_memo.forget_views()
        return super().offload_to_cpu(*args, **kwargs)  # type: ignore[misc]

    def _glm_adapter(self) -> tuple[Dedup, dict[str, Any]] | None:
        rank = torch.distributed.get_rank()
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        base = _peak_bytes(device)
        t0 = time.perf_counter()

        def export() -> Iterator[tuple[str, torch.Tensor]]:  # the collective runs when (if) the stream is read
            yield from self.bridge.export_adapter_weights(self.actor_module, cpu=False, show_progress=False)

        dedup = None
        if rank == 0:
            self._glm_memo = getattr(self, "_glm_memo", None) or DedupMemo()
            # The export memo skips the export, a collective: only where this rank is the only one.
            single = torch.distributed.get_world_size() == 1
            if single and getattr(self, "_glm_export_memo", None) is None:
                self._glm_export_memo = ExportMemo()
            dedup = unique_adapter(
                export(),
                config_rank=self.lora_cls.dim,
                num_moe_experts=getattr(self.provider, "num_moe_experts", None),
                shared_storage=bool(getattr(self.lora_cls, "share_expert_adapters", False)),
                memo=self._glm_memo,
                export_memo=self._glm_export_memo if single else None,
                params=list(self._glm_lora_params()) if single else (),
            )
        else:
            for _ in export():  # the collective: every rank takes part, only rank 0 keeps anything
                pass
        seconds = time.perf_counter() - t0
        peak = _peak_bytes(device)
        peaks: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(peaks, None if peak is None or base is None else peak - base)
        if dedup is None:
            return None
        self._glm_export_info = {"export_dedup_s": seconds, "export_peak_bytes_per_rank": peaks}
        if (export_memo := getattr(self, "_glm_export_memo", None)) is not None:
            self._glm_export_info["export_memo"] = dict(export_memo.counts)
        return dedup, self._glm_adapter_config(dedup.unique)

    def _glm_adapter_config(self, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
        from megatron.bridge.models.conversion.peft_bridge import (
            build_adapter_config_dict,
            infer_target_modules_from_adapter_weights,
        )

        targets = sorted(set(infer_target_modules_from_adapter_weights(tensors.keys())) - {"base_layer"})
        return build_adapter_config_dict(
            self.lora_cls, target_modules=targets, base_model_name_or_path=str(self.cfg.policy.model.path)
        )

    def _glm_lora_params(self, which: str = "adapter.linear_") -> Iterator[torch.Tensor]:
        # Megatron-Bridge LoRA: ``adapter.linear_in`` is A, ``adapter.linear_out`` is B.
        return (p for chunk in self.actor_module for n, p in chunk.named_parameters() if which in n)

    def _glm_lora_b_params(self) -> Iterator[torch.Tensor]:
        return self._glm_lora_params("adapter.linear_out")


def megatron_workers() -> tuple[Any, Any, Any]:
    """``(PolicyWorker, CriticWorker, RefWorker)`` Ray actor classes for ``trainer.strategy=megatron``."""
    import ray
    from skyrl.backends.skyrl_train.workers.megatron import megatron_worker

    def with_defaults(base: Any, *mixins: Any, doc: str) -> Any:
        body = {"__module__": __name__, "__doc__": doc}
        return type(base.__name__, (*mixins, CheckpointDefaults, base), body)

    policy = with_defaults(
        megatron_worker.MegatronPolicyWorkerBase,
        MegatronGlmSync,
        doc="SkyRL's Megatron policy worker with skyrl-glm's in-memory LoRA sync.",
    )
    ref = with_defaults(megatron_worker.MegatronRefWorkerBase, doc="SkyRL's Megatron reference worker.")
    critic = with_defaults(megatron_worker.MegatronCriticWorkerBase, doc="SkyRL's Megatron critic worker.")
    return ray.remote(num_gpus=1)(policy), ray.remote(num_gpus=1)(critic), ray.remote(num_gpus=1)(ref)
