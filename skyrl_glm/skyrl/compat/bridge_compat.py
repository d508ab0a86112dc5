"""The two Megatron-Bridge functions SkyRL 0.4.0's Megatron model wrapper imports that no Bridge release has.

SkyRL installs Megatron-Bridge from its repository at a pinned revision, where shared expert adapters have their
gradients summed over expert parallelism once per optimizer step, inside Megatron's end-of-step gradient sync
(``finalize_model_grads``). Released Bridge (0.6.2, the newest on the package index) sums them instead in backward
hooks it registers on every shared expert adapter as it builds the model. The wrapper imports, at module level:

- ``enable_expert_parallel_grad_sync_in_finalize(model)``: on the pinned revision, drops those hooks so the sum
  happens once, in the sync. Here the hooks stay, and they are the sum: each micro-batch's gradient is summed over
  the expert-parallel group before it is accumulated, which is the same total. They see every gradient only when
  Transformer Engine does not accumulate weight gradients in place (``gradient_accumulation_fusion``, off in
  SkyRL's Megatron defaults), so a model that turns it on with expert parallelism > 1 is refused here.
- ``finalize_model_grads_with_expert_adapter_sync(model, num_tokens)``: megatron-core's ``finalize_model_grads``,
  plus the expert sum on the pinned revision; here the sum already happened, so megatron-core's alone.

With expert parallelism 1 (one GPU, or data parallelism only) both are exactly megatron-core's behaviour.
:func:`install` adds them to ``megatron.bridge.peft.utils`` when that module is imported (never importing it
itself: Bridge needs CUDA), and only where the installed Bridge lacks them; an installed Bridge that has them wins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from skyrl_glm.skyrl.compat.after_import import after_import

BRIDGE_PEFT_UTILS = "megatron.bridge.peft.utils"


def enable_expert_parallel_grad_sync_in_finalize(model: list[Any]) -> None:
    """Keep released Bridge's per-backward expert sums; refuse the one setting under which they miss gradients."""
    from megatron.core.utils import get_model_config

    for chunk in model:
        config = get_model_config(chunk)
        if config.gradient_accumulation_fusion and (config.expert_model_parallel_size or 1) > 1:
            raise RuntimeError(
                "megatron-bridge as released sums shared expert adapter gradients in backward hooks, which "
                "gradient_accumulation_fusion bypasses: with expert_model_parallel_size > 1 set "
                "gradient_accumulation_fusion=false, or install Megatron-Bridge at the revision SkyRL pins"
            )


def finalize_model_grads_with_expert_adapter_sync(model: list[Any], num_tokens: Any = None) -> None:
    """Megatron-core's end-of-step gradient sync (the expert sums ran in backward)."""
    from megatron.core.distributed import finalize_model_grads

    finalize_model_grads(model, num_tokens)


# name -> function, supplied to ``megatron.bridge.peft.utils`` where it lacks the name
SUPPLIED: dict[str, Callable[..., None]] = {
    "enable_expert_parallel_grad_sync_in_finalize": enable_expert_parallel_grad_sync_in_finalize,
    "finalize_model_grads_with_expert_adapter_sync": finalize_model_grads_with_expert_adapter_sync,
}


def _supply(module: Any) -> None:
    for name, function in SUPPLIED.items():
        if not hasattr(module, name):
            setattr(module, name, function)


def install() -> None:
    """Supply the missing names when ``megatron.bridge.peft.utils`` is imported (now, if it already is)."""
    after_import(BRIDGE_PEFT_UTILS, _supply)
