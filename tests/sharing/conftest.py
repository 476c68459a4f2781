"""Fixtures the sharing tests share."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.allocations.models import Allocation
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.teams import team_create, team_quota_set
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from fleet.workflows.reclaim import reclaim_advance
from tests.factories import GpuFactory, HostFactory

WHOLE = DeploymentRequest(kind="gpu", gpu_count=1)


def lend_whole_gpus(n: int, claimants: list[str]) -> dict[str, Any]:
    """``n`` whole GPUs, all held by *search* (deserved 1: ``n - 1`` borrowed, its deployment
    *train*); *ads* (deserved one GPU a claimant) waits with a deployment of one replica for
    each name of ``claimants``."""
    host = HostFactory()
    gpus = [GpuFactory(host=host) for _ in range(n)]
    for gpu in gpus:
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="dedicated"))
    search = team_create(name="search")
    team_quota_set(team_id=search.pk, quota={"gpus": 1, "limit": {"gpus": n}})
    train = deployment_create(name="train", request=WHOLE, replicas=n, team_id=search.pk)
    for gpu in gpus:
        deployment_place(deployment_id=train.pk, gpu_id=gpu.pk)
    ads = team_create(name="ads")
    team_quota_set(team_id=ads.pk, quota={"gpus": len(claimants)})
    serves = [
        deployment_create(name=name, request=WHOLE, replicas=1, team_id=ads.pk)
        for name in claimants
    ]
    return {"serves": serves, "train": train, "ads": ads, "search": search}


@pytest.fixture
def lent_whole(settings: Any) -> dict[str, Any]:
    """Two whole GPUs, both held by *search*: one guaranteed, one borrowed; *ads* (deserved 1)
    waits for one (its deployment *serve*)."""
    settings.FLEET_RECLAIM_MIN_RUNTIME_S = 0
    lent = lend_whole_gpus(2, ["serve"])
    return {**lent, "serve": lent["serves"][0], "borrowed": Allocation.objects.get(borrowed=True)}


def run_reclaim(operation: Any, sync: Any = None, rounds: int = 8) -> Any:
    """Advance the reclaim (after ``sync``: the agents' acks) until it is no longer running,
    at most ``rounds`` times; the operation as it then is."""
    for _ in range(rounds):
        if sync is not None:
            sync()
        reclaim_advance(operation_id=operation.pk)
        operation.refresh_from_db()
        if operation.status != "dispatched":
            break
    return operation
