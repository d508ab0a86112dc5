"""The run key on the vLLM servers' control routes: only a request signed by the run reaches them.

vLLM's dev-mode routes (``/collective_rpc`` names any attribute of any worker; ``/sleep``, ``/pause``, weight
transfer, cache resets), its runtime LoRA routes and SkyRL's own control routes (``/skyrl/v1/load_lora_adapter``,
``/fetch_weights``) sit outside vLLM's API key, and SkyRL's servers listen on every interface. skyrl-glm's vLLM plugin
(loaded into every vLLM process, the API server's included, before its first request) wraps each FastAPI app it
serves in :class:`RouteGuard` when the process's environment names a run key: a request to a control route must
carry ``X-SkyRL-GLM-Signature: <unix seconds> <nonce> <HMAC-SHA256(key, seconds, nonce, method, raw path, raw
query, body)>``, made at most :data:`WINDOW_S` ago, with a nonce not seen before; anything else is answered 401 before
the route (or the engine behind it) sees a byte. The data plane (generation, tokenisation, health, metrics) is
untouched. SkyRL's own client signs its calls (:mod:`skyrl_glm.skyrl.signed_client`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from skyrl_glm.sync.vllm import control

log = logging.getLogger(__name__)

HEADER = "x-skyrl-glm-signature"
WINDOW_S = 120  # how old (or, clocks differing between nodes, how far ahead) a signed request may be
MAX_BODY_BYTES = 64 << 20  # a control request's body (the largest: a manifest, capped at 32 MiB of JSON)
MAX_NONCES = 1 << 20  # nonces remembered within the window (only signed requests add one)
_FORMAT = b"skyrl-glm/route/1"
# The modules whose routes steer the engine (by the module that defines the endpoint, so a route a vLLM release
# moves or renames stays covered): vLLM's dev-mode, RL, LoRA, scaling, profiling and fault-tolerance routes, and
# the routes SkyRL's server actor adds.
CONTROL_MODULES = (
    "vllm.entrypoints.serve.dev",
    "vllm.entrypoints.rl",
    "vllm.entrypoints.serve.lora",
    "vllm.entrypoints.serve.elastic_ep",
    "vllm.entrypoints.serve.profile",
    "vllm.entrypoints.serve.fault_tolerance",
    "skyrl.backends.skyrl_train.inference_servers.vllm_server_actor",
)
# Data-plane routes defined in those modules (SkyRL's token-in/token-out generation).
DATA_ROUTES = frozenset({"/skyrl/v1/generate"})


def _mac(key: bytes, stamp: str, nonce: str, method: str, path: bytes, query: bytes, body: bytes) -> str:
    digest = hmac.new(key, digestmod=hashlib.sha256)
    for part in (_FORMAT, stamp.encode(), nonce.encode(), method.encode(), path, query):
        digest.update(part + b"\n")
    digest.update(body)
    return digest.hexdigest()


def signature(key: bytes, method: str, path: bytes, query: bytes, body: bytes) -> str:
    """The header value that signs one request (``path`` and ``query`` as sent: percent-encoded, no ``?``)."""
    stamp, nonce = str(int(time.time())), secrets.token_hex(16)
    return f"{stamp} {nonce} {_mac(key, stamp, nonce, method.upper(), path, query, body)}"


def signed_headers(method: str, path_qs: str, body: bytes = b"") -> dict[str, str]:
    """``{header: value}`` for a request to ``path_qs`` (``/path?query``), signed with this process's key."""
    key = control.current_key()
    if key is None:
        raise control.ControlRefused(f"no control key: {control.KEY_ENV} is not set")
    path, _, query = path_qs.partition("?")
    return {HEADER: signature(key, method, path.encode(), query.encode(), body)}


def control_paths(app: Any) -> list[Any]:
    """The app's control routes (see :data:`CONTROL_MODULES`)."""
    found = []
    for route in getattr(app, "routes", []):
        module = getattr(getattr(route, "endpoint", None), "__module__", "") or ""
        if module.startswith(CONTROL_MODULES) and getattr(route, "path", None) not in DATA_ROUTES:
            found.append(route)
    return found


