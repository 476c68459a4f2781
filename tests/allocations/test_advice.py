"""The layout advisor end to end in one process: its proposal for waiting replicas, applied as a
rollout through the API, reshapes the GPUs (in place where running replicas keep their
partitions) and the engine then places the waiting replicas."""

from __future__ import annotations

import pytest

from fleet.agents.delivery import agent_ack
from fleet.agents.discovery import agent_hello
from fleet.agents.documents import host_desired_state
from fleet.agents.enrollment import host_issue_token
from fleet.allocations.models import Deployment
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.models import Operation
from fleet.inventory.models import Gpu, Host
from fleet.inventory.services import host_create
from fleet.mig import Instance, product_by_key, validate_layout
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from tests.agent_sim import SimAgent
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db

TWO_3G = LayoutSpec(
    mode="mig", instances=(MigInstanceSpec("3g.40gb", 0), MigInstanceSpec("3g.40gb", 4))
)
H100 = product_by_key("h100-sxm5-80gb")


@pytest.fixture
def world(django_capture_on_commit_callbacks):
    host, _ = host_create(name="node")
    host_issue_token(host)
    agent = SimAgent(["h100-sxm5-80gb"] * 2)
    Host.objects.filter(pk=host.pk).update(hostname="sim-0", status="ready")
    agent_hello(host=host, hello=agent.hello())
    gpus = list(Gpu.objects.filter(host=host).order_by("index"))
    for gpu in gpus:
        gpu_set_layout(gpu_id=gpu.pk, spec=TWO_3G)

    def sync():
        with django_capture_on_commit_callbacks(execute=True):
            agent_ack(host=host, ack=agent.apply(host_desired_state(Host.objects.get(pk=host.pk))))

    sync()
    chat = deployment_create(
        name="chat", request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=1
    )
    running = Partition.objects.get(gpu=gpus[0], start=4)
    with django_capture_on_commit_callbacks(execute=True):
        deployment_place(deployment_id=chat.pk, partition_id=running.pk)
    sync()
    return agent, gpus, sync, chat, running


@pytest.fixture(autouse=True)
def _no_advice_interval(settings):
    """These tests ask the advisor several times in a row as one user."""
    settings.FLEET_ADVICE_MIN_INTERVAL_SECONDS = 0


def _held(agent, gpu):
    return sorted((i.profile_id, i.start) for i in agent.backend.mig_instances(gpu.uuid))


def test_an_applied_proposal_lets_the_waiting_replicas_be_placed(
    world, operator_client, django_capture_on_commit_callbacks
):
    agent, gpus, sync, chat, running = world
    big = deployment_create(
        name="big", request=DeploymentRequest(kind="mig", profile="4g.40gb"), replicas=2
    )
    small = deployment_create(
        name="small", request=DeploymentRequest(kind="mps", memory_mib=8000), replicas=4
    )
    answer = operator_client.get("/api/v1/capacity/advice", {"product": "h100-sxm5-80gb"})
    assert answer.status_code == 200, answer.json()
    advice = answer.json()
    assert advice["solver"]["status"] == "optimal" and advice["solver"]["gap_percent"] == 0.0
    assert advice["solver"]["objective"] == advice["solver"]["bound"]
    assert advice["waiting_replicas"] == 6 and advice["placed_replicas"] == 6
    assert advice["moved_replicas"] == 0
    assert {w["deployment"]: w["placed"] for w in advice["waiting"]} == {"big": 2, "small": 4}
    for gpu in advice["gpus"]:
        layout = [
            Instance(H100.profile(i["profile"]).id, i["start"]) for i in gpu["layout"]["instances"]
        ]
        assert validate_layout(H100, layout) == ()
    mine = next(g for g in advice["gpus"] if g["gpu"] == gpus[0].pk)
    assert {"profile": 9, "start": 4, "mps": None} in mine["layout"]["instances"]  # chat stays
    body = advice["rollout"]
    assert body["selector"] == {"gpus": sorted(g["gpu"] for g in advice["gpus"])}
    assert sorted(body["place_waiting"]) == sorted([big.pk, small.pk])

    with django_capture_on_commit_callbacks(execute=True):
        started = operator_client.post(
            "/api/v1/rollouts/", {**body, "max_unavailable": 2}, format="json"
        )
    assert started.status_code == 202, started.json()
    operation = Operation.objects.get(pk=started.json()["id"])
    for _ in range(12):
        sync()
        operation.refresh_from_db()
        if operation.status != "dispatched":
            break
    assert operation.status == "succeeded", operation.payload
    assert "placed 6 waiting replica(s)" in [e["note"] for e in operation.payload["log"]]
    sync()
    assert big.allocations.placed().count() == 2
    assert small.allocations.placed().count() == 4
    assert chat.allocations.get().partition_id == running.pk  # never moved
    assert not any(g["drained"] for g in advice["gpus"])
    notes = [e["note"] for e in operation.payload["log"]]
    assert any(n.startswith(f"reshaping GPU {gpus[0].pk} in place") for n in notes)
    assert not Operation.objects.filter(kind="drain", gpu=gpus[0]).exists()
    assert all(_held(agent, gpu) for gpu in gpus)
    # Nothing waits any more: nothing to propose.
    again = operator_client.get("/api/v1/capacity/advice", {"product": "h100-sxm5-80gb"}).json()
    assert again["waiting_replicas"] == 0 and again["rollout"] is None


