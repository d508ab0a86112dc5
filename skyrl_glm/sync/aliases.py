"""The alias structure of an update, as compact exact rules instead of one entry per public name.

A full GLM-5.3 export shows 1,389 unique tensors under 116,292 public names; as a ``{public: sent}`` map that is
17 MB of JSON to write, parse and check on every update. Nearly all aliases are *runs*: the public names
``head + str(i) + tail`` for ``i`` in ``[start, stop)`` (one expert index range of one layer's projection) all show
one sent tensor. An :class:`AliasRun` says exactly that; names that fit no run stay explicit ``{public: sent}``
entries. Both sides use the runs without expanding them, except to build the public dict at the end:

* the sender (:func:`cover`) turns each sent tensor's public names (stream order) into runs plus leftovers,
  all sent tensors' names in one pass over their joined text, and a run is kept only when its expansion equals
  those names exactly;
* the receiver (:class:`NameIndex`) checks that no two rules give the same public name and finds a name's pair
  (``lora_A`` <-> ``lora_B``) or coverage by interval arithmetic over the runs, never over 116k strings.

A run's index is one whole dotted component (``head`` ends with ``.``, ``tail`` starts with ``.``), written as
``str(i)``; a run whose names another run could also produce, read at another component, is refused.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat

MAX_INDEX = 1 << 20  # largest run index accepted from a peer (an expert index, not a memory size)
MAX_RUN_NAMES = 1 << 24  # public names all runs of one update may expand to


class AliasError(ValueError):
    """The alias rules are malformed or ambiguous."""


_DIGITS: list[str] = []


def _digits(start: int, stop: int) -> list[str]:
    """``[str(i) for i in range(start, stop)]`` from a cache (run names are built and checked in bulk)."""
    if stop > len(_DIGITS):
        _DIGITS.extend(map(str, range(len(_DIGITS), max(stop, 2 * len(_DIGITS), 1024))))
    return _DIGITS[start:stop]


def _joined(head: str, start: int, stop: int, tail: str) -> str:
    """The names ``head + str(i) + tail``, ``i`` in ``[start, stop)``, joined by newlines (one C-level join)."""
    return head + (tail + "\n" + head).join(_digits(start, stop)) + tail


@dataclass(frozen=True)
class AliasRun:
    """Public names ``head + str(i) + tail`` for ``i`` in ``[start, stop)`` all show the sent tensor ``sent``
    (which may itself be one of them)."""

    head: str
    start: int
    stop: int
    tail: str
    sent: str

    def names(self) -> list[str]:
        return _joined(self.head, self.start, self.stop, self.tail).split("\n")

    def to_json(self) -> list:
        return [self.head, self.start, self.stop, self.tail, self.sent]

    @classmethod
    def from_json(cls, raw: object, i: int) -> AliasRun:
        ok = isinstance(raw, list) and len(raw) == 5
        if ok:
            head, start, stop, tail, sent = raw
            ok = all(isinstance(x, str) for x in (head, tail, sent)) and all(
                isinstance(x, int) and not isinstance(x, bool) for x in (start, stop)
            )
        if not ok:
            raise AliasError(f"alias run #{i} must be [head, start, stop, tail, sent], got {raw!r:.120}")
        run = cls(head, start, stop, tail, sent)
        if not 0 <= start < stop <= MAX_INDEX:
            raise AliasError(f"alias run #{i}: range [{start}, {stop}) is empty or outside 0..{MAX_INDEX}")
        if not head.endswith(".") or not tail.startswith(".") or "\n" in head or "\n" in tail:
            raise AliasError(f"alias run #{i}: the index must be a whole dotted component ({head!r} .. {tail!r})")
        return run


def runs_from_json(raw: list) -> tuple[AliasRun, ...]:
    """Every run of a manifest. Well-formed runs (~450 per full GLM-5.3 update) are checked column-wise at C speed;
    any failure re-reads them one by one (:meth:`AliasRun.from_json`) for the precise reason."""
    if raw and set(map(type, raw)) == {list} and set(map(len, raw)) == {5}:
        heads, starts, stops, tails, sents = zip(*raw, strict=True)
        if (
            {*map(type, heads), *map(type, tails), *map(type, sents)} == {str}
            and {*map(type, starts), *map(type, stops)} == {int}
            and all(map(_ordered, starts, stops))
            and all(map(str.endswith, heads, repeat(".")))
            and all(map(str.startswith, tails, repeat(".")))
            and "\n" not in "".join(heads) + "".join(tails)
        ):
            return tuple(map(AliasRun, heads, starts, stops, tails, sents))
    return tuple(AliasRun.from_json(r, i) for i, r in enumerate(raw))


def _ordered(start: int, stop: int) -> bool:
    return 0 <= start < stop <= MAX_INDEX


_INDEX = re.compile(r"(?<=\.)(?:0|[1-9][0-9]*)(?=\.)")


def split_index(name: str, last: bool = True) -> list[tuple[str, int, str]]:
    """Every way to read ``name`` as ``head + str(i) + tail`` with ``i`` a whole dotted component (canonical
    decimal), last component first when ``last``."""
    out = [(name[: m.start()], int(m[0]), name[m.end() :]) for m in _INDEX.finditer(name)]
    return out[::-1] if last else out


def cover(
    names: Sequence[str], ends: Sequence[int], sents: Sequence[str], min_run: int = 3
) -> tuple[list[AliasRun], list[tuple[str, str]]]:
    """Cover groups of public names with runs of at least ``min_run`` names: group ``k`` is ``names`` up to
    ``ends[k]``, all showing the sent tensor ``sents[k]``, in stream order. Returns the runs and, in order, the
    names in none with their sent tensor. Exact and in bulk: the names are joined once, and a run is kept only if
    its expansion, joined, is that text from the run's first name up to a name boundary (compared in place; the
    run's length is found by probing single names). Names holding a newline would blur the boundaries: then every
    name is left out."""
    text = "\n".join(names)
    plain = text.count("\n") == len(names) - 1
    runs: list[AliasRun] = []
    lone: list[tuple[str, str]] = []
    i = at = 0  # the name looked at, and where it starts in ``text``
    for end, sent in zip(ends, sents, strict=True):
        while i < end:
            taken = 1
            for head, idx, tail in split_index(names[i])[:1] if plain and end - i >= min_run else []:
                # the longest k for which names[i + k - 1] is the run's k-th name (binary search on probes) ...
                lo, hi = 1, min(end - i, MAX_INDEX - idx)
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if names[i + mid - 1] == head + str(idx + mid - 1) + tail:
                        lo = mid
                    else:
                        hi = mid - 1
                # ... kept only when every name in between is the run's too
                joined = _joined(head, idx, idx + lo, tail) if lo >= min_run else ""
                stop = at + len(joined)
                if joined and text.startswith(joined, at) and (stop == len(text) or text[stop] == "\n"):
                    runs.append(AliasRun(head, idx, idx + lo, tail, sent))
                    taken, at = lo, stop + 1
            if taken == 1:
                lone.append((names[i], sent))
                at += len(names[i]) + 1
            i += taken
    return runs, lone


class NameIndex:
    """The public names of an update (explicit names plus runs) as intervals per ``(head, tail)`` template:
    membership, the sent tensor behind a name, and overlap detection, without expanding the runs."""

    def __init__(self, explicit: dict[str, str], runs: Iterable[AliasRun]) -> None:
        """``explicit``: public name -> sent name, sent names included (mapping to themselves)."""
        self.explicit = explicit
        self.runs: dict[tuple[str, str], list[tuple[int, int, str]]] = {}
        total = 0
        for run in runs:
            self.runs.setdefault((run.head, run.tail), []).append((run.start, run.stop, run.sent))
            total += run.stop - run.start
        if total > MAX_RUN_NAMES:
            raise AliasError(f"alias runs expand to {total} names (at most {MAX_RUN_NAMES})")
        for key, intervals in self.runs.items():
            intervals.sort()
            for (_, stop, a), (start, _, b) in zip(intervals, intervals[1:], strict=False):
                if start < stop:
                    raise AliasError(f"alias runs {key[0]}[...]{key[1]} overlap at index {start} ({a!r}, {b!r})")
        self._starts = {k: [iv[0] for iv in v] for k, v in self.runs.items()}
        tails: dict[str, list[str]] = {}
        for head, tail in self.runs:
            tails.setdefault(head, []).append(tail)
        self._check_unambiguous(tails)
        # Only a name with a run's head and a run's tail can be in a run: two C-level tests skip the rest.
        heads, ends = tuple(tails), tuple({tail for _, tail in self.runs})
        for name, sent in explicit.items():
            if name.startswith(heads) and name.endswith(ends):
                run_sent = self._in_run(name)
                if run_sent is not None and not (name == sent == run_sent):
                    raise AliasError(f"public name {name!r} is both explicit and in an alias run")

    def _check_unambiguous(self, tails: dict[str, list[str]]) -> None:
        """No name of one run is also a name of another run read at another component: for run ``(h1, t1)`` and a
        numeric component ``j`` of ``h1`` (``h1 = h2 + j + rest``), a run ``(h2, t2)`` with ``t2 = rest + i + t1``
        names ``h1 + i + t1`` too when ``i`` is in the first run's range and ``j`` in the second's. ``tails``: the
        run tails per head (each head is split once)."""
        for head, own_tails in tails.items():
            for h2, j, rest in split_index(head + "x"):
                rest = rest[:-1]  # drop the "x" that made the index's own component not count
                for t2 in tails.get(h2, ()):
                    for tail in own_tails:
                        middle = t2[len(rest) : len(t2) - len(tail)]
                        if not (t2.startswith(rest) and t2.endswith(tail) and len(t2) >= len(rest) + len(tail)):
                            continue
                        if not middle.isdigit() or not middle.isascii() or (middle != "0" and middle[0] == "0"):
                            continue
                        if self._interval((head, tail), int(middle)) and self._interval((h2, t2), j):
                            raise AliasError(f"alias runs {head}[...]{tail} and {h2}[...]{t2} can name the same tensor")

    def _in_run(self, name: str) -> str | None:
        """The sent name a run gives ``name``, or None."""
        for head, i, tail in split_index(name):
            hit = self._interval((head, tail), i)
            if hit is not None:
                return hit[2]
        return None

    def _interval(self, key: tuple[str, str], i: int) -> tuple[int, int, str] | None:
        starts = self._starts.get(key)
        if not starts:
            return None
        k = bisect.bisect_right(starts, i) - 1
        if k >= 0:
            iv = self.runs[key][k]
            if iv[0] <= i < iv[1]:
                return iv
        return None

    def sent_of(self, name: str) -> str | None:
        """The sent tensor ``name`` shows, or None when the update has no such public name."""
        sent = self.explicit.get(name)
        return sent if sent is not None else self._in_run(name)

    def covers(self, head: str, start: int, stop: int, tail: str) -> bool:
        """Whether every name ``head + str(i) + tail``, ``i`` in ``[start, stop)``, is a public name."""
        i = start
        while i < stop:
            iv = self._interval((head, tail), i)
            if iv is not None:
                i = iv[1]
            elif head + str(i) + tail in self.explicit:
                i += 1
            else:
                return False
        return True

    def count(self) -> int:
        """Public names: explicit ones plus run names that are not also explicit (a run's own sent name)."""
        total = len(self.explicit)
        for intervals in self.runs.values():
            total += sum(stop - start for start, stop, _ in intervals)
        overlap = sum(1 for name in self.explicit if self._in_run(name) is not None)
        return total - overlap
