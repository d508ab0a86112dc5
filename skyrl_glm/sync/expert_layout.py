"""How the routed experts' LoRA is handed to vLLM: one of four layouts, fixed for an engine when it starts.

An update arrives with the per-expert public names vLLM's GPU build loads without flags
(``...mlp.experts.{e}.{gate,up,down}_proj.lora_{A,B}.weight``). vLLM takes the same adapter in two other forms,
each switched on by an engine argument (so a layout is the engine's, not the update's):

``per-expert``
    every expert name as its own tensor (no engine argument): vLLM parses each name and stacks them per layer.
``stacked-3d``
    ``enable_mixed_moe_lora_format`` + ``LoRARequest(is_3d_lora_weight=True)``: four tensors per MoE layer, the
    experts stacked on the rank dimension (``experts.base_layer.lora_A [r*E, H]`` and ``lora_B [2I, r*E]`` for
    gate/up, ``experts.lora_A [r*E, I]`` and ``lora_B [H, r*E]`` for down). gate and up must share ``lora_A``.
``shared-outer``
    ``enable_moe_shared_loras``: ``experts.w{1,2,3}`` stacks whose gate/up ``lora_A`` and down ``lora_B`` have
    expert-dim 1 (vLLM keeps one slot for all experts); the other factors ``[E, ...]``, one broadcast view each when
    the experts share them (Megatron-Bridge's ``share_expert_adapters``). vLLM reads expert 0 of a shared factor and
    ignores the rest, so an adapter whose experts differ there is refused, never served wrong.
``shared-all``
    shared-outer's tensors and engine argument, plus ``additional_config={"skyrl_glm_expert_layout": "shared-all"}``,
    which makes skyrl-glm's vLLM plugin keep the other factors once per layer too
    (:mod:`skyrl_glm.sync.vllm.shared_factors`): shared-outer's quarter of the per-expert slot memory becomes about
    1/E of it. Only for an adapter whose experts share every factor (``share_expert_adapters``); any other is refused.
``grouped:G``
    G factor sets per layer, one per group of E/G consecutive experts (what Megatron-Bridge's
    ``share_expert_adapters`` trains under expert parallelism: one adapter per EP rank's block of experts), asked for
    like shared-all (its ``additional_config`` entry is ``grouped:G``). The update carries ``experts.w{1,2,3}``
    stacks of expert-dim G, the plugin keeps each factor once per group and hands vLLM's fused-MoE LoRA kernels an
    expert-to-group map (:mod:`skyrl_glm.sync.vllm.shared_factors`); shared-all is its G=1 case there. An adapter
    whose experts differ inside a group is refused.

:func:`arrange` builds a layout from the manifest's alias structure (``NameIndex``: explicit names and expert-index
runs) without expanding the per-expert names. Torch only: the receiver calls it, no vLLM import; the layout
records (names, engine arguments) import nothing, so choosing a layout costs no torch import.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from skyrl_glm.sync.manifest import Manifest, TensorEntry

PER_EXPERT = "per-expert"
STACKED_3D = "stacked-3d"
SHARED_OUTER = "shared-outer"
SHARED_ALL = "shared-all"
GROUPED = "grouped"  # written ``grouped:G``: G groups of consecutive experts per layer
NAMED = (PER_EXPERT, STACKED_3D, SHARED_OUTER, SHARED_ALL)
LAYOUTS = (*NAMED, f"{GROUPED}:G")  # as a user writes them
MAX_GROUPS = 1 << 16  # more groups than any MoE has experts: refused before anything is sized by G

# The vLLM engine argument each layout needs (vLLM 0.26-0.32 ``LoRAConfig``), and the LoRARequest fields it loads with.
ENGINE_FLAGS = {STACKED_3D: "enable_mixed_moe_lora_format", SHARED_OUTER: "enable_moe_shared_loras"}
# shared-all and grouped ride on shared-outer's flag; this entry of vLLM's ``additional_config`` (its field for
# plugins, carried to every worker with the engine's config) tells skyrl-glm's vLLM plugin to share the other factors
# too (``shared-all`` or ``grouped:G``).
ADDITIONAL_CONFIG_KEY = "skyrl_glm_expert_layout"
REQUEST_FIELDS: dict[str, dict[str, Any]] = {STACKED_3D: {"is_3d_lora_weight": True}}

# vLLM's names for a gated expert's projections (``FusedMoE`` w1 = gate, w2 = down, w3 = up).
SLOTS = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}
# The factors shared-outer stores once per layer (expert-dim 1).
SHARED_FACTORS = (("gate_proj", "A"), ("up_proj", "A"), ("down_proj", "B"))
FACTORS = tuple((proj, ab) for proj in SLOTS for ab in "AB")

_NAME = re.compile(
    r"(?P<experts>.+\.experts)\.(?P<e>0|[1-9][0-9]*)\.(?P<proj>gate_proj|up_proj|down_proj)\.lora_(?P<ab>[AB])\.weight"
)
_RUN_HEAD = re.compile(r"(?P<experts>.+\.experts)\.")
_RUN_TAIL = re.compile(r"\.(?P<proj>gate_proj|up_proj|down_proj)\.lora_(?P<ab>[AB])\.weight")


class LayoutError(ValueError):
    """The update cannot be served in the engine's expert layout (the reason names the module and the factor)."""


