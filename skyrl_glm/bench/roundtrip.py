"""One ``ours`` sync between two spawned processes through a named transport (the transport tests' harness):
the receiver compares every rebuilt public name with the sender's public tensor after SkyRL's alpha fold
(:func:`~skyrl_glm.bench.verify.compare_exact`)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from skyrl_glm.bench.procs import free_port
from skyrl_glm.bench.run import joined_pair
from skyrl_glm.bench.sides import Sender
from skyrl_glm.bench.synthetic import BenchOptions, synthetic_adapter
from skyrl_glm.bench.verify import compare_exact
from skyrl_glm.sync.plan import synchronize


def _roundtrip_proc(rank: int, opts_d: dict[str, Any], port: int, out_path: str) -> None:
    """One ``ours`` sync between two processes; the receiver compares every rebuilt public name with the sender's
    public tensor after SkyRL's alpha fold (``torch.equal`` semantics on raw bytes, name by name)."""
    from skyrl.backends.skyrl_train.distributed.megatron.lora_export import fold_lora_alpha_for_vllm

    from skyrl_glm.sync.receiver import AdapterReceiver

    opts = BenchOptions(**opts_d)
    with joined_pair(rank, opts, port, minutes=10) as (chan, transport):
        syn = synthetic_adapter(opts)
        if rank == 0:
            sender = Sender(opts, syn, transport)
            manifest_json, handle_json, info = sender.plan_and_stage("ours", 1)
            chan.put("m", manifest_json)
            chan.put("h", handle_json)
            sender.stream()
            answer = json.loads(chan.get("answer"))
            sender.release()
            Path(out_path).write_text(json.dumps({**answer, "sent_tensors": info["sent_tensors"]}))
        else:
            device = torch.device(opts.recv_device)
            t0 = time.perf_counter()
            got = AdapterReceiver(device).receive(chan.get("m"), json.loads(chan.get("h")), transport)
            synchronize(device)
            seconds = time.perf_counter() - t0
            # The sender's public adapter, regenerated from the seed, folded as SkyRL folds the public dict.
            public = {n: syn.unique[k].to(device) for n, k in syn.names.items()}
            expected = fold_lora_alpha_for_vllm(public, config_rank=opts.rank, alpha=opts.alpha)
            chan.put(
                "answer",
                json.dumps({**compare_exact(got.tensors, expected), "receive_s": seconds, "timings": got.timings}),
            )


def transfer_roundtrip(opts: BenchOptions) -> dict[str, Any]:
    """Move the synthetic adapter once through ``opts.transport`` between two spawned processes; the receiver's
    name-by-name bit-exact comparison with the folded public adapter (used by the transport tests)."""
    import torch.multiprocessing as mp

    opts = opts.resolved()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "roundtrip.json")
        mp.spawn(_roundtrip_proc, args=(asdict(opts), free_port(), out), nprocs=2, join=True)
        return json.loads(Path(out).read_text())
