"""Ports of its own for each run's vLLM servers and router.

SkyRL 0.4.0 gives server ``i`` the window ``[SKYRL_VLLM_START_PORT + 100 i, + 100)`` (``inference_servers/setup.py``
reads the variable once, at import, default 8000) and its router's Prometheus exporter a port from 29000 on
(``VLLMRouter._DEFAULT_PROMETHEUS_PORT``); each takes the first port it can bind there, then releases it for the
server to bind again. Two runs on one host start from the same ports and race for them (measured: the second
run's router died on "Address already in use"). Each run here picks random windows whose first ports are free,
below the ephemeral range, holds a lock on each window for as long as it runs (so two runs starting together never
take the same one: vLLM binds its server with ``SO_REUSEPORT``, and two servers on one port share its requests,
measured on the CPU machine: one run's check read another run's adapter), and hands them to the Ray workers in their
environment.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import socket
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skyrl.train.config import InferenceEngineConfig

log = logging.getLogger(__name__)

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


def lock_folder() -> Path | None:
    """This user's folder of window locks, private; None where it cannot be (a file or another user's folder at
    that path): the run then goes without the locks, and says so."""
    from skyrl_glm.skyrl.config.key_placement import private_dir_problem

    folder = Path(tempfile.gettempdir()) / f"skyrl-glm-ports-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as e:
        problem: str | None = f"{folder}: {e.strerror or e}"
    else:
        problem = private_dir_problem(folder)
    if problem is not None:
        log.warning("skyrl-glm: port windows not locked (%s): runs started together may draw the same one", problem)
        return None
    return folder


def _claim(folder: Path | None, base: int, held: ExitStack) -> bool:
    """Lock window ``base`` for this process until ``held`` closes; False where another run on this host holds it
    (the lock goes with the process that holds it, so a file left behind blocks nothing)."""
    if folder is None:
        return True
    try:
        fd = os.open(folder / str(base), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return False  # not a lock file this run can hold: another window
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    held.callback(os.close, fd)
    return True


@contextmanager
def claimed_start_port(servers: int, rng: random.Random | None = None, tries: int = 64) -> Iterator[int]:
    """The base of ``servers`` consecutive windows whose first ports are free now and which no other run on this
    host holds, held until the block ends."""
    rng = rng or random.SystemRandom()
    bases = range(LOW, HIGH - servers * STRIDE, STRIDE)
    folder = lock_folder()
    for base in rng.sample(bases, min(tries, len(bases))):
        with ExitStack() as held:
            windows = [base + i * STRIDE for i in range(servers)]
            if all(_claim(folder, w, held) and _free(w) for w in windows):
                yield base
                return
    raise RuntimeError(f"no free port window for {servers} vLLM server(s) in {LOW}..{HIGH}")


@contextmanager
def run_ports(engine: InferenceEngineConfig) -> Iterator[dict[str, str]]:
    """The environment a run's Ray workers need for their own ports (a server start port set by the user is kept):
    the servers' windows, then one for the router's metrics, held for the block (the run)."""
    servers = server_count(engine)
    with claimed_start_port(servers + 1) as base:
        yield {PORT_ENV: os.environ.get(PORT_ENV) or str(base), ROUTER_METRICS_ENV: str(base + servers * STRIDE)}


def use_run_ports() -> None:
    """In the process that starts SkyRL's router (the experiment): its metrics port from the run's window."""
    if port := os.environ.get(ROUTER_METRICS_ENV):
        from skyrl.backends.skyrl_train.inference_servers.vllm_router import VLLMRouter

        VLLMRouter._DEFAULT_PROMETHEUS_PORT = int(port)
