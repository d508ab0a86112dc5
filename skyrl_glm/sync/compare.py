"""Byte equality of many tensor pairs at once: the sender's proof that two exported tensors are one value.

On CUDA one Triton kernel reads every pair through a table of data pointers (no stacking, no copy, one launch for
all pairs, one host transfer); elsewhere ``torch.equal`` on the bytes per pair (memcmp speed on a CPU). Bytes, not
values: ``-0.0`` and ``0.0`` differ, a NaN equals the same NaN.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_BLOCK = 8192  # elements per program
_KERNEL: list = []


def _kernel():
    if not _KERNEL:
        import triton  # comes with PyTorch's CUDA builds
        import triton.language as tl

        @triton.jit
        def pairs_kernel(a_ptrs, b_ptrs, counts, out, WORDS: tl.constexpr, BLOCK: tl.constexpr):
            pair = tl.program_id(0)
            lo = tl.program_id(1).to(tl.int64) * BLOCK
            n = tl.load(counts + pair)
            if lo < n:
                kind = tl.int32 if WORDS else tl.uint8
                a = tl.load(a_ptrs + pair).to(tl.pointer_type(kind))
                b = tl.load(b_ptrs + pair).to(tl.pointer_type(kind))
                pos = lo + tl.arange(0, BLOCK).to(tl.int64)
                inside = pos < n
                x = tl.load(a + pos, mask=inside, other=0)
                y = tl.load(b + pos, mask=inside, other=0)
                differ = tl.sum((x != y).to(tl.int32), axis=0)
                if differ > 0:
                    tl.store(out + pair, 1)

        _KERNEL.append(pairs_kernel)
    return _KERNEL[0]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def equal_pairs(left: Sequence[torch.Tensor], right: Sequence[torch.Tensor]) -> torch.Tensor:
    """``bool[len(left)]``: ``left[i]`` and ``right[i]`` (same shape and dtype) hold the same bytes. On the pairs'
    device; nothing is synchronised (read it with the other results of a batch)."""
    if not left:
        return torch.zeros(0, dtype=torch.bool)
    device = left[0].device
    if device.type != "cuda":
        return torch.tensor([torch.equal(_bytes(a), _bytes(b)) for a, b in zip(left, right, strict=True)])
    a = [t if t.is_contiguous() else t.contiguous() for t in left]
    b = [t if t.is_contiguous() else t.contiguous() for t in right]
    pa, pb = [t.data_ptr() for t in a], [t.data_ptr() for t in b]
    nbytes = [t.numel() * t.element_size() for t in a]
    words = all(p % 4 == 0 for p in pa) and all(p % 4 == 0 for p in pb) and all(n % 4 == 0 for n in nbytes)
    counts = [n // 4 for n in nbytes] if words else nbytes
    table = torch.tensor([pa, pb, counts], dtype=torch.int64).to(device, non_blocking=True)
    out = torch.zeros(len(a), dtype=torch.int32, device=device)
    most = max(counts) if counts else 0
    grid = (len(a), max(1, (most + _BLOCK - 1) // _BLOCK))
    _kernel()[grid](table[0], table[1], table[2], out, WORDS=words, BLOCK=_BLOCK)
    # Contiguous copies made above are freed when this returns; the caching allocator hands their memory out again
    # only to work queued after this kernel on the same stream.
    return out == 0
