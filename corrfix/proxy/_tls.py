"""TLS for either side of the proxy, in any combination with plaintext.

The client side (``--tls-cert``) terminates TLS from clients, optionally requiring a client
certificate signed by ``--tls-client-ca``. The upstream side (``--upstream-tls``) opens TLS
to the broker, verifying it against ``--upstream-ca`` (or the system's CAs), with SNI and
optionally a client certificate of its own. The repair machine always sees plaintext.

Contexts are built once per configuration, when the proxy starts, so a missing file or a
bad key stops it at once instead of failing every connection. They are built again when the
files change (a certificate rotated by cert-manager or an ACME client) and at SIGHUP; a new
set that cannot be loaded is logged and the one in use stays, so a bad rotation does not take
TLS down while corrfix runs (a restart with such files fails, as any start-up does).
Connections already open keep the session they have. A peer speaking the other
protocol is named in the log: a ClientHello on a plaintext listener, plaintext on a TLS
listener, a plaintext broker behind ``--upstream-tls`` and a TLS broker without it.

TLS has no half-close that a Kafka broker would notice (``close_notify`` ends the whole
session), so a client's end of stream is not passed on to a TLS upstream: the upstream
connection is closed once every outstanding request is answered instead.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import trio

from corrfix.core._tls_hints import HANDSHAKE_RECORD

"""First byte of every TLS ClientHello (record type handshake); a Kafka frame starts with a size."""
_SSL_SOURCE = re.compile(r"\s*\(_ssl\.c:\d+\)$")
TLS_RELOAD_INTERVAL = 10.0
"""How often the proxy looks at its certificate, key and CA files for a rotation."""


class TlsError(ValueError):
    """A TLS setting cannot be used: a missing file, a bad certificate or key, a bad combination."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS settings of both sides; each side is plaintext unless configured."""

    certfile: Path | None = None
    """Certificate chain (PEM) presented to clients; set means clients must speak TLS."""
    keyfile: Path | None = None
    """Private key for ``certfile`` (None: the key is in ``certfile``)."""
    client_ca: Path | None = None
    """CA bundle that client certificates must chain to (None: no client certificate asked for)."""
    upstream_tls: bool = False
    """Speak TLS to the broker."""
    upstream_cafile: Path | None = None
    """CA bundle that verifies the broker (None: the system's default CAs)."""
    upstream_server_hostname: str | None = None
    """SNI and the name the broker's certificate must carry (None: the host connected to)."""
    upstream_certfile: Path | None = None
    """Client certificate for brokers that require mutual TLS."""
    upstream_keyfile: Path | None = None
    upstream_check_hostname: bool = True
    """Check the broker's certificate names its host; the chain is verified either way."""

    def __post_init__(self) -> None:
        if self.certfile is None:
            for name in ("keyfile", "client_ca"):
                if getattr(self, name) is not None:
                    raise TlsError(f"{_OPTION[name]} needs {_OPTION['certfile']}")
        if not self.upstream_tls:
            for name in ("upstream_cafile", "upstream_server_hostname", "upstream_certfile"):
                if getattr(self, name) is not None:
                    raise TlsError(f"{_OPTION[name]} needs {_OPTION['upstream_tls']}")
            if not self.upstream_check_hostname:
                raise TlsError(f"{_OPTION['upstream_check_hostname']} needs {_OPTION['upstream_tls']}")
        if self.upstream_keyfile is not None and self.upstream_certfile is None:
            raise TlsError(f"{_OPTION['upstream_keyfile']} needs {_OPTION['upstream_certfile']}")

    @property
    def client_side(self) -> bool:
        """Clients must speak TLS."""
        return self.certfile is not None


_OPTION = {
    "certfile": "--tls-cert",
    "keyfile": "--tls-key",
    "client_ca": "--tls-client-ca",
    "upstream_tls": "--upstream-tls",
    "upstream_cafile": "--upstream-ca",
    "upstream_server_hostname": "--upstream-server-name",
    "upstream_certfile": "--upstream-cert",
    "upstream_keyfile": "--upstream-key",
    "upstream_check_hostname": "--upstream-no-check-hostname",
}


# -- contexts ------------------------------------------------------------------------------


