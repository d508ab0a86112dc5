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


def structure_errors(manifest: Manifest) -> str | None:
    """What is wrong with the adapter the manifest describes, from names and shapes alone (before any byte
    moves): every ``lora_A`` needs its ``lora_B`` and their ranks must agree (``A [r, in]``, ``B [out, r]``)."""
    shapes = {t.name: t.shape for t in manifest.tensors}
    shapes.update({public: shapes[sent] for public, sent in manifest.aliases.items()})
    unpaired, mismatched = [], []
    for name, shape in shapes.items():
        for mine, other in ((".lora_A.", ".lora_B."), (".lora_B.", ".lora_A.")):
            if mine in name:
                pair = shapes.get(name.replace(mine, other))
                if pair is None:
                    unpaired.append(name)
                elif mine == ".lora_A." and len(shape) == len(pair) == 2 and shape[0] != pair[1]:
                    mismatched.append(name)
    if unpaired:
        return f"missing tensors: {len(unpaired)} lora_A/lora_B without its pair, e.g. {sorted(unpaired)[:2]}"
    if mismatched:
        return f"shape mismatch: lora_A rows != lora_B columns for {sorted(mismatched)[:2]}"
    return None


class AdapterReceiver:
    """Stages updates into private memory on ``device`` and verifies them; tracks the accepted version."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.version: int | None = None

    def receive(
        self, manifest_json: str, handle: dict[str, Any], transport: Transport, verify: bool = True
    ) -> ReceivedAdapter:
        """``verify=False`` skips the per-tensor checksum and finiteness checks (the structure is always checked)."""
        t0 = time.perf_counter()
        try:
            manifest = Manifest.from_json(manifest_json)
        except ManifestError as e:
            raise UpdateRejected(str(e)) from None
        if self.version is not None and manifest.version <= self.version:
            raise UpdateRejected(f"version {manifest.version} is not newer than the serving version {self.version}")
        problem = structure_errors(manifest)
        if problem:
            raise UpdateRejected(problem)
        t1 = time.perf_counter()
        staging = torch.empty(manifest.total_bytes, dtype=torch.uint8, device=self.device)
        try:
            transport.receive(manifest, handle, staging)
        except TransportError as e:
            raise UpdateRejected(f"transfer failed: {e}") from None
        t2 = time.perf_counter()
        sent: dict[str, torch.Tensor] = {}
        for entry in manifest.tensors:
            raw = staging[entry.offset : entry.offset + entry.nbytes]
            sent[entry.name] = raw.view(DTYPES[entry.dtype]).view(entry.shape)
        if verify:
            got = checksums(list(sent.values()))
            for entry, cs in zip(manifest.tensors, got, strict=True):
                if cs != entry.checksum:
                    raise UpdateRejected(f"checksum mismatch on {entry.name!r} (corrupt or partial transfer)")
            finite = torch.stack([torch.isfinite(t).all() for t in sent.values()]).tolist() if sent else []
            bad = [n for n, ok in zip(sent, finite, strict=True) if not ok]
            if bad:
                raise UpdateRejected(f"non-finite values (NaN/inf) in {bad[:3]}{'...' if len(bad) > 3 else ''}")
        t3 = time.perf_counter()
        tensors = expand_lora_aliases(sent, manifest.aliases)
        timings = {"transfer_s": t2 - t1, "verify_s": (t1 - t0) + (t3 - t2), "rebuild_s": time.perf_counter() - t3}
        return ReceivedAdapter(manifest.version, manifest.lora_name, manifest.adapter_config, tensors, timings)

    def commit(self, version: int) -> None:
        """Record ``version`` as serving; call only after the sampler loaded it."""
        self.version = version
