"""Run by ``tests/test_slot_replay.py`` in a process of its own: the five-step check on the tiny GLM-4.5 with vLLM's CPU
build, its engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the slot-write replay can be broken here.
Prints one JSON line: three checks on one engine, each followed by the replay's counts (and the loads cloned) and the
comparison of the serving adapter's slots with vLLM's own writes: the first (its adapter structures recorded), a second
like it (both replayed), a third whose replay zeroes the factors' places instead of copying them, from its step 4 on.
Then the layout bench's switch clock on its worker, read after one request and after none."""

from __future__ import annotations

import dataclasses
import json
import os
import pstats
import sys
import tempfile
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def _manager(worker):
    return worker.model_runner.lora_manager._adapter_manager


def _report(worker):
    from skyrl_glm.sync.vllm import load_memo
    from skyrl_glm.sync.vllm.slot_replay import matches_vllm, state
    from skyrl_glm.sync.vllm.worker import receiver_state

    manager = _manager(worker)
    serving = max(i for i in manager.lora_index_to_id if i is not None)
    loads = load_memo.state(worker.model_runner.lora_manager).counts
    rx = receiver_state(getattr(worker, "worker", worker)).receiver  # a callable gets vLLM's wrapper of the worker
    pool = {f"pool_{k}": v for k, v in rx.pool.counts.items()}
    return {**state(manager).counts, **loads, **pool, "matches_vllm": matches_vllm(manager, serving)}


def _switch_times(sampler):
    """The bench's switch clock on this engine's worker: started, then read after one request and after none."""
    from skyrl_glm.bench.load_layouts import SlotReport

    clock = SlotReport.skyrl_glm_bench_switch_times
    sampler.llm.collective_rpc(clock)
    sampler.generate([[1, 2, 3, 4]], 1)
    (after_request,) = sampler.llm.collective_rpc(clock)
    (after_none,) = sampler.llm.collective_rpc(clock)
    (stopped,) = sampler.llm.collective_rpc(clock, args=(False,))
    return {"after_request": after_request, "after_none": after_none, "stopped": stopped}


def _profiled(sampler, path):
    """The bench's worker profile on this engine: started, one request, written to ``path``; and a stop without a
    start (False: nothing written)."""
    from skyrl_glm.bench.load_layouts import SlotReport

    profile = SlotReport.skyrl_glm_bench_profile
    (started,) = sampler.llm.collective_rpc(profile, args=(None,))
    sampler.generate([[1, 2, 3, 4]], 1)
    (written,) = sampler.llm.collective_rpc(profile, args=(path,))
    (again,) = sampler.llm.collective_rpc(profile, args=(path + ".again",))
    return {"started": started, "written": written, "again": again, "path": path}


def _kernels(sampler):
    """The bench's decode kernel profile on this engine's worker: started, one request, stopped; a stop without a
    start (None). No GPU here: no kernel time."""
    from skyrl_glm.bench.load_layouts import SlotReport

    kernels = SlotReport.skyrl_glm_bench_kernels
    (started,) = sampler.llm.collective_rpc(kernels, args=(True,))
    sampler.generate([[1, 2, 3, 4]], 2)
    (stopped,) = sampler.llm.collective_rpc(kernels, args=(False,))
    (again,) = sampler.llm.collective_rpc(kernels, args=(False,))
    return {"started": started, "stopped": stopped, "again": again}


def main() -> None:
    from skyrl_glm.bench.load_layouts import rpc_round_trip
    from skyrl_glm.check.algorithm import run_check
    from skyrl_glm.check.probes import make_probes
    from skyrl_glm.check.runner import CheckOptions, build, prepare, tiny_model_dir
    from skyrl_glm.sync.vllm import slot_replay

    options = CheckOptions(model="glm-4.5", transport="cpu", rank=8, alpha=16, device="cpu")
    plan = prepare(options)
    with tempfile.TemporaryDirectory(prefix="skyrl-glm-slot-replay-") as tmp:
        options.workdir = tmp
        model_dir, _ = tiny_model_dir(plan.family, Path(tmp))
        probes = make_probes(plan.vocab_size, seed=options.config.seed)
        trainer, sampler, publisher, cleanup = build(options, plan, model_dir, probes)
        try:
            first = run_check(trainer, sampler, publisher, probes, options.config)
            (after_first,) = sampler.llm.collective_rpc(_report)

            def copies_dropped(self, index, factors):  # the deliberately broken replay: the factors' places zeroed
                zeros, consts, values, dsts = self.places(index)
                slot_replay.torch._foreach_zero_(zeros + dsts)
                if consts:
                    slot_replay.torch._foreach_copy_(consts, values)

            def break_after_step_1(step):
                if step.step == 1:
                    slot_replay.Recording.replay = copies_dropped

            def fresh_trainer():  # each check starts from B == 0: a trainer like the first
                return plan.trainer_factory(
                    model_dir, family=plan.family, targets=plan.targets, rank=options.rank, alpha=options.alpha,
                    device=options.device, seed=options.config.seed,
                )  # fmt: skip

            again = dataclasses.replace(options.config, first_version=3)
            replayed = run_check(fresh_trainer(), sampler, publisher, probes, again)
            (after_replayed,) = sampler.llm.collective_rpc(_report)
            # the first check's two versions are gone by now: this one's land in their staging memory
            pooled = run_check(
                fresh_trainer(), sampler, publisher, probes, dataclasses.replace(options.config, first_version=5)
            )
            (after_pooled,) = sampler.llm.collective_rpc(_report)
            last = dataclasses.replace(options.config, first_version=7)
            broken = run_check(fresh_trainer(), sampler, publisher, probes, last, on_step=break_after_step_1)
            (after_broken,) = sampler.llm.collective_rpc(_report)
            switch = _switch_times(sampler)
            rpc = rpc_round_trip(sampler, calls=3)
            profiled = _profiled(sampler, str(Path(tmp) / "worker.prof"))
            profiled["functions"] = sorted({f[2] for f in pstats.Stats(profiled["path"]).stats})
            kernels = _kernels(sampler)
        finally:
            for step in cleanup:
                step()
    failure = broken.first_failure
    json.dump(
        {
            "first_passed": first.passed,
            "after_first": after_first,
            "replayed_passed": replayed.passed,
            "after_replayed": after_replayed,
            "pooled_passed": pooled.passed,
            "after_pooled": after_pooled,
            "broken_passed": broken.passed,
            "broken_failed_at": None if failure is None else failure.step,
            "after_broken": after_broken,
            "switch_times": switch,
            "rpc_round_trip_s": rpc,
            "profiled": profiled,
            "kernels": kernels,
        },
        sys.stdout,
    )
    print()


if __name__ == "__main__":
    main()
