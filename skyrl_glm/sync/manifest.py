"""The sync manifest: plain JSON that says exactly what one adapter update contains.

It travels on the control channel (never pickle: a peer on the sync channel must not be able to run code
in the sampler) and lets the receiver verify the bytes that arrive on the data channel.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

FORMAT = "skyrl-glm/lora-sync/1"
ALIGN = 64  # byte alignment of every tensor in the packed stream

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class ManifestError(ValueError):
    """The manifest is malformed or inconsistent; the update is rejected before any byte is used."""


def dtype_name(dtype: torch.dtype) -> str:
    for name, dt in DTYPES.items():
        if dt == dtype:
            return name
    raise ManifestError(f"unsupported adapter dtype {dtype}; supported: {sorted(DTYPES)}")


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class TensorEntry:
    """One unique tensor on the wire: bytes ``[offset, offset + nbytes)`` of the packed stream."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    checksum: str


def pack_entries(
    items: Iterable[tuple[str, str, tuple[int, ...], int, str]],
) -> tuple[tuple[TensorEntry, ...], int]:
    """Lay tensors out back to back, each at an ``ALIGN``-byte offset: ``(entries, total_bytes)`` from
    ``(name, dtype, shape, nbytes, checksum)`` in stream order."""
    entries, offset = [], 0
    for name, dtype, shape, nbytes, checksum in items:
        entries.append(TensorEntry(name, dtype, tuple(shape), offset, nbytes, checksum))
        offset += align(nbytes)
    return tuple(entries), offset


@dataclass(frozen=True)
class Manifest:
    version: int
    lora_name: str
    adapter_config: dict[str, Any]
    tensors: tuple[TensorEntry, ...]
    aliases: dict[str, str]  # public name -> sent name
    total_bytes: int
    bucket_bytes: int
    format: str = FORMAT
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def public_names(self) -> list[str]:
        return [t.name for t in self.tensors] + list(self.aliases)

    def buckets(self) -> list[tuple[int, int]]:
        """``(start, end)`` byte ranges of the packed stream, each at most ``bucket_bytes`` (or one tensor)."""
        ranges: list[tuple[int, int]] = []
        start = end = 0
        for t in self.tensors:
            t_end = t.offset + align(t.nbytes)
            if end > start and t_end - start > self.bucket_bytes:
                ranges.append((start, end))
                start = t.offset
            end = t_end
        if end > start:
            ranges.append((start, end))
        return ranges

    def receive_target(self) -> dict[str, Any]:
        """SkyRL 0.4's LoRA receive target (``weight_sync/lora_target.py``) for the same update."""
        from skyrl.backends.skyrl_train.weight_sync.lora_target import build_lora_receive_target

        return build_lora_receive_target(self.lora_name, self.adapter_config, self.aliases)

    def to_json(self) -> str:
        d = asdict(self)
        d["tensors"] = [asdict(t) for t in self.tensors]
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        try:
            d = json.loads(text)
            if d.get("format") != FORMAT:
                raise ManifestError(f"unknown manifest format {d.get('format')!r}, expected {FORMAT!r}")
            tensors = tuple(
                TensorEntry(
                    name=str(t["name"]),
                    dtype=str(t["dtype"]),
                    shape=tuple(int(s) for s in t["shape"]),
                    offset=int(t["offset"]),
                    nbytes=int(t["nbytes"]),
                    checksum=str(t["checksum"]),
                )
                for t in d["tensors"]
            )
            m = cls(
                version=int(d["version"]),
                lora_name=str(d["lora_name"]),
                adapter_config=dict(d["adapter_config"]),
                tensors=tensors,
                aliases={str(k): str(v) for k, v in dict(d["aliases"]).items()},
                total_bytes=int(d["total_bytes"]),
                bucket_bytes=int(d["bucket_bytes"]),
                extra=dict(d.get("extra", {})),
            )
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
            raise ManifestError(f"malformed manifest: {type(e).__name__}: {e}") from None
        m.validate()
        return m

    def validate(self) -> None:
        """Structural checks that need no tensor data."""
        if not self.lora_name:
            raise ManifestError("empty lora_name")
        if self.version < 0:
            raise ManifestError(f"negative version {self.version}")
        r, alpha = self.adapter_config.get("r"), self.adapter_config.get("lora_alpha")
        if r is None or alpha != r:
            raise ManifestError(
                f"adapter_config lora_alpha={alpha} != r={r}: the sender must fold alpha/r into lora_B "
                "(vLLM scales lora_B in place on load)"
            )
        names: set[str] = set()
        end = 0
        for t in self.tensors:
            if t.name in names:
                raise ManifestError(f"tensor {t.name!r} listed twice")
            names.add(t.name)
            if t.dtype not in DTYPES:
                raise ManifestError(f"tensor {t.name!r}: unsupported dtype {t.dtype!r}")
            if any(s < 0 for s in t.shape):
                raise ManifestError(f"tensor {t.name!r}: negative shape {t.shape}")
            numel = 1
            for s in t.shape:
                numel *= s
            if t.nbytes != numel * DTYPES[t.dtype].itemsize:
                raise ManifestError(f"tensor {t.name!r}: nbytes {t.nbytes} does not match {t.dtype}{list(t.shape)}")
            if t.offset < end or t.offset % ALIGN:
                raise ManifestError(f"tensor {t.name!r}: offset {t.offset} overlaps or is misaligned")
            end = t.offset + t.nbytes
        if end > self.total_bytes:
            raise ManifestError(f"tensors end at byte {end} > total_bytes {self.total_bytes}")
        for public, sent in self.aliases.items():
            if public in names:
                raise ManifestError(f"alias {public!r} shadows a sent tensor")
            if sent not in names:
                raise ManifestError(f"alias {public!r} -> {sent!r}, which is not sent")