def listener_context(config: TlsConfig) -> ssl.SSLContext | None:
    """The server-side context clients handshake with, or None for a plaintext listener."""
    if config.certfile is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, config.certfile, config.keyfile, "--tls-cert", "--tls-key")
    if config.client_ca is not None:
        # Only this CA: the system's CAs must not vouch for clients.
        _load_ca(context, config.client_ca, "--tls-client-ca")
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def upstream_context(config: TlsConfig) -> ssl.SSLContext | None:
    """The client-side context for the broker connection, or None for plaintext."""
    if not config.upstream_tls:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if config.upstream_cafile is None:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        _load_ca(context, config.upstream_cafile, "--upstream-ca")
    context.check_hostname = config.upstream_check_hostname  # CERT_REQUIRED stays either way
    if config.upstream_certfile is not None:
        _load_chain(
            context, config.upstream_certfile, config.upstream_keyfile, "--upstream-cert", "--upstream-key"
        )
    return context


class TlsContexts(NamedTuple):
    listener: ssl.SSLContext | None
    upstream: ssl.SSLContext | None


_FileState = tuple[int, int, int, int, int] | None
"""A file's device, inode, size, and modification and change times (None: it cannot be
read now). The change time moves with a new mode or owner too: a file made readable."""


def _file_state(path: Path) -> _FileState:
    try:
        st = os.stat(path)  # through symlinks: Kubernetes swaps the link to a secret's new files
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class TlsContextStore:
    """One configuration's contexts, shared by every connection, and their files' state.

    :meth:`check` is called every ``TLS_RELOAD_INTERVAL``: once the files have changed and
    then held still for ``settle`` seconds (a certificate and its key are rarely replaced in
    one step), the contexts are built again. Files that could not be loaded are tried again
    at every check, since what fixes them may not show in their state (a freed descriptor).
    :meth:`reload` builds them at once (SIGHUP).
    """

    def __init__(self, config: TlsConfig) -> None:
        self.config = config
        self.paths = tuple(
            path
            for path in (
                config.certfile,
                config.keyfile,
                config.client_ca,
                config.upstream_cafile,
                config.upstream_certfile,
                config.upstream_keyfile,
            )
            if path is not None
        )
        self._loaded = self._state()
        self._changed_to: tuple[_FileState, ...] | None = None  # a change seen, not loaded yet
        self._changed_at = 0.0
        self.current = self._build()  # raises TlsError: a bad file stops the proxy at start
        self.reloads = 0
        self.failures = 0
        self.failing = False
        """The files on disk could not be loaded, at the last try: those in use are older."""
        self._error = ""

    def _state(self) -> tuple[_FileState, ...]:
        return tuple(_file_state(path) for path in self.paths)

    def _build(self) -> TlsContexts:
        return TlsContexts(listener_context(self.config), upstream_context(self.config))

    def check(self, log: Any, now: float, settle: float) -> bool:
        """Reload if the files changed and have then held still for ``settle`` seconds, or if
        the last try failed; True if new contexts are in use."""
        state = self._state()
        if state == self._loaded:
            self._changed_to = None
            return self.failing and self.reload(log, reason="retry")
        if state != self._changed_to:  # just changed, or still changing: wait for it to settle
            self._changed_to, self._changed_at = state, now
            return False
        if now - self._changed_at < settle:
            return False
        return self.reload(log, reason="files changed")

    def reload(self, log: Any, reason: str = "SIGHUP") -> bool:
        """Build the contexts from the files now; if that fails, keep those in use."""
        self._loaded, self._changed_to = self._state(), None
        try:
            fresh = self._build()
        except TlsError as exc:
            self.failures += 1
            self.failing = True
            if str(exc) != self._error:  # a retry that fails the same way says nothing new
                self._error = str(exc)
                log.error(
                    "TLS files not reloaded: the ones loaded before stay in use",
                    reason=reason,
                    error=str(exc),
                )
            return False
        self.current = fresh
        self.reloads += 1
        self.failing, self._error = False, ""
        log.info("TLS files reloaded", reason=reason, files=[str(path) for path in self.paths])
        return True


_stores: dict[TlsConfig, TlsContextStore] = {}


