"""Hostile or broken updates against the receiver, the transports and the publisher.

Each case is one rejection with a reason (never another exception type, never a hang); nothing is allocated or
opened on the say-so of the manifest or the handle; nothing the sender staged outlives a failed send.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import threading

import pytest
import torch
import torch.multiprocessing as mp
from shm_receive import receive_over_shm

from skyrl_glm.sync.manifest import Manifest, ManifestError
from skyrl_glm.sync.plan import build_plan
from skyrl_glm.sync.receiver import AdapterReceiver, UpdateRejected
from skyrl_glm.sync.transports.shm import SharedMemoryTransport, segment_name
from skyrl_glm.sync.update import UpdateResult
from skyrl_glm.sync.vllm.control import signed
from skyrl_glm.sync.vllm.worker import receiver_state

CONFIG = {"r": 4, "lora_alpha": 8}


def adapter(rank: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    out = {}
    for m in ("q_proj", "o_proj"):
        out[f"base_model.model.model.layers.0.self_attn.{m}.lora_A.weight"] = torch.randn(rank, 16, generator=g)
        out[f"base_model.model.model.layers.0.self_attn.{m}.lora_B.weight"] = torch.randn(16, rank, generator=g)
    return out


def plan(version: int = 1, **kw):
    tensors, config = kw.pop("tensors", adapter()), kw.pop("config", CONFIG)
    return build_plan(tensors, adapter_config=config, lora_name="p", version=version)


def raw(p) -> dict:
    return json.loads(p.manifest.to_json())


def receive(manifest_json, handle=None, tx=None, p=None, receiver=None):
    """``manifest_json`` received against ``p`` (default a valid plan) staged on shared memory."""
    return receive_over_shm(p or plan(), manifest_json, handle=handle, receiver=receiver, tx=tx)


# ------------------------------------------------------------------------------ 1, 7: strict manifest types


LAYOUT = {"lora_name", "adapter_config", "tensors", "aliases", "alias_runs", "total_bytes", "bucket_bytes"}


def _with(**changes) -> str:
    """A valid manifest with fields replaced (layout fields inside ``layout``, the per-update ones at the top)."""
    d = raw(plan())
    for k, v in changes.items():
        (d["layout"] if k in LAYOUT else d)[k] = v
    return json.dumps(d)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"version": 2**63}, "outside 0..2\\*\\*63-1"),
        ({"version": -1}, "outside 0..2\\*\\*63-1"),
        ({"version": "7"}, "'version' must be an integer, got str"),
        ({"version": 7.9}, "'version' must be an integer, got float"),
        ({"version": 7.0}, "'version' must be an integer, got float"),
        ({"version": True}, "'version' must be an integer, got bool"),
        ({"total_bytes": "64"}, "'total_bytes' must be an integer"),
        ({"bucket_bytes": None}, "'bucket_bytes' must be an integer"),
        ({"lora_name": 5}, "'lora_name' must be a string"),
        ({"adapter_config": [["r", 4]]}, "'adapter_config' must be an object"),
        ({"extra": []}, "'extra' must be an object"),
        ({"tensors": {"a": 1}}, "'tensors' must be a list"),
        ({"tensors": [1]}, "tensor #0 must be \\[name, dtype, shape, offset, nbytes\\]"),
        ({"tensors": [["a", "float32", [4, 16], 0]]}, "tensor #0 must be \\[name, dtype, shape, offset, nbytes\\]"),
        ({"layout": [1]}, "'layout' must be an object"),
        ({"checksums": 12}, "'checksums' must be a string"),
        ({"checksums": ["0" * 16] * 4}, "'checksums' must be a string"),
        ({"checksums": "0" * 63}, "checksums: 63 characters for 4 tensors, expected 64"),
        ({"checksums": "0" * 80}, "checksums: 80 characters for 4 tensors, expected 64"),
        ({"checksums": "Z" * 64}, "checksums: not all lowercase hex digits"),
        ({"checksums": "0" * 63 + "\n"}, "checksums: not all lowercase hex digits"),
        ({"checksums": "\u0660" * 64}, "checksums: not all lowercase hex digits"),  # a digit, not an ASCII one
    ],
)
def test_manifest_fields_are_not_coerced(changes, reason):
    with pytest.raises(UpdateRejected, match=reason):
        receive(_with(**changes))


def test_aliases_as_a_list_of_pairs_are_rejected():
    d = raw(plan())
    name = d["layout"]["tensors"][0][0]
    d["layout"]["aliases"] = [["extra.lora_A.weight", name]]
    with pytest.raises(UpdateRejected, match="'aliases' must be an object"):
        receive(json.dumps(d))
    d["layout"]["aliases"] = {"extra.lora_A.weight": 0}
    with pytest.raises(UpdateRejected, match="must map to a string"):
        receive(json.dumps(d))


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("shape", ["4", 16], "list of non-negative integers"),
        ("shape", [4.0, 16], "list of non-negative integers"),
        ("shape", [True, 16], "list of non-negative integers"),
        ("offset", 0.0, "'offset' must be an integer"),
        ("nbytes", "256", "'nbytes' must be an integer"),
        ("name", ["x"], "'name' must be a string"),
        ("dtype", 2, "'dtype' must be a string"),
    ],
)
def test_tensor_entry_fields_are_not_coerced(field, value, reason):
    d = raw(plan())
    d["layout"]["tensors"][0][["name", "dtype", "shape", "offset", "nbytes"].index(field)] = value
    with pytest.raises(UpdateRejected, match=reason):
        receive(json.dumps(d))


@pytest.mark.parametrize("text", ["[]", "3", '"manifest"', "null", "{", b"{}"])
def test_non_object_manifest_is_one_rejection(text):
    with pytest.raises(UpdateRejected, match="must be a JSON object|not valid JSON|must be JSON text"):
        receive(text)


@pytest.mark.parametrize("handle", [[1], "shm", 3, None])
def test_non_object_handle_is_one_rejection(handle):
    p = plan()
    with pytest.raises(UpdateRejected, match="handle must be a JSON object"):
        AdapterReceiver().receive(p.manifest.to_json(), handle, SharedMemoryTransport())


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ({"r": "4", "lora_alpha": "4"}, "r='4' is not a positive integer"),
        ({"r": True, "lora_alpha": True}, "r=True is not a positive integer"),
        ({"r": 0, "lora_alpha": 0}, "r=0 is not a positive integer"),
        ({"r": 4, "lora_alpha": True}, "lora_alpha=True != r=4"),
        ({"r": 4, "lora_alpha": 4, "rank_pattern": {"q_proj": 8}}, "rank_pattern is not supported"),
    ],
)
def test_adapter_config_types(config, reason):
    d = raw(plan())
    d["layout"]["adapter_config"] = config
    with pytest.raises(UpdateRejected, match=reason):
        receive(json.dumps(d))


def test_lora_r_is_checked_against_the_tensors_rank():
    """The config says r=8 (alpha folded to 8) while the tensors have rank 4: rejected before any transfer."""
    d = raw(plan())
    d["layout"]["adapter_config"] = {"r": 8, "lora_alpha": 8}
    with pytest.raises(UpdateRejected, match="rank r=8"):
        receive(json.dumps(d))


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [((2, 4, 16), (2, 16, 3)), ((2, 3, 16), (2, 16, 4)), ((4,), (16, 4)), ((4, 16), (4,))],
    ids=["3d-B", "3d-A", "1d-A", "1d-B"],
)
def test_rank_is_checked_for_any_number_of_dims(a_shape, b_shape):
    tensors = {
        "m.layers.0.mlp.experts.gate_proj.lora_A.weight": torch.randn(a_shape),
        "m.layers.0.mlp.experts.gate_proj.lora_B.weight": torch.randn(b_shape),
    }
    with pytest.raises(UpdateRejected, match="shape mismatch"):
        receive(plan(tensors=tensors).manifest.to_json(), p=plan(tensors=tensors))


def test_three_dim_tensors_of_the_right_rank_pass():
    tensors = {
        "m.layers.0.mlp.experts.gate_proj.lora_A.weight": torch.randn(2, 4, 16),
        "m.layers.0.mlp.experts.gate_proj.lora_B.weight": torch.randn(2, 16, 4),
    }
    p = plan(tensors=tensors)
    got = receive(p.manifest.to_json(), p=p).tensors
    assert got["m.layers.0.mlp.experts.gate_proj.lora_A.weight"].shape == (2, 4, 16)


# ------------------------------------------------------------------------------------------- 5: empty adapter


def test_an_adapter_with_no_tensors_is_rejected():
    d = raw(plan())
    d["layout"]["tensors"], d["layout"]["aliases"], d["layout"]["total_bytes"], d["checksums"] = [], {}, 0, ""
    with pytest.raises(UpdateRejected, match="empty adapter"):
        receive(json.dumps(d))


def test_worker_staging_failure_is_a_rejection(monkeypatch):
    """The worker extension returns a rejection (never raises) when staging the verified adapter fails."""
    from skyrl_glm.sync.vllm import worker as vllm_worker

    def boom(*a, **k):
        raise ValueError("no room")

    monkeypatch.setattr(vllm_worker, "stage_in_memory_adapter", boom)
    p = plan()
    tx = SharedMemoryTransport()
    handle = tx.prepare(p)
    try:
        args = signed("skyrl_glm_receive", (p.manifest.to_json(), handle, "cpu"))
        answer = vllm_worker.LoraSyncWorkerExtension().skyrl_glm_receive(*args)
    finally:
        tx.release()
    assert answer == {"ok": False, "reason": "ValueError: no room"}


# ------------------------------------------------------------------------ 3: no allocation before validation


def test_staging_is_not_allocated_from_an_unvalidated_total_bytes(monkeypatch):
    """A manifest claiming 20 GB (consistent in itself: the tensors fit) against a segment of a few hundred
    bytes: rejected, and no buffer of the claimed size is ever asked for."""
    claim = 20 * 10**9
    d = raw(plan())
    d["layout"]["total_bytes"] = claim
    asked: list[int] = []
    real_empty = torch.empty

    def spy(*size, **kw):
        n = size[0] if size and isinstance(size[0], int) else 0
        asked.append(n)
        return real_empty(*size, **kw)

    monkeypatch.setattr(torch, "empty", spy)
    with pytest.raises(UpdateRejected, match=f"holds \\d+ bytes, the manifest describes {claim}"):
        receive(json.dumps(d))
    assert claim not in asked


# ------------------------------------------------------------------------- 4: the shm handle is confined


def _rejects_quickly(handle: dict, match: str) -> None:
    p = plan()
    errors: list[BaseException] = []

    def attempt() -> None:
        try:
            AdapterReceiver().receive(p.manifest.to_json(), handle, SharedMemoryTransport())
        except BaseException as e:  # noqa: BLE001 - inspected below
            errors.append(e)

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), f"receiver blocked on handle {handle}"
    assert len(errors) == 1 and isinstance(errors[0], UpdateRejected), errors
    assert match in errors[0].reason, errors[0].reason


@pytest.mark.parametrize(
    "name",
    ["/etc/hostname", "../../etc/hostname", "psm_12345678", "skyrl_glm_" + "0" * 31, "skyrl_glm_" + "0" * 32, 7, None],
)
def test_shm_handle_accepts_only_this_transports_segment_names(name):
    _rejects_quickly({"shm_name": name}, "names no segment of this transport")


def test_shm_handle_naming_a_fifo_or_a_link_does_not_block():
    fifo, link = segment_name(), segment_name()
    os.mkfifo(f"/dev/shm/{fifo}")
    os.symlink("/etc/hostname", f"/dev/shm/{link}")
    try:
        _rejects_quickly({"shm_name": fifo}, "not a regular file")
        _rejects_quickly({"shm_name": link}, "unreadable")
    finally:
        os.unlink(f"/dev/shm/{fifo}")
        os.unlink(f"/dev/shm/{link}")


# ---------------------------------------------------------------------- 6: nothing staged outlives a failure


@pytest.fixture
def created(monkeypatch) -> list[str]:
    """Paths of every shared-memory segment the transport creates during the test."""
    paths: list[str] = []
    real = SharedMemoryTransport.staging

    def recording(self, nbytes, device):
        buf = real(self, nbytes, device)
        paths.append(f"/dev/shm/{self._segment[0]}")
        return buf

    monkeypatch.setattr(SharedMemoryTransport, "staging", recording)
    return paths


def test_publisher_releases_the_segment_when_the_sampler_raises(created):
    from skyrl_glm.sync.publisher import InMemoryPublisher

    class Crashing:
        def apply_update(self, manifest_json: str, handle: dict, transport: str) -> UpdateResult:
            assert os.path.exists(created[0])
            raise RuntimeError("engine died")

    publisher = InMemoryPublisher(Crashing(), SharedMemoryTransport())
    with pytest.raises(RuntimeError, match="engine died"):
        publisher.publish(adapter(), CONFIG, 1)
    assert len(created) == 1 and not os.path.exists(created[0])


def test_half_done_prepare_leaves_no_segment(created):
    p = plan()  # packed in its own buffer: prepare copies it into a fresh segment, and that copy fails
    p.buffer = torch.empty(p.manifest.total_bytes, dtype=torch.uint8, device="meta")
    with pytest.raises((RuntimeError, NotImplementedError)):
        SharedMemoryTransport().prepare(p)
    assert len(created) == 1 and not os.path.exists(created[0])


# ------------------------------------------------------ collective: a rejecting receiver releases the sender


def _collective_proc(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from skyrl_glm.sync.transports.collective import CollectiveTransport

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tx = CollectiveTransport()
    p = plan(version=5)
    try:
        if rank == 0:
            tx.stream(p)  # returns once the receiver declined: no bucket is broadcast
            tx.stream(p)  # the second update is accepted
            result = "sender done"
        else:
            rx = AdapterReceiver()
            rx.commit(5)
            try:
                rx.receive(p.manifest.to_json(), tx.prepare(p), tx)
                result = "accepted an old version"
            except UpdateRejected as e:
                result = e.reason
            d = raw(p)
            d["version"] = 6
            got = rx.receive(json.dumps(d), tx.prepare(p), tx)
            ok = all(torch.equal(got.tensors[e.name], t) for e, t in zip(p.manifest.tensors, p.tensors, strict=True))
            result += f" | second ok={ok}"
        with open(f"{out}.{rank}", "w") as f:
            f.write(result)
    finally:
        dist.destroy_process_group()


def test_collective_receiver_that_rejects_releases_the_sender(tmp_path):
    from skyrl_glm.bench.procs import free_port

    out = str(tmp_path / "r")
    mp.spawn(_collective_proc, args=(free_port(), out), nprocs=2, join=True)
    assert open(f"{out}.0").read() == "sender done"
    assert open(f"{out}.1").read() == "version 5 is not newer than the serving version 5 | second ok=True"


def test_manifest_error_for_a_bad_dataclass_value():
    """validate() also guards manifests built in code (the sender's own plan)."""
    m = plan().manifest
    with pytest.raises(ManifestError, match="version 18446744073709551616"):
        dataclasses.replace(m, version=2**64).validate()
    assert Manifest.from_json(m.to_json()) == m


def test_a_plan_that_is_never_sent_leaves_no_segment(created):
    """The publisher planned into a segment, then its caller gave up before sending (a fault that does not apply)."""
    import gc

    from skyrl_glm.sync.publisher import InMemoryPublisher

    publisher = InMemoryPublisher(None, SharedMemoryTransport())
    p = publisher.plan(adapter(), CONFIG, 1)
    assert os.path.exists(created[0])
    del p, publisher
    gc.collect()
    assert not os.path.exists(created[0])


def test_a_plan_that_fails_after_staging_leaves_no_segment(created):
    """The fold refuses a non-positive alpha after the stream was packed into the segment."""
    from skyrl_glm.sync.publisher import InMemoryPublisher

    publisher = InMemoryPublisher(None, SharedMemoryTransport())
    with pytest.raises(ValueError, match="alpha must be positive"):
        publisher.publish(adapter(), {"r": 4, "lora_alpha": -4}, 1)
    assert len(created) == 1 and not os.path.exists(created[0])


# ------------------------------------------------------- a segment is trusted for its file, not for its name

OTHER_UID = 65534  # "nobody": the segment's owner as another local user would make it


def _forged_segment(p, how: str, made: list[str]) -> dict:
    """A segment under a name this transport would use, holding ``p``'s stream, damaged in one way (``how``); the
    paths it makes are added to ``made``."""
    name = segment_name()
    path = f"/dev/shm/{name}"
    made.append(path)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        size = p.manifest.total_bytes
        if how == "sparse":
            os.ftruncate(fd, size)  # the right size, nothing allocated: costs its maker nothing
        else:
            os.write(fd, p.buffer[:size].numpy().tobytes() + (b"\0" * 4096 if how == "too-big" else b""))
        if how == "other-owner":
            os.fchown(fd, OTHER_UID, OTHER_UID)
        if how == "group-writable":
            os.fchmod(fd, 0o620)
    finally:
        os.close(fd)
    if how == "hard-link":
        made.append(f"/dev/shm/{segment_name()}")
        os.link(path, made[-1])
    return {"shm_name": name}


def _big_plan():
    """An update of several pages, so that a sparse segment of its size is visibly unallocated."""
    g = torch.Generator().manual_seed(2)
    tensors = {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(4, 4096, generator=g),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.randn(4096, 4, generator=g),
    }
    return build_plan(tensors, adapter_config=CONFIG, lora_name="p", version=1)


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("other-owner", f"owned by uid {OTHER_UID}"),
        ("group-writable", "writable by others"),
        ("hard-link", "2 links"),
        ("too-big", "bytes, the manifest describes"),
        ("sparse", r"are allocated \(sparse\)"),
    ],
)
def test_a_forged_segment_is_refused_before_any_byte_is_read(how, reason, monkeypatch):
    """A local user who can write to /dev/shm made a segment under a valid name holding a stream that matches the
    manifest (their own adapter would pass the checksums): refused by its file, and nothing is read from it."""
    p = _big_plan()
    made: list[str] = []
    handle = _forged_segment(p, how, made)
    reads: list[int] = []
    real_readv = os.readv
    monkeypatch.setattr(os, "readv", lambda fd, bufs: reads.append(fd) or real_readv(fd, bufs))
    try:
        with pytest.raises(UpdateRejected, match=reason):
            AdapterReceiver().receive(p.manifest.to_json(), handle, SharedMemoryTransport())
        assert reads == []
    finally:
        for path in made:  # only what this test made: whatever else /dev/shm holds is not its business
            os.unlink(path)


