"""``skyrl-glm bench load --config full --layouts ...``: the routed experts' serving layouts side by side (GPU).

One engine per layout (its engine argument is fixed at start: :mod:`skyrl_glm.sync.expert_layout`), each serving a
config-only full-width GLM-5.3 with the largest ``--layers`` count of MoE layers (``load_format="dummy"``); on each,
rank-``--rank`` Megatron-Bridge-shaped adapters (one adapter per layer shared by its experts) covering the first
2, 4, ... MoE layers go over CUDA IPC, are received in the engine's layout, loaded, and timed to the first request
on the new version. Per update: ``receive_s`` (the worker RPC: transfer, verify, build the layout), ``load_s``
(``add_lora`` and the swap), ``request_s`` (the first request alone), ``repeat_s`` (the same request again, on the
adapter already active), ``activation_s`` (what the first request spent in vLLM's adapter switch, timed in the
worker: :meth:`SlotReport.skyrl_glm_bench_switch_times`; ``repeat_activation_s`` the repeat's) and
``to_first_request_s`` (from the publish to the first request's end); of the receive and the load, the worker's
own share (``receive_worker_s``: the receive call inside the worker, and of it the receiver's stages
``transfer_worker_s``, ``verify_worker_s`` (``verify_manifest_worker_s`` its part before any byte) and
``rebuild_worker_s``; ``load_worker_s``: vLLM's ``add_adapter`` there), the rest being the RPCs that carry them.
Each stage is fitted by least squares against the layer count (slope, intercept and residuals shown; the slope not
below zero) and read at GLM-5.3's 75 MoE layers.

Full-width routed experts take ~19 GB per MoE layer, so one H200 holds 6 of GLM-5.3's 75, and a fit from a few
layers multiplies their jitter out by 15 or more (measured: two runs' compositions 24 and 58 ms apart).
``--expert-width W`` narrows the experts' intermediate size alone (:func:`~skyrl_glm.bench.synthetic.model_config`):
every layer keeps its modules, its 256 experts and their names, the attention and the hidden width, so the engine
holds all 75 MoE layers and the per-layer work of the receive and the load (per name, per module, per slot) is
measured at 75 instead of fitted; the adapter's expert factors and slots shrink with the width (their bytes are in
the report: on the GPU they cost microseconds per layer). Slot memory at 75 is then not GLM-5.3's (left out).
(The engine holds the largest count, so a smaller adapter leaves some layers' slots to be zeroed when vLLM
activates it: a memset, left out of the slope.)

LoRA-slot memory is read from the engine: the bytes of the slot tensors vLLM allocated at start for ``max_loras``
adapters (:class:`SlotReport`, read-only), per resident adapter, routed experts apart; at 75 layers each part is
scaled by its layer count (every layer's slots have one shape). ``--sync-json`` (``bench sync --exporter
bridge-stream`` reports of the full model, one per expert grouping: ``--expert-groups G`` for ``grouped:G``) adds
the end-to-end rows at 75 layers: ours (each layout) is the sender side of the sync of the adapter it serves plus the
layout's engine-side receive, load and activation, against SkyRL 0.4.0's memory path (its whole sync, then its
per-expert names through the same loader). The
request itself is left out: on a few-layer engine it is tens of ms of fixed work whose spread exceeds its slope
(measured on one H200), so its fit says nothing of a 75-layer forward, which every request pays anyway.

``--profile-dir DIR``: each engine's worker profiles its updates (cProfile, ``DIR/<layout>.prof``): the receive's and
the load's Python on the engine's side, per function, which a profile of the bench's process cannot see. With
``--decode``, one more decode round per batch size and request kind runs under torch's profiler in the worker: the
GPU kernels' time, by kernel (the report's ``decode_kernels``: :meth:`SlotReport.skyrl_glm_bench_kernels`), which
tells what the adapter adds to a step on the GPU apart from the host's share.

A ``grouped:G`` layout serves an adapter shared by G groups of consecutive experts per layer (Megatron-Bridge's
``share_expert_adapters`` under EP G); the other layouts the one-per-layer adapter. ``max_loras``: resident
versions per engine (3 for asynchronous RL: the version in flight, the next, the one staging).

``decode`` (batch sizes): after its updates, each engine's greedy decode throughput (tokens/s, ``DECODE_TOKENS``
new tokens per sequence, CUDA graphs captured at those batch sizes alone: on one H200 an engine capturing vLLM's
default sizes took 76-116 s to start) at each batch size with the adapter active and without a LoRA request, the
median of ``DECODE_ROUNDS`` rounds taken in turn (one round each varied by up to half on one H200), and its
KV-cache capacity (what the slots left of the GPU's memory); the pseudo-layout ``none`` is an engine without LoRA,
the baseline.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from skyrl_glm.bench.full_width import NO_ADAPTER
from skyrl_glm.sync.transports import GPU_LOCAL, open_transport
from skyrl_glm.sync.vllm.worker import LoraSyncWorkerExtension

FULL_MOE_LAYERS = 75  # GLM-5.3: 78 layers, the first 3 dense
FULL_LAYERS = 78
# each update's stages; the table shows SHOWN, the worker's shares (the rest of a stage is its RPCs) a line after it
STAGES = (
    "receive_s",
    "receive_worker_s",
    "transfer_worker_s",
    "verify_worker_s",
    "verify_manifest_worker_s",
    "rebuild_worker_s",
    "load_s",
    "load_worker_s",
    "request_s",
    "repeat_s",
    "activation_s",
    "repeat_activation_s",
    "to_first_request_s",
)
SHOWN = tuple(s for s in STAGES if not s.endswith("_worker_s"))
# the receiver's own stages inside the worker's receive (its ``timings``), each kept as ``<stage>_worker_s``
RECEIVER_STAGES = ("transfer", "verify", "verify_manifest", "rebuild")
RPC_CALLS = 20  # no-op worker calls timed per engine (rpc_round_trip)
DECODE_TOKENS = 64  # new tokens per sequence in the decode measurement
DECODE_ROUNDS = 3  # timed rounds per batch size and request kind, after one untimed


_SWITCH_TIMES = "_skyrl_glm_switch_times"  # on the worker's LoRA manager: seconds per call of each CLOCKED method
CLOCKED = ("set_active_adapters", "add_adapter")
_PROFILE = "_skyrl_glm_bench_profile"  # on the worker: its running cProfile.Profile
_KERNELS = "_skyrl_glm_bench_kernels"  # on the worker: its running torch profiler
KERNELS_KEPT = 40  # kernels per profiled decode round in the report, by GPU time


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _clocked(call: Any, times: list[float]) -> Any:
    """``call``, each call's seconds (GPU work included) appended to ``times``."""

    def clocked(*args: Any, **kwargs: Any) -> Any:
        _synchronize()
        t0 = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            _synchronize()
            times.append(time.perf_counter() - t0)

    return clocked


