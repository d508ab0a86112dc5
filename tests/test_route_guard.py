"""The route guard by allow-list, on the real vLLM app built in process (no engine behind it).

Every route the app exposes, SageMaker's ``/adapters`` routes included, is either on the open list or refused
unsigned before the app or its body is touched; a route added later is refused by default; a forged signature
costs the server no body read; ``/v1/models`` answers with what is served.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

from skyrl_glm.sync.vllm import control, route_guard

pytestmark = pytest.mark.vllm


def build_vllm_app() -> Any:
    """vLLM's OpenAI server app as SkyRL's servers configure it (dev mode, runtime LoRA updating), routes only."""
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"
    os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "true"
    from vllm.entrypoints.openai import api_server

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # vLLM 0.30
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # an older layout
        from vllm.utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "tiny", "--enable-lora"])
    try:
        return api_server.build_app(args, ("generate",))
    except TypeError:  # a build_app that takes the arguments alone
        return api_server.build_app(args)


class Recorder:
    """The app behind the guard: records what reached it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.seen.append((scope["method"], scope["path"]))
        body = json.dumps({"object": "list", "data": [CARD]}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1")]})
        await send({"type": "http.response.body", "body": body})


CARD = {"id": "skyrl-lora", "object": "model", "root": "skyrl-memory://skyrl-lora@v7", "parent": "tiny"}


def call(
    guard: Any, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, bytes, int]:
    """(status, response body, how many times the guard read the request body) of one request through ``guard``."""
    reads, sent = [0], []
    all_headers = {"content-length": str(len(body)), **(headers or {})}

    async def receive() -> dict[str, Any]:
        reads[0] += 1
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.encode(), v.encode()) for k, v in all_headers.items()],
    }
    asyncio.run(guard(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]), reads[0]


@pytest.fixture(scope="module")
def app() -> Any:
    control.sender_key()  # this process is the run: its key file is named in the environment
    return build_vllm_app()


def requests_of(app: Any) -> list[tuple[str, str]]:
    """(method, path) of every route the app exposes, path parameters filled in."""
    out = []
    for route in app.routes:
        path = route.path.replace("{", "").replace("}", "")
        out += [(m, path) for m in sorted(getattr(route, "methods", None) or {"GET"})]
    return out


def test_every_route_of_vllms_app_is_open_or_refused_unsigned(app):
    route_guard.install()
    guard = app.build_middleware_stack()
    assert isinstance(guard, route_guard.RouteGuard)
    guard.app = inner = Recorder()
    requests = requests_of(app)
    assert {("POST", "/adapters"), ("DELETE", "/adapters/adapter_name"), ("POST", "/collective_rpc")} <= set(requests)
    refused = []
    for method, path in requests:
        status, answer, reads = call(guard, method, path, b'{"name": "evil", "src": "/"}')
        if (method, path) in route_guard.OPEN_ROUTES:
            assert status == 200 and inner.seen[-1] == (method, path), (method, path, status)
            continue
        assert status == 401 and b"not signed with the run's control key" in answer, (method, path, status, answer)
        assert reads == 0, f"{method} {path}: the body was read before the header was checked"
        refused.append((method, path))
    assert not [r for r in inner.seen if r in refused], inner.seen
    assert len(refused) >= 30, refused  # the dev, RL, LoRA, SageMaker, scaling routes


@pytest.mark.gpu
def test_every_route_of_vllm_030s_app_is_open_or_refused_unsigned(app):
    """The same enumeration on the vLLM users install with SkyRL 0.4.0 (its GPU build)."""
    import vllm

    assert vllm.__version__.startswith("0.30."), vllm.__version__
    test_every_route_of_vllms_app_is_open_or_refused_unsigned(app)


def test_a_route_added_later_is_guarded_by_default(app):
    @app.post("/v1/some_future_control")
    async def future() -> dict[str, str]:
        return {"done": "yes"}

    guard = route_guard.RouteGuard(app)
    status, answer, _ = call(guard, "POST", "/v1/some_future_control")
    assert status == 401, answer
    status, answer, _ = call(
        guard, "POST", "/v1/some_future_control", headers=_signed("POST", "/v1/some_future_control")
    )
    assert status == 200 and json.loads(answer) == {"done": "yes"}, answer
    status, _, _ = call(guard, "POST", "/v1/models")  # an open path under another method is not open
    assert status == 401


def _signed(method: str, path: str, body: bytes = b"", key: bytes | None = None) -> dict[str, str]:
    if key is None:
        return route_guard.signed_headers(method, path, body)
    return {route_guard.HEADER: route_guard.signature(key, method, path.encode(), b"", body)}


def test_the_header_is_checked_before_any_body_is_read():
    control.sender_key()
    guard = route_guard.RouteGuard(inner := Recorder())
    body = b"x" * 4096
    wrong = _signed("POST", "/collective_rpc", body, key=b"\x01" * control.KEY_BYTES)
    for headers in ({}, wrong, {route_guard.HEADER: "1 2 3 4"}):
        status, _, reads = call(guard, "POST", "/collective_rpc", body, headers)
        assert (status, reads) == (401, 0), headers
    good = _signed("POST", "/collective_rpc", body)
    status, answer, reads = call(guard, "POST", "/collective_rpc", body + b"!", good)  # its signature, another body
    assert status == 401 and b"not the one signed" in answer and reads == 1
    status, _, reads = call(guard, "POST", "/collective_rpc", body, _signed("POST", "/collective_rpc", body))
    assert status == 200 and reads == 1 and inner.seen == [("POST", "/collective_rpc")]
    oversized = {**_signed("POST", "/collective_rpc", body), "content-length": str(route_guard.MAX_BODY_BYTES + 1)}
    status, _, reads = call(guard, "POST", "/collective_rpc", body, oversized)
    assert (status, reads) == (413, 0)


def test_a_refused_request_is_logged_on_vllms_logger(app):
    import logging

    # (``app``: building it imported model_hosting_container_standards, which raised the root logger's level)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("vllm").addHandler(handler)
    try:
        call(route_guard.RouteGuard(Recorder()), "DELETE", "/adapters/skyrl-lora")
    finally:
        logging.getLogger("vllm").removeHandler(handler)
    assert [r.getMessage() for r in records] == [
        "skyrl-glm refused DELETE /adapters/skyrl-lora: not signed with the run's control key"
    ]


def test_the_model_list_shows_what_is_served_not_the_staged_version():
    status, answer, _ = call(route_guard.RouteGuard(Recorder()), "GET", "/v1/models")
    assert status == 200
    assert json.loads(answer)["data"] == [{**CARD, "root": "skyrl-lora"}]
    assert route_guard.served_only(b"not json") == b"not json"