def tls_store(config: TlsConfig) -> TlsContextStore:
    """The store of this configuration's contexts, made (and every file read) on first use."""
    store = _stores.get(config)
    if store is None:
        store = _stores[config] = TlsContextStore(config)
    return store


def contexts(config: TlsConfig) -> TlsContexts:
    """Both contexts in use for this configuration, shared by every connection."""
    return tls_store(config).current


def _check_file(path: Path | str, option: str) -> None:
    path = Path(path)  # a str from a caller building TlsConfig by hand works too
    if not path.is_file():
        problem = "does not exist" if not path.exists() else "is not a file"
        raise TlsError(f"{option} {path}: {problem}")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise TlsError(f"{option} {path}: {exc.strerror or exc}") from exc


def _load_chain(
    context: ssl.SSLContext, certfile: Path, keyfile: Path | None, cert_option: str, key_option: str
) -> None:
    _check_file(certfile, cert_option)
    if keyfile is not None:
        _check_file(keyfile, key_option)
    files = f"{cert_option} {certfile}" + (f" / {key_option} {keyfile}" if keyfile else "")
    try:
        context.load_cert_chain(certfile, keyfile)
    except ssl.SSLError as exc:
        raise TlsError(f"{files}: not a usable PEM certificate and matching key ({ssl_reason(exc)})") from exc
    except OSError as exc:  # replaced or made unreadable since it was checked (a rotation under way)
        raise TlsError(f"{files}: {exc.strerror or exc}") from exc


def _load_ca(context: ssl.SSLContext, cafile: Path, option: str) -> None:
    _check_file(cafile, option)
    try:
        context.load_verify_locations(cafile=cafile)
    except ssl.SSLError as exc:
        raise TlsError(f"{option} {cafile}: not a PEM CA bundle ({ssl_reason(exc)})") from exc
    except OSError as exc:  # replaced or made unreadable since it was checked
        raise TlsError(f"{option} {cafile}: {exc.strerror or exc}") from exc


# -- handshakes ----------------------------------------------------------------------------


def ssl_reason(exc: BaseException) -> str:
    """The readable part of an ssl error, without CPython's source location."""
    return _SSL_SOURCE.sub("", str(exc)) or type(exc).__name__


def _handshake_failure(exc: BaseException) -> tuple[str, bool]:
    """(reason, whether the peer just closed) for a failed ``do_handshake``."""
    cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else exc
    if cause is None or isinstance(cause, ssl.SSLEOFError | ssl.SSLZeroReturnError | ConnectionError):
        return "peer closed the connection during the handshake", True
    return ssl_reason(cause), False


async def accept_client(
    stream: trio.SocketStream, config: TlsConfig | None, timeout: float, log: Any
) -> trio.abc.Stream | None:
    """``stream`` itself on a plaintext listener, else the TLS stream once the client's handshake
    is done within ``timeout``; None (logged, the caller closes ``stream``) if it is not.

    The first byte is peeked first, so plaintext Kafka on this listener is named as such
    rather than as whatever OpenSSL makes of a size prefix.
    """
    context = None if config is None else contexts(config).listener
    if context is None:
        return stream
    tls = trio.SSLStream(stream, context, server_side=True, https_compatible=False)
    reason: str | None = None
    with trio.move_on_after(timeout) as scope:
        try:
            first = await stream.socket.recv(1, socket.MSG_PEEK)
            if not first:
                reason = "client closed before the handshake"
            elif first[0] != HANDSHAKE_RECORD:
                reason = (
                    f"not a TLS handshake (first byte 0x{first[0]:02x}): plaintext Kafka on a TLS listener? "
                    "The client needs security.protocol=SSL"
                )
            else:
                await tls.do_handshake()
                return tls
        except (trio.BrokenResourceError, OSError) as exc:
            reason = _handshake_failure(exc)[0]
    if scope.cancelled_caught:
        reason = f"no TLS handshake within {timeout:g}s"
    log.warning("TLS handshake with client failed", reason=reason)
    return None


