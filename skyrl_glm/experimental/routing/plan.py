"""The multi-rank routing plan: which sender rank sends which bytes of which unique tensor to which receiver ranks.

Production shape: the adapter is spread over trainer ranks (Megatron EP/TP/PP shards: with EP a rank holds the
routed-expert adapters of the experts it owns plus replicas of every non-expert adapter) and the sampler is a vLLM
engine with tensor parallelism (each TP worker holds a slice of most LoRA tensors). Plan, in three pure steps:

1. **Cross-rank dedup by name** (:func:`assign_owners`): a public name held by several sender ranks (a replicated
   non-expert adapter) is sent by exactly one of them, the lowest rank that holds it. Each sender then runs the
   existing within-rank exact dedup + alpha fold (:func:`skyrl_glm.sync.plan.build_plan`) on the names it owns and
   publishes its :class:`~skyrl_glm.sync.manifest.Manifest` (JSON).
2. **Routes** (:func:`plan_routes`): from the sender manifests and the receiver layout, each public name's
   :func:`placement` says which receiver ranks hold it and which slice. A *piece* is (sender, sent tensor, slice);
   its receiver set is every receiver rank that needs exactly that piece under any of the sent tensor's names.
   Pieces with the same (sender, receiver set) form one :class:`Route`: one packed stream, broadcast once from the
   sender to that group. A whole tensor every TP rank needs crosses the wire once (one broadcast to the group); a
   split tensor sends each receiver only its slice.
3. **Per-receiver manifests** (:meth:`RoutingPlan.receiver_update`): a plain :class:`Manifest` per receiver rank
   (its pieces at offsets in one private staging buffer, named after public names; aliases {public: piece}) plus a
   JSON handle naming the routes to receive, so the unchanged :class:`~skyrl_glm.sync.receiver.AdapterReceiver`
   verifies checksums, finiteness, A/B pairing and rebuilds the receiver's public names (its slices).

Sharding rules (which slice of a LoRA tensor a vLLM TP rank holds) are each target's ``tp_style`` on its record
(:class:`~skyrl_glm.models.base.LoraTarget`, read from vLLM 0.32's LoRA layers and the GLM/DeepSeek model files;
see docs/sync.md, "Multi-rank routing"), handed in as the family's :class:`TargetRules`. Everything here is pure
(no torch.distributed, no tensors): every rank computes the same plan from the same JSON inputs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from skyrl_glm.models.base import COLUMN, EXPERT_COLUMN, QKV_KV, REPLICATED, ROW, LoraPolicy
from skyrl_glm.sync.manifest import DTYPES, Manifest, TensorEntry, pack_entries


class TargetRules:
    """What routing reads from a model family's target records (:class:`~skyrl_glm.models.base.LoraTarget`): each
    target's vLLM TP style and the module patterns its tensor names are exported under. Built once from the
    family's policy by whoever routes (``TargetRules(family.lora)``) and handed in, so one family's module names
    never route another's."""

    def __init__(self, *policies: LoraPolicy) -> None:
        styles: dict[str, str] = {}
        target_of: dict[str, str] = {}
        by_leaf: dict[str, list[tuple[re.Pattern[str], str]]] = {}
        for policy in policies:
            for t in policy.targets:
                if t.tp_style is not None and styles.setdefault(t.hf, t.tp_style) != t.tp_style:
                    raise RoutingError(f"the policies disagree on the TP style of {t.hf!r}")
                for pattern, rx in zip(t.modules, t.module_regexes(), strict=True):
                    known = target_of.setdefault(pattern, t.hf)
                    if known != t.hf:
                        raise RoutingError(f"the policies name module {pattern!r} both {known!r} and {t.hf!r}")
                    same_leaf = by_leaf.setdefault(pattern.rsplit(".", 1)[-1], [])
                    if (rx, t.hf) not in same_leaf:
                        same_leaf.append((rx, t.hf))
        self.styles: Mapping[str, str] = MappingProxyType(styles)  # {HF target: vLLM TP style}
        # {last name component: [(module regex, HF target)]}
        self.by_leaf: Mapping[str, list[tuple[re.Pattern[str], str]]] = MappingProxyType(by_leaf)


