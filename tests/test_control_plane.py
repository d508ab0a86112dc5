"""Nobody but the trainer can change what the sampler serves: the control calls over a real vLLM CPU server's HTTP.

One vLLM OpenAI server (the CPU build, loopback only) with skyrl-glm's worker extension and vLLM's dev-mode
``/collective_rpc`` route, the route SkyRL's servers expose. The trainer publishes through skyrl-glm's
``ServerPublisher`` and SkyRL's ``RemoteInferenceClient``; an attacker without the run's key posts every
control call the earlier review used. Each is refused, the served output is unchanged, and the next trainer
sync is accepted and served.
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

from skyrl_glm.sync.vllm import control
from skyrl_glm.sync.vllm.engine import WORKER_EXTENSION

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

LORA = "skyrl-lora"
PROMPT = [11, 23, 5, 87, 140, 9, 33, 61]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict[str, Any], timeout: float = 120) -> tuple[int, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    try:
        return resp.status, json.loads(text) if text else None
    except ValueError:
        return resp.status, text


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
            status, answer = await asyncio.to_thread(_post, f"{url}/v1/load_lora_adapter", body)
            assert status == 200, answer
            return {}

    return Client(proxy_url=url, server_urls=[url], data_parallel_size=1)


def _served(url: str) -> tuple[list[int], list[float]]:
    """Greedy tokens and their logprobs from the served adapter."""
    body = {"model": LORA, "prompt": PROMPT, "max_tokens": 6, "temperature": 0.0, "logprobs": 1}
    status, answer = _post(f"{url}/v1/completions", body)
    assert status == 200, answer
    lp = answer["choices"][0]["logprobs"]
    return lp["tokens"], lp["token_logprobs"]


def _rpc(url: str, method: str, args: list[Any], kwargs: dict[str, Any] | None = None) -> tuple[int, Any]:
    return _post(f"{url}/collective_rpc", {"method": method, "args": args, "kwargs": kwargs or {}})


def _publish(url: str, trainer: Any, version: int, seed: int) -> Any:
    from skyrl_glm.skyrl.publish import SkyRLServers
    from skyrl_glm.sync.publisher import InMemoryPublisher
    from skyrl_glm.sync.transports.shm import SharedMemoryTransport

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    client = _client(url)
    publisher = InMemoryPublisher(SkyRLServers(client, LORA), SharedMemoryTransport(), LORA, bucket_bytes=1 << 20)

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
        ("discard the serving adapter", "skyrl_glm_discard", [staged], {}),
        ("receive an update of their own", "skyrl_glm_receive", ["{}", {"shm_name": "x"}, "cpu"], {}),
        ("a made-up MAC", "skyrl_glm_commit", [fake_mac, 2**63 - 1, []], {}),
        ("a seen MAC on other arguments", "skyrl_glm_commit", altered, {}),
        ("a seen call replayed", "skyrl_glm_commit", captured, {}),
        ("no arguments at all", "skyrl_glm_discard", [], {}),
        ("keyword arguments", "skyrl_glm_commit", captured[:1], {"version": 2**63 - 1, "keep": []}),
    ]


def test_unauthenticated_control_calls_change_nothing_and_the_next_sync_lands(server, glm45_trainer):
    first = _publish(server, glm45_trainer, 1, seed=1)
    assert first.ok, first.reason
    before = _served(server)
    staged = f"{LORA}@v1"
    for what, method, args, kwargs in _attacks(staged):
        status, answer = _rpc(server, method, args, kwargs)
        text = json.dumps(answer)
        refused = status >= 400 or "control call refused" in text
        assert refused, f"{what}: {status} {text[:300]}"
        assert method != "skyrl_glm_staged" or staged not in text, f"{what}: the attacker learnt {text[:300]}"
        assert _served(server) == before, f"{what} changed what is served"
    # the worker's own listing (signed): nothing dropped, nothing added
    status, answer = _rpc(server, "skyrl_glm_staged", list(control.signed("skyrl_glm_staged", ())))
    assert status == 200 and answer["results"] == [[staged]], answer
    second = _publish(server, glm45_trainer, 2, seed=2)
    assert second.ok, second.reason
    after = _served(server)
    assert after != before, "the trainer's next sync was not served"
    status, answer = _rpc(server, "skyrl_glm_staged", list(control.signed("skyrl_glm_staged", ())))
    assert answer["results"] == [[f"{LORA}@v2"]], answer


def test_a_call_signed_with_another_key_is_refused(server, monkeypatch):
    """A key of another run (say, a second training on the same host) does not drive this run's workers."""
    monkeypatch.setattr(control, "_KEY", b"\x01" * control.KEY_BYTES)
    status, answer = _rpc(server, "skyrl_glm_staged", list(control.signed("skyrl_glm_staged", ())))
    assert status >= 400 and "not signed with the run's control key" in json.dumps(answer), (status, answer)
