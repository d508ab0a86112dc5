"""The allow-list of the worker extension SkyRL's servers load: every name ``collective_rpc`` can call on it is one of
its signed ``skyrl_glm_*`` methods, one of SkyRL's RPCs it refuses or narrows, or one of SkyRL's sleep/wake RPCs its
loop needs (behind the servers' route guard, tests/test_control_plane.py). The class is enumerated, so a method added
here or by a SkyRL release fails this test until it is classified. The worker is a plain object with the
``parallel_config`` vLLM gives one; the extension's methods are the real ones."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from skyrl.backends.skyrl_train.inference_servers.new_inference_worker_wrap import NewInferenceWorkerWrap

from skyrl_glm.skyrl.workers import sync_group
from skyrl_glm.skyrl.workers.vllm_extension import SKYRL_KEPT, SKYRL_NARROWED, SkyRLGlmWorkerExtension
from skyrl_glm.sync.vllm import control
from skyrl_glm.sync.vllm.control import ControlRefused, signed
from skyrl_glm.sync.vllm.worker import CONTROL_METHODS, receiver_state

pytestmark = pytest.mark.vllm

# SkyRL's own helpers of its sleep/wake RPCs (called by them on the worker, so they cannot be taken away).
SKYRL_HELPERS = ("_skyrl_draft_model", "_skyrl_restore_buffers")
SIGNED = (*CONTROL_METHODS, "skyrl_glm_join_group", "skyrl_glm_node")
# Arguments of the right arity and types for each (what the trainer would send after the MAC).
ARGS: dict[str, tuple[Any, ...]] = {
    "skyrl_glm_receive": ("{}", {}, "cpu"),
    "skyrl_glm_commit": (2, ["p@v1"]),
    "skyrl_glm_discard": ("p@v1",),
    "skyrl_glm_staged": (),
    "skyrl_glm_join_group": ("127.0.0.1", 9, 1, 2, "gloo"),
    "skyrl_glm_node": (),
}


@pytest.fixture(autouse=True)
def run_key() -> None:
    control.sender_key()  # this process is the run: its key file is named in the environment the worker reads


class Worker(SkyRLGlmWorkerExtension):
    def __init__(self) -> None:
        self.parallel_config = SimpleNamespace(data_parallel_index=0, world_size=1, rank=0)


def _own_callables(cls: type) -> set[str]:
    return {n for n in dir(cls) if callable(getattr(cls, n)) and not hasattr(object, n)}


def test_every_callable_name_is_classified():
    names = _own_callables(SkyRLGlmWorkerExtension)
    assert names == {*SIGNED, *SKYRL_NARROWED, *SKYRL_KEPT, *SKYRL_HELPERS}, names
    assert _own_callables(NewInferenceWorkerWrap) == {*SKYRL_NARROWED, *SKYRL_KEPT, *SKYRL_HELPERS}
    # no state or helper of skyrl-glm's is reachable as a method (the review's `_skyrl_glm_receiver` killed the
    # engine's output thread with an object vLLM could not send back)
    assert not [n for n in names if n.startswith("_skyrl_glm")]


@pytest.mark.parametrize("method", SIGNED)
def test_each_signed_method_refuses_a_call_without_the_runs_mac(method):
    worker = Worker()
    receiver_state(worker).staged["p@v1"] = 1
    rest = ARGS[method]
    other = control._mac(b"\x01" * control.KEY_BYTES, method, rest)
    for mac in ("0" * control.MAC_CHARS, other, "\u00e9" * control.MAC_CHARS, b"\x00" * 64, None):
        args = (mac, *rest) if mac is not None else rest
        if method == "skyrl_glm_receive":
            answer = getattr(worker, method)(*args)
            assert not answer["ok"] and "control call refused" in answer["reason"], answer
        else:
            with pytest.raises(ControlRefused, match="not signed with the run's control key"):
                getattr(worker, method)(*args)
    assert receiver_state(worker).staged == {"p@v1": 1} and not receiver_state(worker).joined


def test_skyrl_rpcs_that_would_replace_or_drop_the_adapter_are_refused():
    worker = Worker()
    receiver_state(worker).staged["p@v1"] = 1
    with pytest.raises(ControlRefused, match="skyrl-glm's to drop"):
        worker.skyrl_discard_in_memory_lora("p@v1")  # the serving adapter: the review's discard-then-reload crash
    with pytest.raises(ControlRefused, match="skyrl-glm's to drop"):
        worker.skyrl_discard_in_memory_lora(lora_name="p@v1")
    with pytest.raises(ControlRefused, match="takes one lora_name"):
        worker.skyrl_discard_in_memory_lora("p@v1", lora_name="x")
    assert worker.skyrl_discard_in_memory_lora("p") is False  # SkyRL's unload: its plain name, nothing staged
    with pytest.raises(ControlRefused, match="receiver brings the adapter"):
        worker.skyrl_set_lora_receive_target({"kind": "lora", "lora_name": "p"})
    with pytest.raises(ControlRefused, match="base weights are not fetched"):
        worker.fetch_weights(1, "/tmp/theirs")
    assert receiver_state(worker).staged == {"p@v1": 1}


def test_a_group_join_is_signed_typed_and_accepted_once(monkeypatch: pytest.MonkeyPatch):
    joins: list[tuple[Any, ...]] = []
    monkeypatch.setattr(sync_group, "join", lambda *a: joins.append(a) or "group")
    worker = Worker()
    method = "skyrl_glm_join_group"
    for args, reason in (
        (("127.0.0.1", "29500", 1, 2, "gloo"), "port in 1..65535"),
        (("127.0.0.1", 29500, 1, 2, "mpi"), "backend nccl or gloo"),
        (("127.0.0.1", 29500, 0, 2, "gloo"), "rank offset in 1..world - 1"),
        (("127.0.0.1", 29500, 1, 10**30, "gloo"), "world size in 2.."),
        (("127.0.0.1", 29500, 2, 2, "gloo"), "rank offset in 1..world - 1"),
    ):
        with pytest.raises(ControlRefused, match=reason):
            getattr(worker, method)(*signed(method, args))
    assert joins == [] and not receiver_state(worker).joined
    call = signed(method, ("127.0.0.1", 29500, 1, 2, "gloo"))
    assert getattr(worker, method)(*call) == 1
    assert joins == [("127.0.0.1", 29500, 1, 2, "gloo")] and receiver_state(worker).group == "group"
    for again in (call, signed(method, ("127.0.0.1", 29501, 1, 2, "gloo"))):  # replayed, or a second group
        with pytest.raises(ControlRefused, match="already joined"):
            getattr(worker, method)(*again)
    assert len(joins) == 1 and receiver_state(worker).group == "group"
    assert sync_group.TIMEOUT.total_seconds() <= 60  # a join that cannot complete blocks the engine this long at most


def test_skyrls_mixed_format_engine_receives_per_expert_names():
    """SkyRL 0.4.0 starts every LoRA engine with ``enable_mixed_moe_lora_format`` and loads without
    ``is_3d_lora_weight``: a receiver that built the 3D stack there stopped every first sync on one H200 (vLLM's
    ``fused_moe.py`` asserts a list per expert). skyrl-glm's own loader sends the flag, so its engines keep 3D."""
    from skyrl_glm.sync.expert_layout import PER_EXPERT, STACKED_3D
    from skyrl_glm.sync.vllm.worker import LoraSyncWorkerExtension

    mixed = SimpleNamespace(lora_config=SimpleNamespace(enable_mixed_moe_lora_format=True))

    class OwnWorker(LoraSyncWorkerExtension):
        vllm_config = mixed

    skyrl_worker = Worker()
    skyrl_worker.vllm_config = mixed
    assert receiver_state(skyrl_worker).receiver.layout == PER_EXPERT
    assert receiver_state(OwnWorker()).receiver.layout == STACKED_3D


def test_a_worker_says_which_node_it_runs_on_when_the_run_asks() -> None:
    assert Worker().skyrl_glm_node(*signed("skyrl_glm_node", ())) == sync_group.node_address()
