"""A team's policy through the API: every role reads it, only fleet admins set it (audited);
creating a deployment, rolling out a new workload and handing a deployment to a team are
checked against it (422 ``policy.*``, nothing written); the agent gets the policy applied in
each replica's ``security``."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model

from fleet.agents.documents import host_desired_state
from fleet.allocations.models import Deployment
from fleet.core.models import Operation, Team, TeamMembership
from fleet.core.policy import DEFAULTS
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.conftest import _token_client
from tests.factories import GpuFactory, HostFactory, allow_process
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db

PROCESS = {"runtime": "process", "command": ["/opt/serve"]}
CONTAINER = {"runtime": "container", "image": "registry.example.com/team-a/llm:1"}


@pytest.fixture
def team() -> Team:
    return Team.objects.create(name="alpha", slug="alpha")


def member(team: Team, role: str) -> Any:
    user = get_user_model().objects.create_user(f"{role}-of-{team.slug}", password="x-pass-1234")
    TeamMembership.objects.create(team=team, user=user, role=role)
    return _token_client(user)


def url(team: Team) -> str:
    return f"/api/v1/teams/{team.pk}/policy"


def create(client: Any, team: Team, workload: dict[str, Any], **extra: Any) -> Any:
    body = {"name": "job", "kind": "mps", "memory_mib": 1024, "team": team.slug}
    return client.post("/api/v1/deployments/", {**body, "workload": workload, **extra}, "json")


def test_the_teams_members_and_viewers_read_the_restricted_default(team, viewer_client):
    for client in (viewer_client, member(team, "viewer")):
        response = client.get(url(team))
        assert response.status_code == 200, response.json()
        assert response.json() == DEFAULTS


def test_an_admin_sets_the_whole_policy_and_it_is_audited(team, admin_client):
    policy = {"runtimes": ["container", "process"], "process_user": "1000:1000"}

    response = admin_client.put(url(team), policy, format="json")

    assert response.status_code == 200, response.json()
    assert response.json() == {**DEFAULTS, **policy}
    team.refresh_from_db()
    assert team.policy == policy
    operation = Operation.objects.get(kind="set_policy")
    assert operation.requested_by_name == "admin-user"
    assert operation.payload["team"] == team.pk
    assert operation.payload["previous"] == DEFAULTS
    assert operation.payload["policy"] == {**DEFAULTS, **policy}
    # A PUT is the whole policy: an empty one restricts the team again.
    assert admin_client.put(url(team), {}, format="json").json() == DEFAULTS


def test_only_fleet_admins_set_a_policy(team, operator_client):
    body = {"runtimes": ["container", "process"], "process_user": "1000"}
    for client in (operator_client, member(team, "operator")):
        assert_error(client.put(url(team), body, format="json"), 403, "auth.forbidden")
    team.refresh_from_db()
    assert team.policy == {}
    assert not Operation.objects.filter(kind="set_policy").exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"runtimes": ["process"]}, "process_user"),
        ({"runtimes": ["container"], "allow_root": "yes"}, "allow_root"),
        ({"capabilities": ["SYS_ADMIN"]}, "capabilities"),
        ({"privileged": True}, "privileged"),
    ],
)
def test_a_bad_policy_is_a_400_naming_the_field_and_changes_nothing(
    team, admin_client, body, field
):
    allow_process(team)

    response = admin_client.put(url(team), body, format="json")

    assert field in assert_error(response, 400, "policy.invalid")["details"]["fields"]
    team.refresh_from_db()
    assert team.policy["process_user"] == "1000:1000"


def test_a_missing_team_has_no_policy(admin_client):
    assert_error(admin_client.get("/api/v1/teams/999999/policy"), 404, "team.not_found")
    assert_error(admin_client.put("/api/v1/teams/999999/policy", {}, format="json"), 404)


def test_a_team_operator_cannot_create_a_process_deployment_without_a_policy(team):
    client = member(team, "operator")
    before = snapshot_rows()

    response = create(client, team, PROCESS)

    body = assert_error(response, 422, "policy.runtime_denied")
    assert f"PUT /api/v1/teams/{team.pk}/policy" in body["message"]
    assert snapshot_rows() == before
    assert not Deployment.objects.exists()


def test_once_allowed_the_process_deployment_is_created(team):
    allow_process(team)

    response = create(member(team, "operator"), team, PROCESS)

    assert response.status_code == 201, response.json()


@pytest.mark.parametrize(
    ("workload", "code"),
    [
        ({**CONTAINER, "user": "0:0"}, "policy.user_denied"),
        ({**CONTAINER, "user": "root"}, "policy.user_denied"),
        ({**CONTAINER, "image": "attacker.example:5000/miner:latest"}, "policy.image_denied"),
        ({**PROCESS, "user": "0"}, "policy.user_denied"),
    ],
)
def test_root_and_images_outside_the_registries_are_refused(team, workload, code):
    allow_process(team, registries=["registry.example.com/team-a/"])

    assert_error(create(member(team, "operator"), team, workload), 422, code)
    assert not Deployment.objects.exists()


def test_host_memory_is_bounded_by_the_policy_and_shown(team):
    client = member(team, "operator")

    assert_error(
        create(client, team, CONTAINER, host_memory_mib=65537), 422, "policy.host_memory_denied"
    )
    created = create(client, team, CONTAINER, host_memory_mib=2048)

    assert created.status_code == 201, created.json()
    assert created.json()["host_memory_mib"] == 2048
    patched = client.patch(
        f"/api/v1/deployments/{created.json()['id']}/", {"host_memory_mib": 1}, format="json"
    )
    assert_error(patched, 400, "deployment.field_immutable")


def test_a_rollout_to_a_process_workload_is_refused_and_keeps_the_workload(team):
    client = member(team, "operator")
    created = create(client, team, CONTAINER).json()

    response = client.patch(
        f"/api/v1/deployments/{created['id']}/", {"workload": PROCESS}, format="json"
    )

    assert_error(response, 422, "policy.runtime_denied")
    assert Deployment.objects.get().workload["runtime"] == "container"
    assert not Operation.objects.filter(kind="rollout").exists()


def test_handing_a_deployment_to_a_team_whose_policy_forbids_it_is_refused(team, admin_client):
    allow_process(team)
    created = create(admin_client, team, PROCESS).json()
    other = Team.objects.create(name="beta", slug="beta")

    response = admin_client.patch(
        f"/api/v1/deployments/{created['id']}/", {"team": "beta"}, format="json"
    )

    assert_error(response, 422, "policy.runtime_denied")
    assert Deployment.objects.get().team_id == team.pk
    allow_process(other)
    handed = admin_client.patch(
        f"/api/v1/deployments/{created['id']}/", {"team": "beta"}, format="json"
    )
    assert handed.status_code == 200, handed.json()


def test_each_replica_that_runs_something_carries_its_security(team, admin_client):
    allow_process(team, user="2000:2000", capabilities=["NET_BIND_SERVICE"], max_pids=256)
    host = HostFactory(runtime="docker", process_runtime=True)
    gpu = GpuFactory(host=host, product_key="h100-sxm5-80gb")
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    for name, workload in (("proc", PROCESS), ("idle", {"runtime": "none"})):
        body = {"name": name, "auto": True, "host_memory_mib": 4096}
        response = create(admin_client, team, workload, **body)
        assert response.status_code == 201, response.json()

    desired = host_desired_state(host)

    by_name = {a["deployment"]: a for a in desired["gpus"][gpu.uuid]["allocations"]}
    assert by_name["proc"]["security"] == {
        "user": "2000:2000",
        "allow_root": False,
        "cap_add": ["NET_BIND_SERVICE"],
        "pids_limit": 256,
        "memory_mib": 4096,
        "host_network": False,
    }
    assert "security" not in by_name["idle"]


def test_the_schema_documents_the_policy_endpoint(admin_client):
    schema = admin_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    operations = schema["paths"]["/api/v1/teams/{id}/policy"]
    assert {"get", "put"} <= set(operations)
    assert "Fleet admins only" in operations["put"]["description"]
