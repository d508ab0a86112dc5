"""The benchmark's protocol: rounds of each path between a sender and a receiver (one process on the cpu
transport, two spawned processes on nccl/ipc), the disk baseline, and the JSON report.

What is measured and why: :mod:`skyrl_glm.bench.cli`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from skyrl_glm.bench.procs import LocalChannel, StoreChannel, free_port
from skyrl_glm.bench.report import PATH_LABELS, summarise
from skyrl_glm.bench.sides import Receiver, Sender
from skyrl_glm.bench.synthetic import BenchOptions, Synthetic, synthetic_adapter, values_device
from skyrl_glm.provenance import provenance
from skyrl_glm.sync.transports import COLLECTIVE, HOST_LOCAL, needs_group, open_transport

# ---------------------------------------------------------------------------------------------------- protocol


def _sender_round(sender: Sender, chan: Any, path: str, version: int, *, in_process: Receiver | None = None):
    manifest_json, handle_json, info = sender.plan_and_stage(path, version)
    if in_process is not None:  # cpu transport: the receiver reads what prepare staged
        answer = in_process.receive(path, manifest_json, handle_json)
        info["timings"]["stream_s"] = 0.0
    else:
        chan.put(f"{path}/{version}/manifest", manifest_json)
        chan.put(f"{path}/{version}/handle", handle_json)
        info["timings"]["stream_s"] = sender.stream()
        answer = json.loads(chan.get(f"{path}/{version}/answer"))
    sender.accepted(path)
    sender.release()
    return _combine(path, info, answer)


def _receiver_round(receiver: Receiver, chan: Any, path: str, version: int) -> None:
    manifest_json = chan.get(f"{path}/{version}/manifest")
    handle_json = chan.get(f"{path}/{version}/handle")
    chan.put(f"{path}/{version}/answer", json.dumps(receiver.receive(path, manifest_json, handle_json)))


def _combine(path: str, info: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    s, r = info["timings"], answer["timings"]
    stages = {
        "export": s.get("export_s"),  # bridge-stream: the exporter's own time, on the device
        "fold": s.get("fold_s"),
        # ours: exact dedup + its alias runs + the manifest that carries them
        "dedup": s.get("dedup_s", 0.0) + s.get("manifest_s", 0.0),
        "checksum": s.get("checksum_s"),
        # packing the sent tensors into the transport's buffer, staging, the wire, the receiver's copy
        "transfer": s.get("pack_s", 0.0) + s["stage_s"] + r["transfer_s"],
        "verify": r.get("verify_s"),
        "rebuild": r.get("rebuild_s"),
        "load": None,
    }
    return {
        "stages": stages,
        "sender": s,
        "receiver": r,
        "verified": answer["verified"],
        "receiver_peak_gpu_bytes": answer.get("receiver_peak_gpu_bytes"),
        **{k: v for k, v in info.items() if k != "timings"},
    }


def _disk(sender: Sender, chan: Any, receiver: Receiver | None, directory: Path) -> dict[str, Any]:
    saved = sender.disk_save(directory)
    if receiver is not None:
        answer = receiver.disk_load(saved["path"])
    else:
        chan.put("disk/path", saved["path"])
        answer = json.loads(chan.get("disk/answer"))
    s, r = saved["timings"], answer["timings"]
    return {
        "stages": {
            "export": s["export_s"],
            "fold": s["fold_s"],
            "dedup": None,
            "checksum": None,
            "transfer": s["save_s"] + r["load_s"],
            "verify": None,
            "rebuild": None,
            "load": None,
        },
        "sender": s,
        "receiver": r,
        "verified": answer["verified"],
        "sent_tensors": sender.public_count,
        "sent_bytes": sender.public_bytes,
        "file_bytes": saved["file_bytes"],
    }


def _rounds(opts: BenchOptions, one_round: Callable[[str, int], dict[str, Any] | None]) -> dict[str, list]:
    """Warm-up rounds (discarded), then ``repeat`` timed rounds of each in-memory path."""
    runs: dict[str, list] = {"skyrl": [], "ours": []}
    version = 0
    for i in range(opts.warmup + opts.repeat):
        for path in ("skyrl", "ours"):
            version += 1
            res = one_round(path, version)
            if res is not None and i >= opts.warmup:
                runs[path].append(res)
    return runs


def _sender_main(
    opts: BenchOptions, syn: Synthetic, transport: Any, chan: Any, receiver: Receiver | None, bridge: Any = None
):
    sender = Sender(opts, syn, transport, bridge)
    runs = _rounds(opts, lambda p, v: _sender_round(sender, chan, p, v, in_process=receiver))
    disk = None
    if opts.disk:
        directory = Path(opts.disk_dir or tempfile.mkdtemp(prefix="skyrl-glm-bench-"))
        try:
            disk = _disk(sender, chan, receiver, directory / "adapter")
        finally:
            shutil.rmtree(directory / "adapter", ignore_errors=True)
            if not opts.disk_dir:
                shutil.rmtree(directory, ignore_errors=True)
    return runs, disk


def _receiver_main(opts: BenchOptions, syn: Synthetic, transport: Any, chan: Any) -> None:
    receiver = Receiver(opts, syn, transport)
    _rounds(opts, lambda p, v: _receiver_round(receiver, chan, p, v))
    if opts.disk:
        answer = receiver.disk_load(chan.get("disk/path"))
        chan.put("disk/answer", json.dumps(answer))


@contextlib.contextmanager
def joined_pair(rank: int, opts: BenchOptions, port: int, minutes: int) -> Iterator[tuple[StoreChannel, Any]]:
    """Rank 0 (sender) and rank 1 (receiver): the JSON control channel and the transport, over a process group for
    the nccl/gloo transport (both ranks meet at a barrier when the body succeeds; the group is always destroyed)."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=_dt.timedelta(minutes=minutes))
    device = torch.device(opts.device if rank == 0 else opts.recv_device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    group = None
    if needs_group(opts.transport):
        backend = "nccl" if device.type == "cuda" else "gloo"
        kw = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank, world_size=2, **kw)
        group = dist.group.WORLD
    try:
        yield StoreChannel(store), open_transport(opts.transport, group)
        if group is not None:
            dist.barrier()
    finally:
        if group is not None:
            dist.destroy_process_group()


