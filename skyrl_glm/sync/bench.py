"""``skyrl-glm bench sync``: SkyRL 0.4.0's LoRA sync, ours, and the disk baseline, side by side in one run.

A synthetic adapter in Megatron-Bridge's export shape (:func:`skyrl_glm.lora.bridge.bridge_export_specs`: every
routed expert name carries the layer's shared adapter, fused ``linear_fc1`` A under both gate and up) is built for a
registered model's full or tiny config, then moved three ways:

* ``skyrl``: SkyRL 0.4.0's in-memory path, in the order of its ``LoraAdapterSource.prepare`` (dedupe the export
  stream with ``dedupe_shared_expert_adapters``, then ``fold_lora_alpha_for_vllm`` over what is sent), the sent
  tensors over the same packed transport as ours (SkyRL hands them to vLLM's transfer engine, which this benchmark
  does not have), ``expand_lora_aliases`` on the receiver. No checksums, no verification.
* ``ours``: :func:`~skyrl_glm.sync.plan.build_plan` + a transport + :class:`~skyrl_glm.sync.receiver.AdapterReceiver`.
* ``disk``: SkyRL's file path: fold over the public dict, ``safetensors`` save of every public name, load back onto
  the receiver's device.

The receiver side checks, outside the timed stages, that every public name came back bit-exactly equal to the
sender's tensor after the alpha fold (it regenerates the synthetic values from the seed). The cpu transport runs
sender and receiver in one process; nccl and ipc use two processes (``torch.multiprocessing.spawn``) with a
``TCPStore`` as the JSON control channel. vLLM loading is not part of this command (there is no base model for a
synthetic adapter): the ``load`` stage is reported as skipped with the reason.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import os
import platform
import shutil
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

STAGES = ("fold", "dedup", "checksum", "transfer", "verify", "rebuild", "load")
PATHS = ("skyrl", "ours", "disk")
PATH_LABELS = {"skyrl": "SkyRL 0.4.0 (memory)", "ours": "skyrl-glm", "disk": "disk (safetensors)"}
PREFIX = "base_model.model."  # what SkyRL's Megatron source puts before Bridge's export names
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GB = 1e9


@dataclass
class BenchOptions:
    model: str = "glm-5.3"
    config: str = "tiny"  # tiny | full
    layers: int | None = None  # keep only this many MoE layers (after the leading dense ones)
    rank: int = 32
    alpha: float | None = None  # default 2 * rank, so the fold is not a no-op
    dtype: str = "bf16"
    share_experts: bool = True
    copies: bool = False
    transport: str = "cpu"
    device: str | None = None
    recv_device: str | None = None
    bucket_mb: int = 512
    seed: int = 0
    repeat: int = 1
    warmup: int = 1
    disk: bool = True
    disk_dir: str | None = None

    def resolved(self) -> BenchOptions:
        o = BenchOptions(**asdict(self))
        cuda = torch.cuda.is_available()
        if o.alpha is None:
            o.alpha = float(2 * o.rank)
        if o.device is None:
            o.device = "cuda:0" if cuda and o.transport != "cpu" else "cpu"
        if o.recv_device is None:
            if o.transport == "nccl" and o.device.startswith("cuda"):
                o.recv_device = "cuda:1" if torch.cuda.device_count() > 1 else "cuda:0"
            else:
                o.recv_device = o.device
        if o.transport == "ipc" and not (o.device.startswith("cuda") and o.recv_device.startswith("cuda")):
            raise SystemExit("--transport ipc needs CUDA devices (--device cuda:N)")
        if o.dtype not in DTYPES:
            raise SystemExit(f"--dtype must be one of {sorted(DTYPES)}")
        return o


# ----------------------------------------------------------------------------------------------- synthetic adapter


def model_config(model: str, config: str, layers: int | None) -> tuple[Any, Any]:
    """The registered family and its tiny or full HF config, cut to ``layers`` MoE layers when asked."""
    from skyrl_glm.plugins import registry

    family = registry().model(model)
    if config == "tiny":
        cfg = family.tiny_config()
    elif config == "full":
        cfg = importlib.import_module(family.tiny_config.__module__).full_config()
    else:
        raise SystemExit(f"--config must be tiny or full, got {config!r}")
    if layers is not None:
        from skyrl_glm.lora.bridge import _layer_is_moe

        moe_idx = [i for i, m in enumerate(_layer_is_moe(cfg)) if m]
        if not 0 < layers <= len(moe_idx):
            raise SystemExit(f"--layers must be in 1..{len(moe_idx)} for this config")
        keep = moe_idx[layers - 1] + 1
        for attr in ("mlp_layer_types", "layer_types"):
            if isinstance(getattr(cfg, attr, None), list):
                setattr(cfg, attr, getattr(cfg, attr)[:keep])
        cfg.num_hidden_layers = keep
    return family, cfg


@dataclass
class Synthetic:
    """The export's public names, which storage each one shows, and the unique values (on CPU)."""

    names: dict[str, str]  # public name -> storage key
    unique: dict[str, torch.Tensor]  # storage key -> value
    targets: list[str]
    n_experts: int


