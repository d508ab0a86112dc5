"""The CUDA checksum kernel's own code, run by Triton's interpreter on the CPU machine, against the numpy path.

The kernel's integer widths are its correctness (sums modulo 2**32 from wrapping 32-bit lanes, the position weight
from a 64-bit and a 32-bit remainder): the interpreter runs the same kernel body on host memory, so CPU CI checks what
the GPU tests (``test_checksum_gpu.py``) check on a GPU. It needs ``TRITON_INTERPRET=1`` before the kernel is built,
hence a fresh process. Not a test of the GPU's speed, nor of its compiler.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import numpy as np, torch
from packed_streams import packed
from skyrl_glm.sync import checksum as C

g = torch.Generator().manual_seed(0)
shapes = [((7, 33), torch.bfloat16), ((50_000,), torch.float32), ((3,), torch.float16), ((640, 33), torch.bfloat16),
          ((1,), torch.float32), ((C._BLOCK * C._SPLIT * 2 + 5,), torch.bfloat16), ((C._BLOCK,), torch.float16)]
shapes += [((int(n),), torch.bfloat16) for n in torch.randint(1, 20_000, (24,), generator=g)]
tensors = [(torch.randn(s, generator=g) * 1e4).to(dt) for s, dt in shapes]  # large values: every bit pattern busy
tensors[3][5, 7] = float("nan")
tensors[2][1] = float("inf")
tensors[20][-1] = float("-inf")
stream, spans = packed(tensors)


def kernel(stream):
    offsets, words, kinds = C.Spans(spans).columns
    res = C._checks_cuda(torch.device("cpu"), offsets + stream.data_ptr(), words, kinds)
    return C._hex(res), res[:, 2] == 0


want = C.span_checks(stream, spans)
got = kernel(stream)
assert got[0] == want[0], "checksums differ from the numpy path"
assert (got[1] == want[1]).all() and [i for i, ok in enumerate(got[1]) if not ok] == [2, 3, 20], got[1]
stream[spans[5][0] + 4 * (C._BLOCK * C._SPLIT + 1) + 1] ^= 1  # a bit in a second step of a program
flipped = kernel(stream)[0]
changed = [i for i in range(len(spans)) if flipped[16 * i : 16 * i + 16] != want[0][16 * i : 16 * i + 16]]
assert changed == [5], changed
loose = [tensors[1], tensors[6]]  # whole words each: the dedup's fingerprints of tensors in place
words = np.array([t.nbytes // 4 for t in loose], dtype=np.int64)
sums = C.sums_at(torch.device("cpu"), np.array([t.data_ptr() for t in loose], dtype=np.int64), words)
assert (sums == C.fingerprints(loose) & 0xFFFFFFFF).all()
print("ok")
"""


def test_the_cuda_checksum_kernel_equals_the_numpy_path_under_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
