"""SkyRL's own HTTP clients sign their requests with the run key, so their control calls pass the servers' route
guard.

SkyRL's ``RemoteInferenceClient`` (and the generate client under it) sends every request through one aiohttp
session per event loop; its weight-sync control plane (``SkyrlWeightSyncClient``) through one ``requests`` session.
:func:`install` gives each aiohttp session a client middleware and each ``requests`` session an ``auth`` hook that
add the ``X-SkyRL-GLM-Signature`` header of :mod:`skyrl_glm.sync.vllm.route_guard` over the request as it is sent
(method, raw path and query, body bytes). Installed in every process of a skyrl-glm run that holds a client: the
trainer's driver (the experiment) and the policy workers (their sync). Without a run key in the environment nothing
is signed.
"""

from __future__ import annotations

from typing import Any

from skyrl_glm.sync.vllm import control, route_guard


async def sign(request: Any, handler: Any) -> Any:
    """aiohttp client middleware: the run's signature on ``request``."""
    key = control.current_key()
    if key is not None:
        body = request.body if isinstance(request.body, bytes) else await request.body.as_bytes()
        url = request.url
        value = route_guard.signature(key, request.method, url.raw_path.encode(), url.raw_query_string.encode(), body)
        request.headers[route_guard.HEADER] = value
    return await handler(request)


def sign_prepared(request: Any) -> Any:
    """``requests`` auth hook: the run's signature on a prepared request."""
    key = control.current_key()
    if key is not None:
        body = request.body or b""
        body = body.encode() if isinstance(body, str) else body
        path, _, query = request.path_url.partition("?")
        request.headers[route_guard.HEADER] = route_guard.signature(
            key, request.method, path.encode(), query.encode(), body
        )
    return request


def _sign_weight_sync_client() -> None:
    from skyrl.backends.skyrl_train.weight_sync.control_plane import SkyrlWeightSyncClient

    original = SkyrlWeightSyncClient.__init__
    if getattr(original, "skyrl_glm_signed", False):
        return

    def __init__(self: SkyrlWeightSyncClient, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._session.auth = sign_prepared

    __init__.skyrl_glm_signed = True  # type: ignore[attr-defined]
    SkyrlWeightSyncClient.__init__ = __init__  # type: ignore[method-assign]


def install() -> None:
    """Sign every request of SkyRL's remote inference and weight-sync clients in this process (idempotent)."""
    from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import RemoteGenerateClient

    _sign_weight_sync_client()
    original = RemoteGenerateClient._get_session
    if getattr(original, "skyrl_glm_signed", False):
        return

    async def _get_session(self: RemoteGenerateClient) -> Any:
        session = await original(self)
        if sign not in session._middlewares:  # aiohttp >= 3.12: a session's middlewares wrap each request it sends
            session._middlewares = (*session._middlewares, sign)
        return session

    _get_session.skyrl_glm_signed = True  # type: ignore[attr-defined]
    RemoteGenerateClient._get_session = _get_session  # type: ignore[method-assign]
