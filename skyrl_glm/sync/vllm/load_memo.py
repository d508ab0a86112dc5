"""Loading an adapter version like the last without the loader's per-name work: its ``LoRAModel`` cloned.

SkyRL's in-memory loader builds each version's ``LoRAModel`` as a directory load would: the config validated, every
name checked against the model's modules and parsed, a ``LoRALayerWeights`` made per module. The versions of one run
have one structure (the same names, shapes, strides, dtypes and aliasing, the same config), so the first load of a
structure runs that loader and, if every factor of the ``LoRAModel`` it returns is one of the staged tensors itself
(nothing copied or converted: the staged tensors are on the device in the LoRA dtype), records which one. A later
version of that structure gets a ``LoRAModel`` like it whose factors are its own staged tensors in those places; vLLM
then adds and activates it as ever (its packing of fused modules runs on the clone as on a fresh build). A structure
whose model holds anything else (a converted factor, a full module to save) keeps the loader for the engine's life.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

_STATE = "_skyrl_glm_load_memo"  # on a WorkerLoRAManager: its LoadMemo
_CLONE_OF = "_skyrl_glm_clone_of"  # on a cloned LoRAModel: (its Template, is_3d), read by clone_of
Where = str | list[str | None] | None  # a factor's staged name, or per entry of a packed factor


def kinds_with_aliasing(tensors: Iterable[torch.Tensor | None]) -> tuple[Any, ...]:
    """Per tensor its shape, strides, dtype, device and the first position holding the same tensor (None stays):
    what a structure of tensors is, values aside (here and in :mod:`~skyrl_glm.sync.vllm.slot_replay`)."""
    first: dict[int, int] = {}
    return tuple(
        None if t is None else (t.shape, t.stride(), t.dtype, t.device, first.setdefault(id(t), i))
        for i, t in enumerate(tensors)
    )


def structure(tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a clone depends on: the config, the staged names and their tensors' :func:`kinds_with_aliasing`."""
    return (json.dumps(config, sort_keys=True, default=str), tuple(tensors), kinds_with_aliasing(tensors.values()))


# staged name -> (id of its staged tensors' dict, the structure the receiver vouches for): see note_structure
_NOTED: dict[str, tuple[int, Any]] = {}
VOUCHED = "vouched"  # the mark of a key the receiver's note gave


def _staged(name: str) -> Any:
    """SkyRL's staged adapter of that name (its tensors are a dict of its own: ``stage_in_memory_adapter`` copies
    the mapping it is given), or None."""
    from skyrl.backends.skyrl_train.patches.vllm import patch_lora_in_memory as skyrl_loader

    return skyrl_loader._STAGED.get(name)


def note_structure(name: str, vouched: Any) -> None:
    """The receiver's word on the structure of the adapter just staged under ``name`` (its manifest's layout
    identity and the engine layout: :attr:`~skyrl_glm.sync.receiver.ReceivedAdapter.structure`), which the load
    keys its templates by instead of reading every staged tensor's kind (about 1.5 us a tensor). Kept for the
    tensors staged now only, until loaded or :func:`forget_structure`."""
    staged = _staged(name)
    if staged is not None:
        _NOTED[name] = (id(staged.tensors), vouched)


def forget_structure(name: str) -> None:
    _NOTED.pop(name, None)


