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


def _sums(t: torch.Tensor) -> torch.Tensor:
    raw = t.contiguous().view(-1).view(torch.uint8)
    pad = (-raw.numel()) % 4
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    w = raw.view(torch.int32).to(torch.int64)
    weights = torch.arange(w.numel(), device=w.device, dtype=torch.int64).remainder_(_WEIGHT_PERIOD).add_(1)
    return torch.stack([w.sum(), (w * weights).sum()])


def checksums(tensors: Sequence[torch.Tensor]) -> list[str]:
    """One checksum string per tensor, with a single device->host transfer for the whole list."""
    if not tensors:
        return []
    sums = torch.stack([_sums(t).to(tensors[0].device) for t in tensors]).cpu().tolist()
    return [f"{a & _MASK:016x}{b & _MASK:016x}" for a, b in sums]


def packed_checksums(buffer: torch.Tensor, spans: Sequence[tuple[int, int]]) -> list[str]:
    """:func:`checksums` of the tensors laid out in a packed ``uint8`` buffer, each ``(offset, nbytes)`` with
    ``offset`` a multiple of 4, in a fixed handful of elementwise kernels and two prefix sums over the buffer,
    whatever the number of tensors. Bytes between tensors are ignored; the result equals ``checksums`` of the
    tensors themselves (prefix sums wrap modulo 2**64 like the plain sums, so their differences are exact)."""
    if not spans:
        return []
    device = buffer.device
    if any(o % 4 for o, _ in spans):
        raise ValueError("packed_checksums needs 4-byte aligned offsets")
    pad = (-buffer.numel()) % 4
    words = (torch.nn.functional.pad(buffer, (0, pad)) if pad else buffer).view(torch.int32).to(torch.int64)
    n = words.numel()
    starts = torch.tensor([o // 4 for o, _ in spans], dtype=torch.int64, device=device)
    ends = torch.tensor([o // 4 + (b + 3) // 4 for o, b in spans], dtype=torch.int64, device=device)
    # Which words belong to a tensor, and each word's position inside its tensor.
    edge = torch.zeros(n + 1, dtype=torch.int64, device=device)
    edge.index_add_(0, starts, torch.ones_like(starts)).index_add_(0, ends, -torch.ones_like(ends))
    inside = edge.cumsum(0)[:n] > 0
    first = torch.zeros(n, dtype=torch.int64, device=device)
    first[starts[starts < n]] = starts[starts < n]
    position = torch.arange(n, device=device)
    local = position - first.cummax(0).values
    w = words * inside
    # A partial last word keeps only the tensor's own bytes (the per-tensor checksum pads with zeros).
    ragged = [(o // 4 + b // 4, (1 << (8 * (b % 4))) - 1) for o, b in spans if b % 4]
    if ragged:
        idx = torch.tensor([i for i, _ in ragged], dtype=torch.int64, device=device)
        w[idx] &= torch.tensor([m for _, m in ragged], dtype=torch.int64, device=device)
    c1 = torch.nn.functional.pad(w.cumsum(0), (1, 0))
    c2 = torch.nn.functional.pad((w * (local % _WEIGHT_PERIOD + 1)).cumsum(0), (1, 0))
    sums = torch.stack([c1[ends] - c1[starts], c2[ends] - c2[starts]], 1).cpu().tolist()
    return [f"{a & _MASK:016x}{b & _MASK:016x}" for a, b in sums]
