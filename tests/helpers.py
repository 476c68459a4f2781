"""Assertions shared by API tests."""

from __future__ import annotations

from typing import Any

from fleet.allocations.models import Allocation, Deployment
from fleet.inventory.models import Gpu, Host
from fleet.partitioning.models import Operation, Partition


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
