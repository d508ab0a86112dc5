"""The receiver: verify an update against its manifest and rebuild every public adapter name.

Backend-free (torch only): the vLLM worker extension calls it, and so can any other sampler. Every check
runs before the update is handed on, so a rejected update leaves the previous adapter untouched.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from skyrl.backends.skyrl_train.weight_sync.lora_target import expand_lora_aliases

from skyrl_glm.sync.checksum import checksums
from skyrl_glm.sync.manifest import DTYPES, Manifest, ManifestError
from skyrl_glm.sync.transports.base import Transport, TransportError

log = logging.getLogger(__name__)


class UpdateRejected(RuntimeError):
    """An adapter update failed verification; ``reason`` says why. The previous adapter keeps serving."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class ReceivedAdapter:
    version: int
    lora_name: str
    adapter_config: dict[str, Any]
    tensors: dict[str, torch.Tensor]  # every public name; aliases are views of one private buffer
    timings: dict[str, float] = field(default_factory=dict)


def _unpaired(names: dict[str, torch.Tensor]) -> list[str]:
    pair = {".lora_A.": ".lora_B.", ".lora_B.": ".lora_A."}
    return sorted(n for n in names for a, b in pair.items() if a in n and n.replace(a, b) not in names)


def _rank_mismatches(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Pairs whose ranks disagree: ``lora_A`` is ``[r, in]`` and ``lora_B`` ``[out, r]`` (both 2D)."""
    bad = []
    for name, a in tensors.items():
        if ".lora_A." in name:
            b = tensors[name.replace(".lora_A.", ".lora_B.")]
            if a.ndim == b.ndim == 2 and a.shape[0] != b.shape[1]:
                bad.append(name)
    return bad


class AdapterReceiver:
    """Stages updates into private memory on ``device`` and verifies them; tracks the accepted version."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.version: int | None = None

    def receive(self, manifest_json: str, handle: dict[str, Any], transport: Transport) -> ReceivedAdapter:
        t0 = time.perf_counter()
        try:
            manifest = Manifest.from_json(manifest_json)
        except ManifestError as e:
            raise UpdateRejected(str(e)) from None
        if self.version is not None and manifest.version <= self.version:
            raise UpdateRejected(f"version {manifest.version} is not newer than the serving version {self.version}")
        staging = torch.empty(manifest.total_bytes, dtype=torch.uint8, device=self.device)
        try:
            transport.receive(manifest, handle, staging)
        except TransportError as e:
            raise UpdateRejected(f"transfer failed: {e}") from None
        t1 = time.perf_counter()
        sent: dict[str, torch.Tensor] = {}
        for entry in manifest.tensors:
            raw = staging[entry.offset : entry.offset + entry.nbytes]
            sent[entry.name] = raw.view(DTYPES[entry.dtype]).view(entry.shape)
        got = checksums(list(sent.values()))
        for entry, cs in zip(manifest.tensors, got, strict=True):
            if cs != entry.checksum:
                raise UpdateRejected(f"checksum mismatch on {entry.name!r} (corrupt or partial transfer)")
        finite = torch.stack([torch.isfinite(t).all() for t in sent.values()]).tolist() if sent else []
        bad = [n for n, ok in zip(sent, finite, strict=True) if not ok]
        if bad:
            raise UpdateRejected(f"non-finite values (NaN/inf) in {bad[:3]}{'...' if len(bad) > 3 else ''}")
        t2 = time.perf_counter()
        tensors = expand_lora_aliases(sent, manifest.aliases)
        unpaired = _unpaired(tensors)
        if unpaired:
            raise UpdateRejected(
                f"missing tensors: {len(unpaired)} lora_A/lora_B without its pair, e.g. {unpaired[:2]}"
            )
        mismatched = _rank_mismatches(tensors)
        if mismatched:
            raise UpdateRejected(f"shape mismatch: lora_A rows != lora_B columns for {mismatched[:2]}")
        return ReceivedAdapter(
            version=manifest.version,
            lora_name=manifest.lora_name,
            adapter_config=manifest.adapter_config,
            tensors=tensors,
            timings={"transfer_s": t1 - t0, "verify_s": t2 - t1, "rebuild_s": time.perf_counter() - t2},
        )

    def commit(self, version: int) -> None:
        """Record ``version`` as serving; call only after the sampler loaded it."""
        self.version = version
