"""HTTP from the server to an address a user gave (a webhook's receiver, an image registry):
one deadline for the whole exchange, no local destination unless an admin allows it, and the
connection goes to the address that was checked.

* **One deadline**: the name lookup, the connection, TLS, the request and the whole answer end
  at ``deadline`` (a :func:`time.monotonic` instant), however slowly the other side trickles.
  The lookup runs in a thread of its own, so a resolver that hangs costs the deadline only.
* **No local destination**: loopback, link-local (169.254.169.254, the cloud metadata
  service), private (RFC 1918, IPv6 ULA, shared 100.64/10), unspecified and multicast
  addresses, every one that is not globally routable, are refused (:class:`RefusedDestination`)
  unless ``allow_private``; a name is refused whole if any of its addresses is local.
* **No DNS rebinding**: the request connects to the very addresses that were checked, never
  resolving again; the ``Host`` header and TLS's SNI and certificate name the URL's host.
  Proxy variables (``HTTPS_PROXY``) are not used. Redirects are answers, not followed.
"""

from __future__ import annotations

import http.client
import io
import ipaddress
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Besides what ipaddress classifies: "this network" (Linux connects 0.x.x.x locally) and the
# AWS metadata service's IPv6 address.
_LOCAL_NETWORKS = (ipaddress.ip_network("0.0.0.0/8"), ipaddress.ip_network("fd00:ec2::254/128"))


class RefusedDestination(ValueError):
    """The host is, or resolves to, an address that is never a public service's."""


@dataclass(frozen=True)
class Guard:
    """The rules of one kind of outbound call, and how its refusals name them.

    Attributes:
        allow_private: local addresses may be reached (an admin's setting).
        purpose: what the destination would do, for messages ("receive webhooks").
        allow_setting: the setting that lifts the refusal, named in its message.
        timeout_setting: the setting that bounds the exchange, named in a timeout's message.
    """

    allow_private: bool
    purpose: str
    allow_setting: str
    timeout_setting: str


@dataclass(frozen=True)
class Answer:
    """An HTTP answer: its status, its headers (names lower-cased) and its body's first bytes."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def is_local_address(address: IpAddress) -> bool:
    """Not a public service's: loopback, link-local (169.254.169.254, the cloud metadata
    service, included), private (RFC 1918, ULA, 100.64/10), unspecified, multicast or any
    other address that is not globally routable."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (
        not address.is_global
        or address.is_loopback
        or address.is_link_local
        or address.is_unspecified
        or address.is_multicast
        or any(address in network for network in _LOCAL_NETWORKS)
    )


def names_local_address(host: str) -> bool:
    """Whether a URL's host is ``localhost`` (or a name under it) or an IP literal that
    :func:`is_local_address` refuses, in any spelling a resolver takes (``127.1``,
    ``2130706433``). Other names are checked when called, once resolved."""
    host = host.lower().rstrip(".").strip("[]")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return is_local_address(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return is_local_address(ipaddress.IPv4Address(socket.inet_aton(host)))
    except (OSError, ValueError):
        return False


def left(deadline: float, guard: Guard) -> float:
    """Seconds left before the deadline; a timeout once none are."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError(f"no complete answer within {guard.timeout_setting}")
    return remaining


def _lookup(host: str, port: int, deadline: float, guard: Guard) -> list[Any]:
    """``socket.getaddrinfo`` in a thread of its own, waited for until the deadline."""
    found: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            found.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except BaseException as exc:  # handed to the caller
            failed.append(exc)

    worker = threading.Thread(target=run, name=f"lookup {host}", daemon=True)
    worker.start()
    worker.join(left(deadline, guard))
    if worker.is_alive():
        raise TimeoutError(f"looking up {host} took longer than {guard.timeout_setting}")
    if failed:
        raise failed[0]
    return found


def addresses(host: str, port: int, deadline: float, guard: Guard) -> list[tuple[int, Any]]:
    """Every address the host resolves to, as ``(family, sockaddr)`` to connect to; refused
    whole if any is local (a name with a public and a local address could reach the local one
    when the public one fails), unless ``guard.allow_private``."""
    found: list[tuple[int, Any]] = []
    for family, _, _, _, sockaddr in _lookup(host, port, deadline, guard):
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        if not guard.allow_private and is_local_address(ipaddress.ip_address(sockaddr[0])):
            raise RefusedDestination(
                f"{host} resolves to {sockaddr[0]}: private, loopback, link-local, unspecified "
                f"and multicast addresses cannot {guard.purpose} ({guard.allow_setting})"
            )
        if (family, sockaddr) not in found:
            found.append((family, sockaddr))
    if not found:
        raise OSError(f"{host} has no IPv4 or IPv6 address")
    return found


def _connect(found: list[tuple[int, Any]], deadline: float, guard: Guard) -> socket.socket:
    """A TCP connection to the first address that answers before the deadline."""
    error: OSError | None = None
    for family, sockaddr in found:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(left(deadline, guard))
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error or OSError("no address to connect to")


class _DeadlineReader(io.RawIOBase):
    """Reads from the socket, each read waiting at most until the deadline."""

    def __init__(self, sock: socket.socket, deadline: float, guard: Guard) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline
        self._guard = guard

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(left(self._deadline, self._guard))
        return self._sock.recv_into(buffer)


class _DeadlineSocket:
    """What :mod:`http.client` is given as its connection's socket: sends and reads (the
    status line and headers included) end at the deadline, however slowly bytes come.
    Closing is the caller's (see :func:`http_request`)."""

    def __init__(self, sock: socket.socket, deadline: float, guard: Guard) -> None:
        self._sock = sock
        self._deadline = deadline
        self._guard = guard

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(left(self._deadline, self._guard))  # the whole sendall
        self._sock.sendall(data)

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline, self._guard))

    def close(self) -> None:
        pass


def http_request(
    method: str,
    url: str,
    *,
    headers: dict[str, str],
    deadline: float,
    guard: Guard,
    body: bytes | None = None,
    max_body: int = 1024,
) -> Answer:
    """One HTTP exchange with ``url`` (http or https), all of it before ``deadline``; the
    answer's body is read up to ``max_body`` bytes.

    Raises:
        RefusedDestination: the host is, or resolves to, a local address (see the module).
        TimeoutError, OSError, ssl.SSLError, http.client.HTTPException: no whole answer.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    sock = _connect(addresses(host, port, deadline, guard), deadline, guard)
    try:
        connection: http.client.HTTPConnection
        if https:
            context = ssl.create_default_context()
            sock.settimeout(left(deadline, guard))  # the handshake as a whole
            sock = context.wrap_socket(sock, server_hostname=host)  # SNI and certificate: the name
            connection = http.client.HTTPSConnection(host, port, context=context)
        else:
            connection = http.client.HTTPConnection(host, port)
        # Given a connected socket, http.client never connects (nor resolves) itself; the Host
        # header names the URL's host.
        connection.sock = _DeadlineSocket(sock, deadline, guard)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        content = b"" if method == "HEAD" else response.read(max_body)
        return Answer(
            int(response.status), {k.lower(): v for k, v in response.getheaders()}, content
        )
    finally:
        sock.close()
