"""In-memory sync into the real vLLM (CPU build): HF+PEFT trainer -> plan -> shm -> receiver -> vLLM serves it."""

from __future__ import annotations

import dataclasses

import psutil
import pytest
import torch

from skyrl_glm.check.probes import make_probes
from skyrl_glm.sync.publisher import InMemoryPublisher
from skyrl_glm.sync.transports.shm import SharedMemoryTransport

pytestmark = [pytest.mark.vllm]
SEQS = make_probes(512, num=3, length=24, seed=7).sequences


def _max_diff(a, b):
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def _engine_rss(sampler) -> int:
    me = psutil.Process()
    return sum(p.memory_info().rss for p in me.children(recursive=True))


def test_vllm_base_model_matches_hf_fp32(glm45_dir, glm45_sampler):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(glm45_dir, dtype=torch.float32)
    with torch.no_grad():
        ref = []
        for s in SEQS:
            lp = torch.log_softmax(hf(torch.tensor([s])).logits[0], -1)
            ref.append(lp[:-1].gather(1, torch.tensor(s[1:])[:, None])[:, 0].tolist())
    current = glm45_sampler.adapter
    glm45_sampler.adapter = None
    try:
        assert _max_diff(glm45_sampler.score(SEQS), ref) <= 1e-5
    finally:
        glm45_sampler.adapter = current


def test_twenty_versions_stay_exact_without_memory_growth(glm45_trainer, glm45_sampler, versions):
    publisher = InMemoryPublisher(glm45_sampler, SharedMemoryTransport())
    rss = []
    for i in range(22):
        with torch.no_grad():
            for name, p in glm45_trainer.model.named_parameters():
                if "lora_B" in name or (i % 2 and "lora_A" in name):
                    p.normal_(std=0.05)
        result = publisher.publish(glm45_trainer.adapter(), glm45_trainer.lora_config, versions.next())
        assert result.ok, result.reason
        # alpha = 2r: a B scaled twice (or never) would show up here at once
        assert _max_diff(glm45_sampler.score(SEQS), glm45_trainer.score(SEQS)) <= 1e-5, f"version {i}"
        rss.append(_engine_rss(glm45_sampler))
    growth = rss[-1] - rss[2]
    assert growth < 64 << 20, f"engine memory grew {growth / 2**20:.1f} MiB over {len(rss) - 2} syncs"


def test_bad_updates_are_rejected_and_the_old_adapter_keeps_serving(glm45_trainer, glm45_sampler, versions):
    publisher = InMemoryPublisher(glm45_sampler, SharedMemoryTransport())
    with torch.no_grad():
        for name, p in glm45_trainer.model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.05)
    good = publisher.publish(glm45_trainer.adapter(), glm45_trainer.lora_config, versions.next())
    assert good.ok
    serving = glm45_sampler.score(SEQS)
    adapter, config = glm45_trainer.adapter(), glm45_trainer.lora_config

    def with_tensor(name, value):
        bad = dict(adapter)
        bad[name] = value
        return publisher.publish(bad, config, versions.next())

    q_b = next(n for n in adapter if "q_proj.lora_B" in n)
    cases = {
        "checksum": lambda: _tamper_checksum(publisher, adapter, config, versions.next()),
        "non-finite": lambda: with_tensor(q_b, torch.full_like(adapter[q_b], float("inf"))),
        "not newer": lambda: publisher.publish(adapter, config, good.version),
        "could not load": lambda: _extra_module(publisher, adapter, config, versions.next()),
        "lora_alpha": lambda: _tamper_alpha(publisher, adapter, config, versions.next()),
        "missing": lambda: _drop_one(publisher, adapter, config, versions.next()),
        "shape mismatch": lambda: with_tensor(q_b, adapter[q_b][:, :4].clone()),
        # hostile manifests straight to the engine: each one rejection, the engine keeps serving
        "outside 0..2**63-1": lambda: _raw(publisher, adapter, config, lambda d: d.update(version=2**63)),
        "must be an integer, got str": lambda: _raw(publisher, adapter, config, lambda d: d.update(version="99")),
        "must be an integer, got float": lambda: _raw(publisher, adapter, config, lambda d: d.update(version=99.5)),
        "empty adapter": lambda: _raw(
            publisher,
            adapter,
            config,
            lambda d: d.update(
                checksums="", layout={**d["layout"], "tensors": [], "aliases": {}, "alias_runs": [], "total_bytes": 0}
            ),
        ),
        "must be a JSON object": lambda: _raw(publisher, adapter, config, lambda d: d.clear(), text="[]"),
        "'aliases' must be an object": lambda: _raw(
            publisher, adapter, config, lambda d: d["layout"].update(aliases=[["a", "b"]])
        ),
        "rank r=": lambda: _raw(
            publisher,
            adapter,
            config,
            lambda d: d["layout"].update(adapter_config={**d["layout"]["adapter_config"], "r": 4, "lora_alpha": 4}),
        ),
        "transfer failed": lambda: _raw(
            publisher, adapter, config, lambda d: d["layout"].update(total_bytes=20 * 10**9)
        ),
    }
    for expected, attempt in cases.items():
        result = attempt()
        assert not result.ok, expected
        assert expected.strip() in result.reason, (expected, result.reason)
        assert _max_diff(glm45_sampler.score(SEQS), serving) == 0.0, f"serving adapter changed after {expected!r}"