async def connect_upstream(
    stream: trio.SocketStream, config: TlsConfig | None, host: str, timeout: float, log: Any
) -> trio.abc.Stream | None:
    """``stream`` itself for a plaintext broker, else the TLS stream once the handshake with
    ``host`` is done within ``timeout``; None (logged, ``stream`` closed) if it is not.

    Cancelled mid-handshake (the proxy stopping), it closes ``stream`` too: the caller gets
    no stream back to close, and a socket left to the garbage collector is a leak warning.
    """
    context = None if config is None else contexts(config).upstream
    if context is None:
        return stream
    assert config is not None
    server_hostname = config.upstream_server_hostname or host
    tls = trio.SSLStream(stream, context, server_hostname=server_hostname, https_compatible=False)
    reason: str | None = None
    with trio.move_on_after(timeout) as scope:
        try:
            await tls.do_handshake()
            return tls
        except (trio.BrokenResourceError, OSError) as exc:
            reason, closed = _handshake_failure(exc)
            if closed:
                reason = (
                    "the broker closed the connection during the TLS handshake: "
                    "a plaintext listener? (drop --upstream-tls)"
                )
            elif "WRONG_VERSION_NUMBER" in reason or "record layer failure" in reason:
                reason += ": a plaintext listener? (drop --upstream-tls)"
        except BaseException:  # Cancelled; after the timeout the close below finds it closed
            stream.socket.close()
            raise
    if scope.cancelled_caught:
        reason = f"no TLS handshake answer within {timeout:g}s: a plaintext listener? (drop --upstream-tls)"
    log.error("TLS handshake with upstream failed", server_hostname=server_hostname, reason=reason)
    await trio.aclose_forcefully(stream)
    return None


# -- the other protocol on a plaintext side ------------------------------------------------


# -- command line --------------------------------------------------------------------------


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--tls-*`` and ``--upstream-tls`` options of ``corrfix proxy``."""
    clients = parser.add_argument_group("TLS with clients (plaintext unless --tls-cert)")
    clients.add_argument(
        "--tls-cert",
        type=Path,
        metavar="FILE",
        help="certificate chain (PEM) clients see; clients must use TLS",
    )
    clients.add_argument(
        "--tls-key",
        type=Path,
        metavar="FILE",
        help="private key (PEM) of --tls-cert (default: in --tls-cert)",
    )
    clients.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="FILE",
        help="require client certificates signed by this CA bundle (mutual TLS)",
    )
    upstream = parser.add_argument_group("TLS with the brokers (plaintext unless --upstream-tls)")
    upstream.add_argument("--upstream-tls", action="store_true", help="connect to the brokers with TLS")
    upstream.add_argument(
        "--upstream-ca",
        type=Path,
        metavar="FILE",
        help="CA bundle (PEM) that verifies the brokers (default: the system's CAs)",
    )
    upstream.add_argument(
        "--upstream-server-name",
        metavar="NAME",
        help="SNI and the name every broker certificate must carry (default: each broker's host)",
    )
    upstream.add_argument(
        "--upstream-cert",
        type=Path,
        metavar="FILE",
        help="client certificate (PEM) for brokers that require one",
    )
    upstream.add_argument(
        "--upstream-key",
        type=Path,
        metavar="FILE",
        help="private key (PEM) of --upstream-cert (default: in --upstream-cert)",
    )
    upstream.add_argument(
        "--upstream-no-check-hostname",
        dest="upstream_check_hostname",
        action="store_false",
        help="accept a broker certificate for another name (the chain is still verified)",
    )


def tls_config_from_args(args: argparse.Namespace) -> TlsConfig | None:
    """The TLS settings, checked and loaded once; None when both sides are plaintext.

    Raises :class:`TlsError` (a ValueError) naming the option at fault.
    """
    config = TlsConfig(
        certfile=args.tls_cert,
        keyfile=args.tls_key,
        client_ca=args.tls_client_ca,
        upstream_tls=args.upstream_tls,
        upstream_cafile=args.upstream_ca,
        upstream_server_hostname=args.upstream_server_name,
        upstream_certfile=args.upstream_cert,
        upstream_keyfile=args.upstream_key,
        upstream_check_hostname=args.upstream_check_hostname,
    )
    if config == TlsConfig():
        return None
    contexts(config)  # every file is read now, not at the first connection
    return config