class SlotReport(LoraSyncWorkerExtension):
    """The sync's worker extension plus the bench's own calls: the LoRA slot bytes (read only), the slot-write
    replay on or off, its counts with a comparison against vLLM's own writes, the adapter switch's clock and a
    profile of the worker."""

    def skyrl_glm_bench_slot_replay(self, on: bool) -> None:
        """Activate adapters by replaying recorded slot writes (``on``) or with vLLM's own loop."""
        from skyrl_glm.sync.vllm.slot_replay import state

        state(self.model_runner.lora_manager._adapter_manager).enabled = on

    def skyrl_glm_bench_replay_report(self, lora_id: int) -> dict[str, Any]:
        """The replay's counts so far and whether the slots of active adapter ``lora_id`` equal what vLLM's own
        loop writes for it (:func:`~skyrl_glm.sync.vllm.slot_replay.matches_vllm`: it rewrites them)."""
        from skyrl_glm.sync.vllm.slot_replay import matches_vllm, state

        manager = self.model_runner.lora_manager._adapter_manager
        return {**state(manager).counts, "matches_vllm": matches_vllm(manager, lora_id)}

    def skyrl_glm_bench_switch_times(self, keep: bool = True) -> dict[str, list[float]]:
        """Seconds of each call of the worker's LoRA manager's ``set_active_adapters`` and ``add_adapter`` since the
        last read, GPU work included (the first read starts the clock; ``keep=False`` stops it: it synchronizes the
        GPU twice a call). The model runner calls ``set_active_adapters`` before every step: it puts the step's
        adapters in slots if they are not there and hands the kernels the step's token-to-slot mapping, so on the
        first request after a swap it holds all that the new version costs that request (the load already put it in
        a slot: ``add_adapter`` loads and activates, and is the worker's share of the load)."""
        manager = self.model_runner.lora_manager
        if not keep:
            for method in CLOCKED:
                manager.__dict__.pop(method, None)  # vLLM's method again
            return manager.__dict__.pop(_SWITCH_TIMES, {})
        times = manager.__dict__.get(_SWITCH_TIMES)
        if times is None:
            times = manager.__dict__[_SWITCH_TIMES] = {method: [] for method in CLOCKED}
            for method in CLOCKED:
                setattr(manager, method, _clocked(getattr(manager, method), times[method]))
        read = {method: list(t) for method, t in times.items()}
        for t in times.values():
            t.clear()
        return read

    def skyrl_glm_bench_profile(self, path: str | None) -> bool:
        """Start profiling this worker's Python (``path`` None), or stop and write the stats to ``path`` (pstats
        format; False if none was running): what the receive, the load and the steps spend per function on the
        engine's side, which a profile of the bench's process cannot see (the engine runs in its own)."""
        import cProfile

        running = self.__dict__.pop(_PROFILE, None)
        if running is not None:
            running.disable()
        if path is None:
            profile = self.__dict__[_PROFILE] = cProfile.Profile()
            profile.enable()
            return True
        if running is None:
            return False
        running.dump_stats(path)
        return True

    def skyrl_glm_bench_kernels(self, start: bool) -> dict[str, Any] | None:
        """Start torch's profiler of this worker's GPU kernels (``start``), or stop it and return their GPU time:
        the total, the kernel count and the :data:`KERNELS_KEPT` kernels that took most (name, calls, seconds); None
        when none was running. Kernels that CUDA graphs replay are counted one by one."""
        from torch.profiler import ProfilerActivity, profile

        running = self.__dict__.pop(_KERNELS, None)
        if start:
            if running is not None:
                running.__exit__(None, None, None)
            activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * torch.cuda.is_available()
            running = self.__dict__[_KERNELS] = profile(activities=activities)
            running.__enter__()
            return None
        if running is None:
            return None
        _synchronize()
        running.__exit__(None, None, None)
        kernels = [
            (e.key, int(e.count), e.self_device_time_total / 1e6)
            for e in running.key_averages()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.self_device_time_total > 0
        ]
        kernels.sort(key=lambda k: -k[2])
        return {
            "gpu_s": sum(k[2] for k in kernels),
            "kernel_calls": sum(k[1] for k in kernels),
            "top": [{"kernel": name[:160], "calls": calls, "s": s} for name, calls, s in kernels[:KERNELS_KEPT]],
        }

    def skyrl_glm_bench_lora_slots(self) -> dict[str, int]:
        """Bytes of every LoRA slot tensor vLLM allocated at start (each storage once), routed experts apart."""
        manager = self.model_runner.lora_manager._adapter_manager
        seen: set[int] = set()
        out = {"routed_experts": 0, "other": 0, "max_loras": int(manager.lora_config.max_loras)}
        for name, module in manager.modules.items():
            kind = "routed_experts" if name.endswith(".experts") else "other"
            for key, value in vars(module).items():
                if "lora" not in key:
                    continue
                for t in value if isinstance(value, list | tuple) else (value,):
                    if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                        seen.add(t.untyped_storage().data_ptr())
                        out[kind] += t.untyped_storage().nbytes()
        return out


