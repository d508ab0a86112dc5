"""Test helper: tensors packed into one zero-padded ``uint8`` stream as the sender lays it out (64-byte aligned)."""

from __future__ import annotations

import torch


def packed(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list[tuple[int, int, str]]]:
    """``(stream, spans)``: each tensor's bytes at a 64-byte aligned offset, zero padding between them."""
    spans, offset = [], 0
    for t in tensors:
        spans.append((offset, t.nbytes, str(t.dtype).removeprefix("torch.")))
        offset += (t.nbytes + 63) // 64 * 64
    stream = torch.zeros(offset, dtype=torch.uint8)
    for (o, n, _), t in zip(spans, tensors, strict=True):
        stream[o : o + n] = t.reshape(-1).view(torch.uint8)
    return stream, spans
