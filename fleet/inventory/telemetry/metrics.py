"""The replicas' own metrics (read by their agents from the workloads' Prometheus endpoints): the
latest reading per replica, kept in the hot store for :data:`READING_TTL_S` seconds.

Only the latest matters (an autoscaling evaluation reads it), so each replica has one entry,
replaced by each tick that carries its readings and gone when the agent stops sending them: a
replica that stopped, or an agent that never read it, has no value, never an old or made-up one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

READING_TTL_S = 60
"""How long a replica's latest readings are kept after the tick that carried them."""


@dataclass(frozen=True, slots=True)
class ReplicaReading:
    """One metric of one replica in one tick: a finite ``value``, or ``None`` and ``error``."""

    allocation_id: int
    name: str
    value: float | None
    error: str


class StoredReading(TypedDict):
    """A reading as the store keeps it (``received_at``: the server's clock)."""

    value: float | None
    error: str
    received_at: float


def as_stored(
    readings: list[ReplicaReading], received_at: float
) -> dict[int, dict[str, StoredReading]]:
    """Readings grouped by replica, then metric name."""
    out: dict[int, dict[str, StoredReading]] = {}
    for r in readings:
        out.setdefault(r.allocation_id, {})[r.name] = StoredReading(
            value=r.value, error=r.error, received_at=received_at
        )
    return out