def fit_line(xs: list[int], ys: list[float], at: int) -> dict[str, Any]:
    """Least-squares ``y = slope * x + intercept`` with its residuals and its value at ``at`` (two points: exact),
    the slope held at zero or above: a stage's work per layer cannot be negative, so a falling line is jitter on
    flat work (measured on one H200: a flat ~5 ms load fitted to -6 ms at 75 layers) and reads as the mean
    (``held``: True)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    held = slope < 0
    slope = max(slope, 0.0)
    intercept = my - slope * mx
    return {
        "slope": slope,
        "intercept": intercept,
        "held": held,
        "residuals": [y - (slope * x + intercept) for x, y in zip(xs, ys, strict=True)],
        "at": at,
        "value": slope * at + intercept,
    }


def slots_at_full_size(slots: dict[str, int], moe_layers: int, layers: int) -> int:
    """Slot bytes per resident adapter at GLM-5.3's size: each part scaled from the engine's layer counts."""
    per_adapter = {k: slots[k] / slots["max_loras"] for k in ("routed_experts", "other")}
    return round(
        per_adapter["routed_experts"] / moe_layers * FULL_MOE_LAYERS + per_adapter["other"] / layers * FULL_LAYERS
    )


def _engine(
    model_dir: Path, family: Any, targets: list[str], layout: str, rank: int, max_loras: int, decode: list[int] | None
) -> Any:
    """A layout's engine (``decode``: CUDA graphs on, captured at these batch sizes); ``none``: LoRA off."""
    from skyrl_glm.check.scorers import _engine_lora_rank
    from skyrl_glm.sync.expert_layout import engine_arguments
    from skyrl_glm.sync.vllm.engine import VllmEngineSampler

    engine = {
        "model": str(model_dir),
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "worker_extension_cls": f"{__name__}.SlotReport",
        "max_loras": max_loras,
        "max_cpu_loras": max(3, max_loras),
        "enforce_eager": not decode,
    }
    if decode:
        engine.update(max_num_seqs=max(decode), compilation_config={"cudagraph_capture_sizes": sorted(set(decode))})
    if layout == NO_ADAPTER:
        engine["enable_lora"] = False
    else:
        engine.update(lora_target_modules=family.lora.vllm_modules(targets), **engine_arguments(layout))
    return VllmEngineSampler(engine, max_lora_rank=_engine_lora_rank(rank))


def decode_throughput(
    sampler: Any, batches: list[int], loras: dict[str, Any], kernels: dict[str, Any] | None = None
) -> dict[str, dict[str, float]]:
    """Greedy decode tokens/s per request kind (``loras``: label -> LoRA request, None for the base model) and batch
    size: ``batch`` sequences of a 4-token prompt, :data:`DECODE_TOKENS` new tokens each, EOS ignored; one untimed
    round of each kind, then :data:`DECODE_ROUNDS` rounds with the kinds in turn, the median kept. ``generate``
    returns once every sequence is done, so its wall time is the decode's. ``kernels`` (a dict to fill): per kind
    and batch, one more round's GPU kernels in the worker (:meth:`SlotReport.skyrl_glm_bench_kernels`) with its
    ``wall_s`` under the profiler."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=DECODE_TOKENS, temperature=0.0, ignore_eos=True, detokenize=False)
    out: dict[str, dict[str, float]] = {label: {} for label in loras}
    for batch in batches:
        prompts = [{"prompt_token_ids": [1 + i % 97, 2, 3, 4]} for i in range(batch)]
        rates: dict[str, list[float]] = {label: [] for label in loras}
        for timed in [False] + [True] * DECODE_ROUNDS:
            for label, lora in loras.items():
                t0 = time.perf_counter()
                sampler.llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
                if timed:
                    rates[label].append(batch * DECODE_TOKENS / (time.perf_counter() - t0))
        for label, got in rates.items():
            out[label][str(batch)] = statistics.median(got)
        if kernels is not None:
            for label, lora in loras.items():
                sampler.llm.collective_rpc("skyrl_glm_bench_kernels", args=(True,))
                t0 = time.perf_counter()
                sampler.llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
                wall = time.perf_counter() - t0
                got = sampler.llm.collective_rpc("skyrl_glm_bench_kernels", args=(False,))[0]
                kernels.setdefault(label, {})[str(batch)] = {"wall_s": wall, **got}
    return out


def kv_cache_tokens(sampler: Any) -> int | None:
    """Tokens the engine's KV cache holds (its blocks times the block size), as the engine reported them."""
    cache = sampler.llm.llm_engine.vllm_config.cache_config
    blocks = cache.num_gpu_blocks
    return None if blocks is None else int(blocks) * int(cache.block_size)