def test_the_forged_segment_tests_pass_beside_a_leftover_segment(monkeypatch):
    """A segment another run left behind (a killed sender's, an older release's name) does not fail them."""
    leftovers = [f"/dev/shm/skyrl_glm_{secrets.token_hex(16)}", f"/dev/shm/{segment_name()}"]
    for path in leftovers:
        with open(path, "wb") as f:
            f.write(b"left behind")
    try:
        for how, reason in [("hard-link", "2 links"), ("other-owner", "owned by uid")]:
            test_a_forged_segment_is_refused_before_any_byte_is_read(how, reason, monkeypatch)
        assert all(os.path.exists(path) for path in leftovers)
    finally:
        for path in leftovers:
            os.unlink(path)


def test_an_intact_forged_segment_of_this_user_is_what_the_checks_let_through():
    """The control for the cases above: the same forged segment, undamaged, is received (the checks refuse the
    damage, not every segment they did not make)."""
    p = _big_plan()
    made: list[str] = []
    handle = _forged_segment(p, "intact", made)
    try:
        got = AdapterReceiver().receive(p.manifest.to_json(), handle, SharedMemoryTransport())
    finally:
        os.unlink(made[0])
    assert got.version == 1 and len(got.tensors) == 2


# ----------------------------------------------------------------- caps on the manifest, before parsing work