_LORA = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")


class RoutingError(ValueError):
    """The inputs cannot be routed: unknown module, indivisible shard, inconsistent sender manifests."""


@dataclass(frozen=True)
class LoraName:
    """A per-module LoRA tensor name resolved to its target: ``target`` is a key of :attr:`TargetRules.styles`."""

    target: str
    ab: str  # "A" | "B"
    layer: int
    expert: int | None = None


def parse_name(name: str, rules: TargetRules) -> LoraName:
    """Resolve a public name (Megatron-Bridge export / vLLM per-expert names, with or without the PEFT prefix)
    by the module patterns of the family's target records."""
    m = _LORA.match(name)
    if m is None:
        raise RoutingError(f"{name!r} is not a per-module LoRA tensor name (...layers.N.<module>.lora_[AB].weight)")
    module = m["module"]
    styles = rules.styles
    for rx, target in rules.by_leaf.get(module.rsplit(".", 1)[-1], []):
        if (found := rx.fullmatch(module)) is not None and target in styles:
            expert = found.groupdict().get("expert")
            return LoraName(target, m["ab"], int(found["layer"]), None if expert is None else int(expert))
    raise RoutingError(
        f"{name!r}: no vLLM TP sharding rule for module {module!r} (fused 3D expert tensors are not routed; "
        f"known targets: {sorted(styles)})"
    )


@dataclass(frozen=True, order=True)
class Slice:
    """Rows/columns ``[start, stop)`` of ``dim``."""

    dim: int
    start: int
    stop: int

    def shape(self, full: Sequence[int]) -> tuple[int, ...]:
        s = list(full)
        s[self.dim] = self.stop - self.start
        return tuple(s)

    def tag(self) -> str:
        return f"d{self.dim}[{self.start}:{self.stop}]"


Placement = dict[int, Slice | None]  # receiver rank -> its slice (None: the whole tensor)


