"""scripts/gpu-kit: the parts of a packed tree verify, unpack to the same tree, and a missing or corrupt part is one
line and exit 2 before anything is unpacked."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="the builder packs with the zstd command")


@pytest.fixture
def kit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    loader = importlib.machinery.SourceFileLoader("gpu_kit", str(ROOT / "scripts" / "gpu-kit"))
    spec = importlib.util.spec_from_loader("gpu_kit", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    monkeypatch.setattr(module, "KIT", tmp_path / "kit")
    monkeypatch.setattr(module, "PART_BYTES", 4096)
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    for i in range(6):
        (tree / "pkg" / f"f{i}.bin").write_bytes(os.urandom(3000))  # incompressible: several parts
    (tree / "pkg" / "__init__.py").write_text("VALUE = 7\n")
    module.pack("stack", tree, ["pkg==1"])
    return module, tree, tmp_path


def _same_tree(tree: Path, out: Path) -> None:
    files = [p for p in tree.rglob("*") if p.is_file()]
    assert files and {p.relative_to(tree) for p in files} <= {p.relative_to(out) for p in out.rglob("*")}
    for path in files:
        assert (out / path.relative_to(tree)).read_bytes() == path.read_bytes()


def test_parts_unpack_to_the_same_tree(kit) -> None:
    module, tree, tmp_path = kit
    names = module.parts(module.KIT)
    assert len(names) >= 4
    assert module.unpack_all(module.KIT, tmp_path / "device", module.verify(module.KIT)) == ["stack"]
    _same_tree(tree, tmp_path / "device" / "stack")
    assert sorted(p.name for p in (tmp_path / "device").iterdir()) == ["stack"]  # no fresh or old folder left
    assert module.unpack_all(module.KIT, tmp_path / "device", module.verify(module.KIT)) == []  # the same parts: kept


def test_changed_parts_are_unpacked_again(kit) -> None:
    """The marker is keyed on the parts' digests: a stale tree is replaced, not skipped."""
    module, tree, tmp_path = kit
    module.unpack_all(module.KIT, tmp_path / "device", module.verify(module.KIT))
    (tree / "pkg" / "__init__.py").write_text("VALUE = 8\n")
    (tree / "pkg" / "f0.bin").unlink()
    module.pack("stack", tree, ["pkg==2"])
    assert module.unpack_all(module.KIT, tmp_path / "device", module.verify(module.KIT)) == ["stack"]
    out = tmp_path / "device" / "stack"
    assert (out / "pkg" / "__init__.py").read_text() == "VALUE = 8\n" and not (out / "pkg" / "f0.bin").exists()


def test_parts_past_100_join_in_numeric_order(kit, monkeypatch: pytest.MonkeyPatch) -> None:
    module, _, tmp_path = kit
    monkeypatch.setattr(module, "PART_BYTES", 512)
    tree = tmp_path / "big"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "blob.bin").write_bytes(os.urandom(120 * 512))  # incompressible: more than 100 parts
    module.pack("stack", tree, ["pkg==1"])
    assert len(module.parts(module.KIT)) > 100
    module.unpack_all(module.KIT, tmp_path / "device", module.verify(module.KIT))
    _same_tree(tree, tmp_path / "device" / "stack")


def test_split_cuts_the_parts_again_and_plan_refuses_a_call_over_the_limit(kit, monkeypatch, capsys) -> None:
    """The checkout travels with every call: when it grows, a part that fitted no longer does. ``plan`` names it;
    ``split`` re-cuts the same archive (its digest checked) into smaller parts that unpack to the same tree."""
    module, tree, tmp_path = kit
    shutil.copy(ROOT / ".gitignore", module.KIT / "zstandard-0.25.0-py3-none-any.whl")  # the boot wheel's place
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "checkout_bytes", lambda: 2048)
    monkeypatch.setattr(module, "CALL_BYTES", 4096 + 1024)
    with pytest.raises(module.KitError, match="exceed a call's"):
        module.plan()
    before = len(module.parts(module.KIT))
    monkeypatch.setattr(module, "PART_BYTES", 2048)
    module.resplit()
    assert len(module.parts(module.KIT)) > before and "device calls" in capsys.readouterr().out
    assert module.unpack_all(module.KIT, tmp_path / "device", module.verify(module.KIT)) == ["stack"]
    _same_tree(tree, tmp_path / "device" / "stack")


