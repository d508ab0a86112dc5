"""``skyrl-glm data prepare``: DAPO-Math-17k and AIME 2024 into the parquet SkyRL's ``PromptDataset`` reads.

Output rows follow the public DAPO files' schema, which is also what skyrl_gym's ``aime`` env and our ``glm_math``
env read: ``prompt`` (chat messages), ``reward_model.ground_truth``, ``data_source``, ``ability``, ``extra_info``,
plus ``env_class`` so the rows pick the GLM reward. Facts about the public files (BytedTsinghua-SIA/DAPO-Math-17k,
BytedTsinghua-SIA/AIME-2024): the training file repeats each problem many times and a few prompts carry two
different answers; the AIME file repeats each of its 30 problems. Both are reduced to one row per prompt and
prompts with conflicting answers are dropped (as SkyRL's DAPO example does); repeated eval samples come from
``generator.eval_n_samples_per_prompt`` instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_glm.dapo.env import ENV_ID

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


class DataError(ValueError):
    """Input that is not a dataset in a known schema (the message names the row and the field)."""


@dataclass(frozen=True)
class Prepared:
    """What one ``prepare`` call wrote."""

    path: Path
    rows_in: int
    rows_out: int
    duplicates: int
    conflicting: int


def load_rows(source: str) -> list[dict[str, Any]]:
    """Rows of a parquet or JSON-lines file, or of a ``datasets`` dataset: a hub id or a local dataset directory
    (``name`` or ``name:split``, default split ``train``), loaded by ``datasets.load_dataset``."""
    import datasets

    datasets.disable_progress_bars()
    path = Path(source)
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".parquet":
            return [dict(row) for row in datasets.load_dataset("parquet", data_files=str(path), split="train")]
        if suffix in (".jsonl", ".json"):
            return [dict(row) for row in datasets.load_dataset("json", data_files=str(path), split="train")]
        raise DataError(f"{source}: expected a .parquet or .jsonl file, got {suffix or 'no suffix'}")
    name, _, split = source.partition(":")
    if not Path(name).is_dir() and (Path(name).suffix.lower() in (".parquet", ".jsonl", ".json") or name[:1] in "./~"):
        raise DataError(f"{source}: no such file or dataset directory")
    return [dict(row) for row in datasets.load_dataset(name, split=split or "train")]


def _field(row: dict[str, Any], *names: str) -> Any:
    lowered = {k.lower(): v for k, v in row.items()}
    for name in names:
        if name in lowered and lowered[name] is not None:
            return lowered[name]
    return None


def normalise_row(row: dict[str, Any], index: int, kind: DatasetKind) -> dict[str, Any]:
    """One output row from a row in the public DAPO schema, or from a bare ``problem``/``answer`` row."""
    reward_model = row.get("reward_model")
    prompt = row.get("prompt")
    if isinstance(reward_model, dict) and isinstance(prompt, list):
        if "ground_truth" not in reward_model or reward_model["ground_truth"] in (None, ""):
            raise DataError(f"row {index}: reward_model has no ground_truth")
        messages = []
        for m in prompt:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise DataError(f"row {index}: prompt must be a list of {{role, content}} messages")
            messages.append({"role": m["role"], "content": m["content"]})
        if not messages:
            raise DataError(f"row {index}: empty prompt")
        ground_truth = str(reward_model["ground_truth"])
        style = str(reward_model.get("style") or "rule")
        data_source = kind.data_source if kind.own_source else str(row.get("data_source") or kind.data_source)
        ability = str(row.get("ability") or "MATH")
        extra_info = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    else:
        problem = _field(row, "problem", "question")
        answer = _field(row, "answer", "solution_answer")
        if not isinstance(problem, str) or answer is None or str(answer) == "":
            raise DataError(
                f"row {index}: neither the DAPO schema (prompt messages + reward_model.ground_truth) "
                f"nor problem/answer fields (has: {', '.join(sorted(row)) or 'nothing'})"
            )
        messages = [{"role": "user", "content": DAPO_PROMPT.format(problem=problem.strip())}]
        ground_truth, style = str(answer).strip(), "rule"
        data_source, ability, extra_info = kind.data_source, "MATH", {}
    return {
        "data_source": data_source,
        "prompt": messages,
        "ability": ability,
        "env_class": ENV_ID,
        "reward_model": {"ground_truth": ground_truth, "style": style},
        "extra_info": {"index": str(extra_info.get("index", index))},
    }


def dedupe(rows: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], int, int]:
    """One row per prompt, first seen kept; prompts seen with two different ground truths dropped.

    Returns (rows, duplicates removed, conflicting prompts dropped)."""
    by_prompt: dict[str, dict[str, Any]] = {}
    answers: dict[str, set[str]] = {}
    total = 0
    for row in rows:
        total += 1
        key = json.dumps(row["prompt"], sort_keys=True)
        answers.setdefault(key, set()).add(row["reward_model"]["ground_truth"])
        by_prompt.setdefault(key, row)
    conflicting = {k for k, a in answers.items() if len(a) > 1}
    kept = [row for k, row in by_prompt.items() if k not in conflicting]
    return kept, total - len(by_prompt), len(conflicting)


def prepare(kind_name: str, source: str, out_dir: Path, limit: int | None = None) -> Prepared:
    """Load ``source``, check and convert every row, dedupe, write ``out_dir/<kind file>`` (parquet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if kind_name not in KINDS:
        raise DataError(f"unknown dataset {kind_name!r}; known: {', '.join(KINDS)}")
    if limit is not None and limit <= 0:
        raise DataError(f"--limit must be positive, got {limit}")
    kind = KINDS[kind_name]
    raw = load_rows(source)
    if not raw:
        raise DataError(f"{source}: no rows")
    rows, duplicates, conflicting = dedupe(normalise_row(r, i, kind) for i, r in enumerate(raw))
    if not rows:
        raise DataError(f"{source}: no usable rows left after removing duplicates and conflicting answers")
    if limit is not None:
        rows = rows[:limit]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / kind.filename
    pq.write_table(pa.Table.from_pylist(rows), path)
    return Prepared(path, len(raw), len(rows), duplicates, conflicting)
