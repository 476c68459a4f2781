"""The permission matrix of the deployment endpoints: fleet role (none, viewer, operator, admin)
x team role (none, viewer, operator) x the deployment's team (the user's own, another) x every
endpoint that reads or changes deployments and their replicas, and the team admin endpoints.

Reads: any fleet role or any team membership (team members see every team's deployments);
what a deployment runs (its workload), its replicas' logs and metrics: fleet viewers and up and
its own team's members only (others get the workload redacted, a 403 for logs and metrics).
Changes: a fleet operator or admin, or an operator of the deployment's own team (defragmenting,
which moves other deployments' replicas: fleet operators only). Teams and
quotas: fleet admins only. A refusal is a 403 envelope that changes nothing."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from fleet.allocations.models import Allocation
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.models import TeamMembership
from fleet.core.roles import Role
from fleet.core.services import api_token_create, user_create
from fleet.core.teams import team_create
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.factories import GpuFactory, HostFactory
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db

FLEET_ROLES = ["none", "viewer", "operator", "admin"]
TEAM_ROLES = ["none", "viewer", "operator"]
WHOSE = ["own", "other"]


@dataclass(frozen=True)
class Endpoint:
    name: str
    method: str
    url: str
    body: dict | None = None
    writes: bool = False
    admin: bool = False
    ok: int = 200  # what an allowed call answers in this world
    fleet_only: bool = False  # even a team operator may not
    spec: bool = False  # reads what it runs: its own team's members and fleet viewers and up


ENDPOINTS = [
    Endpoint("list", "get", "/api/v1/deployments/"),
    Endpoint("list by team", "get", "/api/v1/deployments/?team=alpha"),
    Endpoint("retrieve", "get", "/api/v1/deployments/{d}/"),
    Endpoint("targets", "get", "/api/v1/deployments/{d}/targets"),
    Endpoint("defrag plan", "get", "/api/v1/deployments/{d}/defrag"),
    Endpoint("allocations", "get", "/api/v1/allocations/?deployment={d}"),
    Endpoint("allocation", "get", "/api/v1/allocations/{a}/"),
    Endpoint("replica metrics", "get", "/api/v1/allocations/{a}/metrics", spec=True),
    # No agent socket in this world: an allowed caller learns that (409), not the lines.
    Endpoint("replica logs", "get", "/api/v1/allocations/{a}/logs", ok=409, spec=True),
    Endpoint("teams", "get", "/api/v1/teams/"),
    Endpoint("team", "get", "/api/v1/teams/{t}/"),
    Endpoint(
        "create",
        "post",
        "/api/v1/deployments/",
        {"name": "new", "kind": "mps", "memory_mib": 1024, "team": "alpha"},
        writes=True,
        ok=201,
    ),
    Endpoint("scale", "patch", "/api/v1/deployments/{d}/", {"replicas": 3}, writes=True),
    Endpoint("place", "post", "/api/v1/deployments/{d}/place", {"gpu": "{g}"}, writes=True, ok=202),
    Endpoint("place all", "post", "/api/v1/deployments/{d}/place-all", {}, writes=True, ok=202),
    Endpoint("evict", "post", "/api/v1/deployments/{d}/evict", {"replica": 0}, writes=True, ok=202),
    Endpoint(
        "defrag apply",
        "post",
        "/api/v1/deployments/{d}/defrag",
        {},
        writes=True,
        ok=409,
        fleet_only=True,
    ),
    Endpoint("move", "post", "/api/v1/allocations/{a}/move", {"gpu": "{g}"}, writes=True, ok=202),
    Endpoint("delete", "delete", "/api/v1/deployments/{d}/", writes=True, ok=204),
    Endpoint("set quota", "put", "/api/v1/teams/{t}/quota", {"gpus": 4}, writes=True, admin=True),
    Endpoint(
        "set members", "put", "/api/v1/teams/{t}/members", {"members": []}, writes=True, admin=True
    ),
    Endpoint(
        "create team", "post", "/api/v1/teams/", {"name": "gamma"}, writes=True, admin=True, ok=201
    ),
]

MATRIX = list(itertools.product(FLEET_ROLES, TEAM_ROLES, WHOSE, ENDPOINTS))


def allowed(fleet: str, team: str, whose: str, endpoint: Endpoint) -> bool:
    if endpoint.admin:
        return fleet == "admin"
    if endpoint.spec:
        return sees_spec(fleet, team, whose)
    if not endpoint.writes:
        return fleet != "none" or team != "none"
    if fleet in ("operator", "admin"):
        return True
    return team == "operator" and whose == "own" and not endpoint.fleet_only


def sees_spec(fleet: str, team: str, whose: str) -> bool:
    return fleet != "none" or (team != "none" and whose == "own")


@pytest.fixture(autouse=True)
def _fresh_throttles():
    """Each case is a new user, but ids repeat after a rollback: the throttles' counts must not
    carry over (the ranking endpoints allow 60 calls a minute)."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture
def world():
    """Team alpha owns ``api`` (2 MPS replicas, one placed); beta owns nothing; a free GPU."""
    alpha, beta = team_create(name="alpha"), team_create(name="beta")
    host = HostFactory()
    gpus = [GpuFactory(host=host) for _ in range(2)]
    for gpu in gpus:
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    deployment = deployment_create(
        name="api",
        request=DeploymentRequest(kind="mps", memory_mib=4096),
        replicas=2,
        team_id=alpha.pk,
    )
    deployment_place(deployment_id=deployment.pk, gpu_id=gpus[0].pk)
    allocation = Allocation.objects.get(deployment=deployment)
    return {"alpha": alpha, "beta": beta, "d": deployment, "a": allocation, "g": gpus[1]}


def client_for(fleet: str, team: str, whose: str, world) -> APIClient:
    if fleet == "none":
        user = get_user_model().objects.create_user("someone", password="s3cret-pass-word")
    else:
        user = user_create(
            username="someone", password="s3cret-pass-word", role=Role[fleet.upper()]
        )
    if team != "none":
        member_of = world["alpha"] if whose == "own" else world["beta"]
        TeamMembership.objects.create(team=member_of, user=user, role=team)
    _, secret = api_token_create(user=user, name="matrix")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {secret}")
    return client


def _fill(value, ids):
    if isinstance(value, str):
        return value.format(**ids)
    if isinstance(value, dict):
        filled = {k: _fill(v, ids) for k, v in value.items()}
        return {k: int(v) if isinstance(v, str) and v.isdigit() else v for k, v in filled.items()}
    return value


@pytest.mark.parametrize(
    ("fleet", "team", "whose", "endpoint"),
    MATRIX,
    ids=[f"{f}-{t}-{w}-{e.name.replace(' ', '_')}" for f, t, w, e in MATRIX],
)
def test_the_permission_matrix(world, fleet, team, whose, endpoint):
    ids = {"d": world["d"].pk, "a": world["a"].pk, "g": world["g"].pk, "t": world["alpha"].pk}
    client = client_for(fleet, team, whose, world)
    before = snapshot_rows()
    call = getattr(client, endpoint.method)
    response = call(_fill(endpoint.url, ids), _fill(endpoint.body, ids), format="json")
    if allowed(fleet, team, whose, endpoint):
        assert response.status_code == endpoint.ok, response.content
        body = response.json() if endpoint.method == "get" and endpoint.ok == 200 else None
        if isinstance(body, dict) and "workload" in body:  # another team's: its runtime only
            redacted = body["workload"] == {"runtime": "none", "redacted": True}
            assert redacted is not sees_spec(fleet, team, whose), body["workload"]
    else:
        assert_error(response, 403, "auth.forbidden")
        assert snapshot_rows() == before


def test_the_matrix_covers_every_combination():
    assert len(MATRIX) == len(FLEET_ROLES) * len(TEAM_ROLES) * len(WHOSE) * len(ENDPOINTS)