def _raw(publisher, adapter, config, edit, text=None):
    """A real plan staged on the transport, its manifest edited as JSON and handed to the engine as it is."""
    import json

    plan = publisher.plan(adapter, config, 10**6)
    d = json.loads(plan.manifest.to_json())
    edit(d)
    try:
        handle = publisher.transport.prepare(plan)
        return publisher.sampler.apply_update(text or json.dumps(d), handle, publisher.transport.name)
    finally:
        publisher.transport.release()


def _tamper_checksum(publisher, adapter, config, version):
    plan = publisher.plan(adapter, config, version)
    plan.manifest = dataclasses.replace(plan.manifest, checksums="f" * 16 + plan.manifest.checksums[16:])
    return publisher.send(plan)


def _tamper_alpha(publisher, adapter, config, version):
    plan = publisher.plan(adapter, config, version)
    plan.manifest = dataclasses.replace(
        plan.manifest, adapter_config={**plan.manifest.adapter_config, "lora_alpha": 99}
    )
    return publisher.send(plan)


def _drop_one(publisher, adapter, config, version):
    """A lora_A without its lora_B: vLLM must refuse the partial adapter."""
    partial = {k: v for k, v in adapter.items() if "layers.0.self_attn.o_proj.lora_B" not in k}
    return publisher.publish(partial, config, version)


def _extra_module(publisher, adapter, config, version):
    """A complete A/B pair for a module the model does not have: vLLM's loader refuses it."""
    extra = {k.replace("q_proj", "bogus_proj"): v for k, v in adapter.items() if "layers.0.self_attn.q_proj" in k}
    return publisher.publish({**adapter, **extra}, config, version)


class _Recording:
    """The engine, with the manifests it is handed recorded: (characters, whether the layout is in them)."""

    def __init__(self, sampler) -> None:
        self.sampler, self.sent = sampler, []

    def apply_update(self, manifest_json, handle, transport):
        self.sent.append((len(manifest_json), '"layout":' in manifest_json))
        return self.sampler.apply_update(manifest_json, handle, transport)


def test_a_known_layout_is_named_by_digest_and_sent_again_to_an_engine_that_holds_another(
    glm45_trainer, glm45_sampler, versions
):
    """Once the engine accepted a layout the publisher names it by digest; when the engine holds another layout by
    then (another publisher updated it), it refuses the name, gets the layout in a second attempt over the same
    staged bytes, and serves the update."""
    engine = _Recording(glm45_sampler)
    publisher = InMemoryPublisher(engine, SharedMemoryTransport())
    adapter, config = glm45_trainer.adapter(), glm45_trainer.lora_config
    for _ in range(2):
        result = publisher.publish(adapter, config, versions.next())
        assert result.ok, result.reason
    (full, with_layout), (named, without) = engine.sent
    assert with_layout and not without and named * 4 < full
    assert (
        InMemoryPublisher(glm45_sampler, SharedMemoryTransport(), lora_name="other")
        .publish(adapter, config, versions.next())
        .ok
    )
    engine.sent.clear()
    result = publisher.publish(adapter, config, versions.next())
    assert result.ok, result.reason
    assert [with_layout for _, with_layout in engine.sent] == [False, True]  # named, refused, sent
    assert _max_diff(glm45_sampler.score(SEQS), glm45_trainer.score(SEQS)) <= 1e-5
