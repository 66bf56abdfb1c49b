"""``corrfix chaos``: the command line of the chaos relay, and running it until a signal."""

from __future__ import annotations

import argparse
import signal

import structlog
import trio

from corrfix._argtypes import count as _count
from corrfix._argtypes import positive as _positive
from corrfix._argtypes import positive_size as _positive_size
from corrfix._argtypes import probability as _probability
from corrfix._argtypes import seconds as _seconds
from corrfix.chaos._policy import ChaosPolicy, ChaosRules, parse_api_keys
from corrfix.chaos._relay import ChaosConfig, serve_chaos
from corrfix.core import LOOPBACK, parse_host_port
from protocol import DEFAULT_MAX_FRAME_SIZE

_log = structlog.get_logger("corrfix.chaos")


async def run_chaos(config: ChaosConfig, *, handle_signals: bool = True) -> None:
    """Serve until cancelled, or until SIGINT/SIGTERM when ``handle_signals`` (main thread
    only), then print the summary of what was done. A signal ends it normally, with no
    KeyboardInterrupt traceback, so the summary is the last thing an operator sees."""
    policy = ChaosPolicy(config.rules)
    try:
        async with trio.open_nursery() as nursery:
            if handle_signals:
                nursery.start_soon(_stop_on_signal, nursery.cancel_scope)
            await serve_chaos(config, policy=policy)
    finally:
        print(policy.summary(), flush=True)


async def _stop_on_signal(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            _log.info("chaos.stopping", signal=signal.Signals(signum).name)
            scope.cancel()
            return


def _host_port(text: str) -> tuple[str | None, int]:
    try:
        return parse_host_port(text, default_host=LOOPBACK)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _apis(text: str) -> frozenset[int]:
    try:
        return parse_api_keys([text])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_chaos_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``corrfix chaos``; the CLI mounts them on its subcommand parser."""
    where = parser.add_argument_group("addresses")
    where.add_argument(
        "--listen", required=True, type=_host_port, metavar="HOST:PORT", help="where clients connect"
    )
    where.add_argument(
        "--upstream", required=True, type=_host_port, metavar="HOST:PORT", help="the broker to relay to"
    )
    faults = parser.add_argument_group(
        "faults (responses only; 0 = off; several faults on one response: drop > duplicate > delay)"
    )
    faults.add_argument("--drop-every", type=_count, default=0, metavar="N", help="drop every Nth response")
    faults.add_argument(
        "--drop-probability",
        type=_probability,
        default=0.0,
        metavar="P",
        help="drop with probability P",
    )
    faults.add_argument(
        "--duplicate-every", type=_count, default=0, metavar="N", help="send every Nth response twice"
    )
    faults.add_argument(
        "--duplicate-probability",
        type=_probability,
        default=0.0,
        metavar="P",
        help="send twice with probability P",
    )
    faults.add_argument("--delay-every", type=_count, default=0, metavar="N", help="delay every Nth response")
    faults.add_argument(
        "--delay-probability",
        type=_probability,
        default=0.0,
        metavar="P",
        help="delay with probability P",
    )
    faults.add_argument(
        "--delay-seconds",
        type=_seconds,
        default=1.0,
        metavar="S",
        help="how long to delay (default 1.0)",
    )
    faults.add_argument(
        "--delay-in-order",
        action="store_true",
        help="a delayed response also holds back the later ones on its connection "
        "(default: later responses overtake it, i.e. out-of-order delivery)",
    )
    faults.add_argument(
        "--kill-every",
        type=_count,
        default=0,
        metavar="N",
        help="close both sides of a connection after every Nth response overall (ignores --api)",
    )
    faults.add_argument(
        "--api",
        action="append",
        type=_apis,
        default=[],
        metavar="KEY",
        help="only damage responses of these apis: number, name (Produce, fetch, ...) or 'unknown' "
        "for stray replies; repeat or comma-separate (default: all)",
    )
    faults.add_argument(
        "--seed", type=int, default=None, help="seed for the probabilities (default: random, printed)"
    )
    parser.add_argument(
        "--max-frame-size",
        type=_positive_size,
        default=DEFAULT_MAX_FRAME_SIZE,
        metavar="BYTES",
        help="close a connection that announces a larger frame",
    )
    parser.add_argument(
        "--connect-timeout", type=_positive, default=10.0, metavar="S", help="upstream connect timeout"
    )


def chaos_config_from_args(args: argparse.Namespace) -> ChaosConfig:
    """Turn parsed ``add_chaos_arguments`` options into a :class:`ChaosConfig`."""
    listen_host, listen_port = args.listen
    upstream_host, upstream_port = args.upstream
    apis: frozenset[int] = frozenset().union(*args.api)
    rules = ChaosRules(
        drop_every=args.drop_every,
        drop_probability=args.drop_probability,
        duplicate_every=args.duplicate_every,
        duplicate_probability=args.duplicate_probability,
        delay_every=args.delay_every,
        delay_probability=args.delay_probability,
        delay_seconds=args.delay_seconds,
        kill_every=args.kill_every,
        apis=apis,
        seed=args.seed,
    )
    return ChaosConfig(
        listen_host=listen_host,
        listen_port=listen_port,
        upstream_host=upstream_host or "127.0.0.1",
        upstream_port=upstream_port,
        rules=rules,
        delay_in_order=args.delay_in_order,
        max_frame_size=args.max_frame_size,
        connect_timeout=args.connect_timeout,
    )
