"""What a model adapter tells skyrl-glm: facts, LoRA targets per side, configs, and how a sampler serves it.

One record per fact: a :class:`LoraTarget` holds everything about one LoRA-able module (its HF, Megatron and vLLM
names, the pattern of the tensor names it is exported under, its shape in a config, the vLLM tensor-parallel style
of its base layer, which samplers ignore it); a :class:`ModelFamily` holds
everything about one architecture (facts, full and tiny configs, vLLM CPU dtype, sampler config overrides).
Importing this module imports no torch or transformers.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from skyrl_glm.usage import UsageError

log = logging.getLogger(__name__)

# How vLLM 0.32 splits a LoRA target's tensors over tensor-parallel ranks (its base layer's parallel style;
# read from vllm/lora/layers/{column,row}_parallel_linear.py, fused_moe.py and the GLM/DeepSeek model files).
REPLICATED = "replicated"  # ReplicatedLinear, or a parallel linear built with disable_tp=True: A and B whole
COLUMN = "column"  # Column/MergedColumn/QKV(q) ParallelLinear: A whole, B split on dim 0
ROW = "row"  # RowParallelLinear: A split on dim 1, B whole
QKV_KV = "qkv_kv"  # k / v of a QKVParallelLinear: like COLUMN over min(tp, num_kv_heads) head groups
EXPERT_COLUMN = "expert_column"  # routed experts' w1/w3 (gate/up) under FusedMoEWithLoRA: like COLUMN
EXPERT_ROW = "expert_row"  # routed experts' w2 (down): like ROW
TP_STYLES = (REPLICATED, COLUMN, ROW, QKV_KV, EXPERT_COLUMN, EXPERT_ROW)

# The sampler backends a target can be unsupported on (``models.vllm_targets.sampler_backend`` names them):
# vLLM's GPU or CPU build, stock or with SkyRL 0.4's worker wrap and its MLA patch in effect.
SAMPLER_BACKENDS = ("vllm", "vllm-cpu", "vllm+skyrl", "vllm-cpu+skyrl")


class UnsupportedTargetError(UsageError):
    """A LoRA target the chosen sampler would not apply (training it would diverge silently)."""


# Placeholders of a module-name pattern (:attr:`LoraTarget.modules`).
LAYER, EXPERT = "{layer}", "{expert}"


@dataclass(frozen=True)
class LoraTarget:
    """One LoRA-able module, named on every side of the handoff.

    ``hf``: the PEFT target, written with its parent (``self_attn.q_a_proj``); ``megatron``: the Megatron-Core
    module (``linear_q_down_proj``); ``vllm``: the vLLM module that carries its LoRA (fused layers share one, e.g.
    ``gate_up_proj``); ``tp_style``: how vLLM shards it over TP ranks (one of :data:`TP_STYLES`).
    ``unsupported`` maps a sampler backend to the reason it does not apply a LoRA on this module.
    ``modules``: the HF module names its LoRA tensors are exported and served under, as patterns with ``{layer}``
    (and ``{expert}`` for a routed expert); several when one target is exported as several modules (the routed
    experts' fused ``gate_up_proj`` as ``gate_proj`` and ``up_proj``, one ``lora_A`` under both); default
    ``model.layers.{layer}.<hf>``. Both directions (a layer to its names, a name to its target) and the Megatron
    fused groups (:meth:`LoraPolicy.with_fused_peers`) derive from it. ``shape(config)``: ``(in, out)`` features
    of each of those modules in a config, None where that config has no such module.
    """

    hf: str
    megatron: str | None
    kind: str  # attention | dense_mlp | shared_expert | routed_expert | indexer
    default: bool = True
    unsupported: Mapping[str, str] = field(default_factory=dict)
    vllm: str | None = None
    tp_style: str | None = None
    modules: tuple[str, ...] = ()
    shape: Callable[[Any], tuple[int, int] | None] | None = None

    def __post_init__(self) -> None:
        if self.tp_style is not None and self.tp_style not in TP_STYLES:
            raise ValueError(f"{self.hf}: tp_style {self.tp_style!r} is not one of {TP_STYLES}")
        if unknown := sorted(set(self.unsupported) - set(SAMPLER_BACKENDS)):
            raise ValueError(f"{self.hf}: unsupported names unknown sampler backends {unknown}")
        if not self.modules:
            object.__setattr__(self, "modules", (f"model.layers.{LAYER}.{self.hf}",))
        routed = self.kind == "routed_expert"
        for pattern in self.modules:
            if LAYER not in pattern or (EXPERT in pattern) != routed:
                need = f"{LAYER} and {EXPERT}" if routed else f"{LAYER} and no {EXPERT}"
                raise ValueError(f"{self.hf}: module pattern {pattern!r} must hold {need}")
            if "{" in pattern.rsplit(".", 1)[-1]:
                raise ValueError(f"{self.hf}: module pattern {pattern!r} must end in a plain module name")

    def module_names(self, layer: int, expert: int | None = None) -> tuple[str, ...]:
        """The HF module names of this target in one layer (and, for a routed expert, one expert)."""
        return tuple(p.format(layer=layer, expert=expert) for p in self.modules)

    def module_regexes(self) -> tuple[re.Pattern[str], ...]:
        """:attr:`modules` as regexes (groups ``layer``, ``expert``) matching a module name after any prefix
        (PEFT's ``base_model.model.``)."""
        out = []
        for pattern in self.modules:
            body = re.escape(pattern).replace(re.escape(LAYER), r"(?P<layer>\d+)")
            out.append(re.compile(r"(?:.+\.)?" + body.replace(re.escape(EXPERT), r"(?P<expert>\d+)")))
        return tuple(out)


def _suffix_match(qualified: str, short: str) -> bool:
    return qualified == short or qualified.endswith("." + short)


@dataclass(frozen=True)
class LoraPolicy:
    """The LoRA targets of a model family and the rules for choosing among them."""

    targets: tuple[LoraTarget, ...]
    # Megatron-Bridge LoRA settings SkyRL's config does not expose.
    megatron_lora_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def target(self, hf_name: str) -> LoraTarget:
        """The record of one qualified HF target name."""
        for t in self.targets:
            if t.hf == hf_name:
                return t
        raise UnsupportedTargetError(
            f"{hf_name!r} is not a LoRA target of this model; known: {[t.hf for t in self.targets]}"
        )

    def match(self, name: str) -> list[LoraTarget]:
        """Every target a name as users write it means: a qualified HF name (``self_attn.q_a_proj``), a PEFT-style
        short name matched as a dotted suffix (``q_a_proj``; ``gate_proj`` means the dense MLP's, the shared
        expert's and the routed experts' gate), or a Megatron module name (``linear_fc1``). Unknown: an error."""
        name = name.strip()
        if not name:
            raise UnsupportedTargetError("an empty LoRA target name")
        exact = [t for t in self.targets if t.hf == name]
        if exact:
            return exact
        found = [t for t in self.targets if t.megatron == name or _suffix_match(t.hf, name)]
        if not found:
            raise UnsupportedTargetError(
                f"{name!r} is not a LoRA target of this model (HF, PEFT short or Megatron name); "
                f"known: {[t.hf for t in self.targets]}"
            )
        return found

    def expand(self, names: Sequence[str]) -> list[str]:
        """Qualified HF names for ``names`` as users write them (order kept, no repeats). A name that means
        several targets expands to all of them, and says so in the log."""
        out: list[str] = []
        for name in names:
            found = self.match(name)
            if len(found) > 1 or found[0].hf != name.strip():
                log.info("LoRA target %r means %s", name, ", ".join(t.hf for t in found))
            out += [t.hf for t in found if t.hf not in out]
        return out

    def resolve(
        self,
        requested: Sequence[str] | None = None,
        *,
        sampler: str = "vllm",
        allow_unsupported: bool = False,
    ) -> list[str]:
        """Qualified HF/PEFT target names to train.

        Without ``requested``: the default targets this sampler applies (a default it cannot apply, such as
        routed experts on vLLM's CPU build, is left out). With ``requested`` (names as users write them, see
        :meth:`match`; an empty list is an error): exactly those, and asking for a
        target the sampler does not apply is an error naming the module and why (unless ``allow_unsupported``).
        """
        if sampler not in SAMPLER_BACKENDS:
            raise UsageError(f"unknown sampler backend {sampler!r} (one of {', '.join(SAMPLER_BACKENDS)})")
        if requested is None:
            return [t.hf for t in self.targets if t.default and sampler not in t.unsupported]
        if not requested:
            raise UnsupportedTargetError("no LoRA targets given")
        chosen = [self.target(n) for n in self.expand(requested)]
        if not allow_unsupported:
            bad = [(t.hf, t.unsupported[sampler]) for t in chosen if sampler in t.unsupported]
            if bad:
                lines = "; ".join(f"{name}: {why}" for name, why in bad)
                raise UnsupportedTargetError(f"sampler {sampler!r} does not apply LoRA on {lines}")
        return [t.hf for t in chosen]

    def with_fused_peers(self, hf_names: Sequence[str]) -> list[LoraTarget]:
        """The records of these targets plus every target fused with one of them in Megatron (same kind and
        Megatron module: q/k/v in ``linear_qkv``, gate/up in ``linear_fc1``), which is adapted as a whole."""
        chosen = [self.target(n) for n in hf_names]
        fused = {(t.kind, t.megatron) for t in chosen if t.megatron is not None}
        return chosen + [t for t in self.targets if (t.kind, t.megatron) in fused and t not in chosen]

    def fused_owner(self, target: LoraTarget) -> LoraTarget:
        """The first target of ``target``'s Megatron module: its one ``linear_in`` is every member's ``lora_A``."""
        if target.megatron is None:
            return target
        return next(t for t in self.targets if (t.kind, t.megatron) == (target.kind, target.megatron))

    def vllm_modules(self, hf_names: Sequence[str]) -> list[str]:
        """vLLM ``lora_target_modules`` for these HF targets (deduplicated, order kept)."""
        out: list[str] = []
        for name in hf_names:
            module = self.target(name).vllm
            if module is None:
                raise UnsupportedTargetError(f"{name!r} has no vLLM LoRA module")
            if module not in out:
                out.append(module)
        return out

    def megatron_targets(self, hf_names: Sequence[str]) -> list[str]:
        """Megatron module names for these HF targets (deduplicated, order kept)."""
        out: list[str] = []
        for name in hf_names:
            meg = self.target(name).megatron
            if meg is not None and meg not in out:
                out.append(meg)
        return out


def missing_fields(config: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``wanted`` that ``config`` lacks or sets to another value."""
    return {k: v for k, v in wanted.items() if config.get(k) != v}


@dataclass(frozen=True)
class ModelFamily:
    """A model adapter.

    ``tiny_config`` builds a small random-weight config of the same architecture, ``full_config`` the published
    one (None: only facts are known). ``vllm_cpu_dtype``: the dtype vLLM's CPU build serves it in (None: no CPU
    serving path). ``sampler_overrides(model_dir, device=, max_model_len=)`` (optional) returns extra vLLM engine
    kwargs a checkpoint needs on that device (``hf_overrides``, ``max_model_len``, ``limit_mm_per_prompt``).
    ``vllm_architecture``: the model class vLLM serves it as (an older vLLM without it is refused in one line).
    ``hf_auto_class``: the transformers auto class that loads its checkpoints; ``lora_exclude``: a regex of modules
    no adapter touches (PEFT's ``exclude_modules``: a vision tower whose MLP names match the text targets).
    ``checkpoint_defaults``: config fields published checkpoints carry and transformers' config class may not write,
    with the value transformers' modeling code hard-codes; vLLM and Megatron-Bridge read them from the config, so a
    checkpoint without them gets them (:meth:`missing_defaults`, :meth:`supply_defaults`).
    """

    name: str
    hf_model_type: str
    summary: str
    facts: Mapping[str, Any]
    lora: LoraPolicy
    tiny_config: Callable[[], Any]
    full_config: Callable[[], Any] | None = None
    vllm_cpu_dtype: str | None = None
    sampler_overrides: Callable[..., dict[str, Any]] | None = None
    tiny_vocab_size: int = 512
    model_class: Callable[[Any], Any] | None = None  # default: AutoModelForCausalLM.from_config
    vllm_architecture: str | None = None
    hf_auto_class: str = "AutoModelForCausalLM"
    lora_exclude: str | None = None
    checkpoint_defaults: Mapping[str, Any] = field(default_factory=dict)

    def config(self, which: str) -> Any:
        """The ``"tiny"`` or ``"full"`` config; a family without a full config says so."""
        if which == "tiny":
            return self.tiny_config()
        if which != "full":
            raise ValueError(f"config must be 'tiny' or 'full', got {which!r}")
        if self.full_config is None:
            raise UsageError(f"model family {self.name!r} has no full-size config; use --tiny for its tiny one")
        return self.full_config()

    def missing_defaults(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The :attr:`checkpoint_defaults` a ``config.json`` (as read) lacks or sets otherwise."""
        return missing_fields(config, self.checkpoint_defaults)

    def supply_defaults(self) -> None:
        """Make :attr:`checkpoint_defaults` the class-level values of transformers' config class for this
        architecture, in this process: a checkpoint's own value (an instance attribute) still wins, and a
        checkpoint without the field reads the value transformers' modeling uses instead of failing inside a
        reader that expects it (Megatron-Bridge's GLM-5 bridge reads ``indexer_rope_interleave`` bare)."""
        if not self.checkpoint_defaults:
            return
        from transformers import CONFIG_MAPPING

        config_class = CONFIG_MAPPING[self.hf_model_type]
        for name, value in self.checkpoint_defaults.items():
            if name not in vars(config_class):
                setattr(config_class, name, value)

    def build_model(self, config: Any) -> Any:
        if self.model_class is not None:
            return self.model_class(config)
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_config(config, dtype="float32")

    def load_pretrained(self, model_dir: str, dtype: Any) -> Any:
        """The checkpoint in ``model_dir`` as transformers loads this architecture (:attr:`hf_auto_class`)."""
        import transformers

        return getattr(transformers, self.hf_auto_class).from_pretrained(model_dir, dtype=dtype)

    def key_facts(self) -> str:
        keys = ("total_params", "active_params", "num_hidden_layers", "hidden_size", "n_routed_experts")
        return ", ".join(f"{k}={self.facts[k]}" for k in keys if k in self.facts)
