"""The job under spark-submit on a Spark standalone cluster (a master and one worker on
loopback, started from the pyspark package's own scripts) writes the report local mode
writes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

import spark_audit.__main__ as job
from spark_audit import AuditOptions, run_audit
from spark_audit.connections import DRIVER_BYTES_CONF

SPARK_HOME = Path(pyspark.__file__).parent
START_TIMEOUT = 60.0
SUBMIT_TIMEOUT = 300.0
MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
VARYING = ("spark", "elapsed_s")
"""Report keys that differ by where and how fast the job ran."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _webui() -> list[str]:
    return ["--webui-port", str(_free_port())]


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }


def _wait_listening(port: int, proc: subprocess.Popen, log: Path) -> None:
    """Until the master accepts connections (bounded; fails with its log if it died)."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the Spark master exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)  # polling a real socket: there is no event to wait on
    pytest.fail(f"the Spark master did not listen within {START_TIMEOUT} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``spark://`` URL of a master with one worker (1 core, 1 GiB), both stopped after."""
    logs = tmp_path_factory.mktemp("standalone")
    port = _free_port()
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    started: list[subprocess.Popen] = []
    try:
        master_log = logs / "master.log"
        with master_log.open("wb") as out:
            master = subprocess.Popen(
                [spark_class, MASTER, "--host", "127.0.0.1", "--port", str(port), *_webui()],
                env=_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        started.append(master)
        _wait_listening(port, master, master_log)
        url = f"spark://127.0.0.1:{port}"
        with (logs / "worker.log").open("wb") as out:
            worker = subprocess.Popen(
                [
                    spark_class,
                    WORKER,
                    url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    *_webui(),
                ],
                env=_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        started.append(worker)
        yield url
    finally:
        for proc in reversed(started):
            _stop(proc)


def _comparable(report: dict) -> dict:
    return {key: value for key, value in report.items() if key not in VARYING}


def test_spark_submit_on_a_standalone_cluster_writes_the_local_report(
    spark, cluster, small_capture, tmp_path
):
    out = tmp_path / "cluster-report"
    submit = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster]
    submit += ["--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.ui.enabled=false"]
    submit += ["--conf", "spark.sql.session.timeZone=UTC", "--executor-memory", "512m"]
    submit += ["--conf", f"{DRIVER_BYTES_CONF}=0"]  # the pass in the executors, not on the driver
    done = subprocess.run(
        [*submit, job.__file__, str(small_capture), "-o", str(out), "-q"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=SUBMIT_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    on_cluster = json.loads((out / "report.json").read_text())
    assert on_cluster["spark"]["master"] == cluster
    local = json.loads(json.dumps(run_audit(spark, AuditOptions(str(small_capture)))))
    assert _comparable(on_cluster) == _comparable(local)
    assert on_cluster["summary"]["findings"] > 0