def synthetic_adapter(opts: BenchOptions) -> Synthetic:
    from skyrl_glm.lora.bridge import bridge_export_specs

    family, cfg = model_config(opts.model, opts.config, opts.layers)
    targets = family.lora.resolve(sampler="vllm")
    specs = bridge_export_specs(cfg, rank=opts.rank, targets=targets, share_expert_adapters=opts.share_experts)
    gen = torch.Generator().manual_seed(opts.seed)
    dtype = DTYPES[opts.dtype]
    unique: dict[str, torch.Tensor] = {}
    names: dict[str, str] = {}
    for s in specs:
        if s.storage not in unique:
            unique[s.storage] = (torch.randn(s.shape, generator=gen) * 0.02).to(dtype)
        names[PREFIX + s.name] = s.storage
    return Synthetic(names, unique, targets, int(getattr(cfg, "n_routed_experts", 0) or 0))


def adapter_config(opts: BenchOptions, targets: list[str]) -> dict[str, Any]:
    return {
        "peft_type": "LORA",
        "r": opts.rank,
        "lora_alpha": opts.alpha,
        "target_modules": sorted({t.split(".")[-1] for t in targets}),
        "bias": "none",
    }


def _is_b(key: str) -> bool:
    return key.endswith(".B") or key.endswith(".lora_B.weight")


def fold_value(t: torch.Tensor, scale: float) -> torch.Tensor:
    """SkyRL's ``fold_lora_alpha_for_vllm`` arithmetic for one lora_B (float32 multiply, cast back)."""
    return t if scale == 1 else (t.to(torch.float32) * scale).to(t.dtype)


def _sync(device: torch.device | str) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------------------------ verification


def verify_rebuilt(
    got: Mapping[str, torch.Tensor], syn: Synthetic, expected: Mapping[str, torch.Tensor]
) -> dict[str, Any]:
    """Every public name present, nothing extra, each value bit-exactly ``expected[storage]`` (already folded).

    Names that show the same view are compared once; the rest are stacked per storage (one comparison per storage
    key, one host sync at the end), so a 115k-name adapter is checked in well under a second on a GPU."""
    missing = sorted(set(syn.names) - set(got))
    extra = sorted(set(got) - set(syn.names))
    per_storage: dict[str, dict[tuple, torch.Tensor]] = {}
    for name, key in syn.names.items():
        t = got.get(name)
        if t is None:
            continue
        vk = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        per_storage.setdefault(key, {})[vk] = t
    oks: list[torch.Tensor] = []
    keys: list[str] = []
    bad_meta: list[str] = []
    for key, views in per_storage.items():
        exp = expected[key]
        vs = list(views.values())
        if any(v.shape != exp.shape or v.dtype != exp.dtype for v in vs):
            bad_meta.append(key)
            continue
        exp = exp.to(vs[0].device)
        for i in range(0, len(vs), 256):
            chunk = torch.stack(vs[i : i + 256])
            oks.append((chunk.view(chunk.shape[0], -1).view(torch.uint8) == exp.reshape(1, -1).view(torch.uint8)).all())
            keys.append(key)
    flags = torch.stack([o.to("cpu") for o in oks]).tolist() if oks else []
    mismatched = sorted({k for k, ok in zip(keys, flags, strict=True) if not ok} | set(bad_meta))
    distinct = sum(len(v) for v in per_storage.values())
    return {
        "public_names": len(syn.names),
        "received_names": len(got),
        "distinct_views": distinct,
        "missing": missing[:5],
        "n_missing": len(missing),
        "extra": extra[:5],
        "n_extra": len(extra),
        "mismatched_storages": mismatched[:5],
        "n_mismatched": len(mismatched),
        "bit_exact": not missing and not extra and not mismatched,
    }