def test_a_kit_without_megatron_leaves_its_parts_out_of_plan_store_and_install(kit, monkeypatch, capsys) -> None:
    """``--without megatron`` (runs without SkyRL's Megatron trainer): the plan carries none of its parts and passes
    the option on, and the install verifies the rest with those parts absent; only megatron can be left out."""
    module, tree, tmp_path = kit
    module.pack("megatron", tree, ["pkg==1"])
    megatron = [n for n in module.parts(module.KIT) if n.startswith("megatron.")]
    assert megatron
    shutil.copy(ROOT / ".gitignore", module.KIT / "zstandard-0.25.0-py3-none-any.whl")  # the boot wheel's place
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "checkout_bytes", lambda: 0)
    assert module.main(["plan", "--without", "megatron"]) == 0
    out = capsys.readouterr().out
    assert "megatron." not in out and "store --without megatron" in out and "install --without megatron" in out
    for name in megatron:
        (module.KIT / name).unlink()
    assert set(module.verify(module.KIT)) == {"stack"}  # what the install checks and unpacks
    module.LEFT_OUT = frozenset()
    with pytest.raises(module.KitError, match="part missing"):
        module.verify(module.KIT)
    for argv in (["plan", "--without", "deps"], ["probe", "--without", "megatron"], ["store", "--without"]):
        assert module.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("gpu-kit: --without"), err


def test_corrupt_part_is_named(kit) -> None:
    module, _, _ = kit
    victim = module.KIT / module.parts(module.KIT)[1]
    data = bytearray(victim.read_bytes())
    data[100] ^= 1
    victim.write_bytes(bytes(data))
    with pytest.raises(module.KitError, match=f"{victim.name}: sha256 mismatch"):
        module.verify(module.KIT)


def test_missing_part_exits_2_in_one_line(kit, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    module, _, tmp_path = kit
    (module.KIT / module.parts(module.KIT)[-1]).unlink()
    monkeypatch.setattr(module, "DEVICE", tmp_path / "device")
    (tmp_path / "device").mkdir()
    shutil.copytree(module.KIT, tmp_path / "device" / "parts")
    assert module.main(["install"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "part missing" in err[0]
    assert not (tmp_path / "device" / "stack").exists()


def test_site_hook_runs_the_trees_pth_files(kit) -> None:
    import subprocess
    import sys

    module, _, tmp_path = kit
    tree = tmp_path / "site-tree"
    (tree / "hidden" / "deep").mkdir(parents=True)
    (tree / "hidden" / "deep" / "found_by_pth.py").write_text("VALUE = 11\n")
    (tree / "adds.pth").write_text(str(tree / "hidden" / "deep") + "\n")
    hook = module.write_site_hook(tmp_path / "hook", [str(tree)])
    code = "import found_by_pth; print(found_by_pth.VALUE)"
    env = {"PYTHONPATH": f"{hook}:{tree}", "PATH": os.environ.get("PATH", "")}
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip() == "11"
    plain = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(tree)}, capture_output=True)
    assert plain.returncode != 0  # a PYTHONPATH folder alone does not run its .pth files


def test_a_bad_verb_is_one_line_and_exit_2(kit, capsys: pytest.CaptureFixture) -> None:
    module, _, _ = kit
    assert module.main(["bogus"]) == 2
    assert module.main(["build", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("gpu-kit: ") for line in err)
    assert module.main(["--help"]) == 0


def test_gpu_verify_refuses_skyrls_loop_beside_other_lanes(tmp_path: Path) -> None:
    """SkyRL's colocated loop frees and retakes GPU memory, which broke the memory profiling of the engines
    started beside it on one H200: such a lane beside another is one line and exit 2, before anything runs."""
    import subprocess

    env = {**os.environ, "OUT": str(tmp_path / "out")}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-verify"), "tests", "kvb,canary_memory"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "lane kvb,canary_memory runs SkyRL's loop" in done.stderr
    assert not (tmp_path / "out" / "logs" / "gpu.txt").exists()  # nothing ran


def test_gpu_verify_counts_megatron_and_recipe_lanes_as_skyrls_loop(tmp_path: Path) -> None:
    """Their runs are SkyRL's loop too: beside another lane without a fixed KV cache, one line and exit 2."""
    import subprocess

    env = {**os.environ, "OUT": str(tmp_path / "out")}
    env.pop("SKYRL_GLM_KV_CACHE_GIB", None)
    for lane in ("meg_glm53@perexpert", "recipe_glm53", "meg_canary"):
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "gpu-verify"), "tests", lane],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2 and f"lane {lane} runs SkyRL's loop" in done.stderr, done.stderr


