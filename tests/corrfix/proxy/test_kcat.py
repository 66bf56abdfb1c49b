"""kcat on Tansu, directly and through corrfix (issue #13).

Debian 12's kcat links librdkafka 2.0.2, which skips tagged fields one byte short (fixed in
2.2.0) and so cannot read Tansu's ApiVersions v3 answer: "Read underflow". Through corrfix,
whose client-compatibility repair drops those optional fields for such clients, it lists
metadata, produces and consumes. The tests are skipped when kcat is not installed, unless
``CORRFIX_REQUIRE_KCAT=1``, which fails them instead.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from corrfix.capture import Recorder
from corrfix.capture._columns import RowColumns, record_batch
from corrfix.capture.format import Source, schema_for
from corrfix.core import Address, RepairConfig, RepairKind
from corrfix.lab import TANSU_NODE_ID, TansuBroker
from corrfix.lab import workload as clients
from corrfix.proxy import Proxy, ProxyConfig, ProxyMetrics
from protocol import ApiKey
from protocol._api_versions import LIBRDKAFKA_TAG_SKIP_FIXED
from tests.support.tools import require_tool, unavailable

pytestmark = pytest.mark.broker

KCAT_NAMES = ("kcat", "kafkacat")
REQUIRE_ENV = "CORRFIX_REQUIRE_KCAT"
RUN_TIMEOUT = 60.0
METADATA_TIMEOUT = "3"
"""kcat's -m: seconds it keeps trying for metadata before it gives up."""
READ_UNDERFLOW = b"Read underflow"
_LIBRDKAFKA = re.compile(rb"librdkafka (\d+)\.(\d+)\.(\d+)")
COMPAT = RepairKind.CLIENT_COMPAT.value