# ---------------------------------------------------------------------------------------------- control channel


class _LocalChannel:
    def __init__(self) -> None:
        self._d: dict[str, str] = {}

    def put(self, key: str, value: str) -> None:
        self._d[key] = value

    def get(self, key: str) -> str:
        return self._d.pop(key)


class _StoreChannel:
    """JSON strings over a ``torch.distributed.TCPStore`` (plain bytes, never pickle)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    PIECE = 4 << 20  # the store refuses values over 8 MiB; a full GLM-5.3 manifest is ~17 MB

    def put(self, key: str, value: str) -> None:
        data = value.encode()
        pieces = [data[i : i + self.PIECE] for i in range(0, len(data), self.PIECE)] or [b""]
        for i, piece in enumerate(pieces):
            self.store.set(f"{key}/{i}", piece)
        self.store.set(f"{key}/n", str(len(pieces)).encode())  # last: a reader waiting on it sees every piece

    def get(self, key: str) -> str:
        n = int(self.store.get(f"{key}/n").decode())
        return b"".join(self.store.get(f"{key}/{i}") for i in range(n)).decode()


# ------------------------------------------------------------------------------------------------ sender, receiver


def make_transport(name: str, group: Any = None) -> Any:
    from skyrl_glm.plugins import registry

    cls = registry().transports[name]
    return cls(group=group, src=0) if name == "nccl" else cls()


class Sender:
    """The trainer side: holds the public adapter (shared storage or, with ``copies``, one copy per name)."""

    def __init__(self, opts: BenchOptions, syn: Synthetic, transport: Any) -> None:
        self.opts, self.syn, self.transport = opts, syn, transport
        self.device = torch.device(opts.device)
        on_dev = {k: v.to(self.device) for k, v in syn.unique.items()}
        self.public: dict[str, torch.Tensor] = {
            n: (on_dev[k].clone() if opts.copies else on_dev[k]) for n, k in syn.names.items()
        }
        del on_dev
        _sync(self.device)
        self.config = adapter_config(opts, syn.targets)
        self.plan: Any = None

    def _plan_skyrl(self, version: int) -> tuple[Any, dict[str, float]]:
        from skyrl.backends.skyrl_train.distributed.megatron.lora_export import (
            fold_lora_alpha_for_vllm,
            mark_alpha_folded,
        )
        from skyrl.backends.skyrl_train.weight_sync.lora_target import dedupe_shared_expert_adapters

        from skyrl_glm.sync.manifest import Manifest, TensorEntry, align, dtype_name
        from skyrl_glm.sync.plan import SyncPlan

        # What SkyRL's Megatron worker passes: one adapter per EP rank's experts (EP 1 here) when shared, else 1.
        span = max(1, self.syn.n_experts) if self.opts.share_experts else 1
        t0 = time.perf_counter()
        to_send, aliases = dedupe_shared_expert_adapters(iter(self.public.items()), span)
        _sync(self.device)
        t1 = time.perf_counter()
        folded = fold_lora_alpha_for_vllm(to_send, config_rank=self.opts.rank, alpha=self.opts.alpha)
        tensors = [t.contiguous() for t in folded.values()]
        _sync(self.device)
        t2 = time.perf_counter()
        entries, offset = [], 0
        for name, t in zip(folded, tensors, strict=True):
            nbytes = t.numel() * t.element_size()
            entries.append(TensorEntry(name, dtype_name(t.dtype), tuple(t.shape), offset, nbytes, ""))
            offset += align(nbytes)
        manifest = Manifest(
            version=version,
            lora_name="bench",
            adapter_config=mark_alpha_folded(dict(self.config)),
            tensors=tuple(entries),
            aliases=aliases,
            total_bytes=offset,
            bucket_bytes=self.opts.bucket_mb << 20,
        )
        public_bytes = sum(t.numel() * t.element_size() for t in self.public.values())
        plan = SyncPlan(manifest, tensors, len(self.public), public_bytes, {})
        return plan, {"dedup_s": t1 - t0, "fold_s": t2 - t1}

    def _plan_ours(self, version: int) -> tuple[Any, dict[str, float]]:
        from skyrl_glm.sync.plan import build_plan

        plan = build_plan(
            iter(self.public.items()),
            adapter_config=self.config,
            lora_name="bench",
            version=version,
            bucket_bytes=self.opts.bucket_mb << 20,
        )
        return plan, dict(plan.timings)

    def plan_and_stage(self, path: str, version: int) -> tuple[str, str, dict[str, Any]]:
        plan, timings = (self._plan_skyrl if path == "skyrl" else self._plan_ours)(version)
        t0 = time.perf_counter()
        handle = self.transport.prepare(plan)
        _sync(self.device)
        timings["stage_s"] = time.perf_counter() - t0
        self.plan = plan
        info = {
            "sent_tensors": len(plan.manifest.tensors),
            "sent_bytes": sum(e.nbytes for e in plan.manifest.tensors),
            "aliases": len(plan.manifest.aliases),
            "wire_bytes": plan.manifest.total_bytes,
            "buckets": len(plan.manifest.buckets()),
        }
        return plan.manifest.to_json(), json.dumps(handle), {"timings": timings, **info}

    def stream(self) -> float:
        t0 = time.perf_counter()
        self.transport.stream(self.plan)
        _sync(self.device)
        return time.perf_counter() - t0

    def release(self) -> None:
        self.transport.release()
        self.plan = None

    def disk_save(self, directory: Path) -> dict[str, Any]:
        from safetensors.torch import save_file
        from skyrl.backends.skyrl_train.distributed.megatron.lora_export import fold_lora_alpha_for_vllm

        t0 = time.perf_counter()
        folded = fold_lora_alpha_for_vllm(self.public, config_rank=self.opts.rank, alpha=self.opts.alpha)
        _sync(self.device)
        t1 = time.perf_counter()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "adapter_model.safetensors"
        # safetensors refuses shared storage: private contiguous CPU copies, as a PEFT save makes.
        save_file({k: v.detach().to("cpu", copy=True).contiguous() for k, v in folded.items()}, str(path))
        (directory / "adapter_config.json").write_text(json.dumps(self.config))
        t2 = time.perf_counter()
        del folded
        return {"path": str(path), "file_bytes": path.stat().st_size, "timings": {"fold_s": t1 - t0, "save_s": t2 - t1}}


class Receiver:
    """The sampler side: receives (ours: verified; skyrl: as SkyRL does) and checks the result bit for bit."""

    def __init__(self, opts: BenchOptions, syn: Synthetic, transport: Any) -> None:
        self.opts, self.syn, self.transport = opts, syn, transport
        self.device = torch.device(opts.recv_device)
        scale = opts.alpha / opts.rank
        self.expected = {
            k: fold_value(v.to(self.device), scale) if _is_b(k) else v.to(self.device) for k, v in syn.unique.items()
        }

    def receive(self, path: str, manifest_json: str, handle_json: str) -> dict[str, Any]:
        handle = json.loads(handle_json)
        if path == "ours":
            from skyrl_glm.sync.receiver import AdapterReceiver

            got = AdapterReceiver(self.device).receive(manifest_json, handle, self.transport)
            _sync(self.device)
            tensors, timings = got.tensors, dict(got.timings)
        else:
            from skyrl.backends.skyrl_train.weight_sync.lora_target import expand_lora_aliases

            from skyrl_glm.sync.manifest import DTYPES as WIRE_DTYPES
            from skyrl_glm.sync.manifest import Manifest

            t0 = time.perf_counter()
            manifest = Manifest.from_json(manifest_json)
            staging = torch.empty(manifest.total_bytes, dtype=torch.uint8, device=self.device)
            self.transport.receive(manifest, handle, staging)
            _sync(self.device)
            t1 = time.perf_counter()
            sent = {
                e.name: staging[e.offset : e.offset + e.nbytes].view(WIRE_DTYPES[e.dtype]).view(e.shape)
                for e in manifest.tensors
            }
            tensors = expand_lora_aliases(sent, manifest.aliases)
            timings = {"transfer_s": t1 - t0, "rebuild_s": time.perf_counter() - t1}
        return {"timings": timings, "verified": verify_rebuilt(tensors, self.syn, self.expected)}

    def disk_load(self, path: str) -> dict[str, Any]:
        from safetensors.torch import load_file

        t0 = time.perf_counter()
        tensors = load_file(path, device=str(self.device))
        _sync(self.device)
        t1 = time.perf_counter()
        return {"timings": {"load_s": t1 - t0}, "verified": verify_rebuilt(tensors, self.syn, self.expected)}


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
    sender.release()
    return _combine(path, info, answer)


def _receiver_round(receiver: Receiver, chan: Any, path: str, version: int) -> None:
    manifest_json = chan.get(f"{path}/{version}/manifest")
    handle_json = chan.get(f"{path}/{version}/handle")
    chan.put(f"{path}/{version}/answer", json.dumps(receiver.receive(path, manifest_json, handle_json)))


def _combine(path: str, info: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    s, r = info["timings"], answer["timings"]
    stages = {
        "fold": s.get("fold_s"),
        "dedup": s.get("dedup_s"),
        "checksum": s.get("checksum_s"),
        "transfer": s["stage_s"] + r["transfer_s"],
        "verify": r.get("verify_s"),
        "rebuild": r.get("rebuild_s"),
        "load": None,
    }
    return {
        "stages": stages,
        "sender": s,
        "receiver": r,
        "verified": answer["verified"],
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
        "sent_tensors": len(sender.public),
        "sent_bytes": sum(t.numel() * t.element_size() for t in sender.public.values()),
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


def _sender_main(opts: BenchOptions, syn: Synthetic, transport: Any, chan: Any, receiver: Receiver | None):
    sender = Sender(opts, syn, transport)
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join_pair(rank: int, opts: BenchOptions, port: int, minutes: int) -> tuple[_StoreChannel, Any, Any]:
    """Rank 0 (sender) and rank 1 (receiver): the JSON control channel, the process group (nccl/gloo transport
    only) and the transport."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=_dt.timedelta(minutes=minutes))
    device = torch.device(opts.device if rank == 0 else opts.recv_device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    group = None
    if opts.transport == "nccl":
        backend = "nccl" if device.type == "cuda" else "gloo"
        kw = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank, world_size=2, **kw)
        group = dist.group.WORLD
    return _StoreChannel(store), group, make_transport(opts.transport, group)


