"""A description of the machine and software a run measured, for the results files."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import targets


def _first(path: str, prefix: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _command_line(command: list[str]) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if text else None


def _git(here: str, *args: str) -> str | None:
    """git's first line of output in ``here``; None without git or outside a checkout (an
    exported tree), where its error message is no commit."""
    if shutil.which("git") is None:
        return None
    done = subprocess.run(["git", "-C", here, *args], capture_output=True, text=True, check=False)
    text = done.stdout.strip() if done.returncode == 0 else ""
    return text.splitlines()[0] if text else None


def _os_name() -> str:
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME", platform.platform())
    except OSError:
        return platform.platform()


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def describe() -> dict[str, object]:
    mem_kib = _first("/proc/meminfo", "MemTotal")
    here = str(Path(__file__).parent)
    commit = _git(here, "rev-parse", "--short", "HEAD")
    if commit and _git(here, "status", "--porcelain", "--untracked-files=no"):
        commit += "-dirty"  # the run measured code that is not in that commit
    return {
        "cpu": _first("/proc/cpuinfo", "model name") or platform.processor(),
        "cores": os.cpu_count(),
        "ram_gib": round(int(mem_kib.split()[0]) / 1024 / 1024, 1) if mem_kib else None,
        "kernel": platform.release(),
        "os": _os_name(),
        "python": platform.python_version(),
        "trio": _version("trio"),
        "kafka-python": _version("kafka-python"),
        "confluent-kafka": _version("confluent-kafka"),
        "pyarrow": _version("pyarrow"),
        "pyspark": _version("pyspark"),
        "haproxy": targets.haproxy_version(),
        "tshark": _command_line(["tshark", "--version"]),
        "corrfix_commit": commit,
        "load_average_at_start": load_average(),
    }
