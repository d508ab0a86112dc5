"""CPU checksums: the numpy path equals the definition written plainly, NaN/inf found in any span, loose tensors agree
with a packed stream. (``test_checksum_gpu.py`` checks the Triton kernel against these.)"""

from __future__ import annotations

import torch
from packed_streams import packed

from skyrl_glm.sync.checksum import checksums, span_checks


def _stream() -> tuple[torch.Tensor, list, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    dtypes = [torch.bfloat16, torch.float32, torch.float16]
    sizes = torch.randint(1, 90_000, (80,), generator=g).tolist()
    tensors = [torch.randn(n, generator=g).to(dtypes[i % 3]) for i, n in enumerate(sizes)]
    tensors[70][3] = float("nan")
    tensors[77][-1] = float("-inf")
    return (*packed(tensors), tensors)


def _reference(t: torch.Tensor) -> str:
    """The checksum's definition, written plainly: int64 sums of the int32 words (zero-padded), then modulo 2**32."""
    raw = t.reshape(-1).view(torch.uint8)
    raw = torch.cat([raw, torch.zeros((-raw.numel()) % 4, dtype=torch.uint8)])
    words = raw.view(torch.int32).to(torch.int64)
    weights = torch.arange(words.numel(), dtype=torch.int64) % 251 + 1
    return f"{int(words.sum()) & 0xFFFFFFFF:08x}{int((words * weights).sum()) & 0xFFFFFFFF:08x}"


def test_checks_follow_the_definition_and_find_every_non_finite_span():
    stream, spans, tensors = _stream()
    sums, finite = span_checks(stream, spans)
    assert sums == [_reference(t) for t in tensors]  # int32 lanes wrap; the definition is modulo 2**32
    assert [i for i, ok in enumerate(finite) if not ok] == [70, 77]
    assert span_checks(stream, spans, finite=False) == (sums, [True] * len(spans))
    assert checksums(tensors) == sums


def test_one_flipped_bit_changes_only_its_tensor():
    stream, spans, _ = _stream()
    before = span_checks(stream, spans)[0]
    stream[spans[41][0] + 5] ^= 4
    after = span_checks(stream, spans)[0]
    assert [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b] == [41]
