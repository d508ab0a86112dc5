"""``skyrl-glm data prepare``: DAPO-Math-17k and AIME 2024 into the parquet SkyRL's ``PromptDataset`` reads.

Output rows follow the public DAPO files' schema, which is also what skyrl_gym's ``aime`` env and our ``glm_math``
env read: ``prompt`` (chat messages), ``reward_model.ground_truth``, ``data_source``, ``ability``, ``extra_info``,
plus ``env_class`` so the rows pick the GLM reward. Facts about the public files (BytedTsinghua-SIA/DAPO-Math-17k,
BytedTsinghua-SIA/AIME-2024): the training file is about 17.9 k prompts repeated about 100 times (1.79 M rows) and
a few prompts carry two different answers; the AIME file is 30 problems x 32 copies. Both are reduced to one row per
prompt and prompts with conflicting answers are dropped (as SkyRL's DAPO preparation does), so an epoch and mean@n
mean what they say; repeated eval samples come from ``generator.eval_n_samples_per_prompt`` instead. Ground truths
are checked and written as canonical integers (:func:`ground_truth`); any bad row stops the run with the rows named
and nothing written, and the output appears whole or not at all (written beside its name, then renamed).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_glm.dapo.env import ENV_ID
from skyrl_glm.usage import UsageError

# The instruction the public DAPO files wrap every problem in (used for sources that ship bare problems).
DAPO_PROMPT = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


@dataclass(frozen=True)
class DatasetKind:
    """One dataset ``data prepare`` knows: its output file and its ``data_source`` (SkyRL groups eval metrics and
    dumps by it; an eval set always gets its own, a training set keeps the one its rows carry)."""

    name: str
    filename: str
    data_source: str
    own_source: bool


KINDS = {
    "dapo-math": DatasetKind("dapo-math", "dapo-math-17k.parquet", "math_dapo", own_source=False),
    "aime2024": DatasetKind("aime2024", "aime-2024.parquet", "aime2024", own_source=True),
}


class DataError(UsageError):
    """Input that is not a dataset in a known schema, or rows that would train on a wrong reward (the message names
    the rows and the fields; nothing is written)."""


@dataclass(frozen=True)
class Prepared:
    """What one ``prepare`` call read and wrote."""

    path: Path
    rows_in: int
    unique_prompts: int
    conflicts_dropped: int
    rows_out: int


# Integers as the public files write them: ``33``, ``-4``, ``+033``, ``33.0``, ``1,000``.
_INTEGER = re.compile(r"[+-]?(?:\d+|[1-9]\d{0,2}(?:,\d{3})+)(?:\.0*)?")
_MAX_REASONS = 5
# Ground truths hold at most this many digits (AIME answers have 3; a longer "integer" is a corrupt cell), and a
# float one at most 2**53 (beyond that a float is not the integer the file meant: 2**60 + 1 reads as 2**60).
MAX_DIGITS = 20
MAX_EXACT_FLOAT = 2**53
# Bounds on an input file, checked before a third-party parser reads it (a DAPO row nests 4 levels: row, prompt
# list, message, text).
MAX_DEPTH = 32
MAX_LINE_BYTES = 4 << 20
MAX_INPUT_BYTES = 16 << 30


def ground_truth(value: Any) -> str:
    """The ground truth as the canonical integer string the reward compares with (``"033"``, ``33.0`` -> ``"33"``).

    AIME and DAPO-Math-17k answers are integers by construction. Anything else is refused rather than written:
    ``"nan"`` (a model answering "nan" would be paid), an empty string (nothing can match it), ``"33.5"``,
    and containers or their string forms (``['1', '2']``, ``{'a': 1}``). Raises ValueError with the reason."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"ground truth {value!r} is not an integer")
    if isinstance(value, int):
        return _digits(value)
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ValueError(f"ground truth {value!r} is not an integer")
        if abs(value) > MAX_EXACT_FLOAT:
            raise ValueError(f"ground truth {value!r} is a float past 2**53: the integer it stood for is lost")
        return str(int(value))
    if not isinstance(value, str):
        raise ValueError(f"ground truth is a {type(value).__name__}, not an integer")
    text = value.strip()
    if not text:
        raise ValueError("ground truth is empty")
    if text[0] in "[({":
        raise ValueError(f"ground truth {_short(text)} is a container, not an integer")
    if not _INTEGER.fullmatch(text):
        raise ValueError(f"ground truth {_short(text)} is not an integer")
    digits = text.split(".")[0].replace(",", "")
    if len(digits.lstrip("+-").lstrip("0")) > MAX_DIGITS:
        raise ValueError(f"ground truth {_short(text)} has more than {MAX_DIGITS} digits")
    return str(int(digits))


