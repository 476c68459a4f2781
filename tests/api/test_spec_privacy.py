"""Who sees what a deployment runs (issue 21, H2): two teams, four readers.

beta runs ``beta-svc`` (a container with a command and env) and rolls it out to a new env.
alice operates alpha, bob operates beta, carol views beta, vic is a fleet viewer. alice sees
beta-svc as a name, a request and slices, never its image, command or env: not through the
deployments, the allocations, the operations (JSON or CSV); beta's replica logs and metrics are
a 403 for her. bob, carol and vic see it all. Webhook URLs in the audit trail lose their
credentials and query strings, for everyone."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model

from fleet.allocations.deployment_rollouts import deployment_rollout_start
from fleet.allocations.models import Allocation, Deployment
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.models import OperationKind, OperationStatus, Team, TeamMembership
from fleet.core.operations import operation_record
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.conftest import _token_client
from tests.factories import GpuFactory, HostFactory, allow_process
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db

IMAGE = "registry.example/beta/llm:7"
COMMAND = ["serve", "--token-file", "/run/beta-cmd-marker"]
ENV = {"DB_PASSWORD": "s3cr3t-beta-v1"}
# Strings of beta's spec that must not reach alpha's operator, in any answer.
MARKERS = ("registry.example/beta", "beta-cmd-marker", "s3cr3t-beta", "DB_PASSWORD")


@pytest.fixture
def world() -> dict[str, Any]:
    return two_teams()


def two_teams() -> dict[str, Any]:
    """alpha (no deployment) and beta, whose ``beta-svc`` runs a container on one MPS share
    and has rolled out a new env."""
    alpha = allow_process(Team.objects.create(name="alpha", slug="alpha"))
    beta = allow_process(Team.objects.create(name="beta", slug="beta"))
    host = HostFactory(runtime="docker", process_runtime=True)
    gpu = GpuFactory(host=host, product_key="h100-sxm5-80gb")
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    workload = {"runtime": "container", "image": IMAGE, "command": COMMAND, "env": ENV}
    deployment = deployment_create(
        name="beta-svc",
        request=DeploymentRequest(kind="mps", memory_mib=1024),
        replicas=1,
        workload=workload,
        team_id=beta.pk,
    )
    deployment_place(deployment_id=deployment.pk, gpu_id=gpu.pk)
    deployment_rollout_start(
        deployment_id=deployment.pk, workload={**workload, "env": {"DB_PASSWORD": "s3cr3t-beta-v2"}}
    )
    return {"alpha": alpha, "beta": beta, "d": deployment, "a": Allocation.objects.first()}


def reader(world: dict[str, Any], team: str, role: str) -> Any:
    user = get_user_model().objects.create_user(f"{role}-of-{team}", password="x-pass-1234")
    TeamMembership.objects.create(team=world[team], user=user, role=role)
    return _token_client(user)


def spec_readers(world: dict[str, Any], viewer_client: Any) -> list[Any]:
    return [reader(world, "beta", "operator"), reader(world, "beta", "viewer"), viewer_client]


def answers(client: Any, world: dict[str, Any]) -> dict[str, bytes]:
    d, a = world["d"].pk, world["a"].pk
    urls = {
        "deployments": "/api/v1/deployments/",
        "deployment": f"/api/v1/deployments/{d}/",
        "allocations": f"/api/v1/allocations/?deployment={d}",
        "allocation": f"/api/v1/allocations/{a}/",
        "operations": f"/api/v1/operations/?deployment={d}",
        "operations csv": f"/api/v1/operations/?deployment={d}&format=csv",
    }
    found = {}
    for name, url in urls.items():
        response = client.get(url)
        assert response.status_code == 200, (name, response.content)
        found[name] = (
            b"".join(response.streaming_content) if response.streaming else response.content
        )
    return found


def test_the_world_holds_the_spec_in_every_answer_its_team_reads(world, viewer_client):
    """The check below can fail: beta's own readers do get every marker somewhere."""
    for client in spec_readers(world, viewer_client):
        body = b"".join(answers(client, world).values()).decode()
        assert all(marker in body for marker in MARKERS), body[:2000]


