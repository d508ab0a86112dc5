"""Two Ray nodes on one machine, each with an address of its own, for a multi-node run in the CPU suite.

Why network namespaces: Ray names a node by its address and SkyRL's server URLs carry it, so the per-engine
routes (``skyrl_glm.skyrl.workers.routes``) can only be exercised with two distinct node addresses. One network
namespace per node gives each its own address, ports and loopback; the two are joined by a veth pair and nothing
else, so their traffic stays between them (each namespace's default route points at the other end, which forwards
nothing). Each node also gets its own PID namespace (ending the node's first process ends every process of the
node, Ray's daemons and vLLM's engines included) and mount namespace with a private ``/dev/shm`` (where Ray keeps
its session too): a shared-memory segment made on node 0 cannot be opened on node 1, as between two machines.

Node 0 runs Ray's head and the driver (``skyrl-glm train``); node 1 joins the head. Cleanup on every exit path:
the two node processes are killed (the ``finally`` of :func:`two_nodes`, also on KeyboardInterrupt), die with this
process if it is killed (``setpriv --pdeathsig``; ``unshare --kill-child`` takes the PID namespace along), and a
namespace left by an earlier run that was killed before it could remove it is removed by the next run
(:func:`sweep`: each name carries its maker's PID). Needs root (``ip netns``, ``unshare``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PREFIX = "sgn"  # namespaces sgn<pid>a / sgn<pid>b, veth ends sgv<pid>a / sgv<pid>b
SUBNET = "10.77.0"
RAY_PORT = 6379
GPUS_PER_NODE = 2  # logical: one policy rank and one vLLM engine per node
CPUS_PER_NODE = 8  # logical too: Ray's bookkeeping, not cores
BIN = Path(sys.executable).parent
# Ray's memory monitor counts the whole host's memory as its node's: on a machine shared with other jobs it kills
# the run's workers for memory they do not use (measured: a run killed at 95 % of the host). The kernel still
# guards the host.
RAY_ENV = {"RAY_memory_monitor_refresh_ms": "0"}


def problem() -> str | None:
    """Why two nodes cannot be made here (one line), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "unshare", "setpriv") if shutil.which(tool) is None]
    return f"missing {', '.join(missing)}" if missing else None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep() -> list[str]:
    """Remove the namespaces of earlier runs whose maker is gone (a killed test); the names removed."""
    removed = []
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        pid = name[len(PREFIX) : -1]
        if name.startswith(PREFIX) and pid.isdigit() and not _alive(int(pid)):
            _ip("netns", "del", name, check=False)
            removed.append(name)
    return removed


@dataclass(frozen=True)
class Node:
    netns: str
    veth: str
    address: str


def _nodes(pid: int) -> tuple[Node, Node]:
    return (
        Node(f"{PREFIX}{pid}a", f"sgv{pid}a", f"{SUBNET}.1"),
        Node(f"{PREFIX}{pid}b", f"sgv{pid}b", f"{SUBNET}.2"),
    )


def _make_network(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    for n in nodes:
        _ip("netns", "add", n.netns)
    _ip("link", "add", a.veth, "type", "veth", "peer", "name", b.veth)
    for n in nodes:
        _ip("link", "set", n.veth, "netns", n.netns)
        _ip("-n", n.netns, "addr", "add", f"{n.address}/24", "dev", n.veth)
        _ip("-n", n.netns, "link", "set", "lo", "up")
        _ip("-n", n.netns, "link", "set", n.veth, "up")
        _ip("-n", n.netns, "route", "add", "default", "dev", n.veth)  # what Ray reads as the node's address


def _in_node(node: Node, script: str) -> list[str]:
    """``script`` (bash) inside ``node``: its network namespace, a PID namespace of its own that dies with this
    process, and a private ``/dev/shm``."""
    body = f"set -e; mount -t tmpfs -o size=8g tmpfs /dev/shm; {script}"
    unshare = ["unshare", "--pid", "--kill-child", "--mount-proc", "--propagation", "private"]
    return ["ip", "netns", "exec", node.netns, "setpriv", "--pdeathsig", "KILL", *unshare, "bash", "-c", body]


def _ray_start(node: Node, head: Node) -> str:
    common = (
        f"--node-ip-address={node.address} --num-gpus={GPUS_PER_NODE} --num-cpus={CPUS_PER_NODE} "
        "--temp-dir=/dev/shm/ray --disable-usage-stats"
    )
    if node is head:
        return f"{BIN}/ray start --head --port={RAY_PORT} --include-dashboard=false {common}"
    return f"{BIN}/ray start --address={head.address}:{RAY_PORT} {common}"


WAIT_FOR_NODES = (
    "import os, ray, time\n"
    "ray.init(address=os.environ['RAY_ADDRESS'])\n"
    "deadline = time.time() + 180\n"
    "while sum(n['Alive'] for n in ray.nodes()) < 2:\n"
    "    assert time.time() < deadline, 'the second node never joined'\n"
    "    time.sleep(1)\n"
)


@dataclass
class Cluster:
    """A finished driver run on two nodes: its exit code, and where its output and each node's log are."""

    head: Node
    worker: Node
    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def two_nodes(tmp: Path, env: dict[str, str], driver: list[str], timeout: float) -> Iterator[Cluster]:
    """Make the two nodes, run ``driver`` on node 0 against the two-node cluster (``RAY_ADDRESS`` set), and yield
    its result; everything made is removed when the block ends, however it ends."""
    sweep()
    nodes = _nodes(os.getpid())
    previous = signal.signal(signal.SIGTERM, _terminated)  # a terminated test still runs the cleanup below
    head, worker = nodes
    procs: list[subprocess.Popen[str]] = []
    try:
        _make_network(nodes)
        join = (
            f"for i in $(seq 120); do {_ray_start(worker, head)} && break; sleep 1; done; "
            "exec sleep infinity"  # the node lives until its PID namespace is ended
        )
        with (tmp / "node1.log").open("w") as log:
            worker_env = {**env, **RAY_ENV, "GLOO_SOCKET_IFNAME": worker.veth}  # gloo's address: the node's own
            procs.append(subprocess.Popen(_in_node(worker, join), env=worker_env, stdout=log, stderr=log, text=True))
        run = (
            f"{_ray_start(head, head)}; export RAY_ADDRESS={head.address}:{RAY_PORT}; "
            f"{shlex.quote(sys.executable)} -c {shlex.quote(WAIT_FOR_NODES)}; {shlex.join(driver)}"
        )
        head_env = {**env, **RAY_ENV, "GLOO_SOCKET_IFNAME": head.veth}
        with (tmp / "stdout.txt").open("w") as out, (tmp / "stderr.txt").open("w") as err:
            procs.append(subprocess.Popen(_in_node(head, run), env=head_env, stdout=out, stderr=err, text=True))
        try:
            code = procs[-1].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = -9
        yield Cluster(head, worker, code, (tmp / "stdout.txt").read_text(), (tmp / "stderr.txt").read_text())
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for n in nodes:
            _ip("netns", "del", n.netns, check=False)
        signal.signal(signal.SIGTERM, previous)


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
