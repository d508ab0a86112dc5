"""``skyrl-glm data prepare`` on fixtures in the public DAPO-Math-17k / AIME-2024 schema, read back by SkyRL."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from skyrl_glm.cli import main
from skyrl_glm.dapo.data import DataError, ground_truth, prepare

DATA = Path(__file__).parent / "data"
DAPO_JSONL = DATA / "dapo_math_17k_sample.jsonl"  # 17 rows: 5 problems x 3 copies + one prompt with two answers
AIME_JSONL = DATA / "aime_2024_sample.jsonl"  # 12 rows: 3 problems x 4 copies


def _jsonl_to_parquet(src: Path, dst: Path) -> Path:
    rows = [json.loads(line) for line in src.read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), dst)
    return dst


def _dapo_shaped_parquet(path: Path) -> Path:
    """A parquet shaped like the public DAPO-Math-17k: the sample's 17 rows (5 problems x 3 copies, one prompt with
    two answers), each copy again with its own extra_info index (the public file's copies differ there), and float
    spellings of the answers ("55.0", "+09", "0023")."""
    rows = [json.loads(line) for line in DAPO_JSONL.read_text().splitlines()]
    spelled = {"55": "55.0", "9": "+09", "23": "0023"}
    copies = []
    for i, row in enumerate(rows):
        copy = json.loads(json.dumps(row))
        copy["extra_info"]["index"] = f"copy-{i}"
        truth = copy["reward_model"]["ground_truth"]
        copy["reward_model"]["ground_truth"] = spelled.get(truth, truth)
        copies.append(copy)
    pq.write_table(pa.Table.from_pylist(rows + copies), path)
    return path


def test_dapo_math_parquet_deduped_normalised_and_conflicts_dropped(tmp_path):
    src = _dapo_shaped_parquet(tmp_path / "dapo-math-17k.parquet")
    out = prepare("dapo-math", str(src), tmp_path / "out")
    assert (out.rows_in, out.unique_prompts, out.conflicts_dropped, out.rows_out) == (34, 6, 1, 5)
    rows = pq.read_table(out.path).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["2", "23", "5", "55", "9"]  # first seen order
    assert all(r["env_class"] == "glm_math" and r["data_source"] == "math_dapo" for r in rows)
    assert all("smallest prime" not in r["prompt"][0]["content"] for r in rows)  # the conflicting prompt
    assert [p.name for p in out.path.parent.iterdir()] == ["dapo-math-17k.parquet"]  # no temporary file left


@pytest.mark.parametrize(
    "value,canonical",
    [
        ("33", "33"),
        ("033", "33"),
        ("+7", "7"),
        ("-4", "-4"),
        ("33.0", "33"),
        (" 12 ", "12"),
        ("1,000", "1000"),
        (33.0, "33"),
        (5, "5"),
        (2**60 + 1, "1152921504606846977"),
        ("1152921504606846977", "1152921504606846977"),
        (float(2**53), "9007199254740992"),
    ],
)
def test_ground_truth_canonical_integers(value, canonical):
    assert ground_truth(value) == canonical


@pytest.mark.parametrize(
    "value,reason",
    [
        ("nan", "not an integer"),
        (float("nan"), "not an integer"),
        ("", "empty"),
        ("  ", "empty"),
        ("33.5", "not an integer"),
        (2.5, "not an integer"),
        ("['1', '2']", "container"),
        ("{'a': 1}", "container"),
        (["1"], "list"),
        ({"a": 1}, "dict"),
        (None, "not an integer"),
        (True, "not an integer"),
        ("inf", "not an integer"),
        ("\\frac{1}{2}", "not an integer"),
        (1e300, "float past 2**53"),
        (float(2**60 + 1), "float past 2**53"),
        ("1" * 5000, "more than 20 digits"),
        (10**30, "more than 20 digits"),
        ("1" * 21, "more than 20 digits"),
    ],
)
def test_ground_truth_refused(value, reason):
    with pytest.raises(ValueError, match=re.escape(reason)):
        ground_truth(value)


def test_bad_rows_named_exit_2_nothing_written(tmp_path, capsys):
    rows = [json.loads(line) for line in DAPO_JSONL.read_text().splitlines()]
    rows[3]["reward_model"]["ground_truth"] = "nan"
    rows[7]["reward_model"]["ground_truth"] = "['1', '2']"
    rows[11]["prompt"][0]["content"] = "   "
    src = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    out = tmp_path / "out"
    assert main(["data", "prepare", "dapo-math", "--input", str(src), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "3 bad row(s), nothing written" in err
    assert "row 3: ground truth 'nan' is not an integer" in err
    assert "row 7: ground truth \"['1', '2']\" is a container" in err
    assert "row 11: prompt has no non-empty user message" in err
    assert not out.exists()


def test_an_existing_output_survives_a_failed_prepare(tmp_path):
    out = prepare("aime2024", str(AIME_JSONL), tmp_path)
    before = out.path.read_bytes()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "Find x.", "answer": "nan"}) + "\n")
    with pytest.raises(DataError, match="row 0: ground truth 'nan'"):
        prepare("aime2024", str(bad), tmp_path)
    assert out.path.read_bytes() == before


def test_aime_jsonl_one_row_per_problem_with_its_own_data_source(tmp_path):
    out = prepare("aime2024", str(AIME_JSONL), tmp_path)
    rows = pq.read_table(out.path).to_pylist()
    assert out.path.name == "aime-2024.parquet" and len(rows) == 3
    assert (out.rows_in, out.unique_prompts, out.conflicts_dropped) == (12, 3, 0)
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
    # A float answer column (a parquet column holding a NaN is float64): 42.0 is written as "42".
    src = tmp_path / "aime.parquet"
    pq.write_table(pa.table({"Problem": ["Find 6 * 7.", "Find 2 + 2."], "Answer": [42.0, 4.0]}), src)
    rows = pq.read_table(prepare("aime2024", str(src), tmp_path / "o").path).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["42", "4"]
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
        ([{"problem": "", "answer": 3}], "row 0: problem is empty"),
        ([{"problem": "Find x.", "answer": 3.5}], "row 0: ground truth 3.5 is not an integer"),
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
    out = capsys.readouterr().out
    assert "12 rows in, 3 unique prompts, 0 dropped for conflicting answers: wrote 3 prompts" in out
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


def _nested(depth: int) -> str:
    return '{"problem": "Find x.", "answer": 3, "extra": ' + "[" * depth + "]" * depth + "}\n"


@pytest.mark.parametrize(
    "text,message",
    [
        (_nested(10_000), "line 1: not usable JSON (RecursionError)"),  # pyarrow segfaulted on it after 149 s
        (_nested(2) + _nested(40), "line 2: a row nests deeper than 32 levels"),
        ("[1, 2]\n", "row 0: a row must be a JSON object, got int"),
        ('{"problem": "x", "answer": ' + "9" * 5000 + "}\n", "line 1: not usable JSON (ValueError)"),
        (b'{"problem": "\xff", "answer": 1}\n', "line 1: not UTF-8 text"),
        ('{"problem": "x", "answer": 1}\n' * 3 + "x" * 5000 + "\n", "line 4: longer than 4,096 bytes"),
    ],
    ids=["nested-10000", "nested-40", "array-of-numbers", "5000-digits", "not-utf8", "long-line"],
)
def test_json_input_bounded_before_any_parser(tmp_path, capsys, monkeypatch, text, message):
    import skyrl_glm.dapo.data as data

    if "longer than" in message:  # a bound the test can reach cheaply
        monkeypatch.setattr(data, "MAX_LINE_BYTES", 4096)
    src = tmp_path / "deep.jsonl"
    src.write_bytes(text if isinstance(text, bytes) else text.encode())
    argv = ["data", "prepare", "aime2024", "--input", str(src), "--output", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{src}: {message}" in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


def test_parquet_schema_nesting_bounded_before_its_rows_are_read(tmp_path):
    arrow_type = pa.int64()
    for _ in range(40):
        arrow_type = pa.list_(arrow_type)
    src = tmp_path / "deep.parquet"
    pq.write_table(pa.table({"problem": ["Find x."], "answer": [3], "deep": pa.array([None], arrow_type)}), src)
    with pytest.raises(DataError, match="column 'deep' nests deeper than 32 levels"):
        prepare("aime2024", str(src), tmp_path / "o")


def test_a_json_array_file_is_rows_too(tmp_path):
    src = tmp_path / "aime.json"
    src.write_text(json.dumps([json.loads(line) for line in AIME_JSONL.read_text().splitlines()]))
    out = prepare("aime2024", str(src), tmp_path / "o")
    assert (out.rows_in, out.rows_out) == (12, 3)


def test_prepare_leaves_no_datasets_cache(tmp_path):
    """Neither a file nor a dataset directory grows the datasets cache in the user's home, and the run's own
    cache is gone afterwards (in a fresh process: ``datasets`` reads its cache location at import)."""
    import os
    import subprocess
    import sys

    repo = tmp_path / "AIME-2024"
    (repo / "data").mkdir(parents=True)
    _jsonl_to_parquet(AIME_JSONL, repo / "data" / "aime-2024.parquet")
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "HOME": str(home), "HF_HOME": str(home / "hf"), "TMPDIR": str(tmp)}
    env.pop("HF_DATASETS_CACHE", None)
    for i, source in enumerate((str(AIME_JSONL), str(repo))):
        argv = ["data", "prepare", "aime2024", "--input", source, "--output", str(tmp_path / f"o{i}")]
        proc = subprocess.run([sys.executable, "-m", "skyrl_glm.cli", *argv], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
    cached = [p for p in home.rglob("*") if p.is_file()] if home.exists() else []
    assert not cached and not list(tmp.iterdir()), (cached, list(tmp.iterdir()))
