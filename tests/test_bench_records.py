"""``docs/bench/`` holds one file per measurement under a stable name, each cited from a doc, and every file a doc
cites is there: a new run replaces its measurement's file (git keeps the earlier ones) instead of adding ``_v2``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CITED = re.compile(r"docs/bench/([\w.-]+\.(?:json|txt))")


def _docs() -> str:
    return "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def unrecorded(bench: Path, docs: str) -> list[str]:
    """What is wrong with ``bench`` against the docs' text: files no doc names, versioned names, citations of
    files that are not there."""
    files = sorted(p.name for p in bench.iterdir())
    problems = [f"{f}: cited by no doc" for f in files if f not in docs]
    problems += [f"{f}: a versioned name (replace the measurement's file)" for f in files if re.search(r"_v\d", f)]
    return problems + [f"{f}: cited, not in docs/bench" for f in sorted(set(CITED.findall(docs))) if f not in files]


def test_every_measurement_file_is_cited_and_every_citation_is_there() -> None:
    assert unrecorded(ROOT / "docs" / "bench", _docs()) == []


def test_the_record_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "a_v2.json").write_text("{}")
    docs = "see docs/bench/a.json and docs/bench/gone.json"
    assert unrecorded(tmp_path, docs) == [
        "a_v2.json: cited by no doc",
        "a_v2.json: a versioned name (replace the measurement's file)",
        "gone.json: cited, not in docs/bench",
    ]
