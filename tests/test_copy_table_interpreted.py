"""The sender's pack through the copy table (:mod:`skyrl_glm.sync.copy_table`), run by Triton's interpreter on the
CPU machine: the CUDA kernel's own code on host memory, against the fused per-dtype copies it replaces.

Its widths (8-, 4- and 1-byte words, the widest every row allows), rows longer than one program's stride, the bytes
between rows left as they were, and the table kept while it repeats; then whole plans (``plan.TABLE_DEVICES`` with
the host added) bit for bit the plans of the fused copies, over tensors read one by one and over an export memo's
recall, whose addresses come from the parameters. ``TRITON_INTERPRET=1`` must be set before a kernel is built,
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
from skyrl_glm.sync import copy_table as K, plan as P
from skyrl_glm.sync.export_memo import ExportMemo
from skyrl_glm.skyrl.workers.megatron import unique_adapter
from test_sync_caches import export, plan, assert_same_plan

g = torch.Generator().manual_seed(0)
long = K._BLOCK * K._SPLIT * 2 + 3  # words: a program's third step, and a ragged end
for width, sizes in ((8, [8, 64, 8 * long, 800]), (4, [4, 12, 4 * long, 36]), (1, [1, 7, long, 5])):
    rows = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in sizes]
    starts = np.cumsum([0] + [n + 64 for n in sizes])[:-1] + 8
    out = torch.full((int(starts[-1]) + sizes[-1] + 72,), 0xAB, dtype=torch.uint8)
    src = np.array([r.data_ptr() for r in rows], np.int64)
    table = K.CopyTable()
    table.run(out.device, src, starts + out.data_ptr(), np.array(sizes, np.int64))
    assert table.width == width, (width, table.width)
    ends = starts + np.array(sizes)
    for r, s in zip(rows, starts):
        assert torch.equal(out[s : s + r.numel()], r), f"width {width}: a row differs"
    gaps = torch.ones_like(out, dtype=torch.bool)
    for s, e in zip(starts, ends):
        gaps[s:e] = False
    assert (out[gaps] == 0xAB).all(), f"width {width}: a byte outside the rows changed"
    table.run(out.device, src, starts + out.data_ptr(), np.array(sizes, np.int64))
    assert table.reused == 1

P.TABLE_DEVICES.add("cpu")
for groups, dtype in ((2, torch.bfloat16), (None, torch.float32), (1, torch.float16)):
    tensors = export(3, groups, dtype=dtype)
    got = plan(tensors, 1, P.PlanCache(), lora_name="t")
    P.TABLE_DEVICES.discard("cpu")
    assert_same_plan(got, plan(tensors, 1, None, lora_name="t"))
    P.TABLE_DEVICES.add("cpu")

params = [torch.randn(s, generator=g).to(torch.bfloat16) for s in ((2, 6), (5, 2), (2, 5), (6, 2))]
a, b, down, fc1 = params


def bridge():
    yield "model.layers.0.self_attn.o_proj.lora_A.weight", a
    yield "model.layers.0.self_attn.o_proj.lora_B.weight", b
    for e in range(4):
        yield f"model.layers.1.mlp.experts.{e}.down_proj.lora_A.weight", down.view(down.shape)
        yield f"model.layers.1.mlp.experts.{e}.gate_proj.lora_B.weight", fc1[:3]
        yield f"model.layers.1.mlp.experts.{e}.up_proj.lora_B.weight", fc1[3:]


memo, cache, kept = ExportMemo(), P.PlanCache(), []
config = {"r": 2, "lora_alpha": 4.0}


def staging(nbytes, device):  # a transport's staging memory, the same every update (CUDA IPC's)
    if not kept:
        kept.append(torch.zeros(nbytes, dtype=torch.uint8, device=device))
    return kept[0]


for version in (1, 2, 3):
    with torch.no_grad():
        for p in params:
            p.add_(1.0)
    dedup = unique_adapter(bridge(), config_rank=2, num_moe_experts=4, shared_storage=True, export_memo=memo,
                           params=params)
    assert (dedup.addresses is not None) == (version > 1), version
    got = P.build_plan(dedup, adapter_config=config, lora_name="m", version=version, cache=cache, staging=staging)
    P.TABLE_DEVICES.discard("cpu")
    want = P.build_plan(unique_adapter(bridge(), config_rank=2, num_moe_experts=4, shared_storage=True),
                        adapter_config=config, lora_name="m", version=version)
    P.TABLE_DEVICES.add("cpu")
    assert_same_plan(got, want)
assert cache.layout.copies.reused == 2  # one staging buffer, the parameters unmoved: one table
print("ok")
"""


def test_the_pack_through_the_copy_table_equals_the_fused_copies_under_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.stdout[-1000:], done.stderr[-3000:])
