"""Every user error of the real CLI is one line naming the problem, exit 2, no traceback, before any work.

Each case runs ``skyrl-glm`` in a subprocess, as a user would. The broken checkpoints are copies of a tiny
GLM-4.5 checkpoint with one thing damaged each.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNWRITABLE = "/proc/skyrl-glm-no-such-dir"  # creating anything under /proc fails, also for root


def _damage(good: Path, root: Path, how: str) -> Path:
    bad = root / how
    shutil.copytree(good, bad)
    weights = bad / "model.safetensors"
    if how == "model-type":
        config = json.loads((bad / "config.json").read_text())
        (bad / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    elif how == "config-list":
        (bad / "config.json").write_text("[1, 2, 3]")
    elif how == "config-not-json":
        (bad / "config.json").write_text('{"model_type": ')
    elif how == "truncated":
        os.truncate(weights, weights.stat().st_size // 2)
    elif how == "corrupt-header":
        data = bytearray(weights.read_bytes())
        data[8:40] = b"\xff" * 32
        weights.write_bytes(bytes(data))
    elif how == "header-too-long":
        data = bytearray(weights.read_bytes())
        data[:8] = (2**40).to_bytes(8, "little")
        weights.write_bytes(bytes(data))
    elif how == "no-weights":
        weights.unlink()
    elif how == "no-tokenizer":
        for f in bad.glob("tokenizer*"):
            f.unlink()
    return bad


# (case id, argv with {good}/{bad}/{file}/{tmp} placeholders, text the one line must contain)
CASES = [
    ("model-type", ["check", "--model", "{bad}"], "model_type 'llama'"),
    ("config-list", ["check", "--model", "{bad}"], "must hold a JSON object"),
    ("config-not-json", ["check", "--model", "{bad}"], "not valid JSON"),
    ("truncated", ["check", "--model", "{bad}"], "truncated"),
    ("corrupt-header", ["check", "--model", "{bad}"], "header is not JSON"),
    ("header-too-long", ["check", "--model", "{bad}"], "does not fit the file"),
    ("no-weights", ["check", "--model", "{bad}"], "no *.safetensors weights"),
    ("no-tokenizer", ["check", "--model", "{bad}"], "no tokenizer"),
    ("no-such-model", ["check", "--model", "{tmp}/nothing-here"], "neither a registered model"),
    ("unknown-trainer", ["check", "--trainer", "nope"], "nope"),
    ("unknown-sampler", ["check", "--sampler", "nope"], "nope"),
    ("unknown-device", ["check", "--device", "tpu"], "tpu"),
    ("unknown-fault", ["check", "--fault", "nope"], "--fault"),
    ("nccl", ["check", "--transport", "nccl"], "nccl"),
    ("prob-tol-nan", ["check", "--prob-tol", "nan"], "prob_tol"),
    ("mean-tol-negative", ["check", "--mean-tol", "-1"], "mean_tol"),
    ("repeat-tol-inf", ["check", "--repeat-tol", "inf"], "repeat_tol"),
    ("mean-tol-huge", ["check", "--mean-tol", "1e30"], "mean_tol must be a number in 0..10"),
    ("prob-tol-huge", ["check", "--prob-tol", "2"], "prob_tol must be a number in 0..1"),
    ("scale-negative", ["check", "--scale", "-1"], "scale must be a number > 0"),
    ("scale-zero", ["check", "--scale", "0"], "scale must be a number > 0"),
    ("check-rank-0", ["check", "--rank", "0"], "rank"),
    ("check-rank-too-big", ["check", "--rank", "9999", "--model", "{good}"], "rank 9999"),
    ("check-empty-targets", ["check", "--lora-targets", ""], "--lora-targets"),
    ("check-unknown-target", ["check", "--lora-targets", "self_attn.nope"], "self_attn.nope"),
    ("json-unwritable", ["check", "--json", UNWRITABLE + "/r.json"], "--json"),
    ("json-under-a-file", ["check", "--json", "{file}/r.json"], "--json"),
    ("plot-is-a-dir", ["check", "--plot", "{tmp}"], "--plot"),
    ("tiny-into-a-file", ["tiny", "make", "glm-4.5", "{file}"], "not a directory"),
    ("tiny-unwritable", ["tiny", "make", "glm-4.5", UNWRITABLE + "/tiny"], "cannot write"),
    ("tiny-unknown-family", ["tiny", "make", "glm-9", "{tmp}/t"], "glm-9"),
    ("sizes-no-full-config", ["sizes", "glm-4.5"], "full-size config"),
    ("sizes-rank-0", ["sizes", "--rank", "0"], "rank"),
    ("sizes-rank-negative", ["sizes", "--rank", "-4", "--tiny"], "rank"),
    ("sizes-empty-targets", ["sizes", "--lora-targets", " , "], "--lora-targets"),
    ("sizes-unknown-model", ["sizes", "nope"], "nope"),
    ("no-command", [], "required"),
    ("flash-on-cpu", ["check", "--model", "glm-5.3-flash"], "no vLLM CPU serving path"),
    ("flash-dir-on-cpu", ["check", "--model", "{bad}"], "glm-5.3-flash (glm5_next) has no vLLM CPU serving path"),
]
DAMAGED = {"model-type", "config-list", "config-not-json", "truncated", "corrupt-header", "header-too-long"}
DAMAGED |= {"no-weights", "no-tokenizer"}


@pytest.mark.parametrize(("case", "argv", "says"), CASES, ids=[c[0] for c in CASES])
def test_user_error_is_one_line_and_exit_2(case, argv, says, glm45_dir, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    bad = _damage(Path(glm45_dir), tmp_path, case) if case in DAMAGED else None
    if case == "flash-dir-on-cpu":  # a tiny GLM-5.3-Flash checkpoint: a valid model, but none vLLM CPU serves
        from skyrl_glm.models.tiny import make_tiny
        from skyrl_glm.plugins import registry

        bad = make_tiny(registry().model("glm-5.3-flash"), tmp_path / "flash", seed=0)
    subs = {"{good}": str(glm45_dir), "{bad}": str(bad), "{file}": str(a_file), "{tmp}": str(tmp_path)}
    args = [arg for arg in argv]
    for key, value in subs.items():
        args = [a.replace(key, value) for a in args]
    env = {**os.environ, "SKYRL_GLM_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "skyrl_glm.cli", *args], capture_output=True, text=True, timeout=300, env=env
    )
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert len(out.splitlines()) == 1, out[-3000:]
    assert says in out, out
    assert not (tmp_path / "cache").exists(), "a refused check must not have started any work"
