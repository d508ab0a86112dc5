"""Byte equality of many tensor pairs at once: the sender's proof that two exported tensors are one value.

On CUDA one Triton kernel reads every pair through a table of data pointers (no stacking, no copy, one launch for
all pairs, one host transfer); elsewhere ``torch.equal`` on the bytes per pair (memcmp speed on a CPU). Bytes, not
values: ``-0.0`` and ``0.0`` differ, a NaN equals the same NaN.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

import numpy as np
import torch

_BLOCK = 8192  # elements per step of one program
_SPLIT = 8  # programs per pair (each strides over its pair)


@functools.cache
def _kernel():
    import triton  # comes with PyTorch's CUDA builds
    import triton.language as tl

    @triton.jit
    def pairs_kernel(a_ptrs, b_ptrs, counts, out, WORDS: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
        pair = tl.program_id(0)
        first = tl.program_id(1).to(tl.int64) * BLOCK
        n = tl.load(counts + pair)
        if first < n:
            kind = tl.int32 if WORDS else tl.uint8
            a = tl.load(a_ptrs + pair).to(tl.pointer_type(kind))
            b = tl.load(b_ptrs + pair).to(tl.pointer_type(kind))
            differ = tl.zeros([BLOCK], dtype=tl.int32)
            for lo in range(first, n, SPLIT * BLOCK):
                pos = lo + tl.arange(0, BLOCK).to(tl.int64)
                inside = pos < n
                x = tl.load(a + pos, mask=inside, other=0)
                y = tl.load(b + pos, mask=inside, other=0)
                differ += (x != y).to(tl.int32)
            if tl.sum(differ, axis=0) > 0:
                tl.store(out + pair, 1)

    return pairs_kernel


def equal_at(device: torch.device, a: np.ndarray, b: np.ndarray, counts: np.ndarray, words: bool) -> torch.Tensor:
    """``bool[n]`` on ``device``: the ``counts[i]`` int32 words (``words``) or bytes at device addresses ``a[i]``
    and ``b[i]`` are equal. Not synchronised (read it with the other results of a batch)."""
    table = torch.from_numpy(np.stack([a, b, counts]).astype(np.int64)).to(device, non_blocking=True)
    out = torch.zeros(len(a), dtype=torch.int32, device=device)
    split = int(min(_SPLIT, max(1, -(-int(counts.max(initial=0)) // _BLOCK))))
    _kernel()[(len(a), split)](table[0], table[1], table[2], out, WORDS=words, SPLIT=split, BLOCK=_BLOCK)
    return out == 0


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
    # Contiguous copies made here are freed when this returns; the caching allocator hands their memory out again
    # only to work queued after the kernel on the same stream.
    a = [t if t.is_contiguous() else t.contiguous() for t in left]
    b = [t if t.is_contiguous() else t.contiguous() for t in right]
    n = len(a)
    pa = np.fromiter(map(torch.Tensor.data_ptr, a), np.int64, n)
    pb = np.fromiter(map(torch.Tensor.data_ptr, b), np.int64, n)
    nbytes = np.fromiter(map(operator.attrgetter("nbytes"), a), np.int64, n)
    words = not ((pa % 4).any() or (pb % 4).any() or (nbytes % 4).any())
    return equal_at(device, pa, pb, nbytes // 4 if words else nbytes, words)
