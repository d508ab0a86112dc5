"""Nobody but the trainer can change what the sampler serves: the control calls over a real vLLM CPU server's HTTP.

One vLLM OpenAI server (the CPU build, loopback only) with the worker extension SkyRL's servers load in skyrl-glm
runs and vLLM's dev-mode routes (``/collective_rpc`` among them), as SkyRL's servers run. The trainer publishes
through skyrl-glm's ``SkyRLServers`` and SkyRL's ``RemoteInferenceClient`` (signing its requests); an attacker
without the run's key posts every control call the earlier reviews used, every method of the extension class by
name, vLLM's own worker methods and the other control routes. Each is refused, the served output is unchanged, and
the next trainer sync is accepted and served.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch

from skyrl_glm.skyrl.workers import signed_client
from skyrl_glm.skyrl.workers.vllm_extension import WORKER_EXTENSION, SkyRLGlmWorkerExtension
from skyrl_glm.sync.vllm import control, route_guard

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

LORA = "skyrl-lora"
PROMPT = [11, 23, 5, 87, 140, 9, 33, 61]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(
    url: str,
    body: dict[str, Any] | None,
    timeout: float = 120,
    headers: dict[str, str] | None = None,
    method: str = "POST",
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json", **(headers or {})}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    try:
        return resp.status, json.loads(text) if text else None
    except ValueError:
        return resp.status, text


SERVER_LOG: list[Path] = []  # the server's log file (stdout and stderr)


@pytest.fixture(scope="module")
def server(glm45_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The server, started by this process (so it holds this run's control key, as SkyRL's servers do)."""
    from skyrl_glm.models.vllm_targets import vllm_engine_kwargs
    from skyrl_glm.plugins import registry

    family = registry().model("glm-4.5")
    targets = family.lora.resolve(sampler="vllm-cpu")  # the engine settings of the glm45_sampler fixture
    engine = vllm_engine_kwargs(family, glm45_dir, lora_targets=targets, device="cpu")
    control.sender_key()  # makes the key file and names it in the environment the server inherits
    port = _free_port()
    log = (tmp_path_factory.mktemp("server") / "vllm.log").open("w")
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",  # what SkyRL's servers set: /collective_rpc is on
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(glm45_dir)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--enable-lora", "--max-lora-rank", "8"]
    cmd += ["--max-loras", "2", "--max-cpu-loras", "3", "--enforce-eager", "--max-model-len", "256"]
    cmd += ["--gpu-memory-utilization", "0.2", "--worker-extension-cls", WORKER_EXTENSION]
    cmd += ["--dtype", engine["dtype"], "--lora-target-modules", *engine["lora_target_modules"]]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    SERVER_LOG.append(Path(log.name))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                break
        except OSError:
            time.sleep(1)
    else:
        proc.kill()
        pytest.fail(f"vLLM server did not start: {Path(log.name).read_text()[-3000:]}")
    yield url
    proc.terminate()
    proc.wait(60)
    log.close()


def _client(url: str) -> Any:
    """SkyRL's client for the control fan-out; the adapter swap goes to vLLM's own /v1/load_lora_adapter (SkyRL's
    /skyrl/v1/load_lora_adapter is added by SkyRL's server actor, which needs a Ray cluster)."""
    from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import RemoteInferenceClient

    class Client(RemoteInferenceClient):
        async def load_lora_adapter(self, lora_name: str, lora_path: str | None = None, **_: Any) -> dict[str, Any]:
            body = {"lora_name": lora_name, "lora_path": lora_path, "load_inplace": True}
            status, answer = await asyncio.to_thread(_signed_post, url, "/v1/load_lora_adapter", body)
            assert status == 200, answer
            return {}

    signed_client.install()  # as the trainer's processes do
    return Client(proxy_url=url, server_urls=[url], data_parallel_size=1)