def _proc_main(rank: int, opts_d: dict[str, Any], port: int, out_path: str) -> None:
    import torch.distributed as dist

    opts = BenchOptions(**opts_d)
    chan, group, transport = _join_pair(rank, opts, port, minutes=20)
    syn = synthetic_adapter(opts)
    try:
        if rank == 0:
            runs, disk = _sender_main(opts, syn, transport, chan, None)
            Path(out_path).write_text(json.dumps({"runs": runs, "disk": disk}))
        else:
            _receiver_main(opts, syn, transport, chan)
        if group is not None:
            dist.barrier()
    finally:
        if group is not None:
            dist.destroy_process_group()


def _roundtrip_proc(rank: int, opts_d: dict[str, Any], port: int, out_path: str) -> None:
    """One ``ours`` sync between two processes; the receiver compares every rebuilt public name with the sender's
    public tensor after SkyRL's alpha fold (``torch.equal`` semantics on raw bytes, name by name)."""
    import torch.distributed as dist
    from skyrl.backends.skyrl_train.distributed.megatron.lora_export import fold_lora_alpha_for_vllm

    from skyrl_glm.sync.receiver import AdapterReceiver

    opts = BenchOptions(**opts_d)
    chan, group, transport = _join_pair(rank, opts, port, minutes=10)
    syn = synthetic_adapter(opts)
    try:
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
            _sync(device)
            seconds = time.perf_counter() - t0
            # The sender's public adapter, regenerated from the seed, folded as SkyRL folds the public dict.
            public = {n: syn.unique[k].to(device) for n, k in syn.names.items()}
            expected = fold_lora_alpha_for_vllm(public, config_rank=opts.rank, alpha=opts.alpha)
            names_ok = set(got.tensors) == set(expected)
            flags, names = [], []
            for n, exp in expected.items():
                t = got.tensors.get(n)
                if t is None or t.shape != exp.shape or t.dtype != exp.dtype:
                    continue
                flags.append(torch.equal(t.reshape(-1).view(torch.uint8), exp.reshape(-1).view(torch.uint8)))
                names.append(n)
            bad = [n for n, ok in zip(names, flags, strict=True) if not ok]
            chan.put(
                "answer",
                json.dumps(
                    {
                        "public_names": len(expected),
                        "received_names": len(got.tensors),
                        "compared": len(names),
                        "names_ok": names_ok,
                        "mismatched": bad[:5],
                        "bit_exact": names_ok and not bad and len(names) == len(expected),
                        "receive_s": seconds,
                        "timings": got.timings,
                    }
                ),
            )
        if group is not None:
            dist.barrier()
    finally:
        if group is not None:
            dist.destroy_process_group()


