"""A team's secrets through the API: its operators (and fleet operators) write them, its members
and fleet viewers read their names, nobody reads a value back; a workload refers to its own
team's secrets only; the value reaches only the desired state of the host running the replica,
never a deployment's answer or the audit trail; a new value can roll every deployment using it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from fleet.agents.documents import host_desired_state
from fleet.allocations.models import Deployment
from fleet.core.models import Operation, OperationKind, Team, TeamMembership, TeamSecret
from fleet.core.secrets import value_digest
from fleet.mps import MpsPolicy
from fleet.partitioning.services import LayoutSpec, gpu_set_layout
from tests.conftest import _token_client
from tests.factories import GpuFactory, HostFactory, allow_process
from tests.helpers import assert_error

pytestmark = pytest.mark.django_db

TOKEN = "hf_alpha_SECRET_123"
ROTATED = "hf_alpha_SECRET_v2"
PLAIN = "plain-db-password"


@pytest.fixture
def alpha() -> Team:
    return allow_process(Team.objects.create(name="alpha", slug="alpha"))


@pytest.fixture
def beta() -> Team:
    return allow_process(Team.objects.create(name="beta", slug="beta"))


def member(team: Team, role: str) -> Any:
    user = get_user_model().objects.create_user(f"{role}-of-{team.slug}", password="x-pass-1234")
    TeamMembership.objects.create(team=team, user=user, role=role)
    return _token_client(user)


def url(team: Team, name: str | None = None) -> str:
    return f"/api/v1/teams/{team.pk}/secrets" + (f"/{name}" if name else "")


def add_secret(client: Any, team: Team, name: str = "hf-token", value: str = TOKEN) -> Any:
    return client.post(url(team), {"name": name, "value": value}, format="json")


@pytest.fixture
def host() -> Any:
    host = HostFactory(runtime="docker", process_runtime=True)
    gpu = GpuFactory(host=host, product_key="h100-sxm5-80gb")
    gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    return host


def deploy(client: Any, team: Team, env: dict[str, Any], name: str = "llm") -> Any:
    body = {
        "name": name,
        "kind": "mps",
        "memory_mib": 1024,
        "team": team.slug,
        "auto": True,
        "workload": {"runtime": "process", "command": ["/opt/serve"], "env": env},
    }
    return client.post("/api/v1/deployments/", body, format="json")


def audit_text() -> str:
    return json.dumps(list(Operation.objects.values("summary", "payload", "result", "reason")))


def test_a_team_operator_creates_lists_rotates_and_deletes_a_secret_never_seeing_a_value(alpha):
    operator = member(alpha, "operator")

    created = add_secret(operator, alpha)
    listed = operator.get(url(alpha))
    rotated = operator.put(url(alpha, "hf-token"), {"value": ROTATED}, format="json")
    names_after = operator.get(url(alpha)).json()
    deleted = operator.delete(url(alpha, "hf-token"))

    assert created.status_code == 201, created.json()
    assert created.json()["name"] == "hf-token" and created.json()["version"] == 1
    assert [s["name"] for s in listed.json()] == ["hf-token"]
    assert rotated.status_code == 200 and rotated.json()["version"] == 2
    assert rotated.json()["rollouts"] == [] and rotated.json()["skipped"] == []
    assert names_after[0]["updated_by"] == "operator-of-alpha"
    assert deleted.status_code == 204 and not TeamSecret.objects.exists()
    for response in (created, listed, rotated):
        assert TOKEN not in response.content.decode() and ROTATED not in response.content.decode()
    secret_kinds = (OperationKind.SET_SECRET, OperationKind.DELETE_SECRET)
    audited = Operation.objects.filter(kind__in=secret_kinds).order_by("pk")
    kinds = list(audited.values_list("kind", "payload"))
    assert kinds == [
        (OperationKind.SET_SECRET, {"team": alpha.pk, "name": "hf-token", "version": 1}),
        (OperationKind.SET_SECRET, {"team": alpha.pk, "name": "hf-token", "version": 2}),
        (OperationKind.DELETE_SECRET, {"team": alpha.pk, "name": "hf-token", "version": 2}),
    ]


def test_the_value_is_stored_encrypted(alpha, admin_client):
    add_secret(admin_client, alpha)

    stored = TeamSecret.objects.get()

    assert TOKEN not in stored.ciphertext and stored.updated_by is not None


def test_the_teams_members_and_fleet_viewers_read_the_names_other_teams_do_not(
    alpha, beta, admin_client, viewer_client
):
    add_secret(admin_client, alpha)

    for client in (member(alpha, "viewer"), viewer_client):
        response = client.get(url(alpha))
        assert response.status_code == 200, response.json()
        assert [s["name"] for s in response.json()] == ["hf-token"]
    assert_error(member(beta, "viewer").get(url(alpha)), 403)
    assert_error(member(beta, "operator").get(url(alpha)), 403)


def test_another_teams_operator_can_neither_write_nor_refer_to_the_secret(alpha, beta, host):
    add_secret(member(alpha, "operator"), alpha)
    intruder = member(beta, "operator")

    assert_error(add_secret(intruder, alpha, name="other"), 403)
    assert_error(intruder.put(url(alpha, "hf-token"), {"value": "x" * 8}, format="json"), 403)
    assert_error(intruder.delete(url(alpha, "hf-token")), 403)
    refused = deploy(intruder, beta, {"HF_TOKEN": {"secret": "hf-token"}})

    body = assert_error(refused, 422, "secret.not_found")
    assert body["details"]["violations"][0]["details"] == {
        "secret": "hf-token",
        "env": ["HF_TOKEN"],
    }
    assert not Deployment.objects.exists()
    assert TeamSecret.objects.get().version == 1


def test_a_taken_name_is_a_409_and_a_bad_name_or_value_a_400_changing_nothing(alpha, admin_client):
    add_secret(admin_client, alpha)
    before = audit_text()

    assert_error(add_secret(admin_client, alpha), 409, "secret.exists")
    assert_error(add_secret(admin_client, alpha, name="bad name"), 400, "secret.name_invalid")
    assert_error(add_secret(admin_client, alpha, name="nul", value="a\x00b"), 400)
    assert_error(add_secret(admin_client, alpha, name="long", value="x" * 5000), 400)
    too_much = {"name": "x", "value": "abcd", "extra": 1}
    assert_error(admin_client.post(url(alpha), too_much, format="json"), 400)
    assert_error(admin_client.put(url(alpha, "missing"), {"value": "abcd"}, format="json"), 404)
    assert_error(
        admin_client.put(url(alpha, "hf-token"), {"value": "abcd", "roll": "yes"}, format="json"),
        400,
        "secret.roll_invalid",
    )

    assert list(TeamSecret.objects.values_list("name", "version")) == [("hf-token", 1)]
    assert audit_text() == before


def test_a_secret_a_deployment_refers_to_cannot_be_deleted(alpha, host, admin_client):
    add_secret(admin_client, alpha)
    assert deploy(admin_client, alpha, {"HF_TOKEN": {"secret": "hf-token"}}).status_code == 201

    body = assert_error(admin_client.delete(url(alpha, "hf-token")), 409, "secret.in_use")

    assert body["details"]["deployments"] == [Deployment.objects.get().pk]
    assert TeamSecret.objects.exists()


def test_only_the_desired_state_of_the_host_running_the_replica_carries_the_value(
    alpha, host, admin_client
):
    add_secret(admin_client, alpha)
    env = {"HF_TOKEN": {"secret": "hf-token"}, "DB_PASSWORD": PLAIN}

    created = deploy(admin_client, alpha, env)
    shown = admin_client.get(f"/api/v1/deployments/{created.json()['id']}/")
    replicas = admin_client.get("/api/v1/allocations/")
    desired = host_desired_state(host)

    assert created.status_code == 201, created.json()
    (allocation,) = [a for g in desired["gpus"].values() for a in g["allocations"]]
    assert allocation["workload"]["env"] == {"HF_TOKEN": TOKEN, "DB_PASSWORD": PLAIN}
    assert allocation["secret_env"] == ["HF_TOKEN"]
    assert shown.json()["workload"]["env"]["HF_TOKEN"] == {"secret": "hf-token"}
    assert Deployment.objects.get().workload["env"]["HF_TOKEN"] == {"secret": "hf-token"}
    for text in (shown.content.decode(), replicas.content.decode(), audit_text()):
        assert TOKEN not in text


def test_a_deleted_or_unreadable_secret_runs_nothing_rather_than_run_without_it(
    alpha, host, admin_client, settings
):
    add_secret(admin_client, alpha)
    deploy(admin_client, alpha, {"HF_TOKEN": {"secret": "hf-token"}})
    settings.FLEET_SECRETS_KEYS = ["0" * 43 + "="]  # another key: no longer opens it

    (allocation,) = [a for g in host_desired_state(host)["gpus"].values() for a in g["allocations"]]

    assert allocation["workload"]["runtime"] == "none" and "secret_env" not in allocation


def test_a_new_value_with_roll_starts_a_rolling_update_of_each_deployment_using_it(
    alpha, host, admin_client
):
    add_secret(admin_client, alpha)
    user = deploy(admin_client, alpha, {"HF_TOKEN": {"secret": "hf-token"}, "DB": PLAIN})
    deploy(admin_client, alpha, {"OTHER": "value"}, name="bystander")

    answer = admin_client.put(
        url(alpha, "hf-token"), {"value": ROTATED, "roll": True}, format="json"
    )

    assert answer.status_code == 200, answer.json()
    (started,) = answer.json()["rollouts"]
    assert started["deployment"] == user.json()["id"]
    rollout = Operation.objects.get(pk=started["operation"])
    assert rollout.kind == OperationKind.DEPLOYMENT_ROLLOUT and rollout.status == "dispatched"
    assert rollout.payload["workload"]["env"] == {
        "HF_TOKEN": {"secret": "hf-token"},
        "DB": value_digest(PLAIN),
    }
    assert rollout.payload["previous"] == rollout.payload["workload"]
    text = audit_text()
    for value in (TOKEN, ROTATED, PLAIN):
        assert value not in text
    values = {
        a["deployment"]: a["workload"]["env"].get("HF_TOKEN")
        for g in host_desired_state(host)["gpus"].values()
        for a in g["allocations"]
    }
    assert values["llm"] == ROTATED  # every copy, the new one included, starts with the new value


def test_the_schema_documents_the_secrets_endpoints(admin_client):
    schema = admin_client.get("/api/schema/", HTTP_ACCEPT="application/json").json()

    assert {"get", "post"} <= set(schema["paths"]["/api/v1/teams/{id}/secrets"])
    assert {"put", "delete"} <= set(schema["paths"]["/api/v1/teams/{id}/secrets/{name}"])


@pytest.mark.parametrize(
    "value", [{"secret": 5}, {"secret": "hf-token", "key": "x"}, {"secret": "bad name"}, ["x"]]
)
def test_an_env_value_is_a_string_or_a_well_formed_reference(alpha, host, admin_client, value):
    add_secret(admin_client, alpha)

    assert_error(deploy(admin_client, alpha, {"HF_TOKEN": value}), 400)

    assert not Deployment.objects.exists()


def test_a_deployment_is_handed_only_to_a_team_with_the_secrets_it_refers_to(
    alpha, beta, host, admin_client
):
    add_secret(admin_client, alpha)
    created = deploy(admin_client, alpha, {"HF_TOKEN": {"secret": "hf-token"}}).json()
    move = {"team": beta.slug}

    assert_error(
        admin_client.patch(f"/api/v1/deployments/{created['id']}/", move, format="json"),
        422,
        "secret.not_found",
    )
    add_secret(admin_client, beta)
    handed = admin_client.patch(f"/api/v1/deployments/{created['id']}/", move, format="json")

    assert handed.status_code == 200, handed.json()
    assert Deployment.objects.get().team_id == beta.pk
