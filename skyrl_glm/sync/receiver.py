"""The receiver: verify an update against its manifest and rebuild every public adapter name.

Backend-free (torch only): the vLLM worker extension calls it, and so can any other sampler. Every check
runs before the update is handed on, so a rejected update leaves the previous adapter untouched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from skyrl.backends.skyrl_train.weight_sync.lora_target import expand_lora_aliases

from skyrl_glm.sync.checksum import span_checks
from skyrl_glm.sync.expert_layout import PER_EXPERT, Arrangement, LayoutError
from skyrl_glm.sync.manifest import CHECKSUM_CHARS, Manifest, ManifestError, views
from skyrl_glm.sync.nogc import paused_gc
from skyrl_glm.sync.staging_pool import StagingPool
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
    tensors: dict[str, torch.Tensor]  # what the engine loads: views of one private buffer (see ``layout``)
    timings: dict[str, float] = field(default_factory=dict)
    # the manifest's layout identity and the engine layout it was arranged in: updates with equal ones have tensors
    # of one structure (names, shapes, strides, dtypes, aliasing); None for a manifest built in code
    structure: tuple[bytes, str] | None = None


def structure_errors(manifest: Manifest) -> str | None:
    """What is wrong with the adapter the manifest describes, from the sent tensors' shapes and the alias structure
    alone (before any byte moves; per sent tensor and per alias rule, not per public name): it has tensors, every
    ``lora_A`` has its ``lora_B`` and back, and every LoRA matrix has the adapter's rank ``r`` on its rank dimension
    (``A [..., r, in]``, ``B [..., out, r]``), whatever its number of dims."""
    if not manifest.tensors:
        return "empty adapter: the update lists no tensors"
    r = manifest.adapter_config["r"]
    index = manifest.names
    shapes = {t.name: t.shape for t in manifest.tensors}
    unpaired: list[str] = []
    wrong_rank: list[str] = []

    def check(label: str, sent: str, pair_present: bool, dim: int) -> None:
        shape = shapes[sent]
        if not pair_present:
            unpaired.append(label)
        elif len(shape) < 2 or shape[dim] != r:
            wrong_rank.append(f"{label} {list(shape)}")

    markers = ((".lora_A.", ".lora_B.", -2), (".lora_B.", ".lora_A.", -1))
    for name, sent in index.explicit.items():
        for mine, other, dim in markers:
            if mine in name:
                check(name, sent, index.sent_of(name.replace(mine, other)) is not None, dim)
    for (head, tail), intervals in index.runs.items():
        for mine, other, dim in markers:
            if mine in head or mine in tail:
                h, t = head.replace(mine, other), tail.replace(mine, other)
                for start, stop, sent in intervals:
                    check(f"{head}[{start}:{stop}]{tail}", sent, index.covers(h, start, stop, t), dim)
    if unpaired:
        return f"missing tensors: {len(unpaired)} lora_A/lora_B without its pair, e.g. {sorted(unpaired)[:2]}"
    if wrong_rank:
        return f"shape mismatch: {len(wrong_rank)} LoRA tensors without rank r={r}, e.g. {sorted(wrong_rank)[:2]}"
    return None


def rebuild(manifest: Manifest, sent: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every public name -> its sent tensor (views, no copies): SkyRL's ``expand_lora_aliases`` for the explicit
    aliases, then the alias runs' names (:meth:`Manifest.run_items`, names kept with the layout) in one update."""
    tensors = expand_lora_aliases(sent, manifest.aliases)
    tensors.update(manifest.run_items(sent[run.sent] for run in manifest.alias_runs))
    return tensors