def test_gpu_verify_refuses_more_loops_than_host_memory_holds(tmp_path: Path) -> None:
    """On one H200 thirteen loop lanes and two others reached 119.5 of 125.9 GB and Ray killed a lane: lanes past
    the host memory available (about 10 GiB each) are one line and exit 2, before anything runs."""
    import subprocess

    env = {**os.environ, "OUT": str(tmp_path / "out"), "SKYRL_GLM_KV_CACHE_GIB": "2"}
    lanes = [f"train_glm53@seed{i}" for i in range(200)]  # 2,000 GiB: more than any machine here
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-verify"), *lanes], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "200 lanes run SkyRL's loop, about 2000 GiB of host memory" in done.stderr
    assert not (tmp_path / "out").exists()  # nothing made or run


def test_gpu_verify_says_why_a_step_failed(tmp_path: Path) -> None:
    """The call's output carries each failed step's own error line (the next call is decided on it while the GPU
    machine is held), and the results file is written."""
    import subprocess

    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_BUDGET_S": "30"}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-verify"), "nope"], capture_output=True, text=True, env=env, timeout=60
    )
    assert "nope: exit 2 in " in done.stdout
    assert "  nope: error: unknown step nope" in done.stdout
    assert (tmp_path / "out" / "results.tar.gz").is_file()


def test_gpu_verify_refuses_a_bad_kv_cache_size_before_anything(tmp_path: Path) -> None:
    import subprocess

    env = {**os.environ, "OUT": str(tmp_path / "out"), "SKYRL_GLM_KV_CACHE_GIB": "two"}
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu-verify"), "tests"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "SKYRL_GLM_KV_CACHE_GIB='two'" in done.stderr
    assert not (tmp_path / "out").exists()  # nothing made or run


def _gpu_verify_with_stand_in(
    tmp_path: Path, lane: str, stand_in: str = 'echo "args: $*"', **extra_env: str
) -> tuple[Any, Path]:
    """``scripts/gpu-verify LANE`` with a stand-in ``skyrl-glm`` on PATH that prints the arguments it was given, or
    runs ``stand_in`` (the plumbing is under test, not SkyRL's loop): the finished process and its ``$OUT``."""
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "skyrl-glm").write_text(f"#!/bin/sh\n{stand_in}\n")
    (bin_dir / "skyrl-glm").chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "GPU_BUDGET_S": "30", "PATH": f"{bin_dir}:{os.environ['PATH']}", **extra_env}
    script = str(ROOT / "scripts" / "gpu-verify")
    return subprocess.run(["bash", script, lane], capture_output=True, text=True, env=env, timeout=60), out


def test_gpu_verify_variants_add_their_overrides(tmp_path: Path) -> None:
    """``STEP@VARIANT@...`` adds each variant's overrides to the step's SkyRL run, which is kept under its own name;
    an unknown variant is the step's error."""
    done, out = _gpu_verify_with_stand_in(tmp_path, "train_glm53@noprefix@dense,train_glm45@nope")
    assert "train_glm53@noprefix@dense: exit 0 in " in done.stdout, done.stdout
    assert "  train_glm45@nope: error: unknown variant nope" in done.stdout
    with tarfile.open(out / "results.tar.gz") as tar:
        log = tar.extractfile("logs/train_glm53@noprefix@dense.log").read().decode()  # type: ignore[union-attr]
    assert "generator.inference_engine.enable_prefix_caching=false" in log
    assert "target_modules=[q_a_proj," in log and "mlp.experts" not in log
    assert f"trainer.log_path={out}/runs/train_glm53_noprefix_dense/logs" in log


def test_gpu_verify_syncs_the_adapter_of_every_grouping_the_load_serves(tmp_path: Path) -> None:
    """A ``grouped:G`` layout serves an adapter of G groups per layer, sent by a sender of its own: the sync step
    sends the one-per-layer adapter and each grouping of ``LOAD_LAYOUTS`` once, each to its own report."""
    done, out = _gpu_verify_with_stand_in(tmp_path, "sync", LOAD_LAYOUTS="shared-all,grouped:64,grouped:4,grouped:4")
    assert "sync: exit 0 in " in done.stdout, done.stdout
    with tarfile.open(out / "results.tar.gz") as tar:
        log = tar.extractfile("logs/sync.log").read().decode()  # type: ignore[union-attr]
    sent = [line for line in log.splitlines() if line.startswith("args: bench sync")]
    assert [line.split("--expert-groups ")[1].split()[0] for line in sent] == ["1", "4", "64"], log
    assert "ipc_full_bridge_stream.json" in sent[0] and "ipc_full_bridge_stream_g64.json" in sent[2]