def test_bad_advice_queries_are_refused_and_change_nothing(world, operator_client):
    before = snapshot_rows()
    assert_error(operator_client.get("/api/v1/capacity/advice"), 400)
    assert_error(
        operator_client.get("/api/v1/capacity/advice", {"product": "nope"}),
        400,
        "advice.unknown_product",
    )
    assert_error(
        operator_client.get(
            "/api/v1/capacity/advice", {"product": "h100-sxm5-80gb", "time_limit_s": 99}
        ),
        400,
    )
    assert snapshot_rows() == before


def test_operators_may_ask_and_nobody_else(world, client, viewer_client):
    """The solver runs for seconds: operators only (limits: tests/api/test_capacity_advice.py)."""
    assert_error(client.get("/api/v1/capacity/advice", {"product": "h100-sxm5-80gb"}), 401)
    assert_error(viewer_client.get("/api/v1/capacity/advice", {"product": "h100-sxm5-80gb"}), 403)


def test_a_deployment_that_requires_host_labels_is_advised_only_onto_those_hosts(
    operator_client, django_capture_on_commit_callbacks
):
    """Two idle hosts, zone a and zone b: the waiting replicas of a deployment that requires
    zone b are proposed on zone b's GPU only, and those of one without labels wherever."""
    gpus = {}
    for seed, zone in enumerate(("a", "b"), start=1):
        host, _ = host_create(name=f"node-{zone}")
        host_issue_token(host)
        Host.objects.filter(pk=host.pk).update(
            hostname=f"sim-{seed}", status="ready", labels={"zone": zone}
        )
        agent_hello(host=host, hello=SimAgent(["h100-sxm5-80gb"], seed=seed).hello())
        gpus[zone] = Gpu.objects.get(host=host)
    deployment_create(
        name="zonal",
        request=DeploymentRequest(kind="mig", profile="3g.40gb"),
        replicas=2,
        host_labels={"zone": "b"},
    )
    answer = operator_client.get("/api/v1/capacity/advice", {"product": "h100-sxm5-80gb"})
    assert answer.status_code == 200, answer.json()
    advice = answer.json()
    assert advice["placed_replicas"] == 2 and advice["solver"]["status"] == "optimal"
    assert [g["gpu"] for g in advice["gpus"]] == [gpus["b"].pk]
    assert {p["serves"] for p in advice["gpus"][0]["places"]} == {"zonal"}

    deployment_create(
        name="anywhere", request=DeploymentRequest(kind="mig", profile="7g.80gb"), replicas=1
    )
    advice = operator_client.get("/api/v1/capacity/advice", {"product": "h100-sxm5-80gb"}).json()
    # Zone b's GPU is the zonal one's; the 7g takes zone a's, where it may go too.
    assert advice["solver"]["status"] == "sequential" and advice["placed_replicas"] == 3
    serves = {g["gpu"]: {p["serves"] for p in g["places"]} for g in advice["gpus"]}
    assert serves == {gpus["a"].pk: {"anywhere"}, gpus["b"].pk: {"zonal"}}