def _signed_post(url: str, path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
    data = b"" if body is None else json.dumps(body).encode()
    return _post(f"{url}{path}", body, headers=route_guard.signed_headers("POST", path, data))


def _served(url: str) -> tuple[list[int], list[float]]:
    """Greedy tokens and their logprobs from the served adapter."""
    body = {"model": LORA, "prompt": PROMPT, "max_tokens": 6, "temperature": 0.0, "logprobs": 1}
    status, answer = _post(f"{url}/v1/completions", body)
    assert status == 200, answer
    lp = answer["choices"][0]["logprobs"]
    return lp["tokens"], lp["token_logprobs"]


def _trainer_rpc(url: str, method: str, args: list[Any]) -> tuple[int, Any]:
    """A ``/collective_rpc`` call as the trainer makes it: the request and the call signed."""
    return _signed_post(url, "/collective_rpc", {"method": method, "args": args, "kwargs": {}})


def _publish(url: str, trainer: Any, version: int, seed: int) -> Any:
    from skyrl_glm.skyrl.workers.publish import SkyRLServers
    from skyrl_glm.skyrl.workers.routes import Route
    from skyrl_glm.sync.publisher import InMemoryPublisher
    from skyrl_glm.sync.transports.fanout import FanOut
    from skyrl_glm.sync.transports.shm import SharedMemoryTransport

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    client = _client(url)
    servers = SkyRLServers([(Route(url, "this host", "cpu", "this process"), client)], LORA)
    publisher = InMemoryPublisher(servers, FanOut([SharedMemoryTransport()]), LORA, bucket_bytes=1 << 20)

    async def publish() -> Any:
        try:
            return await publisher.publish_async(trainer.adapter(), trainer.lora_config, version)
        finally:
            await client.aclose()

    return asyncio.run(publish())


def _attacks(staged: str) -> list[tuple[str, str, list[Any], dict[str, Any]]]:
    """(what, method, args, kwargs) of every call an attacker without the key can make."""
    fake_mac = "0" * control.MAC_CHARS
    captured = list(control.signed("skyrl_glm_commit", (1, [staged])))  # a call of the trainer's, seen on the wire
    altered = [captured[0], 2**63 - 1, [staged]]  # its MAC, other arguments
    return [
        ("commit the largest version", "skyrl_glm_commit", [2**63 - 1, []], {}),
        ("commit a string version", "skyrl_glm_commit", ["x", []], {}),
        ("commit version 0", "skyrl_glm_commit", [0, []], {}),
        ("list the staged adapters", "skyrl_glm_staged", [], {}),
        ("ask where the workers run", "skyrl_glm_node", [], {}),
        ("discard the serving adapter", "skyrl_glm_discard", [staged], {}),
        ("receive an update of their own", "skyrl_glm_receive", ["{}", {"shm_name": "x"}, "cpu"], {}),
        ("a made-up MAC", "skyrl_glm_commit", [fake_mac, 2**63 - 1, []], {}),
        ("a seen MAC on other arguments", "skyrl_glm_commit", altered, {}),
        ("a seen call replayed", "skyrl_glm_commit", captured, {}),
        ("no arguments at all", "skyrl_glm_discard", [], {}),
        ("keyword arguments", "skyrl_glm_commit", captured[:1], {"version": 2**63 - 1, "keep": []}),
    ]


def test_calls_past_the_route_without_their_own_mac_change_nothing_and_the_next_sync_lands(server, glm45_trainer):
    """Defence in depth: with the request signed (a process of the run, or a leaked request signature) the worker
    still refuses every call that is not the trainer's."""
    first = _publish(server, glm45_trainer, 1, seed=1)
    assert first.ok, first.reason
    before = _served(server)
    staged = f"{LORA}@v1"
    for what, method, args, kwargs in _attacks(staged):
        body = {"method": method, "args": args, "kwargs": kwargs}
        status, answer = _signed_post(server, "/collective_rpc", body)
        text = json.dumps(answer)
        refused = status >= 400 or "control call refused" in text
        assert refused, f"{what}: {status} {text[:300]}"
        assert method != "skyrl_glm_staged" or staged not in text, f"{what}: the attacker learnt {text[:300]}"
        assert _served(server) == before, f"{what} changed what is served"
    _assert_staged_then_next_sync_lands(server, glm45_trainer, staged, before)


def _assert_staged_then_next_sync_lands(server: str, trainer: Any, staged: str, before: Any) -> None:
    """The worker's own listing (signed) shows nothing dropped or added, and the trainer's next sync is served."""
    status, answer = _trainer_rpc(server, "skyrl_glm_staged", list(control.signed("skyrl_glm_staged", ())))
    assert status == 200 and answer["results"] == [[staged]], answer
    version = int(staged.rsplit("@v", 1)[1]) + 1
    second = _publish(server, trainer, version, seed=version)
    assert second.ok, second.reason
    assert _served(server) != before, "the trainer's next sync was not served"
    status, answer = _trainer_rpc(server, "skyrl_glm_staged", list(control.signed("skyrl_glm_staged", ())))
    assert answer["results"] == [[f"{LORA}@v{version}"]], answer


def _callable_names() -> list[str]:
    """Every name ``/collective_rpc`` can call on the extension class (its own, SkyRL's and Python's)."""
    return sorted(n for n in dir(SkyRLGlmWorkerExtension) if callable(getattr(SkyRLGlmWorkerExtension, n, None)))


def _route_attacks(staged: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(what, path, body) of the control requests without the run's signature: the four the last review found,
    vLLM's own worker methods, and the other control routes."""
    rpc = "/collective_rpc"
    return [
        ("a private helper's unserialisable result", rpc, {"method": "_skyrl_glm_state"}),
        ("Python's attribute lookup", rpc, {"method": "__getattribute__", "args": ["_skyrl_glm_state"]}),
        (
            "join a group at a dead port",
            rpc,
            {"method": "skyrl_glm_join_group", "args": ["127.0.0.1", 9, 1, 2, "gloo"]},
        ),
        ("what is staged and served", rpc, {"method": "skyrl_glm_staged"}),
        ("SkyRL's discard of the serving adapter", rpc, {"method": "skyrl_discard_in_memory_lora", "args": [staged]}),
        ("vLLM's remove_lora", rpc, {"method": "remove_lora", "args": [1]}),
        ("vLLM's pin_lora", rpc, {"method": "pin_lora", "args": [1]}),
        ("sleep the engine", "/sleep", None),
        ("wake the engine", "/wake_up", None),
        ("reset the prefix cache", "/reset_prefix_cache", None),
        ("load an adapter of theirs", "/v1/load_lora_adapter", {"lora_name": LORA, "lora_path": "/tmp/theirs"}),
        ("unload the serving adapter", "/v1/unload_lora_adapter", {"lora_name": LORA}),
    ]


def test_every_control_route_and_method_needs_the_run_signature(server, glm45_trainer):
    """The route is the door: an unsigned or wrongly signed request reaches neither the route nor the worker."""
    published = _publish(server, glm45_trainer, 11, seed=11)
    assert published.ok, published.reason
    before = _served(server)
    staged = f"{LORA}@v11"
    wrong = control.KEY_BYTES * b"\x01"
    requests = [(f"rpc {name}", "/collective_rpc", {"method": name, "args": []}) for name in _callable_names()]
    assert {"skyrl_glm_receive", "skyrl_glm_join_group", "skyrl_discard_in_memory_lora"} <= {
        r[2]["method"] for r in requests
    }
    requests += _route_attacks(staged)
    for what, path, body in requests:
        data = b"" if body is None else json.dumps(body).encode()
        headers = {route_guard.HEADER: route_guard.signature(wrong, "POST", path.encode(), b"", data)}
        for how, sent in (("unsigned", {}), ("wrong key", headers)):
            status, answer = _post(f"{server}{path}", body, headers=sent)
            assert status == 401 and "skyrl-glm" in json.dumps(answer), f"{what} ({how}): {status} {answer!r:.300}"
        assert _served(server) == before, f"{what} changed what is served"
    _assert_staged_then_next_sync_lands(server, glm45_trainer, staged, before)


def test_a_signed_request_is_accepted_once_and_only_as_signed(server):
    path, body = "/collective_rpc", {"method": "skyrl_glm_staged", "args": list(control.signed("skyrl_glm_staged", ()))}
    data = json.dumps(body).encode()
    headers = route_guard.signed_headers("POST", path, data)
    status, answer = _post(f"{server}{path}", body, headers=headers)
    assert status == 200 and isinstance(answer["results"][0], list), answer
    status, answer = _post(f"{server}{path}", body, headers=headers)  # seen on the wire, sent again
    assert status == 401 and "replayed" in json.dumps(answer), answer
    other = {**body, "method": "skyrl_glm_discard"}  # its signature on another body
    status, answer = _post(f"{server}{path}", other, headers=route_guard.signed_headers("POST", path, data))
    assert status == 401, answer
    stamp, nonce, body_sha, _ = headers[route_guard.HEADER].split(" ")
    old = str(int(stamp) - 2 * route_guard.WINDOW_S)
    key = control.current_key()
    mac = route_guard._mac(key, old, nonce[::-1], "POST", path.encode(), b"", body_sha)
    stale = {route_guard.HEADER: f"{old} {nonce[::-1]} {body_sha} {mac}"}
    status, answer = _post(f"{server}{path}", body, headers=stale)
    assert status == 401 and "more than" in json.dumps(answer), answer


def test_a_call_signed_with_another_key_is_refused(server, monkeypatch):
    """A key of another run (say, a second training on the same host) does not drive this run's workers."""
    monkeypatch.setattr(control, "_KEY", b"\x01" * control.KEY_BYTES)
    status, answer = _trainer_rpc(server, "skyrl_glm_staged", list(control.signed("skyrl_glm_staged", ())))
    assert status == 401 and "not signed with the run's control key" in json.dumps(answer), (status, answer)
    monkeypatch.undo()
    # past the route (the run's request signature) but the call itself signed with another key: the worker refuses
    call = ["f" * control.MAC_CHARS]
    status, answer = _trainer_rpc(server, "skyrl_glm_staged", call)
    assert status >= 400 and "not signed with the run's control key" in json.dumps(answer), (status, answer)
    status, answer = _trainer_rpc(server, "skyrl_glm_staged", ["\u00e9" * control.MAC_CHARS])  # not ASCII
    assert status >= 400 and "not signed with the run's control key" in json.dumps(answer), (status, answer)


def test_sagemaker_adapter_routes_unsigned_are_refused_logged_and_the_adapter_keeps_serving(
    server, glm45_trainer, tmp_path
):
    """vLLM's SageMaker routes wrap its LoRA load and unload handlers under other paths: unsigned, each is refused
    and logged in the server's log, what is served is unchanged, and the model list names no staged version."""
    published = _publish(server, glm45_trainer, 21, seed=21)
    assert published.ok, published.reason
    before = _served(server)
    staged = f"{LORA}@v21"
    attacks = [
        ("DELETE", f"/adapters/{LORA}", None),
        ("POST", "/adapters", {"name": LORA, "src": f"skyrl-memory://{LORA}@v1"}),
        ("POST", "/adapters", {"name": "evil", "src": str(tmp_path)}),
    ]
    for method, path, body in attacks:
        status, answer = _post(f"{server}{path}", body, method=method)
        assert status == 401 and "skyrl-glm" in json.dumps(answer), (method, path, status, answer)
        assert _served(server) == before, f"{method} {path} changed what is served"
    with urllib.request.urlopen(f"{server}/v1/models", timeout=30) as resp:
        listing = resp.read().decode()
    assert LORA in listing and "skyrl-memory" not in listing and "@v" not in listing, listing
    logged = SERVER_LOG[0].read_text()
    for method, path, _ in attacks:
        assert f"skyrl-glm refused {method} {path}: not signed" in logged, f"{method} {path} not in the server log"
    _assert_staged_then_next_sync_lands(server, glm45_trainer, staged, before)