def test_gpu_verify_stopped_from_outside_stops_its_lanes_and_packs_what_they_wrote(tmp_path: Path) -> None:
    """A call's time limit signals gpu-verify, not its lanes (each runs in a session of its own): the lanes must be
    stopped there, or their engines keep the GPU into the next call. A stand-in ``skyrl-glm`` that runs for minutes
    is the lane's step."""
    import signal
    import subprocess
    import time

    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    started = tmp_path / "started"
    (bin_dir / "skyrl-glm").write_text(f"#!/bin/sh\necho $$ > {started}\nexec sleep 300\n")
    (bin_dir / "skyrl-glm").chmod(0o755)
    env = {**os.environ, "OUT": str(out), "GPU_BUDGET_S": "120", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "gpu-verify"), "train_glm53"], stdout=subprocess.PIPE, text=True, env=env
    )
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    step = int(started.read_text())
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=60)
    assert "lane train_glm53: stopped from outside in train_glm53" in stdout, stdout
    with pytest.raises(ProcessLookupError):
        os.kill(step, 0)  # the step is gone, not left running beside the next call
    assert (out / "results.tar.gz").is_file()


def _archive(kit_dir: Path, archive: str, data: bytes, part_bytes: int = 4096) -> None:
    """``data`` (already compressed, or not: a damaged kit) as the archive's parts, with every sha256 right."""
    import hashlib

    sums = {}
    if (kit_dir / "SHA256SUMS").exists():
        sums = dict(reversed(line.split()) for line in (kit_dir / "SHA256SUMS").read_text().splitlines())
    sums[f"{archive}.tar.zst"] = hashlib.sha256(data).hexdigest()
    for i in range(0, len(data), part_bytes):
        part = kit_dir / f"{archive}.tar.zst.part{i // part_bytes:03d}"
        part.write_bytes(data[i : i + part_bytes])
        sums[part.name] = hashlib.sha256(part.read_bytes()).hexdigest()
    (kit_dir / "SHA256SUMS").write_text("".join(f"{d}  {n}\n" for n, d in sorted(sums.items())))


def _tar(*members: tuple[str, str, str]) -> bytes:
    """A zstd-compressed tar of (kind, name, link target or content) members, as a hostile builder would make."""
    import io

    import zstandard

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for kind, name, value in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(value)
                tar.addfile(info, io.BytesIO(value.encode()))
                continue
            info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
            info.linkname = value
            tar.addfile(info)
    return zstandard.ZstdCompressor().compress(buf.getvalue())


GOOD = ("file", "pkg/ok.py", "X = 1\n")
DAMAGED = {
    "dotdot": _tar(GOOD, ("file", "../escaped.txt", "out")),
    "absolute": _tar(GOOD, ("file", "/tmp/skyrl-glm-kit-absolute.txt", "out")),
    "symlink-out": _tar(GOOD, ("symlink", "pkg/up", "../../.."), ("file", "pkg/late.py", "")),
    "hardlink-out": _tar(GOOD, ("hardlink", "pkg/passwd", "/etc/passwd")),
    "lone-symlink": _tar(("symlink", "passwd", "/etc/passwd")),
    "corrupt-zstd": _tar(GOOD)[:12] + b"\x00garbage" * 50,
    "not-zstd": b"plainly not a zstd stream" * 20,
    "truncated": _tar(GOOD, ("file", "pkg/more.py", "Y = 2\n" * 2000))[:-40],
}


@pytest.fixture
def device(kit, monkeypatch: pytest.MonkeyPatch):
    """The GPU machine's folder, holding the good stack archive's parts; a test adds a damaged one."""
    module, _, tmp_path = kit
    monkeypatch.setattr(module, "DEVICE", tmp_path / "device")
    shutil.copytree(module.KIT, tmp_path / "device" / "parts")
    return module, tmp_path / "device"