class RouteGuard:
    """ASGI middleware: a request that any control route matches must be signed (module docstring)."""

    def __init__(self, app: Callable, routes: list[Any], key: Callable[[], bytes | None] = control.current_key):
        self.app, self.routes, self._key = app, routes, key
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def guards(self, scope: dict[str, Any]) -> bool:
        from starlette.routing import Match

        if scope["type"] not in ("http", "websocket"):
            return False
        probe = {**scope, "type": "http", "method": scope.get("method", "GET")}
        return any(route.matches(probe)[0] is not Match.NONE for route in self.routes)

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if not self.guards(scope):
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more and scope["type"] == "http":
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_BODY_BYTES:
                await _refuse(scope, send, 413, f"a control request's body exceeds {MAX_BODY_BYTES} bytes")
                return
        problem = self.problem(scope, body)
        if problem is not None:
            log.warning("refused %s %s: %s", scope.get("method"), scope.get("path"), problem)
            await _refuse(scope, send, 401, problem)
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def problem(self, scope: dict[str, Any], body: bytes) -> str | None:
        """Why the request is not the run's (None when it is); a request accepted once is never accepted again."""
        try:
            key = self._key()
        except control.ControlRefused as e:
            return f"this server cannot check signatures: {e}"
        if key is None:
            return f"this server holds no control key ({control.KEY_ENV})"
        values = [v for k, v in scope.get("headers", []) if k.lower() == HEADER.encode()]
        if len(values) != 1:
            return "not signed with the run's control key"
        parts = values[0].split(b" ")
        if len(parts) != 3 or not all(p.isascii() for p in parts) or not parts[0].isdigit() or len(parts[0]) > 12:
            return "not signed with the run's control key"
        stamp, nonce, mac = (p.decode() for p in parts)
        if len(nonce) != 32 or not control.is_mac(mac):
            return "not signed with the run's control key"
        now = time.time()
        if abs(now - int(stamp)) > WINDOW_S:
            return f"signature made {int(now) - int(stamp)} s from now (more than {WINDOW_S} s)"
        method = scope.get("method", "GET") if scope["type"] == "http" else "WEBSOCKET"
        path = scope.get("raw_path") or scope["path"].encode()
        want = _mac(key, stamp, nonce, method, path, scope.get("query_string", b""), body)
        if not hmac.compare_digest(want, mac):
            return "not signed with the run's control key"
        with self._lock:
            for old in [n for n, t in self._seen.items() if now - t > 2 * WINDOW_S]:
                del self._seen[old]
            if nonce in self._seen:
                return "a signed request seen before (replayed)"
            if len(self._seen) >= MAX_NONCES:
                return "too many signed requests within the window"
            self._seen[nonce] = now
        return None


async def _refuse(scope: dict[str, Any], send: Callable, status: int, reason: str) -> None:
    if scope["type"] != "http":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps({"error": f"skyrl-glm: {reason}"}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install() -> None:
    """Wrap every FastAPI app this process serves in :class:`RouteGuard`, built when the app serves its first
    request (after every route, SkyRL's included, was added); only when the environment names a run key."""
    import os

    from fastapi import FastAPI

    original = FastAPI.build_middleware_stack
    if getattr(original, "skyrl_glm_guard", False):
        return

    def build_middleware_stack(self: FastAPI) -> Any:
        stack = original(self)
        routes = control_paths(self)
        if not routes or not os.environ.get(control.KEY_ENV):
            return stack
        log.info("skyrl-glm: %d control routes need the run's signature", len(routes))
        return RouteGuard(stack, routes)

    build_middleware_stack.skyrl_glm_guard = True  # type: ignore[attr-defined]
    FastAPI.build_middleware_stack = build_middleware_stack  # type: ignore[method-assign]
