"""A proxy started in a test's nursery, with repair timers short enough for tests."""

from __future__ import annotations

import trio

from corrfix.core import Address, RepairConfig
from corrfix.proxy import ConnectionObserver, Proxy, ProxyConfig

FAST_REPAIR = RepairConfig(probe_after=0.2, probe_min=0.01)


async def start_proxy(
    nursery: trio.Nursery,
    upstream_port: int,
    repair: RepairConfig = FAST_REPAIR,
    *,
    engine: bool = True,
    observer: ConnectionObserver | None = None,
) -> tuple[Proxy, int]:
    config = ProxyConfig(
        Address("127.0.0.1", 0), Address("127.0.0.1", upstream_port), repair=repair, engine=engine
    )
    proxy = Proxy(config, observer=observer)
    bound = await nursery.start(proxy.serve)
    return proxy, bound[0].port