@dataclass(frozen=True)
class ReceiverLayout:
    """The sampler's parallel layout, as plain data.

    ``tp_size``: vLLM tensor-parallel size (one engine, DP 1). ``expert_parallel``: vLLM ``enable_expert_parallel``
    (EP size = ``tp_size``; experts placed in contiguous blocks, as ``LoRAModelManager._slice_moe_lora_ep`` slices
    them). ``num_experts`` is needed with expert parallelism; ``num_kv_heads`` for GQA k/v targets.
    """

    tp_size: int
    expert_parallel: bool = False
    num_experts: int = 0
    num_kv_heads: int | None = None

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise RoutingError(f"tp_size must be >= 1, got {self.tp_size}")
        if self.expert_parallel and (self.num_experts <= 0 or self.num_experts % self.tp_size):
            raise RoutingError(
                f"expert parallelism needs num_experts divisible by {self.tp_size}, got {self.num_experts}"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "tp_size": self.tp_size,
            "expert_parallel": self.expert_parallel,
            "num_experts": self.num_experts,
            "num_kv_heads": self.num_kv_heads,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ReceiverLayout:
        kv = d.get("num_kv_heads")
        return cls(
            int(d["tp_size"]),
            bool(d.get("expert_parallel", False)),
            int(d.get("num_experts", 0)),
            None if kv is None else int(kv),
        )


# ------------------------------------------------------------------------------------------- sharding rules


def split(shape: Sequence[int], dim: int, tp: int, parts: int | None = None) -> Placement:
    """``dim`` cut into ``parts`` equal pieces (default ``tp``); rank ``r`` holds piece ``r // (tp // parts)``
    (``parts < tp``: consecutive ranks share a piece, as vLLM's QKV layer replicates kv heads)."""
    parts = tp if parts is None else parts
    if parts < 1 or tp % parts:
        raise RoutingError(f"cannot spread {parts} pieces over {tp} ranks")
    size = shape[dim]
    if size % parts:
        raise RoutingError(f"dim {dim} of shape {tuple(shape)} is not divisible into {parts} shards")
    chunk, reps = size // parts, tp // parts
    return {r: Slice(dim, (r // reps) * chunk, (r // reps + 1) * chunk) for r in range(tp)}


def replicated(ab: str, shape: Sequence[int], tp: int) -> Placement:
    """ReplicatedLinear / ``disable_tp`` layers: both LoRA matrices whole on every rank."""
    return dict.fromkeys(range(tp))


def column_parallel(ab: str, shape: Sequence[int], tp: int, parts: int | None = None) -> Placement:
    """ColumnParallelLinearWithLoRA: ``slice_lora_a`` returns A whole; ``slice_lora_b`` keeps rows
    ``[tp_rank * out/tp, (tp_rank + 1) * out/tp)`` of B. Merged (gate_up, qkv) layers do the same per slice, i.e.
    per public name. ``tp == 1`` or ``parts == 1`` is whole."""
    if ab == "A" or (parts or tp) == 1:
        return dict.fromkeys(range(tp))
    return split(shape, 0, tp, parts)


def row_parallel(ab: str, shape: Sequence[int], tp: int) -> Placement:
    """RowParallelLinearWithLoRA: ``slice_lora_a`` keeps columns ``[tp_rank * in/tp, ...)`` of A; B is whole."""
    if ab == "B" or tp == 1:
        return dict.fromkeys(range(tp))
    return split(shape, 1, tp)


def expert_owner(expert: int, num_experts: int, ep_size: int) -> int:
    """vLLM EP rank holding ``expert`` (contiguous blocks of ``num_experts // ep_size``)."""
    if not 0 <= expert < num_experts:
        raise RoutingError(f"expert {expert} outside 0..{num_experts - 1}")
    return expert // (num_experts // ep_size)


def placement(name: str, shape: Sequence[int], layout: ReceiverLayout, rules: TargetRules) -> Placement:
    """Which receiver ranks hold public tensor ``name`` (of full ``shape``) and which slice each holds."""
    n = parse_name(name, rules)
    style, tp = rules.styles[n.target], layout.tp_size
    if style == REPLICATED:
        return replicated(n.ab, shape, tp)
    if style == COLUMN:
        return column_parallel(n.ab, shape, tp)
    if style == ROW:
        return row_parallel(n.ab, shape, tp)
    if style == QKV_KV:
        if layout.num_kv_heads is None:
            raise RoutingError(f"{name!r}: k/v sharding needs the layout's num_kv_heads")
        return column_parallel(n.ab, shape, tp, parts=min(tp, layout.num_kv_heads))
    # routed experts
    if n.expert is None:
        raise RoutingError(f"{name!r}: routed-expert target without an expert index")
    if layout.expert_parallel:
        return {expert_owner(n.expert, layout.num_experts, tp): None}
    return column_parallel(n.ab, shape, tp) if style == EXPERT_COLUMN else row_parallel(n.ab, shape, tp)


# ------------------------------------------------------------------------------------ cross-rank ownership


def assign_owners(names_per_sender: Sequence[Sequence[str]]) -> list[list[str]]:
    """Cross-rank dedup by name: each public name is sent by the lowest sender rank holding it. Returns, per
    sender, the names it sends in its own stream order."""
    owner: dict[str, int] = {}
    for s, names in enumerate(names_per_sender):
        for n in names:
            owner.setdefault(n, s)
    return [[n for n in names if owner[n] == s] for s, names in enumerate(names_per_sender)]


# ------------------------------------------------------------------------------------------------- routes


@dataclass(frozen=True)
class Piece:
    """What crosses the wire once: a slice (or the whole) of one unique tensor of one sender."""

    src: int
    sent: str  # the sender manifest's tensor name
    slice: Slice | None
    dtype: str
    shape: tuple[int, ...]  # of the piece

    @property
    def key(self) -> str:
        return f"{self.src}:{self.sent}" + ("" if self.slice is None else "@" + self.slice.tag())

    @property
    def nbytes(self) -> int:
        n = DTYPES[self.dtype].itemsize
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Route:
    """One sender -> one receiver group: its pieces packed at 64-byte aligned offsets, broadcast once (per bucket).
    ``manifest`` is the route's internal layout (piece keys as names, no checksums); it never reaches a receiver."""

    src: int
    receivers: tuple[int, ...]
    pieces: tuple[Piece, ...]
    manifest: Manifest

    @property
    def key(self) -> tuple[int, tuple[int, ...]]:
        return (self.src, self.receivers)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pieces)


@dataclass
class RoutingPlan:
    layout: ReceiverLayout
    version: int
    lora_name: str
    adapter_config: dict[str, Any]
    bucket_bytes: int
    routes: tuple[Route, ...]  # global order: every rank executes its routes in this order (deadlock-free)
    # receiver rank -> public name -> piece key (what the receiver rebuilds that name from)
    needs: dict[int, dict[str, str]] = field(default_factory=dict)

    def group_keys(self) -> list[tuple[int, tuple[int, ...]]]:
        return [r.key for r in self.routes]

    def routes_from(self, sender: int) -> list[Route]:
        return [r for r in self.routes if r.src == sender]

    def routes_to(self, receiver: int) -> list[Route]:
        return [r for r in self.routes if receiver in r.receivers]

    def wire_table(self) -> dict[str, dict[str, int]]:
        """``{"s{src}->r{dst}": {"tensors", "bytes"}}``: what each (sender, receiver) pair moves."""
        out: dict[str, dict[str, int]] = {}
        for route in self.routes:
            for r in route.receivers:
                cell = out.setdefault(f"s{route.src}->r{r}", {"tensors": 0, "bytes": 0})
                cell["tensors"] += len(route.pieces)
                cell["bytes"] += route.nbytes
        return out

    def receiver_update(self, receiver: int, checksums: Mapping[str, str]) -> tuple[Manifest, dict[str, Any]]:
        """The receiver's :class:`Manifest` (its pieces, named after public names; aliases onto them) and the JSON
        handle for :class:`~skyrl_glm.experimental.routing.transport.RoutedTransport` (routes, base offsets, buckets).
        ``checksums``: piece key -> checksum, computed by each sender on the piece it sends."""
        need = self.needs.get(receiver, {})
        by_piece: dict[str, list[str]] = {}
        for public, key in need.items():
            by_piece.setdefault(key, []).append(public)
        entries: list[TensorEntry] = []
        sums: list[str] = []
        aliases: dict[str, str] = {}
        routes: list[dict[str, Any]] = []
        base = 0
        for route in self.routes_to(receiver):
            routes.append(
                {
                    "src": route.src,
                    "receivers": list(route.receivers),
                    "base": base,
                    "nbytes": route.manifest.total_bytes,
                    "buckets": [list(b) for b in route.manifest.buckets()],
                }
            )
            for piece, rel in zip(route.pieces, route.manifest.tensors, strict=True):
                publics = by_piece.get(piece.key)
                if not publics:
                    raise RoutingError(f"route {route.key} carries {piece.key} to rank {receiver}, which needs none")
                # Prefer the sent name itself; otherwise the first public name that resolves to this piece.
                name = piece.sent if piece.sent in publics else publics[0]
                if piece.key not in checksums:
                    raise RoutingError(f"no checksum for piece {piece.key}")
                entries.append(TensorEntry(name, piece.dtype, piece.shape, base + rel.offset, piece.nbytes))
                sums.append(checksums[piece.key])
                for p in publics:
                    if p != name:
                        aliases[p] = name
            base += route.manifest.total_bytes
        manifest = Manifest(
            version=self.version,
            lora_name=self.lora_name,
            adapter_config=dict(self.adapter_config),
            tensors=tuple(entries),
            aliases=aliases,
            total_bytes=base,
            bucket_bytes=self.bucket_bytes,
            checksums="".join(sums),
            extra={"routing": {"receiver": receiver, "layout": self.layout.to_json()}},
        )
        manifest.validate()
        return manifest, {"routes": routes}


def _route_manifest(pieces: Sequence[Piece], plan_meta: Manifest, bucket_bytes: int) -> Manifest:
    entries, total_bytes = pack_entries((p.key, p.dtype, p.shape, p.nbytes) for p in pieces)
    return Manifest(
        version=plan_meta.version,
        lora_name=plan_meta.lora_name,
        adapter_config=dict(plan_meta.adapter_config),
        tensors=entries,
        aliases={},
        total_bytes=total_bytes,
        bucket_bytes=bucket_bytes,
        checksums="",  # the receiver's manifest carries the checksums (receiver_update)
    )


def plan_routes(
    sender_manifests: Sequence[Manifest],
    layout: ReceiverLayout,
    rules: TargetRules,
    *,
    bucket_bytes: int | None = None,
) -> RoutingPlan:
    """Route every public name of every sender manifest to the receiver ranks that hold it (see module doc).
    Sender manifests must agree on version, lora_name and adapter_config, and no public name may come from two
    senders (run :func:`assign_owners` first)."""
    if not sender_manifests:
        raise RoutingError("no sender manifests")
    first = sender_manifests[0]
    for s, m in enumerate(sender_manifests):
        if (m.version, m.lora_name, m.adapter_config) != (first.version, first.lora_name, first.adapter_config):
            raise RoutingError(f"sender {s}'s manifest disagrees with sender 0 on version, lora_name or config")
    bucket_bytes = first.bucket_bytes if bucket_bytes is None else bucket_bytes
    owner: dict[str, int] = {}
    receivers_of: dict[Piece, set[int]] = {}
    order: dict[Piece, tuple[int, int]] = {}
    needs: dict[int, dict[str, str]] = {r: {} for r in range(layout.tp_size)}
    for s, m in enumerate(sender_manifests):
        entries = {t.name: (i, t) for i, t in enumerate(m.tensors)}
        alias_map = m.alias_map()
        for public in [*entries, *alias_map]:
            if public in owner:
                raise RoutingError(f"{public!r} is sent by sender {owner[public]} and sender {s}: assign owners first")
            owner[public] = s
            i, entry = entries[alias_map.get(public, public)]
            for r, sl in placement(public, entry.shape, layout, rules).items():
                shape = entry.shape if sl is None else sl.shape(entry.shape)
                piece = Piece(s, entry.name, sl, entry.dtype, shape)
                receivers_of.setdefault(piece, set()).add(r)
                order.setdefault(piece, (i, -1 if sl is None else sl.start))
                needs[r][public] = piece.key
    grouped: dict[tuple[int, tuple[int, ...]], list[Piece]] = {}
    for piece, rs in receivers_of.items():
        grouped.setdefault((piece.src, tuple(sorted(rs))), []).append(piece)
    # Global order: by sender, wider groups first, then receiver ranks.
    keys = sorted(grouped, key=lambda k: (k[0], -len(k[1]), k[1]))
    routes = []
    for k in keys:
        pieces = sorted(grouped[k], key=lambda p: order[p])
        routes.append(Route(k[0], k[1], tuple(pieces), _route_manifest(pieces, first, bucket_bytes)))
    return RoutingPlan(
        layout=layout,
        version=first.version,
        lora_name=first.lora_name,
        adapter_config=dict(first.adapter_config),
        bucket_bytes=bucket_bytes,
        routes=tuple(routes),
        needs=needs,
    )


def expected_slices(
    full: Mapping[str, Any], layout: ReceiverLayout, receiver: int, rules: TargetRules
) -> dict[str, Any]:
    """Reference: ``{public name: its slice}`` that ``receiver`` must hold, cut from the full (folded) adapter
    ``{public name: tensor}``. Works on anything with ``.shape`` and ``narrow`` (torch tensors)."""
    out = {}
    for name, t in full.items():
        place = placement(name, tuple(t.shape), layout, rules)
        if receiver in place:
            sl = place[receiver]
            out[name] = t if sl is None else t.narrow(sl.dim, sl.start, sl.stop - sl.start)
    return out
