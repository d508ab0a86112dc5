"""``bench load --layouts`` keeps what it measured and says what it waits on: a run stopped at a budget (measured on
one H200: two such runs printed nothing and left no file) keeps every layout finished before the stop.

The engines (with their decode rate and KV-cache size) and the GPU-held adapters are stand-ins here, the one thing
faked: vLLM's CPU build cannot serve routed-expert LoRA and this machine has no GPU (the GPU run is
``scripts/gpu-verify load``). The LoRA engines refuse to start, a real outcome the bench records (an engine out of
memory); the baseline without LoRA starts and decodes."""

from __future__ import annotations

import json
from types import SimpleNamespace

from skyrl_glm import strict_json
from skyrl_glm.bench import load_layouts


def test_each_layout_is_on_disk_before_the_next_engine_starts(tmp_path, monkeypatch):
    out = tmp_path / "load_layouts.json"
    started: list[str] = []

    def engine(model_dir, family, targets, layout, rank, max_loras, decode):
        on_disk = json.loads(out.read_text())["layouts"] if out.exists() else {}
        assert list(on_disk) == started  # every earlier layout was written before this engine starts
        started.append(layout)
        if layout == "none":  # an engine without LoRA, the decode baseline: it starts and decodes
            return SimpleNamespace(close=lambda: None)
        raise RuntimeError("CUDA out of memory (stand-in engine)")

    monkeypatch.setattr(load_layouts, "_engine", engine)
    monkeypatch.setattr(load_layouts, "kv_cache_tokens", lambda sampler: 1024)
    monkeypatch.setattr(
        load_layouts,
        "decode_throughput",
        lambda sampler, batches, loras, kernels: {label: {str(b): 1.0 for b in batches} for label in loras},
    )
    monkeypatch.setattr(
        load_layouts,
        "_adapters",
        lambda layers, rank, groups, expert_width: {
            k: load_layouts.Adapter({}, ["mlp.experts.gate_up_proj"], 0) for k in layers
        },
    )
    lines: list[str] = []
    report = load_layouts.run_layout_bench(
        [2], ["none", "per-expert", "grouped:4"], rounds=1, warmup=0, rank=4, decode=[1],
        progress=lines.append, after_layout=lambda so_far: strict_json.write(so_far, out),
    )  # fmt: skip
    assert started == ["none", "per-expert", "grouped:4"]
    kept = json.loads(out.read_text())
    assert kept["complete"] is False and report["complete"] is True
    assert {k: v["started"] for k, v in kept["layouts"].items()} == {
        "none": True,
        "per-expert": False,
        "grouped:4": False,
    }
    assert kept["layouts"]["none"]["decode_tokens_per_s"] == {"base": {"1": 1.0}}
    assert "out of memory" in kept["layouts"]["grouped:4"]["reason"]
    assert "per-expert: starting its engine ..." in lines
    assert any(line.startswith("grouped:4: the engine did not start") for line in lines)
    assert not list(tmp_path.glob(".*.part"))  # each write replaced the file whole


def test_a_grouping_no_later_layout_serves_lets_its_adapters_go_before_the_next_engine(monkeypatch):
    """The adapters of every layer count are held on the GPU beside each engine: at 75 narrowed layers one H200
    ran out of memory while an earlier grouping's were still held. A grouping is kept while a later layout needs it."""
    import weakref

    class Tensors(dict):
        pass

    made: dict[int, weakref.ref] = {}
    alive_at_start: dict[str, list[int]] = {}

    def adapters(layers, rank, groups, expert_width):
        held = {k: load_layouts.Adapter(Tensors(), ["mlp.experts.gate_up_proj"], 0) for k in layers}
        made[groups] = weakref.ref(held[layers[0]].tensors)
        return held

    def engine(model_dir, family, targets, layout, rank, max_loras, decode):
        alive_at_start[layout] = sorted(g for g, ref in made.items() if ref() is not None)
        raise RuntimeError("CUDA out of memory (stand-in engine)")

    monkeypatch.setattr(load_layouts, "_adapters", adapters)
    monkeypatch.setattr(load_layouts, "_engine", engine)
    layouts = ["shared-all", "grouped:4", "per-expert", "grouped:64"]
    load_layouts.run_layout_bench([2], layouts, rounds=1, warmup=0, rank=4)
    # per-expert serves the one-per-layer adapter again: it stays until then, grouped:4's goes after its layout
    assert alive_at_start == {"shared-all": [1], "grouped:4": [1, 4], "per-expert": [1], "grouped:64": [64]}


def test_decode_throughput_times_each_request_kind_in_turn_on_a_real_engine(glm45_sampler):
    """On vLLM's CPU build (the tiny GLM-4.5 engine the suite shares, a real engine here): one rate per request
    kind and batch size, each the median of its timed rounds."""
    rates = load_layouts.decode_throughput(glm45_sampler, [1, 3], {"base": None, "base again": None})
    assert set(rates) == {"base", "base again"}
    for row in rates.values():
        assert set(row) == {"1", "3"} and all(0 < r < float("inf") for r in row.values())


def test_a_profiled_decode_runs_one_more_round_per_kind_and_batch_under_the_workers_profiler():
    """The profiled round's calls in order (a stand-in engine: the bench's own worker extension is not the suite's
    engine's; the profiler itself runs on a real worker in ``tests/slot_replay_run.py``)."""
    calls: list[tuple] = []

    def rpc(method, args=()):
        calls.append((method, *args))
        return [None if args[0] else {"gpu_s": 0.5, "kernel_calls": 7, "top": []}]

    def generate(prompts, params, lora_request=None, use_tqdm=True):
        calls.append(("generate", len(prompts), lora_request))

    sampler = SimpleNamespace(llm=SimpleNamespace(collective_rpc=rpc, generate=generate))
    kernels: dict = {}
    load_layouts.decode_throughput(sampler, [2], {"adapter": "lora", "base": None}, kernels)
    profiled = [("skyrl_glm_bench_kernels", True), ("generate", 2, "lora"), ("skyrl_glm_bench_kernels", False)]
    profiled += [("skyrl_glm_bench_kernels", True), ("generate", 2, None), ("skyrl_glm_bench_kernels", False)]
    assert calls[-6:] == profiled
    assert len(calls) == 6 + 2 * (1 + load_layouts.DECODE_ROUNDS)  # the untimed and timed rounds before it
    assert set(kernels) == {"adapter", "base"}
    assert kernels["adapter"]["2"]["gpu_s"] == 0.5 and kernels["adapter"]["2"]["wall_s"] >= 0
