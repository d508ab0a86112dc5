"""A port window of its own for each run's vLLM servers.

SkyRL 0.4.0 gives server ``i`` the window ``[SKYRL_VLLM_START_PORT + 100 i, + 100)`` (``inference_servers/setup.py``
reads the variable once, at import, default 8000) and takes the first port there it can bind, then releases it
for vLLM to bind again; two runs on one host both start at 8000 and race for the same ports. Each run here picks
a random window whose first ports are free, outside the ephemeral range, and hands it to the Ray workers that
import SkyRL's setup.
"""

from __future__ import annotations

import os
import random
import socket
from typing import Any

PORT_ENV = "SKYRL_VLLM_START_PORT"
STRIDE = 100  # SkyRL's SERVER_PORT_STRIDE
LOW, HIGH = 10_000, 30_000  # below Linux's ephemeral range (32768-60999), above the usual service ports


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def server_count(cfg: Any) -> int:
    """How many server windows SkyRL lays out for the run (one per engine and data-parallel rank)."""
    engine = cfg.generator.inference_engine
    return max(engine.num_engines, 1) * max(engine.data_parallel_size, 1)


def pick_start_port(servers: int, rng: random.Random | None = None, tries: int = 64) -> int:
    """The base of ``servers`` consecutive windows whose first ports are free now."""
    rng = rng or random.SystemRandom()
    bases = range(LOW, HIGH - servers * STRIDE, STRIDE)
    for base in rng.sample(bases, min(tries, len(bases))):
        if all(_free(base + i * STRIDE) for i in range(servers)):
            return base
    raise RuntimeError(f"no free port window for {servers} vLLM server(s) in {LOW}..{HIGH}")


def run_env(cfg: Any) -> dict[str, str]:
    """The environment a run's Ray workers need for their own ports (a start port set by the user is kept)."""
    if os.environ.get(PORT_ENV):
        return {PORT_ENV: os.environ[PORT_ENV]}
    return {PORT_ENV: str(pick_start_port(server_count(cfg)))}
