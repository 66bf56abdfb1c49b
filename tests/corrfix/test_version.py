"""``corrfix --version``: corrfix's version, Python's and the libraries', on stdout."""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata

from corrfix._version import LIBRARIES, version_report


def test_the_report_names_corrfix_python_and_each_library():
    lines = version_report().splitlines()
    assert lines[0] == f"corrfix {metadata.version('corrfix')}"
    assert lines[1].startswith(f"Python {platform.python_version()} ")
    for library in LIBRARIES:
        assert f"{library} {metadata.version(library)}" in lines


def test_corrfix_version_prints_it_and_exits_0():
    result = subprocess.run(
        [sys.executable, "-m", "corrfix", "--version"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == version_report() + "\n"
