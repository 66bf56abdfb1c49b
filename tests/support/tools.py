"""External tools the tests run (tshark, tcpdump, Node, kcat, promtool, ...): found on PATH,
else the test that needs one skips, unless CI requires it (``CORRFIX_REQUIRE_<TOOL>=1``,
set by .ci/run, which installs them all), and then it fails."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest


def unavailable(problem: str, variable: str) -> NoReturn:
    """Skip the calling test for ``problem``; fail it instead when ``$variable`` is 1.

    Call it from synchronous code: a skip raised inside a trio test loses its reason.
    """
    if os.environ.get(variable) == "1":
        pytest.fail(f"{problem}, and {variable}=1 requires it", pytrace=False)
    pytest.skip(f"{problem}; {variable}=1 makes this a failure")


def require_tool(name: str | tuple[str, ...], variable: str, install: str) -> str:
    """The path of ``name`` (the first of several names found); see :func:`unavailable`."""
    names = (name,) if isinstance(name, str) else name
    for candidate in names:
        path = shutil.which(candidate)
        if path is not None:
            return path
    unavailable(f"{names[0]} is not installed ({install})", variable)
