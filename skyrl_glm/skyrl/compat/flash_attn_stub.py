"""A pure-torch stand-in for ``flash_attn.bert_padding``, put in place only where flash-attn is not installed.

SkyRL 0.4.0's ``workers/model_wrapper.py:13`` imports ``pad_input`` and ``unpad_input`` from
``flash_attn.bert_padding`` at module level, even with ``trainer.flash_attn=false``; without flash-attn (CPU
mode, or a GPU stack with no flash-attn wheel for its torch, e.g. torch 2.13) every policy worker would fail to
import. With ``trainer.flash_attn=false`` and ``trainer.remove_microbatch_padding=false`` SkyRL calls neither, so
the stand-in only has to import and be right (``tests/test_flash_attn_stub.py``). Recorded in ``seams.py``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def unpad_input(
    hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """flash-attn's ``bert_padding.unpad_input`` in plain torch: keep the tokens the mask selects."""
    import torch
    import torch.nn.functional as F

    mask = attention_mask if unused_mask is None else attention_mask + unused_mask
    seqlens = mask.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return flat[indices], indices, cu_seqlens, int(seqlens.max().item()), used


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """flash-attn's ``bert_padding.pad_input`` in plain torch: scatter tokens back into a padded batch."""
    import torch

    out = torch.zeros(batch * seqlen, *hidden_states.shape[1:], dtype=hidden_states.dtype, device=hidden_states.device)
    out[indices] = hidden_states
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])


def provide_bert_padding() -> bool:
    """Put the stand-in in ``sys.modules`` unless flash-attn is installed (or already imported); whether it did."""
    if "flash_attn" in sys.modules or importlib.util.find_spec("flash_attn") is not None:
        return False
    package = types.ModuleType("flash_attn")
    package.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None, is_package=True)
    package.__path__ = []
    padding = types.ModuleType("flash_attn.bert_padding")
    padding.__spec__ = importlib.machinery.ModuleSpec("flash_attn.bert_padding", None)
    padding.pad_input = pad_input  # type: ignore[attr-defined]
    padding.unpad_input = unpad_input  # type: ignore[attr-defined]
    package.bert_padding = padding  # type: ignore[attr-defined]
    sys.modules.update({"flash_attn": package, "flash_attn.bert_padding": padding})
    return True
