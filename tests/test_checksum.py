"""CPU checksums: the numpy path equals the definition written plainly, NaN/inf found in any span, loose tensors agree
with a packed stream. (``test_checksum_gpu.py`` checks the Triton kernel against these.)"""

from __future__ import annotations

import numpy as np
import torch
from packed_streams import packed

from skyrl_glm.sync.checksum import Spans, checksums, span_checks
from skyrl_glm.sync.manifest import CHECKSUM_CHARS


def _stream() -> tuple[torch.Tensor, list, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    dtypes = [torch.bfloat16, torch.float32, torch.float16]
    sizes = torch.randint(1, 90_000, (80,), generator=g).tolist()
    tensors = [torch.randn(n, generator=g).to(dtypes[i % 3]) for i, n in enumerate(sizes)]
    tensors[70][3] = float("nan")
    tensors[77][-1] = float("-inf")
    return (*packed(tensors), tensors)


def _each(digits: str) -> list[str]:
    """The per-span checksums of span_checks' one string (CHECKSUM_CHARS hex digits each)."""
    return [digits[i : i + CHECKSUM_CHARS] for i in range(0, len(digits), CHECKSUM_CHARS)]


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
    assert sums == "".join(_reference(t) for t in tensors)  # int32 lanes wrap; the definition is modulo 2**32
    assert np.flatnonzero(~finite).tolist() == [70, 77]
    unchecked = span_checks(stream, spans, finite=False)
    assert unchecked[0] == sums and unchecked[1].all() and len(unchecked[1]) == len(spans)
    assert "".join(checksums(tensors)) == sums and len(checksums(tensors)) == len(tensors)


def test_a_layouts_span_table_checks_alike_and_derives_its_columns_once():
    """What a layout keeps (``Spans``): the same checks as the plain spans, its kernel columns and CPU runs made on
    first use and kept."""
    stream, spans, _ = _stream()
    table = Spans(spans)
    got, want = span_checks(stream, table), span_checks(stream, spans)
    assert got[0] == want[0] and np.array_equal(got[1], want[1])
    assert table.runs is table.runs and table.columns is table.columns
    offsets, words, kinds = table.columns
    assert offsets.tolist() == [o for o, _, _ in spans] and words.tolist() == [(n + 3) // 4 for _, n, _ in spans]
    assert kinds.tolist() == [{"float32": 0, "bfloat16": 1, "float16": 2}[d] for _, _, d in spans]
    assert table.end == max(o + (n + 3) // 4 * 4 for o, n, _ in spans) and list(table) == spans


def test_one_flipped_bit_changes_only_its_tensor():
    stream, spans, _ = _stream()
    before = _each(span_checks(stream, spans)[0])
    stream[spans[41][0] + 5] ^= 4
    after = _each(span_checks(stream, spans)[0])
    assert [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b] == [41]


def _runs_stream() -> tuple[torch.Tensor, list, list[torch.Tensor]]:
    """Runs of equal tensors back to back, as a sender packs a factor's experts or groups: sizes on and off the
    64-byte grid (padded), a lone one between runs, an empty one, and three dtypes."""
    g = torch.Generator().manual_seed(3)
    tensors: list[torch.Tensor] = []
    for n, dtype, count in (
        (1024, torch.bfloat16, 9),
        (7, torch.float32, 5),
        (513, torch.float16, 4),
        (251 * 3, torch.float32, 6),
        (0, torch.bfloat16, 2),
        (300, torch.bfloat16, 1),
        (300, torch.float16, 3),
    ):
        tensors += [torch.randn(n, generator=g).to(dtype) for _ in range(count)]
    tensors[4][100] = float("inf")
    tensors[17][0] = float("nan")
    return (*packed(tensors), tensors)


def test_runs_of_equal_tensors_are_checked_as_each_tensor_alone():
    stream, spans, tensors = _runs_stream()
    sums, finite = span_checks(stream, spans)
    assert _each(sums) == [_reference(t) for t in tensors]
    assert np.flatnonzero(~finite).tolist() == [4, 17]
    for i in (2, 12, 20, 28):  # a flipped bit inside a run changes only its tensor
        flipped = stream.clone()
        flipped[spans[i][0] + min(3, spans[i][1] - 1)] ^= 1
        after = _each(span_checks(flipped, spans)[0])
        assert [k for k, (a, b) in enumerate(zip(_each(sums), after, strict=True)) if a != b] == [i]
