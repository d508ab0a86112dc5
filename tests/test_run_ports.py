"""Each run's vLLM servers and router get ports of their own (two runs on one host raced for 8000 and 29000, and two
runs that drew the same window shared one server port: vLLM binds it with SO_REUSEPORT)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from types import SimpleNamespace

from skyrl_glm.skyrl.run import ports


def _engine(engines: int = 1, dp: int = 1) -> SimpleNamespace:
    return SimpleNamespace(num_engines=engines, data_parallel_size=dp)


def test_a_taken_window_is_skipped():
    with ports.claimed_start_port(2, random.Random(7)) as first:
        pass
    with socket.socket() as held:  # another run's server holds the first port of that window
        held.bind(("", first))
        with ports.claimed_start_port(2, random.Random(7)) as other:
            pass
    assert other != first
    assert ports.LOW <= other < ports.HIGH and other % ports.STRIDE == 0


def test_two_runs_that_draw_the_same_window_get_different_ones():
    """Both runs draw the same random windows (their servers not yet up, every port free): the second skips each
    window the first holds, and the first's window is free again once it ends."""
    with ports.claimed_start_port(2, random.Random(7)) as first:
        with ports.claimed_start_port(2, random.Random(7)) as second:
            assert abs(second - first) >= 2 * ports.STRIDE  # no window of one is a window of the other
    with ports.claimed_start_port(2, random.Random(7)) as again:
        assert again == first


def test_a_run_in_another_process_holds_its_window():
    """The lock is the process's: a second process drawing the same windows never gets the first one's."""
    code = (
        "import random\nfrom skyrl_glm.skyrl.run import ports\n"
        "with ports.claimed_start_port(2, random.Random(7)) as base: print(base)"
    )
    with ports.claimed_start_port(2, random.Random(7)) as mine:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert int(out.stdout.strip()) != mine, out.stderr[-2000:]


def test_run_ports_gives_every_server_and_the_router_a_window(monkeypatch):
    monkeypatch.delenv(ports.PORT_ENV, raising=False)
    with ports.run_ports(_engine(engines=2, dp=2)) as env:
        start, metrics = int(env[ports.PORT_ENV]), int(env[ports.ROUTER_METRICS_ENV])
    assert metrics == start + 4 * ports.STRIDE  # after the 4 servers' windows
    monkeypatch.setenv(ports.PORT_ENV, "12000")  # a start port the user chose is kept
    with ports.run_ports(_engine()) as env:
        assert env[ports.PORT_ENV] == "12000"


def test_use_run_ports_moves_skyrls_router_metrics_port(monkeypatch):
    from skyrl.backends.skyrl_train.inference_servers.vllm_router import VLLMRouter

    monkeypatch.setattr(VLLMRouter, "_DEFAULT_PROMETHEUS_PORT", VLLMRouter._DEFAULT_PROMETHEUS_PORT)
    monkeypatch.setenv(ports.ROUTER_METRICS_ENV, "23456")
    ports.use_run_ports()
    assert VLLMRouter._DEFAULT_PROMETHEUS_PORT == 23456


def test_skyrl_reads_the_server_start_port_from_the_environment():
    """The SkyRL behaviour the run's window relies on (a SkyRL upgrade that drops it fails here)."""
    code = "from skyrl.backends.skyrl_train.inference_servers import setup; print(setup.VLLM_START_PORT)"
    port = "17300"
    env = {**os.environ, ports.PORT_ENV: port}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == port, out.stderr[-2000:]


def test_a_lock_folder_that_is_not_this_users_own_leaves_the_run_unlocked(tmp_path, monkeypatch, caplog):
    """A file where the folder should be, or a folder others may write: the run still gets a free window (no
    traceback), and the log says its windows are not locked."""
    monkeypatch.setattr(ports.tempfile, "gettempdir", lambda: str(tmp_path))
    folder = tmp_path / f"skyrl-glm-ports-{os.getuid()}"
    folder.write_text("left behind")
    with ports.claimed_start_port(2, random.Random(7)) as base:
        assert ports.LOW <= base < ports.HIGH
    assert "port windows not locked" in caplog.text
    folder.unlink()
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    assert ports.lock_folder() is None
    folder.chmod(0o700)
    assert ports.lock_folder() == folder
