"""What a recall of the export memo costs the sender per sync where no parameter moved, off the GPU: ``recall`` at
``grouped:64``'s parameter count for 75 MoE layers (64 groups, six LoRA parameters each, per layer: 28,800), the
code of a given revision beside this tree's, alternating in one process; and this tree's host work for the pack's
copy table from the recall's addresses (the gather by packing order, the table, the comparison with the kept one).
Median of 25 recalls after 5, in ms, as one JSON line. Run from the repository root:
``python docs/bench/cpu_memo_recall_micro.py REV`` (REV: the revision to compare with, e.g. the one before)."""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch

from skyrl_glm.sync import export_memo
from skyrl_glm.sync.copy_table import width_of
from skyrl_glm.sync.dedup import deduplicate

LAYERS, GROUPS, PARAMS = 75, 64, ("gate_A", "gate_B", "up_A", "up_B", "down_A", "down_B")


def refuse(message: str) -> NoReturn:
    """Bad input: one line, exit 2."""
    print(f"cpu_memo_recall_micro: {message}", file=sys.stderr)
    raise SystemExit(2)


def older(rev: str):
    """``skyrl_glm/sync/export_memo.py`` as it was at ``rev``, loaded as a module of its own."""
    text = subprocess.run(["git", "show", f"{rev}:skyrl_glm/sync/export_memo.py"], capture_output=True, text=True)
    if text.returncode != 0:
        refuse(f"{rev!r}: no skyrl_glm/sync/export_memo.py at that revision")
    path = Path(tempfile.mkdtemp()) / "export_memo_older.py"
    path.write_text(text.stdout)
    spec = importlib.util.spec_from_file_location("export_memo_older", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    if len(sys.argv) != 2:
        refuse("usage: python docs/bench/cpu_memo_recall_micro.py REV")
    rev = sys.argv[1]
    params = [
        torch.zeros(4, 8 + k) for _ in range(LAYERS) for _ in range(GROUPS) for k in range(len(PARAMS))
    ]  # small: a recall's cost is per parameter, not per byte
    names = [
        f"model.layers.{layer}.mlp.experts.{g}.{p}.lora_{'A' if p.endswith('A') else 'B'}.weight"
        for layer in range(LAYERS)
        for g in range(GROUPS)
        for p in PARAMS
    ]
    memos = {"before": older(rev).ExportMemo(), "after": export_memo.ExportMemo()}
    for memo in memos.values():
        memo.verify_every = 10**6
        assert memo.learn(deduplicate(zip(names, params, strict=True), shared_storage=True), params)
    times: dict[str, list[float]] = {k: [] for k in memos}
    for _ in range(30):
        for key, memo in memos.items():
            t0 = time.perf_counter()
            got = memo.recall(params)
            times[key].append(time.perf_counter() - t0)
            assert got is not None and len(got.unique) == len(params)
    addresses = memos["after"].recall(params).addresses
    order = np.random.default_rng(0).permutation(len(params))
    offsets = np.arange(len(params), dtype=np.int64) * 256
    nbytes = np.full(len(params), 128, dtype=np.int64)
    kept = np.stack([addresses[order], offsets, nbytes // 8])
    table = []
    for _ in range(30):
        t0 = time.perf_counter()
        src = addresses[order]
        width = width_of(src, offsets, nbytes)
        same = np.array_equal(np.stack([src, offsets, nbytes // width]), kept)
        table.append(time.perf_counter() - t0)
        assert same
    row = {
        "what": "export memo recall, no parameter moved, 28,800 LoRA parameters (grouped:64 at 75 layers); the copy "
        "table's host work from the recall's addresses",
        "before": rev,
        "after": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "torch": torch.__version__,
        "parameters": len(params),
        **{f"recall_{k}_median_ms": round(statistics.median(v[5:]) * 1e3, 3) for k, v in times.items()},
        "copy_table_host_median_ms": round(statistics.median(table[5:]) * 1e3, 3),
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
