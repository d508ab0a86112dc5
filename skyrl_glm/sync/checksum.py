"""Order-independent integer checksums and finiteness, computed where the tensors live (GPU or CPU).

Two sums of a tensor's bytes read as int32 words (zero-padded to a multiple of 4 bytes), in int64 with
wraparound: the plain sum and a position-weighted sum, weight ``pos % 251 + 1`` (catches reordering). Integer
addition modulo 2**64 is exact in any order, so the sender's GPU and the receiver's GPU (or CPU) agree bit for
bit. This detects corruption and truncation on the data channel; it is not a cryptographic hash.

:func:`span_checks` works on a packed stream (the sender's buffer, the receiver's staging buffer): on CUDA one
Triton kernel computes both sums and a NaN/inf flag for every tensor of the stream at once (one launch, one host
transfer); elsewhere numpy reductions per tensor. :func:`checksums` packs loose tensors (routing pieces) first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from skyrl_glm.sync.manifest import dtype_name

_WEIGHT_PERIOD = 251
_MASK = 0xFFFFFFFFFFFFFFFF
# Exponent bits of a float: all set = inf or NaN. Per dtype name: (mask, bits per value in an int32 word).
_EXPONENT = {"float32": (0x7F800000, 32), "bfloat16": (0x7F80, 16), "float16": (0x7C00, 16)}
_KIND = {"float32": 0, "bfloat16": 1, "float16": 2}


def int32_words(raw: torch.Tensor) -> torch.Tensor:
    """``uint8`` bytes (last dim) read as int32 words, the last dim zero-padded to a multiple of 4 bytes."""
    pad = (-raw.shape[-1]) % 4
    return (torch.nn.functional.pad(raw, (0, pad)) if pad else raw).view(torch.int32)


def _fmt(sums: list[list[int]]) -> list[str]:
    return [f"{a & _MASK:016x}{b & _MASK:016x}" for a, b in sums]


def checksums(tensors: Sequence[torch.Tensor]) -> list[str]:
    """One checksum string per tensor (packed into one zeroed stream, then :func:`span_checks`)."""
    if not tensors:
        return []
    spans, offset = [], 0
    for t in tensors:
        spans.append((offset, t.numel() * t.element_size(), dtype_name(t.dtype)))
        offset += (spans[-1][1] + 63) // 64 * 64
    stream = torch.zeros(offset, dtype=torch.uint8, device=tensors[0].device)
    for (o, n, _), t in zip(spans, tensors, strict=True):
        stream[o : o + n].copy_(t.reshape(-1).view(torch.uint8))
    return span_checks(stream, spans)[0]


Span = tuple[int, int, str]  # (byte offset, nbytes, dtype name); offsets are multiples of 4


def span_checks(stream: torch.Tensor, spans: Sequence[Span]) -> tuple[list[str], list[bool]]:
    """Checksum and "every value finite" of each span of the packed ``uint8`` stream. Bytes between a span's
    end and the next multiple of 4 count as padding and must be zero (the sender zeroes them)."""
    if not spans:
        return [], []
    if stream.is_cuda:
        return _span_checks_triton(stream, spans)
    return _span_checks_numpy(stream, spans)


def _span_checks_numpy(stream: torch.Tensor, spans: Sequence[Span]) -> tuple[list[str], list[bool]]:
    """Off the GPU: numpy reductions (int64 accumulation without an int64 copy of the stream; column sums of a
    ``[-1, 251]`` view weighted once instead of a weight per word)."""
    end = max(o + (n + 3) // 4 * 4 for o, n, _ in spans)
    words = stream[:end].numpy().view(np.int32)
    weights = np.arange(1, _WEIGHT_PERIOD + 1, dtype=np.int64)
    sums, finite = [], []
    for offset, nbytes, dtype in spans:
        w = words[offset // 4 : (offset + nbytes + 3) // 4]
        k = w.size - w.size % _WEIGHT_PERIOD
        cols = w[:k].reshape(-1, _WEIGHT_PERIOD).sum(0, dtype=np.int64)
        tail = w[k:].astype(np.int64)
        plain = int(cols.sum()) + int(tail.sum())
        weighted = int((cols * weights).sum()) + int((tail * weights[: tail.size]).sum())
        sums.append([plain, weighted])
        mask, bits = _EXPONENT[dtype]
        values = w.view(np.int16) if bits == 16 else w
        finite.append(not bool(((values & mask) == mask).any()))
    return _fmt(sums), finite


_TRITON: list = []


def _triton():
    """The Triton kernel (built on first use)."""
    if not _TRITON:
        import triton  # comes with PyTorch's CUDA builds
        import triton.language as tl

        @triton.jit
        def span_kernel(words, starts, counts, kinds, out, BLOCK: tl.constexpr):
            span = tl.program_id(0)
            lo = tl.program_id(1).to(tl.int64) * BLOCK
            n = tl.load(counts + span)
            if lo < n:
                pos = lo + tl.arange(0, BLOCK).to(tl.int64)
                inside = pos < n
                w32 = tl.load(words + tl.load(starts + span) + pos, mask=inside, other=0)
                w = w32.to(tl.int64)
                weight = pos % 251 + 1
                tl.atomic_add(out + span * 3, tl.sum(w, axis=0))
                tl.atomic_add(out + span * 3 + 1, tl.sum(w * weight, axis=0))
                kind = tl.load(kinds + span)
                lo16 = w & 0xFFFF
                hi16 = (w >> 16) & 0xFFFF
                bad32 = (w & 0x7F800000) == 0x7F800000
                bad_bf = ((lo16 & 0x7F80) == 0x7F80) | ((hi16 & 0x7F80) == 0x7F80)
                bad_fp = ((lo16 & 0x7C00) == 0x7C00) | ((hi16 & 0x7C00) == 0x7C00)
                bad = tl.where(kind == 0, bad32, tl.where(kind == 1, bad_bf, bad_fp))
                tl.atomic_add(out + span * 3 + 2, tl.sum(bad.to(tl.int64), axis=0))

        _TRITON.append(span_kernel)
    return _TRITON[0]


_BLOCK = 4096  # words per program


def _span_checks_triton(stream: torch.Tensor, spans: Sequence[Span]) -> tuple[list[str], list[bool]]:
    kernel = _triton()
    n = len(spans)
    rows = [[o // 4, (nb + 3) // 4, _KIND[dt]] for o, nb, dt in spans]
    table = torch.tensor(rows, dtype=torch.int64).t().contiguous().to(stream.device)
    words = stream[: stream.numel() // 4 * 4].view(torch.int32)
    out = torch.zeros(n, 3, dtype=torch.int64, device=stream.device)
    most = max((nb + 3) // 4 for _, nb, _ in spans)
    kernel[(n, (most + _BLOCK - 1) // _BLOCK)](words, table[0], table[1], table[2], out, BLOCK=_BLOCK)
    res = out.cpu().tolist()
    return _fmt([r[:2] for r in res]), [r[2] == 0 for r in res]
