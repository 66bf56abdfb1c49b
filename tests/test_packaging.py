"""Packaging: ``python -m build`` makes an sdist and a wheel; the wheel installs into a fresh
venv, whose ``corrfix --version`` and ``corrfix proxy --help`` work, and it installs exactly
the three top-level packages the README names."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
TOP_LEVEL = {"corrfix", "protocol", "spark_audit"}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "!!" not in result.stdout + result.stderr, "setuptools warned about the project metadata"
    return out


def test_build_makes_an_sdist_and_a_wheel_of_the_three_packages(dist):
    (sdist,) = dist.glob("corrfix-*.tar.gz")
    (wheel,) = dist.glob("corrfix-*-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert packages == TOP_LEVEL
    assert not any(name.startswith("tests/") for name in names)
    assert sdist.stat().st_size > 0
    readme = (ROOT / "README.md").read_text()
    for package in TOP_LEVEL:
        assert f"`{package}`" in readme


def test_the_wheel_installs_in_a_fresh_venv_and_runs(dist, tmp_path):
    (wheel,) = dist.glob("corrfix-*.whl")
    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=False)
    # A PYTHONPATH naming a checkout (a git worktree's runs set one) would make pip call the
    # wheel installed already and the venv's corrfix import from the checkout: not inherited.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    python = fresh / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # The dependencies come from this environment (appended after the venv's own packages,
    # so the wheel's corrfix is the one imported, not this checkout); no index is needed.
    Path(site, "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    corrfix = fresh / "bin" / "corrfix"
    # Run away from this checkout, which `python -c` would otherwise import from.
    run = functools.partial(subprocess.run, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    version = run([corrfix, "--version"])
    assert version.returncode == 0, version.stderr
    lines = version.stdout.splitlines()
    assert lines[0] == "corrfix 0.1.0" and lines[1].startswith("Python 3.")
    assert any(line.startswith("kafka-python ") for line in lines)
    help_text = run([corrfix, "proxy", "--help"])
    assert help_text.returncode == 0 and "--ready-stale" in help_text.stdout
    where = run([python, "-c", "import corrfix, protocol, spark_audit; print(corrfix.__file__)"])
    assert where.stdout.startswith(site), where.stdout + where.stderr