def test_a_gpu_is_not_drained_for_a_proposal_when_its_replicas_may_not_go_elsewhere(
    operator_client, django_capture_on_commit_callbacks
):
    """Zone a's GPU runs a replica that requires zone a, zone b's one that requires zone b; each
    GPU has a free 3g beside it. A waiting 7g fits only by draining one GPU and moving its
    replica into the other's free 3g, on a host its deployment may not use: nothing is
    proposed, rather than a drain the engine would refuse to carry out."""
    for seed, zone in enumerate(("a", "b"), start=1):
        host, _ = host_create(name=f"node-{zone}")
        host_issue_token(host)
        Host.objects.filter(pk=host.pk).update(
            hostname=f"sim-{seed}", status="ready", labels={"zone": zone}
        )
        agent = SimAgent(["h100-sxm5-80gb"], seed=seed)
        agent_hello(host=host, hello=agent.hello())
        gpu = Gpu.objects.get(host=host)
        gpu_set_layout(gpu_id=gpu.pk, spec=TWO_3G)
        with django_capture_on_commit_callbacks(execute=True):
            agent_ack(host=host, ack=agent.apply(host_desired_state(Host.objects.get(pk=host.pk))))
        pinned = deployment_create(
            name=f"zone-{zone}",
            request=DeploymentRequest(kind="mig", profile="3g.40gb"),
            replicas=1,
            host_labels={"zone": zone},
        )
        with django_capture_on_commit_callbacks(execute=True):
            deployment_place(
                deployment_id=pinned.pk, partition_id=Partition.objects.get(gpu=gpu, start=4).pk
            )
    deployment_create(
        name="big", request=DeploymentRequest(kind="mig", profile="7g.80gb"), replicas=1
    )
    advice = operator_client.get("/api/v1/capacity/advice", {"product": "h100-sxm5-80gb"}).json()
    assert advice["moved_replicas"] == 0 and advice["placed_replicas"] == 0
    assert advice["gpus"] == [] and advice["rollout"] is None

    # Zone b's replica may go anywhere once its deployment stops requiring zone b: zone b's GPU
    # is drained into zone a's free 3g, and the 7g takes it.
    Deployment.objects.filter(name="zone-b").update(host_labels={})
    advice = operator_client.get("/api/v1/capacity/advice", {"product": "h100-sxm5-80gb"}).json()
    assert advice["moved_replicas"] == 1 and advice["placed_replicas"] == 1
    drained = {g["gpu"] for g in advice["gpus"] if g["drained"]}
    assert drained == {Gpu.objects.get(host__name="node-b").pk}


def test_replicas_their_team_quota_refuses_are_not_counted_as_placed(world, operator_client):
    """Issue 22, defect 4: the advisor counted as placed a replica its team's quota refuses."""
    from fleet.core.models import Team

    capped = Team.objects.create(name="capped", slug="capped", quota_mig_compute_slices=0)
    deployment_create(
        name="refused",
        request=DeploymentRequest(kind="mig", profile="4g.40gb"),
        replicas=2,
        team_id=capped.pk,
    )
    free = deployment_create(
        name="free", request=DeploymentRequest(kind="mig", profile="4g.40gb"), replicas=1
    )
    answer = operator_client.get("/api/v1/capacity/advice", {"product": "h100-sxm5-80gb"})
    assert answer.status_code == 200, answer.json()
    advice = answer.json()
    assert [w["deployment"] for w in advice["waiting"]] == ["free"]
    assert advice["waiting_replicas"] == 1 and advice["placed_replicas"] == 1
    if advice["rollout"] is not None:
        assert advice["rollout"]["place_waiting"] == [free.pk]