def _digits(value: int) -> str:
    if value.bit_length() > 4 * MAX_DIGITS or len(str(abs(value))) > MAX_DIGITS:
        raise ValueError(f"ground truth has more than {MAX_DIGITS} digits")
    return str(value)


def _short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def load_rows(source: str) -> list[dict[str, Any]]:
    """Rows of a parquet or JSON-lines file, or of a ``datasets`` dataset: a hub id or a local dataset directory
    (``name`` or ``name:split``, default split ``train``), loaded by ``datasets.load_dataset``.

    A file is bounded before any third-party parser sees it (its size; a JSON row's line length and nesting, read
    with the standard library; a parquet's schema nesting): pyarrow crashes the process on a row nested 10,000 deep.
    Nothing is cached in the user's home: files are read directly, a dataset through a cache removed afterwards."""
    path = Path(source)
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix not in (".parquet", ".jsonl", ".json"):
            raise DataError(f"{source}: expected a .parquet or .jsonl file, got {suffix or 'no suffix'}")
        if (size := path.stat().st_size) > MAX_INPUT_BYTES:
            raise DataError(f"{source}: {size:,} bytes, past the {MAX_INPUT_BYTES:,} an input may hold")
        return _parquet_rows(path) if suffix == ".parquet" else _json_rows(path)
    name, _, split = source.partition(":")
    if not Path(name).is_dir() and (Path(name).suffix.lower() in (".parquet", ".jsonl", ".json") or name[:1] in "./~"):
        raise DataError(f"{source}: no such file or dataset directory")
    import datasets

    datasets.disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="skyrl-glm-datasets-") as cache:
        return datasets.load_dataset(name, split=split or "train", cache_dir=cache).to_list()  # 9x faster than rows


def _depth(root: Any, children: Callable[[Any], Iterable[Any]]) -> int:
    """How deep ``root`` nests (no children 0, ...), counted without recursion and given up past the bound."""
    deepest, stack = 0, [(root, 0)]
    while stack and deepest <= MAX_DEPTH:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children(node))
    return deepest


def _json_children(node: Any) -> Iterable[Any]:
    return node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()


