"""Bit-exact comparison of a received adapter with what was sent (the one place the harnesses compare bytes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from skyrl_glm.bench.synthetic import Synthetic


def bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, same dtype and the same bytes (``torch.equal`` on the raw bytes: NaN payloads and -0.0 count)."""
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))
    )


def compare_exact(got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Name by name: every expected name present, nothing extra, each one :func:`bytes_equal` (a JSON-able report)."""
    bad = [n for n, exp in expected.items() if n not in got or not bytes_equal(got[n], exp.to(got[n].device))]
    names_ok = set(got) == set(expected)
    return {
        "expected_names": len(expected),
        "received_names": len(got),
        "names_ok": names_ok,
        "mismatched": bad[:5],
        "bit_exact": names_ok and not bad,
    }


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