# How an update's adapter is written into vLLM's LoRA slots, alternated per update: the product's replay of
# recorded writes (:mod:`skyrl_glm.sync.vllm.slot_replay`) and vLLM's own per-module loop.
WRITES = ("replay", "vllm")


def _updates(
    sampler: Any,
    adapters: dict[int, Any],
    rank: int,
    rounds: int,
    warmup: int,
    version: int,
    profile: Path | None = None,
    progress: Callable[[str], None] = lambda line: None,
    layout: str = "",
) -> tuple[dict[str, dict[int, list[dict[str, float]]]], list[dict[str, Any]], int]:
    """Per slot-write path and layer count: every timed update's stages (each path's first ``warmup`` dropped); the
    replay's report after each replayed update; ``version``: the last one used. ``profile``: where the worker writes
    its profile of all of them (:meth:`SlotReport.skyrl_glm_bench_profile`). ``progress`` gets a line per update,
    named by ``layout`` (a run stopped at a budget then shows how far its updates got and what each took)."""
    from skyrl_glm.bench.full_width import publish_to_first_request
    from skyrl_glm.lora.bridge import adapter_config
    from skyrl_glm.sync.publisher import InMemoryPublisher

    transport = open_transport(GPU_LOCAL)
    publisher = InMemoryPublisher(sampler, transport, shared_storage=True)

    def switch_clock() -> dict[str, float]:
        return {k: sum(v) for k, v in sampler.llm.collective_rpc("skyrl_glm_bench_switch_times")[0].items()}

    rows: dict[str, dict[int, list[dict[str, float]]]] = {path: {} for path in WRITES}
    checks: list[dict[str, Any]] = []
    if profile is not None:
        sampler.llm.collective_rpc("skyrl_glm_bench_profile", args=(None,))
    try:
        for layers, adapter in adapters.items():
            config = adapter_config(rank, 2 * rank, adapter.targets)
            for i in range(warmup + rounds):
                for path in WRITES:
                    sampler.llm.collective_rpc("skyrl_glm_bench_slot_replay", args=(path == "replay",))
                    version += 1
                    served = publish_to_first_request(
                        sampler, publisher, adapter.tensors, config, version, switch_clock=switch_clock
                    )
                    progress(
                        f"{layout}: update {i + 1} of {warmup + rounds} at {layers} MoE layers, {path} writes: "
                        f"{served.first_s * 1e3:.1f} ms to the first request"
                    )
                    if path == "replay":
                        report = sampler.llm.collective_rpc(
                            "skyrl_glm_bench_replay_report", args=(sampler.adapter.lora_int_id,)
                        )[0]
                        checks.append({"layers": layers, "version": version, **report})
                    if i >= warmup:
                        t = served.result.timings
                        rows[path].setdefault(layers, []).append(
                            {
                                "receive_s": t["receive_rpc_s"],
                                "receive_worker_s": t["worker_s"],
                                **{f"{st}_worker_s": t[f"{st}_s"] for st in RECEIVER_STAGES},
                                "load_s": t["load_s"],
                                "load_worker_s": served.add_s,
                                "request_s": served.first_s - served.published_s,
                                "repeat_s": served.repeat_s,
                                "activation_s": served.switch_s,
                                "repeat_activation_s": served.repeat_switch_s,
                                "to_first_request_s": served.first_s,
                            }
                        )
    finally:
        transport.release()
        sampler.llm.collective_rpc("skyrl_glm_bench_switch_times", args=(False,))  # the decode runs without it
        if profile is not None:
            sampler.llm.collective_rpc("skyrl_glm_bench_profile", args=(str(profile),))
    return rows, checks, version


def rpc_round_trip(sampler: Any, calls: int = RPC_CALLS) -> float:
    """The median seconds of a worker call that does nothing (``skyrl_glm_staged``, signed as every sync call):
    what each RPC of an update pays to reach the worker and back, whatever it carries."""
    from skyrl_glm.sync.vllm.control import signed

    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        sampler.llm.collective_rpc("skyrl_glm_staged", args=signed("skyrl_glm_staged", ()))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _stages(rows: dict[int, list[dict[str, float]]]) -> dict[str, Any]:
    """Per layer count the medians of each stage, their fits read at 75 layers, and the rows."""
    medians = {k: {st: statistics.median(r[st] for r in rs) for st in STAGES} for k, rs in rows.items()}
    xs = sorted(medians)
    return {
        "medians_s": {str(k): v for k, v in medians.items()},
        "fit_75": {st: fit_line(xs, [medians[k][st] for k in xs], FULL_MOE_LAYERS) for st in STAGES},
        "runs": {str(k): v for k, v in rows.items()},
    }