def _json_rows(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file (or of a .json file holding one array of them), each line bounded in
    length and every row in nesting."""
    rows: list[dict[str, Any]] = []
    with path.open("rb") as f:
        first = f.read(1 << 16).lstrip()[:1]
        f.seek(0)
        if first == b"[":  # one JSON array of rows, not JSON lines
            whole = _json_value(path, "the file", f.read())
            records = ((f"row {i}", record) for i, record in enumerate(whole))
        else:
            records = _json_lines(path, f)
        for where, record in records:
            if not isinstance(record, dict):
                raise DataError(f"{path}: {where}: a row must be a JSON object, got {type(record).__name__}")
            if _depth(record, _json_children) > MAX_DEPTH:
                raise DataError(f"{path}: {where}: a row nests deeper than {MAX_DEPTH} levels")
            rows.append(record)
    return rows


def _json_lines(path: Path, f: Any) -> Iterator[tuple[str, Any]]:
    lineno = 0
    while line := f.readline(MAX_LINE_BYTES + 1):
        lineno += 1
        if len(line) > MAX_LINE_BYTES:
            raise DataError(f"{path}: line {lineno}: longer than {MAX_LINE_BYTES:,} bytes")
        if line.strip():
            yield f"line {lineno}", _json_value(path, f"line {lineno}", line)


def _json_value(path: Path, where: str, text: bytes) -> Any:
    try:
        return json.loads(text)
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: {where}: not UTF-8 text ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: {where}: not JSON ({e.msg})") from None
    except (ValueError, RecursionError) as e:  # a number of 5,000 digits; nesting past Python's stack
        raise DataError(f"{path}: {where}: not usable JSON ({type(e).__name__})") from None


def _parquet_rows(path: Path) -> list[dict[str, Any]]:
    """A parquet's rows, its schema's nesting checked from the footer before any row is read."""
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    for field in schema:
        if _depth(field.type, lambda t: (t.field(i).type for i in range(t.num_fields))) > MAX_DEPTH:
            raise DataError(f"{path}: column {field.name!r:.40} nests deeper than {MAX_DEPTH} levels")
    return pq.read_table(path).to_pylist()


def _field(row: dict[str, Any], *names: str) -> Any:
    lowered = {k.lower(): v for k, v in row.items()}
    for name in names:
        if name in lowered and lowered[name] is not None:
            return lowered[name]
    return None


def normalise_row(row: dict[str, Any], index: int, kind: DatasetKind) -> dict[str, Any]:
    """One output row from a row in the public DAPO schema, or from a bare ``problem``/``answer`` row.
    Raises ValueError naming the field when the row cannot train on a right reward."""
    reward_model = row.get("reward_model")
    prompt = row.get("prompt")
    if isinstance(reward_model, dict) and isinstance(prompt, list | tuple):
        if "ground_truth" not in reward_model:
            raise ValueError("reward_model has no ground_truth")
        messages = []
        for m in prompt:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ValueError("prompt must be a list of {role, content} messages")
            messages.append({"role": m["role"], "content": m["content"]})
        if not any(m["role"] == "user" and m["content"].strip() for m in messages):
            raise ValueError("prompt has no non-empty user message")
        truth = ground_truth(reward_model["ground_truth"])
        style = str(reward_model.get("style") or "rule")
        data_source = kind.data_source if kind.own_source else str(row.get("data_source") or kind.data_source)
        ability = str(row.get("ability") or "MATH")
        extra_info = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    else:
        problem = _field(row, "problem", "question")
        answer = _field(row, "answer", "solution_answer")
        if not isinstance(problem, str) or answer is None:
            raise ValueError(
                "neither the DAPO schema (prompt messages + reward_model.ground_truth) "
                f"nor problem/answer fields (has: {', '.join(sorted(map(str, row))) or 'nothing'})"
            )
        if not problem.strip():
            raise ValueError("problem is empty")
        messages = [{"role": "user", "content": DAPO_PROMPT.format(problem=problem.strip())}]
        truth, style = ground_truth(answer), "rule"
        data_source, ability, extra_info = kind.data_source, "MATH", {}
    return {
        "data_source": data_source,
        "prompt": messages,
        "ability": ability,
        "env_class": ENV_ID,
        "reward_model": {"ground_truth": truth, "style": style},
        "extra_info": {"index": str(extra_info.get("index", index))},
    }


def dedupe(rows: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """One row per (data source, prompt, ability), the first seen kept, as SkyRL's DAPO preparation does; a prompt
    whose copies disagree on the ground truth is dropped whole (training on it pays one of two answers).

    Returns (rows, prompts dropped for conflicting answers)."""
    first: dict[tuple, dict[str, Any]] = {}
    truths: dict[tuple, set[str]] = {}
    for row in rows:
        messages = tuple((m["role"], m["content"]) for m in row["prompt"])
        key = (row["data_source"], messages, row["ability"])
        first.setdefault(key, row)
        truths.setdefault(key, set()).add(row["reward_model"]["ground_truth"])
    kept = [row for key, row in first.items() if len(truths[key]) == 1]
    return kept, len(first) - len(kept)


def _checked_rows(raw: list[dict[str, Any]], kind: DatasetKind, source: str) -> list[dict[str, Any]]:
    """Every row normalised, or DataError naming the bad rows (all of them counted, the first few with reasons)."""
    rows, bad = [], []
    for index, row in enumerate(raw):
        try:
            rows.append(normalise_row(row, index, kind))
        except ValueError as e:
            bad.append(f"row {index}: {e}")
    if bad:
        more = f"; and {len(bad) - _MAX_REASONS} more" if len(bad) > _MAX_REASONS else ""
        raise DataError(f"{source}: {len(bad)} bad row(s), nothing written: {'; '.join(bad[:_MAX_REASONS])}{more}")
    return rows


def _output_path(out_dir: Path, kind: DatasetKind) -> Path:
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"--output {out_dir}: not a directory")
    return out_dir / kind.filename


def _write_atomically(rows: list[dict[str, Any]], path: Path) -> None:
    """Write the parquet beside its final name, then rename: a reader never sees a partial file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise DataError(f"--output {path.parent}: cannot write ({e.strerror or e})") from None
    os.close(fd)
    try:
        pq.write_table(pa.Table.from_pylist(rows), tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def prepare(kind_name: str, source: str, out_dir: Path, limit: int | None = None) -> Prepared:
    """Load ``source``, check and normalise every row, dedupe, write ``out_dir/<kind file>`` (parquet) atomically.
    Nothing is written when any row is bad."""
    if kind_name not in KINDS:
        raise DataError(f"unknown dataset {kind_name!r}; known: {', '.join(KINDS)}")
    if limit is not None and limit <= 0:
        raise DataError(f"--limit must be positive, got {limit}")
    kind = KINDS[kind_name]
    path = _output_path(out_dir, kind)
    raw = load_rows(source)
    if not raw:
        raise DataError(f"{source}: no rows")
    rows, conflicts = dedupe(_checked_rows(raw, kind, source))
    unique = len(rows) + conflicts
    if not rows:
        raise DataError(f"{source}: every prompt has conflicting answers; nothing written")
    if limit is not None:
        rows = rows[:limit]
    _write_atomically(rows, path)
    return Prepared(path, len(raw), unique, conflicts, len(rows))
