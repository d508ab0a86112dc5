"""Order-independent integer checksums computed where the tensors live (GPU or CPU).

Two sums of a tensor's bytes read as int32 words, in int64 with wraparound: the plain sum and a
position-weighted sum (catches reordering). Integer addition modulo 2**64 is exact in any order, so
the sender's GPU and the receiver's GPU (or CPU) agree bit for bit. This detects corruption and
truncation on the data channel; it is not a cryptographic hash.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_WEIGHT_PERIOD = 251
_MASK = 0xFFFFFFFFFFFFFFFF


def int32_words(raw: torch.Tensor) -> torch.Tensor:
    """``uint8`` bytes (last dim) read as int32 words, the last dim zero-padded to a multiple of 4 bytes."""
    pad = (-raw.shape[-1]) % 4
    return (torch.nn.functional.pad(raw, (0, pad)) if pad else raw).view(torch.int32)


def _sums(t: torch.Tensor) -> torch.Tensor:
    w = int32_words(t.contiguous().view(-1).view(torch.uint8)).to(torch.int64)
    weights = torch.arange(w.numel(), device=w.device, dtype=torch.int64).remainder_(_WEIGHT_PERIOD).add_(1)
    return torch.stack([w.sum(), (w * weights).sum()])


def checksums(tensors: Sequence[torch.Tensor]) -> list[str]:
    """One checksum string per tensor, with a single device->host transfer for the whole list."""
    if not tensors:
        return []
    sums = torch.stack([_sums(t).to(tensors[0].device) for t in tensors]).cpu().tolist()
    return [f"{a & _MASK:016x}{b & _MASK:016x}" for a, b in sums]
