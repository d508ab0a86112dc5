"""Order-independent integer checksums and finiteness, computed where the tensors live (GPU or CPU).

Two sums of a tensor's bytes read as int32 words (zero-padded to a multiple of 4 bytes), in int64 with
wraparound: the plain sum and a position-weighted sum, weight ``pos % 251 + 1`` (catches reordering). Integer
addition modulo 2**64 is exact in any order, so the sender's GPU and the receiver's GPU (or CPU) agree bit for
bit. This detects corruption and truncation on the data channel; it is not a cryptographic hash.

:func:`checksums` works tensor by tensor (routing pieces). :func:`span_checks` works on a packed stream (the
sender's buffer, the receiver's staging buffer): on CUDA one Triton kernel computes both sums and a NaN/inf flag
for every tensor of the stream at once (one launch, one host transfer); elsewhere one int64 view of the whole
stream and a few reductions per tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_WEIGHT_PERIOD = 251
_MASK = 0xFFFFFFFFFFFFFFFF
# Exponent bits of a float: all set = inf or NaN. Per dtype name: (mask, bits per value in an int32 word).
_EXPONENT = {"float32": (0x7F800000, 32), "bfloat16": (0x7F80, 16), "float16": (0x7C00, 16)}
_KIND = {"float32": 0, "bfloat16": 1, "float16": 2}


def int32_words(raw: torch.Tensor) -> torch.Tensor:
    """``uint8`` bytes (last dim) read as int32 words, the last dim zero-padded to a multiple of 4 bytes."""
    pad = (-raw.shape[-1]) % 4
    return (torch.nn.functional.pad(raw, (0, pad)) if pad else raw).view(torch.int32)


def _weights(n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(1, n + 1, dtype=torch.int64, device=device)


def _word_sums(w: torch.Tensor) -> torch.Tensor:
    """``[plain, weighted]`` (int64, on ``w``'s device) of int64 words ``w``: column sums of a ``[-1, 251]`` view
    weighted once, instead of a weight per word."""
    n = w.numel()
    k = n - n % _WEIGHT_PERIOD
    cols = w[:k].view(-1, _WEIGHT_PERIOD).sum(0)
    tail = w[k:]
    plain = cols.sum() + tail.sum()
    weighted = (cols * _weights(_WEIGHT_PERIOD, w.device)).sum() + (tail * _weights(n - k, w.device)).sum()
    return torch.stack([plain, weighted])


def _fmt(sums: list[list[int]]) -> list[str]:
    return [f"{a & _MASK:016x}{b & _MASK:016x}" for a, b in sums]


def checksums(tensors: Sequence[torch.Tensor]) -> list[str]:
    """One checksum string per tensor, with a single device->host transfer for the whole list."""
    if not tensors:
        return []
    device = tensors[0].device
    sums = [_word_sums(int32_words(t.contiguous().view(-1).view(torch.uint8)).to(torch.int64)) for t in tensors]
    return _fmt(torch.stack([s.to(device) for s in sums]).cpu().tolist())


Span = tuple[int, int, str]  # (byte offset, nbytes, dtype name); offsets are multiples of 4


def span_checks(stream: torch.Tensor, spans: Sequence[Span]) -> tuple[list[str], list[bool]]:
    """Checksum and "every value finite" of each span of the packed ``uint8`` stream. Bytes between a span's
    end and the next multiple of 4 count as padding and must be zero (the sender zeroes them)."""
    if not spans:
        return [], []
    if stream.is_cuda and _triton() is not None:
        return _span_checks_triton(stream, spans)
    return _span_checks_torch(stream, spans)


def _span_checks_torch(stream: torch.Tensor, spans: Sequence[Span]) -> tuple[list[str], list[bool]]:
    end = max(o + (n + 3) // 4 * 4 for o, n, _ in spans)
    words = stream[:end].view(torch.int32)
    wide = words.to(torch.int64)
    sums, finite = [], []
    for offset, nbytes, dtype in spans:
        a, b = offset // 4, (offset + nbytes + 3) // 4
        sums.append(_word_sums(wide[a:b]))
        mask, bits = _EXPONENT[dtype]
        w = words[a:b]
        bad = (w & mask) == mask
        if bits == 16:
            bad |= ((w >> 16) & mask) == mask
        finite.append(~bad.any())
    out = torch.stack(sums).cpu().tolist()
    return _fmt(out), torch.stack(finite).cpu().tolist()


_TRITON: list = []


def _triton():
    """The compiled kernel, or None where Triton is missing (a CPU-only install)."""
    if not _TRITON:
        try:
            import triton
            import triton.language as tl
        except ImportError:
            _TRITON.append(None)
            return None

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
