"""Order-independent integer checksums and finiteness, computed where the tensors live (GPU or CPU).

Two sums of a tensor's bytes read as int32 words (zero-padded to a multiple of 4 bytes), modulo 2**32: the plain
sum and a position-weighted sum, weight ``pos % 251 + 1`` (catches reordering). Integer addition modulo 2**32 is
exact in any order and at any accumulator width, so the sender's GPU and the receiver's GPU (or CPU) agree bit for
bit; off the GPU numpy adds in int32 lanes, 4x faster than int64 accumulation. This detects corruption and
truncation on the data channel (any change of one word changes the plain sum); it is not a cryptographic hash.

One computation, three uses: :func:`span_checks` over a packed stream (the sender's buffer, the receiver's
staging buffer), :func:`checksums` of loose tensors (routing pieces), and :func:`fingerprints`, the sums the
sender's dedup groups candidate duplicates by. On CUDA one Triton kernel reads every tensor through a table of
addresses (one launch, one host transfer for any number of tensors); elsewhere numpy reductions per run of
equally sized tensors laid out at a constant stride.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from functools import cache, cached_property
from typing import Any

import numpy as np
import torch

CHECKSUM_CHARS = 16  # hex digits of one tensor's checksum: two sums modulo 2**32, 8 each
_WEIGHT_PERIOD = 251
_MASK = 0xFFFFFFFF  # the sums are taken modulo 2**32
# Exponent bits of a float: all set = inf or NaN. Per dtype name: (mask, bits per value in an int32 word).
_EXPONENT = {"float32": (0x7F800000, 32), "bfloat16": (0x7F80, 16), "float16": (0x7C00, 16)}
_KIND = {"float32": 0, "bfloat16": 1, "float16": 2}

Span = tuple[int, int, str]  # (byte offset, nbytes, dtype name); offsets are multiples of 4


class Spans(Sequence[Span]):
    """The spans of one stream layout with what :func:`span_checks` derives from them alone, made on first use and
    kept with the layout (``Manifest.spans``, the sender's plan layout): an update then takes no Python step per
    tensor for them (for 25,014 spans, grouped experts at 75 layers, that step took 6 ms a side on the 2-core CPU
    machine, measured 2026-12-04)."""

    def __init__(self, spans: Sequence[Span]) -> None:
        self.spans = list(spans)

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, i: Any) -> Any:
        return self.spans[i]

    def __iter__(self) -> Iterator[Span]:
        return iter(self.spans)

    @cached_property
    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Byte offsets, int32 words (bytes rounded up to 4) and dtype kinds (``_KIND``): the CUDA kernel's table."""
        n = len(self.spans)
        offsets = np.fromiter((o for o, _, _ in self.spans), dtype=np.int64, count=n)
        words = (np.fromiter((b for _, b, _ in self.spans), dtype=np.int64, count=n) + 3) // 4
        kinds = np.fromiter((_KIND[d] for _, _, d in self.spans), dtype=np.int64, count=n)
        return offsets, words, kinds

    @cached_property
    def end(self) -> int:
        """Where the last span's words end (its bytes rounded up to 4): what the CPU path reads of a stream."""
        return max(o + (n + 3) // 4 * 4 for o, n, _ in self.spans)

    @cached_property
    def runs(self) -> list[tuple[int, int, int, int, str]]:
        """:func:`_runs` of the spans: how the CPU path reads them."""
        return _runs(self.spans)


def _hex(sums: np.ndarray) -> str:
    """Each row's checksum, its first two columns modulo 2**32 as 8 hex digits each, every row in one string (one
    numpy pass: no Python step per tensor, which 25,000 grouped expert tensors would make ~10 ms)."""
    return (np.asarray(sums, dtype=np.int64)[:, :2] & _MASK).astype(">u4").tobytes().hex()


def _word_sums(words: np.ndarray) -> tuple[int, int]:
    """``(plain, weighted)`` of one tensor's int32 words, modulo 2**32 (numpy: column sums of a ``[-1, 251]`` view in
    wrapping int32 lanes, weighted once per column instead of once per word)."""
    weights = np.arange(1, _WEIGHT_PERIOD + 1, dtype=np.int64)
    k = words.size - words.size % _WEIGHT_PERIOD
    cols = words[:k].reshape(-1, _WEIGHT_PERIOD).sum(0, dtype=np.int32).astype(np.int64)
    tail = words[k:].astype(np.int64)
    plain = int(cols.sum()) + int(tail.sum())
    weighted = int((cols * weights).sum()) + int((tail * weights[: tail.size]).sum())
    return plain & _MASK, weighted & _MASK


def _finite(words: np.ndarray, dtype: str) -> bool:
    """No value has every exponent bit set: the largest ``value & mask`` is below ``mask`` (two SIMD passes)."""
    mask, bits = _EXPONENT[dtype]
    values = words.view(np.int16) if bits == 16 else words
    return values.size == 0 or int(np.bitwise_and(values, mask, dtype=values.dtype).max()) != mask


def _runs(spans: Sequence[Span]) -> list[tuple[int, int, int, int, str]]:
    """``(first span, spans, word offset, word stride, dtype)`` for each run of consecutive spans of one word count
    and dtype at a constant stride (a sender lays a factor's tensors back to back: thousands of spans are a few
    hundred runs), so that a run is read as one ``[spans, words]`` strided view."""
    runs: list[list[Any]] = []
    words = [(n + 3) // 4 for _, n, _ in spans]
    for i, (o, _, dt) in enumerate(spans):
        w, o = words[i], o // 4
        if runs:
            first, count, start, stride, dtype = runs[-1]
            last = start + (count - 1) * stride
            step = o - last
            if dtype == dt and words[first] == w and step >= w and (count == 1 or step == stride):
                runs[-1][1:4] = count + 1, start, step
                continue
        runs.append([i, 1, o, w, dt])
    return [tuple(r) for r in runs]


def _run_checks(rows: np.ndarray, dtype: str, finite: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_word_sums` and :func:`_finite` of every row of ``rows`` (``[spans, words]`` int32) at once."""
    count, size = rows.shape
    weights = np.arange(1, _WEIGHT_PERIOD + 1, dtype=np.int64)
    k = size - size % _WEIGHT_PERIOD
    cols = rows[:, :k].reshape(count, -1, _WEIGHT_PERIOD).sum(1, dtype=np.int32).astype(np.int64)
    tail = rows[:, k:].astype(np.int64)
    plain = cols.sum(1) + tail.sum(1)
    weighted = cols @ weights + tail @ weights[: size - k]
    ok = np.ones(count, dtype=bool)
    if finite and size:
        mask, bits = _EXPONENT[dtype]
        values = rows.view(np.int16) if bits == 16 else rows
        ok = np.bitwise_and(values, mask, dtype=values.dtype).max(1) != mask
    return plain & _MASK, weighted & _MASK, ok


def _cpu_checks(words: np.ndarray, spans: Spans, finite: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(sums [n, 2], finite [n])``: plain and weighted sums and the finite flag per span of ``words``, a run of
    spans at a time (:func:`_runs`: numpy's work per run, not per tensor). One thread: with int32 lanes the sums run
    at memory speed, and a thread per core measured slower on 2 cores (3.9-5.5 vs 2.1 ms for a 30 MB sender
    stream)."""
    plain = np.zeros(len(spans), dtype=np.int64)
    weighted = np.zeros(len(spans), dtype=np.int64)
    ok = np.ones(len(spans), dtype=bool)
    for first, count, start, stride, dtype in spans.runs:
        size = (spans[first][1] + 3) // 4
        rows = np.lib.stride_tricks.as_strided(
            words[start:], (count, size), (stride * words.itemsize, words.itemsize), writeable=False
        )
        got = _run_checks(rows, dtype, finite)
        plain[first : first + count], weighted[first : first + count], ok[first : first + count] = got
    return np.stack([plain, weighted], 1), ok


_BLOCK = 1024  # words per step of one program
_SPLIT = 16  # programs per tensor (each strides over its tensor)


@cache
def _kernel():
    """The Triton kernel (built on first use). Its lanes are 32 bits wide: the sums are wanted modulo 2**32, which
    unsigned 32-bit adds and multiplies give as they wrap, and the weight ``pos % 251 + 1`` is made from one 64-bit
    remainder per step and a 32-bit one per word. Compiled for sm_90a it takes 65 registers and spills none; with
    64-bit lanes and 4,096 words a step it took 255 and spilled (``docs/benchmarks.md``)."""
    import triton  # comes with PyTorch's CUDA builds
    import triton.language as tl

    @triton.jit
    def checks_kernel(addrs, counts, kinds, out, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0)
        first = tl.program_id(1).to(tl.int64) * BLOCK
        n = tl.load(counts + i)
        if first < n:
            words = tl.load(addrs + i).to(tl.pointer_type(tl.uint32))
            kind = tl.load(kinds + i)
            lane = tl.arange(0, BLOCK)
            plain = tl.zeros([BLOCK], dtype=tl.uint32)
            weighted = tl.zeros([BLOCK], dtype=tl.uint32)
            bad = tl.zeros([BLOCK], dtype=tl.int32)
            for lo in range(first, n, SPLIT * BLOCK):
                inside = lane < tl.minimum(n - lo, BLOCK).to(tl.int32)
                w = tl.load(words + lo + lane, mask=inside, other=0)
                weight = (tl.cast(lo % 251, tl.int32) + lane) % 251 + 1
                plain += w
                weighted += w * weight.to(tl.uint32)
                lo16 = w & 0xFFFF
                hi16 = w >> 16
                bad32 = (w & 0x7F800000) == 0x7F800000
                bad_bf = ((lo16 & 0x7F80) == 0x7F80) | ((hi16 & 0x7F80) == 0x7F80)
                bad_fp = ((lo16 & 0x7C00) == 0x7C00) | ((hi16 & 0x7C00) == 0x7C00)
                bad += tl.where(kind == 0, bad32, tl.where(kind == 1, bad_bf, bad_fp)).to(tl.int32)
            tl.atomic_add(out + i * 3, tl.sum(plain, axis=0).to(tl.int64))
            tl.atomic_add(out + i * 3 + 1, tl.sum(weighted, axis=0).to(tl.int64))
            tl.atomic_add(out + i * 3 + 2, tl.sum(bad, axis=0).to(tl.int64))

    return checks_kernel


def _checks_cuda(device: torch.device, addrs: np.ndarray, words: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """``int64 [n, 3]``: plain sum, weighted sum, count of non-finite values of the ``words[i]`` int32 words at
    ``addrs[i]`` (4-byte aligned device addresses)."""
    n = len(addrs)
    table = torch.from_numpy(np.stack([addrs, words, kinds]).astype(np.int64)).to(device)
    out = torch.zeros(n, 3, dtype=torch.int64, device=device)
    split = int(min(_SPLIT, max(1, -(-int(words.max(initial=0)) // _BLOCK))))
    _kernel()[(n, split)](table[0], table[1], table[2], out, SPLIT=split, BLOCK=_BLOCK)
    return out.cpu().numpy()


def span_checks(stream: torch.Tensor, spans: Spans | Sequence[Span], finite: bool = True) -> tuple[str, np.ndarray]:
    """Checksum and "every value finite" of each span of the packed ``uint8`` stream: every span's checksum (16 hex
    digits) in one string, in span order (the manifest's form), and a bool array. Bytes between a span's end and the
    next multiple of 4 count as padding and must be zero (the sender zeroes them). ``finite=False``: the flags are
    not needed (all True; saves a pass off the GPU, where the kernel gives them for free). A layout's
    :class:`Spans` keeps what is derived from the spans alone between updates."""
    if not spans:
        return "", np.ones(0, dtype=bool)
    table = spans if isinstance(spans, Spans) else Spans(spans)
    if stream.is_cuda:
        offsets, words, kinds = table.columns
        res = _checks_cuda(stream.device, offsets + stream.data_ptr(), words, kinds)
        return _hex(res), res[:, 2] == 0
    sums, ok = _cpu_checks(stream[: table.end].numpy().view(np.int32), table, finite)
    return _hex(sums), ok


def checksums(tensors: Sequence[torch.Tensor]) -> list[str]:
    """One checksum string per tensor, as :func:`span_checks` gives it for the tensor in a packed stream."""
    digits = _hex(fingerprints(tensors))
    return [digits[i : i + CHECKSUM_CHARS] for i in range(0, len(digits), CHECKSUM_CHARS)]


def word_aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its bytes can be read as int32 words in place (contiguous, 4-byte aligned, a multiple of 4
    bytes), else a zero-padded ``uint8`` copy that can."""
    if t.is_contiguous() and t.data_ptr() % 4 == 0 and t.nbytes % 4 == 0:
        return t
    out = torch.zeros((t.nbytes + 3) // 4 * 4, dtype=torch.uint8, device=t.device)
    out[: t.nbytes].copy_(t.contiguous().reshape(-1).view(torch.uint8))
    return out


def fingerprints(tensors: Sequence[torch.Tensor]) -> np.ndarray:
    """``int64 [n, 2]``: the plain and weighted sums of each tensor (its checksum as integers), on any device."""
    views = [word_aligned(t) for t in tensors]
    if views and views[0].is_cuda:
        n = len(views)
        addrs = np.fromiter(map(torch.Tensor.data_ptr, views), np.int64, n)
        return sums_at(views[0].device, addrs, np.fromiter(map(operator.attrgetter("nbytes"), views), np.int64, n) // 4)
    out = np.zeros((len(views), 2), dtype=np.int64)
    for i, v in enumerate(views):
        out[i] = _word_sums(v.reshape(-1).view(torch.uint8).numpy().view(np.int32))
    return out


def sums_at(device: torch.device, addrs: np.ndarray, words: np.ndarray) -> np.ndarray:
    """:func:`fingerprints` of the ``words[i]`` int32 words at CUDA addresses ``addrs[i]`` (4-byte aligned), for
    callers that already hold the addresses (no Python work per tensor)."""
    return _checks_cuda(device, addrs, words, np.zeros(len(addrs), dtype=np.int64))[:, :2] & _MASK