class Adapter(NamedTuple):
    """One layer count's adapter: its public tensors on the GPU (names aliasing the unique ones), its targets, and
    the bytes of its unique tensors."""

    tensors: dict[str, torch.Tensor]
    targets: list[str]
    unique_bytes: int


def _adapters(layers: list[int], rank: int, groups: int, expert_width: int | None) -> dict[int, Adapter]:
    """Per layer count: the public tensors (on the GPU), the targets and the unique bytes of an adapter shared by
    ``groups`` groups of consecutive experts per layer (experts of ``expert_width``, None: the model's)."""
    from skyrl_glm.bench.synthetic import BenchOptions, synthetic_adapter

    adapters = {}
    for k in sorted(layers):
        opts = BenchOptions(model="glm-5.3", config="full", layers=k, rank=rank, expert_groups=groups)
        syn = synthetic_adapter(opts, expert_width, device="cuda")
        unique = syn.unique
        unique_bytes = sum(t.numel() * t.element_size() for t in unique.values())
        adapters[k] = Adapter({name: unique[key] for name, key in syn.names.items()}, syn.targets, unique_bytes)
    return adapters


def run_layout_bench(
    layers: list[int],
    layouts: list[str],
    rounds: int,
    warmup: int,
    rank: int,
    syncs: list[dict[str, Any]] | None = None,
    max_loras: int = 2,
    decode: list[int] | None = None,
    progress: Callable[[str], None] = lambda line: None,
    after_layout: Callable[[dict[str, Any]], None] = lambda report: None,
    expert_width: int | None = None,
    profile_dir: Path | None = None,
) -> dict[str, Any]:
    """Every layout on its own engine, every layer count on each; see the module docstring. ``progress`` gets one
    phase line per wait (:mod:`skyrl_glm.phases`); ``after_layout`` the report so far (``complete`` false) after each
    layout, so a run stopped midway keeps what it measured. ``profile_dir``: each engine's worker writes its profile
    of the updates there (``<layout>.prof``, pstats format)."""
    from skyrl_glm.bench.full_width import full_width_model
    from skyrl_glm.plugins import registry
    from skyrl_glm.provenance import provenance
    from skyrl_glm.sync.expert_layout import expert_groups

    family = registry().model("glm-5.3")
    by_groups: dict[int, dict[int, Any]] = {}
    engine_layers = max(layers)
    results: dict[str, Any] = {}
    decode_flag = f" --decode {','.join(map(str, decode))}" if decode else ""
    width_flag = f" --expert-width {expert_width}" if expert_width else ""
    report: dict[str, Any] = {
        "command": f"skyrl-glm bench load --device cuda --config full --layers {','.join(map(str, layers))} "
        f"--layouts {','.join(layouts)} --rank {rank} --max-loras {max_loras}{decode_flag}{width_flag}",
        "complete": False,
        "model": "glm-5.3",
        "engine_moe_layers": engine_layers,
        "expert_width": expert_width,  # None: GLM-5.3's own (2048)
        "layers": sorted(layers),
        "rank": rank,
        "rounds": rounds,
        "warmup": warmup,
        "max_loras": max_loras,
        "decode_batches": decode or [],
        "decode_new_tokens": DECODE_TOKENS if decode else None,
        "layouts": results,
        **provenance(),
    }
    with tempfile.TemporaryDirectory(prefix="skyrl-glm-bench-layouts-") as tmp:
        progress(f"full-width GLM-5.3 with {engine_layers} MoE layers (config only) ...")
        model_dir = full_width_model(Path(tmp) / "model", engine_layers, expert_width)
        progress("model written")
        version = 0
        grouping = [1 if layout == NO_ADAPTER else expert_groups(layout) or 1 for layout in layouts]
        for i, (layout, groups) in enumerate(zip(layouts, grouping, strict=True)):
            for done in set(by_groups) - set(grouping[i:]):  # on the GPU beside every later engine: let them go
                del by_groups[done]
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            if groups not in by_groups:
                progress(f"{layout}: rank-{rank} adapters of {groups} expert group(s) per layer on the GPU ...")
                by_groups[groups] = _adapters(layers, rank, groups, expert_width)
                progress(f"{layout}: adapters ready")
            adapters = by_groups[groups]
            report.setdefault("targets", adapters[engine_layers].targets)  # the same targets at every grouping
            progress(f"{layout}: starting its engine ...")
            t0 = time.perf_counter()
            try:
                sampler = _engine(model_dir, family, adapters[engine_layers].targets, layout, rank, max_loras, decode)
            except Exception as e:  # noqa: BLE001 - an engine that does not start (memory) is a result here
                results[layout] = {"started": False, "reason": f"{type(e).__name__}: {e}"[:300]}
                progress(f"{layout}: the engine did not start ({results[layout]['reason'][:120]})")
                after_layout(report)
                continue
            try:
                engine_s = time.perf_counter() - t0
                progress(f"{layout}: engine up")
                results[layout] = {
                    "started": True,
                    "engine_start_s": engine_s,
                    "expert_groups": groups,
                    "adapter_unique_bytes": {str(k): a.unique_bytes for k, a in adapters.items()},
                }
                if decode:
                    results[layout]["kv_cache_tokens"] = kv_cache_tokens(sampler)
                if layout == NO_ADAPTER:
                    if decode:
                        progress(f"{layout}: decode at batch {','.join(map(str, decode))} ...")
                        results[layout]["decode_tokens_per_s"] = decode_throughput(
                            sampler, decode, {"base": None}, _kernels(results[layout], profile_dir)
                        )
                        progress(f"{layout}: decode measured")
                    after_layout(report)
                    continue
                slots = sampler.llm.collective_rpc("skyrl_glm_bench_lora_slots")[0]
                results[layout]["rpc_round_trip_s"] = rpc_round_trip(sampler)
                counts = f"{len(adapters)} layer count(s)"
                progress(f"{layout}: {warmup + rounds} updates per slot-write path at each of {counts} ...")
                profile = None if profile_dir is None else profile_dir / f"{layout.replace(':', '_')}.prof"
                by_path, replay_checks, version = _updates(
                    sampler, adapters, rank, rounds, warmup, version, profile, progress, layout
                )
                if profile is not None:
                    results[layout]["profile"] = str(profile)
                progress(f"{layout}: updates timed")
                if decode:
                    progress(f"{layout}: decode at batch {','.join(map(str, decode))}, adapter on and off ...")
                    kinds = {"adapter": sampler.adapter, "base": None}
                    results[layout]["decode_tokens_per_s"] = decode_throughput(
                        sampler, decode, kinds, _kernels(results[layout], profile_dir)
                    )
                    progress(f"{layout}: decode measured")
            finally:
                sampler.close()
            results[layout].update(
                {
                    "slots": slots,
                    "slot_bytes_per_adapter": (slots["routed_experts"] + slots["other"]) / slots["max_loras"],
                    # narrowed experts have narrower slots: no GLM-5.3 figure from them
                    "slot_bytes_per_adapter_at_75": None
                    if expert_width
                    else slots_at_full_size(slots, engine_layers, engine_layers + 3),
                    **_stages(by_path["replay"]),
                    "vllm_slot_writes": _stages(by_path["vllm"]),
                    "replay_checks": replay_checks,
                }
            )
            after_layout(report)
    report["complete"] = True
    if syncs:
        report["end_to_end_75"] = end_to_end(report, syncs)
    return report


