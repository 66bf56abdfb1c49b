"""External tools the deploy tests run: found on PATH, else the test skips, unless CI requires it."""

from __future__ import annotations

import os
import shutil

import pytest


def require_tool(name: str, variable: str, install: str) -> str:
    """The path of ``name``; skip without it, fail instead when ``$variable`` is 1 (as in CI)."""
    path = shutil.which(name)
    if path is not None:
        return path
    message = f"{name} is not installed ({install})"
    if os.environ.get(variable) == "1":
        pytest.fail(f"{message}, and {variable}=1 requires it")
    pytest.skip(message)
