"""Reference conversions for the tests (no product code uses them): name and shape rules for a LoRA adapter in
the layouts it passes through on the way trainer -> sampler.

Four layouts of the same adapter (``W_e += scale * B_e @ A_e`` per module, ``scale = alpha / r``):

``peft``
    HF/PEFT state dict on transformers 5.x (keys ``base_model.model.<module>.lora_{A,B}.weight``).
    Routed experts are fused 3D parameters (``mlp.experts.gate_up_proj [E, 2I, H]``, ``mlp.experts.down_proj
    [E, H, I]``) reached through ``target_parameters``. PEFT wraps the ``experts`` module once per targeted
    parameter, innermost first in the module's parameter order (not the list order), so the keys are
    ``...mlp.experts.base_layer.lora_A.weight`` (gate_up) and ``...mlp.experts.lora_A.weight`` (down). The fused
    tensors have ``r * E`` rows/columns and come in two orientations (:data:`PEFT_TRANSPOSED` for peft <= 0.18,
    :data:`STANDARD` for peft 0.21 and vLLM).
``bridge``
    Megatron-Bridge ``export_adapter_weights``: HF names without the PEFT prefix, routed experts per expert
    (``model.layers.L.mlp.experts.{e}.{gate,up,down}_proj.lora_{A,B}.weight``), the fused fc1 split into gate/up
    (both halves of ``linear_out`` under gate/up ``lora_B``, the one ``linear_in`` under both ``lora_A`` names). With
    ``share_expert_adapters`` one adapter serves all experts of a layer, so every expert name carries the same tensor.
``vllm``
    vLLM per-expert names: the ``bridge`` names with the PEFT prefix (``base_model.model.``).
``vllm3d``
    vLLM's 3D MoE LoRA layout (``enable_mixed_moe_lora_format=True``, ``LoRARequest(..., is_3d_lora_weight=True)``):
    the ``peft`` names with the fused expert tensors in :data:`STANDARD` orientation, gate_up under
    ``experts.base_layer`` and down under ``experts``.

All functions are pure: they return new dicts, never modify their input, and never scale tensors.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import torch

PEFT_PREFIX = "base_model.model."
GATE_UP = "mlp.experts.gate_up_proj"
DOWN = "mlp.experts.down_proj"
ROUTED_PARAMS = (GATE_UP, DOWN)

# Orientation of a fused expert LoRA pair (A: [r*E, a], B: [b, r*E]).
# STANDARD: A reshapes to [E, r, in], B to [out, r, E]; W[e] (out x in) += B_e @ A_e.  (vLLM 3D, peft 0.21)
# PEFT_TRANSPOSED: peft 0.18 treats the [E, d1, d2] parameter as [E, in, out], so A is [r*E, d1] and B [d2, r*E],
# and its delta is (B_e @ A_e)^T: the roles of A and B are swapped relative to the HF weight.
STANDARD = "standard"
PEFT_TRANSPOSED = "peft_transposed"

_EXPERTS_RE = re.compile(
    r"^(?P<head>.*\.layers\.(?P<layer>\d+)\.mlp\.experts)(?P<wrap>(?:\.base_layer)*)\.lora_(?P<ab>[AB])\.weight$"
)
_PER_EXPERT_RE = re.compile(
    r"^(?P<head>.*\.layers\.(?P<layer>\d+)\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)"
    r"\.lora_(?P<ab>[AB])\.weight$"
)


class LayoutError(ValueError):
    """An adapter does not fit the layout it was declared to be in, or cannot be expressed in the target layout."""


def installed_peft_fused_layout() -> str:
    """The fused-expert orientation the installed peft writes (measured: 0.18.1 transposed; 0.21 standard)."""
    import peft
    from packaging.version import Version

    return PEFT_TRANSPOSED if Version(peft.__version__) < Version("0.19") else STANDARD


def expert_wrapper_suffixes(target_parameters: Sequence[str]) -> dict[str, str]:
    """PEFT module suffix under ``mlp.experts`` for each routed-expert target parameter.

    PEFT nests one wrapper per targeted parameter, innermost first in the order the experts module registers its
    parameters (transformers: ``gate_up_proj`` then ``down_proj``), whatever the order of ``target_parameters``
    (measured on peft 0.18.1): gate_up lives at ``experts.base_layer`` and down at ``experts``; with one of them
    targeted it lives at ``experts``. Parameters outside ``mlp.experts`` are ignored.
    """
    routed = [p for p in target_parameters if p.startswith("mlp.experts.") or ".mlp.experts." in p]
    routed = [p[p.index("mlp.experts.") :] for p in routed]
    unknown = [p for p in routed if p not in ROUTED_PARAMS]
    if unknown:
        raise LayoutError(f"unknown routed-expert target parameters {unknown}; known {list(ROUTED_PARAMS)}")
    ordered = [p for p in ROUTED_PARAMS if p in routed]
    n = len(ordered)
    return {p: ".base_layer" * (n - 1 - i) for i, p in enumerate(ordered)}


def _strip_prefix(name: str) -> str:
    if not name.startswith(PEFT_PREFIX):
        raise LayoutError(f"{name!r} does not start with the PEFT prefix {PEFT_PREFIX!r}")
    return name[len(PEFT_PREFIX) :]


# ---------------------------------------------------------------------------------------------------------------
# fused expert tensors <-> per-expert standard tensors


def fused_to_experts(a: torch.Tensor, b: torch.Tensor, num_experts: int, layout: str) -> tuple[list, list]:
    """Split a fused expert LoRA pair into per-expert standard ``(A_e [r, in], B_e [out, r])`` views."""
    e = num_experts
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] % e or b.shape[1] != a.shape[0]:
        raise LayoutError(f"fused expert LoRA shapes A{tuple(a.shape)} B{tuple(b.shape)} do not fit {e} experts")
    if layout == STANDARD:
        a3 = a.reshape(e, -1, a.shape[1])  # [E, r, in]
        b3 = b.reshape(b.shape[0], -1, e)  # [out, r, E]
        return [a3[i] for i in range(e)], [b3[:, :, i] for i in range(e)]
    if layout == PEFT_TRANSPOSED:
        a3 = a.reshape(e, -1, a.shape[1])  # [E, r, out]   (peft's "in" is the HF weight's out)
        b3 = b.reshape(b.shape[0], -1, e)  # [in, r, E]
        return [b3[:, :, i].T for i in range(e)], [a3[i].T for i in range(e)]
    raise LayoutError(f"unknown fused layout {layout!r}")


def experts_to_fused(a_list: Sequence[torch.Tensor], b_list: Sequence[torch.Tensor], layout: str):
    """Inverse of :func:`fused_to_experts`: per-expert standard pairs -> fused ``(A, B)`` in ``layout``."""
    e = len(a_list)
    if layout == STANDARD:
        a = torch.stack(list(a_list), 0)  # [E, r, in]
        b = torch.stack(list(b_list), 2)  # [out, r, E]
    elif layout == PEFT_TRANSPOSED:
        a = torch.stack([x.T for x in b_list], 0)  # [E, r, out]
        b = torch.stack([x.T for x in a_list], 2)  # [in, r, E]
    else:
        raise LayoutError(f"unknown fused layout {layout!r}")
    if e == 0:
        raise LayoutError("no experts")
    return a.reshape(-1, a.shape[-1]).contiguous(), b.reshape(b.shape[0], -1).contiguous()


def convert_fused(a: torch.Tensor, b: torch.Tensor, num_experts: int, src: str, dst: str):
    """Re-orient a fused expert pair between :data:`PEFT_TRANSPOSED` and :data:`STANDARD`."""
    if src == dst:
        return a, b
    return experts_to_fused(*fused_to_experts(a, b, num_experts, src), dst)


def detect_fused_layout(
    sd: Mapping[str, torch.Tensor],
    *,
    target_parameters: Sequence[str],
    hidden_size: int,
    moe_intermediate_size: int,
) -> str | None:
    """Orientation of the fused expert tensors in ``sd`` from their shapes (``None``: no fused experts).

    lora_A columns: gate_up ([E, 2I, H]) has H standard / 2I transposed; down ([E, H, I]) has I standard / H
    transposed. A projection whose two candidates are equal does not vote; raises if nothing decides.
    """
    h, i = hidden_size, moe_intermediate_size
    cols = {GATE_UP: {STANDARD: h, PEFT_TRANSPOSED: 2 * i}, DOWN: {STANDARD: i, PEFT_TRANSPOSED: h}}
    param_of = {v: k for k, v in expert_wrapper_suffixes(target_parameters).items()}
    votes: set[str] = set()
    found = False
    for name, t in sd.items():
        m = _EXPERTS_RE.match(name)
        if not m or m["ab"] != "A" or m["wrap"] not in param_of:
            continue
        found = True
        cand = cols[param_of[m["wrap"]]]
        matching = [k for k, c in cand.items() if c == t.shape[1]]
        if not matching:
            raise LayoutError(f"{name}: {t.shape[1]} columns fit no orientation {cand}")
        if len(matching) == 1:
            votes.add(matching[0])
    if not found:
        return None
    if len(votes) != 1:
        raise LayoutError(f"cannot tell the fused expert orientation from the shapes (votes: {sorted(votes)})")
    return votes.pop()


# ---------------------------------------------------------------------------------------------------------------
# routed experts: per-expert <-> fused


def _split_fc1(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if b.shape[0] % 2:
        raise LayoutError(f"gate_up lora_B has odd output dim {b.shape[0]}")
    inter = b.shape[0] // 2
    return a, b[:inter], b[inter:]  # HF: gate, up = linear(x, gate_up_proj[e]).chunk(2, dim=-1)


def peft_experts_to_per_expert(
    sd: Mapping[str, torch.Tensor],
    *,
    num_experts: int,
    target_parameters: Sequence[str],
    fused_layout: str,
) -> dict[str, torch.Tensor]:
    """Replace PEFT's fused routed-expert tensors by per-expert names (no prefix change); other keys pass through.

    Output names: ``<head>.{e}.gate_proj.lora_A.weight`` etc., where ``<head>`` is the module path ending in
    ``mlp.experts``. gate and up carry the same ``lora_A`` tensor (one fc1 adapter), as Megatron-Bridge exports it.
    """
    suffix_of = expert_wrapper_suffixes(target_parameters)
    param_of_suffix = {v: k for k, v in suffix_of.items()}
    out: dict[str, torch.Tensor] = {}
    groups: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for name, t in sd.items():
        m = _EXPERTS_RE.match(name)
        if not m:
            out[name] = t
            continue
        if m["wrap"] not in param_of_suffix:
            raise LayoutError(f"{name}: wrapper depth {m['wrap']!r} matches no target parameter {suffix_of}")
        groups.setdefault((m["head"], param_of_suffix[m["wrap"]]), {})[m["ab"]] = t
    per_head: dict[str, dict[str, tuple[list, list]]] = {}
    for (head, param), ab in groups.items():
        if set(ab) != {"A", "B"}:
            raise LayoutError(f"{head} {param}: need lora_A and lora_B, got {sorted(ab)}")
        per_head.setdefault(head, {})[param] = fused_to_experts(ab["A"], ab["B"], num_experts, fused_layout)
    for head, by_param in per_head.items():
        if GATE_UP in by_param and DOWN in by_param:  # x[H] -> gate_up -> [2I] -> down -> [H]
            (fa, fb), (da, db) = by_param[GATE_UP], by_param[DOWN]
            if fa[0].shape[1] != db[0].shape[0] or fb[0].shape[0] != 2 * da[0].shape[1]:
                raise LayoutError(
                    f"{head}: gate_up {tuple(fb[0].shape)}@{tuple(fa[0].shape)} and down "
                    f"{tuple(db[0].shape)}@{tuple(da[0].shape)} do not chain; wrong target_parameters order "
                    "or fused layout?"
                )
    for (head, param), _ab in groups.items():
        a_list, b_list = per_head[head][param]
        for e in range(num_experts):
            if param == GATE_UP:
                a, gate_b, up_b = _split_fc1(a_list[e], b_list[e])
                out[f"{head}.{e}.gate_proj.lora_A.weight"] = a
                out[f"{head}.{e}.gate_proj.lora_B.weight"] = gate_b
                out[f"{head}.{e}.up_proj.lora_A.weight"] = a
                out[f"{head}.{e}.up_proj.lora_B.weight"] = up_b
            else:
                out[f"{head}.{e}.down_proj.lora_A.weight"] = a_list[e]
                out[f"{head}.{e}.down_proj.lora_B.weight"] = b_list[e]
    return out


def per_expert_to_peft_experts(
    named: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    *,
    num_experts: int,
    target_parameters: Sequence[str],
    fused_layout: str,
) -> dict[str, torch.Tensor]:
    """Inverse of :func:`peft_experts_to_per_expert`. gate and up ``lora_A`` of an expert must be equal
    (one fc1 adapter); a per-expert adapter with independent gate/up ``A`` has no fused rank-r form."""
    items = named.items() if isinstance(named, Mapping) else named
    suffix_of = expert_wrapper_suffixes(target_parameters)
    out: dict[str, torch.Tensor] = {}
    per: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name, t in items:
        m = _PER_EXPERT_RE.match(name)
        if not m:
            out[name] = t
            continue
        slot = per.setdefault(m["head"], {}).setdefault(int(m["e"]), {})
        key = f"{m['proj']}.{m['ab']}"
        if key in slot:
            raise LayoutError(f"duplicate name {name}")
        slot[key] = t
    need = {"gate_proj.A", "gate_proj.B", "up_proj.A", "up_proj.B", "down_proj.A", "down_proj.B"}
    for head, experts in per.items():
        if sorted(experts) != list(range(num_experts)):
            raise LayoutError(f"{head}: experts {sorted(experts)} != 0..{num_experts - 1}")
        has_fc1 = GATE_UP in suffix_of
        has_fc2 = DOWN in suffix_of
        want = {k for k in need if (k.startswith("down") and has_fc2) or (not k.startswith("down") and has_fc1)}
        fc1_a, fc1_b, fc2_a, fc2_b = [], [], [], []
        for e in range(num_experts):
            got = experts[e]
            if set(got) != want:
                raise LayoutError(f"{head}.{e}: tensors {sorted(got)} != expected {sorted(want)}")
            if has_fc1:
                if not torch.equal(got["gate_proj.A"], got["up_proj.A"]):
                    raise LayoutError(
                        f"{head}.{e}: gate_proj and up_proj lora_A differ; a fused gate_up adapter needs one A"
                    )
                fc1_a.append(got["gate_proj.A"])
                fc1_b.append(torch.cat([got["gate_proj.B"], got["up_proj.B"]], 0))
            if has_fc2:
                fc2_a.append(got["down_proj.A"])
                fc2_b.append(got["down_proj.B"])
        for param, a_list, b_list in ((GATE_UP, fc1_a, fc1_b), (DOWN, fc2_a, fc2_b)):
            if param not in suffix_of:
                continue
            a, b = experts_to_fused(a_list, b_list, fused_layout)
            out[f"{head}{suffix_of[param]}.lora_A.weight"] = a
            out[f"{head}{suffix_of[param]}.lora_B.weight"] = b
    return out


# ---------------------------------------------------------------------------------------------------------------
# whole-adapter conversions between the named layouts


def peft_to_bridge(
    sd: Mapping[str, torch.Tensor], *, num_experts: int, target_parameters: Sequence[str], fused_layout: str
) -> dict[str, torch.Tensor]:
    """PEFT state dict -> Megatron-Bridge ``export_adapter_weights`` names (per-expert, no PEFT prefix)."""
    per = peft_experts_to_per_expert(
        sd, num_experts=num_experts, target_parameters=target_parameters, fused_layout=fused_layout
    )
    return {_strip_prefix(k): v for k, v in per.items()}


def bridge_to_peft(
    named: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    *,
    num_experts: int,
    target_parameters: Sequence[str],
    fused_layout: str,
) -> dict[str, torch.Tensor]:
    """Megatron-Bridge export (a dict or the ``(name, tensor)`` stream) -> PEFT state dict."""
    items = named.items() if isinstance(named, Mapping) else named
    prefixed = ((PEFT_PREFIX + k, v) for k, v in items)
    return per_expert_to_peft_experts(
        prefixed, num_experts=num_experts, target_parameters=target_parameters, fused_layout=fused_layout
    )


def bridge_to_vllm(named: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Megatron-Bridge export -> vLLM per-expert names (adds the PEFT prefix vLLM's loader expects)."""
    items = named.items() if isinstance(named, Mapping) else named
    return {PEFT_PREFIX + k: v for k, v in items}


