"""Transports between two processes, bit-exact: NCCL (2 GPUs), CUDA IPC (2 processes, one GPU), and the
collective transport over gloo on CPU (runs in CPU CI).

Each test spawns a sender and a receiver process (:func:`skyrl_glm.bench.roundtrip.transfer_roundtrip`): the sender
plans a synthetic Megatron-Bridge-shaped GLM-5.3 adapter and ships it; the receiver rebuilds every public name and
compares each one, byte for byte, with the sender's public tensor after SkyRL's alpha fold (regenerated from the
seed in the receiver process). "large" is the full GLM-5.3 rank-32 bf16 adapter: 116k public names, 30.6 GB public,
0.47 GB unique.
"""

from __future__ import annotations

import pytest
import torch

from skyrl_glm.bench.roundtrip import transfer_roundtrip
from skyrl_glm.bench.synthetic import BenchOptions

_CUDA = torch.cuda.is_available()
_GPUS = torch.cuda.device_count() if _CUDA else 0

needs_cuda = pytest.mark.skipif(not _CUDA, reason="needs CUDA")
needs_2_gpus = pytest.mark.skipif(_GPUS < 2, reason=f"needs 2 CUDA GPUs (found {_GPUS})")

SIZES = {
    "tiny": {"config": "tiny", "rank": 8},
    "large": {"config": "full", "rank": 32},
}


def _check(result: dict, opts: BenchOptions) -> None:
    assert result["names_ok"], result
    assert result["expected_names"] == result["received_names"] > 0, result
    assert result["mismatched"] == [], result
    assert result["bit_exact"], result


@pytest.mark.parametrize("copies", [False, True], ids=["shared", "copies"])
def test_collective_transport_over_gloo_cpu(copies):
    opts = BenchOptions(config="tiny", rank=8, transport="nccl", device="cpu", recv_device="cpu", copies=copies)
    opts.bucket_mb = 0  # every tensor its own bucket: exercises the multi-bucket path
    _check(transfer_roundtrip(opts), opts)


@pytest.mark.gpu
@needs_cuda
@needs_2_gpus
@pytest.mark.parametrize("size", list(SIZES))
def test_nccl_two_gpus_bit_exact(size):
    opts = BenchOptions(transport="nccl", device="cuda:0", recv_device="cuda:1", **SIZES[size])
    _check(transfer_roundtrip(opts), opts)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("size", list(SIZES))
def test_cuda_ipc_two_processes_one_gpu_bit_exact(size):
    opts = BenchOptions(transport="ipc", device="cuda:0", recv_device="cuda:0", **SIZES[size])
    _check(transfer_roundtrip(opts), opts)


@pytest.mark.gpu
@needs_cuda
@needs_2_gpus
def test_nccl_large_copies_bit_exact():
    """The exporter hands out a separate copy under every name (30 GB on the sender GPU)."""
    opts = BenchOptions(transport="nccl", device="cuda:0", recv_device="cuda:1", copies=True, **SIZES["large"])
    _check(transfer_roundtrip(opts), opts)