def _parses(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = json.loads
    monkeypatch.setattr(json, "loads", lambda text, *a, **k: calls.append(len(text)) or real(text, *a, **k))
    return calls


def test_an_oversized_manifest_is_refused_before_json_parsing(monkeypatch):
    from skyrl_glm.sync.manifest import MAX_MANIFEST_BYTES

    text = _with(extra={"pad": "x" * MAX_MANIFEST_BYTES})
    calls = _parses(monkeypatch)
    with pytest.raises(UpdateRejected, match="exceeds the cap"):
        receive(text)
    assert calls == []


@pytest.mark.parametrize("what", ["aliases", "tensors", "name", "run-names", "run-count"])
def test_counts_and_name_lengths_are_capped(what):
    from skyrl_glm.sync import manifest as m

    d = raw(plan())
    sent = d["layout"]["tensors"][0][0]
    if what == "aliases":
        d["layout"]["aliases"] = {f"x.{i}.lora_A.weight": sent for i in range(m.MAX_ALIASES + 1)}
    elif what == "tensors":
        d["layout"]["tensors"] = [d["layout"]["tensors"][0]] * (m.MAX_TENSORS + 1)
    elif what == "name":
        d["layout"]["aliases"] = {"x." * m.MAX_NAME_CHARS + "lora_A.weight": sent}
    elif what == "run-names":  # 900-character heads over 2**20 indices: ~1 GB of names from a few kB of JSON
        d["layout"]["alias_runs"] = [["h" * 900 + ".", 0, 1 << 20, ".lora_A.weight", sent]]
    else:
        d["layout"]["alias_runs"] = [["a.", 0, 1, ".b", sent]] * (m.MAX_TENSORS + 1)
    with pytest.raises(UpdateRejected, match="cap"):
        receive(json.dumps(d))


# ------------------------------------------------- control calls: typed, and only on what this worker staged


def _signed_receive(ext, version: int) -> None:
    """``ext`` receives and stages a valid update of ``version`` through a signed call."""
    tx = SharedMemoryTransport()
    p = plan(version=version)
    try:
        answer = ext.skyrl_glm_receive(*signed("skyrl_glm_receive", (p.manifest.to_json(), tx.prepare(p), "cpu")))
    finally:
        tx.release()
    assert answer["ok"], answer


@pytest.fixture
def worker():
    """The worker extension in this process, with one update (version 1) received, staged and committed."""
    from skyrl_glm.sync.vllm.worker import LoraSyncWorkerExtension

    ext = LoraSyncWorkerExtension()
    _signed_receive(ext, 1)
    assert ext.skyrl_glm_commit(*signed("skyrl_glm_commit", (1, ["p@v1"]))) == ["p@v1"]
    yield ext
    from skyrl.backends.skyrl_train.patches.vllm.patch_lora_in_memory import discard_in_memory_adapter

    discard_in_memory_adapter("p@v1")


@pytest.mark.parametrize(
    ("method", "args", "reason"),
    [
        ("skyrl_glm_commit", (2**63 - 1, []), "was not staged by this worker"),
        ("skyrl_glm_commit", ("x", []), "was not staged by this worker"),
        ("skyrl_glm_commit", (True, []), "was not staged by this worker"),
        ("skyrl_glm_commit", (0, []), "was not staged by this worker"),
        ("skyrl_glm_commit", (1, []), "is not newer than the serving 1"),
        ("skyrl_glm_commit", (1, "p@v1"), "is not newer"),
        ("skyrl_glm_discard", ("p@v1",), "is serving"),
        ("skyrl_glm_discard", ("someone-else@v9",), "was not staged by this worker"),
        ("skyrl_glm_discard", (["p@v1"],), "was not staged by this worker"),
        ("skyrl_glm_staged", ("extra",), "takes 0..0 arguments"),
    ],
)
def test_signed_calls_are_still_typed_and_confined_to_this_workers_names(worker, method, args, reason):
    from skyrl_glm.sync.vllm.control import ControlRefused

    with pytest.raises(ControlRefused, match=reason):
        getattr(worker, method)(*signed(method, args))
    assert worker.skyrl_glm_staged(*signed("skyrl_glm_staged", ())) == ["p@v1"]
    assert receiver_state(worker).receiver.version == 1


def test_a_receive_with_a_bad_transport_or_verify_type_is_refused(worker):
    p = plan(version=2)
    for args in ((p.manifest.to_json(), {}, 7), (p.manifest.to_json(), {}, "cpu", "no")):
        answer = worker.skyrl_glm_receive(*signed("skyrl_glm_receive", args))
        assert not answer["ok"] and "transport must be a string and verify a boolean" in answer["reason"]


def test_commit_keeps_only_listed_names_this_worker_staged(worker):
    _signed_receive(worker, 2)
    from skyrl_glm.sync.vllm.control import ControlRefused

    with pytest.raises(ControlRefused, match="keep must list names this worker staged"):
        worker.skyrl_glm_commit(*signed("skyrl_glm_commit", (2, ["p@v2", "not-mine@v1"])))
    assert worker.skyrl_glm_commit(*signed("skyrl_glm_commit", (2, ["p@v2"]))) == ["p@v2"]


def test_a_second_publisher_of_a_staged_version_is_refused_and_the_first_stays_staged(worker, monkeypatch):
    """Two signed publishers send version 2: the first is staged, the second refused with the reason (it used to be
    staged too, silently replacing the first's tensors under the same name); an older one is refused as well."""
    from skyrl_glm.sync.vllm import worker as worker_module

    staged: list[str] = []
    real = worker_module.stage_in_memory_adapter
    monkeypatch.setattr(
        worker_module, "stage_in_memory_adapter", lambda name, *a: staged.append(name) or real(name, *a)
    )
    _signed_receive(worker, 2)
    tx = SharedMemoryTransport()
    reasons = []
    for version in (2, 1):
        other = plan(version=version, tensors={k: v + 1 for k, v in adapter().items()})
        try:
            args = (other.manifest.to_json(), tx.prepare(other), "cpu")
            answer = worker.skyrl_glm_receive(*signed("skyrl_glm_receive", args))
        finally:
            tx.release()
        assert not answer["ok"], answer
        reasons.append(answer["reason"])
    assert "version 2 of 'p' is not newer than version 2 already staged here" in reasons[0], reasons
    assert "version 1 is not newer than the serving version 1" in reasons[1], reasons
    assert staged == ["p@v2"], staged
    assert worker.skyrl_glm_commit(*signed("skyrl_glm_commit", (2, ["p@v2"]))) == ["p@v2"]