class AdapterReceiver:
    """Stages updates into private memory on ``device`` and verifies them; tracks the accepted version.

    ``known`` is the manifest of the last update :meth:`receive` accepted (never a rejected one); the next update with
    the identical layout reuses its validation and structure check. It is set on accept, not on :meth:`commit`: what
    it vouches for is the layout's verdict, a pure function of the layout that the update earned whether or not the
    engine then loads it (the version order is commit's, checked separately).

    ``layout``: the engine's routed-expert layout (:mod:`skyrl_glm.sync.expert_layout`); an update that cannot be
    served in it is rejected with the reason. The :class:`~skyrl_glm.sync.expert_layout.Arrangement` of the last
    layout served in it is kept (``arranged``), keyed by the manifest's layout identity (``Manifest.layout_key``): an
    update of another layout, or a manifest built in code (no identity), is arranged anew.

    ``pool``: the staging memory of updates whose adapters are gone, kept with the tensors made of it
    (:mod:`~skyrl_glm.sync.staging_pool`): an update of the same layout lands in one and hands those on, with no
    view or name made again (and its values checked as ever)."""

    def __init__(self, device: str | torch.device = "cpu", layout: str = PER_EXPERT) -> None:
        self.device = torch.device(device)
        self.layout = layout
        self.version: int | None = None
        self.known: Manifest | None = None
        self.arranged: tuple[bytes, Arrangement] | None = None
        self.pool = StagingPool()

    def _admit(
        self, manifest_json: str, handle: dict[str, Any], transport: Transport, staged: Mapping[str, int]
    ) -> tuple[Manifest, float]:
        """Every check that needs no byte of the stream, the stream's size (from the transport) included;
        returns the manifest and the seconds spent asking the transport (a collective waits for the sender)."""
        if not isinstance(handle, dict):
            raise UpdateRejected(f"transport handle must be a JSON object, got {type(handle).__name__}")
        try:
            manifest = Manifest.from_json(manifest_json, known=self.known)
        except ManifestError as e:
            raise UpdateRejected(str(e)) from None
        if self.version is not None and manifest.version <= self.version:
            raise UpdateRejected(f"version {manifest.version} is not newer than the serving version {self.version}")
        newest = staged.get(manifest.lora_name)
        if newest is not None and manifest.version <= newest:
            raise UpdateRejected(
                f"version {manifest.version} of {manifest.lora_name!r} is not newer than version {newest} already "
                "staged here (a second publisher?): an adapter's versions only grow"
            )
        if not manifest.same_layout(self.known):  # an accepted layout passed this check already
            problem = structure_errors(manifest)
            if problem:
                raise UpdateRejected(problem)
        t0 = time.perf_counter()
        try:
            held = transport.incoming_bytes(manifest, handle)
        except TransportError as e:
            raise UpdateRejected(f"transfer failed: {e}") from None
        waited = time.perf_counter() - t0
        if held < manifest.total_bytes:
            raise UpdateRejected(
                f"transfer failed: the manifest claims {manifest.total_bytes} bytes, the transport holds {held}"
            )
        return manifest, waited

    def receive(
        self,
        manifest_json: str,
        handle: dict[str, Any],
        transport: Transport,
        verify: bool = True,
        staged: Mapping[str, int] | None = None,
    ) -> ReceivedAdapter:
        """Validate, receive, verify and rebuild one update, or raise :class:`UpdateRejected` with the reason.
        ``verify=False`` skips the per-tensor checksum and finiteness checks (the structure is always checked).
        ``staged``: adapter name -> the newest version staged and not yet dropped; an update must be newer (two
        publishers of one version: the second is refused, not swapped in under the first's name)."""
        with paused_gc():
            return self._receive(manifest_json, handle, transport, verify, staged or {})

    def _receive(
        self, manifest_json: str, handle: dict[str, Any], transport: Transport, verify: bool, staged: Mapping[str, int]
    ) -> ReceivedAdapter:
        t0 = time.perf_counter()
        try:
            manifest, waited = self._admit(manifest_json, handle, transport, staged)
        except UpdateRejected:
            transport.decline(handle if isinstance(handle, dict) else {})
            raise
        t1 = time.perf_counter()
        # Allocated (or a kept buffer taken) only now: total_bytes is checked against what the sender staged.
        key = None if manifest.layout_key is None else (manifest.layout_key, self.layout, manifest.total_bytes)
        kept = None if key is None else self.pool.take(key)
        if kept is not None:
            staging = kept.staging
        else:
            staging = torch.empty(manifest.total_bytes, dtype=torch.uint8, device=self.device)
        try:
            transport.receive(manifest, handle, staging)
        except TransportError as e:
            raise UpdateRejected(f"transfer failed: {e}") from None
        t2 = time.perf_counter()
        if verify:
            got, finite = span_checks(staging, manifest.spans)
            if got != manifest.checksums:
                first = next(k for k, (a, b) in enumerate(zip(got, manifest.checksums, strict=True)) if a != b)
                i = first // CHECKSUM_CHARS
                name = manifest.tensors[i].name
                raise UpdateRejected(f"checksum mismatch on {name!r} (corrupt or partial transfer)")
            if not finite.all():
                bad = np.flatnonzero(~finite)
                names = [manifest.tensors[i].name for i in bad[:3]]
                raise UpdateRejected(f"non-finite values (NaN/inf) in {names}{'...' if len(bad) > 3 else ''}")
        t3 = time.perf_counter()
        try:
            arrangement = None if self.layout == PER_EXPERT else self._arrangement(manifest)
            if kept is not None:  # its tensors are this layout's, made of this memory: the values are checked
                if arrangement is not None:
                    arrangement.check(kept.sent)
                tensors = dict(kept.tensors)  # a mapping of the caller's own: its references count (see the pool)
            else:
                # per-expert: every public name; else views of the sent tensors the arrangement reads only (a
                # factor's groups: one strided view)
                read = manifest.tensors if arrangement is None else arrangement.reads
                sent = dict(zip((e.name for e in read), views(staging, read), strict=True))
                tensors = rebuild(manifest, sent) if arrangement is None else arrangement.apply(sent)
                if key is not None:
                    self.pool.keep(key, staging, sent, tensors)
                    tensors = dict(tensors)
        except LayoutError as e:
            raise UpdateRejected(str(e)) from None
        timings = {
            "transfer_s": t2 - t1 + waited,
            "verify_s": (t1 - t0 - waited) + (t3 - t2),
            "verify_manifest_s": t1 - t0 - waited,  # of verify_s: parse, checks and structure, before any byte
            "rebuild_s": time.perf_counter() - t3,
        }
        self.known = manifest
        structure = None if manifest.layout_key is None else (manifest.layout_key, self.layout)
        return ReceivedAdapter(
            manifest.version, manifest.lora_name, manifest.adapter_config, tensors, timings, structure
        )

    def _arrangement(self, manifest: Manifest) -> Arrangement:
        """The arrangement of ``manifest``'s layout in the engine's (the kept one for the same layout identity)."""
        key = manifest.layout_key
        if key is not None and self.arranged is not None and self.arranged[0] == key:
            return self.arranged[1]
        arrangement = Arrangement(manifest, self.layout)
        if key is not None:
            self.arranged = (key, arrangement)
        return arrangement

    def commit(self, version: int) -> None:
        """Record ``version`` as serving; call only after the sampler loaded it."""
        self.version = version
