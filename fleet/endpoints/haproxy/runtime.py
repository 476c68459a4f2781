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


def server_sessions(api: RuntimeApi) -> dict[tuple[str, str], int]:
    """The connections each server holds now (``show stat``'s ``scur``)."""
    out: dict[tuple[str, str], int] = {}
    lines = api.command("show", "stat").splitlines()
    if not lines or not lines[0].startswith("# "):
        return out
    header = lines[0][2:].split(",")
    try:
        px, sv, scur = header.index("pxname"), header.index("svname"), header.index("scur")
    except ValueError:
        return out
    for line in lines[1:]:
        fields = line.split(",")
        if len(fields) > scur and fields[sv] not in ("FRONTEND", "BACKEND"):
            out[(fields[px], fields[sv])] = int(fields[scur] or 0)
    return out