def _kernels(result: dict[str, Any], profile_dir: Path | None) -> dict[str, Any] | None:
    """Where a layout's decode kernels go in its report when the run profiles (``--profile-dir``), else None."""
    return None if profile_dir is None else result.setdefault("decode_kernels", {})


def sync_groups(sync: dict[str, Any]) -> int:
    """The expert groups per layer of a ``bench sync`` report's adapter (1: one adapter per layer; a report from
    before the option: 1)."""
    return int((sync.get("options") or {}).get("expert_groups") or 1)


def end_to_end(report: dict[str, Any], syncs: list[dict[str, Any]]) -> dict[str, Any]:
    """The handoff at 75 layers: ours in each layout that ran is the sync's sender side (a ``bench sync`` report at
    full size of the adapter the layout serves: ``grouped:G`` the one of ``--expert-groups G``, every other layout
    the one-per-layer adapter's; less its receiver's stages), the layout's engine-side receive and load (as
    measured where the engine served 75 MoE layers, else fitted) and activation; SkyRL 0.4.0's memory path is its
    whole sync of the one-per-layer adapter plus the per-expert load and activation (its receiver is its own). A
    layout whose adapter no report sent gets no row (``no_sync``): a sender of another adapter would misstate it.

    The activation is what the first request on the new version spent in vLLM's adapter switch, timed inside the
    worker (the load already put the adapter in its slots: ``LRUCacheWorkerLoRAManager.add_adapter`` activates it),
    as measured where the engine served 75 layers, else the median over the measured counts (it has no per-layer
    part, and a fit of a few layers multiplies its jitter). It was the first request's time less the repeat's,
    which on a 75-layer engine read anything from -113 to +76 ms: a one-token request there takes 0.3-0.6 s and
    varies by up to 0.1 s from one to the next (measured on one H200)."""
    by_groups = {sync_groups(s): s for s in syncs}

    def at_75(layout: str, stage: str) -> float | None:
        """The stage at 75 layers: as measured where the engine served 75, else its fit (the activation: the median
        of the measured counts); None where the layout's engine did not run."""
        r = report["layouts"].get(layout, {})
        if "fit_75" not in r:
            return None
        if measured := r["medians_s"].get(str(FULL_MOE_LAYERS)):
            return measured[stage]
        if stage == "activation_s":
            return statistics.median(m[stage] for m in r["medians_s"].values())
        return r["fit_75"][stage]["value"]

    def sender(sync: dict[str, Any]) -> float:
        """The median over the sync's timed rounds of its sender's own stages (export, dedup, fold, pack, checksum,
        manifest, staging); its receiver's (another process, rebuilding per-expert names) give way to the layout's
        engine-side receive. Not its total less the report's ``transfer`` stage: that holds the sender's pack too."""
        runs = sync["paths"]["ours"]["runs"]
        return statistics.median(sum(v for k, v in r["sender"].items() if k.endswith("_s") and v) for r in runs)

    rows, no_sync = {}, []
    for layout, r in report["layouts"].items():
        if (load := at_75(layout, "load_s")) is None:
            continue
        sync = by_groups.get(int(r.get("expert_groups") or 1))  # 1 for every layout but grouped:G
        if sync is None:
            no_sync.append(layout)
            continue
        rows[f"skyrl-glm, {layout}"] = {
            "sync_sender_s": sender(sync),
            "receive_s": at_75(layout, "receive_s"),
            "load_and_activation_s": load + at_75(layout, "activation_s"),
            "sync_expert_groups": sync_groups(sync),
            "engine_at_75": "measured" if str(FULL_MOE_LAYERS) in r["medians_s"] else "fit",
        }
    one = by_groups.get(1)
    if (load := at_75("per-expert", "load_s")) is not None and one is not None and "skyrl" in one["paths"]:
        rows["SkyRL 0.4.0 memory path, per-expert"] = {
            "sync_sender_s": one["paths"]["skyrl"]["total_s"],
            "receive_s": None,  # inside its sync
            "load_and_activation_s": load + at_75("per-expert", "activation_s"),
            "sync_expert_groups": 1,
        }
    for row in rows.values():
        row["total_s"] = row["sync_sender_s"] + (row["receive_s"] or 0.0) + row["load_and_activation_s"]
    syncs_made = [
        {"expert_groups": g, "command": s.get("command"), "commit": s.get("commit")} for g, s in by_groups.items()
    ]
    return {"syncs": syncs_made, "rows": rows, "no_sync": no_sync}


