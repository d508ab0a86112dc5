"""The run key on the vLLM servers' HTTP routes: a route not on the allow-list answers only a request signed by the run.

vLLM's dev-mode routes (``/collective_rpc`` names any attribute of any worker; ``/sleep``, ``/pause``, weight
transfer, cache resets), its runtime LoRA routes (``/v1/load_lora_adapter`` and the SageMaker ``/adapters`` routes
that wrap the same handlers), SkyRL's own control routes and whatever a later vLLM release adds sit outside vLLM's
API key, and SkyRL's servers listen on every interface. skyrl-glm's vLLM plugin (loaded into every vLLM process, the
API server's included, before its first request) wraps each FastAPI app the process serves in :class:`RouteGuard`
when the environment names a run key. Only the data plane users and SkyRL's client need is open
(:data:`OPEN_ROUTES`: generation, tokenisation, health, metrics, the model list); every other method and path, known
or not, must carry ``X-SkyRL-GLM-Signature: <unix seconds> <nonce> <SHA-256 of the body>
<HMAC-SHA256(key, seconds, nonce, method, raw path, raw query, body hash)>``, made at most :data:`WINDOW_S` ago, with a
nonce not seen before. The header alone is checked before any byte of the body is read (the MAC covers the body's
hash, which the body must then match); anything else is answered 401, and logged on one line in vLLM's log, before
the route (or the engine behind it) sees a byte. ``/v1/models`` lists what is served, not the staged names behind it.
SkyRL's own client signs every request it sends (:mod:`skyrl_glm.skyrl.workers.signed_client`).
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

from skyrl.backends.skyrl_train.weight_sync.lora_target import IN_MEMORY_LORA_PATH_PREFIX

from skyrl_glm.sync.vllm import control

# A child of vLLM's logger, so the server's own handler writes it to the server's log, at its own level: importing
# model_hosting_container_standards raises the root logger's level to ERROR, which an unset level would inherit.
log = logging.getLogger("vllm.skyrl_glm.route_guard")
log.setLevel(logging.INFO)

HEADER = "x-skyrl-glm-signature"
WINDOW_S = 120  # how old (or, clocks differing between nodes, how far ahead) a signed request may be
MAX_BODY_BYTES = 64 << 20  # a signed request's body (the largest: a manifest, capped at 32 MiB of JSON)
MAX_NONCES = 1 << 20  # nonces remembered within the window (only signed requests add one)
_FORMAT = b"skyrl-glm/route/2"
_NOT_SIGNED = "not signed with the run's control key"
MODELS = "/v1/models"
# The routes open without the run's signature, by method and exact path: what SkyRL's client and users need to
# generate, tokenise and watch the server (SkyRL's client signs every request anyway). Anything else is guarded,
# so a route a vLLM release adds is guarded until it is listed here.
OPEN_ROUTES = frozenset(
    {
        *((m, p) for m in ("GET", "HEAD") for p in ("/health", "/ping", "/metrics", "/version", "/load", MODELS)),
        ("POST", "/ping"),
        *(
            ("POST", p)
            for p in (
                "/v1/completions",
                "/v1/chat/completions",
                "/v1/completions/render",
                "/v1/chat/completions/render",
                "/v1/responses",
                "/v1/messages",
                "/v1/messages/count_tokens",
                "/tokenize",
                "/detokenize",
                "/inference/v1/generate",
                "/skyrl/v1/generate",
            )
        ),
    }
)


def _mac(key: bytes, stamp: str, nonce: str, method: str, path: bytes, query: bytes, body_sha: str) -> str:
    digest = hmac.new(key, digestmod=hashlib.sha256)
    for part in (_FORMAT, stamp.encode(), nonce.encode(), method.encode(), path, query, body_sha.encode()):
        digest.update(part + b"\n")
    return digest.hexdigest()


def signature(key: bytes, method: str, path: bytes, query: bytes, body: bytes) -> str:
    """The header value that signs one request (``path`` and ``query`` as sent: percent-encoded, no ``?``)."""
    stamp, nonce, body_sha = str(int(time.time())), secrets.token_hex(16), hashlib.sha256(body).hexdigest()
    return f"{stamp} {nonce} {body_sha} {_mac(key, stamp, nonce, method.upper(), path, query, body_sha)}"


def signed_headers(method: str, path_qs: str, body: bytes = b"") -> dict[str, str]:
    """``{header: value}`` for a request to ``path_qs`` (``/path?query``), signed with this process's key."""
    key = control.current_key()
    if key is None:
        raise control.ControlRefused(f"no control key: {control.KEY_ENV} is not set")
    path, _, query = path_qs.partition("?")
    return {HEADER: signature(key, method, path.encode(), query.encode(), body)}


def route_of(scope: dict[str, Any]) -> tuple[str, str]:
    """The request's method and the path the app routes it by (Starlette's own reading: the root path taken off)."""
    from starlette._utils import get_route_path

    return scope.get("method", "WEBSOCKET") if scope["type"] == "http" else "WEBSOCKET", get_route_path(scope)