def test_another_teams_operator_reads_no_spec_through_any_api_answer(world):
    alice = reader(world, "alpha", "operator")
    for name, body in answers(alice, world).items():
        for marker in MARKERS:
            assert marker.encode() not in body, (name, marker)
    deployment = alice.get(f"/api/v1/deployments/{world['d'].pk}/").json()
    assert deployment["name"] == "beta-svc" and deployment["memory_mib"] == 1024
    assert deployment["workload"] == {"runtime": "container", "redacted": True}
    allocation = alice.get(f"/api/v1/allocations/{world['a'].pk}/").json()
    assert allocation["workload"] == {"runtime": "container", "redacted": True}
    assert allocation["gpu"] and allocation["environment"] is not None  # slices stay visible


def test_the_rollouts_payload_keeps_its_steps_without_the_workloads(world, viewer_client):
    alice = reader(world, "alpha", "operator")
    rows = alice.get(f"/api/v1/operations/?kind=rollout&deployment={world['d'].pk}").json()
    payload = rows["results"][0]["payload"]
    assert payload["workload"] == payload["previous"] == {"runtime": "container", "redacted": True}
    assert "step" in payload and "sealed_previous" not in payload
    full = viewer_client.get(f"/api/v1/operations/?kind=rollout&deployment={world['d'].pk}")
    assert full.json()["results"][0]["payload"]["workload"]["image"] == IMAGE


def test_replica_logs_and_metrics_are_the_teams_and_fleet_viewers(world, viewer_client):
    a = world["a"].pk
    alice = reader(world, "alpha", "operator")
    assert_error(alice.get(f"/api/v1/allocations/{a}/logs"), 403, "auth.forbidden")
    assert_error(alice.get(f"/api/v1/allocations/{a}/metrics"), 403, "auth.forbidden")
    for client in spec_readers(world, viewer_client):
        # No agent socket here: allowed readers are told so, not refused.
        assert_error(client.get(f"/api/v1/allocations/{a}/logs"), 409, "logs.agent_unreachable")
        assert client.get(f"/api/v1/allocations/{a}/metrics").status_code == 200


def test_a_missing_replicas_logs_are_a_404_for_everyone(world):
    alice = reader(world, "alpha", "operator")
    assert_error(alice.get("/api/v1/allocations/999999/logs"), 404)


def test_a_deleted_deployments_rollout_shows_its_spec_to_fleet_viewers_only(world, viewer_client):
    carol = reader(world, "beta", "viewer")
    Allocation.objects.all().delete()
    Deployment.objects.filter(pk=world["d"].pk).delete()
    url = "/api/v1/operations/?kind=rollout"
    assert carol.get(url).json()["results"][0]["payload"]["workload"]["redacted"] is True
    assert viewer_client.get(url).json()["results"][0]["payload"]["workload"]["image"] == IMAGE


def test_webhook_urls_in_the_audit_trail_lose_credentials_and_query_strings(
    world, admin_client, viewer_client
):
    secret_url = "https://ops:hunter2@hooks.example.com/services/T0/B0?token=XYZSECRET#frag"
    operation_record(
        kind=OperationKind.SET_WEBHOOK,
        summary=f"Alert webhook #1 created: {secret_url}",
        status=OperationStatus.SUCCEEDED,
        payload={"webhook": 1},
    )
    for client in (reader(world, "alpha", "viewer"), viewer_client, admin_client):
        listed = client.get("/api/v1/operations/?kind=set_webhook")
        summary = listed.json()["results"][0]["summary"]
        assert summary == "Alert webhook #1 created: https://hooks.example.com/services/T0/B0"
        csv = b"".join(client.get("/api/v1/operations/?format=csv").streaming_content).decode()
        assert "https://hooks.example.com/services/T0/B0" in csv
        assert "hunter2" not in csv and "XYZSECRET" not in csv


def test_a_team_member_without_a_fleet_role_holds_the_member_role(world):
    alice = reader(world, "alpha", "viewer")
    assert alice.get("/api/v1/me").json()["role"] == "member"
    assert alice.get("/api/v1/gpus/").status_code == 200