def vllm_to_bridge(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {_strip_prefix(k): v for k, v in sd.items()}


def peft_to_vllm(
    sd: Mapping[str, torch.Tensor], *, num_experts: int, target_parameters: Sequence[str], fused_layout: str
) -> dict[str, torch.Tensor]:
    """PEFT state dict -> vLLM per-expert indexed names (``...mlp.experts.{e}.{gate,up,down}_proj.lora_{A,B}``)."""
    return peft_experts_to_per_expert(
        sd, num_experts=num_experts, target_parameters=target_parameters, fused_layout=fused_layout
    )


def vllm_to_peft(
    sd: Mapping[str, torch.Tensor], *, num_experts: int, target_parameters: Sequence[str], fused_layout: str
) -> dict[str, torch.Tensor]:
    return per_expert_to_peft_experts(
        sd, num_experts=num_experts, target_parameters=target_parameters, fused_layout=fused_layout
    )


def peft_to_vllm3d(
    sd: Mapping[str, torch.Tensor], *, num_experts: int, target_parameters: Sequence[str], fused_layout: str
) -> dict[str, torch.Tensor]:
    """PEFT state dict -> vLLM 3D MoE layout: gate_up under ``experts.base_layer``, down under ``experts``,
    fused tensors in :data:`STANDARD` orientation. Needs both routed projections targeted (vLLM requires both)."""
    suffix_of = expert_wrapper_suffixes(target_parameters)
    if set(suffix_of) != set(ROUTED_PARAMS):
        raise LayoutError(f"vLLM's 3D MoE LoRA needs both {list(ROUTED_PARAMS)} targeted, got {list(suffix_of)}")
    vllm_suffix = {GATE_UP: ".base_layer", DOWN: ""}
    return _renest_experts(sd, suffix_of, vllm_suffix, num_experts, fused_layout, STANDARD)


def vllm3d_to_peft(
    sd: Mapping[str, torch.Tensor], *, num_experts: int, target_parameters: Sequence[str], fused_layout: str
) -> dict[str, torch.Tensor]:
    suffix_of = expert_wrapper_suffixes(target_parameters)
    vllm_suffix = {GATE_UP: ".base_layer", DOWN: ""}
    return _renest_experts(sd, vllm_suffix, suffix_of, num_experts, STANDARD, fused_layout)


def _renest_experts(sd, src_suffix, dst_suffix, num_experts, src_layout, dst_layout) -> dict[str, torch.Tensor]:
    """Re-nest (wrapper depth) and re-orient the fused expert pairs; other keys pass through."""
    param_of = {v: k for k, v in src_suffix.items()}
    out: dict[str, torch.Tensor] = {}
    pairs: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for name, t in sd.items():
        m = _EXPERTS_RE.match(name)
        if not m:
            out[name] = t
            continue
        if m["wrap"] not in param_of:
            raise LayoutError(f"{name}: wrapper depth {m['wrap']!r} matches no target parameter")
        pairs.setdefault((m["head"], param_of[m["wrap"]]), {})[m["ab"]] = t
    for (head, param), ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise LayoutError(f"{head} {param}: need lora_A and lora_B, got {sorted(ab)}")
        a, b = convert_fused(ab["A"], ab["B"], num_experts, src_layout, dst_layout)
        out[f"{head}{dst_suffix[param]}.lora_A.weight"] = a
        out[f"{head}{dst_suffix[param]}.lora_B.weight"] = b
    return out


def expert_deltas(
    sd: Mapping[str, torch.Tensor], *, num_experts: int, target_parameters: Sequence[str], fused_layout: str
) -> dict[tuple[str, str], torch.Tensor]:
    """Unscaled ``B_e @ A_e`` per (experts module, parameter), stacked [E, out, in] in the HF weight's orientation.
    For checking a layout numerically against PEFT's own ``get_delta_weight``."""
    suffix_of = expert_wrapper_suffixes(target_parameters)
    param_of = {v: k for k, v in suffix_of.items()}
    pairs: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for name, t in sd.items():
        m = _EXPERTS_RE.match(name)
        if m and m["wrap"] in param_of:
            pairs.setdefault((m["head"], param_of[m["wrap"]]), {})[m["ab"]] = t
    out = {}
    for key, ab in pairs.items():
        a_list, b_list = fused_to_experts(ab["A"], ab["B"], num_experts, fused_layout)
        out[key] = torch.stack([b @ a for a, b in zip(a_list, b_list, strict=True)])
    return out
