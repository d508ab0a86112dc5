"""The sync manifest: plain JSON that says exactly what one adapter update contains.

It travels on the control channel (never pickle: a peer on the sync channel must not be able to run code
in the sampler) and lets the receiver verify the bytes that arrive on the data channel.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from skyrl_glm.sync.aliases import AliasError, AliasRun, NameIndex

FORMAT = "skyrl-glm/lora-sync/2"
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


def views(stream: torch.Tensor, entries: Sequence[TensorEntry]) -> list[torch.Tensor]:
    """Each entry's tensor as a view of the packed ``uint8`` stream (no copy)."""
    return [stream[e.offset : e.offset + e.nbytes].view(DTYPES[e.dtype]).view(e.shape) for e in entries]


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


MAX_INT = 2**63 - 1  # versions, sizes and offsets must fit an int64 (vLLM serialises results with msgpack)


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ManifestError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _field(d: dict[str, Any], key: str, kind: type, what: str) -> Any:
    if key not in d:
        raise ManifestError(f"{what}: missing field {key!r}")
    value = d[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ManifestError(f"{what}: field {key!r} must be {_KIND[kind]}, got {type(value).__name__} {value!r:.40}")
    return value


def _count(d: dict[str, Any], key: str, what: str) -> int:
    """A non-negative JSON integer that fits an int64."""
    value = _field(d, key, int, what)
    if not 0 <= value <= MAX_INT:
        raise ManifestError(f"{what}: field {key!r} = {value} is outside 0..2**63-1")
    return value


_KIND = {int: "an integer", str: "a string", list: "a list", dict: "an object"}
_CHECKSUM = re.compile(r"[0-9a-f]{32}")


def _tensor_entry(raw: Any, i: int) -> TensorEntry:
    # Fast path for a well-formed entry (1,389 per full GLM-5.3 update); anything else gets the precise reason.
    if type(raw) is dict and len(raw) == 6:
        name, dtype, shape = raw.get("name"), raw.get("dtype"), raw.get("shape")
        offset, nbytes, checksum = raw.get("offset"), raw.get("nbytes"), raw.get("checksum")
        if (
            type(name) is str
            and type(dtype) is str
            and type(shape) is list
            and all(type(x) is int and 0 <= x <= MAX_INT for x in shape)
            and type(offset) is int
            and 0 <= offset <= MAX_INT
            and type(nbytes) is int
            and 0 <= nbytes <= MAX_INT
            and type(checksum) is str
            and _CHECKSUM.fullmatch(checksum)
        ):
            return TensorEntry(name, dtype, tuple(shape), offset, nbytes, checksum)
    return _tensor_entry_checked(raw, i)


def _tensor_entry_checked(raw: Any, i: int) -> TensorEntry:
    what = f"tensor #{i}"
    t = _object(raw, what)
    name = _field(t, "name", str, what)
    what = f"tensor {name!r}"
    shape = _field(t, "shape", list, what)
    if any(not isinstance(s, int) or isinstance(s, bool) or not 0 <= s <= MAX_INT for s in shape):
        raise ManifestError(f"{what}: shape {shape!r:.80} must be a list of non-negative integers")
    checksum = _field(t, "checksum", str, what)
    if not _CHECKSUM.fullmatch(checksum):
        raise ManifestError(f"{what}: checksum {checksum!r:.40} is not 32 lowercase hex digits")
    return TensorEntry(
        name=name,
        dtype=_field(t, "dtype", str, what),
        shape=tuple(shape),
        offset=_count(t, "offset", what),
        nbytes=_count(t, "nbytes", what),
        checksum=checksum,
    )


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
    alias_runs: tuple[AliasRun, ...] = ()  # compact rules for most aliases (see ``sync/aliases.py``)

    @cached_property
    def names(self) -> NameIndex:
        """Every public name (sent, explicit aliases, runs) without expanding the runs; raises ``AliasError``
        when two rules give one name."""
        explicit = {t.name: t.name for t in self.tensors}
        explicit.update(self.aliases)
        return NameIndex(explicit, self.alias_runs)

    def alias_map(self) -> dict[str, str]:
        """Every alias as ``{public: sent}`` (runs expanded; SkyRL's wire form)."""
        out = dict(self.aliases)
        for run in self.alias_runs:
            out.update(dict.fromkeys(run.names(), run.sent))
        for t in self.tensors:
            out.pop(t.name, None)
        return out

    @property
    def public_names(self) -> list[str]:
        return [t.name for t in self.tensors] + list(self.alias_map())

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

        return build_lora_receive_target(self.lora_name, self.adapter_config, self.alias_map())

    def to_json(self) -> str:
        d = {
            "format": self.format,
            "version": self.version,
            "lora_name": self.lora_name,
            "adapter_config": self.adapter_config,
            "tensors": [
                {
                    "name": t.name,
                    "dtype": t.dtype,
                    "shape": t.shape,
                    "offset": t.offset,
                    "nbytes": t.nbytes,
                    "checksum": t.checksum,
                }
                for t in self.tensors
            ],
            "aliases": self.aliases,
            "alias_runs": [r.to_json() for r in self.alias_runs],
            "total_bytes": self.total_bytes,
            "bucket_bytes": self.bucket_bytes,
            "extra": self.extra,
        }
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse with strict JSON types (no coercion: ``"7"``, ``7.9`` and ``true`` are not versions), then
        :meth:`validate`. Every problem is one :class:`ManifestError` naming the field."""
        if not isinstance(text, str):
            raise ManifestError(f"manifest must be JSON text, got {type(text).__name__}")
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise ManifestError(f"manifest is not valid JSON: {e}") from None
        d = _object(d, "manifest")
        if d.get("format") != FORMAT:
            raise ManifestError(f"unknown manifest format {d.get('format')!r}, expected {FORMAT!r}")
        raw_tensors = _field(d, "tensors", list, "manifest")
        tensors = tuple(_tensor_entry(t, i) for i, t in enumerate(raw_tensors))
        aliases = _field(d, "aliases", dict, "manifest")
        for k, v in aliases.items():
            if not isinstance(v, str):
                raise ManifestError(f"alias {k!r} must map to a string, got {type(v).__name__}")
        try:
            runs = tuple(AliasRun.from_json(r, i) for i, r in enumerate(_field(d, "alias_runs", list, "manifest")))
        except AliasError as e:
            raise ManifestError(str(e)) from None
        m = cls(
            version=_count(d, "version", "manifest"),
            lora_name=_field(d, "lora_name", str, "manifest"),
            adapter_config=_field(d, "adapter_config", dict, "manifest"),
            tensors=tensors,
            aliases=aliases,
            total_bytes=_count(d, "total_bytes", "manifest"),
            bucket_bytes=_count(d, "bucket_bytes", "manifest"),
            extra=_field(d, "extra", dict, "manifest") if "extra" in d else {},
            alias_runs=runs,
        )
        m.validate()
        return m

    def validate(self) -> None:
        """Structural checks that need no tensor data."""
        if not self.lora_name:
            raise ManifestError("empty lora_name")
        for key in ("version", "total_bytes", "bucket_bytes"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_INT:
                raise ManifestError(f"{key} {value!r} is not an integer in 0..2**63-1")
        r, alpha = self.adapter_config.get("r"), self.adapter_config.get("lora_alpha")
        if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
            raise ManifestError(f"adapter_config r={r!r} is not a positive integer")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha != r:
            raise ManifestError(
                f"adapter_config lora_alpha={alpha!r} != r={r}: the sender must fold alpha/r into lora_B "
                "(vLLM scales lora_B in place on load)"
            )
        for key in ("rank_pattern", "alpha_pattern"):
            if self.adapter_config.get(key):
                raise ManifestError(f"adapter_config {key} is not supported: one rank and one alpha per adapter")
        names: set[str] = set()
        end = 0
        for t in self.tensors:
            if t.name in names:
                raise ManifestError(f"tensor {t.name!r} listed twice")
            names.add(t.name)
            if t.dtype not in DTYPES:
                raise ManifestError(f"tensor {t.name!r}: unsupported dtype {t.dtype!r}")
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
        for run in self.alias_runs:
            if run.sent not in names:
                raise ManifestError(
                    f"alias run {run.head}[{run.start}:{run.stop}]{run.tail} -> {run.sent!r}, which is not sent"
                )
        try:
            self.names  # noqa: B018 - builds the index: two rules naming one public name are refused here
        except AliasError as e:
            raise ManifestError(str(e)) from None
