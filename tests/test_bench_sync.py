"""``skyrl-glm bench sync`` on CPU: both in-memory paths and the disk baseline in one run, rebuilt bit-exactly."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from skyrl.backends.skyrl_train.distributed.megatron.lora_export import fold_lora_alpha_for_vllm

from skyrl_glm.bench import cli, report
from skyrl_glm.bench.procs import StoreChannel, free_port
from skyrl_glm.bench.synthetic import BenchOptions, synthetic_adapter, values_device
from skyrl_glm.lora.bridge import adapter_config
from skyrl_glm.sync.plan import build_plan
from skyrl_glm.sync.receiver import AdapterReceiver
from skyrl_glm.sync.transports.shm import SharedMemoryTransport


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser


@pytest.fixture(scope="module")
def bench_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "sync.json"
    args = _parser().parse_args(
        ["bench", "sync", "--config", "tiny", "--rank", "8", "--warmup", "0", "--repeat", "2", "--json", str(out)]
    )
    assert args.func(args) == 0
    return json.loads(out.read_text())


def test_report_has_all_paths_and_sizes(bench_report):
    assert set(bench_report["paths"]) == {"skyrl", "ours", "disk"}
    a = bench_report["adapter"]
    assert a["public_tensors"] > a["unique_tensors"] > 0
    assert a["public_bytes"] > a["unique_bytes"] > 0
    ours, skyrl = bench_report["paths"]["ours"], bench_report["paths"]["skyrl"]
    assert ours["sent_tensors"] == a["unique_tensors"]  # exact dedup: every unique tensor once, nothing else
    assert skyrl["sent_tensors"] >= ours["sent_tensors"]  # SkyRL dedups routed experts only
    for p in ("ours", "skyrl", "disk"):
        assert set(bench_report["paths"][p]["stages_s"]) == set(report.STAGES)
        assert bench_report["paths"][p]["stages_s"]["export"] is None  # resident: the adapter is already exported
        assert bench_report["paths"][p]["total_s"] > 0
    for st in ("fold", "dedup", "checksum", "transfer", "verify", "rebuild"):
        assert ours["stages_s"][st] is not None
    assert ours["stages_s"]["load"] is None and bench_report["skipped"]["load"].startswith("skipped")
    # one receiver across rounds: its first update (no warm-up here, so the first timed round) is reported apart
    assert ours["verify_first_s"] == ours["runs"][0]["receiver"]["verify_s"] > 0
    assert "verify_first_s" not in skyrl or skyrl["verify_first_s"] is None


@pytest.mark.parametrize("copies", [[], ["--copies"]], ids=["shared-storage", "copies"])
def test_bridge_stream_exporter_times_the_export_on_every_path(copies, tmp_path):
    """``--exporter bridge-stream``: each sync exports afresh (the Megatron sync's rank 0 for ours, SkyRL's memory
    path's dedupe over the same stream, its file path for disk), every public name rebuilt bit-exactly."""
    out = tmp_path / "sync.json"
    argv = ["bench", "sync", "--config", "tiny", "--rank", "8", "--warmup", "0", "--exporter", "bridge-stream"]
    args = _parser().parse_args([*argv, *copies, "--json", str(out)])
    assert args.func(args) == 0
    got = json.loads(out.read_text())
    assert got["adapter"]["exporter"].startswith("bridge-stream, ")
    n = got["adapter"]["public_tensors"]
    for p in ("ours", "skyrl", "disk"):
        path = got["paths"][p]
        assert path["stages_s"]["export"] is not None and path["stages_s"]["export"] >= 0, p
        assert path["verified"]["bit_exact"] and path["verified"]["received_names"] == n, (p, path["verified"])
    assert got["paths"]["ours"]["sent_tensors"] == got["adapter"]["unique_tensors"]


def test_ours_names_the_accepted_layout_by_digest_after_the_first_update(bench_report):
    """As the publisher does: the receiver holds the layout after one update, so the manifest names it by digest."""
    runs = bench_report["paths"]["ours"]["runs"]
    assert len(runs) > 1 and [r["manifest_by_digest"] for r in runs] == [False] + [True] * (len(runs) - 1)
    assert runs[-1]["manifest_bytes"] < runs[0]["manifest_bytes"]
    assert not any(r["manifest_by_digest"] for r in bench_report["paths"]["skyrl"]["runs"])


def test_every_path_rebuilt_every_public_name_bit_exactly(bench_report):
    n = bench_report["adapter"]["public_tensors"]
    for p in ("ours", "skyrl", "disk"):
        v = bench_report["paths"][p]["verified"]
        assert v["bit_exact"], (p, v)
        assert v["received_names"] == v["public_names"] == n


@pytest.mark.parametrize("copies", [False, True])
def test_our_receiver_rebuilds_the_folded_input(copies):
    """Independent of the bench's own check: plan -> shm -> receiver, then torch.equal per public name against
    SkyRL's fold of the input dict."""
    opts = BenchOptions(config="tiny", rank=8, alpha=32.0, copies=copies).resolved()
    syn = synthetic_adapter(opts)
    public = {n: (syn.unique[k].clone() if copies else syn.unique[k]) for n, k in syn.names.items()}
    config = adapter_config(opts.rank, opts.alpha, syn.targets)
    plan = build_plan(iter(public.items()), adapter_config=config, lora_name="t", version=1, bucket_bytes=4096)
    assert len(plan.manifest.tensors) == len(syn.unique)
    transport = SharedMemoryTransport()
    handle = transport.prepare(plan)
    try:
        got = AdapterReceiver("cpu").receive(plan.manifest.to_json(), handle, transport)
    finally:
        transport.release()
    expected = fold_lora_alpha_for_vllm(public, config_rank=8, alpha=32.0)
    assert set(got.tensors) == set(expected)
    for name, exp in expected.items():
        assert got.tensors[name].dtype == exp.dtype and torch.equal(got.tensors[name], exp), name
    assert got.adapter_config["lora_alpha"] == got.adapter_config["r"] == 8


def test_layers_cuts_the_full_config():
    opts = BenchOptions(config="full", layers=1, rank=2).resolved()
    syn = synthetic_adapter(opts)
    expert_names = [n for n in syn.names if ".mlp.experts." in n]
    assert len(expert_names) == 256 * 6  # one MoE layer, 256 experts, gate/up/down x A/B
    assert {n.split(".layers.")[1].split(".")[0] for n in expert_names} == {"3"}


def test_each_process_draws_on_its_own_device_and_the_counting_one_draws_nothing():
    """The values where both sides' devices are of one kind, else on the host; ``meta`` counts the same bytes."""
    cpu = BenchOptions(config="tiny", rank=2, transport="nccl", device="cpu").resolved()
    assert values_device(cpu, cpu.device) == values_device(cpu, cpu.recv_device) == "cpu"
    mixed = BenchOptions(config="tiny", rank=2, device="cuda:0", recv_device="cpu")
    assert values_device(mixed, "cuda:0") == values_device(mixed, "cpu") == "cpu"
    drawn, counted = synthetic_adapter(cpu), synthetic_adapter(cpu, device="meta")
    assert [(k, t.shape, t.dtype) for k, t in drawn.unique.items()] == [
        (k, t.shape, t.dtype) for k, t in counted.unique.items()
    ]
    assert all(t.is_meta for t in counted.unique.values()) and drawn.names == counted.names
    assert torch.equal(next(iter(drawn.unique.values())), next(iter(synthetic_adapter(cpu).unique.values())))


def test_two_processes_each_draw_the_same_values_and_every_name_arrives_bit_exact(tmp_path):
    """The two-process path (the collective transport over gloo on this machine): each side draws its own values."""
    out = tmp_path / "nccl.json"
    args = _parser().parse_args(
        ["bench", "sync", "--config", "tiny", "--rank", "4", "--transport", "nccl", "--device", "cpu"]
        + ["--repeat", "1", "--warmup", "0", "--no-disk", "--json", str(out)]
    )
    assert args.func(args) == 0
    got = json.loads(out.read_text())
    assert all(got["paths"][p]["bit_exact"] for p in ("skyrl", "ours"))
    assert got["adapter"]["unique_bytes"] > 0 and got["paths"]["ours"]["sent_bytes"] == got["adapter"]["unique_bytes"]


def test_store_channel_carries_a_full_size_manifest():
    """TCPStore refuses values over 8 MiB; a full GLM-5.3 manifest (116k aliases) is ~17 MB."""
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", free_port(), 1, is_master=True, timeout=datetime.timedelta(seconds=30))
    chan = StoreChannel(store)
    value = json.dumps({"aliases": {f"n{i}": "x" * 40 for i in range(300_000)}})
    assert len(value) > 8 << 20
    chan.put("m", value)
    assert chan.get("m") == value


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--model", "glm-4.5", "--config", "full"],
            "--config full: model family 'glm-4.5' has no full config (use --config tiny)",
        ),
        (["--rank", "0"], "--rank must be >= 1, got 0"),
        (
            ["--exporter", "bridge-stream", "--no-share-experts"],
            "--exporter bridge-stream: the bridge shares one adapter across experts here (drop --no-share-experts)",
        ),
        (["--json", "{file}/report.json"], "--json {file}/report.json: {file} is not a directory"),
        (["--plot", "/"], "--plot /: is a directory, not a file"),
        (["--alpha", "nan"], "--alpha must be a finite number > 0, got nan"),
        (["--alpha", "inf"], "--alpha must be a finite number > 0, got inf"),
        (["--alpha", "0"], "--alpha must be a finite number > 0, got 0.0"),
        (["--alpha", "-16"], "--alpha must be a finite number > 0, got -16.0"),
        (["--rank", "100000"], "--rank must be <= 512, got 100000"),
        (["--repeat", "10000000"], "--repeat must be <= 1000, got 10000000"),
        (["--seed", str(2**70)], f"--seed must be <= {2**63 - 1}, got {2**70}"),
        (["--disk-dir", "{file}"], "--disk-dir {file}: exists and is not a directory"),
        (["--disk-dir", "{file}/sub"], "--disk-dir {file}/sub: {file} is not a directory"),
        (["--device", "bogus"], "--device 'bogus': not a device (cpu, cuda or cuda:N)"),
        (["--device", "cuda"], "--device 'cuda': no CUDA device on this machine (use cpu)"),
        (["--recv-device", "cuda:9"], "--recv-device 'cuda:9': no CUDA device on this machine (use cpu)"),
        (["--device", "meta"], "--device 'meta': the benchmark runs on cpu or cuda devices"),
        (
            ["--transport", "ipc"],
            "--transport ipc moves CUDA memory: it needs CUDA devices (--device cuda:N)",
        ),
        (["--layers", "1000000"], "--layers must be in 1..2 for glm-5.3's tiny config, got 1000000"),
        (
            ["--exporter", "bridge", "--transport", "nccl"],
            "--exporter bridge: the model lives in the sending process; use --transport cpu",
        ),
    ],
    ids=[
        "no-full-config",
        "rank-0",
        "unshared-stream",
        "unwritable-json",
        "plot-is-a-dir",
        "alpha-nan",
        "alpha-inf",
        "alpha-0",
        "alpha-negative",
        "rank-huge",
        "repeat-huge",
        "seed-past-64-bit",
        "disk-dir-a-file",
        "disk-dir-under-a-file",
        "device-bogus",
        "device-cuda",
        "recv-device-cuda-9",
        "device-meta",
        "ipc",
        "layers-huge",
        "bridge-over-nccl",
    ],
)
def test_bad_arguments_are_refused_before_the_run(extra, message, capsys, monkeypatch, tmp_path):
    import skyrl_glm.bench.run as run

    if torch.cuda.is_available() and any(a.startswith("cuda") or a == "ipc" for a in extra):
        pytest.skip("the CUDA cases are about a machine without CUDA")
    file = tmp_path / "a-file"
    file.write_text("")
    extra, message = [a.format(file=file) for a in extra], message.format(file=file)
    monkeypatch.setattr(run, "run_sync_bench", lambda opts: pytest.fail("the run started"))
    args = _parser().parse_args(["bench", "sync", *extra])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err == f"skyrl-glm bench sync: error: {message}\n"


def test_the_command_line_builds_every_option_and_runs(tmp_path):
    """Every ``BenchOptions`` field comes from a command-line argument: the command itself runs (one MoE layer of
    the tiny GLM-5.3, no disk baseline) and writes its report."""
    out = tmp_path / "sync.json"
    args = _parser().parse_args(["bench", "sync", "--layers", "1", "--no-disk", "--json", str(out)])
    assert args.func(args) == 0
    runs = [run for path in json.loads(out.read_text())["paths"].values() for run in path["runs"]]
    assert runs and all(run["verified"] for run in runs)


@pytest.mark.parametrize(
    ("model", "config", "layers"), [("glm-5.3", "full", 2), ("glm-5.3", "tiny", None), ("glm-4.5", "tiny", None)]
)
def test_a_bench_model_folder_names_its_architecture(tmp_path, model, config, layers) -> None:
    """``bench sync --exporter bridge`` hands Megatron-Bridge a config-only folder; Bridge refuses one whose config
    names no ``...ForCausalLM`` architecture (measured on one H200: 'Architectures: None')."""
    import json

    from skyrl_glm.bench.synthetic import model_config

    _, cfg = model_config(model, config, layers)
    cfg.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"][0].endswith("ForCausalLM")
