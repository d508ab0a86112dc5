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
    ``offset`` a multiple of 4, in a fixed handful of kernels whatever the number of tensors (one index_add per
    sum instead of a kernel chain per tensor). Bytes between tensors are ignored; the result equals
    ``checksums`` of the tensors themselves."""
    if not spans:
        return []
    device = buffer.device
    offsets = torch.tensor([o for o, _ in spans], dtype=torch.int64)
    nbytes = torch.tensor([n for _, n in spans], dtype=torch.int64)
    if bool((offsets % 4).any()):
        raise ValueError("packed_checksums needs 4-byte aligned offsets")
    nwords = (nbytes + 3) // 4
    segment = torch.repeat_interleave(torch.arange(len(spans)), nwords)
    first = torch.cumsum(nwords, 0) - nwords  # index of each tensor's first word in the gathered list
    local = torch.arange(int(nwords.sum())) - first[segment]  # word position inside its tensor
    index = (offsets // 4)[segment] + local
    pad = (-buffer.numel()) % 4
    words = torch.nn.functional.pad(buffer, (0, pad)) if pad else buffer
    w = words.view(torch.int32)[index.to(device)].to(torch.int64)
    # A partial last word keeps only the tensor's own bytes (the per-tensor checksum pads with zeros).
    tail = (nbytes % 4).tolist()
    ragged = [i for i, r in enumerate(tail) if r]
    if ragged:
        last = (first + nwords - 1)[ragged].to(device)
        masks = torch.tensor([(1 << (8 * tail[i])) - 1 for i in ragged], dtype=torch.int64, device=device)
        w[last] &= masks
    segment, weights = segment.to(device), (local % _WEIGHT_PERIOD + 1).to(device)
    s1 = torch.zeros(len(spans), dtype=torch.int64, device=device).index_add_(0, segment, w)
    s2 = torch.zeros(len(spans), dtype=torch.int64, device=device).index_add_(0, segment, w * weights)
    return [f"{a & _MASK:016x}{b & _MASK:016x}" for a, b in torch.stack([s1, s2], 1).cpu().tolist()]
