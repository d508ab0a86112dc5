"""The pure-torch stand-in for flash-attn's ``bert_padding``: right, put in place only where flash-attn is missing,
and applied on the GPU path too (not only in CPU mode), so SkyRL's FSDP worker imports without flash-attn."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from skyrl_glm.skyrl.compat import flash_attn_stub

ROOT = Path(__file__).resolve().parents[1]


def test_bert_padding_round_trip_matches_masking() -> None:
    hidden = torch.randn(3, 5, 4)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    flat, indices, cu_seqlens, max_len, used = flash_attn_stub.unpad_input(hidden, mask)
    assert flat.shape == (9, 4) and cu_seqlens.tolist() == [0, 3, 8, 9] and max_len == 5 and used.tolist() == [3, 5, 1]
    torch.testing.assert_close(flat, hidden[mask.bool()])
    back = flash_attn_stub.pad_input(flat, indices, 3, 5)
    torch.testing.assert_close(back, hidden * mask.unsqueeze(-1))


def _python(code: str, *path: Path) -> subprocess.CompletedProcess[str]:
    env_path = ":".join(str(p) for p in (*path, ROOT))
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": env_path},
    )


def test_skyrl_fsdp_worker_imports_without_flash_attn_outside_cpu_mode() -> None:
    # The check can fail: without the stand-in SkyRL's model wrapper does not import here (no flash-attn installed).
    bare = _python("import skyrl.backends.skyrl_train.workers.model_wrapper")
    assert bare.returncode != 0 and "No module named 'flash_attn'" in bare.stderr, bare.stderr[-2000:]
    # skyrl-glm's FSDP worker module (what a GPU run's Ray worker imports to rebuild the actor) puts it in place
    # without CPU mode: torch.cuda is left alone.
    code = (
        "import torch; real = torch.cuda.current_device; import skyrl_glm.skyrl.workers.fsdp;"
        " from flash_attn.bert_padding import pad_input; import skyrl.backends.skyrl_train.workers.model_wrapper as m;"
        " print(m.pad_input is pad_input, torch.cuda.current_device is real)"
    )
    ok = _python(code)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ok.stdout.split() == ["True", "True"]


def test_an_installed_flash_attn_is_left_alone(tmp_path: Path) -> None:
    real = tmp_path / "flash_attn"
    (real / "bert_padding").mkdir(parents=True)
    (real / "__init__.py").write_text("WHO = 'installed'\n")
    (real / "bert_padding" / "__init__.py").write_text("def pad_input(*a):\n    return 'installed'\n")
    code = (
        "from skyrl_glm.skyrl.compat.flash_attn_stub import provide_bert_padding; print(provide_bert_padding());"
        " import flash_attn; print(flash_attn.WHO)"
    )
    proc = _python(code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "installed"]