def _proc_main(rank: int, opts_d: dict[str, Any], port: int, out_path: str) -> None:
    opts = BenchOptions(**opts_d)
    with joined_pair(rank, opts, port, minutes=20) as (chan, transport):
        syn = synthetic_adapter(opts, device=values_device(opts, opts.device if rank == 0 else opts.recv_device))
        if rank == 0:
            runs, disk = _sender_main(opts, syn, transport, chan, None)
            Path(out_path).write_text(json.dumps({"runs": runs, "disk": disk}))
        else:
            _receiver_main(opts, syn, transport, chan)


def _machine(opts: BenchOptions) -> dict[str, Any]:
    """What :func:`~skyrl_glm.provenance.provenance` does not say: the host's size, and NCCL's version."""
    m: dict[str, Any] = {"host": platform.node(), "cpu_count": os.cpu_count(), "python": platform.python_version()}
    if opts.transport == COLLECTIVE and torch.cuda.is_available():
        m["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return m


def _load_skip_reason() -> str:
    if importlib.util.find_spec("vllm") is None:
        return "skipped: vLLM is not installed here"
    return (
        "skipped: a synthetic adapter has no base checkpoint for a vLLM engine to load it into "
        "(and vLLM's CPU build cannot apply routed-expert LoRA); `skyrl-glm bench load` measures it with a real "
        "engine and a tiny checkpoint"
    )


def run_sync_bench(opts: BenchOptions) -> dict[str, Any]:
    """Run the benchmark; return the JSON-able report."""
    opts = opts.resolved()
    t_start = time.perf_counter()
    bridge = None
    if opts.exporter == "bridge":  # the real export: one process (the model lives in the sender)
        from skyrl_glm.bench.bridge_model import BridgeModel

        bridge = BridgeModel(opts)
        syn = bridge.reference()
    else:  # one process draws the values for both sides; else each side draws its own, this one counts bytes
        syn = synthetic_adapter(
            opts, device=values_device(opts, opts.device) if opts.transport == HOST_LOCAL else "meta"
        )
    if opts.transport == HOST_LOCAL:
        transport = open_transport(HOST_LOCAL)
        receiver = Receiver(opts, syn, transport)
        runs, disk = _sender_main(opts, syn, transport, LocalChannel(), receiver, bridge)
        del receiver
    else:
        import torch.multiprocessing as mp

        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "sender.json")
            mp.spawn(_proc_main, args=(asdict(opts), free_port(), out), nprocs=2, join=True)
            res = json.loads(Path(out).read_text())
        runs, disk = res["runs"], res["disk"]
    unique_bytes = sum(t.numel() * t.element_size() for t in syn.unique.values())
    public_bytes = sum(syn.unique[k].numel() * syn.unique[k].element_size() for k in syn.names.values())
    paths = {p: summarise(p, runs[p]) for p in ("skyrl", "ours")}
    if disk is not None:
        paths["disk"] = {
            "label": PATH_LABELS["disk"],
            "stages_s": disk["stages"],
            "total_s": sum(v for v in disk["stages"].values() if v is not None),
            "sent_tensors": disk["sent_tensors"],
            "sent_bytes": disk["sent_bytes"],
            "file_bytes": disk["file_bytes"],
            "verified": disk["verified"],
            "bit_exact": disk["verified"]["bit_exact"],
            "runs": [disk],
        }
    return {
        "command": "skyrl-glm bench sync",
        **provenance(),
        "options": asdict(opts),
        "machine": _machine(opts),
        "adapter": {
            "model": opts.model,
            "config": opts.config,
            "layers": opts.layers,
            "targets": syn.targets,
            "public_tensors": len(syn.names),
            "public_bytes": public_bytes,
            "unique_tensors": len(syn.unique),
            "unique_bytes": unique_bytes,
            "exporter": f"{opts.exporter}, {'separate copies' if opts.copies else 'shared storage'}",
        },
        "paths": paths,
        "skipped": {"load": _load_skip_reason()},
        "wall_s": time.perf_counter() - t_start,
    }
