"""Assertions shared by API tests."""

from __future__ import annotations

from typing import Any

from fleet.allocations.models import Allocation, Deployment
from fleet.core.models import Operation
from fleet.inventory.models import Gpu, Host
from fleet.partitioning.models import Partition


def assert_error(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    """The response is the error envelope with this status (and code, when given)."""
    assert response.status_code == status, (
        response.status_code,
        getattr(response, "data", response.content),
    )
    body = response.json()
    assert set(body) == {"code", "message", "details"}, body
    assert isinstance(body["message"], str) and body["message"]
    assert isinstance(body["details"], dict)
    if code is not None:
        assert body["code"] == code, body
    return body


def snapshot_rows() -> dict[str, Any]:
    """Everything a refused write must leave untouched."""
    return {
        "hosts": list(
            Host.objects.values_list("id", "desired_generation", "status").order_by("id")
        ),
        "gpus": list(
            Gpu.objects.values_list("id", "mode", "cordoned", "mig_enabled").order_by("id")
        ),
        "partitions": list(
            Partition.objects.values_list("id", "profile_id", "start", "mps_enabled").order_by("id")
        ),
        "deployments": list(
            Deployment.objects.values_list("id", "name", "replicas").order_by("id")
        ),
        "allocations": list(
            Allocation.objects.values_list("id", "partition_id", "memory_mib").order_by("id")
        ),
        "operations": Operation.objects.count(),
    }


def race(*calls: Any, timeout: float = 30) -> list[object]:
    """Run the calls at the same instant in separate threads (each with its own database
    connection, closed after); a call's :class:`ServiceError` is its outcome. Needs real
    concurrent transactions (PostgreSQL: SQLite serialises writers)."""
    import threading

    from django.db import connections

    from fleet.core.errors import ServiceError

    barrier = threading.Barrier(len(calls))
    outcomes: list[object] = [None] * len(calls)

    def run(i: int, call: Any) -> None:
        try:
            barrier.wait()
            outcomes[i] = call()
        except ServiceError as error:
            outcomes[i] = error
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return outcomes
