"""The sync manifest: plain JSON that says exactly what one adapter update contains.

It travels on the control channel (never pickle: a peer on the sync channel must not be able to run code
in the sampler) and lets the receiver verify the bytes that arrive on the data channel.

Format ``skyrl-glm/lora-sync/3``: what changes per update (``version``, ``checksums``, ``extra``) beside the
``layout`` (names, dtypes, shapes, offsets, aliases, sizes), which is the same for every update of a run. A receiver
passes the manifest it last accepted as ``known``: an identical layout reuses that manifest's validated objects, and
only the per-update fields are checked (validation is a pure function of the layout, so the verdict is the same).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import hmac
import json
import marshal
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain, repeat
from typing import Any, NamedTuple

import torch

from skyrl_glm.sync.aliases import MAX_INDEX, AliasError, AliasRun, NameIndex, runs_from_json
from skyrl_glm.sync.checksum import CHECKSUM_CHARS, Spans

FORMAT = "skyrl-glm/lora-sync/3"
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


class TensorEntry(NamedTuple):
    """One unique tensor on the wire: bytes ``[offset, offset + nbytes)`` of the packed stream (a tuple: 1,389 of
    them are built per full GLM-5.3 manifest parse, at a third of a frozen dataclass's cost)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Contiguous strides of ``shape``, in elements."""
    out, step = [], 1
    for dim in reversed(shape):
        out.append(step)
        step *= dim
    return tuple(reversed(out))


def views(stream: torch.Tensor, entries: Sequence[TensorEntry]) -> list[torch.Tensor]:
    """Each entry's tensor as a view of the packed ``uint8`` stream (no copy): one typed view of the stream per dtype,
    then one ``as_strided`` per tensor (a third of the cost of slicing and viewing each tensor twice)."""
    out: list[Any] = [None] * len(entries)
    by_dtype: dict[str, list[int]] = {}
    for i, e in enumerate(entries):
        by_dtype.setdefault(e.dtype, []).append(i)
    strides: dict[tuple[int, ...], tuple[int, ...]] = {}
    for dtype, index in by_dtype.items():
        size = DTYPES[dtype].itemsize
        typed = stream[: stream.numel() // size * size].view(DTYPES[dtype])
        base = typed.storage_offset()
        shapes = [entries[i].shape for i in index]
        for s in set(shapes) - strides.keys():
            strides[s] = _strides(s)
        offsets = [base + entries[i].offset // size for i in index]
        typed_views = map(typed.as_strided, shapes, map(strides.__getitem__, shapes), offsets)
        for i, view in zip(index, typed_views, strict=True):
            out[i] = view
    return out


def pack_entries(items: Iterable[tuple[str, str, tuple[int, ...], int]]) -> tuple[tuple[TensorEntry, ...], int]:
    """Lay tensors out back to back, each at an ``ALIGN``-byte offset: ``(entries, total_bytes)`` from
    ``(name, dtype, shape, nbytes)`` in stream order."""
    entries, offset = [], 0
    for name, dtype, shape, nbytes in items:
        entries.append(TensorEntry(name, dtype, tuple(shape), offset, nbytes))
        offset += align(nbytes)
    return tuple(entries), offset


_SEPARATORS = (",", ":")
MAX_INT = 2**63 - 1  # versions, sizes and offsets must fit an int64 (vLLM serialises results with msgpack)
# Caps checked before the work they bound (a full GLM-5.3 rank-32 update: 0.26 MB of JSON, 1,389 tensors, 116,292
# public names of ~80 characters; SkyRL's explicit {public: sent} form of it is 17 MB): a peer cannot make the
# receiver parse, index or build more than this, whatever it sends.
MAX_MANIFEST_BYTES = 32 << 20  # characters of manifest JSON, checked before json.loads
MAX_TENSORS = 1 << 16  # sent tensors, and alias runs
MAX_ALIASES = 1 << 18  # explicit {public: sent} entries
MAX_NAME_CHARS = 1024  # one tensor name, alias name, or run head / tail
MAX_RUN_NAME_BYTES = 64 << 20  # characters of all public names the alias runs expand to
_KIND = {int: "an integer", str: "a string", list: "a list", dict: "an object"}
_HEX_DIGITS = b"0123456789abcdef"


def _lower_hex(text: str) -> bool:
    """Whether ``text`` is lowercase hex digits only (at C speed: 0.3 ms for the 400,000 of 25,000 tensors' checksums,
    a regular expression 1.1 ms on the 2-core CPU machine)."""
    return text.isascii() and not text.encode("ascii").translate(None, _HEX_DIGITS)


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ManifestError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _typed(value: Any, key: str, kind: type, what: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ManifestError(f"{what}: field {key!r} must be {_KIND[kind]}, got {type(value).__name__} {value!r:.40}")
    return value


def _in_range(value: Any, key: str, what: str) -> int:
    """A non-negative JSON integer that fits an int64."""
    _typed(value, key, int, what)
    if not 0 <= value <= MAX_INT:
        raise ManifestError(f"{what}: field {key!r} = {value} is outside 0..2**63-1")
    return value


def _field(d: dict[str, Any], key: str, kind: type, what: str) -> Any:
    if key not in d:
        raise ManifestError(f"{what}: missing field {key!r}")
    return _typed(d[key], key, kind, what)


def _count(d: dict[str, Any], key: str, what: str) -> int:
    if key not in d:
        raise ManifestError(f"{what}: missing field {key!r}")
    return _in_range(d[key], key, what)


_ROW = "[name, dtype, shape, offset, nbytes]"


def _tensor_entries(rows: list[Any]) -> tuple[TensorEntry, ...]:
    """The tensor table. A well-formed table (1,389 rows per full GLM-5.3 update) is checked column-wise at C speed;
    any failure re-reads it row by row for the precise reason."""
    if not rows:
        return ()
    if set(map(type, rows)) == {list} and set(map(len, rows)) == {5}:
        names, dtypes, shapes, offsets, nbytes = zip(*rows, strict=True)
        if {*map(type, names), *map(type, dtypes)} == {str} and set(map(type, shapes)) == {list}:
            ints = [*offsets, *nbytes, *chain.from_iterable(shapes)]
            if set(map(type, ints)) == {int} and min(ints) >= 0 and max(ints) <= MAX_INT:
                return tuple(map(TensorEntry, names, dtypes, map(tuple, shapes), offsets, nbytes))
    return tuple(_tensor_entry(row, i) for i, row in enumerate(rows))


def _tensor_entry(row: Any, i: int) -> TensorEntry:
    if not isinstance(row, list) or len(row) != 5:
        raise ManifestError(f"tensor #{i} must be {_ROW}, got {row!r:.80}")
    name, dtype, shape, offset, nbytes = row
    name = _typed(name, "name", str, f"tensor #{i}")
    what = f"tensor {name!r}"
    _typed(shape, "shape", list, what)
    if any(not isinstance(s, int) or isinstance(s, bool) or not 0 <= s <= MAX_INT for s in shape):
        raise ManifestError(f"{what}: shape {shape!r:.80} must be a list of non-negative integers")
    return TensorEntry(
        name,
        _typed(dtype, "dtype", str, what),
        tuple(shape),
        _in_range(offset, "offset", what),
        _in_range(nbytes, "nbytes", what),
    )


def _aliases(layout: dict[str, Any]) -> dict[str, str]:
    aliases = _field(layout, "aliases", dict, "manifest layout")
    if set(map(type, aliases.values())) - {str}:
        k, v = next((k, v) for k, v in aliases.items() if not isinstance(v, str))
        raise ManifestError(f"alias {k!r} must map to a string, got {type(v).__name__}")
    return aliases


def _longest(names: Iterable[Any]) -> int:
    return max((len(n) for n in names if isinstance(n, str)), default=0)


def _check_caps(layout: dict[str, Any]) -> None:
    """Counts and name lengths of a layout against the caps, before any entry is built or indexed (the types are
    checked after: what is not a list or object here is refused there)."""
    tensors, aliases, runs = (layout.get(k) for k in ("tensors", "aliases", "alias_runs"))
    for key, value, cap in (("tensors", tensors, MAX_TENSORS), ("aliases", aliases, MAX_ALIASES)):
        if isinstance(value, list | dict) and len(value) > cap:
            raise ManifestError(f"manifest layout: {len(value)} {key} exceed the cap of {cap}")
    if isinstance(runs, list) and len(runs) > MAX_TENSORS:
        raise ManifestError(f"manifest layout: {len(runs)} alias runs exceed the cap of {MAX_TENSORS}")
    rows = [r for r in tensors if isinstance(r, list) and r] if isinstance(tensors, list) else []
    well_formed = [r for r in runs if isinstance(r, list) and len(r) == 5] if isinstance(runs, list) else []
    longest = max(
        _longest(r[0] for r in rows),
        _longest(aliases) if isinstance(aliases, dict) else 0,
        _longest(aliases.values()) if isinstance(aliases, dict) else 0,
        _longest(part for r in well_formed for part in (r[0], r[3], r[4])),
    )
    if longest > MAX_NAME_CHARS:
        raise ManifestError(f"manifest layout: a name of {longest} characters exceeds the cap of {MAX_NAME_CHARS}")
    expanded = 0
    for head, start, stop, tail, _ in well_formed:
        ints = all(isinstance(x, int) and not isinstance(x, bool) for x in (start, stop))
        if ints and 0 <= start < stop <= MAX_INDEX:  # other ranges are refused by runs_from_json
            if isinstance(head, str) and isinstance(tail, str):
                expanded += (stop - start) * (len(head) + len(tail) + len(str(stop)) + 1)
    if expanded > MAX_RUN_NAME_BYTES:
        raise ManifestError(
            f"manifest layout: alias runs expand to {expanded} characters of names, over the cap of "
            f"{MAX_RUN_NAME_BYTES}"
        )


_LAYOUT_AT = ',"layout":'


def _around_layout(text: str, layout: str) -> dict[str, Any] | None:
    """The per-update fields of ``text`` when it is exactly ``{FIELDS,"layout":LAYOUT,"extra":{...}}`` with
    ``layout`` the known layout's text (what :meth:`Manifest.to_json` writes for it): the layout then needs no parse
    (at 25,000 sent tensors, grouped experts, its 7.7 MB took 77 ms to parse and key on this CPU, measured
    2026-12-03). None for anything else, which the full parse decides. Exact: the fields before it parse as an
    object once one brace is added (so the layout key sits at the top level, outside any string) and hold exactly
    format, version and checksums, and what follows the layout's text is a comma and the rest of an object: the
    text is then one JSON object, the layout's value the known one byte for byte unless a later key repeats it
    (then that one wins, as in JSON; the caller sees it in the fields returned)."""
    cut = text.find(_LAYOUT_AT)
    after = cut + len(_LAYOUT_AT) + len(layout)
    if cut < 0 or not text.startswith(layout, cut + len(_LAYOUT_AT)) or text[after : after + 1] != ",":
        return None
    try:
        head, tail = json.loads(text[:cut] + "}"), json.loads("{" + text[after + 1 :])
    except (ValueError, RecursionError):
        return None
    if not (isinstance(head, dict) and isinstance(tail, dict)) or head.keys() != {"format", "version", "checksums"}:
        return None
    return {**head, **tail}


def _layout_key(layout: dict[str, Any]) -> bytes | None:
    """The layout's identity: ``marshal`` version 2 (no object references) writes each JSON value with its type, so
    equal keys mean the same values of the same types (``==`` alone takes ``1``, ``1.0`` and ``true`` for one
    another); 0.2 ms for a full GLM-5.3 layout. None for a value too deep to marshal (no memo then)."""
    try:
        return marshal.dumps(layout, 2)
    except ValueError:
        return None


# what Manifest derives from its layout alone (cached properties), handed on to a manifest of the same layout
_LAYOUT_CACHES = ("names", "spans", "run_names", "layout_json", "layout_digest")
# The reason a receiver gives for a manifest that names a layout it does not hold (its first words): the sender
# then sends the layout itself (:meth:`Manifest.to_json`).
UNKNOWN_LAYOUT = "unknown layout"


@dataclass(frozen=True)
class Manifest:
    version: int
    lora_name: str
    adapter_config: dict[str, Any]
    tensors: tuple[TensorEntry, ...]
    aliases: dict[str, str]  # public name -> sent name
    total_bytes: int
    bucket_bytes: int
    # CHECKSUM_CHARS lowercase hex digits per tensor, in tensor order: one string, checked and compared in one go
    checksums: str
    format: str = FORMAT
    extra: dict[str, Any] = field(default_factory=dict)
    alias_runs: tuple[AliasRun, ...] = ()  # compact rules for most aliases (see ``sync/aliases.py``)
    # set by from_json: the parsed layout's identity (see _layout_key); None for a manifest built in code
    layout_key: bytes | None = field(default=None, init=False, compare=False, repr=False)

    @cached_property
    def names(self) -> NameIndex:
        """Every public name (sent, explicit aliases, runs) without expanding the runs; raises ``AliasError``
        when two rules give one name."""
        explicit = {t.name: t.name for t in self.tensors}
        explicit.update(self.aliases)
        return NameIndex(explicit, self.alias_runs)

    @cached_property
    def spans(self) -> Spans:
        """``(offset, nbytes, dtype)`` per tensor: what :func:`~skyrl_glm.sync.checksum.span_checks` reads, with what
        it derives from them (kept with the layout, like every cache here)."""
        return Spans([(t.offset, t.nbytes, t.dtype) for t in self.tensors])

    @cached_property
    def run_names(self) -> list[str]:
        """Every alias run's public names, run after run (116,292 strings per full GLM-5.3 update: built once per
        layout, since the memo of :meth:`from_json` hands them on)."""
        return list(chain.from_iterable(run.names() for run in self.alias_runs))

    def checksum(self, i: int) -> str:
        """Tensor ``i``'s checksum."""
        return self.checksums[i * CHECKSUM_CHARS : (i + 1) * CHECKSUM_CHARS]

    def same_layout(self, other: Manifest | None) -> bool:
        """Whether both were parsed from one layout (``from_json`` with ``known=other`` reused ``other``'s)."""
        return other is not None and self.layout_key is not None and self.layout_key == other.layout_key

    def run_items(self, per_run: Iterable[Any]) -> Iterator[tuple[str, Any]]:
        """``(public name, value)`` for every name of every alias run, ``per_run`` giving one value per run in run
        order: the runs expanded through :attr:`run_names` (built once per layout), no dict per run."""
        lengths = [run.stop - run.start for run in self.alias_runs]
        return zip(self.run_names, chain.from_iterable(map(repeat, per_run, lengths)), strict=True)

    def alias_map(self) -> dict[str, str]:
        """Every alias as ``{public: sent}`` (runs expanded; SkyRL's wire form)."""
        out = dict(self.aliases)
        out.update(self.run_items(run.sent for run in self.alias_runs))
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

    @cached_property
    def layout_json(self) -> str:
        """The ``layout`` object as JSON text (written once per layout: :meth:`with_update` hands it on)."""
        layout = {
            "lora_name": self.lora_name,
            "adapter_config": self.adapter_config,
            "tensors": [[t.name, t.dtype, t.shape, t.offset, t.nbytes] for t in self.tensors],
            "aliases": self.aliases,
            "alias_runs": [r.to_json() for r in self.alias_runs],
            "total_bytes": self.total_bytes,
            "bucket_bytes": self.bucket_bytes,
        }
        return json.dumps(layout, separators=_SEPARATORS)

    @cached_property
    def layout_digest(self) -> str:
        """SHA-256 of :attr:`layout_json` (hex): the name by which a manifest refers to a layout the receiver holds."""
        return hashlib.sha256(self.layout_json.encode()).hexdigest()

    def to_json(self, layout: bool = True) -> str:
        """The manifest as compact JSON: the per-update fields around the layout's text (the same text as one
        ``json.dumps`` of the whole object). ``layout=False``: the layout by its digest (``layout_digest``), for a
        receiver that accepted this layout already: at 25,014 sent tensors (grouped experts at 75 layers) the layout
        is 7.3 MB of the 7.7, the same every update."""
        head = {"format": self.format, "version": self.version, "checksums": self.checksums}
        extra = json.dumps(self.extra, separators=_SEPARATORS)
        body = f'"layout":{self.layout_json}' if layout else f'"layout_digest":"{self.layout_digest}"'
        return f'{json.dumps(head, separators=_SEPARATORS)[:-1]},{body},"extra":{extra}}}'

    def with_update(self, version: int, checksums: str, extra: dict[str, Any] | None = None) -> Manifest:
        """This layout with another update's ``version``, ``checksums`` and ``extra``: the layout's objects and
        everything derived from them alone (name index, spans, run names, layout JSON) are shared, and only the
        per-update fields are checked (validation is a pure function of the layout)."""
        m = dataclasses.replace(self, version=version, checksums=checksums, extra={} if extra is None else extra)
        m.__dict__.update({k: self.__dict__[k] for k in _LAYOUT_CACHES if k in self.__dict__})
        object.__setattr__(m, "layout_key", self.layout_key)
        m._check_update_fields()
        return m

    @classmethod
    def from_json(cls, text: str, known: Manifest | None = None) -> Manifest:
        """Parse with strict JSON types (no coercion: ``"7"``, ``7.9`` and ``true`` are not versions), then
        :meth:`validate`. Every problem is one :class:`ManifestError` naming the field.

        ``known``: a manifest the caller parsed here before and accepted. When the layout is identical to known's
        (its text, :func:`_around_layout`, read without parsing it; or its value, :func:`_layout_key`; or named by
        its digest, ``layout_digest``, in place of the layout), known's validated tensor table, alias runs and name
        index are reused and only ``version``, ``checksums`` and ``extra`` are checked; any other layout is
        validated in full. A digest that names no layout held here is refused with :data:`UNKNOWN_LAYOUT`."""
        if not isinstance(text, str):
            raise ManifestError(f"manifest must be JSON text, got {type(text).__name__}")
        if len(text) > MAX_MANIFEST_BYTES:
            raise ManifestError(f"manifest of {len(text)} characters exceeds the cap of {MAX_MANIFEST_BYTES}")
        d = _around_layout(text, known.layout_json) if known is not None and known.layout_key is not None else None
        by_text = d is not None
        if d is None:
            try:
                d = json.loads(text)
            except (ValueError, RecursionError) as e:  # ValueError: also an integer of more digits than Python takes
                raise ManifestError(f"manifest is not valid JSON: {e}") from None
            d = _object(d, "manifest")
        if d.get("format") != FORMAT:
            raise ManifestError(f"unknown manifest format {d.get('format')!r}, expected {FORMAT!r}")
        version = _count(d, "version", "manifest")
        checksums = _field(d, "checksums", str, "manifest")
        extra = _field(d, "extra", dict, "manifest") if "extra" in d else {}
        if "layout" in d and "layout_digest" in d:
            raise ManifestError("manifest: both layout and layout_digest (send one)")
        if "layout" in d:
            layout = _field(d, "layout", dict, "manifest")
            key = _layout_key(layout)
        elif by_text:  # known's layout, by its text
            layout, key = None, known.layout_key  # type: ignore[union-attr]  # _around_layout had known
        elif "layout_digest" not in d:
            raise ManifestError("manifest: missing field 'layout' (or 'layout_digest', naming one held here)")
        else:
            digest = _field(d, "layout_digest", str, "manifest")
            held = known is not None and known.layout_key is not None and digest.isascii()
            if not (held and hmac.compare_digest(digest, known.layout_digest)):  # type: ignore[union-attr]
                raise ManifestError(
                    f"{UNKNOWN_LAYOUT} {digest[:16]!r}: no layout of that digest was accepted here "
                    "(the sender sends the layout itself)"
                )
            layout, key = None, known.layout_key
        if known is not None and key is not None and key == known.layout_key:
            m = cls(
                version=version,
                lora_name=known.lora_name,
                # equal to known's; a fresh dict the caller may keep
                adapter_config=copy.deepcopy(known.adapter_config) if layout is None else layout["adapter_config"],
                tensors=known.tensors,
                aliases=known.aliases if layout is None else layout["aliases"],
                total_bytes=known.total_bytes,
                bucket_bytes=known.bucket_bytes,
                checksums=checksums,
                extra=extra,
                alias_runs=known.alias_runs,
            )
            m.__dict__.update({k: known.__dict__[k] for k in _LAYOUT_CACHES if k in known.__dict__})
            m._check_update_fields()
        else:
            what = "manifest layout"
            assert layout is not None  # only known's layout is read by its text
            _check_caps(layout)
            try:
                runs = runs_from_json(_field(layout, "alias_runs", list, what))
            except AliasError as e:
                raise ManifestError(str(e)) from None
            m = cls(
                version=version,
                lora_name=_field(layout, "lora_name", str, what),
                adapter_config=_field(layout, "adapter_config", dict, what),
                tensors=_tensor_entries(_field(layout, "tensors", list, what)),
                aliases=_aliases(layout),
                total_bytes=_count(layout, "total_bytes", what),
                bucket_bytes=_count(layout, "bucket_bytes", what),
                checksums=checksums,
                extra=extra,
                alias_runs=runs,
            )
            m.validate()
        object.__setattr__(m, "layout_key", key)
        return m

    def _check_update_fields(self) -> None:
        """The per-update fields: version and the checksums (their count follows the tensor table)."""
        if not isinstance(self.version, int) or isinstance(self.version, bool) or not 0 <= self.version <= MAX_INT:
            raise ManifestError(f"version {self.version!r} is not an integer in 0..2**63-1")
        want = CHECKSUM_CHARS * len(self.tensors)
        if len(self.checksums) != want:
            raise ManifestError(
                f"checksums: {len(self.checksums)} characters for {len(self.tensors)} tensors, expected {want}"
            )
        if not _lower_hex(self.checksums):
            raise ManifestError("checksums: not all lowercase hex digits")

    def validate(self) -> None:
        """Structural checks that need no tensor data."""
        if not self.lora_name:
            raise ManifestError("empty lora_name")
        self._check_update_fields()
        for key in ("total_bytes", "bucket_bytes"):
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
            if t.nbytes != math.prod(t.shape) * DTYPES[t.dtype].itemsize:
                raise ManifestError(f"tensor {t.name!r}: nbytes {t.nbytes} does not match {t.dtype}{list(t.shape)}")
            if t.offset < end or t.offset % ALIGN:
                raise ManifestError(f"tensor {t.name!r}: offset {t.offset} overlaps or is misaligned")
            end = t.offset + t.nbytes
        if end > self.total_bytes:
            raise ManifestError(f"tensors end at byte {end} > total_bytes {self.total_bytes}")
        if not names.isdisjoint(self.aliases):
            public = next(p for p in self.aliases if p in names)
            raise ManifestError(f"alias {public!r} shadows a sent tensor")
        if not names.issuperset(self.aliases.values()):
            public, sent = next((p, s) for p, s in self.aliases.items() if s not in names)
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