def served_only(body: bytes) -> bytes:
    """A ``/v1/models`` answer with each in-memory adapter's staged name and version (its ``root``) replaced by the
    name it is served under."""
    try:
        listing = json.loads(body)
    except ValueError:
        return body
    cards = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(cards, list):
        return body
    for card in cards:
        root = card.get("root") if isinstance(card, dict) else None
        if isinstance(root, str) and root.startswith(IN_MEMORY_LORA_PATH_PREFIX):
            card["root"] = card.get("id")
    return json.dumps(listing).encode()


class RouteGuard:
    """ASGI middleware: a request not on :data:`OPEN_ROUTES` must be signed (module docstring)."""

    def __init__(self, app: Callable, key: Callable[[], bytes | None] = control.current_key):
        self.app, self._key = app, key
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        route = route_of(scope)
        if route in OPEN_ROUTES:
            await self.app(scope, receive, _rewriting(send, served_only) if route == ("GET", MODELS) else send)
            return
        problem, nonce, body_sha = self.header_problem(scope)
        body = b""
        if problem is None and scope["type"] == "http":
            body, problem = await _read_body(scope, receive)
            if problem is None and not hmac.compare_digest(hashlib.sha256(body).hexdigest(), body_sha):
                problem = "the body is not the one signed"
        if problem is None:
            problem = self.remember(nonce)
        if problem is not None:
            log.warning("skyrl-glm refused %s %s: %s", *route, problem)
            await _refuse(scope, send, 413 if "exceeds" in problem else 401, problem)
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay if scope["type"] == "http" else receive, send)

    def header_problem(self, scope: dict[str, Any]) -> tuple[str | None, str, str]:
        """Why the request's header does not sign it for the run (None when it does), its nonce and the body hash it
        signs: from the header alone, before any byte of the body is read."""
        try:
            key = self._key()
        except control.ControlRefused as e:
            return f"this server cannot check signatures: {e}", "", ""
        if key is None:
            return f"this server holds no control key ({control.KEY_ENV})", "", ""
        values = [v for k, v in scope.get("headers", []) if k.lower() == HEADER.encode()]
        if len(values) != 1:
            return _NOT_SIGNED, "", ""
        parts = values[0].split(b" ")
        if len(parts) != 4 or not all(p.isascii() for p in parts) or not parts[0].isdigit() or len(parts[0]) > 12:
            return _NOT_SIGNED, "", ""
        stamp, nonce, body_sha, mac = (p.decode() for p in parts)
        if len(nonce) != 32 or not control.is_mac(body_sha) or not control.is_mac(mac):
            return _NOT_SIGNED, "", ""
        now = time.time()
        if abs(now - int(stamp)) > WINDOW_S:
            return f"signature made {int(now) - int(stamp)} s from now (more than {WINDOW_S} s)", "", ""
        method = scope.get("method", "GET") if scope["type"] == "http" else "WEBSOCKET"
        path = scope.get("raw_path") or scope["path"].encode()
        want = _mac(key, stamp, nonce, method, path, scope.get("query_string", b""), body_sha)
        if not hmac.compare_digest(want, mac):
            return _NOT_SIGNED, "", ""
        return None, nonce, body_sha

    def remember(self, nonce: str) -> str | None:
        """Record the nonce of a request signed for the run; a request accepted once is never accepted again."""
        now = time.time()
        with self._lock:
            for old in [n for n, t in self._seen.items() if now - t > 2 * WINDOW_S]:
                del self._seen[old]
            if nonce in self._seen:
                return "a signed request seen before (replayed)"
            if len(self._seen) >= MAX_NONCES:
                return "too many signed requests within the window"
            self._seen[nonce] = now
        return None


async def _read_body(scope: dict[str, Any], receive: Callable) -> tuple[bytes, str | None]:
    """The request's body, or why it was not read whole (a declared or actual size over :data:`MAX_BODY_BYTES`)."""
    declared = [v for k, v in scope.get("headers", []) if k.lower() == b"content-length"]
    if declared and (not declared[0].isdigit() or int(declared[0]) > MAX_BODY_BYTES):
        return b"", f"a signed request's body exceeds {MAX_BODY_BYTES} bytes"
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return b"", "the client went away"
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return b"", f"a signed request's body exceeds {MAX_BODY_BYTES} bytes"
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks), None


def _rewriting(send: Callable, rewrite: Callable[[bytes], bytes]) -> Callable:
    """``send`` with the response body gathered and passed through ``rewrite`` (its length header set anew)."""
    start: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def rewritten(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
            return
        if message["type"] != "http.response.body":
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = rewrite(b"".join(chunks))
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return rewritten


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
    request; only when the environment names a run key."""
    import os

    from fastapi import FastAPI

    original = FastAPI.build_middleware_stack
    if getattr(original, "skyrl_glm_guard", False):
        return

    def build_middleware_stack(self: FastAPI) -> Any:
        stack = original(self)
        if not os.environ.get(control.KEY_ENV):
            return stack
        log.info("skyrl-glm: routes outside the %d open ones need the run's signature", len(OPEN_ROUTES))
        return RouteGuard(stack)

    build_middleware_stack.skyrl_glm_guard = True  # type: ignore[attr-defined]
    FastAPI.build_middleware_stack = build_middleware_stack  # type: ignore[method-assign]
