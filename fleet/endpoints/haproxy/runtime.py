"""HAProxy's Runtime API (the ``stats socket`` at level admin): one command per connection, each
bounded in time and in the size of its answer.

Only words the CLI reads as words are ever sent: :func:`check_word` refuses spaces, ``;`` (the
CLI's command separator), ``#``, backslashes and control characters in any argument, so a name
or an address can never become a second command.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path

MAX_ANSWER_BYTES = 8 * 2**20
_WORD = re.compile(r"^[0-9A-Za-z._:/\[\]@-]{1,255}$")


class RuntimeApiError(RuntimeError):
    """HAProxy refused a command, or could not be reached."""


def check_word(word: str) -> str:
    if not _WORD.match(word):
        raise RuntimeApiError(f"{word[:40]!r} is not a word the Runtime API may be sent")
    return word


class RuntimeApi:
    """A client of one HAProxy's Runtime API, on a UNIX socket path or ``host:port``."""

    def __init__(self, address: str | Path, timeout_s: float = 2.0) -> None:
        self.address = address
        self.timeout_s = timeout_s

    def _connect(self) -> socket.socket:
        text = str(self.address)
        if isinstance(self.address, Path) or text.startswith("/"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: object = text
        else:
            host, _, port = text.rpartition(":")
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            target = (host.strip("[]"), int(port))
        sock.settimeout(self.timeout_s)
        try:
            sock.connect(target)  # type: ignore[arg-type]
        except OSError as exc:
            sock.close()
            raise RuntimeApiError(
                f"HAProxy's Runtime API at {text} cannot be reached: {exc}"
            ) from exc
        return sock

    def command(self, *words: str) -> str:
        """Send one command; its answer, as text. HAProxy closes the connection after it."""
        line = " ".join(check_word(w) for w in words)
        with self._connect() as sock:
            try:
                sock.sendall(line.encode() + b"\n")
                chunks, size = [], 0
                while chunk := sock.recv(65536):
                    size += len(chunk)
                    if size > MAX_ANSWER_BYTES:
                        raise RuntimeApiError(f"{words[0]} {words[1:2]}: answer over 8 MiB")
                    chunks.append(chunk)
            except TimeoutError as exc:
                raise RuntimeApiError(
                    f"{line[:60]}: no answer within {self.timeout_s:g} s"
                ) from exc
            except OSError as exc:
                raise RuntimeApiError(f"{line[:60]}: {exc}") from exc
        return b"".join(chunks).decode("utf-8", "replace")


@dataclass(frozen=True)
class ServerState:
    """One server as ``show servers state`` has it."""

    backend: str
    name: str
    address: str
    port: int
    up: bool  # its operational state: its check passes (or it has none)
    maint: bool
    drain: bool


# srv_admin_state bits (HAProxy's SRV_ADMF_*): forced, inherited, configuration and resolution
# maintenance; forced and inherited drain.
_MAINT_BITS = 0x01 | 0x02 | 0x04 | 0x20
_DRAIN_BITS = 0x08 | 0x10


def servers_state(api: RuntimeApi) -> list[ServerState]:
    """Every server of every backend."""
    rows = []
    for line in api.command("show", "servers", "state").splitlines():
        fields = line.split()
        if len(fields) < 19 or line.startswith("#"):
            continue
        try:
            admin = int(fields[6])
            rows.append(
                ServerState(
                    backend=fields[1],
                    name=fields[3],
                    address=fields[4],
                    port=int(fields[18]),
                    up=fields[5] == "2",
                    maint=bool(admin & _MAINT_BITS),
                    drain=bool(admin & _DRAIN_BITS),
                )
            )
        except ValueError:
            continue
    return rows


def map_entries(api: RuntimeApi, path: Path) -> dict[str, str]:
    """The entries of a map file as HAProxy holds them (``show map <file>``)."""
    entries = {}
    for line in api.command("show", "map", str(path)).splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0].startswith("0x"):
            entries[fields[1]] = fields[2]
    return entries


@dataclass(frozen=True)
class Counters:
    """One server (or a backend as a whole: ``server`` is ``BACKEND``) as ``show stat`` has it.
    ``requests`` and ``errors_5xx`` count from the server's creation; ``response_ms`` is
    HAProxy's average over the last 1,024 requests (0 before the first)."""

    backend: str
    server: str
    in_flight: int  # scur: requests being served
    queued: int  # qcur: requests waiting for a connection slot
    requests: int  # req_tot
    errors_5xx: int  # hrsp_5xx
    response_ms: int  # rtime
    status: str  # UP, DOWN, DRAIN, MAINT, no check, ...


def read_counters(api: RuntimeApi) -> list[Counters]:
    """Every server and backend of ``show stat`` (frontends left out); a row HAProxy writes in
    another shape is skipped, never guessed."""
    lines = api.command("show", "stat").splitlines()
    if not lines or not lines[0].startswith("# "):
        return []
    header = lines[0][2:].split(",")
    names = ("pxname", "svname", "scur", "qcur", "req_tot", "hrsp_5xx", "rtime", "status")
    try:
        px, sv, scur, qcur, req, err, rtime, status = (header.index(n) for n in names)
    except ValueError:
        return []
    rows = []
    for line in lines[1:]:
        fields = line.split(",")
        if len(fields) < len(header) - 1 or fields[sv] == "FRONTEND":
            continue
        try:
            rows.append(
                Counters(
                    backend=fields[px],
                    server=fields[sv],
                    in_flight=int(fields[scur] or 0),
                    queued=int(fields[qcur] or 0),
                    requests=int(fields[req] or 0),
                    errors_5xx=int(fields[err] or 0),
                    response_ms=int(fields[rtime] or 0),
                    status=fields[status],
                )
            )
        except ValueError:
            continue
    return rows


def server_sessions(api: RuntimeApi) -> dict[tuple[str, str], int]:
    """The requests each server holds now (``show stat``'s ``scur``)."""
    return {
        (row.backend, row.server): row.in_flight
        for row in read_counters(api)
        if row.server != "BACKEND"
    }
