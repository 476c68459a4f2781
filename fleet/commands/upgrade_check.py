"""``manage.py fleet_upgrade_check``: before migrating, what the migrations will do and whether
every enrolled agent will be served by this (new) code.

It runs with the new code against the old database, so it reads the hosts without the model
where a column the new code added is not there yet: an agent's protocol then comes from its
release (:data:`hostagent.protocol.AGENT_RELEASES`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from fleet.agents.versions import protocol_sentence
from fleet.inventory.models import Host
from hostagent import protocol


@dataclass(frozen=True)
class PendingMigration:
    name: str  # app_label.migration_name
    operations: list[str]  # Operation.describe() of each
    reversible: bool


@dataclass(frozen=True)
class AgentCheck:
    host: str
    status: str
    agent_version: str
    protocol: int | None  # None: neither said nor a known release
    problem: str  # empty: served


def pending_migrations() -> list[PendingMigration]:
    """The migrations ``migrate`` would apply, in order."""
    executor = MigrationExecutor(connection)
    targets = executor.loader.graph.leaf_nodes()
    pending = []
    for migration, backwards in executor.migration_plan(targets):
        if backwards:
            continue
        operations = [op.describe() for op in migration.operations]
        reversible = all(op.reversible for op in migration.operations)
        pending.append(
            PendingMigration(f"{migration.app_label}.{migration.name}", operations, reversible)
        )
    return pending


def _columns(table: str) -> set[str] | None:
    with connection.cursor() as cursor:
        if table not in connection.introspection.table_names(cursor):
            return None
        return {c.name for c in connection.introspection.get_table_description(cursor, table)}


def agent_checks() -> list[AgentCheck]:
    """Every host whose agent has said hello, and whether this code's server serves it."""
    columns = _columns(Host._meta.db_table)
    if columns is None:
        return []  # a database never migrated: no hosts
    fields = ["name", "status", "agent_version"]
    said = "agent_protocol" in columns
    rows = Host.objects.exclude(agent_version="").order_by("name")
    checks = []
    for row in rows.values(*fields, *(["agent_protocol"] if said else [])):
        version = str(row["agent_version"])
        spoken = int(row["agent_protocol"]) if said else None
        known = spoken if spoken is not None else protocol.AGENT_RELEASES.get(version)
        if known is None:
            problem = f"Agent {version} is not a known release: check it by hand."
        else:
            problem = protocol_sentence(agent_version=version, agent_protocol=known) or ""
        checks.append(AgentCheck(row["name"], row["status"], version, known, problem))
    return checks


def upgrade_report() -> dict[str, Any]:
    """What the command prints as JSON; ``ok`` is false when an agent would be refused."""
    agents = agent_checks()
    refused = [a for a in agents if a.problem and a.protocol is not None]
    unknown = [a for a in agents if a.protocol is None]
    return {
        "server_protocol": protocol.PROTOCOL_VERSION,
        "served_protocols": [protocol.OLDEST_PROTOCOL, protocol.PROTOCOL_VERSION],
        "migrations": [asdict(m) for m in pending_migrations()],
        "agents": {
            "total": len(agents),
            "served": len(agents) - len(refused) - len(unknown),
            "refused": [asdict(a) for a in refused],
            "unknown": [asdict(a) for a in unknown],
        },
        "ok": not refused,
    }
