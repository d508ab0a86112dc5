"""``skyrl-glm data prepare`` on fixtures in the public DAPO-Math-17k / AIME-2024 schema, read back by SkyRL."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from skyrl_glm.cli import main
from skyrl_glm.dapo.data import DataError, prepare

DATA = Path(__file__).parent / "data"
DAPO_JSONL = DATA / "dapo_math_17k_sample.jsonl"  # 17 rows: 5 problems x 3 copies + one prompt with two answers
AIME_JSONL = DATA / "aime_2024_sample.jsonl"  # 12 rows: 3 problems x 4 copies


def _jsonl_to_parquet(src: Path, dst: Path) -> Path:
    rows = [json.loads(line) for line in src.read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), dst)
    return dst


def test_dapo_math_parquet_deduped_and_conflicts_dropped(tmp_path):
    src = _jsonl_to_parquet(DAPO_JSONL, tmp_path / "dapo-math-17k.parquet")
    out = prepare("dapo-math", str(src), tmp_path / "out")
    assert (out.rows_in, out.rows_out, out.duplicates, out.conflicting) == (17, 5, 11, 1)
    rows = pq.read_table(out.path).to_pylist()
    assert {r["reward_model"]["ground_truth"] for r in rows} == {"55", "9", "2", "5", "23"}
    assert all(r["env_class"] == "glm_math" and r["data_source"] == "math_dapo" for r in rows)
    assert all("smallest prime" not in r["prompt"][0]["content"] for r in rows)  # the conflicting prompt


def test_aime_jsonl_one_row_per_problem_with_its_own_data_source(tmp_path):
    out = prepare("aime2024", str(AIME_JSONL), tmp_path)
    rows = pq.read_table(out.path).to_pylist()
    assert out.path.name == "aime-2024.parquet" and len(rows) == 3
    assert {r["data_source"] for r in rows} == {"aime2024"}  # SkyRL names eval metrics and dumps by it


def test_datasets_id_path_on_a_local_dataset_repo(tmp_path):
    # `--input NAME[:split]` goes through datasets.load_dataset(NAME, split=...), as for a hub id; here NAME is a
    # local directory laid out like the public dataset repos (data/<file>.parquet), since there is no hub access.
    repo = tmp_path / "AIME-2024"
    (repo / "data").mkdir(parents=True)
    _jsonl_to_parquet(AIME_JSONL, repo / "data" / "aime-2024.parquet")
    out = prepare("aime2024", str(repo), tmp_path / "o1")
    assert (out.rows_in, out.rows_out) == (12, 3)
    assert prepare("aime2024", f"{repo}:train", tmp_path / "o2").rows_out == 3
    with pytest.raises(ValueError, match="test"):  # datasets names the unknown split
        prepare("aime2024", f"{repo}:test", tmp_path / "o3")


def test_bare_problem_answer_rows_get_the_dapo_instruction(tmp_path):
    src = tmp_path / "aime.jsonl"
    src.write_text(json.dumps({"Problem": "Find 6 * 7.", "Answer": 42}) + "\n")
    rows = pq.read_table(prepare("aime2024", str(src), tmp_path / "o").path).to_pylist()
    assert rows[0]["reward_model"]["ground_truth"] == "42"
    content = rows[0]["prompt"][0]["content"]
    assert "Find 6 * 7." in content and 'after "Answer:"' in content


def test_skyrl_prompt_dataset_and_env_read_the_output(tmp_path):
    from skyrl.train.dataset.dataset import PromptDataset

    from skyrl_glm.dapo.env import ENV_ID, register
    from skyrl_glm.models.tokenizer import build_tokenizer

    out = prepare("dapo-math", str(DAPO_JSONL), tmp_path)
    ds = PromptDataset([str(out.path)], build_tokenizer(512), max_prompt_length=4096, num_workers=1)
    assert len(ds) == 5
    messages, env_class, extras, _ = ds[0]
    assert env_class == ENV_ID and messages[0]["role"] == "user"
    import skyrl_gym

    register()
    env = skyrl_gym.make(env_class, env_config={}, extras=extras)
    truth = extras["reward_model"]["ground_truth"]
    assert env.step(f"Answer: \\({truth}\\)<|user|>")["reward"] == 1.0


@pytest.mark.parametrize(
    "rows,message",
    [
        ([{"prompt": [{"role": "user", "content": "q"}], "reward_model": {"style": "rule"}}], "row 0: reward_model"),
        ([{"prompt": "not messages", "question": None, "answer": None}], "row 0: neither"),
        ([{"prompt": [{"role": "user"}], "reward_model": {"ground_truth": "1"}}], "row 0: prompt must be"),
    ],
)
def test_rows_outside_the_schema_are_named(tmp_path, rows, message):
    src = tmp_path / "bad.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=message):
        prepare("dapo-math", str(src), tmp_path / "o")
    assert not (tmp_path / "o").exists()  # nothing written on bad input


def test_cli_prepare_and_bad_input_exit_2(tmp_path, capsys):
    assert main(["data", "prepare", "aime2024", "--input", str(AIME_JSONL), "--output", str(tmp_path)]) == 0
    assert "3 prompts" in capsys.readouterr().out
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1 not really a parquet file")
    (tmp_path / "repo" / "data").mkdir(parents=True)
    _jsonl_to_parquet(AIME_JSONL, tmp_path / "repo" / "data" / "aime-2024.parquet")
    for argv in (
        ["data", "prepare", "aime2024", "--input", str(tmp_path / "missing.parquet"), "--output", str(tmp_path)],
        ["data", "prepare", "aime2024", "--input", str(DATA / "README"), "--output", str(tmp_path)],
        ["data", "prepare", "aime2024", "--input", str(corrupt), "--output", str(tmp_path)],
        ["data", "prepare", "aime2024", "--input", str(tmp_path / "repo:test"), "--output", str(tmp_path)],
        ["data", "prepare", "aime2024", "--input", str(AIME_JSONL), "--output", str(tmp_path), "--limit", "0"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("skyrl-glm: error:") and len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_corrupt_input_is_one_line_on_the_real_stderr(tmp_path):
    # In a fresh process: `datasets` logs load failures through its own handlers, which capsys does not see.
    import os
    import subprocess
    import sys

    corrupt = tmp_path / "x.parquet"
    corrupt.write_bytes(b"PAR1 not a parquet file")
    argv = ["data", "prepare", "aime2024", "--input", str(corrupt), "--output", str(tmp_path / "o")]
    proc = subprocess.run(
        [sys.executable, "-m", "skyrl_glm.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"skyrl-glm: error: {corrupt}: cannot load (ArrowInvalid"), proc.stderr
    assert not (tmp_path / "o").exists()
