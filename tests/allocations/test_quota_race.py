"""Many placements of one team racing against its quota, each on its own host (so only the
team's row lock stands between them): the quota is never passed. PostgreSQL only: SQLite
serialises writers."""

from __future__ import annotations

import logging

import pytest
from django.db import connection

from fleet.allocations.autoplace import deployment_autoplace
from fleet.allocations.quotas import team_usage
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.errors import ServiceError
from fleet.core.teams import team_create, team_quota_set
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory
from tests.helpers import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

logger = logging.getLogger(__name__)

RACERS = 12


@pytest.fixture(autouse=True)
def _needs_postgres():
    if connection.vendor != "postgresql":
        pytest.skip("the race needs PostgreSQL (set FLEET_DATABASE_URL); SQLite serialises writers")


def gpus_on_their_own_hosts(n, mode):
    gpus = []
    for _ in range(n):
        gpu = GpuFactory(host=HostFactory(), product_key="h100-sxm5-80gb")
        spec = LayoutSpec(mode="mps", mps=MpsPolicy()) if mode == "mps" else LayoutSpec(mode=mode)
        gpu_set_layout(gpu_id=gpu.pk, spec=spec)
        gpus.append(gpu)
    return gpus


CASES = {
    "mps": (DeploymentRequest(kind="mps", memory_mib=4096), {"mps_memory_mib": 5 * 4096}),
    "gpu": (DeploymentRequest(kind="gpu", gpu_count=1), {"gpus": 5}),
}


@pytest.mark.parametrize("auto", [False, True], ids=["place", "auto"])
@pytest.mark.parametrize("kind", sorted(CASES))
@pytest.mark.parametrize("attempt", range(3))
def test_racing_placements_never_pass_the_teams_quota(kind, auto, attempt):
    request, limits = CASES[kind]
    team = team_create(name=f"race-{kind}-{auto}-{attempt}")
    team_quota_set(team_id=team.pk, quota=limits)
    gpus = gpus_on_their_own_hosts(RACERS, "mps" if kind == "mps" else "dedicated")
    deployments = [
        deployment_create(name=f"r{i}", request=request, replicas=1, team_id=team.pk)
        for i in range(RACERS)
    ]

    def place(i):
        if auto:
            return lambda: deployment_autoplace(deployment_id=deployments[i].pk)
        return lambda: deployment_place(deployment_id=deployments[i].pk, gpu_id=gpus[i].pk)

    outcomes = race(*[place(i) for i in range(RACERS)], timeout=60)
    refused = [o for o in outcomes if isinstance(o, ServiceError)]
    accepted = len(outcomes) - len(refused)
    usage = team_usage(team.pk)
    in_use = usage.mps_memory_mib if kind == "mps" else usage.gpus
    limit = next(iter(limits.values()))
    per_replica = 4096 if kind == "mps" else 1
    logger.warning(
        "quota race %s/%s #%s: %s attempts, %s accepted, %s refused, usage %s of %s",
        kind,
        "auto" if auto else "place",
        attempt,
        RACERS,
        accepted,
        len(refused),
        in_use,
        limit,
    )
    assert {e.code for e in refused} == {"quota.exceeded"}, refused
    assert in_use <= limit
    assert accepted == limit // per_replica and in_use == accepted * per_replica
