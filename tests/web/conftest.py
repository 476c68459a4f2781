"""Fixtures for the dashboard tests: logged-in browsers (Django test clients) per persona, and a
small mixed fleet (MIG, MPS, dedicated) with a placed deployment."""

from __future__ import annotations

from typing import Any

import pytest

PASSWORD = "s3cret-pass-word"


def _signed_in(user: Any) -> Any:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


@pytest.fixture(autouse=True)
def _no_login_failures_counted():
    """Failed sign-ins are counted in the cache, which outlives a test (and, on Redis, a run)."""
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def nobody(db) -> Any:
    """A signed-up user holding no role (no group, not a superuser)."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user("nobody", password=PASSWORD)


@pytest.fixture
def nobody_web(nobody) -> Any:
    return _signed_in(nobody)


@pytest.fixture
def viewer_web(viewer) -> Any:
    return _signed_in(viewer)


@pytest.fixture
def operator_web(operator) -> Any:
    return _signed_in(operator)


@pytest.fixture
def small_fleet(db) -> dict[str, Any]:
    """Three H100s on one host: MIG (balanced, one replica placed), MPS and dedicated."""
    from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
    from fleet.inventory.models import Gpu
    from fleet.partitioning.models import Partition
    from fleet.partitioning.services import gpu_set_layout
    from tests.factories import GpuFactory, HostFactory
    from tests.web.seed import LAYOUTS

    host = HostFactory(name="h100-x01")
    mig, mps, whole = (GpuFactory(host=host, index=i) for i in range(3))
    gpu_set_layout(gpu_id=mig.pk, spec=LAYOUTS[1])
    gpu_set_layout(gpu_id=mps.pk, spec=LAYOUTS[2])
    gpu_set_layout(gpu_id=whole.pk, spec=LAYOUTS[3])
    deployment = deployment_create(
        name="llama-chat", request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=2
    )
    three_g = Partition.objects.get(gpu=mig, profile_name="3g.40gb")
    deployment_place(deployment_id=deployment.pk, partition_id=three_g.pk)
    Gpu.objects.filter(pk=mig.pk).update(
        last_telemetry={
            "uuid": mig.uuid,
            "utilization_gpu_percent": None,
            "memory_used_mib": 30000,
            "memory_total_mib": 81559,
            "temperature_c": 55,
            "power_mw": 250000,
            "processes": [],
            "mig": [],
        }
    )
    return {
        "host": host,
        "mig": mig,
        "mps": mps,
        "whole": whole,
        "deployment": deployment,
        "three_g": three_g,
    }
