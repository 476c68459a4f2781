"""Many placements of one borrowing team racing, each on its own host (so only the team's row
lock stands between them): the team never passes its limit, and never borrows what another
team's deserved share waits for. PostgreSQL only: SQLite serialises writers."""

from __future__ import annotations

import logging

import pytest
from django.db import connection

from fleet.allocations.models import Allocation
from fleet.allocations.quotas import team_usage
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.errors import ServiceError
from fleet.core.teams import team_create, team_quota_set
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory
from tests.helpers import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

logger = logging.getLogger(__name__)

RACERS = 12
WHOLE = DeploymentRequest(kind="gpu", gpu_count=1)


@pytest.fixture(autouse=True)
def _needs_postgres():
    if connection.vendor != "postgresql":
        pytest.skip("the race needs PostgreSQL (set FLEET_DATABASE_URL); SQLite serialises writers")


def gpus_on_their_own_hosts(n):
    gpus = []
    for _ in range(n):
        gpu = GpuFactory(host=HostFactory(), product_key="h100-sxm5-80gb")
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="dedicated"))
        gpus.append(gpu)
    return gpus


def team_with(name, replicas, **quota):
    team = team_create(name=name)
    team_quota_set(team_id=team.pk, quota=quota)
    deployments = [
        deployment_create(name=f"{name}-{i}", request=WHOLE, replicas=1, team_id=team.pk)
        for i in range(replicas)
    ]
    return team, deployments


def race_places(deployments, gpus):
    outcomes = race(
        *[
            (lambda d=d, g=g: deployment_place(deployment_id=d.pk, gpu_id=g.pk))
            for d, g in zip(deployments, gpus, strict=True)
        ],
        timeout=60,
    )
    return [o for o in outcomes if isinstance(o, ServiceError)]


def test_racing_borrowers_never_pass_the_teams_limit():
    gpus = gpus_on_their_own_hosts(RACERS)
    team, deployments = team_with("borrower", RACERS, gpus=2, limit={"gpus": 5})
    refused = race_places(deployments, gpus)
    held = team_usage(team.pk).gpus
    borrowed = Allocation.objects.filter(deployment__team=team, borrowed=True).count()
    logger.warning("limit race: %s refused, %s held, %s borrowed", len(refused), held, borrowed)
    assert {e.code for e in refused} == {"quota.exceeded"}, refused
    assert (held, borrowed, len(refused)) == (5, 3, RACERS - 5)


def test_racing_borrowers_leave_what_another_teams_deserved_share_waits_for():
    gpus = gpus_on_their_own_hosts(RACERS)
    lender, waiting = team_with("lender", 3, gpus=3)
    borrower, deployments = team_with("borrower", RACERS, limit={"gpus": RACERS})
    refused = race_places(deployments, gpus)
    held = team_usage(borrower.pk).gpus
    logger.warning("lending race: %s refused, %s held", len(refused), held)
    assert {e.code for e in refused} == {"quota.borrow_unavailable"}, refused
    assert held == RACERS - 3
    free = [g for g in gpus if not Allocation.objects.filter(gpu=g).exists()]
    for d, gpu in zip(waiting, free, strict=True):
        deployment_place(deployment_id=d.pk, gpu_id=gpu.pk)
    assert team_usage(lender.pk).gpus == 3
