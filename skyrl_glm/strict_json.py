"""JSON reports every parser reads: Python's ``json`` writes NaN and Infinity bare by default, which is not JSON.

A non-finite number becomes ``null``, and the report's top-level ``non_finite`` object says where and what it
was (``{"steps[0].prefill.mean": "nan"}``), so a reader can tell a missing value from a broken one.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

# A list with more non-finite entries than this is reported as one entry with counts.
_LIST_DETAIL = 3


def finite_number(value: object) -> float | None:
    """``value`` read back from JSON as a finite float; None for anything else (not a number, a bool, NaN or an
    infinity, an int past float's range): what a report may draw or average."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _clean(value: Any, path: str, found: dict[str, str]) -> Any:
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        found[path] = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        return None
    if isinstance(value, dict):
        return {k: _clean(v, f"{path}.{k}" if path else str(k), found) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        numbers: dict[str, str] = {}  # this list's own non-finite numbers, summarised when there are many
        out = [_clean(v, f"{path}[{i}]", numbers if isinstance(v, float) else found) for i, v in enumerate(value)]
        if len(numbers) > _LIST_DETAIL:
            counts = Counter(numbers.values())
            found[f"{path}[*]"] = ", ".join(f"{n} of {len(value)} {kind}" for kind, n in sorted(counts.items()))
        else:
            found.update(numbers)
        return out
    return value


def dumps(report: dict[str, Any], **kwargs: Any) -> str:
    """``report`` as strict JSON; non-finite numbers as null, listed under ``non_finite``."""
    found: dict[str, str] = {}
    clean = _clean(report, "", found)
    if found:
        clean["non_finite"] = found
    return json.dumps(clean, allow_nan=False, **kwargs)


def write(report: dict[str, Any], path: str | Path, **kwargs: Any) -> None:
    """``report`` at ``path`` whole or not at all (a run stopped while writing leaves the previous file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.part")
    part.write_text(dumps(report, **kwargs))
    part.replace(path)
