"""Fixtures the sharing tests share."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.allocations.models import Allocation
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.teams import team_create, team_quota_set
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory

WHOLE = DeploymentRequest(kind="gpu", gpu_count=1)


@pytest.fixture
def lent_whole(settings: Any) -> dict[str, Any]:
    """Two whole GPUs, both held by *search*: one guaranteed, one borrowed; *ads* (deserved 1)
    waits for one (its deployment *serve*)."""
    settings.FLEET_RECLAIM_MIN_RUNTIME_S = 0
    host = HostFactory()
    gpus = [GpuFactory(host=host) for _ in range(2)]
    for gpu in gpus:
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="dedicated"))
    search = team_create(name="search")
    team_quota_set(team_id=search.pk, quota={"gpus": 1, "limit": {"gpus": 2}})
    train = deployment_create(name="train", request=WHOLE, replicas=2, team_id=search.pk)
    for gpu in gpus:
        deployment_place(deployment_id=train.pk, gpu_id=gpu.pk)
    ads = team_create(name="ads")
    team_quota_set(team_id=ads.pk, quota={"gpus": 1})
    serve = deployment_create(name="serve", request=WHOLE, replicas=1, team_id=ads.pk)
    return {
        "serve": serve,
        "train": train,
        "ads": ads,
        "search": search,
        "borrowed": Allocation.objects.get(borrowed=True),
    }
