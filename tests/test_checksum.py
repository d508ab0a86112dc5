"""CPU checksums: the threaded path equals the serial one, NaN/inf found in any span, loose tensors agree with a
packed stream. (``test_checksum_gpu.py`` checks the Triton kernel against these.)"""

from __future__ import annotations

import torch
from packed_streams import packed

from skyrl_glm.sync import checksum
from skyrl_glm.sync.checksum import checksums, span_checks


def _stream() -> tuple[torch.Tensor, list, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    dtypes = [torch.bfloat16, torch.float32, torch.float16]
    sizes = torch.randint(1, 90_000, (80,), generator=g).tolist()
    tensors = [torch.randn(n, generator=g).to(dtypes[i % 3]) for i, n in enumerate(sizes)]
    tensors[70][3] = float("nan")  # late spans: the second thread's part
    tensors[77][-1] = float("-inf")
    return (*packed(tensors), tensors)


def test_threaded_checks_equal_serial(monkeypatch):
    stream, spans, tensors = _stream()
    assert stream.numel() > checksum._PARALLEL_BYTES
    parallel = span_checks(stream, spans)
    monkeypatch.setattr(checksum, "_PARALLEL_BYTES", 1 << 62)
    assert span_checks(stream, spans) == parallel
    assert [i for i, ok in enumerate(parallel[1]) if not ok] == [70, 77]
    assert span_checks(stream, spans, finite=False) == (parallel[0], [True] * len(spans))
    assert checksums(tensors) == parallel[0]


def test_one_flipped_bit_changes_only_its_tensor():
    stream, spans, _ = _stream()
    before = span_checks(stream, spans)[0]
    stream[spans[41][0] + 5] ^= 4
    after = span_checks(stream, spans)[0]
    assert [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b] == [41]