def structure_key(name: str, tensors: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> tuple[Any, ...]:
    """The load's key for a staged adapter: the config and the structure the receiver noted for these tensors, else
    :func:`structure` (the two kinds of key never equal: the first holds the "vouched" mark)."""
    noted = _NOTED.pop(name, None)
    if noted is not None and noted[0] == id(tensors):
        return (json.dumps(config, sort_keys=True, default=str), VOUCHED, noted[1])
    return structure(tensors, config)


def _copied(obj: Any) -> Any:
    """A shallow copy of a plain object (its class, its attribute dict copied): what ``copy.copy`` makes, without
    its reduce protocol (a few microseconds a module, about 900 modules at GLM-5.3's depth, on every clone)."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    return new


def clone_of(lora: Any) -> tuple[Any, bool] | None:
    """The template and 3D flag a ``LoRAModel`` was cloned from, or None (built by the loader). Clones of one
    template with one flag have one structure (the template's key holds every factor's kind): the slot replay keys
    its recordings by it instead of reading every factor again."""
    return lora.__dict__.get(_CLONE_OF)


@dataclass(eq=False)  # compared and hashed by identity: a recording's key holds the template
class Template:
    """A built ``LoRAModel`` with its factors taken out: per module its weights object (copied, no tensors) and,
    per side, the staged name each factor was."""

    model: Any
    modules: dict[str, tuple[Any, Where, Where]]

    @classmethod
    def of(cls, lora: Any, tensors: Mapping[str, torch.Tensor]) -> Template | None:
        """``lora``'s template, or None if a factor is not a staged tensor or it holds more than LoRA factors."""
        if getattr(lora, "modules_to_save", None):
            return None
        names = {id(t): n for n, t in reversed(list(tensors.items()))}

        def where(value: Any) -> Where | bool:
            if value is None:
                return None
            if isinstance(value, list):
                entries = [where(v) for v in value]
                return False if any(e is False for e in entries) else entries  # type: ignore[return-value]
            return names.get(id(value), False)

        modules = {}
        for module_name, weights in lora.loras.items():
            a, b = where(weights.lora_a), where(weights.lora_b)
            if a is False or b is False:
                return None
            empty = _copied(weights)
            empty.lora_a = empty.lora_b = None
            modules[module_name] = (empty, a, b)
        model = _copied(lora)
        model.loras = {}
        return cls(model, modules)  # type: ignore[arg-type]

    def clone(self, lora_id: int, tensors: Mapping[str, torch.Tensor], is_3d: bool) -> Any:
        def factor(where: Where) -> Any:
            if isinstance(where, list):
                return [None if w is None else tensors[w] for w in where]
            return None if where is None else tensors[where]

        model = _copied(self.model)
        model.id, model.is_3d_lora_weight, model.loras = lora_id, is_3d, {}
        model.__dict__[_CLONE_OF] = (self, is_3d)
        for module_name, (empty, a, b) in self.modules.items():
            weights = _copied(empty)
            weights.lora_a, weights.lora_b = factor(a), factor(b)
            model.loras[module_name] = weights
        return model


@dataclass
class LoadMemo:
    """One worker manager's templates by structure (None: that structure keeps the loader) and counts: loads by
    the loader, by a clone, structures refused a template, and loads keyed by the receiver's note."""

    templates: dict[tuple[Any, ...], Template | None] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: {"loaded": 0, "cloned": 0, "refused": 0, "vouched": 0})


def state(manager: Any) -> LoadMemo:
    memo = manager.__dict__.get(_STATE)
    if memo is None:
        memo = manager.__dict__[_STATE] = LoadMemo()
    return memo


def install() -> None:
    """Wrap the worker manager's ``_load_adapter`` (SkyRL's in-memory loader; once per process, after SkyRL's
    patch: the vLLM plugin calls it)."""
    from skyrl.backends.skyrl_train.weight_sync.lora_target import lora_name_from_in_memory_path
    from vllm.lora.worker_manager import WorkerLoRAManager

    original = WorkerLoRAManager._load_adapter
    if original.__module__ == __name__:
        return

    def _load_adapter(self: Any, lora_request: Any) -> Any:
        name = lora_name_from_in_memory_path(lora_request.lora_path)
        staged = _staged(name) if name is not None else None
        if staged is None:
            return original(self, lora_request)
        memo = state(self)
        key = structure_key(name, staged.tensors, staged.peft_config)
        memo.counts["vouched"] += key[1] == VOUCHED
        if key in memo.templates:
            template = memo.templates[key]
            if template is not None:
                memo.counts["cloned"] += 1
                return template.clone(lora_request.lora_int_id, staged.tensors, lora_request.is_3d_lora_weight)
        lora = original(self, lora_request)
        memo.counts["loaded"] += 1
        if key not in memo.templates:
            template = memo.templates[key] = Template.of(lora, staged.tensors)
            memo.counts["refused"] += template is None
            if template is not None:  # its factors are the staged tensors in the template's places: a clone's
                lora.__dict__[_CLONE_OF] = (template, lora_request.is_3d_lora_weight)
        return lora

    WorkerLoRAManager._load_adapter = _load_adapter