def print_layout_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    width = f" (experts {report['expert_width']} wide)" if report.get("expert_width") else ""
    table = Table(
        title=f"routed-expert layouts: full-width GLM-5.3, rank {report['rank']}, engine of "
        f"{report['engine_moe_layers']} MoE layers{width}, max_loras {report['max_loras']}; "
        f"median of {report['rounds']}"
    )
    inside: list[str] = []  # the worker's share of the receive and the load, per layout and layer count
    for col in ("layout", "MoE layers", *(s.removesuffix("_s") for s in SHOWN)):
        table.add_column(col, justify="right")
    for layout, r in report["layouts"].items():
        if not r["started"]:
            table.add_row(layout, "-", f"engine did not start: {r['reason'][:60]}", "", "", "")
            continue
        if "medians_s" not in r:  # the no-adapter baseline
            continue
        for label, stages in ((layout, r), (f"{layout}, vLLM's writes", r.get("vllm_slot_writes"))):
            if not stages:  # a report from before the replay
                continue
            for k, med in stages["medians_s"].items():
                table.add_row(label, k, *(f"{med[s] * 1e3:.1f} ms" for s in SHOWN))
                inside.append(
                    f"{label} at {k}: receive {med['receive_worker_s'] * 1e3:.1f} of {med['receive_s'] * 1e3:.1f} ms, "
                    f"load {med['load_worker_s'] * 1e3:.1f} of {med['load_s'] * 1e3:.1f} ms"
                    + "".join(
                        f", {st} {med[f'{st}_worker_s'] * 1e3:.1f}"
                        for st in RECEIVER_STAGES
                        if f"{st}_worker_s" in med  # a report from before they were kept has none
                    )
                )
            fit = stages["fit_75"]
            # a fit held flat (its slope was below zero: jitter on flat work) says so
            cells = (f"{fit[s]['value'] * 1e3:.0f} ms" + (" (flat)" if fit[s].get("held") else "") for s in SHOWN)
            table.add_row(label, "75 (fit)", *cells)
            worst = max(abs(e) for s in SHOWN for e in fit[s]["residuals"])
            table.add_row(label, "residual", *(f"max {worst * 1e3:.2f} ms" if s == SHOWN[0] else "" for s in SHOWN))
    console.print(table)
    if inside:
        console.print("inside the worker (the rest is the RPCs'): " + "; ".join(inside))
    trips = [
        f"{k} {r['rpc_round_trip_s'] * 1e3:.2f} ms" for k, r in report["layouts"].items() if "rpc_round_trip_s" in r
    ]
    if trips:
        console.print("a worker call that does nothing, round trip (median of " + f"{RPC_CALLS}): " + ", ".join(trips))
    for layout, r in report["layouts"].items():
        if checks := r.get("replay_checks"):
            last, equal = checks[-1], sum(c["matches_vllm"] for c in checks)
            console.print(
                f"{layout}: slot writes recorded {last['recorded']}, replayed {last['replayed']}, refused "
                f"{last['refused']}; after each replayed update the slots equal vLLM's own writes in {equal} of "
                f"{len(checks)}"
            )
    mem = Table(title="LoRA slots per resident adapter (read from the engine)")
    for col in ("layout", "routed experts, engine", "other, engine", "per adapter, engine", "per adapter at 75"):
        mem.add_column(col, justify="right")
    for layout, r in report["layouts"].items():
        if "slots" in r:
            s, n = r["slots"], r["slots"]["max_loras"]
            gib = 1 << 30
            mem.add_row(
                layout,
                f"{s['routed_experts'] / n / gib:.2f} GiB",
                f"{s['other'] / n / gib:.2f} GiB",
                f"{r['slot_bytes_per_adapter'] / gib:.2f} GiB",
                "-" if (at_75 := r["slot_bytes_per_adapter_at_75"]) is None else f"{at_75 / gib:.2f} GiB",
            )
    console.print(mem)
    if "end_to_end_75" in report:
        e2e = Table(title="handoff at full GLM-5.3 (75 MoE layers): sync + receive + load + activation")
        for col in ("path", "sync (sender)", "receive (engine)", "load + activation", "total", "engine at 75"):
            e2e.add_column(col, justify="right")
        keys = ("sync_sender_s", "receive_s", "load_and_activation_s", "total_s")
        for path, row in report["end_to_end_75"]["rows"].items():
            cells = ("in sync" if row[k] is None else f"{row[k] * 1e3:.1f} ms" for k in keys)
            e2e.add_row(path, *cells, row.get("engine_at_75", "fit"))
        console.print(e2e)
        if missing := report["end_to_end_75"].get("no_sync"):
            console.print(f"no handoff row for {', '.join(missing)}: no --sync-json report of its expert grouping")
    if report.get("decode_batches"):
        print_decode_table(report, console)


