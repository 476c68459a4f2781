"""Host ports for replicas: each declared port of a replica gets one of the agent's range
(``--port-range``), unique on the host (see :mod:`hostagent.protocol.ports`).

The supervisor keeps each replica's ports in its record and in the replica store, so a
restarted agent adopts a workload with the ports it was started with. Here only the choice:
pure but for an optional probe that says whether something outside Fleet already binds a
port.
"""

from __future__ import annotations

import socket
import zlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from hostagent.protocol import PortSpec
from hostagent.runtime.base import StartError

DEFAULT_PORT_RANGE = "20000-29999"
DEFAULT_NETWORK = "fleet"
"""The Docker bridge network of containers without the host's network."""
DEFAULT_PUBLISH_ADDRESS = "127.0.0.1"
"""Loopback: a replica's ports are reachable from its own host only, until the operator
publishes them where a load balancer reaches them (``--publish-address``): no workload is
exposed to a network by default."""
MIN_HOST_PORT = 1024
"""Ports below are privileged: no range may include them."""


class PortsExhausted(StartError):
    """No port of the range is free for a replica; it stays ``failed`` with this message and
    is tried again as its restart policy says (another replica's ports may have been freed)."""


@dataclass(frozen=True)
class PortRange:
    """An inclusive range of host ports (``20000-29999``)."""

    first: int
    last: int

    @classmethod
    def parse(cls, text: str) -> PortRange:
        """``"<first>-<last>"``; raises ``ValueError`` saying what is wrong."""
        head, dash, tail = text.strip().partition("-")
        if not dash or not head.isdecimal() or not tail.isdecimal():
            raise ValueError(
                f"expected <first>-<last> (such as {DEFAULT_PORT_RANGE}), not {text!r}"
            )
        first, last = int(head), int(tail)
        if not MIN_HOST_PORT <= first <= last <= 65535:
            raise ValueError(
                f"the range must lie within {MIN_HOST_PORT}-65535, first before last: {text!r}"
            )
        return cls(first, last)

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.first <= port <= self.last

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


def bindable(address: str) -> Callable[[int], bool]:
    """A probe: whether a TCP socket can bind ``address:port`` now (nothing outside Fleet, a
    squatter say, holds it)."""

    def probe(port: int) -> bool:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((address, port))
            except OSError:
                return False
        return True

    return probe


class PortAllocator:
    """Chooses host ports from ``ports`` (the range), skipping those ``probe`` says are taken."""

    def __init__(
        self, ports: PortRange, probe: Callable[[int], bool] | None = None, seed: str = ""
    ) -> None:
        self.range = ports
        self._probe = probe
        # Agents sharing one machine (tests, demos) start at different places of the range.
        size = ports.last - ports.first + 1
        self._next = ports.first + (zlib.crc32(seed.encode()) % size if seed else 0)

    def allocate(
        self, declared: list[PortSpec], kept: Mapping[str, int], taken: Collection[int]
    ) -> dict[str, int]:
        """A host port for each of ``declared``: the one ``kept`` gives it (the replica had it
        already), else a free one of the range not in ``taken`` (other replicas' ports).
        Ports are handed out round-robin, so a port just freed is the last to be reused.

        Raises:
            PortsExhausted: the range holds no free port for one of them (nothing is given).
        """
        chosen = {p["name"]: kept[p["name"]] for p in declared if p["name"] in kept}
        busy = set(taken) | set(chosen.values())
        size = self.range.last - self.range.first + 1
        for spec in declared:
            if spec["name"] in chosen:
                continue
            port = self._free(busy, size)
            if port is None:
                raise PortsExhausted(
                    f"no free host port for {spec['name']!r} in --port-range {self.range}: "
                    f"{len(busy)} taken; widen the range or run fewer replicas here"
                )
            chosen[spec["name"]] = port
            busy.add(port)
        return chosen

    def _free(self, busy: set[int], size: int) -> int | None:
        for step in range(size):
            port = self.range.first + (self._next - self.range.first + step) % size
            if port in busy or (self._probe is not None and not self._probe(port)):
                continue
            self._next = port + 1 if port < self.range.last else self.range.first
            return port
        return None