def _refused(module, device: Path, capsys: pytest.CaptureFixture, says: str) -> None:
    """One line, exit 2, and nothing beside the parts: no tree, no fresh folder, no decompressor."""
    assert module.main(["install"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpu-kit: ") and says in err[0], err
    assert [p.name for p in device.iterdir()] == ["parts"]


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_a_damaged_archive_is_one_line_and_leaves_nothing(device, capsys: pytest.CaptureFixture, name: str) -> None:
    """The damaged archive sorts after the good one (``zz``): the good one must not be unpacked either."""
    module, folder = device
    _archive(folder / "parts", "zz", DAMAGED[name])
    says = "damaged archive" if name in ("corrupt-zstd", "not-zstd", "truncated") else "refused"
    _refused(module, folder, capsys, f"zz: {'' if says == 'damaged archive' else 'member '}")
    assert not Path("/tmp/skyrl-glm-kit-absolute.txt").exists()
    assert not (folder.parent / "escaped.txt").exists()


@pytest.mark.parametrize(
    "content,says",
    [
        (b"\xff\xfe not utf-8\n", "SHA256SUMS: not UTF-8 text (byte 0)"),
        (b"garbage\n", "SHA256SUMS line 1: expected '<sha256>  <file name>'"),
        (b"%s  ../stack.tar.zst.part000\n" % (b"0" * 64), "SHA256SUMS line 1: expected"),
        (b"%s  stack.tar.zst.partXY\n" % (b"0" * 64), "not a part"),
    ],
    ids=["not-utf8", "garbage", "path-in-name", "bad-part-name"],
)
def test_a_damaged_sums_file_is_one_line_and_leaves_nothing(device, capsys, content: bytes, says: str) -> None:
    module, folder = device
    (folder / "parts" / "SHA256SUMS").write_bytes(content)
    _refused(module, folder, capsys, says)


def test_a_part_missing_from_the_sums_is_named(device, capsys) -> None:
    module, folder = device
    sums = folder / "parts" / "SHA256SUMS"
    sums.write_text("".join(line + "\n" for line in sums.read_text().splitlines() if "part001" not in line))
    _refused(module, folder, capsys, "stack: part 1 is not in SHA256SUMS")


def test_gpu_verify_seed_steps_lr_and_fault_at_step_variants(tmp_path: Path) -> None:
    """The canary's and the in-training faults' lanes: ``@seedN``, ``@stepsN``, ``@lrX`` and ``@fault_NAME_atK``
    (one variant, two overrides: the fault with its dashes back, and its step), each run under its own name."""
    lane = "canary_memory@seed2@steps16@lr5e-2@wide,train_glm53@fault_drop_shared_experts_at3"
    done, out = _gpu_verify_with_stand_in(tmp_path, lane)
    assert "train_glm53@fault_drop_shared_experts_at3: exit 0 in " in done.stdout, done.stdout
    with tarfile.open(out / "results.tar.gz") as tar:
        canary = tar.extractfile("logs/canary_memory@seed2@steps16@lr5e-2@wide.log").read().decode()  # type: ignore[union-attr]
        fault = tar.extractfile("logs/train_glm53@fault_drop_shared_experts_at3.log").read().decode()  # type: ignore[union-attr]
    args = canary.split()
    assert {"trainer.seed=2", "trainer.max_training_steps=16", "trainer.policy.optimizer_config.lr=5e-2"} <= set(args)
    assert {"trainer.train_batch_size=16", "generator.n_samples_per_prompt=32"} <= set(args)
    assert "skyrl_glm.sync.fault=drop-shared-experts skyrl_glm.sync.fault_at_step=3 " in fault, fault
    assert f"trainer.log_path={out}/runs/train_glm53_fault_drop_shared_experts_at3/logs" in fault


def test_gpu_verify_load_profiles_the_engines_on_request(tmp_path: Path) -> None:
    """``LOAD_PROFILE=1`` hands the layout bench a profile directory inside ``$OUT`` (so the profiles come back with
    the results); without it, none."""
    done, out = _gpu_verify_with_stand_in(tmp_path, "load", LOAD_LAYOUTS="shared-all", LOAD_PROFILE="1")
    assert "load: exit 0 in " in done.stdout, done.stdout
    with tarfile.open(out / "results.tar.gz") as tar:
        log = tar.extractfile("logs/load.log").read().decode()  # type: ignore[union-attr]
    assert f"--profile-dir {out}/profiles " in log, log
    # what the engines write there comes back in the results file
    (tmp_path / "again").mkdir()
    writes = 'mkdir -p "$OUT/profiles" && echo x > "$OUT/profiles/a.prof"'
    done, out = _gpu_verify_with_stand_in(
        tmp_path / "again", "load", writes, LOAD_LAYOUTS="shared-all", LOAD_PROFILE="1"
    )
    with tarfile.open(out / "results.tar.gz") as tar:
        assert tar.extractfile("profiles/a.prof").read() == b"x\n"  # type: ignore[union-attr]
    (tmp_path / "plain").mkdir()
    done, out = _gpu_verify_with_stand_in(tmp_path / "plain", "load", LOAD_LAYOUTS="shared-all")
    with tarfile.open(out / "results.tar.gz") as tar:
        assert "--profile-dir" not in tar.extractfile("logs/load.log").read().decode()  # type: ignore[union-attr]