def print_decode_table(report: dict[str, Any], console: Any) -> None:
    """Decode tokens/s per layout and batch (with the adapter, and the base model on the same engine), each against
    the no-adapter engine's; the KV-cache capacity each engine was left."""
    from rich.table import Table

    batches = [str(b) for b in report["decode_batches"]]
    layouts = report["layouts"]
    baseline = layouts.get(NO_ADAPTER, {}).get("decode_tokens_per_s", {}).get("base", {})
    table = Table(title=f"decode tokens/s ({report['decode_new_tokens']} new tokens per sequence, greedy, CUDA graphs)")
    for col in ("layout", "requests", *(f"batch {b}" for b in batches), "KV cache tokens"):
        table.add_column(col, justify="right")
    for layout, r in layouts.items():
        for requests, row in r.get("decode_tokens_per_s", {}).items():
            cells = []
            for b in batches:
                share = f" ({row[b] / baseline[b]:.0%})" if baseline.get(b) and layout != NO_ADAPTER else ""
                cells.append(f"{row[b]:,.0f}{share}")
            table.add_row(layout, requests, *cells, f"{r.get('kv_cache_tokens') or '-'}")
    console.print(table)
    profiled = {k: r["decode_kernels"] for k, r in layouts.items() if r.get("decode_kernels")}
    if not profiled:
        return
    steps = report["decode_new_tokens"]
    table = Table(title=f"GPU kernels per decode step (one profiled round of {steps} steps)")
    for col in ("layout", "requests", "batch", "GPU ms", "wall ms", "kernels", "most GPU time"):
        table.add_column(col, justify="left" if col == "most GPU time" else "right")
    for layout, by_kind in profiled.items():
        for requests, by_batch in by_kind.items():
            for b, k in by_batch.items():
                top = ", ".join(f"{t['kernel'][:28]} {t['s'] / steps * 1e3:.2f}" for t in k["top"][:3])
                row = (k["gpu_s"] / steps * 1e3, k["wall_s"] / steps * 1e3, k["kernel_calls"] / steps)
                table.add_row(layout, requests, b, *(f"{v:,.2f}" for v in row[:2]), f"{row[2]:,.0f}", top)
    console.print(table)


def plot_layout_report(report: dict[str, Any], path: str) -> None:
    """Each layout's engine-side receive + load against MoE layers, the sum of their fits out to 75 (the stages the
    handoff extrapolates; the request's fixed work is left out, see the module docstring); slot memory per adapter."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    started = {k: r for k, r in report["layouts"].items() if "medians_s" in r}
    for layout, r in started.items():
        xs = [int(k) for k in r["medians_s"]]
        ys = [r["medians_s"][k]["receive_s"] + r["medians_s"][k]["load_s"] for k in r["medians_s"]]
        fits = [r["fit_75"][st] for st in ("receive_s", "load_s")]
        (line,) = ax.plot(xs, ys, "o", label=f"{layout} (measured)")
        ends = [sum(f["intercept"] for f in fits), sum(f["value"] for f in fits)]
        ax.plot([0, FULL_MOE_LAYERS], ends, "--", color=line.get_color())
    ax.set(xlabel="MoE layers", ylabel="receive + load in the engine (s)", title="fit to 75 layers (dashed)")
    ax.legend(fontsize=8)
    at_75 = {k: r["slot_bytes_per_adapter_at_75"] for k, r in started.items()}
    if None in at_75.values():  # narrowed experts: the slots as the engine held them
        at_75 = {k: r["slot_bytes_per_adapter"] for k, r in started.items()}
        title = f"LoRA slots per resident adapter, {report['engine_moe_layers']} MoE layers, experts narrowed"
    else:
        title = "LoRA slots per resident adapter at 75 MoE layers"
    bx.bar(list(at_75), [v / (1 << 30) for v in at_75.values()])
    bx.set(ylabel="GiB", title=title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
