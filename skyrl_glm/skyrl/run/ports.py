"""Ports of its own for each run's vLLM servers and router.

SkyRL 0.4.0 gives server ``i`` the window ``[SKYRL_VLLM_START_PORT + 100 i, + 100)`` (``inference_servers/setup.py``
reads the variable once, at import, default 8000) and its router's Prometheus exporter a port from 29000 on
(``VLLMRouter._DEFAULT_PROMETHEUS_PORT``); each takes the first port it can bind there, then releases it for the
server to bind again. Two runs on one host start from the same ports and race for them (measured: the second
run's router died on "Address already in use"). Each run here picks random windows whose first ports are free,
below the ephemeral range, and hands them to the Ray workers in their environment.
"""

from __future__ import annotations

import os
import random
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skyrl.train.config import InferenceEngineConfig

PORT_ENV = "SKYRL_VLLM_START_PORT"
ROUTER_METRICS_ENV = "SKYRL_GLM_ROUTER_METRICS_PORT"
STRIDE = 100  # SkyRL's SERVER_PORT_STRIDE
LOW, HIGH = 10_000, 30_000  # below Linux's ephemeral range (32768-60999), above the usual service ports


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def server_count(engine: InferenceEngineConfig) -> int:
    """How many server windows SkyRL lays out for the run (one per engine and data-parallel rank)."""
    return max(engine.num_engines, 1) * max(engine.data_parallel_size, 1)


def pick_start_port(servers: int, rng: random.Random | None = None, tries: int = 64) -> int:
    """The base of ``servers`` consecutive windows whose first ports are free now."""
    rng = rng or random.SystemRandom()
    bases = range(LOW, HIGH - servers * STRIDE, STRIDE)
    for base in rng.sample(bases, min(tries, len(bases))):
        if all(_free(base + i * STRIDE) for i in range(servers)):
            return base
    raise RuntimeError(f"no free port window for {servers} vLLM server(s) in {LOW}..{HIGH}")


def run_env(engine: InferenceEngineConfig) -> dict[str, str]:
    """The environment a run's Ray workers need for their own ports (a server start port set by the user is kept):
    the servers' windows, then one for the router's metrics."""
    servers = server_count(engine)
    base = pick_start_port(servers + 1)
    return {PORT_ENV: os.environ.get(PORT_ENV) or str(base), ROUTER_METRICS_ENV: str(base + servers * STRIDE)}


def use_run_ports() -> None:
    """In the process that starts SkyRL's router (the experiment): its metrics port from the run's window."""
    if port := os.environ.get(ROUTER_METRICS_ENV):
        from skyrl.backends.skyrl_train.inference_servers.vllm_router import VLLMRouter

        VLLMRouter._DEFAULT_PROMETHEUS_PORT = int(port)
