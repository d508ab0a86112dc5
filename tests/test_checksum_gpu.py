"""The CUDA kernels (Triton) agree with the CPU paths: span checksums + NaN/inf flags, and pairwise byte equality."""

from __future__ import annotations

import pytest
import torch
from packed_streams import packed

from skyrl_glm.sync.checksum import checksums, fingerprints, span_checks
from skyrl_glm.sync.compare import equal_pairs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _stream(seed: int = 0) -> tuple[torch.Tensor, list]:
    g = torch.Generator().manual_seed(seed)
    shapes = [((7, 33), torch.bfloat16), ((50_000,), torch.float32), ((3,), torch.float16), ((640, 33), torch.bfloat16)]
    shapes += [((int(n),), torch.bfloat16) for n in torch.randint(1, 40_000, (200,), generator=g)]
    tensors = [torch.randn(s, generator=g).to(dt) for s, dt in shapes]
    tensors[3][5, 7] = float("nan")
    tensors[2][1] = float("inf")
    tensors[40][-1] = float("-inf")
    return packed(tensors)


def test_span_checks_triton_equals_cpu():
    stream, spans = _stream()
    cpu = span_checks(stream, spans)
    gpu = span_checks(stream.cuda(), spans)
    assert gpu[0] == cpu[0] and (gpu[1] == cpu[1]).all()
    assert [i for i, ok in enumerate(cpu[1]) if not ok] == [2, 3, 40]
    stream[spans[100][0] + 3] ^= 1  # one flipped bit changes exactly that tensor's checksum
    flipped = span_checks(stream.cuda(), spans)[0]
    assert [i for i in range(len(spans)) if cpu[0][16 * i : 16 * i + 16] != flipped[16 * i : 16 * i + 16]] == [100]


@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "odd-bytes"])
def test_equal_pairs_cuda_equals_cpu(offset):
    g = torch.Generator().manual_seed(1)
    base = [torch.randn(int(n), generator=g).to(torch.bfloat16) for n in torch.randint(2, 30_000, (300,), generator=g)]
    left = [t[offset:] for t in base]
    right = [t.clone() for t in left]
    for i in range(0, 300, 7):
        right[i][-1] = right[i][-1] + 1
    right[5][0] = -0.0 if left[5][0] == 0 else left[5][0]
    cpu = equal_pairs(left, right).tolist()
    gpu = equal_pairs([t.cuda() for t in left], [t.cuda() for t in right]).cpu().tolist()
    assert gpu == cpu
    assert [i for i, ok in enumerate(cpu) if not ok] == list(range(0, 300, 7))


def test_fingerprints_cuda_equal_cpu_and_checksums():
    stream, spans = _stream(2)
    tensors = [stream[o : o + n] for o, n, _ in spans]
    tensors.append(torch.randn(9, 7).to(torch.bfloat16).t())  # non-contiguous, odd-sized: a padded copy
    cpu = fingerprints(tensors)
    gpu = fingerprints([t.cuda() for t in tensors])
    assert (gpu == cpu).all()
    assert "".join(checksums([t.cuda() for t in tensors[:-1]])) == span_checks(stream, spans)[0]


def _export(copies: bool, device: str) -> dict[str, torch.Tensor]:
    """Expert adapters under every expert name (as copies or one storage), zero lora_B in two layers."""
    g = torch.Generator().manual_seed(4)
    out: dict[str, torch.Tensor] = {}
    for layer in range(3):
        a, b = torch.randn(8, 64, generator=g), torch.randn(48, 8, generator=g)
        for e in range(700):
            pre = f"m.layers.{layer}.mlp.experts.{e}.up_proj"
            out[f"{pre}.lora_A.weight"] = a.to(device).clone() if copies else a
            out[f"{pre}.lora_B.weight"] = b.to(device).clone() if copies else b
        out[f"m.layers.{layer}.self_attn.o_proj.lora_B.weight"] = torch.zeros(16, 8, device=device)
    return out


@pytest.mark.parametrize("collide", [False, True], ids=["fingerprints", "all-collide"])
def test_dedup_cuda_equals_cpu(monkeypatch, collide):
    """The CUDA branch (address tables, one fingerprint and one proof launch per slice) decides as the CPU one;
    with every fingerprint forced equal it still never aliases unequal values."""
    from skyrl_glm.sync import dedup

    if collide:
        real = dedup.sums_at
        monkeypatch.setattr(dedup, "sums_at", lambda *a: real(*a) * 0)
    cpu = dedup.deduplicate(_export(True, "cpu"))
    gpu = dedup.deduplicate(_export(True, "cuda"))
    assert gpu.names == cpu.names
    assert len(gpu.unique) == 3 * 2 + 1
    export = _export(True, "cuda")
    for public, sent in gpu.aliases.items():
        assert torch.equal(export[public], export[sent])


def test_a_gpu_adapter_staged_in_host_memory_is_folded_on_its_gpu_and_arrives_as_the_cpu_plan():
    """The plan packs and folds a GPU adapter on its GPU, then copies to the host staging buffer once: the stream,
    manifest and checksums equal those of the same adapter planned on the CPU."""
    from skyrl_glm.sync.plan import build_plan

    g = torch.Generator().manual_seed(3)
    adapter = {
        f"base_model.model.layers.{i}.mlp.{p}.lora_{ab}.weight": torch.randn(shape, generator=g).to(torch.bfloat16)
        for i in range(3)
        for p in ("gate_proj", "down_proj")
        for ab, shape in (("A", (8, 64)), ("B", (64, 8)))
    }
    config = {"r": 8, "lora_alpha": 16, "target_modules": ["gate_proj", "down_proj"]}
    on_cpu = build_plan(adapter, adapter_config=config, lora_name="a", version=2)
    on_gpu = build_plan(
        {k: v.cuda() for k, v in adapter.items()},
        adapter_config=config,
        lora_name="a",
        version=2,
        staging=lambda n, device: torch.zeros(n, dtype=torch.uint8),
    )
    assert on_gpu.buffer.device.type == "cpu" and torch.equal(on_gpu.buffer, on_cpu.buffer)
    assert on_gpu.manifest == on_cpu.manifest


@pytest.mark.parametrize("groups", [2, None], ids=["grouped", "per-expert"])
def test_a_plan_packed_through_the_copy_table_equals_the_fused_copies(groups):
    """On a GPU the pack runs through the copy table; the same plan with the host's fused per-dtype copies (the
    stream moved back) gives the same stream bit for bit, fresh and with a kept layout and staging buffer."""
    from test_sync_caches import export, plan

    from skyrl_glm.sync.plan import PlanCache

    kept: list[torch.Tensor] = []

    def staging(nbytes, device):
        if not kept:
            kept.append(torch.zeros(nbytes, dtype=torch.uint8, device=device))
        return kept[0]

    cache = PlanCache()
    for version, seed in ((1, 0), (2, 1), (3, 2)):
        tensors = export(seed, groups, dtype=torch.bfloat16)
        want = plan(tensors, version, None, lora_name="g")
        on_gpu = {id(v): v.cuda() for v in tensors.values()}  # each storage moved once: names that share it still do
        got = plan({k: on_gpu[id(v)] for k, v in tensors.items()}, version, cache, lora_name="g", staging=staging)
        assert got.manifest.to_json() == want.manifest.to_json()
        assert torch.equal(got.buffer.cpu(), want.buffer)
    assert cache.hits == 2 and cache.layout.copies.host is not None  # the kept layout's table ran