def transfer_roundtrip(opts: BenchOptions) -> dict[str, Any]:
    """Move the synthetic adapter once through ``opts.transport`` between two spawned processes; the receiver's
    name-by-name bit-exact comparison with the folded public adapter (used by the transport tests)."""
    import torch.multiprocessing as mp

    opts = opts.resolved()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "roundtrip.json")
        mp.spawn(_roundtrip_proc, args=(asdict(opts), _free_port(), out), nprocs=2, join=True)
        return json.loads(Path(out).read_text())


# ------------------------------------------------------------------------------------------------------ report


def _median(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _summarise(path: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    stages = {st: _median([r["stages"][st] for r in runs]) for st in STAGES}
    last = runs[-1]
    return {
        "label": PATH_LABELS[path],
        "stages_s": stages,
        "total_s": sum(v for v in stages.values() if v is not None),
        "sent_tensors": last["sent_tensors"],
        "sent_bytes": last["sent_bytes"],
        "verified": last["verified"],
        "bit_exact": all(r["verified"]["bit_exact"] for r in runs),
        "runs": runs,
    }


def _machine(opts: BenchOptions) -> dict[str, Any]:
    m: dict[str, Any] = {
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    try:
        from importlib.metadata import version

        m["skyrl"] = version("skyrl")
    except Exception:  # noqa: BLE001
        m["skyrl"] = None
    if torch.cuda.is_available():
        m["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        m["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if opts.transport == "nccl" else None
    return m


def _load_skip_reason() -> str:
    if importlib.util.find_spec("vllm") is None:
        return "skipped: vLLM is not installed here"
    return (
        "skipped: a synthetic adapter has no base checkpoint for a vLLM engine to load it into "
        "(and vLLM's CPU build cannot apply routed-expert LoRA); the in-memory vLLM load is covered by the "
        "sync integration tests, not by this command"
    )


def run_sync_bench(opts: BenchOptions) -> dict[str, Any]:
    """Run the benchmark; return the JSON-able report."""
    opts = opts.resolved()
    t_start = time.perf_counter()
    syn = synthetic_adapter(opts)
    if opts.transport == "cpu":
        transport = make_transport("cpu")
        receiver = Receiver(opts, syn, transport)
        runs, disk = _sender_main(opts, syn, transport, _LocalChannel(), receiver)
        del receiver
    else:
        import torch.multiprocessing as mp

        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "sender.json")
            mp.spawn(_proc_main, args=(asdict(opts), _free_port(), out), nprocs=2, join=True)
            res = json.loads(Path(out).read_text())
        runs, disk = res["runs"], res["disk"]
    unique_bytes = sum(t.numel() * t.element_size() for t in syn.unique.values())
    public_bytes = sum(syn.unique[k].numel() * syn.unique[k].element_size() for k in syn.names.values())
    paths = {p: _summarise(p, runs[p]) for p in ("skyrl", "ours")}
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
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
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
            "exporter": "separate copies" if opts.copies else "shared storage",
        },
        "paths": paths,
        "skipped": {"load": _load_skip_reason()},
        "wall_s": time.perf_counter() - t_start,
    }


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1e3:.1f} ms" if v < 10 else f"{v:.2f} s"


