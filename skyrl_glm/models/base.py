"""What a model adapter tells skyrl-glm: facts, LoRA targets per side, and how to make a tiny copy."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from skyrl_glm.usage import UsageError

# Sampler backends a target policy knows about.
SAMPLER_BACKENDS = ("vllm", "vllm-cpu")


class UnsupportedTargetError(UsageError):
    """A LoRA target the chosen sampler would not apply (training it would diverge silently)."""


@dataclass(frozen=True)
class LoraTarget:
    """One LoRA-able module, named on every side of the handoff.

    ``unsupported`` maps a sampler backend to the reason it does not apply a LoRA on this module.
    """

    hf: str
    megatron: str | None
    kind: str  # attention | dense_mlp | shared_expert | routed_expert | indexer
    default: bool = True
    unsupported: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LoraPolicy:
    """The LoRA targets of a model family and the rules for choosing among them."""

    targets: tuple[LoraTarget, ...]
    # Megatron-Bridge LoRA settings SkyRL's config does not expose.
    megatron_lora_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def target(self, hf_name: str) -> LoraTarget:
        for t in self.targets:
            if t.hf == hf_name:
                return t
        raise UnsupportedTargetError(
            f"{hf_name!r} is not a LoRA target of this model; known: {[t.hf for t in self.targets]}"
        )

    def resolve(
        self,
        requested: Sequence[str] | None = None,
        *,
        sampler: str = "vllm",
        allow_unsupported: bool = False,
    ) -> list[str]:
        """HF/PEFT module names to train.

        Without ``requested``: the default targets this sampler applies (a default it cannot apply, such as
        routed experts on vLLM's CPU build, is left out). With ``requested``: exactly those, and asking for a
        target the sampler does not apply is an error naming the module and why (unless ``allow_unsupported``).
        """
        if not requested:
            return [t.hf for t in self.targets if t.default and sampler not in t.unsupported]
        chosen = [self.target(n) for n in requested]
        if not allow_unsupported:
            bad = [(t.hf, t.unsupported[sampler]) for t in chosen if sampler in t.unsupported]
            if bad:
                lines = "; ".join(f"{name}: {why}" for name, why in bad)
                raise UnsupportedTargetError(f"sampler {sampler!r} does not apply LoRA on {lines}")
        return [t.hf for t in chosen]

    def megatron_targets(self, hf_names: Sequence[str]) -> list[str]:
        """Megatron module names for these HF targets (deduplicated, order kept)."""
        out: list[str] = []
        for name in hf_names:
            meg = self.target(name).megatron
            if meg is not None and meg not in out:
                out.append(meg)
        return out


@dataclass(frozen=True)
class ModelFamily:
    """A model adapter. ``tiny_config`` builds a small random-weight config of the same architecture;
    ``prepare_for_sampler`` (optional) returns kwargs that let a given sampler backend serve a checkpoint."""

    name: str
    hf_model_type: str
    summary: str
    facts: Mapping[str, Any]
    lora: LoraPolicy
    tiny_config: Callable[[], Any]
    tiny_vocab_size: int = 512
    model_class: Callable[[Any], Any] | None = None  # default: AutoModelForCausalLM.from_config

    def build_model(self, config: Any) -> Any:
        if self.model_class is not None:
            return self.model_class(config)
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_config(config, dtype="float32")

    def key_facts(self) -> str:
        keys = ("total_params", "active_params", "num_hidden_layers", "hidden_size", "n_routed_experts")
        return ", ".join(f"{k}={self.facts[k]}" for k in keys if k in self.facts)
