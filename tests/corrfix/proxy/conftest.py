"""The relay scenarios run through both relay paths: the engine, and tasks per connection."""

from __future__ import annotations

import pytest


@pytest.fixture(params=[True, False], ids=["engine", "tasks"])
def engine(request: pytest.FixtureRequest) -> bool:
    """``ProxyConfig.engine`` for the test: plaintext connections in the relay engine, or in
    tasks of their own (the path TLS connections always take)."""
    return bool(request.param)