def print_report(report: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    a, paths = report["adapter"], report["paths"]
    o = report["options"]
    title = (
        f"LoRA sync: {a['model']} ({a['config']}{'' if a['layers'] is None else f', {a["layers"]} MoE layers'}), "
        f"rank {o['rank']}, {o['dtype']}, {a['exporter']}, transport {o['transport']} "
        f"({o['device']} -> {o['recv_device']})"
    )
    t = Table(title=title)
    t.add_column("stage")
    for p in paths:
        t.add_column(paths[p]["label"], justify="right")
    for st in STAGES:
        t.add_row(st, *(_fmt_s(paths[p]["stages_s"][st]) for p in paths))
    t.add_row("[bold]total[/]", *(f"[bold]{_fmt_s(paths[p]['total_s'])}[/]" for p in paths), end_section=True)
    t.add_row("public tensors", *(f"{a['public_tensors']:,}" for _ in paths))
    t.add_row("public GB", *(f"{a['public_bytes'] / GB:.3f}" for _ in paths))
    t.add_row("unique tensors", *(f"{a['unique_tensors']:,}" for _ in paths))
    t.add_row("unique GB", *(f"{a['unique_bytes'] / GB:.3f}" for _ in paths))
    t.add_row("sent tensors", *(f"{paths[p]['sent_tensors']:,}" for p in paths))
    t.add_row("sent GB", *(f"{paths[p]['sent_bytes'] / GB:.3f}" for p in paths))
    t.add_row(
        "rebuilt bit-exact",
        *(
            f"{'yes' if paths[p]['bit_exact'] else '[red]NO[/]'} ({paths[p]['verified']['received_names']:,} names)"
            for p in paths
        ),
    )
    console.print(t)
    if "disk" in paths:
        ours, disk = paths["ours"]["total_s"], paths["disk"]["total_s"]
        sk = paths["skyrl"]["total_s"]
        console.print(f"speed-up vs disk: skyrl-glm {disk / ours:.1f}x, SkyRL 0.4.0 memory path {disk / sk:.1f}x")
    console.print(f"load: {report['skipped']['load']}")


def plot_report(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = report["paths"]
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.7 * len(paths)))
    names = list(paths)
    left = [0.0] * len(names)
    for st in STAGES:
        vals = [(paths[p]["stages_s"][st] or 0.0) * 1e3 for p in names]
        if any(vals):
            ax.barh([paths[p]["label"] for p in names], vals, left=left, label=st)
            left = [x + v for x, v in zip(left, vals, strict=True)]
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlabel("ms (symlog)")
    a, o = report["adapter"], report["options"]
    ax.set_title(f"{a['model']} {a['config']} rank {o['rank']} {a['exporter']}, transport {o['transport']}")
    ax.legend(fontsize=8, ncol=4, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------------------- CLI


def _cmd_bench_sync(args: argparse.Namespace) -> int:
    opts = BenchOptions(
        model=args.model,
        config=args.config,
        layers=args.layers,
        rank=args.rank,
        alpha=args.alpha,
        dtype=args.dtype,
        share_experts=args.share_experts,
        copies=args.copies,
        transport=args.transport,
        device=args.device,
        recv_device=args.recv_device,
        bucket_mb=args.bucket_mb,
        seed=args.seed,
        repeat=args.repeat,
        warmup=args.warmup,
        disk=args.disk,
        disk_dir=args.disk_dir,
    )
    report = run_sync_bench(opts)
    print_report(report)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
    if args.plot:
        plot_report(report, args.plot)
    return 0 if all(p["bit_exact"] for p in report["paths"].values()) else 1


def add_parser(subparsers: Any) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks")
    sub = bench.add_subparsers(dest="bench_cmd", required=True)
    p = sub.add_parser(
        "sync",
        help="LoRA sync: SkyRL 0.4.0's path vs skyrl-glm's vs disk, one run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="glm-5.3", help="registered model family (default glm-5.3)")
    p.add_argument("--config", choices=("tiny", "full"), default="tiny")
    p.add_argument("--layers", type=int, default=None, help="keep only the first N MoE layers (fits a CPU)")
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--alpha", type=float, default=None, help="lora_alpha (default 2 * rank)")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument(
        "--share-experts",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="one adapter for all routed experts of a layer (Bridge share_expert_adapters)",
    )
    p.add_argument("--copies", action="store_true", help="exporter hands out a separate copy under every name")
    p.add_argument("--transport", choices=("cpu", "nccl", "ipc"), default="cpu")
    p.add_argument("--device", default=None, help="sender device (default cuda:0 for nccl/ipc when present, else cpu)")
    p.add_argument("--recv-device", default=None, help="receiver device (nccl: cuda:1; ipc/cpu: the sender's)")
    p.add_argument("--bucket-mb", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1, help="timed rounds per in-memory path (median reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--disk", action=argparse.BooleanOptionalAction, default=True, help="run the disk baseline")
    p.add_argument("--disk-dir", default=None, help="where the disk baseline writes (default a temp dir)")
    p.add_argument("--json", default=None, help="write the report as JSON")
    p.add_argument("--plot", default=None, help="write a PNG of the stage times (needs matplotlib)")
    p.set_defaults(func=_cmd_bench_sync)


def main(argv: list[str] | None = None) -> int:
    """``python -m skyrl_glm.sync.bench sync ...`` (the same command as ``skyrl-glm bench sync``)."""
    parser = argparse.ArgumentParser(prog="skyrl-glm bench")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["bench", *(argv if argv is not None else __import__("sys").argv[1:])])
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
