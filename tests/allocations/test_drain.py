"""Drain and reshape one GPU: replicas move off, the agent confirms, the new layout is applied
and verified, the GPU returns to service; a failed apply rolls back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.agents.delivery import agent_ack
from fleet.agents.discovery import agent_hello
from fleet.agents.documents import host_desired_state
from fleet.agents.enrollment import host_issue_token
from fleet.allocations.drain import gpu_drain
from fleet.allocations.models import Allocation
from fleet.allocations.services import DeploymentRequest, deployment_create, deployment_place
from fleet.core.models import Operation
from fleet.inventory.models import Gpu, Host
from fleet.inventory.services import host_create
from fleet.partitioning.models import Partition
from fleet.partitioning.services import LayoutSpec, MigInstanceSpec, gpu_set_layout
from fleet.workflows.drain import drain_advance
from tests.agent_sim import SimAgent
from tests.helpers import assert_error, snapshot_rows

pytestmark = pytest.mark.django_db

TWO_3G = LayoutSpec(
    mode="mig", instances=(MigInstanceSpec("3g.40gb", 0), MigInstanceSpec("3g.40gb", 4))
)
SEVEN = LayoutSpec(mode="mig", instances=(MigInstanceSpec("7g.80gb", 0),))


@pytest.fixture
def world(django_capture_on_commit_callbacks):
    host, _ = host_create(name="node")
    host_issue_token(host)
    agent = SimAgent(["h100-sxm5-80gb", "h100-sxm5-80gb"])
    Host.objects.filter(pk=host.pk).update(hostname="sim-0", status="ready")
    agent_hello(host=host, hello=agent.hello())
    source, spare = Gpu.objects.filter(host=host).order_by("index")
    for gpu in (source, spare):
        gpu_set_layout(gpu_id=gpu.pk, spec=TWO_3G)
    deployment = deployment_create(
        name="chat", request=DeploymentRequest(kind="mig", profile="3g.40gb"), replicas=1
    )
    deployment_place(
        deployment_id=deployment.pk, partition_id=Partition.objects.get(gpu=source, start=0).pk
    )

    def sync():
        with django_capture_on_commit_callbacks(execute=True):
            agent_ack(host=host, ack=agent.apply(host_desired_state(Host.objects.get(pk=host.pk))))

    sync()
    return host, agent, source, spare, sync


def test_a_busy_gpu_is_drained_reshaped_verified_and_uncordoned(
    world, django_capture_on_commit_callbacks
):
    _, agent, source, spare, sync = world
    with django_capture_on_commit_callbacks(execute=True):
        op = gpu_drain(gpu_id=source.pk, layout=SEVEN)
    assert Gpu.objects.get(pk=source.pk).cordoned
    assert Allocation.objects.get().gpu_id == spare.pk  # moved before anything is destroyed
    assert Operation.objects.get(pk=op.pk).payload["step"] == "wait_idle"
    sync()  # the agent stops the replica on the source and starts it on the spare
    assert Operation.objects.get(pk=op.pk).payload["step"] == "wait_apply"
    sync()  # the agent applies the 7g layout
    op.refresh_from_db()
    assert op.status == "succeeded", op.payload
    steps = [s["step"] for s in op.payload["log"]]
    assert steps[:4] == ["cordon", "move", "wait_moves", "wait_idle"]
    source.refresh_from_db()
    assert not source.cordoned
    assert [(i.profile_id, i.start) for i in agent.backend.mig_instances(source.uuid)] == [(0, 0)]


def test_a_failed_apply_rolls_back_to_the_previous_layout(
    world, django_capture_on_commit_callbacks
):
    _, agent, source, _, sync = world
    # A process Fleet does not know about keeps the 3g at slice 4 busy.
    instance = next(i for i in agent.backend.mig_instances(source.uuid) if i.start == 4)
    agent.backend.run_process(source.uuid, 512, gpu_instance_id=instance.gpu_instance_id)
    with django_capture_on_commit_callbacks(execute=True):
        op = gpu_drain(gpu_id=source.pk, layout=SEVEN)
    sync()  # idle confirmed
    sync()  # the 7g cannot be created: the agent reports in_use
    sync()  # the rollback layout is applied
    op.refresh_from_db()
    assert op.status == "failed"
    assert "in_use" in op.reason and "rolled back" in op.reason
    assert sorted(Partition.objects.filter(gpu=source).values_list("profile_name", "start")) == [
        ("3g.40gb", 0),
        ("3g.40gb", 4),
    ]
    assert not Gpu.objects.get(pk=source.pk).cordoned
    assert {(i.profile_id, i.start) for i in agent.backend.mig_instances(source.uuid)} == {
        (9, 0),
        (9, 4),
    }


def test_a_drain_whose_agent_never_answers_fails_with_a_reason_after_its_timeout(
    world, django_capture_on_commit_callbacks
):
    _, _, source, _, _ = world
    with django_capture_on_commit_callbacks(execute=True):
        op = gpu_drain(gpu_id=source.pk, layout=SEVEN, timeout_s=30)
    Operation.objects.filter(pk=op.pk).update(
        payload={
            **Operation.objects.get(pk=op.pk).payload,
            "deadline": (timezone.now() - timedelta(seconds=1)).isoformat(),
        }
    )
    drain_advance(operation_id=op.pk)
    op.refresh_from_db()
    assert op.status == "failed" and "stuck for 30 s" in op.reason and "not confirmed" in op.reason
    assert not Gpu.objects.get(pk=source.pk).cordoned


def test_a_plain_drain_leaves_the_gpu_cordoned_and_empty(world, django_capture_on_commit_callbacks):
    _, _, source, _, sync = world
    with django_capture_on_commit_callbacks(execute=True):
        op = gpu_drain(gpu_id=source.pk)
    sync()
    op.refresh_from_db()
    assert op.status == "succeeded"
    assert Gpu.objects.get(pk=source.pk).cordoned
    assert not Allocation.objects.filter(gpu=source).exists()


def test_the_api_starts_a_drain_and_refuses_bad_ones(
    world, operator_client, viewer_client, django_capture_on_commit_callbacks
):
    _, _, source, _, _ = world
    url = f"/api/v1/gpus/{source.pk}/drain"
    before = snapshot_rows()
    bad = {
        "layout": {
            "mode": "mig",
            "instances": [{"profile": "3g.40gb", "start": 0}, {"profile": "4g.40gb", "start": 0}],
        }
    }
    body = assert_error(operator_client.post(url, bad, format="json"), 422)
    assert {v["code"] for v in body["details"]["violations"]} == {"mig.overlap"}
    assert snapshot_rows() == before
    assert_error(viewer_client.post(url, {}, format="json"), 403)
    assert_error(operator_client.post(url, {"timeout_s": 1}, format="json"), 400)
    with django_capture_on_commit_callbacks(execute=True):
        response = operator_client.post(
            url,
            {"layout": {"mode": "mig", "instances": [{"profile": "7g.80gb", "start": 0}]}},
            format="json",
        )
    assert response.status_code == 202 and response.json()["kind"] == "drain"
    assert_error(operator_client.post(url, {}, format="json"), 409, "drain.in_progress")


def test_a_drain_of_running_replicas_never_drops_the_running_count(
    django_capture_on_commit_callbacks,
):
    """Two replicas of one deployment run on the GPU and have room elsewhere: each gets a new
    copy that runs before the old one stops, so the deployment always has two running."""
    import time

    from fleet.agents.messages import handle_message
    from tests.factories import GpuFactory, HostFactory, allow_process

    allow_process()
    host = HostFactory(runtime="process", process_runtime=True)
    source, spare = (GpuFactory(host=host, product_key="h100-sxm5-80gb") for _ in range(2))
    for gpu in (source, spare):
        gpu_set_layout(gpu_id=gpu.pk, spec=TWO_3G)
    deployment = deployment_create(
        name="chat",
        request=DeploymentRequest(kind="mig", profile="3g.40gb"),
        replicas=2,
        workload={"runtime": "process", "command": ["/opt/serve"]},
    )
    for start in (0, 4):
        deployment_place(
            deployment_id=deployment.pk,
            partition_id=Partition.objects.get(gpu=source, start=start).pk,
        )

    def report(states):
        with django_capture_on_commit_callbacks(execute=True):
            handle_message(
                host.pk,
                {
                    "type": "workloads",
                    "ts": time.time(),
                    "full": False,
                    "workloads": [
                        {
                            "allocation_id": pk,
                            "state": state,
                            "started_at": time.time() if state == "running" else None,
                            "exit_code": None,
                            "restarts": 0,
                            "message": "",
                            "pids": [],
                        }
                        for pk, state in states.items()
                    ],
                },
            )

    def running() -> int:
        return len(
            set(
                Allocation.objects.placed()
                .filter(deployment=deployment, workload_state="running")
                .values_list("replica", flat=True)
            )
        )

    old = list(Allocation.objects.filter(deployment=deployment).values_list("pk", flat=True))
    report(dict.fromkeys(old, "running"))
    assert running() == 2
    with django_capture_on_commit_callbacks(execute=True):
        op = gpu_drain(gpu_id=source.pk)
    assert Operation.objects.get(pk=op.pk).payload["step"] == "wait_moves"
    new = list(Allocation.objects.filter(gpu=spare).values_list("pk", flat=True))
    assert len(new) == 2 and running() == 2
    report(dict.fromkeys(new, "starting"))
    assert running() == 2
    report({new[0]: "running"})  # one move done: its old copy stops, the other still serves
    assert running() == 2
    report({new[1]: "running"})
    assert running() == 2
    assert Operation.objects.get(pk=op.pk).payload["step"] == "wait_idle"
    Host.objects.filter(pk=host.pk).update(
        applied_generation=Host.objects.get(pk=host.pk).desired_generation
    )
    drain_advance(operation_id=op.pk)
    assert "still stopping" in Operation.objects.get(pk=op.pk).payload["waiting_for"]
    report(dict.fromkeys(old, "none"))  # the old copies have exited
    drain_advance(operation_id=op.pk)
    op.refresh_from_db()
    assert op.status == "succeeded", op.payload
    assert running() == 2 and not Allocation.objects.filter(gpu=source).exists()


def test_a_reshape_moves_only_the_replicas_whose_partitions_it_destroys(
    world, django_capture_on_commit_callbacks
):
    """The replica's 3g at slice 0 is kept by the new layout: it stays and keeps running; only
    the idle 3g at slice 4 is cut into a 2g and a 1g."""
    _, _, source, _, sync = world
    before = Allocation.objects.get()
    keeps_slice_0 = LayoutSpec(
        mode="mig",
        instances=(
            MigInstanceSpec("3g.40gb", 0),
            MigInstanceSpec("2g.20gb", 4),
            MigInstanceSpec("1g.10gb", 6),
        ),
    )
    with django_capture_on_commit_callbacks(execute=True):
        op = gpu_drain(gpu_id=source.pk, layout=keeps_slice_0)
    sync()
    sync()
    op.refresh_from_db()
    assert op.status == "succeeded", op.payload
    assert op.payload["move_operations"] == []
    assert "1 replica(s) stay" in op.payload["log"][1]["note"]
    after = Allocation.objects.get()
    assert (after.pk, after.partition_id) == (before.pk, before.partition_id)
    assert not Operation.objects.filter(kind__in=["move", "replace"]).exists()
    assert sorted(Partition.objects.filter(gpu=source).values_list("profile_name", "start")) == [
        ("1g.10gb", 6),
        ("2g.20gb", 4),
        ("3g.40gb", 0),
    ]
    assert not Gpu.objects.get(pk=source.pk).cordoned


def test_a_gpu_drain_moves_every_replica_of_a_team_at_its_quota_on_the_record(
    django_capture_on_commit_callbacks,
):
    """The fleet's drain is not the team's move: all three replicas move at once though the
    team is at its quota; the first is the team's surge replica, the two others pass the quota
    and each is recorded as an ``over_quota`` operation."""
    from fleet.core.models import OperationKind
    from fleet.core.teams import team_create, team_quota_set
    from fleet.mps import MpsPolicy
    from tests.factories import GpuFactory, HostFactory, allow_process

    team = team_create(name="search")
    allow_process(team)
    team_quota_set(team_id=team.pk, quota={"mps_memory_mib": 3 * 4096})
    host = HostFactory(runtime="process", process_runtime=True)
    source, spare = (GpuFactory(host=host, product_key="h100-sxm5-80gb") for _ in range(2))
    for gpu in (source, spare):
        gpu_set_layout(gpu_id=gpu.pk, spec=LayoutSpec(mode="mps", mps=MpsPolicy()))
    deployment = deployment_create(
        name="asr",
        request=DeploymentRequest(kind="mps", memory_mib=4096),
        replicas=3,
        team_id=team.pk,
        workload={"runtime": "process", "command": ["/opt/serve"]},
    )
    for _ in range(3):
        deployment_place(deployment_id=deployment.pk, gpu_id=source.pk)

    with django_capture_on_commit_callbacks(execute=True):
        op = gpu_drain(gpu_id=source.pk)

    assert Operation.objects.get(pk=op.pk).payload["step"] == "wait_moves"
    assert Allocation.objects.filter(gpu=spare, replaces__isnull=False).count() == 3
    over = Operation.objects.filter(kind=OperationKind.OVER_QUOTA)
    assert over.count() == 2
    assert all(f"draining {source}" in o.reason for o in over)
