"""The chaos relay's trio shell: sockets, timers and logging around :mod:`corrfix.chaos`.

``corrfix chaos --listen HOST:PORT --upstream HOST:PORT ...`` accepts clients, opens one
upstream connection per client, forwards requests unchanged (whole receive chunks, no
per-frame work beyond tracking), and applies the policy's decision to every response.

Delays: by default a delayed response is held by its own timer while later responses
keep flowing, so they overtake it and the client sees responses out of order. That is a
fault corrfix must repair, and a plain "the broker is slow" is already covered by the
other mode: with ``--delay-in-order`` (``ChaosConfig.delay_in_order``) the delayed
response blocks the responses behind it on that connection, preserving order.

Killing (``--kill-every N``): the Nth response overall is handled as decided, then both
sides of its connection are closed. Responses still waiting on a delay timer die with
the connection, as they would with a real broker.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog
import trio

from corrfix.chaos._policy import (
    Action,
    ChaosPolicy,
    ChaosRules,
    ConnectionChaos,
    Decision,
    api_label,
)
from protocol import DEFAULT_MAX_FRAME_SIZE, ProtocolError

RECEIVE_SIZE = 256 * 1024
OUTGOING_QUEUE = 64
"""Response batches queued for one client before the broker side stops reading (backpressure)."""

_log = structlog.get_logger("corrfix.chaos")


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    """Everything ``serve_chaos`` needs: where to listen, where to connect, what to break."""

    listen_host: str | None
    listen_port: int
    upstream_host: str
    upstream_port: int
    rules: ChaosRules = field(default_factory=ChaosRules)
    delay_in_order: bool = False
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    connect_timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class ChaosRelay:
    """What ``serve_chaos`` reports through ``task_status.started()``.

    ``ports`` has one entry per listener (IPv4 and IPv6 may differ only when port 0 was
    asked for on a host with both). ``policy`` gives tests and callers live counters.
    """

    ports: tuple[int, ...]
    policy: ChaosPolicy

    @property
    def port(self) -> int:
        return self.ports[0]


@dataclass(slots=True)
class _Outgoing:
    """One batch for the client writer: bytes to send, no earlier than ``not_before``,
    then optionally kill the connection."""

    data: bytes
    not_before: float = 0.0
    kill: bool = False


_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class _Connection:
    """One client with its upstream: a request pump, a response pump and a client writer.

    The writer is the only task that sends to the client, so the response pump and
    the delay timers never send concurrently; the bounded channel between them carries
    backpressure from a slow client back to the broker socket.
    """

    def __init__(
        self,
        client: trio.SocketStream,
        upstream: trio.SocketStream,
        chaos: ConnectionChaos,
        config: ChaosConfig,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.client = client
        self.upstream = upstream
        self.chaos = chaos
        self.config = config
        self.log = log
        self.cancel_scope = trio.CancelScope()

    async def run(self) -> None:
        send_out, receive_out = trio.open_memory_channel[_Outgoing](OUTGOING_QUEUE)
        with self.cancel_scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._guard, self._pump_requests)
                nursery.start_soon(self._guard, lambda: self._pump_responses(nursery, send_out))
                nursery.start_soon(self._guard, lambda: self._write_responses(receive_out))

    async def _guard(self, pump: Callable[[], Awaitable[None]]) -> None:
        """Run one direction; a broken socket or garbage ends the whole connection, nothing more."""
        try:
            await pump()
        except ProtocolError as exc:
            self.log.warning("chaos.protocol_error", error=str(exc))
            self.cancel_scope.cancel()
        except _STREAM_ERRORS as exc:
            self.log.info("chaos.connection_error", error=str(exc) or type(exc).__name__)
            self.cancel_scope.cancel()

    async def _pump_requests(self) -> None:
        client, upstream, chaos = self.client, self.upstream, self.chaos
        while True:
            data = await client.receive_some(RECEIVE_SIZE)
            if not data:
                self.log.debug("chaos.client_eof")
                with contextlib.suppress(*_STREAM_ERRORS):
                    await upstream.send_eof()
                return
            chaos.client_data(data)  # track before the broker can possibly answer
            await upstream.send_all(data)

    async def _pump_responses(
        self, nursery: trio.Nursery, send_out: trio.MemorySendChannel[_Outgoing]
    ) -> None:
        async with send_out:
            while True:
                data = await self.upstream.receive_some(RECEIVE_SIZE)
                if not data:
                    self.log.debug("chaos.broker_eof")
                    return
                batch: list[bytearray] = []
                for frame in self.chaos.broker_frames(data):
                    # Decided one by one: the frames behind a kill are never sent, nor counted.
                    decision = self.chaos.response(frame)
                    action = decision.action
                    if action is Action.FORWARD:
                        batch.append(frame)
                    elif action is Action.DUPLICATE:
                        batch += (frame, frame)
                    elif action is Action.DELAY:
                        deadline = trio.current_time() + decision.delay_seconds
                        if self.config.delay_in_order:
                            await _flush(send_out, batch)
                            await send_out.send(_Outgoing(bytes(frame), not_before=deadline))
                        else:
                            nursery.start_soon(_deliver_later, send_out.clone(), bytes(frame), deadline)
                    if action is not Action.FORWARD:
                        self._log_action(decision)
                    if decision.kill:
                        self._log_action(decision, event="chaos.kill")
                        await _flush(send_out, batch)
                        await send_out.send(_Outgoing(b"", kill=True))
                        return
                await _flush(send_out, batch)

    async def _write_responses(self, receive_out: trio.MemoryReceiveChannel[_Outgoing]) -> None:
        client = self.client
        async with receive_out:
            async for item in receive_out:
                if item.not_before:
                    await trio.sleep_until(item.not_before)
                if item.data:
                    await client.send_all(item.data)
                if item.kill:
                    self.log.debug("chaos.killed")
                    self.cancel_scope.cancel()
                    return
        # The broker closed and every delayed response is out: pass the close on.
        with contextlib.suppress(*_STREAM_ERRORS):
            await client.send_eof()

    def _log_action(self, decision: Decision, event: str | None = None) -> None:
        self.log.info(
            event or f"chaos.{decision.action.value}",
            api=api_label(decision.api_key),
            api_key=decision.api_key,
            api_version=decision.api_version,
            correlation_id=decision.correlation_id,
            **({"delay_seconds": decision.delay_seconds} if decision.action is Action.DELAY else {}),
        )


async def _flush(send_out: trio.MemorySendChannel[_Outgoing], batch: list[bytearray]) -> None:
    """Queue the frames gathered so far as one send."""
    if batch:
        await send_out.send(_Outgoing(b"".join(batch)))
        batch.clear()


async def _deliver_later(send_out: trio.MemorySendChannel[_Outgoing], data: bytes, deadline: float) -> None:
    """Overtaking delay: this response waits, the ones behind it do not."""
    async with send_out:
        await trio.sleep_until(deadline)
        # The writer may be gone: the connection died while this response waited.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await send_out.send(_Outgoing(data))


async def _relay_connection(
    client: trio.SocketStream, config: ChaosConfig, policy: ChaosPolicy, name: str
) -> None:
    log = _log.bind(connection=name)
    upstream: trio.SocketStream | None = None
    error = "timed out"
    with trio.move_on_after(config.connect_timeout):
        try:
            upstream = await trio.open_tcp_stream(config.upstream_host, config.upstream_port)
        except OSError as exc:
            error = str(exc)
    if upstream is None:
        log.error(
            "chaos.upstream_unreachable",
            upstream=f"{config.upstream_host}:{config.upstream_port}",
            error=error,
        )
        await client.aclose()
        return
    chaos = policy.connection(name, config.max_frame_size)
    log.info("chaos.connected", peer=_peer(client))
    try:
        async with client, upstream:
            await _Connection(client, upstream, chaos, config, log).run()
    except Exception:
        # A bug must cost one connection, not the relay (and every other connection).
        log.exception("chaos.connection_crashed")
    finally:
        chaos.close()
        log.info("chaos.closed", requests=chaos.requests, responses=chaos.responses)


def _peer(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"


async def serve_chaos(
    config: ChaosConfig,
    *,
    policy: ChaosPolicy | None = None,
    task_status: trio.TaskStatus[ChaosRelay] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Relay with chaos until cancelled; ``task_status.started()`` gets a :class:`ChaosRelay`.

    Pass ``policy`` to share counters with the caller (``run_chaos`` does, to print the
    summary); otherwise one is made from ``config.rules``.
    """
    if policy is None:
        policy = ChaosPolicy(config.rules)
    listeners = await trio.open_tcp_listeners(config.listen_port, host=config.listen_host)
    ports = tuple(int(listener.socket.getsockname()[1]) for listener in listeners)
    _log.info(
        "chaos.listening",
        host=config.listen_host or "*",
        ports=list(ports),
        upstream=f"{config.upstream_host}:{config.upstream_port}",
        seed=policy.seed,
        rules=_describe_rules(config),
    )
    names = itertools.count(1)

    async def handle(stream: trio.SocketStream) -> None:
        await _relay_connection(stream, config, policy, f"c{next(names)}")

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, handle, listeners)
            task_status.started(ChaosRelay(ports, policy))
    finally:
        _log.info("chaos.summary", **policy.summary_fields())


def _describe_rules(config: ChaosConfig) -> dict[str, object]:
    rules = config.rules
    described: dict[str, object] = {
        name: getattr(rules, name)
        for name in (
            "drop_every",
            "drop_probability",
            "duplicate_every",
            "duplicate_probability",
            "delay_every",
            "delay_probability",
            "kill_every",
        )
        if getattr(rules, name)
    }
    if rules.delay_every or rules.delay_probability:
        described["delay_seconds"] = rules.delay_seconds
        described["delay_in_order"] = config.delay_in_order
    described["apis"] = sorted(api_label(key) for key in rules.apis) or "all"
    return described