@dataclass(frozen=True)
class Kcat:
    """The installed kcat and the librdkafka it runs on."""

    path: str
    librdkafka: tuple[int, int, int]

    @property
    def misreads_tagged_fields(self) -> bool:
        return self.librdkafka < LIBRDKAFKA_TAG_SKIP_FIXED

    async def run(self, bootstrap: str, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        with trio.fail_after(RUN_TIMEOUT):
            return await trio.run_process(
                [self.path, "-b", bootstrap, *args],
                stdin=stdin,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )


@pytest.fixture(scope="module")
def kcat() -> Kcat:
    path = require_tool(KCAT_NAMES, REQUIRE_ENV, "apt-get install kcat")
    banner = subprocess.run([path, "-V"], capture_output=True, timeout=10, check=False)
    match = _LIBRDKAFKA.search(banner.stdout + banner.stderr)
    if match is None:
        unavailable(f"{path} -V names no librdkafka version", REQUIRE_ENV)
    assert match is not None
    major, minor, patch = (int(part) for part in match.groups())
    return Kcat(path, (major, minor, patch))


@pytest.fixture
def old_kcat(kcat: Kcat) -> Kcat:
    """A kcat on a librdkafka that misreads tagged fields (Debian 12's)."""
    if not kcat.misreads_tagged_fields:
        version = ".".join(map(str, kcat.librdkafka))
        pytest.skip(f"this kcat runs librdkafka {version}, which reads tagged fields correctly")
    return kcat


@dataclass
class Stack:
    proxy: Proxy
    bootstrap: str
    metrics: ProxyMetrics
    columns: RowColumns
    taken: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Every row recorded so far, by column name."""
        chunk = self.columns.take()
        if chunk.rows:
            self.taken += record_batch(chunk, schema_for("kcat", Source.PROXY), "kcat", "proxy").to_pylist()
        return self.taken

    def compat_repairs(self) -> float:
        value = self.metrics.registry.get_sample_value("corrfix_repairs_total", {"kind": COMPAT})
        return value or 0.0

    def event_rows(self, kind: str) -> list[dict[str, Any]]:
        return [row for row in self.rows if row["event"] == kind]


@asynccontextmanager
async def corrfix_in_front_of(tansu: TansuBroker, repair: RepairConfig | None = None) -> AsyncIterator[Stack]:
    """kcat -> corrfix -> Tansu, Tansu advertising itself: rewriting keeps kcat on corrfix.
    A capture recorder and the metrics watch, as they do in production."""
    columns = RowColumns(max_rows=10_000_000, max_bytes=1 << 30)
    metrics = ProxyMetrics()
    config = ProxyConfig(
        Address("127.0.0.1", 0), Address("127.0.0.1", tansu.port), repair=repair or RepairConfig()
    )
    proxy = Proxy(config, observer=Recorder(columns, snaplen=0), metrics=metrics)
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(proxy.serve)
        yield Stack(proxy, f"127.0.0.1:{bound[0].port}", metrics, columns)
        nursery.cancel_scope.cancel()


def lines(n: int) -> list[bytes]:
    return [b"kcat-%05d" % i for i in range(n)]


async def test_kcat_cannot_read_tansus_api_versions_directly(old_kcat, tansu):
    listed = await old_kcat.run(tansu.bootstrap, "-L", "-m", METADATA_TIMEOUT)
    assert listed.returncode != 0
    assert READ_UNDERFLOW in listed.stderr, listed.stderr.decode(errors="replace")


async def test_kcat_lists_produces_and_consumes_through_corrfix(kcat, tansu):
    n, topic = 1000, "kcat"
    async with corrfix_in_front_of(tansu) as stack:
        listed = await kcat.run(stack.bootstrap, "-L", "-m", "10")
        await trio.to_thread.run_sync(clients.create_topic, stack.bootstrap, topic, 2)
        produced = await kcat.run(stack.bootstrap, "-P", "-t", topic, stdin=b"\n".join(lines(n)) + b"\n")
        consumed = await kcat.run(stack.bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q")
        connections = stack.proxy.stats.connections_opened
    assert listed.returncode == 0, listed.stderr.decode(errors="replace")
    assert READ_UNDERFLOW not in listed.stderr
    router = stack.proxy.router
    assert router is not None
    listener = router.listener_ports[TANSU_NODE_ID]
    assert f"broker {TANSU_NODE_ID} at 127.0.0.1:{listener}".encode() in listed.stdout
    assert produced.returncode == 0, produced.stderr.decode(errors="replace")
    assert consumed.returncode == 0, consumed.stderr.decode(errors="replace")
    assert sorted(consumed.stdout.splitlines()) == lines(n)
    repairs = Counter(stack.proxy.stats.repairs)
    assert repairs["give_up"] == 0
    if not kcat.misreads_tagged_fields:
        assert repairs[COMPAT] == 0
        return
    # At least one kcat connection per run was repaired (each is repaired once); the
    # kafka-python connections of create_topic were not.
    assert 3 <= repairs[COMPAT] < connections
    assert stack.compat_repairs() == repairs[COMPAT]
    rows = stack.event_rows(COMPAT)
    assert len(rows) == repairs[COMPAT]
    version = ".".join(map(str, kcat.librdkafka))
    for row in rows:
        assert row["api_key"] == ApiKey.API_VERSIONS
        assert row["client_correlation_id"] is not None and row["upstream_correlation_id"] is not None
        assert f"for librdkafka {version}," in row["reason"]
    assert {row["event"] for row in stack.rows if row["event"]} <= {COMPAT, "stale_drop", "probe_sent"}


async def test_without_the_compat_repair_kcat_fails_through_corrfix_too(old_kcat, tansu):
    """corrfix relays Tansu's answer byte for byte (every version is under its caps), so
    the repair, and nothing else, is what lets kcat in; --no-client-compat turns it off."""
    async with corrfix_in_front_of(tansu, RepairConfig(client_compat=False)) as stack:
        listed = await old_kcat.run(stack.bootstrap, "-L", "-m", METADATA_TIMEOUT)
    assert listed.returncode != 0
    assert READ_UNDERFLOW in listed.stderr, listed.stderr.decode(errors="replace")
    assert stack.proxy.stats.repairs[COMPAT] == 0
    assert stack.event_rows(COMPAT) == []
