"""sd_notify over a real unix datagram socket, as systemd's Type=notify receives it, and the
SIGHUP that re-opens the log and capture files (what a systemd ExecReload or logrotate sends)."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import time

import pytest

from corrfix._netutil import can_connect, free_port
from corrfix.lab import CorrfixProcess, workload
from corrfix.proxy._systemd import NOTIFY_SOCKET, READY, notify
from tests.support.health import probe, wait_for

UCRED = struct.Struct("3i")


class FakeSystemd:
    """The receiving end systemd would hold: a datagram socket that also learns each sender's pid."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)

    def receive(self, timeout: float = 20.0) -> tuple[int, list[str]]:
        """The next message and its sender's pid; fails if none comes within ``timeout``."""
        self.sock.settimeout(timeout)
        data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(UCRED.size))
        pids = [UCRED.unpack(payload[: UCRED.size])[0] for _, _, payload in ancillary]
        return pids[0], data.decode().splitlines()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def systemd(tmp_path, monkeypatch):
    path = str(tmp_path / "notify")
    receiver = FakeSystemd(path)
    monkeypatch.setenv(NOTIFY_SOCKET, path)
    yield receiver
    receiver.close()


def test_notify_sends_one_datagram_and_nothing_without_a_socket(systemd):
    assert notify("READY=1\nSTATUS=serving")
    assert systemd.receive(5) == (os.getpid(), ["READY=1", "STATUS=serving"])
    assert notify(READY, environ={}) is False
    assert notify(READY, environ={NOTIFY_SOCKET: "vsock:2:1"}) is False  # not ours to speak


def test_notify_reaches_an_abstract_socket():
    name = f"corrfix-test-{os.getpid()}-{time.monotonic_ns()}"
    receiver = FakeSystemd("\0" + name)
    try:
        assert notify(READY, environ={NOTIFY_SOCKET: "@" + name})
        assert receiver.receive(5)[1] == [READY]
    finally:
        receiver.close()


def test_a_vanished_socket_is_logged_not_fatal(tmp_path):
    assert notify(READY, environ={NOTIFY_SOCKET: str(tmp_path / "gone")}) is False


@pytest.mark.broker
def test_ready_after_listening_reload_reopens_files_stopping_on_sigterm(systemd, tansu_factory, tmp_path):
    port = free_port()
    broker = tansu_factory(advertised_port=port)
    log_file, capture = tmp_path / "logs" / "corrfix.log", tmp_path / "capture"
    args = [
        "proxy",
        "--listen",
        f"127.0.0.1:{port}",
        "--upstream",
        broker.bootstrap,
        "--log-file",
        str(log_file),
        "--capture-dir",
        str(capture),
        "--capture-flush-seconds",
        "0.05",
    ]
    proxy = CorrfixProcess(args, port, tmp_path / "stdout.log")
    with proxy:
        pid, message = systemd.receive()
        assert (pid, message) == (proxy._proc.pid, [READY])
        assert can_connect("127.0.0.1", port)  # READY=1 came once the listener was up
        workload.api_versions(f"127.0.0.1:{port}")
        first = wait_for(lambda: sorted(capture.glob("*.arrows")), 10, "the first capture file")

        # logrotate's way: move the files away, then SIGHUP.
        log_file.rename(log_file.with_suffix(".log.1"))
        capture.rename(tmp_path / "capture.1")
        proxy._proc.send_signal(signal.SIGHUP)
        pid, reloading = systemd.receive()
        assert pid == proxy._proc.pid and reloading[0] == "RELOADING=1"
        assert reloading[1].startswith("MONOTONIC_USEC=") and int(reloading[1].split("=")[1]) > 0
        assert systemd.receive()[1] == [READY]
        workload.api_versions(f"127.0.0.1:{port}")
        second = wait_for(lambda: sorted(capture.glob("*.arrows")), 10, "a capture file in a new directory")
        assert second[0].name != first[0].name  # a new file, not the old one re-created

        proxy._proc.send_signal(signal.SIGTERM)
        assert systemd.receive()[1] == ["STOPPING=1"]
        assert proxy._proc.wait(20) == 0
    old = [json.loads(line)["event"] for line in log_file.with_suffix(".log.1").read_text().splitlines()]
    new = [json.loads(line)["event"] for line in log_file.read_text().splitlines()]
    assert old[0] == "capture started" and "reopened log and capture files" not in old
    assert new[0] == "reopened log and capture files" and new[-1] == "proxy stopped"
    assert proxy.output() == ""  # everything went to the log file


@pytest.mark.broker
def test_ready_says_where_health_is_served_when_the_kernel_picked_the_port(systemd, tansu, tmp_path):
    port = free_port()
    args = ["proxy", "--listen", f"127.0.0.1:{port}", "--upstream", tansu.bootstrap, "--admin", "127.0.0.1:0"]
    with CorrfixProcess(args, port, tmp_path / "stdout.log") as proxy:
        pid, message = systemd.receive()
        assert pid == proxy._proc.pid and message[0] == READY
        (said,) = message[1:]
        name, _, where = said.partition("=")
        assert name == "X_CORRFIX_ENDPOINT"
        assert probe(f"http://{where}/livez") == (200, {"live": True})


@pytest.mark.broker
def test_workers_are_ready_when_every_worker_listens_and_pass_sighup_on(systemd, tansu, tmp_path):
    port, log_file = free_port(), tmp_path / "corrfix.log"
    args = ["proxy", "--listen", f"127.0.0.1:{port}", "--upstream", tansu.bootstrap, "--workers", "2"]
    with CorrfixProcess([*args, "--log-file", str(log_file)], port, tmp_path / "stdout.log") as proxy:
        pid, message = systemd.receive()
        assert (pid, message) == (proxy._proc.pid, [READY])  # the supervisor's, not a worker's
        assert events(log_file).count("proxy listening") == 2  # both workers listened before it
        log_file.rename(tmp_path / "corrfix.log.1")
        proxy._proc.send_signal(signal.SIGHUP)  # passed on to the workers
        pid, reloading = systemd.receive()
        assert pid == proxy._proc.pid and reloading[0] == "RELOADING=1"
        assert systemd.receive() == (proxy._proc.pid, [READY])
        wait_for(
            lambda: log_file.exists() and events(log_file).count("reopened log and capture files") == 2,
            10,
            "both workers to reopen the log file",
        )
        proxy._proc.send_signal(signal.SIGTERM)
        assert systemd.receive() == (proxy._proc.pid, ["STOPPING=1"])
        assert proxy._proc.wait(20) == 0
    assert events(log_file)[-1] == "workers stopped"  # the supervisor re-opened it too
    assert "workers stopped" not in events(tmp_path / "corrfix.log.1")


def events(path) -> list[str]:
    """The events of the complete lines so far (a process may be writing the last one)."""
    return [json.loads(line)["event"] for line in path.read_text().split("\n")[:-1]]
