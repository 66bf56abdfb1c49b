"""Waiting for a condition another task or thread makes true, without a fixed sleep."""

from __future__ import annotations

from collections.abc import Callable

import trio


async def wait_until(predicate: Callable[[], object]) -> None:
    """Poll ``predicate`` until it holds; the caller's ``fail_after`` bounds the wait."""
    while not predicate():
        await trio.sleep(0.01)