def _groups_in(layout: str) -> int | None:
    """G of ``grouped:G`` (a decimal integer in 1..MAX_GROUPS), None for any other text."""
    head, _, count = layout.partition(":")
    if head != GROUPED or not count.isdecimal() or not count.isascii() or len(count) > 6:
        return None
    return int(count) if 1 <= int(count) <= MAX_GROUPS else None


def check_layout(layout: Any) -> str:
    """``layout`` if it names a layout (``grouped:G`` with its G), else :class:`LayoutError` saying what to write."""
    if isinstance(layout, str) and (layout in NAMED or _groups_in(layout) is not None):
        return layout
    raise LayoutError(
        f"unknown expert layout {layout!r}; choose from {', '.join(LAYOUTS)} (G: groups per layer, 1..{MAX_GROUPS})"
    )


def expert_groups(layout: str) -> int | None:
    """How many factor sets per layer ``layout`` serves the routed experts with, where one set serves a whole
    group of consecutive experts: 1 for shared-all, G for ``grouped:G``; None where a factor is kept per expert."""
    return 1 if layout == SHARED_ALL else _groups_in(layout)


def engine_arguments(layout: str, engine: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The vLLM engine arguments that start an engine in ``layout``: every layout flag, on for ``layout``'s and off
    otherwise, so they win over a default set elsewhere (SkyRL 0.4.0 turns ``enable_mixed_moe_lora_format`` on for
    every LoRA engine, which beside ``enable_moe_shared_loras`` would make the layout ambiguous); for shared-all and
    grouped, ``additional_config`` with its entry, merged into the one ``engine`` (the other arguments) already
    holds."""
    grouped = expert_groups(check_layout(layout)) is not None
    flag_layout = SHARED_OUTER if grouped else layout
    out: dict[str, Any] = {flag: owner == flag_layout for owner, flag in ENGINE_FLAGS.items()}
    if grouped:
        theirs = (engine or {}).get("additional_config") or {}
        if not isinstance(theirs, Mapping):
            raise LayoutError(
                f"additional_config must be a mapping (vLLM's config for plugins; {layout} adds its entry there), "
                f"got {type(theirs).__name__}"
            )
        out["additional_config"] = {**theirs, ADDITIONAL_CONFIG_KEY: layout}
    return out


def layout_of(settings: Mapping[str, Any] | Any, *, loads_3d: bool = True) -> str:
    """The layout an engine runs, from its engine arguments (a mapping) or its ``VllmConfig`` (``lora_config`` and
    ``additional_config``; or an object with the flags as attributes): the one source of truth, read where the engine
    starts and inside its workers. ``loads_3d``: whether the engine's loader sends
    ``LoRARequest(is_3d_lora_weight=True)``; without it ``enable_mixed_moe_lora_format`` (which SkyRL 0.4.0 sets on
    every LoRA engine, for Megatron's per-expert export) serves per-expert names through vLLM's universal 2D
    wrapper, and a 3D stack would stop its load (``fused_moe.py`` asserts a list per expert, on one H200)."""
    if isinstance(settings, Mapping):
        read, extra = settings.get, settings.get("additional_config")
    else:
        flags = getattr(settings, "lora_config", None) or settings
        read, extra = (lambda key, default: getattr(flags, key, default)), getattr(settings, "additional_config", None)
    on = [layout for layout, flag in ENGINE_FLAGS.items() if read(flag, False)]
    if len(on) > 1:
        raise LayoutError(f"{' and '.join(ENGINE_FLAGS[x] for x in on)} are exclusive: pick one expert layout")
    layout = on[0] if on else PER_EXPERT
    asked = extra.get(ADDITIONAL_CONFIG_KEY) if isinstance(extra, Mapping) else None
    if layout == SHARED_OUTER and isinstance(asked, str) and expert_groups(asked) is not None:
        return asked
    return PER_EXPERT if layout == STACKED_3D and not loads_3d else layout


def request_fields(layout: str) -> dict[str, Any]:
    """Extra ``LoRARequest`` fields an adapter in ``layout`` is loaded with."""
    return dict(REQUEST_FIELDS.get(layout, {}))


def _owners(manifest: Manifest) -> tuple[dict[str, dict[tuple[str, str], list[str | None]]], dict[str, str], list]:
    """Per experts module, per (projection, A/B): the sent name behind each expert index; plus the public names
    that are not routed-expert names (explicit ``{public: sent}`` and runs), left as they are."""
    index = manifest.names
    spans: dict[str, dict[tuple[str, str], list[tuple[int, int, str]]]] = {}
    others: dict[str, str] = {}
    for name, sent in index.explicit.items():
        m = _NAME.fullmatch(name)
        if m is None:
            others[name] = sent
        else:
            e = int(m["e"])
            spans.setdefault(m["experts"], {}).setdefault((m["proj"], m["ab"]), []).append((e, e + 1, sent))
    other_runs = []
    for (head, tail), intervals in index.runs.items():
        h, t = _RUN_HEAD.fullmatch(head), _RUN_TAIL.fullmatch(tail)
        if h is None or t is None:
            other_runs.extend(r for r in manifest.alias_runs if (r.head, r.tail) == (head, tail))
        else:
            spans.setdefault(h["experts"], {}).setdefault((t["proj"], t["ab"]), []).extend(intervals)
    owners: dict[str, dict[tuple[str, str], list[str | None]]] = {}
    for experts, factors in spans.items():
        size = max(stop for intervals in factors.values() for _, stop, _ in intervals)
        owners[experts] = {}
        for factor, intervals in factors.items():
            row: list[str | None] = [None] * size
            for start, stop, sent in intervals:  # overlaps name one sent tensor (NameIndex refuses others)
                row[start:stop] = [sent] * (stop - start)
            owners[experts][factor] = row
    return owners, others, other_runs


def _complete(experts: str, factors: dict[tuple[str, str], list[str | None]]) -> None:
    """Every factor of every projection covers every expert of the module (its rows share one length)."""
    for proj, ab in FACTORS:
        row = factors.get((proj, ab))
        if row is None:
            raise LayoutError(f"{experts}: no {proj}.lora_{ab} (a stacked expert layout needs gate, up and down)")
        missing = [e for e, s in enumerate(row) if s is None]
        if missing:
            raise LayoutError(f"{experts}: {proj}.lora_{ab} misses experts {missing[:4]} of {len(row)}")


# How one tensor handed to vLLM is built from the sent ones: decided per layout, built per update (:func:`_build`)
_Spec = tuple[str, tuple[str, ...]]


def _differing(a: list[str], b: list[str]) -> list[tuple[int, str, str]]:
    """``(expert, a's sent name, b's)`` wherever the rows name different sent tensors: only these can differ in value.
    Rows that name the same sent tensors (an exporter's declared sharing) give none at C speed, no step per expert."""
    if a == b:
        return []
    return [(e, x, y) for e, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]


def _first_unequal(sent: Mapping[str, torch.Tensor], pairs: list[tuple[int, str, str]]) -> int | None:
    """The first expert of ``pairs`` whose two tensors differ in value, else None."""
    import torch

    return next((e for e, x, y in pairs if not torch.equal(sent[x], sent[y])), None)


def _stack_spec(row: list[str], entries: Mapping[str, TensorEntry]) -> _Spec:
    """How to build ``[E, ...]`` of one factor without a copy where it can: ``expand``, a broadcast view, when every
    expert shows one sent tensor; ``strided``, a view of the received stream, when the row's tensors lie back to
    back in it (the sender packs a factor's groups in stream order, each at a 64-byte offset: back to back wherever
    its bytes are a multiple of 64), read from the manifest's entries; else ``stack``, one copy."""
    if len(set(row)) == 1:
        return "expand", tuple(row)
    first = entries[row[0]]
    alike = all(
        (e.dtype, e.shape, e.offset) == (first.dtype, first.shape, first.offset + i * first.nbytes)
        for i, e in enumerate(map(entries.__getitem__, row))
    )
    return ("strided" if alike else "stack"), tuple(row)


def _build(spec: _Spec, sent: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The tensor ``spec`` describes (``one``: a sent tensor at expert-dim 1, or a stack of :func:`_stack_spec`),
    from ``sent`` (the update's sent tensors, views of its stream)."""
    import torch

    how, names = spec
    one = sent[names[0]]
    if how == "one":
        return one.unsqueeze(0)
    if how == "expand":
        return one.unsqueeze(0).expand(len(names), *one.shape)
    if how == "strided":
        return one.as_strided((len(names), *one.shape), (one.numel(), *one.stride()))
    return torch.stack([sent[n] for n in names])


# Pairs of sent tensors that must be equal in value, and the refusal if one pair is not (given its expert)
_Check = tuple[list[tuple[int, str, str]], Callable[[int], str]]


def _split_group(layout: str, experts: str, factor: str, size: int, e: int) -> str:
    first = e - e % size
    return (
        f"expert layout {layout}: {experts} expert {e} has another {factor} than expert {first}, the first of its "
        f"group of {size} (the engine keeps one per group and would serve expert {first}'s); use per-expert or "
        "stacked-3d"
    )


def _split_gate_up(experts: str, e: int) -> str:
    return (
        f"expert layout stacked-3d: {experts} expert {e} has different gate_proj and up_proj lora_A "
        "(vLLM's 3D format holds one gate/up lora_A per expert); use per-expert"
    )


def _group_checks(
    experts: str, rows: dict[tuple[str, str], list[str]], layout: str, groups: int
) -> tuple[list[int], list[_Check]]:
    """The first expert of each of ``groups`` groups of consecutive experts, and per factor of ``rows`` the value
    checks that every expert of a group shows its first expert's tensor (the engine keeps one per group and would
    serve the first's to all)."""
    experts_count = len(next(iter(rows.values())))
    if experts_count % groups:
        raise LayoutError(f"expert layout {layout}: {experts} has {experts_count} experts, not {groups} equal groups")
    size = experts_count // groups
    heads = list(range(0, experts_count, size))
    checks = []
    for (proj, ab), row in rows.items():
        pairs = _differing(row, [row[e - e % size] for e in range(experts_count)])
        if pairs:
            checks.append((pairs, partial(_split_group, layout, experts, f"{proj}.lora_{ab}", size)))
    return heads, checks


def _rank_major(b: torch.Tensor) -> torch.Tensor:
    """``[E, out, r]`` as vLLM's 3D ``lora_B [out, r*E]`` (column ``k*E + e``: it reshapes to ``[out, r, E]``)."""
    num_experts, out, r = b.shape
    return b.permute(1, 2, 0).reshape(out, r * num_experts)


class Arrangement:
    """How the updates of one manifest layout are handed to vLLM in one expert layout (see :func:`arrange`), worked
    out once from the alias structure and the entries: which names pass as views, each experts module's rows, the
    stack of each factor, and the few value checks left (pairs of distinct sent tensors that must be equal; none
    for an exporter's declared sharing). :meth:`apply` then costs a step per output tensor and per value check,
    none per public name. Valid for manifests of the same layout only: :class:`~skyrl_glm.sync.receiver.
    AdapterReceiver` keeps one per accepted layout, keyed by the manifest's layout identity
    (:attr:`~skyrl_glm.sync.manifest.Manifest.layout_key`) and the engine's layout; any other layout makes a new one.
    Raises :class:`LayoutError` when no update of the layout can be served so."""

    def __init__(self, manifest: Manifest, layout: str) -> None:
        groups = expert_groups(layout)
        if layout not in (STACKED_3D, SHARED_OUTER, SHARED_ALL) and groups is None:
            raise LayoutError(
                f"arrange builds {STACKED_3D}, {SHARED_OUTER}, {SHARED_ALL} or {GROUPED}:G, not {layout!r}"
            )
        owners, others, other_runs = _owners(manifest)
        self.views: dict[str, str] = dict(others)  # public name -> its sent name, handed on as it is
        for run in other_runs:
            self.views.update(dict.fromkeys(run.names(), run.sent))
        entries = {e.name: e for e in manifest.tensors}
        self.specs: dict[str, _Spec] = {}  # per experts module, in order: its output names -> how each is built
        self.stacked_3d: dict[str, dict[tuple[str, str], _Spec]] = {}  # stacked-3d: per experts module, its stacks
        self.checks: list[_Check] = []
        for experts, factors in owners.items():
            _complete(experts, factors)
            rows: dict[tuple[str, str], list[str]] = factors  # type: ignore[assignment]  # complete: no None left
            if layout == STACKED_3D:
                self._stacked_3d(experts, rows, entries)
            elif layout in (SHARED_OUTER, SHARED_ALL):
                self._shared(experts, rows, entries, layout)
            else:
                self._grouped(experts, rows, entries, layout, groups)  # type: ignore[arg-type]  # grouped: an int
        specs = [*self.specs.values(), *(s for module in self.stacked_3d.values() for s in module.values())]
        read = {*self.views.values(), *(x for pairs, _ in self.checks for _, *xy in pairs for x in xy)}
        read.update(names[0] if how in ("one", "expand", "strided") else n for how, names in specs for n in names)
        # the sent tensors apply() reads (a stack of a factor's groups back to back reads its first): only these
        # are made views of (``manifest.views``); in stream order
        self.reads: list[TensorEntry] = [e for e in manifest.tensors if e.name in read]

    def _shared(
        self, experts: str, rows: dict[tuple[str, str], list[str]], entries: Mapping[str, TensorEntry], layout: str
    ) -> None:
        """shared-outer or shared-all: the factors vLLM keeps once per layer as ``[1, ...]`` (refused where an expert
        differs from expert 0), the others ``[E, ...]`` (shared-all keeps expert 0's slot of them, so these must be
        shared too: a broadcast view each)."""
        shared = FACTORS if layout == SHARED_ALL else SHARED_FACTORS
        self.checks += _group_checks(experts, {f: rows[f] for f in shared}, layout, 1)[1]
        for proj, ab in FACTORS:
            row, name = rows[(proj, ab)], f"{experts}.{SLOTS[proj]}.lora_{ab}.weight"
            self.specs[name] = ("one", (row[0],)) if (proj, ab) in SHARED_FACTORS else _stack_spec(row, entries)

    def _grouped(
        self,
        experts: str,
        rows: dict[tuple[str, str], list[str]],
        entries: Mapping[str, TensorEntry],
        layout: str,
        groups: int,
    ) -> None:
        """grouped:G: shared-outer's ``experts.w{1,2,3}`` names, every factor ``[G, ...]`` (its groups' first
        experts)."""
        heads, checks = _group_checks(experts, rows, layout, groups)
        self.checks += checks
        for proj, ab in FACTORS:
            name = f"{experts}.{SLOTS[proj]}.lora_{ab}.weight"
            self.specs[name] = _stack_spec([rows[(proj, ab)][e] for e in heads], entries)

    def _stacked_3d(
        self, experts: str, rows: dict[tuple[str, str], list[str]], entries: Mapping[str, TensorEntry]
    ) -> None:
        pairs = _differing(rows[("gate_proj", "A")], rows[("up_proj", "A")])
        if pairs:
            self.checks.append((pairs, partial(_split_gate_up, experts)))
        wanted = (("gate_proj", "A"), ("gate_proj", "B"), ("up_proj", "B"), ("down_proj", "A"), ("down_proj", "B"))
        self.stacked_3d[experts] = {f: _stack_spec(rows[f], entries) for f in wanted}

    def apply(self, sent: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors vLLM loads for an update of this layout, ``sent`` its sent tensors (those of :attr:`reads` at
        least) as views of its received stream (``manifest.views``); :class:`LayoutError` when its values break a
        check (nothing handed on then)."""
        self.check(sent)
        return self.build(sent)

    def check(self, sent: Mapping[str, torch.Tensor]) -> None:
        """:class:`LayoutError` when the update's values break a check (its structure passed them all): what an
        update whose tensors are already built (a kept buffer's) still runs."""
        for pairs, refusal in self.checks:
            e = _first_unequal(sent, pairs)
            if e is not None:
                raise LayoutError(refusal(e))

    def build(self, sent: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors vLLM loads, made of ``sent`` (views, no copies where the layout allows; no check)."""
        import torch

        out = dict(zip(self.views, map(sent.__getitem__, self.views.values()), strict=True))
        for name, spec in self.specs.items():
            out[name] = _build(spec, sent)
        for experts, specs in self.stacked_3d.items():
            gate_up_a = _build(specs[("gate_proj", "A")], sent)
            gate_up_b = torch.cat([_build(specs[("gate_proj", "B")], sent), _build(specs[("up_proj", "B")], sent)], 1)
            down_a, down_b = _build(specs[("down_proj", "A")], sent), _build(specs[("down_proj", "B")], sent)
            out[f"{experts}.base_layer.lora_A.weight"] = gate_up_a.reshape(-1, gate_up_a.shape[-1])
            out[f"{experts}.base_layer.lora_B.weight"] = _rank_major(gate_up_b)
            out[f"{experts}.lora_A.weight"] = down_a.reshape(-1, down_a.shape[-1])
            out[f"{experts}.lora_B.weight"] = _rank_major(down_b)
        return out


def arrange(manifest: Manifest, sent: Mapping[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """The tensors vLLM loads for this update in ``layout``: every public name that is not a routed-expert name
    as it is (a view of its sent tensor), the routed experts per experts module in the layout. Raises
    :class:`LayoutError` when the update cannot be served so (nothing is handed on then). ``sent``: the views of
    the update's received stream (``manifest.views``); a receiver of many updates keeps the :class:`Arrangement`."""
    return Arrangement(manifest, layout).apply(sent)
